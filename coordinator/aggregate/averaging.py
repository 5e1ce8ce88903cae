"""Averaging of tensors reported by several devices."""

from __future__ import annotations

from typing import Iterable, Mapping, Sequence

import numpy as np

from edge_sdk.protocol.messages import Update

__all__ = ["weighted_average", "mean_train_loss", "capped_shares", "check_weights"]


def check_weights(weights: Iterable[float]) -> np.ndarray:
    """``weights`` as float64, or ValueError unless they are finite, non-negative and sum above 0."""
    w = np.asarray(list(weights), dtype=np.float64)
    if w.ndim != 1 or len(w) == 0:
        raise ValueError("need a non-empty list of weights")
    if not np.isfinite(w).all() or (w < 0).any() or not w.sum() > 0:
        raise ValueError("weights must be finite and non-negative with a positive sum")
    return w


def capped_shares(weights: Iterable[float], max_share: float) -> np.ndarray:
    """``weights`` with the largest lowered to one common cap so that none is above ``max_share``
    of the (new) total; unchanged when none was. When the cap cannot hold (fewer than
    ``1 / max_share`` weights), the weights become equal."""
    w = check_weights(weights)
    if not 0 < max_share <= 1:
        raise ValueError(f"max_share must be in (0, 1], got {max_share!r}")
    if w.max() <= max_share * w.sum():
        return w
    desc = np.sort(w)[::-1]
    rest = np.concatenate([np.cumsum(desc[::-1])[::-1], [0.0]])  # rest[k] = sum of all but the k largest
    for k in range(1, len(w)):  # cap the k largest at c, with c = max_share * (k c + rest[k])
        if k * max_share >= 1:
            break
        cap = max_share * rest[k] / (1 - k * max_share)
        if desc[k] <= cap and cap > 0:  # cap 0: only zero weights besides the k largest; no cap holds
            return np.minimum(w, cap)
    return np.full_like(w, w.sum() / len(w))


def weighted_average(tensor_sets: Sequence[Mapping[str, np.ndarray]],
                     weights: Iterable[float]) -> dict[str, np.ndarray]:
    """Per-name weighted mean (float64 accumulation, float32 result)."""
    weights = check_weights(weights)
    if len(weights) != len(tensor_sets):
        raise ValueError("need one weight per tensor set, and at least one set")
    weights = weights / weights.sum()
    result: dict[str, np.ndarray] = {}
    for name in tensor_sets[0]:
        acc = np.zeros(tensor_sets[0][name].shape, dtype=np.float64)
        for tensors, w in zip(tensor_sets, weights, strict=True):  # lengths checked above
            acc += w * tensors[name]
        result[name] = acc.astype(np.float32)
    return result


def mean_train_loss(updates: Sequence[Update]) -> float:
    """The devices' reported local training ``loss``, averaged weighted by their sample counts
    (NaN when one did not report it)."""
    return float(np.average([u.metrics.get("loss", float("nan")) for u in updates],
                            weights=[u.num_samples for u in updates]))
