"""Buffered asynchronous aggregation on a real fleet, in wall-clock time (``[federation] asynchronous``
of `edgefl coordinator`).

`AsyncLoop` runs a simulated fleet one device at a time and folds in the order of simulated arrival;
here the plans are out at once: ``concurrency`` devices (every online one by default) each hold a
plan under a round tag of its own (`Fleet.open_collection`), each update is folded as it arrives
(weighted by its staleness, refused past ``max_staleness``) and the model steps every
``buffer_size`` updates. A device whose update arrived is free for the next slot, drawn seeded
among the idle online devices, and is sent the version current then.

A plan not answered within ``round_deadline_s``, or whose device went away (offline past the
rejoin grace), is closed and counted (``plans_expired``); its update, should it still come, is
refused by the fleet as ``wrong_round`` and counted — never folded. A device that comes back,
after minutes or hours, is idle: the next free slot may send it the current version. A device that
declined or reported a failed training is not asked again for `RETRY_AFTER_S`, twice that after a
second decline in a row, and so on up to `MAX_REST_S` (a device outside its training window all night
is asked, and says why not, a few times an hour, not every minute).

A resumed job continues the versions of its checkpoint. What was open when it stopped (Ctrl-C,
SIGTERM, an error) is written beside the checkpoint (`coordinator.runtime.in_flight`) and taken up
again: the updates taken but not yet in a version fill the resumed version's buffer first, and each
plan that was out is sent again to its device, once it is back, under the same tag and with the same
tensors — a device that trained it answers with the update it kept, without training again — its
deadline counting on from its age at the stop. The new plans' tags start `RESUME_TAG_GAP` past
every tag sent before (the last version's count, or the stopped session's when it kept its plans),
so an update of a plan sent before the stop never passes for one sent after. What was sent or taken
while a version was evaluated (the model already stepped) waits until that version is stepped again.

An evaluated version with ``federated_eval`` asks the online devices to evaluate it on their held-out
data (each under a tag of its own, beside a training plan it may hold: a device answers once its
training is done) and waits for them as a synchronous round does (``eval_deadline_s``); the fleet
keeps training meanwhile: an update that arrives waits for the next version (its device is sent a
new plan at once, while the updates waiting fill less than a buffer), plans past their deadline
close and free slots are filled, counted in the next version's record.

A job paced by new data (``min_new_samples``, docs/continuous.md) waits before each version as a
synchronous one waits before each round (enough new samples online, ``min_interval_s``,
``windows``); a device is then sent a plan only while it holds samples it has not trained on (its
``data_count``s; its registration counts as all new), never re-planned at once on the same rows; and
a version steps with the updates it has once no device holding new data is left to ask.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, replace
from functools import partial
from pathlib import Path
from typing import Any, Callable

import numpy as np

from coordinator.core.federation import TrainingFailed
from coordinator.core.received_update import ReceivedUpdate
from coordinator.runtime.async_loop import RETRY_AFTER_S, AsyncLoop, InFlight
from coordinator.runtime.in_flight import (IN_FLIGHT_FILE, InFlightState, OpenPlanState, TakenUpdate, load_in_flight,
                                           save_in_flight)
from coordinator.runtime.fleet import Arrivals
from coordinator.runtime.report import RoundRecord
from edge_sdk.protocol.errors import ProtocolError
from edge_sdk.protocol.messages import Plan, RoundStart

__all__ = ["FleetAsyncLoop", "RESUME_TAG_GAP"]

log = logging.getLogger(__name__)

#: a resumed job's plan tags start this far past the last version's count of plans sent
RESUME_TAG_GAP = 1 << 20
#: the longest a device that keeps declining waits before it is asked again
MAX_REST_S = 3600.0
#: the longest single wait for arrivals (the loop then checks deadlines and fills slots)
WAIT_S = 1.0
#: what a version's record counts of its plans (and ``down``: the bytes sent)
_COUNTS = ("dispatched", "stale_refused", "plans_expired", "declined", "down")


@dataclass(frozen=True)
class _OpenPlan:
    version: int  # the version it holds
    base: tuple[int, str]  # the (version, label) of its tensors (`AsyncLoop._bases`)
    sent_at: float  # time.monotonic()
    new_samples: int  # the new samples its device held when it was sent (given back if it fails)
    tag: int  # the round tag it went out under
    plan: Plan  # as sent, without its tensors (those of ``base``): to send it again after a stop


class FleetAsyncLoop(AsyncLoop):
    """`AsyncLoop`'s job on a real fleet: many plans out at once, folded as they arrive (module doc)."""

    PACED_BY_DATA = True

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._open_plans: dict[str, _OpenPlan] = {}
        self._resting: dict[str, float] = {}  # device -> time.monotonic() it may be asked again
        self._declines: dict[str, int] = {}  # device -> plans it declined or failed in a row
        self._collection_open = False
        #: plans open at a stop, taken up on resume: sent again once their device is back
        self._restored: dict[str, _OpenPlan] = {}
        #: the buffer being filled (restated updates and their staleness), kept for a stop
        self._filling: tuple[dict[str, ReceivedUpdate], list[int]] | None = None
        self._carried: list[tuple[ReceivedUpdate, int]] = []  # folded before a stop: the resumed buffer's
        self._filling_round: int | None = None
        #: the next version's counts (and bytes sent, ``down``) of what happened during an evaluation
        self._between: dict[str, int] = dict.fromkeys(_COUNTS, 0)
        self._stepped = 0  # 1 while a version is evaluated: the model is that version, ``version`` one behind

    def run(self, *args: Any, **kwargs: Any) -> Any:
        try:
            return super().run(*args, **kwargs)
        except BaseException:  # Ctrl-C, SIGTERM or an error: what is open is kept for the resumed job
            try:
                self._keep_in_flight()
            except Exception:  # never in the way of the stop itself, nor of its reason
                log.exception("the plans and updates open at the stop could not be kept")
            raise
        finally:
            if self._collection_open:
                self.fleet.close_collection()

    def _resume(self) -> int:
        start = super()._resume()
        sent_before = self._take_up_in_flight(start)  # the stopped session's tags, when it kept any
        if sent_before is not None or self.report.rounds:  # past every tag sent before the stop
            self._dispatches = max(self._dispatches, sent_before or 0) + RESUME_TAG_GAP
        self._filling_round = start
        return start

    # -- across a stop ------------------------------------------------------
    def _keep_in_flight(self) -> None:
        """Write the plans out and the updates taken but not in a version beside the checkpoint."""
        if self.config.checkpoint_dir is None or self._filling_round is None:
            return
        buffer, staleness = self._filling or ({}, [])
        folded = [*self._carried, *zip(buffer.values(), staleness, strict=True)]
        taken = [TakenUpdate(received, (self.version, received.update.label), stale) for received, stale in folded]
        taken += [TakenUpdate(item.received, item.base, None) for item in self._held]
        plans = {**self._restored, **self._open_plans}
        if not plans and not taken:
            return
        now = time.monotonic()
        bases = {p.base for p in plans.values()} | {t.base for t in taken if t.stale is None}
        state = InFlightState(self.version, self._filling_round, {b: self._bases[b] for b in bases},
                              [OpenPlanState(d, p.tag, p.base, p.plan, now - p.sent_at, p.new_samples)
                               for d, p in plans.items()], taken, self._dispatches)
        try:
            path = save_in_flight(Path(self.config.checkpoint_dir), state)
        except OSError as exc:
            log.error("the plans and updates open at the stop could not be kept: %s", exc)
            return
        log.info("kept %d open plans and %d updates taken for the resumed job (%s)", len(state.plans),
                 len(taken), path)

    def _take_up_in_flight(self, start: int) -> int | None:
        """Take up what a stop kept, if it is this checkpoint's (then the file is removed); the plans
        the stopped session had sent (None: nothing taken up)."""
        if self.config.checkpoint_dir is None:
            return None
        directory = Path(self.config.checkpoint_dir)
        try:
            state = load_in_flight(directory)
        except ProtocolError as exc:  # what it held is lost, as before it was kept: the job itself goes on
            log.warning("the plans and updates kept at a stop are not taken up: %s", exc)
            state = None
        (directory / IN_FLIGHT_FILE).unlink(missing_ok=True)
        if state is None:
            return None
        version = self.report.rounds[-1].version if self.report.rounds else 0  # the checkpoint's
        if (state.version, state.round) != (version, start):
            log.info("the plans and updates kept at a stop were for version %d, not this checkpoint's: "
                     "not taken up", state.version)
            return None
        now = time.monotonic()
        for base, tensors in state.bases.items():
            self._bases[base] = tensors
            self._base_users[base] = 0
        for kept in state.plans:
            self._restored[kept.device] = _OpenPlan(kept.base[0], kept.base, now - kept.age_s, kept.new_samples,
                                                    kept.tag, replace(kept.plan, tensors={}))
            self._base_users[kept.base] += 1
        for taken in state.taken:
            if taken.stale is not None:
                self._carried.append((taken.received, taken.stale))
                continue
            self._seq += 1
            self._held.append(InFlight(now, self._seq, taken.received.device_id, taken.base[0], taken.received,
                                       taken.base))
            self._base_users[taken.base] += 1
            self._busy.add(taken.received.device_id)
        log.info("taken up from the stop: %d plans to send again, %d updates", len(self._restored),
                 len(state.taken))
        return state.dispatches

    def _send_again(self) -> int:
        """Send the plans open at a stop to their devices that are back; returns the bytes sent."""
        down = 0
        ahead = self.version + self._stepped  # a plan of the version evaluated at the stop waits for it
        for device in [d for d, kept in self._restored.items() if kept.version <= ahead
                       and (r := self.fleet.devices.get(d)) is not None and r.online]:
            kept = self._restored.pop(device)
            down += self._open(device, kept, replace(kept.plan, tensors=self._bases[kept.base]))
            log.info("plan of %s (version %d, tag %d) open at the stop: sent again", device, kept.version, kept.tag)
        return down

    def _open(self, device: str, opened: _OpenPlan, plan: Plan) -> int:
        """Announce and send ``plan`` to ``device`` under ``opened.tag`` and hold it open as ``opened``
        (the device busy with it, its new samples trained on now); returns the bytes sent."""
        down = self.fleet.send(device, RoundStart(self.config.round_deadline_s, (device,)), opened.tag)
        sent = self.fleet.ask(device, opened.tag, plan)
        self.payload_bytes.setdefault(plan.label, sent)
        self._open_plans[device] = opened
        self._busy.add(device)
        if self.serving is not None:
            self.fleet.devices[device].new_samples = 0  # it trains on them now
        return down + sent

    # -- one version --------------------------------------------------------
    def _round(self, rnd: int) -> RoundRecord:
        """Fold updates as they arrive until a buffer is full, then step the model: version ``rnd + 1``."""
        started = time.monotonic()
        config, fleet = self.config, self.fleet
        if not self._collection_open:
            fleet.open_collection(self.strategy.check_update)
            self._collection_open = True
        fleet.rounds_collected = self.version  # a claimed sample count may grow per version
        self._counts = {}
        buffer: dict[str, Any] = {received.device_id: received for received, _ in self._carried}
        staleness: list[int] = [stale for _, stale in self._carried]
        self._carried = []
        self._filling, self._filling_round = (buffer, staleness), rnd
        counts, self._between = self._between, dict.fromkeys(_COUNTS, 0)  # what happened since the last step
        down = counts.pop("down")
        held, self._held = self._held, []
        for item in held:  # held from the last buffer: a place each, in arrival order
            counts["stale_refused"] += not self._take(item, buffer, staleness)
        fleet.progress(rnd, len(buffer), config.buffer_size, sum(u.nbytes for u in buffer.values()), started)
        idle_since = time.monotonic()
        while len(buffer) < config.buffer_size:
            down += self._send_again()
            sent, asked = self._fill_slots()
            down, counts["dispatched"] = down + sent, counts["dispatched"] + asked
            if not self._open_plans and buffer and self.serving is not None:
                break  # paced by new data: every device holding some has answered
            if not self._open_plans:  # nobody to train: wait for a device to come (back)
                if self.serving is None and time.monotonic() - idle_since > config.register_timeout_s:
                    raise TrainingFailed(f"asynchronous aggregation: no device to train for "
                                         f"{config.register_timeout_s:g} s")
                fleet.pump(WAIT_S)
                counts["plans_expired"] += self._expire()  # plans kept at a stop whose devices stay away
                continue
            idle_since = time.monotonic()
            self._take_arrivals(fleet.arrivals(WAIT_S), counts, lambda item: self._take(item, buffer, staleness))
            counts["plans_expired"] += self._expire()
            fleet.progress(rnd, len(buffer), config.buffer_size, sum(u.nbytes for u in buffer.values()), started)
        # an evaluated version's federated evaluation: the devices keep training meanwhile
        # (`_train_while_evaluating`), their updates wait for the next version
        record = self._step(rnd, buffer, staleness, {"dispatches": float(self._dispatches),
                                                     "in_flight": float(len(self._open_plans)),
                                                     **{k: float(v) for k, v in counts.items()}}, down, started)
        self._filling, self._filling_round = None, rnd + 1  # stepped: its updates are in this version
        return record

    def _aggregate(self, rnd: int, updates: list[ReceivedUpdate]) -> dict[str, float]:
        """As `AsyncLoop._aggregate`; a buffer the strategy fails on is not kept for the resumed job
        (which would fail on it again at every restart): its updates are lost, the plans out are kept."""
        try:
            return super()._aggregate(rnd, updates)
        except Exception:
            log.error("version %d's %d updates failed the aggregation: not kept for a restart", rnd + 1,
                      len(updates))
            self._filling = None
            raise

    def _take_arrivals(self, arrived: Arrivals, counts: dict[str, int], take: Callable[[InFlight], bool]) -> None:
        """Hand each update that arrived to ``take`` (False: refused), and rest the devices that
        declined or failed; counted in ``counts``."""
        for device, received in arrived.updates.items():
            plan = self._open_plans.pop(device)
            self._seq += 1
            counts["stale_refused"] += not take(InFlight(time.monotonic(), self._seq, device, plan.version, received,
                                                         plan.base))
            self._failed_in_a_row = 0
            self._declines.pop(device, None)
        for device in [*arrived.declined, *arrived.failed]:
            counts["declined"] += 1
            self._declines[device] = self._declines.get(device, 0) + 1
            self._drop(device, rest=True)
        for why in arrived.failed.values():
            self._training_failed(why)

    def _take(self, item: InFlight, buffer: dict[str, ReceivedUpdate], staleness: list[int]) -> bool:
        """As `AsyncLoop._take`; a device that holds a newer plan (sent while its update waited)
        stays busy with it. An update kept at a stop whose device has not registered again since
        waits for it (its model is the device's label's), unless too stale by now; one trained on
        the version that was being evaluated at the stop waits until it is stepped again."""
        if item.version > self.version or (item.device_id not in self.fleet.devices
                                           and self.version - item.version <= self.config.max_staleness):
            self._held.append(item)  # of the version evaluated at a stop, not stepped again yet; or see above
            return True
        folded = super()._take(item, buffer, staleness)
        if item.device_id in self._open_plans:  # busy with its newer plan
            self._busy.add(item.device_id)
        return folded

    def _federated_evaluation(self, rnd: int, record: RoundRecord) -> RoundRecord:
        """As the round loop's, with the devices training meanwhile (`_train_while_evaluating`)."""
        previous = self.fleet.while_waiting
        last = record.round + 1 >= self.config.rounds  # no plan for a version that will not come
        self.fleet.while_waiting = partial(self._train_while_evaluating, previous, not last)
        self._stepped = 1  # the strategy holds the version evaluated; `self.version` counts it once it is recorded
        try:
            return super()._federated_evaluation(rnd, record)
        finally:
            self.fleet.while_waiting, self._stepped = previous, 0

    def _train_while_evaluating(self, previous: Callable[[float], bool] | None, plans: bool, timeout: float) -> bool:
        """While a version is evaluated: each update that arrives waits for the next version (its
        device free for a new plan at once), plans past their deadline close, and (``plans``: unless
        it is the job's last version) free slots are filled; counted in the next version's record.
        New plans go out only while the updates waiting fill less than a buffer (what waits stays
        bounded: a buffer and the plans out). True when an update arrived."""
        if previous is not None:
            previous(timeout)
        arrived = self.fleet.arrivals(0.0 if previous is not None else timeout)
        self._take_arrivals(arrived, self._between, self._hold_for_next_version)
        self._between["plans_expired"] += self._expire()
        if plans and len(self._held) < self.config.buffer_size:  # the next buffer has places left
            sent, asked = self._fill_slots()
            self._between["down"] += self._send_again() + sent
            self._between["dispatched"] += asked
        return bool(arrived.updates)

    def _hold_for_next_version(self, item: InFlight) -> bool:
        self._held.append(item)  # folded first into the next buffer, in arrival order
        self._busy.discard(item.device_id)  # free for a new plan now (one place a buffer all the same)
        return True

    def _fill_slots(self) -> tuple[int, int]:
        """Send a plan to idle online devices (seeded draws) until ``concurrency`` plans are open;
        returns the bytes sent and the plans."""
        online = self.fleet.online()
        wanted = len(online) if self.config.concurrency is None else min(self.config.concurrency, len(online))
        now = time.monotonic()
        idle = [d for d in online if d not in self._busy and d not in self._restored
                and self._resting.get(d, 0.0) <= now
                and (self.serving is None or self.fleet.devices[d].new_samples > 0)]
        down = asked = 0
        while len(self._open_plans) < wanted and idle:
            rng = np.random.default_rng([self.config.seed, self._dispatches, 0xA5])
            down += self._ask(idle.pop(int(rng.integers(len(idle)))))
            asked += 1
        return down, asked

    def _ask(self, device: str) -> int:
        """Send ``device`` the current version under a tag of its own; returns the bytes sent. While
        a version is evaluated the model has already stepped to it (`_step`): that is the one sent."""
        tag = self._next_tag()
        record = self.fleet.devices[device]
        version = self.version + self._stepped
        plan = self.strategy.configure_train(version, record)
        if self.preprocessing is not None:
            plan = replace(plan, preprocessing=self.preprocessing.normalisation())
        base = (version, plan.label)
        self._keep_base(base, plan)
        self._resting.pop(device, None)
        return self._open(device, _OpenPlan(version, base, time.monotonic(), record.new_samples, tag,
                                            replace(plan, tensors={})), plan)

    def _expire(self) -> int:
        """Close the plans past ``round_deadline_s`` or whose devices went away; returns how many."""
        now, deadline = time.monotonic(), self.config.round_deadline_s
        gone = {d: "went away" if not self.fleet.still_expected(d) else f"sent nothing in {deadline:g} s"
                for d, plan in self._open_plans.items()
                if now - plan.sent_at > deadline or not self.fleet.still_expected(d)}
        for device, why in gone.items():
            log.info("plan of %s (version %d) closed: it %s; it is sent the current version when next free",
                     device, self._open_plans[device].version, why)
            self.fleet.close_plan(device)
            self._drop(device, rest=self.fleet.devices[device].online)
        late = [d for d, plan in self._restored.items() if now - plan.sent_at > deadline]
        for device in late:  # open at a stop, and its device not back in time
            log.info("plan of %s (version %d) open at the stop closed: its device did not come back in %g s",
                     device, self._restored[device].version, deadline)
            self._release(self._restored.pop(device).base)
        return len(gone) + len(late)

    def _drop(self, device: str, rest: bool) -> None:
        """Forget ``device``'s open plan (its base released); ``rest``: not asked for `RETRY_AFTER_S`
        (doubled for each decline in a row beyond the first, at most `MAX_REST_S`)."""
        plan = self._open_plans.pop(device, None)
        if plan is not None:
            self._release(plan.base)
            if (record := self.fleet.devices.get(device)) is not None:  # not trained on after all
                record.new_samples = max(record.new_samples, plan.new_samples)
        self._busy.discard(device)
        if rest:
            declines = self._declines.get(device, 1)
            self._resting[device] = time.monotonic() + min(RETRY_AFTER_S * 2 ** min(declines - 1, 20), MAX_REST_S)
