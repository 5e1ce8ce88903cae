"""Per-channel moments of a device's training data (count, mean, M2 in float64, in the raw value
scale), merged across the fleet into the job's normalisation when no one holds central data
(``[task] mean = "fleet"``): Chan et al.'s pairwise update, exact for any split of the samples."""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from edge_sdk.data.local_data import LocalData

__all__ = ["ChannelMoments", "channel_moments", "merge_moments", "raw_values"]


@dataclass(frozen=True)
class ChannelMoments:
    """``count`` samples; per channel the mean and M2 (the sum of squared deviations) of its values,
    per value averaged over a sample's positions (so M2/count is the per-value variance)."""

    count: int
    mean: tuple[float, ...]
    m2: tuple[float, ...]

    def weighed_as(self, count: int) -> "ChannelMoments":
        """The same statistics weighing ``count`` samples (a claim the coordinator believes less of)."""
        if count >= self.count or self.count == 0:
            return self
        return ChannelMoments(count, self.mean, tuple(m * count / self.count for m in self.m2))

    def std(self) -> tuple[float, ...]:
        """Per channel, the standard deviation (population), at least 1e-6 (a constant channel)."""
        return tuple(max(math.sqrt(m / self.count), 1e-6) if self.count else 1.0 for m in self.m2)


def raw_values(data: LocalData) -> np.ndarray:
    """``data``'s samples as ``(N, C, positions)`` float64 in the raw value scale (its own
    normalisation undone)."""
    x = np.asarray(data.x, np.float64)
    channels = x.shape[1] if x.ndim > 1 else 1
    values = x.reshape(len(x), channels, -1)
    if data.preprocessing is not None and not data.preprocessing.is_raw and data.x.dtype != np.uint8:
        own = data.preprocessing
        mean, std = (np.asarray(v, np.float64)[None, :, None] for v in (own.mean, own.std))
        values = values * std + mean
    return values


def channel_moments(data: LocalData) -> ChannelMoments:
    """The moments of ``data``'s samples in the raw value scale (its own normalisation undone)."""
    if len(data.x) == 0:
        return ChannelMoments(0, (), ())
    values = raw_values(data)
    mean = values.mean(axis=(0, 2))
    variance = values.var(axis=(0, 2))  # the channel's per-value variance over every value
    return ChannelMoments(len(values), tuple(float(m) for m in mean), tuple(float(v) * len(values) for v in variance))


def merge_moments(parts: list[ChannelMoments]) -> ChannelMoments:
    """The moments of the union of ``parts``' samples (Chan, Golub & LeVeque's pairwise update)."""
    parts = [p for p in parts if p.count > 0]
    if not parts:
        raise ValueError("no device reported statistics of its data")
    channels = len(parts[0].mean)
    if any(len(p.mean) != channels or len(p.m2) != channels for p in parts):
        raise ValueError("devices reported statistics of different numbers of channels")
    count, mean, m2 = 0, np.zeros(channels), np.zeros(channels)
    for part in parts:
        n_b, mean_b, m2_b = part.count, np.asarray(part.mean), np.asarray(part.m2)
        total = count + n_b
        delta = mean_b - mean
        mean = mean + delta * n_b / total
        m2 = m2 + m2_b + delta * delta * count * n_b / total
        count = total
    return ChannelMoments(count, tuple(float(v) for v in mean), tuple(float(v) for v in m2))
