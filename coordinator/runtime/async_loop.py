"""Buffered asynchronous aggregation (FedBuff, Nguyen et al., AISTATS 2022) on a simulated fleet
(a real fleet's, in wall-clock time: `coordinator.runtime.fleet_async_loop`).

There is no round barrier: ``concurrency`` devices train at once; each update is folded into a
buffer as it arrives, weighted by its staleness (`coordinator.aggregate.staleness`), and the
model steps every ``buffer_size`` updates — through the method's own aggregate, so the robust
screen, the share cap and the server optimizer act on each buffer as on a round. A device whose
update arrived is sent the current model at once (or, when ``concurrency`` is below the fleet,
the freed slot goes to a device drawn from those online, seeded). An update staler than
``max_staleness`` is refused and counted; a device's second update in one buffer waits for the
next (one device never holds more than one of a buffer's ``buffer_size`` places).

Events happen in **simulated** time (`coordinator.runtime.sim_clock`): a device's update arrives
when its download, training (FLOPs at its profile's speed) and upload are done, paused while it
is away. The devices really train, over the broker, on the version they were sent; the loop
folds their updates in the order of their simulated arrival. One version is one record of the
report (``round`` counts versions; ``seconds``: simulated time since the last version;
``metrics.sim_time_s``: since the job began). Memory: the updates in flight (what a real fleet's
devices would hold) and one copy of each version still being trained on.

A checkpoint holds the versions; a resumed job continues from the last one (updates in flight
when it stopped are lost: their devices are sent the current version; a real fleet's coordinator
keeps them across a stop: `coordinator.runtime.fleet_async_loop`).
"""

from __future__ import annotations

import heapq
import logging
import time
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np

from edge_sdk.protocol.messages import Plan, RoundStart

from coordinator.aggregate.staleness import restate_update, staleness_weight
from coordinator.core.asynchronous import check_async_method
from coordinator.core.federation import TrainingFailed
from coordinator.core.received_update import ReceivedUpdate
from coordinator.runtime.report import RoundRecord
from coordinator.runtime.round_loop import RoundLoop
from coordinator.runtime.sim_clock import SimClock

__all__ = ["AsyncLoop"]

log = logging.getLogger(__name__)

#: a device whose training failed is sent work again after this many simulated seconds
RETRY_AFTER_S = 60.0


@dataclass(order=True)
class InFlight:
    """An update on its way: it arrives at ``arrives`` (simulated seconds)."""

    arrives: float
    seq: int
    device_id: str = field(compare=False)
    version: int = field(compare=False)
    received: ReceivedUpdate = field(compare=False)
    base: tuple[int, str] = field(compare=False)  # the (version, label) of what it was sent


class AsyncLoop(RoundLoop):
    """The round loop's job, run as buffered asynchronous aggregation (see the module doc)."""

    #: whether a job paced by new data (``min_new_samples``) runs here (a real fleet's loop: yes)
    PACED_BY_DATA = False

    def __init__(self, *args: Any, clock: SimClock | None = None, **kwargs: Any) -> None:
        super().__init__(*args, clock=clock, **kwargs)
        check_async_method(self.strategy.name)
        if self.serving is not None and not self.PACED_BY_DATA:
            raise ValueError("a simulated asynchronous job is not paced by new data (min_new_samples): its "
                             "devices' data does not grow")
        self.clock: SimClock = clock if clock is not None else SimClock(self.config.seed)
        self._in_flight: list[InFlight] = []  # a heap by arrival
        self._starting: list[tuple[float, int, str]] = []  # (when, seq, device): work sent then
        self._busy: set[str] = set()  # devices in `_starting` or `_in_flight`
        self._bases: dict[tuple[int, str], dict[str, np.ndarray]] = {}  # what versions' plans held
        self._base_users: dict[tuple[int, str], int] = {}
        self._held: list[InFlight] = []  # a device's second update of a buffer: for the next
        self._dispatches = 0  # plans sent: each goes out as a "round" of its own (the devices' tag)
        self._seq = 0

    # -- the job's start ----------------------------------------------------
    def _resume(self) -> int:
        start = super()._resume()
        if self.report.rounds:  # the clock and the plans' tags go on from the last version
            metrics = self.report.rounds[-1].metrics
            self.clock.now = float(metrics.get("sim_time_s", 0.0))
            self._dispatches = int(metrics.get("dispatches", 0))
        return start

    def _slots(self) -> None:
        """Fill every free slot of `concurrency` with a device (at the clock's time)."""
        online = self.fleet.online()
        wanted = len(online) if self.config.concurrency is None else min(self.config.concurrency, len(online))
        idle, here = self._idle(self.clock.now, online)
        while len(self._busy) - len(self._held) < wanted:
            if not self._fill_slot(self.clock.now, idle, here):
                break

    def _idle(self, t: float, online: list[str]) -> tuple[list[str], list[str]]:
        """The idle devices among ``online``, and those of them online at ``t`` (in the same order)."""
        idle = [d for d in online if d not in self._busy]
        return idle, [d for d in idle if self.clock.online(d, t)]

    def _fill_slot(self, t: float, idle: list[str], here: list[str]) -> bool:
        """A device for a slot freed at ``t``: drawn (seeded) from ``here`` (the idle devices online
        then), else the one of ``idle`` back online soonest; False when every device is busy. The
        device chosen leaves both lists (the next slot of the same moment draws from the rest)."""
        if not idle:
            return False
        if here:
            rng = np.random.default_rng([self.config.seed, self._dispatches, self._seq, 0xA5])
            device, when = here.pop(int(rng.integers(len(here)))), t
        else:
            when, device = min((self.clock.availability(d).next_online(t), d) for d in idle)
        idle.remove(device)
        self._seq += 1
        heapq.heappush(self._starting, (when, self._seq, device))
        self._busy.add(device)
        return True

    # -- one version --------------------------------------------------------
    def _round(self, rnd: int) -> RoundRecord:
        """Fold updates as they arrive until a buffer is full, then step the model: version ``rnd + 1``."""
        started, before = time.monotonic(), self.clock.now
        config = self.config
        self._counts = {}
        buffer: dict[str, ReceivedUpdate] = {}
        staleness: list[int] = []
        refused, down, dispatched = 0, 0, 0
        held, self._held = self._held, []
        for item in held:  # held from the last buffer: in arrival order, a place each
            refused += not self._take(item, buffer, staleness)
        self._slots()
        while len(buffer) < config.buffer_size:
            if not self._in_flight and not self._starting:
                self._slots()
                if not self._starting:
                    raise TrainingFailed("asynchronous aggregation: no device left to train")
            if self._starting and (not self._in_flight or self._starting[0][0] <= self._in_flight[0].arrives):
                when, _, device = heapq.heappop(self._starting)
                self.clock.now = max(self.clock.now, when)
                down += self._dispatch(device)
                dispatched += 1
                continue
            item = heapq.heappop(self._in_flight)
            self.clock.now = item.arrives
            refused += not self._take(item, buffer, staleness)
            self._fill_slot(self.clock.now, *self._idle(self.clock.now, self.fleet.online()))
        return self._step(rnd, buffer, staleness, {
            "sim_time_s": self.clock.now, "dispatches": float(self._dispatches), "dispatched": float(dispatched),
            "stale_refused": float(refused), "in_flight": float(len(self._in_flight))},
            down, started, seconds=self.clock.now - before)

    def _step(self, rnd: int, buffer: dict[str, ReceivedUpdate], staleness: list[int], metrics: dict[str, float],
              down: int, started: float, seconds: float | None = None) -> RoundRecord:
        """Step the model with the full ``buffer``: version ``rnd + 1``'s record, with the loop's own
        ``metrics`` after the staleness figures (``seconds``: since the last version; None: the host's
        since ``started``), evaluated, by the devices too when this version is."""
        updates = list(buffer.values())
        for received in updates:
            self._count(rnd, received.device_id, received.update.label, trained=received.update.num_samples)
        aggregated = self._aggregate(rnd, updates)
        self._hold_rocket_biases(rnd)
        self.fleet.apply_pending_profiles()  # re-measured devices: their labels from the next plan on
        metrics = {**aggregated, "staleness_mean": float(np.mean(staleness)),
                   "staleness_max": float(max(staleness)), **metrics}
        accuracy, loss, metrics = self._evaluate(rnd, metrics)
        host_seconds = time.monotonic() - started
        record = RoundRecord(round=rnd, accuracy=accuracy, loss=loss, bytes_down=down,
                             bytes_up=sum(u.nbytes for u in updates),
                             seconds=host_seconds if seconds is None else seconds, host_seconds=host_seconds,
                             participants=sorted(buffer), aggregated=True, metrics=metrics)
        if self.evaluates(rnd) and self.config.federated_eval:
            record = self._federated_evaluation(self._next_tag(), record)
        self.device_counts = [self._counts[d] for d in sorted(self._counts)]
        return record

    def _aggregate(self, rnd: int, updates: list[ReceivedUpdate]) -> dict[str, float]:
        """The strategy steps the model with a full buffer's updates."""
        return self.strategy.aggregate(rnd, updates, {})

    def _take(self, item: InFlight, buffer: dict[str, ReceivedUpdate], staleness: list[int]) -> bool:
        """`_fold` ``item``; its device is free again unless its update waits for the next buffer
        (then it waits with it). False: refused."""
        folded = self._fold(item, buffer, staleness)
        if item not in self._held:
            self._busy.discard(item.device_id)
        return folded

    def _training_failed(self, why: str) -> None:
        """A device's training failed (or brought nothing): the job stops once that happened
        `stop_after_failed_rounds` times in a row for every online device."""
        self._failed_in_a_row += 1
        self._last_failure = why
        config = self.config
        if config.stop_after_failed_rounds and self._failed_in_a_row >= config.stop_after_failed_rounds \
                * max(1, len(self.fleet.online())):
            raise TrainingFailed(f"every device failed its training: {self._last_failure}")

    def _fold(self, item: InFlight, buffer: dict[str, ReceivedUpdate], staleness: list[int]) -> bool:
        """Fold an arrived update into ``buffer`` (or hold it for the next buffer when its device, or
        the buffer, has no place left); False: refused (too stale, or no longer of the device's model)."""
        stale = self.version - item.version
        if stale > self.config.max_staleness:
            log.info("update of %s refused: %d versions stale (max_staleness %d)", item.device_id, stale,
                     self.config.max_staleness)
            self._release(item.base)
            return False
        if item.device_id in buffer or len(buffer) >= self.config.buffer_size:
            self._held.append(item)  # its device gets no new work until it is folded
            return True
        try:
            buffer[item.device_id] = self._restate(item, stale)
        except ValueError as exc:  # e.g. its label changed while it trained
            log.info("update of %s refused: %s", item.device_id, exc)
            return False
        staleness.append(stale)
        return True

    def _next_tag(self) -> int:
        tag, self._dispatches = self._dispatches, self._dispatches + 1
        return tag

    def _dispatch(self, device_id: str) -> int:
        """Send ``device_id`` the current version and take its update (it trains now, over the
        broker); the update arrives in simulated time when its work is done. Returns the bytes sent."""
        fleet, strategy, config = self.fleet, self.strategy, self.config
        tag = self._next_tag()
        record = fleet.devices.get(device_id)
        if record is None or not record.online:
            self._busy.discard(device_id)
            return 0
        plan = strategy.configure_train(self.version, record)
        if self.preprocessing is not None:
            plan = replace(plan, preprocessing=self.preprocessing.normalisation())
        base = (self.version, plan.label)
        sent: dict[str, int] = {}

        def send_plan(device: str) -> int:
            sent[device] = fleet.send(device, plan, tag)
            self.payload_bytes.setdefault(plan.label, sent[device])
            return sent[device]
        down = fleet.send(device_id, RoundStart(config.round_deadline_s, (device_id,)), tag)
        fleet.rounds_collected = self.version  # a claimed sample count may grow per version, not per plan sent
        collected = fleet.collect(tag, [device_id], config.round_deadline_s, strategy.check_update, send_plan,
                                  quorum=1)
        received = collected.updates.get(device_id)
        if received is None:  # failed, declined or silent: tried again later
            self._training_failed(collected.failures.get(device_id, "no update"))
            self._seq += 1
            heapq.heappush(self._starting, (self.clock.now + RETRY_AFTER_S, self._seq, device_id))
            return down + sent.get(device_id, 0)
        self._failed_in_a_row = 0
        self._keep_base(base, plan)
        work = self._work_seconds(device_id, sent.get(device_id, 0), received)
        self._seq += 1
        heapq.heappush(self._in_flight, InFlight(self.clock.finish(device_id, self.clock.now, work), self._seq,
                                                  device_id, self.version, received, base))
        return down + sent.get(device_id, 0)

    def _keep_base(self, base: tuple[int, str], plan: Plan) -> None:
        if base not in self._bases:
            self._bases[base] = {k: np.array(v, copy=True) for k, v in plan.tensors.items()}
        self._base_users[base] = self._base_users.get(base, 0) + 1

    def _release(self, base: tuple[int, str]) -> None:
        self._base_users[base] -= 1
        if not self._base_users[base]:
            del self._base_users[base], self._bases[base]

    def _restate(self, item: InFlight, stale: int) -> ReceivedUpdate:
        """The update as if trained on the current version, its change weighted by its staleness."""
        record = self.fleet.devices[item.device_id]
        now = self.strategy.configure_train(self.version, record).tensors
        try:
            tensors = restate_update(now, self._bases[item.base], item.received.update.tensors,
                                     staleness_weight(self.config.staleness, stale))
        finally:
            self._release(item.base)
        return replace(item.received, update=replace(item.received.update, tensors=tensors))

    def _stop_if_training_fails(self, rnd: int) -> None:
        """Counted per plan in `_dispatch`."""
