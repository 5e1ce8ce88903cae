"""Averaging of tensors reported by several devices."""

from __future__ import annotations

from typing import Iterable, Mapping, Sequence

import numpy as np

from edge_sdk.protocol.messages import Update

__all__ = ["weighted_average", "mean_train_loss"]


def weighted_average(tensor_sets: Sequence[Mapping[str, np.ndarray]],
                     weights: Iterable[float]) -> dict[str, np.ndarray]:
    """Per-name weighted mean (float64 accumulation, float32 result)."""
    weights = np.asarray(list(weights), dtype=np.float64)
    if len(tensor_sets) == 0 or len(weights) != len(tensor_sets):
        raise ValueError("need one weight per tensor set, and at least one set")
    if (weights < 0).any() or weights.sum() <= 0:
        raise ValueError("weights must be non-negative with a positive sum")
    weights = weights / weights.sum()
    result: dict[str, np.ndarray] = {}
    for name in tensor_sets[0]:
        acc = np.zeros(tensor_sets[0][name].shape, dtype=np.float64)
        for tensors, w in zip(tensor_sets, weights):
            acc += w * tensors[name]
        result[name] = acc.astype(np.float32)
    return result


def mean_train_loss(updates: Sequence[Update]) -> float:
    """The devices' reported local training ``loss``, averaged weighted by their sample counts
    (NaN when one did not report it)."""
    return float(np.average([u.metrics.get("loss", float("nan")) for u in updates],
                            weights=[u.num_samples for u in updates]))
