"""Simulated time for a simulated fleet: when each device is online, and when its work ends.

A round's ``seconds`` were always the profiled devices' time (`edge_sdk.throttle`: FLOPs at the
profile's GFLOPS, bytes at its link speed). A :class:`SimClock` adds what both loops need to
compare synchronous rounds with buffered asynchronous aggregation on the same fleet:

- a clock since the job started (``now``), which the synchronous loop advances round by round and
  the asynchronous loop event by event;
- **availability**: a share of the devices (``offline_share``, picked by a seeded hash of the id)
  is online only ``online_fraction`` of every ``period_s`` (a phone away part of the day), at a
  seeded phase; a device offline when work is sent starts it when it is back, and its work pauses
  while it is offline (it uploads when it is back); or each device as its profile's
  ``[availability]`` says (``by_device``: ``--offline profiles``, e.g. a phone online half the day);
- a **simulated deadline** for synchronous rounds (``deadline_s``; None: wait for every update):
  an update that would arrive after it is dropped, as a real coordinator's deadline would.

It decides nothing in a real fleet: there time is the wall clock and availability is real.
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Mapping
from dataclasses import dataclass

__all__ = ["Availability", "SimClock", "parse_offline", "PROFILES"]

#: ``--offline profiles``: each device online as its profile's ``[availability]`` says
PROFILES = "profiles"


@dataclass(frozen=True)
class Availability:
    """A device online ``online_fraction`` of each ``period_s``, from ``phase`` (seconds) on."""

    online_fraction: float = 1.0
    period_s: float = 3600.0
    phase: float = 0.0

    @property
    def always(self) -> bool:
        return self.online_fraction >= 1.0

    def _position(self, t: float) -> float:
        return (t - self.phase) % self.period_s

    def online(self, t: float) -> bool:
        """Whether the device is online at simulated time ``t``."""
        return self.always or self._position(t) < self.online_fraction * self.period_s

    def next_online(self, t: float) -> float:
        """The first time at or after ``t`` the device is online."""
        return t if self.online(t) else t + self.period_s - self._position(t)

    def finish(self, start: float, work_s: float) -> float:
        """When ``work_s`` seconds of online time, begun at ``start`` (or when next online), are done."""
        t = self.next_online(start)
        if self.always:
            return t + work_s
        window = self.online_fraction * self.period_s
        opened = t - self._position(t)  # when this online window opened
        first = opened + window - t  # online seconds left in it
        if work_s <= first:
            return t + work_s
        windows, rest = divmod(work_s - first, window)  # whole windows after it, and the rest
        if rest == 0:
            return opened + windows * self.period_s + window
        return opened + (windows + 1) * self.period_s + rest


def parse_offline(text: str) -> tuple[float, float, float]:
    """``SHARE[:ONLINE[:PERIOD_S]]`` (e.g. ``0.2:0.5:3600``: a fifth of the devices online half of
    every hour) as ``(share, online_fraction, period_s)``; a one-line ValueError otherwise."""
    parts = text.split(":")
    try:
        values = [float(p) for p in parts]
    except ValueError:
        raise ValueError(f"offline {text!r}: expected SHARE[:ONLINE[:PERIOD_S]], e.g. 0.2:0.5:3600") from None
    if not 1 <= len(values) <= 3:
        raise ValueError(f"offline {text!r}: expected SHARE[:ONLINE[:PERIOD_S]], e.g. 0.2:0.5:3600")
    share, online, period = values + [0.5, 3600.0][len(values) - 1:]
    if not (math.isfinite(share) and 0 <= share <= 1):
        raise ValueError(f"offline share must be in [0, 1], got {share:g}")
    if not (math.isfinite(online) and 0 < online <= 1):
        raise ValueError(f"offline: the online fraction must be in (0, 1], got {online:g}")
    if not (math.isfinite(period) and period > 0):
        raise ValueError(f"offline: the period must be > 0 seconds, got {period:g}")
    return share, online, period


def _unit(seed: int, device_id: str, what: str) -> float:
    """A number in [0, 1) fixed by the seed, the device and ``what`` (the same in every run)."""
    digest = hashlib.blake2b(f"{seed}:{device_id}:{what}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big") / 2.0 ** 64


class SimClock:
    """The simulated fleet's clock, availability and synchronous deadline (see the module doc)."""

    def __init__(self, seed: int = 0, offline_share: float = 0.0, online_fraction: float = 1.0,
                 period_s: float = 3600.0, deadline_s: float | None = None,
                 by_device: Mapping[str, tuple[float, float]] | None = None) -> None:
        if deadline_s is not None and not (math.isfinite(deadline_s) and deadline_s > 0):
            raise ValueError(f"the simulated deadline must be > 0 seconds, got {deadline_s!r}")
        self.seed, self.offline_share = seed, offline_share
        self.online_fraction, self.period_s = online_fraction, period_s
        self.deadline_s = deadline_s
        #: (online_fraction, period_s) of each device whose profile says when it is online
        #: (``--offline profiles``); the others follow ``offline_share``
        self.by_device = dict(by_device or {})
        self.now = 0.0  # simulated seconds since the job's first round began
        self._availability: dict[str, Availability] = {}

    @classmethod
    def from_text(cls, seed: int, offline: str | None, deadline_s: float | None = None,
                  by_device: Mapping[str, tuple[float, float]] | None = None) -> "SimClock":
        """A clock for ``--offline SHARE[:ONLINE[:PERIOD_S]]`` (None: every device always online),
        or ``--offline profiles``: each device as ``by_device`` says (its profile's availability)."""
        if offline == PROFILES:
            return cls(seed, deadline_s=deadline_s, by_device=by_device)
        share, online, period = parse_offline(offline) if offline else (0.0, 1.0, 3600.0)
        return cls(seed, share, online, period, deadline_s)

    def availability(self, device_id: str) -> Availability:
        """The device's availability (fixed by the seed and its id)."""
        found = self._availability.get(device_id)
        if found is None:
            if device_id in self.by_device:  # its profile's [availability]
                online, period = self.by_device[device_id]
            elif _unit(self.seed, device_id, "offline") < self.offline_share:
                online, period = self.online_fraction, self.period_s
            else:
                online, period = 1.0, None
            found = Availability() if period is None else \
                Availability(online, period, _unit(self.seed, device_id, "phase") * period)
            self._availability[device_id] = found
        return found

    def online(self, device_id: str, t: float | None = None) -> bool:
        return self.availability(device_id).online(self.now if t is None else t)

    def finish(self, device_id: str, start: float, work_s: float) -> float:
        """When the device's ``work_s`` seconds of download, training and upload, sent at ``start``, arrive."""
        return self.availability(device_id).finish(start, work_s)

    def describe(self) -> dict[str, float | None]:
        """What the report records of it."""
        return {"offline_share": self.offline_share, "online_fraction": self.online_fraction,
                "period_s": self.period_s, "deadline_s": self.deadline_s,
                "by_profile": sum(online < 1 for online, _ in self.by_device.values())}
