"""Re-measuring the device's compute (`ClientConfig.remeasure_every_s`): between rounds, when the
rest of the machine stayed idle for a while, the device measures again; a figure more than
`REPORT_CHANGE` off the one the coordinator has becomes its profile and is sent as a
`ProfileUpdate`. A busy device's figure (at start-up or later) is measured again sooner."""

from __future__ import annotations

import logging
import time
from typing import TYPE_CHECKING, Callable

from edge_sdk.device.client_config import ClientConfig
from edge_sdk.profiling import (
    BUSY_OTHERS_MIN, BUSY_OTHERS_SHARE, REPORT_CHANGE, CpuWatch, DeviceProfile, changed_enough,
    measure_flops_detail, with_measurement,
)
from edge_sdk.protocol.messages import Envelope, ProfileUpdate

if TYPE_CHECKING:
    import torch

__all__ = ["BUSY_RETRY_S", "IDLE_WATCH_S", "Remeasuring"]

log = logging.getLogger("edge_sdk.client")  # the device's log, whichever part of it speaks
#: Before re-measuring, the device watches the machine this long: the rest of it must stay idle.
IDLE_WATCH_S = 5.0
#: A re-measurement that found the device busy (or a busy start-up figure) is tried again this soon.
BUSY_RETRY_S = 300.0


class Remeasuring:
    """When the next measurement is due, the watch on the machine's idleness before it, and the
    figure the coordinator has."""

    def __init__(self, config: ClientConfig, profile: DeviceProfile, torch_device: torch.device) -> None:
        self.device_id = config.device_id
        self.every_s = every = config.remeasure_every_s
        self.reported_gflops = profile.gflops  # the figure the coordinator has
        busy_start = profile.quality is not None and profile.quality.busy
        #: when the next measurement is due (time.monotonic())
        self.next_at = (time.monotonic() + (min(every, BUSY_RETRY_S) if busy_start else every) if every > 0
                        else float("inf"))  # never: an idle device sleeps until its heartbeat
        if busy_start:
            log.warning("%s: measured %.1f GFLOPS while busy (%s): %s", config.device_id, profile.gflops,
                        profile.quality.reason, f"measuring again when idle, in {min(every, BUSY_RETRY_S):.0f} s "
                        "or later" if every > 0 else "the figure stays ([device] remeasure_every_s = 0)")
        self.idle_watch: tuple[CpuWatch, float] | None = None  # the watch on the machine, until when
        self.expect_plan_until = 0.0  # a round it takes part in announced: its plan is due until then
        self.update_id: str | None = None  # the message id of the last `ProfileUpdate` sent
        self.updates: list[ProfileUpdate] = []  # the new measurements sent to the coordinator
        #: how a measurement is taken: ``measure_flops_detail``'s result (tests substitute it)
        self.measure: Callable[[], dict] = lambda: measure_flops_detail(
            seconds=config.measure_seconds, device=str(torch_device))

    def reported(self, profile: DeviceProfile) -> None:
        """The device registers with ``profile``: its figure is the one the coordinator has."""
        self.reported_gflops = profile.gflops

    def plan_announced(self, deadline_s: float) -> None:
        """A round it takes part in began: no re-measuring while its plan may come."""
        self.expect_plan_until = time.monotonic() + min(deadline_s, 3600.0)

    def plan_came(self) -> None:
        """A plan arrived: the wait for it is over, and idleness is watched afresh after the round."""
        self.expect_plan_until = 0.0
        self.idle_watch = None

    def not_understood(self, reply_to: str | None) -> None:
        """The coordinator answered ``reply_to`` with `error{kind}`: if that was a profile update,
        it takes none (an older edgefl), and the device stops re-measuring."""
        if reply_to is not None and reply_to == self.update_id:
            log.warning("%s: the coordinator does not take profile updates (an older edgefl): not "
                        "re-measuring any more", self.device_id)
            self.next_at = float("inf")

    def wants_wakeups(self, now: float) -> bool:
        """Whether it watches the machine now, or measures within the second."""
        return self.idle_watch is not None or self.next_at - now < 1.0

    def wake_at(self, now: float) -> float:
        """When it next has something to do (a measurement, or the end of a wait for a plan)."""
        return min(self.next_at, self.expect_plan_until) if now < self.expect_plan_until else self.next_at

    def check(self, now: float, profile: DeviceProfile,
              between_rounds: bool) -> tuple[DeviceProfile, Envelope] | None:
        """When a measurement is due, ``between_rounds`` (registered, no plan held) and no plan is
        awaited: watch the machine for IDLE_WATCH_S; if the rest of it stayed idle, measure. A new
        figure comes back as the device's new profile and the `ProfileUpdate` to send."""
        if self.every_s <= 0 or now < self.next_at or not between_rounds or now < self.expect_plan_until:
            return None
        if self.idle_watch is None:
            self.idle_watch = (CpuWatch(), now + IDLE_WATCH_S)
            return None
        watch, until = self.idle_watch
        if now < until:
            return None
        self.idle_watch = None
        others, cpus = watch.others(), len(watch.cpus)
        if others is not None and others > max(BUSY_OTHERS_MIN, BUSY_OTHERS_SHARE * cpus):
            self.next_at = now + min(self.every_s, BUSY_RETRY_S)
            log.debug("%s: not re-measuring: other processes use %.2f of %d CPUs", self.device_id, others, cpus)
            return None
        return self._measure(profile)

    def _measure(self, profile: DeviceProfile) -> tuple[DeviceProfile, Envelope] | None:
        """Measure the compute; a figure from an idle device more than REPORT_CHANGE off the one the
        coordinator has becomes the new profile, with the `ProfileUpdate` that reports it."""
        every = self.every_s
        try:
            detail = self.measure()
        except (RuntimeError, ValueError) as exc:
            log.warning("%s: re-measuring failed: %s", self.device_id, exc)
            self.next_at = time.monotonic() + every
            return None
        quality, gflops = detail["quality"], float(detail["conv_train_gflops"])
        if quality.busy:
            self.next_at = time.monotonic() + min(every, BUSY_RETRY_S)
            log.info("%s: re-measured %.1f GFLOPS, but the device looked busy (%s): not reported",
                     self.device_id, gflops, quality.reason)
            return None
        self.next_at = time.monotonic() + every
        if not changed_enough(self.reported_gflops, gflops):
            log.info("%s: re-measured %.1f GFLOPS, within %.0f %% of the %.1f reported", self.device_id,
                     gflops, REPORT_CHANGE * 100, self.reported_gflops)
            return None
        before = self.reported_gflops
        profile = with_measurement(profile, detail)  # a later registration carries it too
        self.reported_gflops = profile.gflops
        update = ProfileUpdate(
            gflops=profile.gflops, trials=quality.trials, spread=quality.spread,
            median_gflops=quality.median_gflops or 0.0,
            load_avg=-1.0 if quality.load_avg is None else quality.load_avg,
            others_cpu=-1.0 if quality.others_cpu is None else quality.others_cpu,
            cpu_mhz=quality.cpu_mhz or 0.0)
        env = Envelope.of(update, self.device_id)
        self.update_id = env.msg_id
        self.updates.append(update)
        log.info("%s: re-measured while idle: %.1f GFLOPS (%.1f reported before): telling the coordinator",
                 self.device_id, update.gflops, before)
        return profile, env
