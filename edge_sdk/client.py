"""The device: registers with the coordinator, trains on plans, uploads updates.

Only compact messages leave the device: its profile, its sample count, and the
tensors a method uploads. Its data stays in `LocalData`.
"""

from __future__ import annotations

import hashlib
import logging
import threading
import time
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Callable

import numpy as np

from edge_sdk.accelerator import resolve_device
from edge_sdk.evaluation import evaluate_holdout
from edge_sdk.holdout import check_holdout, split_holdout
from edge_sdk.link import LinkConfig, MessageLink, Received, Rejected
from edge_sdk.model_store import ModelRejected, installed_issued_ms, installed_sha256, save_model
from edge_sdk.methods import DEVICE_METHODS, DeviceContext, LocalData, device_method
from edge_sdk.network_loop import NetworkLoop
from edge_sdk.preprocessing import Preprocessing
from edge_sdk.profiling import (
    BUSY_OTHERS_MIN, BUSY_OTHERS_SHARE, REPORT_CHANGE, CpuWatch, DeviceProfile, changed_enough,
    measure_flops_detail, with_measurement,
)
from edge_sdk.protocol.codec import packb
from edge_sdk.protocol.errors import ErrorCode, ProtocolError
from edge_sdk.protocol.messages import (
    Ack, Envelope, Error, Evaluate, Evaluation, Model, Plan, ProfileUpdate, Register, RoundStart, Status, Stop, Update,
    encode_envelope,
)
from edge_sdk.protocol.topics import Topics
from edge_sdk.schedule import Decision, SchedulePolicy, SystemMonitor, apply_caps
from edge_sdk.signing import SignatureRejected, key_id, verify_model
from edge_sdk.throttle import Throttle
from edge_sdk.training import TrainingStopped
from edge_sdk.transport import MqttTransport, TransportConfig, TransportError, Will
from edge_sdk.update_resend import UnansweredUpdate

if TYPE_CHECKING:
    from edge_sdk.sources import DataSource

__all__ = ["ClientConfig", "DeviceClient", "RoundTrained", "SDK_VERSION", "plan_digest"]

SDK_VERSION = "0.4.0"
log = logging.getLogger(__name__)
#: Before re-measuring, the device watches the machine this long: the rest of it must stay idle.
IDLE_WATCH_S = 5.0
#: A re-measurement that found the device busy (or a busy start-up figure) is tried again this soon.
BUSY_RETRY_S = 300.0


@dataclass(frozen=True)
class ClientConfig:
    """Everything a device needs to join a federation."""

    device_id: str
    transport: TransportConfig = field(default_factory=TransportConfig)
    job: str = "default"
    link: LinkConfig = field(default_factory=LinkConfig)
    state_dir: str | None = None
    heartbeat_s: float = 30.0
    register_retry_s: float = 5.0
    seed: int = 0
    schedule: SchedulePolicy = field(default_factory=SchedulePolicy)
    #: where local training runs: auto (a CUDA GPU when torch sees one), cpu, cuda or cuda:N
    device: str = "auto"
    #: keep retrying a failed first connection to the broker this long (0: fail at once, with
    #: the reason), e.g. while a simulation's hundreds of devices connect at the same time
    connect_retry_s: float = 0.0
    #: raw Ed25519 public keys of the coordinator (edge_sdk/signing.py): with any, only models signed
    #: by one of them for this device and job, and not older than the installed one, are installed;
    #: with none, published models are installed unchecked (as before signing), with a warning
    trusted_keys: tuple[bytes, ...] = ()
    #: measure the compute again this often (seconds; 0: never), between rounds and only when the
    #: machine looks idle; a figure more than 25 % off the reported one is sent (`ProfileUpdate`)
    remeasure_every_s: float = 0.0
    #: seconds a (re-)measurement takes (`edge_sdk.profiling.measure_flops_detail`)
    measure_seconds: float = 1.0
    #: share of its data the device holds out of training for federated evaluation, chosen by each
    #: sample's stable key (edge_sdk/holdout.py): a fraction in (0, 0.9]; 0: none (it answers an
    #: evaluation with none); None: the held-out set its data source names (an npz's x_test/y_test)
    holdout: float | None = 0.0
    #: an update the coordinator has not answered (ack or error) after this many seconds is sent
    #: again, then after twice and four times as long, while its round is open (0: never); its loss
    #: on the way (e.g. the broker's queue to the coordinator full after a flood) costs no round
    update_resend_s: float = 15.0
    #: how many times at most (edge_sdk/update_resend.py)
    update_resends: int = 3

    def __post_init__(self) -> None:
        if self.holdout is not None and self.holdout != 0:
            check_holdout(self.holdout, "holdout")
        if not (isinstance(self.update_resend_s, (int, float)) and 0 <= self.update_resend_s < float("inf")):
            raise ValueError(f"update_resend_s must be a number of seconds >= 0, got {self.update_resend_s!r}")
        if type(self.update_resends) is not int or not 0 <= self.update_resends <= 100:
            raise ValueError(f"update_resends must be an integer in [0, 100], got {self.update_resends!r}")


@dataclass(frozen=True)
class RoundTrained:
    """What a device did in one round, for a one-line log of it."""

    round: int
    method: str
    label: str
    samples: int
    loss: float
    seconds: float  # wall-clock of the local training here
    bytes_down: int  # the plan's payload
    bytes_up: int  # the update's payload


def _short(values: tuple[float, ...]) -> str:
    return "[" + ", ".join(f"{v:.4g}" for v in values[:4]) + (", ...]" if len(values) > 4 else "]")


def plan_digest(plan: Plan) -> str:
    """SHA-256 over a plan's method, label, spec, settings and tensor bytes (identifies a re-sent plan)."""
    h = hashlib.sha256(packb([plan.method, plan.label, plan.model_spec, plan.train, plan.preprocessing]))
    for name in sorted(plan.tensors):
        tensor = np.ascontiguousarray(plan.tensors[name])
        h.update(packb([name, tensor.dtype.str, list(tensor.shape)]))
        h.update(tensor.reshape(-1).view(np.uint8))
    return h.hexdigest()


class DeviceClient:
    """Runs one device until the coordinator says stop (or `stop()` is called)."""

    def __init__(self, config: ClientConfig, data: LocalData | None, profile: DeviceProfile,
                 throttle: Throttle | None = None,
                 on_round: Callable[[RoundTrained], None] | None = None,
                 run_compute: Callable[[Callable[[], object]], object] | None = None,
                 source: "DataSource | None" = None, test: LocalData | None = None,
                 network: NetworkLoop | None = None,
                 connect_via: Callable[[TransportConfig], MqttTransport] | None = None) -> None:
        self.config = config
        for key in config.trusted_keys:
            key_id(key)  # a raw 32-byte Ed25519 public key, or a ValueError now rather than at the first model
        self.torch_device = resolve_device(config.device)
        #: where the torch part of a round runs (None: on this device's own thread); simulated
        #: devices of one process hand it to one shared thread (simulation/training_queue.py)
        self.run_compute = run_compute
        self.on_round = on_round  # called after every round this device trained and uploaded
        #: called on the network thread when a message for this device arrived (or `stop` was
        #: called): a host driving many devices by `step` sets it before `open` (None: `run` polls)
        self.on_ready: Callable[[], None] | None = None
        #: called with the round of every round announcement this device hears (a simulation's host
        #: tells its other devices that the rounds before are over: `forget_updates_before`)
        self.on_round_start: Callable[[int], None] | None = None
        #: its last update (kept to answer a re-sent plan) is dropped at its next step once it is
        #: older than this round: the coordinator re-sends only the open round's plans
        self.forget_updates_before = -1
        #: the loop that drives this device's MQTT connection with others' (a simulation's); None:
        #: a network thread of its own (edge_sdk/network_loop.py)
        self.network = network
        #: builds this device's connection from its settings (a simulation's host carries many
        #: devices over one: simulation/shared_connection.py); None: an `MqttTransport` of its own
        self.connect_via = connect_via
        #: where the data comes from, read again at the start of every round the device trains
        #: (edge_sdk/sources); None: ``data`` as given, for good
        self.source = source
        self.data = data  # what it trains on (its held-out share removed: `_use_data`)
        self.holdout: LocalData | None = None  # what it evaluates on
        self._holdout_note = ""  # why it holds nothing out
        self.evaluations: list[Evaluation] = []  # what it answered the coordinator's evaluations
        self.profile = profile
        self.throttle = throttle
        self.topics = Topics(job=config.job)
        self.rounds_trained: list[int] = []
        self.errors: list[Error] = []
        self.published_model: Model | None = None  # the latest model the coordinator published
        self._stop = threading.Event()
        self._finished = False  # `finish` ran
        self._registered = False
        self._register_id: str | None = None
        self._last_register = 0.0
        self._last_heartbeat = 0.0
        self._memory: dict[str, object] = {}  # what device parts keep between rounds (DeviceContext.memory)
        self.link: MessageLink | None = None
        self.monitor = SystemMonitor(config.schedule)
        self.declined: list[int] = []  # rounds whose plan the schedule declined
        self._pending: tuple[Envelope, float] | None = None  # plan waiting for the schedule
        #: (round, plan digest, update) of the last round trained, to answer a re-sent plan
        self._last_update: tuple[int, str, Update] | None = None
        self.resent_updates: list[int] = []  # rounds whose update was sent again instead of retraining
        #: its latest update while the coordinator has not answered it (edge_sdk/update_resend.py)
        self._unanswered: UnansweredUpdate | None = None
        self.unanswered_resends: list[int] = []  # rounds whose update was sent again for want of an answer
        self._next_check = 0.0
        self._warned_unsigned = False  # said once that models are installed without checking who signed them
        #: re-measuring (`ClientConfig.remeasure_every_s`): the figure the coordinator has, when the
        #: next one is due, the watch on the machine's idleness before it, a round it awaits a plan of
        self._reported_gflops = profile.gflops
        busy_start = profile.quality is not None and profile.quality.busy
        every = config.remeasure_every_s
        self._remeasure_at = (time.monotonic() + (min(every, BUSY_RETRY_S) if busy_start else every) if every > 0
                              else float("inf"))  # never: an idle device sleeps until its heartbeat
        if busy_start:
            log.warning("%s: measured %.1f GFLOPS while busy (%s): %s", config.device_id, profile.gflops,
                        profile.quality.reason, f"measuring again when idle, in {min(every, BUSY_RETRY_S):.0f} s "
                        "or later" if every > 0 else "the figure stays ([device] remeasure_every_s = 0)")
        self._idle_watch: tuple[CpuWatch, float] | None = None
        self._expect_plan_until = 0.0
        self._profile_update_id: str | None = None
        self.profile_updates: list[ProfileUpdate] = []  # the new measurements sent to the coordinator
        #: how a re-measurement is taken: ``measure_flops_detail``'s result (tests substitute it)
        self.measure_compute: Callable[[], dict] = lambda: measure_flops_detail(
            seconds=config.measure_seconds, device=str(self.torch_device))
        #: the job's normalisation the last plan named, and the data converted to it (`_job_data`)
        self._job_preprocessing: Preprocessing | None = None
        self._job_data_cache: LocalData = data
        self._use_data(data, test)

    def _use_data(self, data: LocalData | None, test: LocalData | None = None) -> None:
        """Train on ``data`` less its held-out share (`ClientConfig.holdout`), or hold out ``test``."""
        holdout = self.config.holdout
        self._job_preprocessing = None
        if data is None:
            self.data = LocalData(np.zeros((0,), np.float32), np.zeros(0, np.int64), 0)
            self.holdout, self._holdout_note = None, "it has no data"
        elif holdout is None:
            self.data, self.holdout = data, test
            self._holdout_note = "" if test is not None else "its data source names no held-out set"
        elif holdout == 0:
            self.data, self.holdout, self._holdout_note = data, None, "it holds out no data ([data] holdout)"
        else:
            split = split_holdout(data, holdout)
            self.data, self.holdout, self._holdout_note = split.train, split.holdout, split.note
        self._job_data_cache = self.data

    # -- public -----------------------------------------------------------
    def stop(self) -> None:
        """Ask the run loop to finish after the current step (it wakes at once if it waits)."""
        self._stop.set()
        self._wake()

    def _wake(self) -> None:
        if self.link is not None:
            self.link.transport.wake()

    def report_capacity(self, profile: DeviceProfile) -> None:
        """Re-register with a new profile (CPU load, throttling, battery); the coordinator
        may then give this device another model from the next round on. Thread-safe: the
        run loop sends the Register on its next pass (after the current round's training)."""
        if not isinstance(profile, DeviceProfile):
            raise ValueError(f"profile must be a DeviceProfile, got {type(profile).__name__}")
        self.profile = profile
        self._reported_gflops = profile.gflops
        self._registered = False
        self._last_register = 0.0
        self._wake()

    def run(self, timeout_s: float | None = None) -> str:
        """Connect, register and serve plans; returns why it ended.

        Ctrl-C (KeyboardInterrupt) stops it cleanly: training stops after its current step,
        the device says "offline" to the coordinator and disconnects, then the interrupt
        propagates."""
        self.open()
        assert self.link is not None
        reason = "stopped"
        try:
            reason = self._loop(timeout_s)
        except KeyboardInterrupt:
            self._stop.set()
            self.finish("interrupted", wait_s=2.0)
            raise
        finally:
            self.finish(reason)  # no-op after an interrupt's
        return reason

    def open(self) -> None:
        """Connect to the broker (blocking until the first CONNACK, retrying for
        ``connect_retry_s``) and subscribe; then `step` (or `run`) serves the device. A host that
        drives many devices (simulation/sim_devices.py) calls it, `step` and `finish` itself."""
        transport_config = replace(
            self.config.transport,
            client_id=self.config.transport.client_id or self.config.device_id,
            will=self._presence("offline", "connection lost"),
            birth=self._presence("online", "connected"),  # after every reconnect too
        )
        for cap in apply_caps(self.config.schedule):
            log.info("%s: %s", self.config.device_id, cap)
        transport = (MqttTransport(transport_config, network=self.network) if self.connect_via is None
                     else self.connect_via(transport_config))
        transport.on_ready = self.on_ready
        # subscribed on connect, before the birth message: what answers it reaches us
        transport.subscribe(self.topics.downlink(self.config.device_id))
        transport.subscribe(self.topics.broadcast())
        try:
            self._connect(transport)
        except BaseException:
            transport.close()
            raise
        self.link = MessageLink(transport, self.config.link)
        self._last_heartbeat = time.monotonic()  # the birth message said "online"

    def step(self, max_messages: int = 64) -> str | float:
        """One pass of the device without waiting: its due duties (registration, a held plan,
        heartbeat, re-measuring), then up to ``max_messages`` of the messages that have arrived.
        Returns why it ended, or the seconds until it has something to do again unless a
        message comes first (`on_ready` says when one does; 0: more are waiting)."""
        if self._stop.is_set():
            return "stopped"
        if self.link is None:  # a message came while `open` was still connecting: the host steps it after
            return 1.0
        self._duties(time.monotonic())
        for _ in range(max_messages):
            item = self.link.poll(0)
            if item is None:
                return self._idle_wait(time.monotonic())
            if (reason := self._on_item(item)) is not None:
                return reason
            if self._stop.is_set():
                return "stopped"
        return 0.0

    def abort(self) -> None:
        """Stop at once and drop the connection without a word, as a device that loses power:
        the broker publishes its will ("offline", "connection lost"). A simulation's host ends
        its devices so when the job is over (its broker does the work, not the host)."""
        self._stop.set()
        if self.link is not None and not self._finished:
            self._finished = True
            self.link.transport.abort()

    def finish(self, reason: str, wait_s: float = 10.0) -> None:
        """Say "offline" (with ``reason``) to the coordinator, wait up to ``wait_s`` for what is
        unsent to be acknowledged, and disconnect."""
        if self.link is None or self._finished:
            return
        self._finished = True
        transport = self.link.transport
        try:
            self._status("offline", reason)
            transport.wait_published(wait_s)
        except (TransportError, ProtocolError, ConnectionError) as exc:
            log.warning("%s: could not say offline: %s", self.config.device_id, exc)
        finally:
            transport.close()

    def _presence(self, state: str, reason: str) -> Callable[[int], Will]:
        """The retained status `state` of one connection (its will or its birth message),
        stamped with that connection, so the coordinator can tell a late will of an old
        connection from news about the current one."""
        topic = self.topics.status(self.config.device_id)

        def build(stamp: int) -> Will:
            env = Envelope.of(Status(state, reason, connection=stamp), self.config.device_id)
            return Will(topic, encode_envelope(env), qos=1, retain=True)
        return build

    # -- loop -------------------------------------------------------------
    def _connect(self, transport: MqttTransport) -> None:
        give_up = time.monotonic() + self.config.connect_retry_s
        pause = 0.5
        while True:
            try:
                return transport.connect()
            except TransportError as exc:
                if self._stop.is_set() or time.monotonic() + pause > give_up:
                    raise
                log.info("%s: %s; retrying in %.1f s", self.config.device_id, exc, pause)
                self._stop.wait(pause)
                pause = min(2 * pause, 5.0)

    def _loop(self, timeout_s: float | None) -> str:
        end = None if timeout_s is None else time.monotonic() + timeout_s
        while not self._stop.is_set():
            now = time.monotonic()
            if end is not None and now > end:
                return "timeout"
            wait = self._duties(now)
            assert self.link is not None
            # a message wakes it at once, and so does one that begins to arrive in chunks (it may
            # stall: see `_idle_wait`); otherwise it sleeps until its next duty
            item = self.link.poll(wait if end is None else max(0.0, min(wait, end - now)), wake_on_partial=True)
            if item is not None and (reason := self._on_item(item)) is not None:
                return reason
        return "stopped"

    def _duties(self, now: float) -> float:
        """What is due now: register, retry a held plan, heartbeat, ask for stalled transfers,
        re-measure; then how long the device may sleep when no message comes."""
        if not self._registered and now - self._last_register >= self.config.register_retry_s:
            self._register()
        if self._pending is not None and now >= self._next_check:
            self._retry_pending()
        if self._last_update is not None and self._last_update[0] < self.forget_updates_before:
            self._last_update = None  # a later round began: no plan of its round comes again
        if self._unanswered is not None and now >= self._unanswered.due_at:
            self._resend_unanswered()
        if now - self._last_heartbeat >= self.config.heartbeat_s:
            self._heartbeat()
        self._report_stalled_transfers()
        self._maybe_remeasure()
        return self._idle_wait(now)

    def _on_item(self, item: Received | Rejected) -> str | None:
        """Handle what the link gave; why the device ends, if it does."""
        if isinstance(item, Rejected):
            log.warning("%s: dropped a malformed message: %s", self.config.device_id, item.error)
            return None
        return self._handle(item.envelope)

    def _idle_wait(self, now: float) -> float:
        """How long the loop may sleep when no message comes: until its next registration while
        it is not registered; a second while it holds a plan, has a message half received or
        re-measures; else until its next heartbeat, or the end of its wait for an announced plan
        (a message wakes it: an idle device of a large simulation costs no wake-ups, nor does one
        whose plan comes minutes after the announcement, in a round where 10,000 devices train);
        sooner when an update the coordinator has not answered is due again."""
        wait = self._next_wake(now)
        if self._unanswered is not None:  # an update to send again
            wait = min(wait, max(0.05, self._unanswered.due_at - now))
        return wait

    def _next_wake(self, now: float) -> float:
        """`_idle_wait` but for an unanswered update."""
        assert self.link is not None
        if not self._registered:  # until its next registration (the ack, a message, wakes it sooner)
            return max(0.05, min(1.0 if self._last_register == 0 else self.config.register_retry_s,
                                 self._last_register + self.config.register_retry_s - now))
        busy = (self._pending is not None or self.link.pending_transfers() or self._idle_watch is not None
                or self._remeasure_at - now < 1.0)
        if busy:
            return 1.0
        wake = min(self._last_heartbeat + self.config.heartbeat_s, self._remeasure_at)
        if now < self._expect_plan_until:  # re-measuring may start when the wait ends
            wake = min(wake, self._expect_plan_until)
        return max(0.05, wake - now)

    def _report_stalled_transfers(self) -> None:
        """A message from the coordinator whose chunks stopped coming (one was lost on the way)
        is asked for again: `error{code: "incomplete"}` makes it re-send the open round's plan."""
        assert self.link is not None
        for sender, transfer_id, got, count in self.link.expire():
            log.warning("%s: a message from %s stalled at %d/%d chunks: asking for it again",
                        self.config.device_id, sender, got, count)
            self._send(Error(ErrorCode.INCOMPLETE, f"transfer {transfer_id} timed out with {got}/{count} chunks"), -1)

    def _handle(self, env: Envelope) -> str | None:
        body = env.body
        pending = self._unanswered
        if pending is not None and isinstance(body, (Ack, Error)) and pending.answered_by(env.reply_to):
            self._unanswered = None  # accepted, or refused for good (a duplicate, a closed round)
        if isinstance(body, Ack) and env.reply_to == self._register_id:
            self._registered = True
        elif isinstance(body, Plan):
            self._on_plan(env)
        elif isinstance(body, Evaluate):
            self._on_evaluate(env)
        elif isinstance(body, Error):
            self.errors.append(body)
            log.warning("%s: coordinator error %s: %s", self.config.device_id, body.code, body.message)
            if body.code == ErrorCode.UNKNOWN_DEVICE:
                self._registered = False
                self._last_register = 0.0
            if body.code in (ErrorCode.UNSUPPORTED_METHOD, ErrorCode.TASK_MISMATCH):  # retrying cannot help:
                return f"the coordinator turned this device away: {body.message}"  # a method or data this job lacks
            if body.code == ErrorCode.KIND and env.reply_to is not None and env.reply_to == self._profile_update_id:
                log.warning("%s: the coordinator does not take profile updates (an older edgefl): not "
                            "re-measuring any more", self.config.device_id)
                self._remeasure_at = float("inf")
        elif isinstance(body, RoundStart):  # a plan follows for each participant: no re-measuring meanwhile
            if self._unanswered is not None and env.round > self._unanswered.round:
                self._unanswered = None  # a later round: the coordinator takes no update of that one now
            if self.config.device_id in body.participants:
                self._expect_plan_until = time.monotonic() + min(body.deadline_s, 3600.0)
            if self.on_round_start is not None:
                self.on_round_start(env.round)
        elif isinstance(body, Model):
            self._on_model(env)
        elif isinstance(body, Stop):
            return body.reason or "stopped by coordinator"
        elif isinstance(body, Status) and self._registered:  # the coordinator (re)connected: a roll call,
            self._heartbeat()  # answered at once (an unregistered device's registration is its answer)
        return None

    def _on_model(self, env: Envelope) -> None:
        """Install the inference model the coordinator published (see edge_sdk/model_store.py), if
        its signature checks out (edge_sdk/signing.py); a refusal is answered `error{bad_model}`."""
        model: Model = env.body
        state_dir = self.config.state_dir
        claimed = bytes(model.sha256)
        if (state_dir is not None and claimed.hex() == installed_sha256(state_dir)
                and hashlib.sha256(model.data).digest() == claimed):
            # an intact copy of the installed model, e.g. the retained one the broker hands out on every connect
            self.published_model = model
            self._send_reply(Ack(f"model for round {model.round + 1} already installed"), env)
            return
        try:
            self._check_origin(model)
        except SignatureRejected as exc:
            log.error("%s: published model of round %d refused: %s", self.config.device_id, model.round + 1, exc)
            self._send_reply(Error(ErrorCode.BAD_MODEL, f"refused: {exc}"[:1000]), env)
            return
        self.published_model = model
        if state_dir is None:
            log.info("%s: model for %s (round %d) kept in memory: no state_dir to save it in",
                     self.config.device_id, model.label, model.round + 1)
            self._send_reply(Ack(f"model for round {model.round + 1} kept in memory"), env)
            return
        try:
            path = save_model(state_dir, model)
        except (ModelRejected, OSError) as exc:
            log.error("%s: published model refused: %s", self.config.device_id, exc)
            self._send_reply(Error(ErrorCode.BAD_MODEL, str(exc)[:1000]), env)
            return
        log.info("%s: installed the %s model of round %d (%s) at %s", self.config.device_id, model.label,
                 model.round + 1, f"signed by key {model.key_id}" if self.config.trusted_keys else "unchecked", path)
        self._send_reply(Ack(f"model for round {model.round + 1} installed"), env)

    def _check_origin(self, model: Model) -> None:
        """Raise `SignatureRejected` unless a trusted key signed ``model`` for this device and job,
        no earlier than the model it has; without trusted keys, warn once and let it through."""
        if not self.config.trusted_keys:
            if not self._warned_unsigned:
                self._warned_unsigned = True
                log.warning("%s: installing published models without checking who signed them: no trusted "
                            "coordinator key; add its model-signing.pub as [security] trusted_keys in the "
                            "client config (docs/deploy.md, \"Signed models\")", self.config.device_id)
            return
        if self.config.state_dir is not None:
            not_before = installed_issued_ms(self.config.state_dir)
        else:
            not_before = self.published_model.issued_ms if self.published_model is not None else 0
        verify_model(model, self.config.trusted_keys, self.config.job, self.config.device_id, not_before)

    def _train(self, rnd: int, plan: Plan) -> Update | None:
        self._status("training")
        if self.throttle is not None:
            self.throttle.apply_transfer(sum(t.nbytes for t in plan.tensors.values()), "down")
        # on a shared compute thread the throttle only counts: this device sleeps its share afterwards
        deferred = self.run_compute is not None and self.throttle is not None and self.throttle.mode == "sleep"
        ctx = DeviceContext(
            device_id=self.config.device_id, round=rnd, seed=self.config.seed,
            state_dir=Path(self.config.state_dir) if self.config.state_dir else None,
            throttle=replace(self.throttle, mode="virtual") if deferred else self.throttle,
            stop=self._stop, device=self.torch_device, memory=self._memory,
        )
        started = time.monotonic()
        if self.source is not None and not self._read_source(rnd):
            return None
        try:
            data = self._job_data(plan)
            method = device_method(plan.method)
            if self.run_compute is None:
                update = method(plan, data, ctx)
            else:
                update = self.run_compute(lambda: method(plan, data, ctx))
        except TrainingStopped:
            log.info("%s: round %d stopped: the device is shutting down", self.config.device_id, rnd + 1)
            return None
        except (KeyError, ValueError, RuntimeError, ArithmeticError) as exc:
            log.error("%s: round %d failed: %s", self.config.device_id, rnd + 1, exc)
            self._send(Error(ErrorCode.TRAIN_FAILED, str(exc)[:1000]), rnd)
            self._status("idle", f"round {rnd + 1} failed: {exc}"[:200])
            return None
        if deferred:
            assert self.throttle is not None
            self.throttle.settle(float(update.metrics.get("compute_s", 0.0)),
                                 float(update.metrics.get("train_seconds", 0.0)))
        if self.throttle is not None:
            self.throttle.apply_transfer(sum(t.nbytes for t in update.tensors.values()), "up")
        self.rounds_trained.append(rnd)  # before sending: whoever sees the update sees it counted
        self._send_update(update, rnd)
        self._status("idle")
        if self.on_round is not None:
            self.on_round(RoundTrained(
                rnd, plan.method, plan.label, update.num_samples, float(update.metrics.get("loss", float("nan"))),
                time.monotonic() - started, sum(t.nbytes for t in plan.tensors.values()),
                sum(t.nbytes for t in update.tensors.values())))
        return update

    def _read_source(self, rnd: int) -> bool:
        """Read the data source again (it may have grown); a missing or empty one is answered
        ``no_data`` and the device stays in the fleet, training nothing this round."""
        from edge_sdk.sources import NoData

        assert self.source is not None
        try:
            read = self.source.read()
        except NoData as exc:
            log.warning("%s: round %d: no data: %s", self.config.device_id, rnd + 1, exc)
            self._use_data(None)
            self._send(Error(ErrorCode.NO_DATA, str(exc)[:1000]), rnd)
            self._status("idle", f"no data: {exc}"[:200])
            return False
        except (ValueError, OSError) as exc:
            log.error("%s: round %d: reading %s failed: %s", self.config.device_id, rnd + 1,
                      self.source.description, exc)
            self._send(Error(ErrorCode.NO_DATA, f"reading its data failed: {exc}"[:1000]), rnd)
            self._status("idle", f"reading its data failed: {exc}"[:200])
            return False
        before = len(self.data)
        self._use_data(read.data, read.test)
        if len(self.data) != before:
            log.info("%s: round %d: %d samples to train on (%d before)", self.config.device_id, rnd + 1,
                     len(self.data), before)
        return True

    # -- federated evaluation -------------------------------------------------
    def _on_evaluate(self, env: Envelope) -> None:
        """Evaluate the model the coordinator names on the held-out data, and answer with the
        counts (never a sample); with none held out, an evaluation of no samples saying why."""
        request: Evaluate = env.body
        ctx = DeviceContext(device_id=self.config.device_id, round=env.round, seed=self.config.seed,
                            state_dir=Path(self.config.state_dir) if self.config.state_dir else None,
                            stop=self._stop, device=self.torch_device, memory=self._memory)
        try:
            holdout = self._job_holdout(request)
            if self.run_compute is None:
                result = evaluate_holdout(request, holdout, ctx, self._holdout_note)
            else:
                result = self.run_compute(lambda: evaluate_holdout(request, holdout, ctx, self._holdout_note))
        except TrainingStopped:
            return
        except (KeyError, ValueError, RuntimeError, ArithmeticError) as exc:
            log.error("%s: evaluation of round %d failed: %s", self.config.device_id, env.round + 1, exc)
            result = Evaluation(request.label, 0, 0, 0.0, reason=f"evaluation failed: {exc}"[:300])
        assert isinstance(result, Evaluation)
        self.evaluations.append(result)
        if result.num_samples:
            log.info("%s: round %d: the %s model scores %.4f on its %d held-out samples", self.config.device_id,
                     env.round + 1, request.label, result.correct / result.num_samples, result.num_samples)
        self._send_reply(result, env)

    def _job_holdout(self, request: Evaluate) -> LocalData | None:
        """The held-out data in the normalisation ``request`` names."""
        if self.holdout is None or request.preprocessing is None:
            return self.holdout
        return self.holdout.normalised_as(Preprocessing.from_dict(request.preprocessing))

    def _job_data(self, plan: Plan) -> LocalData:
        """The device's data in the normalisation the plan names (converted once per job and
        kept: `LocalData.normalised_as`; raw uint8 bytes, a simulated device's shard, are converted
        each time and not kept); the data as loaded when the plan names none."""
        if plan.preprocessing is None:
            return self.data
        job = Preprocessing.from_dict(plan.preprocessing)
        own = self.data.preprocessing
        if own is not None and own.is_raw and self.data.x.dtype == np.uint8:
            return self.data.normalised_as(job)  # as cheap as a copy: none kept (a simulated device's bytes)
        if self._job_preprocessing is None or not self._job_preprocessing.same_normalisation(job):
            if own is not None and not own.same_normalisation(job):
                log.info("%s: normalising its data with the job's statistics (mean %s, std %s) instead of "
                         "its own", self.config.device_id, _short(job.mean), _short(job.std))
            self._job_data_cache = self.data.normalised_as(job)
            self._job_preprocessing = job
        return self._job_data_cache

    @property
    def holds_update(self) -> bool:
        """Whether it keeps its last update (to answer that round's plan if it comes again)."""
        return self._last_update is not None

    # -- schedule (see edge_sdk/schedule.py) --------------------------------
    def _on_plan(self, env: Envelope) -> None:
        """Train now if the schedule allows; else hold the plan up to `wait_s`, then decline it.

        A plan the device already trained (the coordinator re-sends it after a reconnect, when the
        update may have been lost with the connection) is answered with the same update again.
        """
        self._expect_plan_until = 0.0
        self._idle_watch = None  # idleness is watched afresh after the round
        last = self._last_update
        if last is not None and last[0] == env.round and last[1] == plan_digest(env.body):
            log.info("%s: round %d's plan again: re-sending its update", self.config.device_id, env.round + 1)
            self.resent_updates.append(env.round)
            self._send_update(last[2], env.round)
            return
        if self._pending is not None:  # a newer plan supersedes the one still waiting
            self._decline(self._pending[0], "superseded by a newer plan")
            self._pending = None
        decision = self.monitor.check()
        if decision.allowed:
            self._train_capped(env)
        elif self.config.schedule.wait_s > 0:
            self._pending = (env, time.monotonic() + self.config.schedule.wait_s)
            self._next_check = time.monotonic() + self.config.schedule.check_interval_s
            self._status("waiting", decision.reason, decision)
        else:
            self._decline(env, decision.reason, decision)

    def _retry_pending(self) -> None:
        assert self._pending is not None
        env, give_up_at = self._pending
        decision = self.monitor.check()
        if decision.allowed:
            self._pending = None
            self._train_capped(env)
        elif time.monotonic() >= give_up_at:
            self._pending = None
            self._decline(env, decision.reason, decision)
        else:
            self._next_check = time.monotonic() + self.config.schedule.check_interval_s

    def _train_capped(self, env: Envelope) -> None:
        """Train with the plan's thread count capped by the schedule's `threads`."""
        plan, cap = env.body, self.config.schedule.threads
        asked = plan.train.get("threads")
        if cap is not None and isinstance(asked, int) and asked > cap:
            plan = replace(plan, train={**plan.train, "threads": cap})
        update = self._train(env.round, plan)
        if update is not None:
            self._last_update = (env.round, plan_digest(env.body), update)
        self.monitor.reset_cpu()  # the next idleness reading must not count our own training

    def _decline(self, env: Envelope, reason: str, decision: Decision | None = None) -> None:
        """Tell the coordinator this device will not train that plan (`not_training`)."""
        log.info("%s: not training round %d: %s", self.config.device_id, env.round + 1, reason)
        self.declined.append(env.round)
        self._send_envelope(Envelope.of(Error(ErrorCode.NOT_TRAINING, reason[:1000]), self.config.device_id,
                                        round=env.round, reply_to=env.msg_id))
        self._status("paused", reason, decision)

    def _heartbeat(self) -> None:
        """Periodic status: idle, or paused/waiting with the reasons it would not train now."""
        decision = self.monitor.check()
        state = "idle" if decision.allowed else ("waiting" if self._pending else "paused")
        self._status(state, decision.reason, decision)

    # -- re-measuring (ClientConfig.remeasure_every_s) ------------------------
    def _maybe_remeasure(self) -> None:
        """When a re-measurement is due, between rounds (no plan held or awaited), registered:
        watch the machine for IDLE_WATCH_S; if the rest of it stayed idle, measure."""
        now = time.monotonic()
        if (self.config.remeasure_every_s <= 0 or now < self._remeasure_at or not self._registered
                or self._pending is not None or now < self._expect_plan_until):
            return
        if self._idle_watch is None:
            self._idle_watch = (CpuWatch(), now + IDLE_WATCH_S)
            return
        watch, until = self._idle_watch
        if now < until:
            return
        self._idle_watch = None
        others, cpus = watch.others(), len(watch.cpus)
        if others is not None and others > max(BUSY_OTHERS_MIN, BUSY_OTHERS_SHARE * cpus):
            self._remeasure_at = now + min(self.config.remeasure_every_s, BUSY_RETRY_S)
            log.debug("%s: not re-measuring: other processes use %.2f of %d CPUs", self.config.device_id,
                      others, cpus)
            return
        self._remeasure()

    def _remeasure(self) -> None:
        """Measure the compute; a figure from an idle device more than REPORT_CHANGE off the one the
        coordinator has becomes this device's profile and is sent as a `ProfileUpdate`."""
        every = self.config.remeasure_every_s
        try:
            detail = self.measure_compute()
        except (RuntimeError, ValueError) as exc:
            log.warning("%s: re-measuring failed: %s", self.config.device_id, exc)
            self._remeasure_at = time.monotonic() + every
            return
        quality, gflops = detail["quality"], float(detail["conv_train_gflops"])
        if quality.busy:
            self._remeasure_at = time.monotonic() + min(every, BUSY_RETRY_S)
            log.info("%s: re-measured %.1f GFLOPS, but the device looked busy (%s): not reported",
                     self.config.device_id, gflops, quality.reason)
            return
        self._remeasure_at = time.monotonic() + every
        if not changed_enough(self._reported_gflops, gflops):
            log.info("%s: re-measured %.1f GFLOPS, within %.0f %% of the %.1f reported", self.config.device_id,
                     gflops, REPORT_CHANGE * 100, self._reported_gflops)
            return
        before = self._reported_gflops
        self.profile = with_measurement(self.profile, detail)  # a later registration carries it too
        self._reported_gflops = self.profile.gflops
        update = ProfileUpdate(
            gflops=self.profile.gflops, trials=quality.trials, spread=quality.spread,
            median_gflops=quality.median_gflops or 0.0,
            load_avg=-1.0 if quality.load_avg is None else quality.load_avg,
            others_cpu=-1.0 if quality.others_cpu is None else quality.others_cpu,
            cpu_mhz=quality.cpu_mhz or 0.0)
        env = Envelope.of(update, self.config.device_id)
        self._profile_update_id = env.msg_id
        self.profile_updates.append(update)
        log.info("%s: re-measured while idle: %.1f GFLOPS (%.1f reported before): telling the coordinator",
                 self.config.device_id, update.gflops, before)
        self._send_envelope(env)

    # -- sending ----------------------------------------------------------
    def _register(self) -> None:
        env = Envelope.of(
            Register(profile=self.profile.to_dict(), num_samples=len(self.data),
                     capabilities=tuple(DEVICE_METHODS), sdk_version=SDK_VERSION,
                     connection=self.link.transport.connection_stamp if self.link else 0,
                     input_shape=tuple(int(n) for n in self.data.x.shape[1:]), num_classes=self.data.num_classes),
            self.config.device_id,
        )
        self._register_id = env.msg_id
        self._last_register = time.monotonic()
        self._send_envelope(env)

    def _status(self, state: str, reason: str = "", decision: Decision | None = None) -> None:
        self._last_heartbeat = time.monotonic()
        assert self.link is not None
        metrics = decision.readings.metrics() if decision is not None else {}
        env = Envelope.of(Status(state, reason[:1000], metrics, self.link.transport.connection_stamp),
                          self.config.device_id)
        self.link.send(self.topics.status(self.config.device_id), env, retain=True)

    def _send(self, body: object, rnd: int) -> None:
        self._send_envelope(Envelope.of(body, self.config.device_id, round=rnd))

    def _send_update(self, update: Update, rnd: int) -> None:
        """Send ``update`` and keep it until the coordinator answers it (`_resend_unanswered`)."""
        env = Envelope.of(update, self.config.device_id, round=rnd)
        self._send_envelope(env)
        if self.config.update_resend_s > 0 and self.config.update_resends > 0:
            self._unanswered = UnansweredUpdate(rnd, update, env.msg_id, time.monotonic(),
                                                self.config.update_resend_s, self.config.update_resends)

    def _resend_unanswered(self) -> None:
        """The coordinator has not answered the latest update in time: send it again, or give up."""
        pending = self._unanswered
        assert pending is not None
        if pending.round < self.forget_updates_before or pending.exhausted():
            if pending.exhausted():
                log.warning("%s: round %d's update was never answered after %d re-sends: giving up",
                            self.config.device_id, pending.round + 1, pending.tries)
            self._unanswered = None
            return
        log.warning("%s: no answer to round %d's update after %.0f s: sending it again",
                    self.config.device_id, pending.round + 1, time.monotonic() - pending.sent_at)
        env = Envelope.of(pending.update, self.config.device_id, round=pending.round)
        pending.resent(env.msg_id)
        self.unanswered_resends.append(pending.round)
        self._send_envelope(env)

    def _send_reply(self, body: object, to: Envelope) -> None:
        self._send_envelope(Envelope.of(body, self.config.device_id, round=to.round, reply_to=to.msg_id))

    def _send_envelope(self, env: Envelope) -> None:
        assert self.link is not None
        try:
            self.link.send(self.topics.uplink(self.config.device_id), env)
        except (ProtocolError, ConnectionError) as exc:
            log.error("%s: could not send %s: %s", self.config.device_id, env.kind, exc)
