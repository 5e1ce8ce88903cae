"""The coordinator's view of its devices, and its side of the conversation.

The fleet receives registrations, status and updates on one thread (the
caller's), replies with acks and errors, and hands valid updates to the round
loop. Every rejection is logged and reported to the sender; none reaches
aggregation. A device is known by the topic the broker let it publish on, never
by a name inside a message, and what it may cost is bounded by its budgets
(`coordinator.runtime.device_budgets.FleetLimits`): error replies per second (the rest
are counted and named in the next reply), plan re-sends per round, bytes in
flight, how fast its sample count may grow, and how often it may report a new
measurement of its compute (`ProfileUpdate`, which changes nothing but its GFLOPS).
What it knows of each device is a `coordinator.core.device_record.DeviceRecord`.
"""

from __future__ import annotations

import logging
import time
from collections import deque
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Callable

from edge_sdk.networking.not_authorized import NotAuthorized
from edge_sdk.networking.link import MessageLink, Received, Rejected
from edge_sdk.profiling import DeviceProfile, MeasureQuality
from edge_sdk.protocol.capabilities import FEATURES, FLEET_STATS, SERVE
from edge_sdk.protocol.errors import ErrorCode
from edge_sdk.protocol.messages import (
    Ack, DataCount, Envelope, Error, Evaluate, Evaluation, FleetStats, Plan, ProfileUpdate, Register, StatsRequest,
    Status, Update,
)
from edge_sdk.data.channel_moments import ChannelMoments
from edge_sdk.protocol.topics import Topics
from edge_sdk.signing import ModelSigner
from edge_sdk.networking.token_bucket import TokenBucket

from coordinator.aggregate.validation import MAX_SAMPLES, UpdateRejected
from coordinator.core.device_record import MISS_MASK, MISS_WINDOW, DeviceRecord
from coordinator.core.received_update import ReceivedUpdate
from coordinator.runtime.device_budgets import FleetLimits, grown_sample_limit
from coordinator.runtime.fixed_tensors import FixedTensors
from coordinator.runtime.plan_pacer import PlanPacer
from coordinator.runtime.task import Task
from coordinator.runtime.update_spool import UpdateSpool

__all__ = ["Arrivals", "Collected", "CollectedEvaluations", "Fleet", "FleetProgress", "COORDINATOR_ID"]

log = logging.getLogger(__name__)
COORDINATOR_ID = "coordinator"
#: How many of the latest rejections the fleet keeps for the report.
MAX_KEPT_REJECTIONS = 10_000


@dataclass(frozen=True)
class Collected:
    """What one round's collection brought: the valid updates, in the order of the participants,
    and the participants that reported a failed local training (``train_failed``), with their
    messages."""

    updates: dict[str, ReceivedUpdate]
    failures: dict[str, str]
    #: participants the round stopped waiting for once it had its quorum (`Fleet.collect`)
    not_waited_for: list[str] = field(default_factory=list)


@dataclass(frozen=True)
class Arrivals:
    """What an open collection (`Fleet.open_collection`) brought since it was last asked: the valid
    updates in the order they arrived, the devices that said they are not training now, and those
    that reported a failed training (with its message). Each of these devices' plans is closed."""

    updates: dict[str, ReceivedUpdate]
    declined: list[str]
    failed: dict[str, str]


@dataclass(frozen=True)
class CollectedEvaluations:
    """What one federated evaluation brought: the valid reports in the order of the devices asked
    (those of no samples too: they say why), and the devices asked that sent none in time."""

    reports: dict[str, Evaluation]
    missing: list[str]


@dataclass(frozen=True)
class FleetProgress:
    """What the fleet is waiting for, for a live display: devices registering before the
    first round (``round`` -1), or the updates of round ``round``."""

    round: int
    done: int  # devices registered and online, or updates accepted (+ declined)
    total: int  # devices wanted, or participants
    bytes_up: int  # bytes received from the participants since the collection began
    elapsed_s: float
    #: what is collected: "update" (a training round) or "evaluation" (a federated evaluation)
    collecting: str = "update"


#: The budgets of a `Fleet` not given any (FleetLimits is frozen: one instance serves every fleet).
_DEFAULT_LIMITS = FleetLimits()
#: How often (seconds) the fleet calls its `on_progress` callback while it waits (and at every change).
PROGRESS_EVERY_S = 0.5
#: How long (seconds) a round still waits for a participant that went offline, counted from when
#: it did or from the coordinator's own reconnect, whichever is later: a device whose connection
#: blipped, or a broker that restarted, costs seconds, not the device's update. Above paho's
#: longest pause between reconnect attempts (`TransportConfig.reconnect_max_delay`, 10 s).
REJOIN_GRACE_S = 15.0
#: The least time (seconds) a round still waits for its missing stragglers once every other
#: participant answered (`Fleet.collect`); otherwise as long again as the others took.
STRAGGLER_GRACE_MIN_S = 2.0
#: How many messages already waiting `Fleet.pump` handles after its time is up.
MAX_DRAIN = 1000


@dataclass
class _Collection:
    round: int
    participants: set[str]
    check: Callable[[DeviceRecord, Any], None]
    #: the answer collected: an `Update` (a training round) or an `Evaluation` (a federated evaluation)
    kind: type = Update
    accepted: dict[str, Any] = field(default_factory=dict)  # device -> ReceivedUpdate, or its Evaluation
    declined: set[str] = field(default_factory=set)  # said "not_training" for this round
    failed: dict[str, str] = field(default_factory=dict)  # reported "train_failed": its message
    lost: set[str] = field(default_factory=set)  # said a message to it stalled: wants its plan again
    resent: dict[str, int] = field(default_factory=dict)  # plan re-sends per device this round
    resent_at: dict[str, float] = field(default_factory=dict)  # time.monotonic() of the last one
    #: updates needed to aggregate, and how many of its last `MISS_WINDOW` rounds a participant must
    #: have missed to be a straggler the round does not wait for once it has them (0: wait for everyone)
    quorum: int = 0
    straggler_after: int = 0
    not_waited_for: list[str] = field(default_factory=list)
    _stragglers_only_since: float | None = None
    #: an open collection's (`Fleet.open_collection`): each participant's own plan's tag (None: the
    #: round's collection, every participant answering ``round``)
    tags: dict[str, int] | None = None

    def tag_of(self, device: str) -> int | None:
        """The round tag of the answers collected from ``device``: the round's, or in an open
        collection its own plan's (None: no plan of it is open)."""
        return self.round if self.tags is None else self.tags.get(device)

    def expects(self, device: str, rnd: int) -> bool:
        """Is an answer of ``device`` tagged ``rnd`` one this collection waits for?"""
        return device in self.participants and self.tag_of(device) == rnd

    def collecting(self, device: str) -> str:
        """What is collected, as a rejection names it."""
        if self.tags is None:
            return f"the {self.kind.KIND}s of round {self.round + 1}"
        tag = self.tags.get(device)
        return "no plan of this device is open" if tag is None else f"its plan of round {tag + 1}"

    def answered_all(self) -> bool:
        """Every participant accepted or declined (cheap: asked after each message)."""
        return self.answers() >= len(self.participants)

    def answers(self) -> int:
        """Participants that accepted or declined so far."""
        return len(self.accepted) + len(self.declined)

    def answered_since(self, answers: int) -> Callable[[], bool]:
        """A test for `Fleet.pump`: true once more than ``answers`` participants answered."""
        return lambda: self.answers() > answers


class Fleet:
    """Registration, status and update collection over a `MessageLink`."""

    def __init__(self, link: MessageLink, topics: Topics,
                 on_register: Callable[[DeviceRecord], None] | None = None,
                 on_progress: Callable[[FleetProgress], None] | None = None,
                 method: str | None = None, limits: FleetLimits = _DEFAULT_LIMITS, task: Task | None = None,
                 spool_dir: str | Path | None = None) -> None:
        self.link = link
        self.topics = topics
        self.limits = limits
        #: accepted updates wait here for aggregation: in memory up to `FleetLimits.updates_in_memory_bytes`,
        #: the rest in files under ``spool_dir`` (None: a temporary directory)
        self.spool = UpdateSpool(limits.updates_in_memory_bytes, spool_dir)
        #: the job's task: a device whose registered data is of another is refused (None: not checked)
        self.task = task
        #: the key that signs the models published to this fleet (`coordinator.runtime.publish.attach_signer`)
        self.model_signer: ModelSigner | None = None
        self._reply_budget: dict[str, TokenBucket] = {}
        self._suppressed: dict[str, int] = {}  # error replies not sent, per device, since its last one
        #: rounds collected so far (a device's sample count may grow per round: `FleetLimits`)
        self.rounds_collected = 0
        self.on_register = on_register
        #: called when a registered device's new measurement (`ProfileUpdate`) has replaced its
        #: profile's GFLOPS, between collections: the strategy may give it another label from the
        #: next round on (None: `on_register` is called instead)
        self.on_profile_update: Callable[[DeviceRecord], None] | None = None
        #: called after a device's `data_count` (its new samples counted)
        self.on_data_count: Callable[[DeviceRecord], None] | None = None
        self._profile_budget: dict[str, TokenBucket] = {}
        #: profile updates that arrived during a collection, applied when it ends (latest per device)
        self._pending_profiles: dict[str, DeviceProfile] = {}
        #: the device part this job's plans name: a device whose registration lists the methods it
        #: supports without this one is rejected (an SDK that lists none is taken at its word)
        self.method = method
        #: called while the fleet waits for devices or updates: when a device registers or
        #: reports, and at least every PROGRESS_EVERY_S
        self.on_progress = on_progress
        self._progress_at = 0.0
        self._progress_last: tuple[int, int, int] | None = None
        self.devices: dict[str, DeviceRecord] = {}
        #: `online`'s last answer, valid while the count of devices and of presence changes is the same
        #: (a record's ``online`` is set only here, each time with ``_presence_changes += 1``)
        self._presence_changes = 0
        self._online_cache: tuple[tuple[int, int], tuple[list[str], list[DeviceRecord]]] | None = None
        #: (device, code, message) of the latest rejections; bounded, so a flood cannot exhaust memory.
        self.rejections: deque[tuple[str, str, str]] = deque(maxlen=MAX_KEPT_REJECTIONS)
        self.rejection_count = 0  # all of them, ever
        self._collecting: _Collection | None = None  # a round's, or an evaluation's
        #: an asynchronous job's, open beside an evaluation's (`open_collection`): updates go to it
        self._open_col: _Collection | None = None
        self._declined_stats: set[str] | None = None  # while gather_stats waits: who answered no_data
        #: the job's fixed tensors: named by digest in its plans, left out for a device that holds them
        self.fixed = FixedTensors()
        #: the last plan (answered by an update; whole, fixed tensors declared) and evaluation request
        #: (by an evaluation) sent to each device, by (device, the answer's kind): (its round tag, the message)
        self._plans: dict[tuple[str, str], tuple[int, Plan | Evaluate]] = {}
        #: per device, the (device connection, coordinator connection) its plan was last sent
        #: over: a plan is sent again only when one side has reconnected since
        self._plan_sent_over: dict[tuple[str, str], tuple[int, int]] = {}
        self._connects_seen = 0  # our own connections the fleet has held a roll call for
        self._reconnected_at = 0.0  # time.monotonic() of our latest reconnect
        self.rejoin_grace_s = REJOIN_GRACE_S
        self.straggler_grace_min_s = STRAGGLER_GRACE_MIN_S
        #: work for the coordinator's thread while it waits for updates: given up to how many
        #: seconds it may wait for some, it returns whether it did any. A simulation runs its
        #: devices' training here, so that one thread of the process runs torch
        #: (simulation/training_queue.py); messages are then handled between two pieces of work.
        self.while_waiting: Callable[[float], bool] | None = None
        #: called when a device registered, came online or went offline (e.g. Home Assistant's state)
        self.on_device_change: Callable[[DeviceRecord], None] | None = None
        #: called at the start of every `pump` (each must be quick, and rate itself)
        self.tickers: list[Callable[[], None]] = []
        #: devices removed from the job (deploy/homeserver/remove-device.sh): never sampled, and
        #: refused when they register again
        self.removed: set[str] = set()
        #: called with a device's id when it was removed (e.g. to clear it from Home Assistant)
        self.on_removed: Callable[[str], None] | None = None

    def start(self) -> None:
        """Subscribe to every device's uplink and status; a device not asked for an update may
        have `FleetLimits.idle_upload_bytes` in flight, and each of its topics may queue
        `FleetLimits.messages_per_s` messages per second."""
        self.link.set_sender_budget(None, self.limits.idle_upload_bytes)
        self.link.transport.set_topic_rate(self.limits.messages_per_s, self.limits.message_burst)
        self.link.transport.subscribe(self.topics.all_uplinks())
        self.link.transport.subscribe(self.topics.all_status())

    # -- sending ----------------------------------------------------------
    def send(self, device_id: str, body: object, rnd: int = -1, reply_to: str | None = None,
             retain: bool = False) -> int:
        """Send one message to one device; returns the payload bytes (``retain``: see `MessageLink.send`)."""
        return self.send_envelope(device_id, Envelope.of(body, COORDINATOR_ID, round=rnd, reply_to=reply_to),
                                  retain=retain)

    def send_envelope(self, device_id: str, env: Envelope, retain: bool = False) -> int:
        """`send` an envelope made by the caller, who then knows its ``msg_id`` (the ``reply_to``
        of the device's answer: `DeviceRecord.acknowledged`); returns the payload bytes."""
        body, rnd = env.body, env.round
        if isinstance(body, (Plan, Evaluate)) and self.fixed.names:
            body = self.fixed.declare(body)
            env = replace(env, body=self.fixed.for_device(device_id, body))
        nbytes = self.link.send(self.topics.downlink(device_id), env, retain=retain)
        if isinstance(body, (Plan, Evaluate)):  # what the device must answer, sent again if it is lost
            key = (device_id, Update.KIND if isinstance(body, Plan) else Evaluation.KIND)
            self._plans[key] = (rnd, body)
            self._plan_sent_over[key] = self._connections(device_id)
            self.link.set_sender_budget(self.topics.uplink(device_id), self.limits.upload_budget(nbytes))
        if device_id in self.devices:
            self.devices[device_id].bytes_down += nbytes
        return nbytes

    def broadcast(self, body: object, rnd: int = -1) -> int:
        """Send one message to every device; returns bytes times online devices."""
        nbytes = self.link.send(self.topics.broadcast(), Envelope.of(body, COORDINATOR_ID, round=rnd))
        online = [d for d in self.devices.values() if d.online]
        for record in online:
            record.bytes_down += nbytes
        return nbytes * len(online)

    # -- receiving --------------------------------------------------------
    def gather_stats(self, kind: str, devices: list[str], timeout_s: float,
                     params: dict[str, int] | None = None) -> dict[str, Any]:
        """Ask ``devices`` (those naming the capability) for statistics of ``kind`` (with
        ``params``) and wait up to ``timeout_s`` for their answers; returns what came, by device:
        `ChannelMoments`, or the `FleetStats` of other kinds, weighed as far as believed (and no
        longer held by the device records)."""
        asked = [d for d in devices if FLEET_STATS in self.devices[d].capabilities]
        for device in asked:
            self.devices[device].stats.pop(kind, None)
            self.send(device, StatsRequest(kind, dict(params or {})))
        end = time.monotonic() + timeout_s
        self._declined_stats = declined = set()  # devices that answered no_data: not waited for
        try:
            while time.monotonic() < end and any(kind not in self.devices[d].stats and d not in declined
                                                 for d in asked):
                self.pump(min(0.5, max(0.0, end - time.monotonic())))
        finally:
            self._declined_stats = None
        # handed over, not kept: a series model's histograms are a megabyte or more a device
        return {d: self.devices[d].stats.pop(kind) for d in asked if kind in self.devices[d].stats}

    def why_not_registered(self) -> str:
        """What the devices turned away were told (up to 5), or that none was: one line for the
        error of a job whose devices did not register."""
        turned: dict[str, str] = {}
        for device, code, message in self.rejections:
            turned.setdefault(device, f"{code}: {message[:120]}")
        if not turned:
            return (f"no device was turned away (are they on this broker, in job {self.topics.job!r}, allowed by "
                    "its ACL?)")
        shown = "; ".join(f"{d} ({why})" for d, why in sorted(turned.items())[:5])
        return f"turned away: {shown}" + (f" and {len(turned) - 5} more" if len(turned) > 5 else "")

    def pump(self, timeout: float, until: Callable[[], bool] | None = None) -> None:
        """Handle every message that arrives within `timeout` seconds, then up to
        `MAX_DRAIN` of those still waiting (so a flood of messages cannot hold the caller);
        sooner once ``until()`` (asked after each message) is true. Messages the receive queue
        dropped over a device's budget, and its transfers that stalled or were evicted, are
        counted as that device's rejections."""
        if (refused := self.link.transport.not_authorized) is not None:  # its ACL: no round can work
            raise NotAuthorized(refused)
        self._roll_call_if_reconnected()
        for tick in self.tickers:
            tick()
        end = time.monotonic() + timeout
        late = 0
        while True:
            item = self.link.poll(max(0.0, end - time.monotonic()))
            if item is not None:
                self._dispatch(item)
                if until is not None and until():
                    break
            if time.monotonic() >= end:
                late += 1
                if item is None or late > MAX_DRAIN:
                    break
        for topic, transfer_id, got, count in self.link.expire():
            if (device := self.topics.device_from_topic(topic)) is not None:
                self._reject(device, ErrorCode.INCOMPLETE, f"transfer {transfer_id} timed out or was dropped with "
                             f"{got}/{count} chunks")
        for topic, dropped in self.link.transport.take_dropped().items():
            if (device := self.topics.device_from_topic(topic)) is not None:
                self._reject(device, ErrorCode.FLOOD, f"{dropped} messages dropped: over this device's receive budget",
                             count=dropped)

    def _roll_call_if_reconnected(self) -> None:
        """After each connection of our own (the first one too), ask every device for its
        status: whatever order the broker delivered wills and births in while we were away,
        the answers say who is connected now (and the answers of participants that missed
        their plan bring it to them again)."""
        connects = self.link.transport.connect_count
        if connects == self._connects_seen or not self.link.transport.connected:
            return
        if self._connects_seen:
            self._reconnected_at = time.monotonic()
            log.warning("reconnected to the broker: asking every device for its status")
        self._connects_seen = connects
        try:
            self.broadcast(Status("online", "roll call"))
        except ConnectionError as exc:  # dropped again meanwhile: the next reconnect asks again
            log.warning("roll call not sent: %s", exc)
            self._connects_seen = 0

    def _connections(self, device: str) -> tuple[int, int]:
        record = self.devices.get(device)
        return (record.connection if record else 0, self.link.transport.connect_count)

    def still_expected(self, device: str) -> bool:
        """Online, or offline for less than the rejoin grace (counted from our own reconnect
        too: while we were away, the wills we took may be older than the devices' return)."""
        record = self.devices[device]
        if record.online:
            return True
        if device in self.removed:
            return False
        since = max(record.offline_since, self._reconnected_at)
        return (not self.link.transport.connected) or time.monotonic() - since < self.rejoin_grace_s

    def wait_for_devices(self, count: int, timeout: float) -> list[str]:
        """Block until `count` devices are registered and online (or timeout)."""
        start = time.monotonic()
        end = start + timeout
        online = self.online()
        while time.monotonic() < end and len(online) < count:
            self.progress(-1, len(online), count, 0, start)
            self.pump(0.2)
            online = self.online()
        self.progress(-1, len(online), count, 0, start)
        return online

    def progress(self, rnd: int, done: int, total: int, bytes_up: int, start: float,
                  collecting: str = "update") -> None:
        """Tell `on_progress` when ``done`` changed, else at most every PROGRESS_EVERY_S."""
        now = time.monotonic()
        if self.on_progress is None:
            return
        if (rnd, done, total) != self._progress_last or now - self._progress_at >= PROGRESS_EVERY_S:
            self._progress_at, self._progress_last = now, (rnd, done, total)
            self.on_progress(FleetProgress(rnd, done, total, bytes_up, now - start, collecting))

    def online(self) -> list[str]:
        """Ids of registered devices that are online, sorted."""
        return list(self._online()[0])

    def online_records(self) -> list[DeviceRecord]:
        """The records of `online`'s devices, in its order."""
        return list(self._online()[1])

    def _online(self) -> tuple[list[str], list[DeviceRecord]]:
        key = (len(self.devices), self._presence_changes)
        if self._online_cache is None or self._online_cache[0] != key:  # 10,000 devices: 3 ms to list
            ids = sorted(d.device_id for d in self.devices.values() if d.online)
            self._online_cache = (key, (ids, [self.devices[d] for d in ids]))
        return self._online_cache[1]

    def remove(self, device: str) -> None:
        """Take ``device`` out of the job (its credentials were revoked): offline from now on, never
        sampled again, and refused if it registers again."""
        self.removed.add(device)
        self.fixed.forget(device)
        if (record := self.devices.get(device)) is not None:
            record.state, record.reason = "removed", "removed from the job"
            if record.online:
                record.online, record.offline_since = False, time.monotonic()
                self._presence_changes += 1
                self.link.discard_topic(self.topics.uplink(device))
        log.warning("device %s removed from the job", device)
        if self.on_removed is not None:
            self.on_removed(device)

    def collect(self, rnd: int, participants: list[str], deadline_s: float,
                check: Callable[[DeviceRecord, Update], None],
                send_plan: Callable[[str], int] | None = None, quorum: int = 0,
                straggler_after: int = 0) -> Collected:
        """Valid updates of round `rnd` from `participants`, until all online ones sent or deadline,
        and the participants' reported training failures.

        They come in the order of `participants`, not of arrival, so that floating-point sums over
        them, and with them a seeded job, are the same from run to run. ``send_plan`` (given): sends
        a participant its plan and returns its bytes; the plans go out in the participants' order
        while those not yet answered total under `FleetLimits.plan_bytes_in_flight` (`PlanPacer`).

        ``straggler_after`` (> 0): a participant that sent nothing in that many of the last
        `MISS_WINDOW` rounds it was asked (`DeviceRecord.missed_rounds`) is a straggler: once
        ``quorum`` updates are in and only stragglers are missing, the round waits for them as long
        again as the others took (at least `straggler_grace_min_s`), not until the deadline. A
        straggler still gets its plan (one that answers at the others' pace loses nothing), and is
        waited for in full again once its misses leave the window; the latest round's update sent
        late (a slow device, not a silent one) takes that round's miss back, once in `MISS_WINDOW`
        rounds (a device that is silent every round and late every round stays a straggler).
        """
        if self._open_col is not None:  # its updates would go to the open collection
            raise RuntimeError("a round's collection while an open collection runs")
        col = _Collection(rnd, set(participants), check, quorum=quorum, straggler_after=straggler_after)
        try:
            pacer = None if send_plan is None else PlanPacer(participants, send_plan, self.limits.plan_bytes_in_flight)
            col = self._wait_for(col, participants, deadline_s, pacer)
            return Collected({d: col.accepted[d] for d in participants if d in col.accepted}, dict(col.failed),
                             list(col.not_waited_for))
        finally:
            self.rounds_collected += 1
            self._count_missed(col, participants)
            self.apply_pending_profiles()

    def apply_pending_profiles(self) -> None:
        """The profile updates that arrived during a collection, taken now (the latest per device)."""
        pending, self._pending_profiles = self._pending_profiles, {}
        for device, profile in pending.items():
            self._apply_profile(device, profile)

    def _count_missed(self, col: _Collection, participants: list[str]) -> None:
        """Each participant's `DeviceRecord.missed_rounds` after round ``col.round``."""
        for device in participants:
            record = self.devices.get(device)
            if record is None:
                continue
            missed = device not in col.accepted and device not in col.declined
            record.miss_bits = ((record.miss_bits << 1) | missed) & MISS_MASK
            record.last_asked = col.round

    def _stragglers_only(self, col: _Collection, waiting: list[str], start: float) -> bool:
        """True once the round has its quorum and has waited long enough for the stragglers that
        are all it still waits for (`collect`); they are then listed in ``col.not_waited_for``."""
        if (col.straggler_after <= 0 or len(col.accepted) < max(col.quorum, 1)
                or any(self.devices[d].missed_rounds < col.straggler_after for d in waiting)):
            col._stragglers_only_since = None
            return False
        now = time.monotonic()
        if col._stragglers_only_since is None:
            col._stragglers_only_since = now
        grace = max(self.straggler_grace_min_s, col._stragglers_only_since - start)
        if now - col._stragglers_only_since < grace:
            return False
        col.not_waited_for = sorted(waiting)
        log.warning("round %d: not waiting any longer for %s (sent nothing in %d or more of their last %d rounds; "
                    "waited %.1f s after the others)", col.round + 1, ", ".join(col.not_waited_for),
                    col.straggler_after, MISS_WINDOW, now - col._stragglers_only_since)
        return True

    def collect_evaluations(self, rnd: int, devices: list[str], deadline_s: float,
                            check: Callable[[DeviceRecord, Evaluation], None],
                            shown_round: int | None = None) -> CollectedEvaluations:
        """The `Evaluation`s of round ``rnd`` from ``devices`` (each sent an `Evaluate`), until all
        online ones answered or the deadline; a device that drops out is counted, not waited for.
        ``shown_round``: the round a live display names, when ``rnd`` is only a tag (asynchronous jobs)."""
        col = self._wait_for(_Collection(rnd, set(devices), check, Evaluation), devices, deadline_s,
                             shown_round=shown_round)
        return CollectedEvaluations({d: col.accepted[d] for d in devices if d in col.accepted},
                                    [d for d in devices if d not in col.accepted])

    # -- an open collection: many plans out at once (asynchronous aggregation) ----
    def open_collection(self, check: Callable[[DeviceRecord, Update], None]) -> None:
        """Collect updates of many plans at once, each device answering its own plan's tag (`ask`),
        until `close_collection`; `arrivals` hands them on as they come. A device's plan stays
        open until its update arrives, it declines, or `close_plan` (its deadline, its leaving):
        an update that comes after is refused as ``wrong_round`` and counted, never folded."""
        if self._open_col is not None or self._collecting is not None:
            raise RuntimeError("a collection is already open")
        self._open_col = _Collection(-1, set(), check, tags={})

    def _open(self) -> _Collection:
        col = self._open_col
        if col is None:
            raise RuntimeError("no open collection (Fleet.open_collection)")
        return col

    def ask(self, device: str, tag: int, plan: Plan) -> int:
        """Send ``device`` its ``plan`` under its own round ``tag`` in the open collection; returns
        the plan's bytes (a device that reconnects or loses part of it is sent it again, within
        `FleetLimits.plan_resends_per_round` for this plan)."""
        col = self._open()
        col.participants.add(device)
        col.tags[device] = tag
        return self.send(device, plan, tag)

    def arrivals(self, timeout: float) -> Arrivals:
        """Handle messages for up to ``timeout`` seconds, sooner once anything arrived; what arrived
        (the plans it answered are closed). Plans lost on a reconnect are sent again first."""
        col = self._open()
        if self.link.transport.connected:
            for device in list(col.participants):
                self._resend_plan(device)
        self.pump(timeout, until=col.answered_since(0))
        updates, failed, col.accepted, col.failed = col.accepted, col.failed, {}, {}
        declined, col.declined = sorted(col.declined - set(failed)), set()
        for device in [*updates, *declined, *failed]:
            self._close(col, device, missed=device not in updates)
        return Arrivals(updates, declined, failed)

    def close_plan(self, device: str) -> None:
        """Stop waiting for ``device``'s open plan (it missed it): its update, if one still comes, is refused."""
        col = self._open()
        if device in col.participants:
            self._close(col, device, missed=True)

    def close_collection(self) -> None:
        """End the open collection (the plans still open are forgotten, not counted as missed)."""
        col = self._open()
        for device in list(col.participants):
            self._close(col, device, missed=None)
        self._open_col = None

    def _close(self, col: _Collection, device: str, missed: bool | None) -> None:
        """Close ``device``'s plan in the open collection ``col`` (``missed``: count it in its miss
        bits, True or False; None: not at all)."""
        tag = col.tags.pop(device)
        col.participants.discard(device)
        col.lost.discard(device)
        col.resent.pop(device, None)
        col.resent_at.pop(device, None)
        self._plans.pop((device, Update.KIND), None)
        self._plan_sent_over.pop((device, Update.KIND), None)
        if (device, Evaluation.KIND) not in self._plans:  # an idle device's budget again
            self.link.set_sender_budget(self.topics.uplink(device), None)
        record = self.devices.get(device)
        if record is not None and missed is not None:
            record.miss_bits = ((record.miss_bits << 1) | missed) & MISS_MASK
            record.last_asked = tag

    def _wait_for(self, col: _Collection, participants: list[str], deadline_s: float,
                  pacer: PlanPacer | None = None, shown_round: int | None = None) -> _Collection:
        """Handle messages until every participant still expected answered ``col``, or the deadline
        (``pacer``: sends the plans as the answers come; ``shown_round``: see `collect_evaluations`)."""
        self._collecting = col
        rnd = col.round
        start = time.monotonic()
        end = start + deadline_s
        up_before = sum(self.devices[d].bytes_up for d in participants)

        shown = rnd if shown_round is None else shown_round

        def progress() -> None:
            self.progress(shown, len(col.accepted) + len(col.declined), len(col.participants),
                          sum(self.devices[d].bytes_up for d in participants) - up_before, start, col.kind.KIND)
        try:
            while time.monotonic() < end:
                waiting = [d for d in col.participants
                           if d not in col.accepted and d not in col.declined and self.still_expected(d)]
                if not waiting or self._stragglers_only(col, waiting, start):
                    break
                if pacer is not None and pacer.pending:
                    pacer.send_more(set(waiting))
                if self.link.transport.connected:
                    # after our own reconnect, what devices sent meanwhile is lost (clean sessions):
                    # ask again (a device that trained re-sends its update, it does not retrain)
                    for device in waiting:
                        self._resend_plan(device)
                progress()
                if self.while_waiting is None:  # back as soon as the last answer is in (plans still
                    # to send: as soon as any answer is in)
                    self.pump(0.1, until=col.answered_all if pacer is None or not pacer.pending
                              else col.answered_since(col.answers()))
                else:
                    self.while_waiting(0.02)
                    self.pump(0.0)
            progress()
            return col
        finally:
            self._collecting = None
            open_col = self._open_col
            for device in participants:  # back to the budget of a device not asked for an answer
                self._plans.pop((device, col.kind.KIND), None)
                self._plan_sent_over.pop((device, col.kind.KIND), None)
                if open_col is None or device not in open_col.participants:
                    self.link.set_sender_budget(self.topics.uplink(device), None)

    # -- dispatch ---------------------------------------------------------
    def _dispatch(self, item: Received | Rejected) -> None:
        device = self.topics.device_from_topic(item.topic)
        if device is None:
            return
        if isinstance(item, Rejected):
            self._count_up(device, item.nbytes)
            self._reject(device, item.error.code, str(item.error), reply_to=item.msg_id)
            return
        env = item.envelope
        self._count_up(device, item.nbytes)
        if device in self.removed:  # taken out of the job: not heard any more (a registration is told why)
            if isinstance(env.body, Register):
                self._reject(device, ErrorCode.UNKNOWN_DEVICE, "this device was removed from the job", env.msg_id)
            return
        if env.sender != device:
            self._reject(device, ErrorCode.SENDER_MISMATCH,
                         f"sender {env.sender!r} does not match topic device {device!r}", env.msg_id)
            return
        if item.topic == self.topics.status(device):
            self._on_status(device, env)
        elif isinstance(env.body, Register):
            self._on_register(device, env)
        elif isinstance(env.body, (Update, Evaluation)):
            self._on_update(device, env, item.nbytes)
        elif isinstance(env.body, ProfileUpdate):
            self._on_profile_update(device, env)
        elif isinstance(env.body, Error):
            log.warning("device %s reports %s: %s", device, env.body.code, env.body.message)
            if self._declined_stats is not None and env.body.code == ErrorCode.NO_DATA:
                self._declined_stats.add(device)  # no statistics to give: gather_stats need not wait
            col = next((c for c in (self._open_col, self._collecting)
                        if c is not None and c.expects(device, env.round)), None)
            if env.body.code in (ErrorCode.NOT_TRAINING, ErrorCode.TRAIN_FAILED, ErrorCode.NO_DATA) and col is not None:
                col.declined.add(device)  # the round need not wait for it
                if env.body.code == ErrorCode.TRAIN_FAILED:
                    col.failed[device] = env.body.message
            elif env.body.code == ErrorCode.INCOMPLETE:  # a message to it lost a chunk: its plan again
                self._resend_plan(device, lost=True)
            elif env.body.code == ErrorCode.UNKNOWN_FIXED:  # it no longer holds a fixed tensor: that plan (or
                self.fixed.forget(device)  # evaluation request) whole, not the other one it may hold
                if col is not None:
                    self._resend(col, device, lost=True)
        elif isinstance(env.body, Ack):  # e.g. a published model installed: matched by its reply_to
            log.info("device %s: %s", device, env.body.note[:200])
            if device in self.devices:
                self.devices[device].last_ack = env.body.note[:200]
                if env.reply_to is not None:
                    self.devices[device].acked.append(env.reply_to)
        elif isinstance(env.body, DataCount):
            self._on_data_count(device, env.body)
        elif isinstance(env.body, FleetStats):
            if (record := self.devices.get(device)) is not None:  # weighed no more than its believed samples
                if env.body.kind == "channel_moments":
                    moments = ChannelMoments(env.body.count, env.body.mean, env.body.m2)
                    record.stats[env.body.kind] = moments.weighed_as(record.num_samples)
                else:
                    record.stats[env.body.kind] = replace(env.body, count=min(env.body.count, record.num_samples))
        elif not isinstance(env.body, Status):
            self._reject(device, ErrorCode.UNEXPECTED, f"a device may not send {env.kind!r}", env.msg_id)

    def _on_register(self, device: str, env: Envelope) -> None:
        body: Register = env.body
        try:
            profile = DeviceProfile.from_dict(body.profile)
        except (ValueError, TypeError, KeyError) as exc:
            self._reject(device, ErrorCode.BAD_PROFILE, str(exc), env.msg_id)
            return
        if not 0 <= body.num_samples <= MAX_SAMPLES:  # 0: a device whose data source is empty as yet
            self._reject(device, ErrorCode.BAD_SAMPLES, f"num_samples={body.num_samples} is impossible", env.msg_id)
            return
        if self.method is not None and body.capabilities and self.method not in body.capabilities:
            self._reject(device, ErrorCode.UNSUPPORTED_METHOD,
                         f"this job runs method {self.method!r}, which this device's edgefl SDK does not "
                         f"support (it supports {', '.join(sorted(set(body.capabilities) - {*FEATURES, SERVE}))}); "
                         "update the SDK",
                         env.msg_id)
            return
        why = self.task.refuses(body.input_shape, body.num_classes) if self.task is not None else None
        if why is not None:
            self._reject(device, ErrorCode.TASK_MISMATCH, why, env.msg_id)
            return
        self.fixed.forget(device)  # a device registers as it starts: what it held may be gone
        record = self.devices.get(device)
        if record is None:
            record = DeviceRecord(device, profile, body.num_samples, samples_since=self.rounds_collected,
                                  new_samples=body.num_samples)  # all new to this job until it trains
            self.devices[device] = record
        else:
            record.profile, record.online = profile, True
            self._presence_changes += 1
            self._accept_samples(record, body.num_samples)
        record.connection = max(record.connection, body.connection)
        record.sdk_version = body.sdk_version[:32]
        record.capabilities = body.capabilities
        if self.on_register is not None:
            self.on_register(record)
        if self.on_device_change is not None:
            self.on_device_change(record)
        log.info("registered %s (%s, %.1f GFLOPS, %d samples) as %s", device, profile.name,
                 profile.gflops, record.num_samples, record.label)
        self._reply(device, Ack(f"registered as {record.label}"), reply_to=env.msg_id)

    def _on_profile_update(self, device: str, env: Envelope) -> None:
        """A registered device measured itself again: its profile's GFLOPS (and nothing else: not
        its sample count) becomes the new figure — at once between rounds, at the end of the
        collection during one — within `FleetLimits.profile_update_interval_s`; a measurement
        the device itself judged busy is not taken."""
        body: ProfileUpdate = env.body
        record = self.devices.get(device)
        if record is None:
            self._reject(device, ErrorCode.UNKNOWN_DEVICE, "register before sending profile updates", env.msg_id)
            return
        if body.busy:
            self._reject(device, ErrorCode.BAD_PROFILE, "a measurement its device judged busy is not taken", env.msg_id)
            return
        interval = self.limits.profile_update_interval_s
        if interval > 0:
            bucket = self._profile_budget.get(device)
            if bucket is None:
                bucket = self._profile_budget[device] = TokenBucket(1.0 / interval, self.limits.profile_update_burst)
            if not bucket.take():
                self._reject(device, ErrorCode.RATE_LIMITED, f"at most one profile update per {interval:g} s "
                             f"(burst {self.limits.profile_update_burst})", env.msg_id)
                return
        try:
            quality = MeasureQuality(
                trials=body.trials, spread=body.spread, median_gflops=body.median_gflops or None,
                load_avg=None if body.load_avg < 0 else body.load_avg,
                others_cpu=None if body.others_cpu < 0 else body.others_cpu, cpu_mhz=body.cpu_mhz or None)
            source = (f"profile_update: re-measured by the device while idle ({quality.summary()}); "
                      f"registered with {record.profile.gflops:.3g} GFLOPS")
            profile = replace(record.profile, gflops=body.gflops, measured=True, quality=quality,
                              sources={**record.profile.sources, "gflops": source[:1000]})
        except ValueError as exc:
            self._reject(device, ErrorCode.BAD_PROFILE, str(exc), env.msg_id)
            return
        if self._collecting is not None or self._open_col is not None:
            self._pending_profiles[device] = profile
            self._reply(device, Ack(f"profile update taken: {body.gflops:.3g} GFLOPS from the next round"),
                        reply_to=env.msg_id)
            return
        self._reply(device, Ack(f"profile update taken: {body.gflops:.3g} GFLOPS"), reply_to=env.msg_id)
        self._apply_profile(device, profile)

    def _apply_profile(self, device: str, profile: DeviceProfile) -> None:
        record = self.devices.get(device)
        if record is None:
            return
        before, label = record.profile.gflops, record.label
        record.profile = profile
        hook = self.on_profile_update or self.on_register
        if hook is not None:
            hook(record)
        log.info("device %s re-measured itself: %.3g -> %.3g GFLOPS (samples still %d); label %s", device,
                 before, profile.gflops, record.num_samples,
                 f"{label} -> {record.label} from the next round" if record.label != label else f"{label} (unchanged)")

    def _on_data_count(self, device: str, count: DataCount) -> None:
        """A registered device's counts: its training count believed as a registration's is (growth
        bounded by `FleetLimits`), its new samples no more than that."""
        record = self.devices.get(device)
        if record is None:
            return  # it registers first (it is told so by its next status)
        # clamped here without a word: a growing source says so every reread_s between rounds, and
        # its growth is believed round by round (`_accept_samples` warns for registrations)
        limit = grown_sample_limit(record.num_samples, self.rounds_collected - record.samples_since, self.limits)
        self._accept_samples(record, min(count.training, limit))
        record.new_samples = min(count.new, record.num_samples)
        record.held_out_samples = count.held_out
        if self.on_data_count is not None:
            self.on_data_count(record)

    def _accept_samples(self, record: DeviceRecord, claimed: int) -> None:
        """A registered device's new sample count: lower at once, higher by at most the growth
        `FleetLimits` allows per round since its count last rose (the rest is not believed)."""
        limit = grown_sample_limit(record.num_samples, self.rounds_collected - record.samples_since, self.limits)
        if claimed > limit:
            log.warning("device %s claims %d samples; its count may rise to %d by now (%d before, +%g/round): "
                        "taking %d", record.device_id, claimed, limit, record.num_samples,
                        self.limits.sample_growth, limit)
            claimed = limit
        if claimed > record.num_samples:
            record.samples_since = self.rounds_collected
        record.num_samples = claimed

    def _on_status(self, device: str, env: Envelope) -> None:
        if not isinstance(env.body, Status):
            return
        record = self.devices.get(device)
        if record is None:
            if env.body.state not in ("online", "offline"):  # a device this coordinator has not
                # met (e.g. it restarted): ask it to register; a fresh device registers anyway
                log.info("status %r from unregistered device %s: asking it to register", env.body.state, device)
                self._reject(device, ErrorCode.UNKNOWN_DEVICE, "register with this coordinator", level=logging.INFO)
            return
        stamp = env.body.connection
        if env.body.state == "offline":
            if stamp < record.connection:  # e.g. a broker's late delivery of an old connection's will
                log.info("ignored a stale last will of %s (its connection %d; it has reported from %d since)",
                         device, stamp, record.connection)
                return
            record.state, record.reason, record.connection = "offline", env.body.reason, stamp
            if record.online:
                record.online, record.offline_since = False, time.monotonic()
                self._presence_changes += 1
                dropped = self.link.discard_topic(self.topics.uplink(device))
                log.warning("device %s went offline (%s); dropped %d partial transfers",
                            device, env.body.reason, dropped)
                if self.on_device_change is not None:
                    self.on_device_change(record)
            return
        # any other status is the word of a connected device
        came_back = not record.online
        record.state, record.reason, record.online = env.body.state, env.body.reason[:200], True
        self._presence_changes += int(came_back)
        record.connection = max(record.connection, stamp)
        if came_back and self.on_device_change is not None:
            self.on_device_change(record)
        self._resend_plan(device)  # if it, or we, reconnected since its plan was sent

    def _resend_plan(self, device: str, lost: bool = False) -> None:
        """A participant that (re)connected may have missed its plan (sessions are clean) or
        lost part of its upload, or it says a message to it stalled (`lost`): send it the
        round's plan again; one update still counts. At most `FleetLimits.plan_resends_per_round`
        times a round and one every `plan_resend_interval_s` (a wish that has to wait is kept,
        and met by `collect` once the interval has passed). An asynchronous job's device may have
        a plan and an evaluation request open at once: each is sent again on its own."""
        for col in (self._open_col, self._collecting):
            if col is not None:
                self._resend(col, device, lost)

    def _resend(self, col: _Collection, device: str, lost: bool) -> None:
        key = (device, col.kind.KIND)
        rnd, plan = self._plans.get(key, (None, None))
        if (plan is None or rnd is None or not col.expects(device, rnd)
                or device in col.accepted or device in col.declined):
            return
        if lost:
            col.lost.add(device)
        if not (device in col.lost or self._reconnected_since_plan(key)):
            return
        done = col.resent.get(device, 0)
        if done >= self.limits.plan_resends_per_round:
            if lost:
                self._reject(device, ErrorCode.RESEND_BUDGET, f"its plan was sent {done + 1} times in round {rnd + 1}: "
                             "no more re-sends this round")
            return
        if time.monotonic() - col.resent_at.get(device, -1e9) < self.limits.plan_resend_interval_s:
            return
        why = "a message to it stalled" if device in col.lost else "it, or this coordinator, reconnected"
        log.info("device %s: %s during round %d: sending its plan again", device, why, rnd + 1)
        col.resent[device], col.resent_at[device] = done + 1, time.monotonic()
        col.lost.discard(device)
        try:
            self.send(device, plan, rnd)
        except ConnectionError as exc:  # the next pass of `collect` tries again
            log.warning("could not re-send the plan of %s: %s", device, exc)

    def _reconnected_since_plan(self, key: tuple[str, str]) -> bool:
        """Has the device or the coordinator reconnected since the device's plan (``key``: the
        device and its answer's kind) was sent? (A device whose connection was unknown then — no
        status heard yet — counts as unchanged.)"""
        device = key[0]
        device_then, ours_then = self._plan_sent_over.get(key, (0, 0))
        device_now, ours_now = self._connections(device)
        return ours_now != ours_then or (device_then != 0 and device_now != device_then)

    def _on_update(self, device: str, env: Envelope, nbytes: int) -> None:
        """An `Update` (or an `Evaluation`) for the open collection, checked; an update of more
        samples than the device registered counts when its data grew no faster than
        `FleetLimits` allows (`_grow_samples`)."""
        what = env.kind  # "update" or "evaluation"
        record = self.devices.get(device)
        if record is None:
            self._reject(device, ErrorCode.UNKNOWN_DEVICE, f"register before sending an {what}", env.msg_id)
            return
        col = self._open_col if self._open_col is not None and isinstance(env.body, Update) else self._collecting
        if (isinstance(env.body, Update) and record.miss_bits & 1 and env.round == record.last_asked
                and env.round - record.took_back >= MISS_WINDOW):
            log.info("device %s sent its update of round %d late: that round no longer counts as missed",
                     device, env.round + 1)
            record.miss_bits &= ~1  # slow, not silent (whatever the update holds: it is not counted)
            record.took_back = env.round  # once in a window: late updates after every silence do not wipe it
        if col is None or not isinstance(env.body, col.kind) or env.round != col.tag_of(device):
            current = "none" if col is None else col.collecting(device)
            self._reject(device, ErrorCode.WRONG_ROUND, f"{what} for round {env.round + 1}; collecting: {current}",
                         env.msg_id)
            return
        if device not in col.participants:
            self._reject(device, ErrorCode.NOT_PARTICIPANT, f"not asked for an {what} in round {env.round + 1}",
                         env.msg_id)
            return
        if device in col.accepted:
            self._reject(device, ErrorCode.DUPLICATE, f"an {what} for round {env.round + 1} was already accepted",
                         env.msg_id)
            return
        body, checked = env.body, record
        if isinstance(body, Update) and body.fixed:  # fixed tensors it holds, sent back as digests
            sent = self._plans.get((device, Update.KIND))
            try:
                body = self.fixed.restore(body, sent[1] if sent is not None and sent[0] == env.round else None)
            except UpdateRejected as exc:
                self._reject(device, exc.code, exc.message, env.msg_id)
                return
        complete = body
        if isinstance(body, Update) and body.num_samples > record.num_samples:
            # its data grew: the update is checked against what it claims, and weighs what is believed
            believed = self._grow_samples(record, body.num_samples)
            checked = replace(record, num_samples=min(body.num_samples, MAX_SAMPLES))
            if believed < body.num_samples:
                body = replace(body, num_samples=believed)
        try:
            col.check(checked, complete)
        except UpdateRejected as exc:
            self._reject(device, exc.code, exc.message, env.msg_id)
            return
        if isinstance(body, Evaluation):
            col.accepted[device] = body
            if body.num_samples:
                record.last_evaluation = (env.round, body.num_samples, body.correct, body.label)
            return  # nothing to acknowledge: the device does not wait for it
        col.accepted[device] = self.spool.keep(ReceivedUpdate(device, env.round, body, nbytes))
        self.fixed.holds(device, env.body.fixed)
        self._reply(device, Ack(f"update for round {env.round + 1} accepted"), rnd=env.round, reply_to=env.msg_id)

    def _grow_samples(self, record: DeviceRecord, claimed: int) -> int:
        """A device whose data grew (it re-reads its source each round) trains on more samples
        than it registered: its count rises to the claim, or to what `FleetLimits` lets it grow
        to since its count last rose (the round being collected included); returns the count
        believed, which is what its update weighs. A hostile claim weighs no more than honest
        growth; an honest device growing faster catches up over the next rounds."""
        limit = grown_sample_limit(record.num_samples, self.rounds_collected + 1 - record.samples_since, self.limits)
        believed = min(claimed, limit, MAX_SAMPLES)
        if believed < claimed:
            log.warning("round %d: device %s trains on %d samples; its count may rise to %d by now (%d before, "
                        "+%g/round): its update weighs %d", self.rounds_collected + 1, record.device_id, claimed,
                        believed, record.num_samples,
                        self.limits.sample_growth, believed)
        else:
            log.info("round %d: device %s now trains on %d samples (%d before)", self.rounds_collected + 1,
                     record.device_id, claimed, record.num_samples)
        if believed > record.num_samples:
            record.num_samples, record.samples_since = believed, self.rounds_collected + 1
        return believed

    def _count_up(self, device: str, nbytes: int) -> None:
        if device in self.devices:
            self.devices[device].bytes_up += nbytes

    def _reply(self, device: str, body: object, rnd: int = -1, reply_to: str | None = None) -> bool:
        """Send a reply; a failure (the outgoing queue full, the connection gone) is logged, never raised."""
        try:
            self.send(device, body, rnd, reply_to=reply_to)
            return True
        except (ValueError, ConnectionError) as exc:  # e.g. a device id that is not a valid topic
            log.warning("could not send %s to %s: %s", type(body).__name__, device, exc)
            return False

    def _reject(self, device: str, code: ErrorCode | str, message: str, reply_to: str | None = None,
                count: int = 1, level: int = logging.WARNING) -> None:
        """Record ``count`` rejections of ``device``'s input and tell it — within its error-reply
        budget: a rejection over it is counted, and the next reply sent names how many were.
        ``level``: of its log line (INFO for what is expected, e.g. after the coordinator restarted)."""
        code = str(code)  # kept and reported as the plain wire string
        self.rejections.append((device, code, message[:1000]))
        self.rejection_count += count
        bucket = self._reply_budget.get(device)
        if bucket is None:
            if len(self._reply_budget) >= 100_000:  # bounded: forget the buckets of the oldest devices
                for old in list(self._reply_budget)[:1000]:
                    del self._reply_budget[old]
            bucket = self._reply_budget[device] = TokenBucket(self.limits.error_replies_per_s,
                                                              max(1, self.limits.error_reply_burst))
        if not bucket.take():
            suppressed = self._suppressed.get(device, 0)
            self._suppressed[device] = suppressed + count
            if suppressed == 0:
                log.log(level, "rejected input from %s: %s: %s (more of its rejections are only counted, "
                        "at most %g replies/s)", device, code, message[:300], self.limits.error_replies_per_s)
            return
        log.log(level, "rejected input from %s: %s: %s", device, code, message[:300])
        if suppressed := self._suppressed.pop(device, 0):
            message = f"{message} ({suppressed} more rejections since the last reply were not answered)"
        self._reply(device, Error(code, message[:1000]), reply_to=reply_to)
