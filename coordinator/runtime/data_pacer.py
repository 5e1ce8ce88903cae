"""When a job that keeps serving (``[federation] min_new_samples``) starts its next round: once the
online devices hold enough training samples they have not trained on, no sooner than
``min_interval_s`` after the last round, and only inside ``windows``.

What a device holds new comes from its `data_count` messages (its registration counts as all new
before its first round) and goes back to 0 when its update of a round is accepted. One device
counts for at most ``new_samples_share`` of the threshold, so that one chatty sensor alone does not
start rounds; its count is believed only as far as its sample count is (`Fleet._accept_samples`).
"""

from __future__ import annotations

import datetime as dt
import math
import time
from dataclasses import dataclass
from typing import Callable, Iterable

from coordinator.core.device_record import DeviceRecord
from coordinator.core.federation import FederationConfig
from edge_sdk.schedule import TimeWindow

__all__ = ["DataPacer", "Pace"]


@dataclass(frozen=True)
class Pace:
    """Whether the next round may start, and what a person reads about it."""

    ready: bool
    new: int  # new samples counted (each device capped)
    devices: int  # online devices holding new samples
    why: str  # why it waits ("" when ready)


class DataPacer:
    """Decides, from the fleet's records, whether a round may start now."""

    def __init__(self, config: FederationConfig, clock: Callable[[], float] = time.monotonic,
                 local_time: Callable[[], dt.datetime] = dt.datetime.now) -> None:
        self.config, self.clock, self.local_time = config, clock, local_time
        self.windows = tuple(TimeWindow.parse(w) for w in config.windows)
        self.cap = max(1, math.ceil(config.new_samples_share * config.min_new_samples))
        self.last_round_end: float | None = None  # clock() when the last round ended

    def round_ended(self, participants: Iterable[DeviceRecord]) -> None:
        """A round ended: what its participants held is trained on."""
        self.last_round_end = self.clock()
        for record in participants:
            record.new_samples = 0

    def decide(self, online: Iterable[DeviceRecord]) -> Pace:
        """Ready when enough new samples are counted, the interval has passed and the time of day
        is inside a window; else why not."""
        counted = [min(d.new_samples, self.cap) for d in online if d.new_samples > 0]
        new, needed = sum(counted), self.config.min_new_samples
        if new < needed:
            return Pace(False, new, len(counted), f"{new} of {needed} new samples from {len(counted)} devices "
                                                  f"(each counts at most {self.cap})")
        if self.last_round_end is not None:
            wait = self.last_round_end + self.config.min_interval_s - self.clock()
            if wait > 0:
                return Pace(False, new, len(counted), f"min_interval_s: {wait:.0f} s to go")
        if self.windows and not any(w.contains(self.local_time()) for w in self.windows):
            return Pace(False, new, len(counted), f"outside the windows {', '.join(map(str, self.windows))}")
        return Pace(True, new, len(counted), "")
