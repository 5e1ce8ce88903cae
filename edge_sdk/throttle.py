"""Make a fast host behave like a slower device (simulated or real time).

A :class:`Throttle` turns the FLOPs a device's work costs into seconds at the profile's
sustained GFLOPS, and payload sizes into link time from the profile's Mbit/s. Simulated
time therefore depends only on the work and the profile, never on how fast or how busy
the host is: the same job reports the same seconds on any machine. In ``"virtual"``
mode it only returns the simulated seconds, in ``"sleep"`` mode it also sleeps so the
process really runs at device speed, and ``"off"`` disables the simulation.

FLOPs follow :func:`edge_sdk.models.spec.count_flops` (2 x multiply-accumulates of the
conv and linear layers); a training sample costs :data:`TRAIN_FLOPS_PER_FORWARD` forward
passes (forward, gradient of the input, gradient of the weights), the same counting as
the profile's GFLOPS figure (:func:`edge_sdk.profiling.measure_flops_detail`).
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass

from edge_sdk.profiling import DeviceProfile

__all__ = ["MODES", "TRAIN_FLOPS_PER_FORWARD", "Throttle"]

#: Valid values of :attr:`Throttle.mode`.
MODES = ("virtual", "sleep", "off")

#: A training step costs this many forward passes: forward, grad-input and grad-weight.
TRAIN_FLOPS_PER_FORWARD = 3


def _check_seconds(name: str, value: float) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ValueError(f"{name} must be a number, got {type(value).__name__}")
    if not math.isfinite(value) or value < 0:
        raise ValueError(f"{name} must be finite and >= 0, got {value!r}")
    return float(value)


@dataclass(frozen=True)
class Throttle:
    """Simulate ``profile``'s compute and link speed.

    ``max_sleep_s`` caps every single sleep in ``"sleep"`` mode so a simulation
    of a very slow device cannot hang; the returned simulated time is not capped.
    """

    profile: DeviceProfile
    mode: str = "virtual"
    max_sleep_s: float = 30.0

    def __post_init__(self) -> None:
        if not isinstance(self.profile, DeviceProfile):
            raise ValueError(f"profile must be a DeviceProfile, got {type(self.profile).__name__}")
        if self.mode not in MODES:
            raise ValueError(f"mode must be one of {MODES}, got {self.mode!r}")
        object.__setattr__(self, "max_sleep_s", _check_seconds("max_sleep_s", self.max_sleep_s))

    def compute_seconds(self, flops: int) -> float:
        """Seconds the device needs for ``flops`` floating-point operations."""
        if isinstance(flops, bool) or not isinstance(flops, int) or flops < 0:
            raise ValueError(f"flops must be an int >= 0, got {flops!r}")
        return flops / (self.profile.gflops * 1e9)

    def transfer_seconds(self, nbytes: int, direction: str) -> float:
        """Seconds to move ``nbytes`` over the device's ``"up"`` or ``"down"`` link."""
        if isinstance(nbytes, bool) or not isinstance(nbytes, int) or nbytes < 0:
            raise ValueError(f"nbytes must be an int >= 0, got {nbytes!r}")
        if direction == "up":
            mbps = self.profile.uplink_mbps
        elif direction == "down":
            mbps = self.profile.downlink_mbps
        else:
            raise ValueError(f"direction must be 'up' or 'down', got {direction!r}")
        return nbytes * 8 / (mbps * 1e6)

    def apply_compute(self, flops: int, host_seconds: float) -> float:
        """Simulated seconds of work costing ``flops`` that took ``host_seconds`` here.

        In "sleep" mode sleep ``simulated - host`` (capped); in "off" mode nothing is
        simulated and ``host_seconds`` is returned.
        """
        host_seconds = _check_seconds("host_seconds", host_seconds)
        simulated = self.compute_seconds(flops)
        if self.mode == "off":
            return host_seconds
        self.settle(simulated, host_seconds)
        return simulated

    def settle(self, simulated_seconds: float, host_seconds: float) -> None:
        """In "sleep" mode sleep what work of ``simulated_seconds`` that took ``host_seconds``
        here still owes (capped); nothing otherwise. A simulated device whose compute ran on a
        shared thread with a "virtual" throttle settles here afterwards, on its own thread."""
        if self.mode == "sleep":
            self._sleep(simulated_seconds - host_seconds)

    def apply_transfer(self, nbytes: int, direction: str) -> float:
        """Simulated link seconds; in "sleep" mode sleep that long (capped).

        In "off" mode nothing is simulated and 0.0 is returned (the real network
        time is whatever the transfer took).
        """
        simulated = self.transfer_seconds(nbytes, direction)
        if self.mode == "off":
            return 0.0
        if self.mode == "sleep":
            self._sleep(simulated)
        return simulated

    def _sleep(self, seconds: float) -> None:
        if seconds > 0:
            time.sleep(min(seconds, self.max_sleep_s))
