"""What every device part of a method receives and returns."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

import numpy as np

from edge_sdk.models.spec import count_flops
from edge_sdk.protocol.messages import Plan, Update
from edge_sdk.throttle import TRAIN_FLOPS_PER_FORWARD, Throttle

__all__ = ["LocalData", "DeviceContext", "DeviceMethod", "compute_seconds"]


@dataclass(frozen=True)
class LocalData:
    """A device's private training data; it never leaves the device."""

    x: np.ndarray
    y: np.ndarray
    num_classes: int

    def __post_init__(self) -> None:
        if len(self.x) != len(self.y):
            raise ValueError(f"{len(self.x)} inputs but {len(self.y)} labels")

    def __len__(self) -> int:
        return len(self.y)


@dataclass(frozen=True)
class DeviceContext:
    """Who is training, where it may keep state, and how it is throttled."""

    device_id: str
    round: int
    seed: int = 0
    state_dir: Path | None = None
    throttle: Throttle | None = None


class DeviceMethod(Protocol):
    """Trains on a plan and returns the update to upload."""

    def __call__(self, plan: Plan, data: LocalData, ctx: DeviceContext) -> Update: ...


def compute_seconds(ctx: DeviceContext, spec: dict, host_seconds: float, *, trained: int = 0,
                    forward: int = 0) -> float:
    """This round's compute time on the device: what it took here, or, under a throttle,
    the FLOPs of ``trained`` training samples and ``forward`` inference-only samples of
    ``spec``'s network at the profile's speed (independent of this host's speed and load)."""
    if ctx.throttle is None:
        return host_seconds
    flops = count_flops(spec) * (TRAIN_FLOPS_PER_FORWARD * trained + forward)
    return ctx.throttle.apply_compute(flops, host_seconds)
