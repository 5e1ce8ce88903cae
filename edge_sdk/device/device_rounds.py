"""A device's rounds: a plan trained at once, held while the schedule says wait, or declined
(edge_sdk/schedule.py); the local training (on the host's compute thread in a simulation) and its
update's upload; a plan the coordinator sends again answered with the same update; and the
coordinator's evaluations answered on the held-out data."""

from __future__ import annotations

import hashlib
import logging
import threading
import time
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Callable

from edge_sdk.device.client_config import ClientConfig
from edge_sdk.device.data_watch import DataWatch
from edge_sdk.device.device_data import DeviceData
from edge_sdk.device.fixed_cache import PROCESS_FIXED_CACHE, MissingFixed, Received
from edge_sdk.device.fleet_statistics import fleet_statistics
from edge_sdk.evaluation import evaluate_holdout
from edge_sdk.methods import DeviceContext, device_method
from edge_sdk.protocol.codec import packb
from edge_sdk.protocol.errors import ErrorCode
from edge_sdk.protocol.fixed_tensors import tensor_digest
from edge_sdk.protocol.messages import Envelope, Error, Evaluate, Evaluation, Plan, Update
from edge_sdk.schedule import Decision, SystemMonitor, apply_caps
from edge_sdk.device.sim_hooks import SimHooks
from edge_sdk.throttle import Throttle
from edge_sdk.training import TrainingStopped
from edge_sdk.device.uplink import Uplink

if TYPE_CHECKING:
    import torch

__all__ = ["DeviceRounds", "RoundTrained", "plan_digest"]

log = logging.getLogger("edge_sdk.client")  # the device's log, whichever part of it speaks


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


def plan_digest(plan: Plan) -> str:
    """SHA-256 over a plan's method, label, spec, settings and tensor bytes (identifies a re-sent plan);
    a fixed tensor counts by its digest (`Plan.fixed`), so the plan is the same whether it carries it or
    leaves it out (sent again whole to a device the coordinator no longer knows to hold it)."""
    h = hashlib.sha256(packb([plan.method, plan.label, plan.model_spec, plan.train, plan.preprocessing]))
    for name in sorted(set(plan.tensors) | set(plan.fixed)):
        h.update(packb([name, plan.fixed.get(name) or tensor_digest(plan.tensors[name])]))
    return h.hexdigest()


class DeviceRounds:
    """The plans and evaluations of one device. The ``train`` and ``send_update`` it is given are
    the device's `DeviceClient._train` (which comes back to `train` here) and `_send_update`: the
    seams a test device overrides (to see the plan, to change the update)."""

    def __init__(self, config: ClientConfig, local: DeviceData, uplink: Uplink, sim: SimHooks,
                 throttle: Throttle | None, torch_device: torch.device, stop: threading.Event,
                 train: Callable[[int, Plan], Update | None], send_update: Callable[[Update, int], None]) -> None:
        self.config, self.local, self.uplink, self.sim = config, local, uplink, sim
        self.throttle, self.torch_device, self.stop = throttle, torch_device, stop
        self._train, self._send_update = train, send_update
        self.monitor = SystemMonitor(config.schedule)
        self.trained: list[int] = []  # the rounds it trained and uploaded
        self.declined: list[int] = []  # rounds whose plan the schedule declined
        self.resent: list[int] = []  # rounds whose update was sent again instead of retraining
        self.evaluations: list[Evaluation] = []  # what it answered the coordinator's evaluations
        self.pending: tuple[Envelope, float] | None = None  # plan waiting for the schedule
        self._next_check = 0.0
        #: (round, plan digest, update) of the last round trained, to answer a re-sent plan
        self._last_update: tuple[int, str, Update] | None = None
        self._memory: dict[str, object] = {}  # what device parts keep between rounds (DeviceContext.memory)
        self.data_watch = DataWatch(config, local, uplink)  # its source re-read between rounds
        #: the fixed tensors it received (`Plan.fixed`), shared by the devices of this process
        self.fixed_cache = PROCESS_FIXED_CACHE

    @property
    def holds_update(self) -> bool:
        """Whether it keeps its last update (to answer that round's plan if it comes again)."""
        return self._last_update is not None

    def forget_updates_before(self, rnd: int) -> None:
        """A later round began: no plan of a round before ``rnd`` comes again."""
        if self._last_update is not None and self._last_update[0] < rnd:
            self._last_update = None

    def _context(self, rnd: int, throttle: Throttle | None = None) -> DeviceContext:
        config = self.config
        return DeviceContext(device_id=config.device_id, round=rnd, seed=config.seed,
                             state_dir=Path(config.state_dir) if config.state_dir else None, throttle=throttle,
                             stop=self.stop, device=self.torch_device, memory=self._memory)

    # -- schedule (see edge_sdk/schedule.py) --------------------------------
    def apply_caps(self) -> None:
        """Apply the schedule's caps on this process (torch threads, memory) as the device opens."""
        for cap in apply_caps(self.config.schedule):
            log.info("%s: %s", self.config.device_id, cap)

    def on_plan(self, env: Envelope) -> None:
        """Train now if the schedule allows; else hold the plan up to `wait_s`, then decline it.

        A plan the device already trained (the coordinator re-sends it after a reconnect, when the
        update may have been lost with the connection) is answered with the same update again.
        """
        last = self._last_update
        if last is not None and last[0] == env.round and last[1] == plan_digest(env.body):
            log.info("%s: round %d's plan again: re-sending its update", self.config.device_id, env.round + 1)
            self.resent.append(env.round)
            self._send_update(last[2], env.round)
            return
        if self.pending is not None:  # a newer plan supersedes the one still waiting
            self._decline(self.pending[0], "superseded by a newer plan")
            self.pending = None
        decision = self.monitor.check()
        if decision.allowed:
            self._train_capped(env)
        elif self.config.schedule.wait_s > 0:
            self.pending = (env, time.monotonic() + self.config.schedule.wait_s)
            self._next_check = time.monotonic() + self.config.schedule.check_interval_s
            self.uplink.status("waiting", decision.reason, decision)
        else:
            self._decline(env, decision.reason, decision)

    def duties(self, now: float) -> None:
        """What is due between messages: a held plan retried, the data source re-read."""
        self.retry_held(now)
        self.data_watch.check(now, busy=self.pending is not None)

    def retry_held(self, now: float) -> None:
        """Ask the schedule again about a held plan when its next check is due."""
        if self.pending is None or now < self._next_check:
            return
        env, give_up_at = self.pending
        decision = self.monitor.check()
        if decision.allowed:
            self.pending = None
            self._train_capped(env)
        elif time.monotonic() >= give_up_at:
            self.pending = None
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
        self.uplink.envelope(Envelope.of(Error(ErrorCode.NOT_TRAINING, reason[:1000]), self.config.device_id,
                                         round=env.round, reply_to=env.msg_id))
        self.uplink.status("paused", reason, decision)

    def heartbeat(self) -> None:
        """Periodic status: idle, or paused/waiting with the reasons it would not train now."""
        decision = self.monitor.check()
        state = "idle" if decision.allowed else ("waiting" if self.pending else "paused")
        self.uplink.status(state, decision.reason, decision)

    # -- fixed tensors ----------------------------------------------------------
    def _filled(self, message: Received, what: str, tell: Callable[[Error], None]) -> Received | None:
        """``message`` (a plan or an evaluation request) with the fixed tensors it left out filled in
        from the cache (`FixedCache.resolve`); None when the cache no longer holds one (the device
        restarted since): the coordinator is told ``unknown_fixed`` and sends it whole again."""
        try:
            return self.fixed_cache.resolve(message)
        except MissingFixed as exc:
            log.info("%s: %s: %s; asking for it whole", self.config.device_id, what, exc)
            tell(Error(ErrorCode.UNKNOWN_FIXED, str(exc)[:1000]))
            return None

    # -- training -------------------------------------------------------------
    def train(self, rnd: int, plan: Plan, on_round: Callable[[RoundTrained], None] | None) -> Update | None:
        """Train round ``rnd`` on ``plan`` and upload the update; ``on_round`` hears how it went.
        A failure is answered `train_failed` (`no_data` when the data source has none)."""
        status, throttle, run_compute = self.uplink.status, self.throttle, self.sim.run_compute
        received = sum(t.nbytes for t in plan.tensors.values())  # what came over the link
        filled = self._filled(plan, f"round {rnd + 1}", lambda error: self.uplink.send(error, rnd))
        if filled is None:
            return None
        plan = filled
        status("training")
        if throttle is not None:
            throttle.apply_transfer(received, "down")
        # on a shared compute thread the throttle only counts: this device sleeps its share afterwards
        deferred = run_compute is not None and throttle is not None and throttle.mode == "sleep"
        ctx = self._context(rnd, replace(throttle, mode="virtual") if deferred else throttle)
        started = time.monotonic()
        if self.local.source is not None and (failed := self.local.read_again(rnd)) is not None:
            self.uplink.send(Error(ErrorCode.NO_DATA, failed.error), rnd)
            status("idle", failed.status)
            return None
        try:
            data = self.local.for_plan(plan)
            method = device_method(plan.method)
            update = method(plan, data, ctx) if run_compute is None else run_compute(lambda: method(plan, data, ctx))
        except TrainingStopped:
            log.info("%s: round %d stopped: the device is shutting down", self.config.device_id, rnd + 1)
            return None
        except (KeyError, ValueError, RuntimeError, ArithmeticError) as exc:
            log.error("%s: round %d failed: %s", self.config.device_id, rnd + 1, exc)
            self.uplink.send(Error(ErrorCode.TRAIN_FAILED, str(exc)[:1000]), rnd)
            status("idle", f"round {rnd + 1} failed: {exc}"[:200])
            return None
        if deferred:
            assert throttle is not None
            throttle.settle(float(update.metrics.get("compute_s", 0.0)),
                            float(update.metrics.get("train_seconds", 0.0)))
        update = self.fixed_cache.strip(plan, update)  # what it holds goes back as a digest
        if throttle is not None:
            throttle.apply_transfer(sum(t.nbytes for t in update.tensors.values()), "up")
        self.trained.append(rnd)  # before sending: whoever sees the update sees it counted
        self.data_watch.trained()
        self._send_update(update, rnd)
        status("idle")
        if on_round is not None:
            on_round(RoundTrained(
                rnd, plan.method, plan.label, update.num_samples, float(update.metrics.get("loss", float("nan"))),
                time.monotonic() - started, received,
                sum(t.nbytes for t in update.tensors.values())))
        return update

    # -- federated evaluation, fleet statistics -------------------------------
    def answer(self, env: Envelope) -> None:
        """An `evaluate` (`evaluate`) or a `stats_request`: the per-channel moments of its training
        data (aggregates, never a sample) for a job that normalises with the fleet's statistics."""
        if isinstance(env.body, Evaluate):
            self.evaluate(env)
            return
        try:
            stats = fleet_statistics(env.body, self.local.data)
        except ValueError as exc:
            log.error("%s: no %s statistics: %s", self.config.device_id, env.body.kind, exc)
            self.uplink.reply(Error(ErrorCode.NO_DATA, str(exc)[:200]), env)
            return
        self.uplink.reply(stats, env)

    def evaluate(self, env: Envelope) -> None:
        """Evaluate the model the coordinator names on the held-out data, and answer with the
        counts (never a sample); with none held out, an evaluation of no samples saying why."""
        request = self._filled(env.body, f"evaluation of round {env.round + 1}",
                               lambda error: self.uplink.reply(error, env))
        if request is None:
            return
        ctx = self._context(env.round)
        run_compute, note = self.sim.run_compute, self.local.holdout_note
        try:
            holdout = self.local.holdout_for(request)
            if run_compute is None:
                result = evaluate_holdout(request, holdout, ctx, note)
            else:
                result = run_compute(lambda: evaluate_holdout(request, holdout, ctx, note))
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
        self.uplink.reply(result, env)
