"""When a device class is online: a phone is at home, on Wi-Fi and charging part of the day.

A profile file may carry an ``[availability]`` table (plain keys)::

    [availability]
    online_fraction = 0.5
    period_s = 86400.0
    source = "estimate: ..."

It describes the class, not one device, and is never sent in a registration (a coordinator learns
a real device's presence from the broker). A simulation uses it with ``--offline profiles``: each
device of the class is online ``online_fraction`` of every ``period_s`` at a phase of its own
(`coordinator.runtime.sim_clock`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Mapping

__all__ = ["OnlineShare"]

_KEYS = {"online_fraction", "period_s", "source"}
_MAX_SOURCE_LEN = 2000


@dataclass(frozen=True)
class OnlineShare:
    """Online ``online_fraction`` (in (0, 1]) of every ``period_s`` seconds; ``source`` says why."""

    online_fraction: float
    period_s: float = 86400.0
    source: str = ""

    def __post_init__(self) -> None:
        for name in ("online_fraction", "period_s"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) \
                    or value <= 0:
                raise ValueError(f"availability {name} must be a finite number > 0, got {value!r}")
            object.__setattr__(self, name, float(value))
        if self.online_fraction > 1:
            raise ValueError(f"availability online_fraction must be at most 1, got {self.online_fraction!r}")
        if not isinstance(self.source, str) or len(self.source) > _MAX_SOURCE_LEN:
            raise ValueError(f"availability source must be a str of <= {_MAX_SOURCE_LEN} chars")

    def to_dict(self) -> dict[str, Any]:
        """The plain keys of the ``[availability]`` table (``source`` only when set)."""
        out: dict[str, Any] = {"online_fraction": self.online_fraction, "period_s": self.period_s}
        if self.source:
            out["source"] = self.source
        return out

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> OnlineShare:
        """Strictly: the table's keys, ``online_fraction`` required."""
        unknown = sorted(set(d) - _KEYS)
        if unknown:
            raise ValueError(f"unknown availability field(s) {unknown}; allowed: {sorted(_KEYS)}")
        if "online_fraction" not in d:
            raise ValueError("availability is missing required field 'online_fraction'")
        return cls(**d)
