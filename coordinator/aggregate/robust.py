"""Robust aggregation: sample-weight bounds, update-norm clipping, coordinate-wise median, trimmed mean.

A device's *update* is its tensors minus the current global tensors. Three defences apply to
every method that averages weights, in this order:

1. **Weight shares.** A device's weight is its sample count (bounded by what it registered and
   how fast the fleet lets that grow: `coordinator.runtime.device_budgets`); once three or more devices
   report, no device keeps more than ``max_share`` (default half) of the round's weight — the
   largest weights are lowered to a common cap until none is above it.
2. **Norm screening** (``clip``, on by default: ``3x``). Every update whose L2 norm (over all
   its float tensors jointly) exceeds a bound is scaled back to it, never dropped, and in the
   mean its weight is scaled by the same factor: an update a million times too long fades out,
   one just over the bound loses little (on non-IID digits, shards:3, no honest update was ever
   above 2.4x the median: BENCHMARKS.md). The bound is a number, or ``Kx``: K times a reference
   norm — the round's median norm when three or more devices report (``auto`` = ``1x``); with one
   or two, the smaller of their smallest norm and the group's last trusted reference
   (`Strategy.fold` keeps one per group), so a single device cannot set its own bound.
3. **The rule.** ``mean`` is the weighted mean; ``median`` and ``trimmed`` are coordinate-wise and
   *unweighted* — a device cannot buy influence by claiming more samples. ``trimmed`` drops the
   ``trim`` fraction of the largest and of the smallest values of every coordinate, and at least
   one at each end once three or more devices hold it.

The settings (``aggregate``, ``trim``, ``clip``, ``max_share``) are
:class:`edge_sdk.methods.settings.shared.RobustConfig`, a group of every such method's settings.
Integer tensors (e.g. BatchNorm's batch counters) always take the weighted mean.

A device may send a *leading block* of a tensor (HeteroFL's and FedPara's narrow widths hold the
first rows/channels): its update covers that block only, each coordinate is combined over the
devices that hold it, and a coordinate nobody holds keeps its current value. Every method that
averages weights takes these options (FedAvg, FLANC, HeteroFL, FedPara, pFedPara, low-rank, FDNNC,
static pruning). Deltas are made one tensor at a time, and the mean folds them into a float64
running sum one device at a time (memory: O(model), whatever the number of devices; updates kept
in files are read one tensor at a time, `coordinator.core.spooled_tensors`). ``median`` and
``trimmed`` sort every coordinate over the devices: they hold one tensor of every device at once
(float64: 8 bytes × devices × the largest tensor's size).
"""

from __future__ import annotations

from typing import Iterable, Mapping, Sequence

import numpy as np

from edge_sdk.methods.settings.shared import RobustConfig

from coordinator.aggregate.averaging import capped_shares, weighted_average
from coordinator.aggregate.width_slicing import leading_block

__all__ = ["robust_aggregate", "reference_norm"]


def _is_float(a: np.ndarray) -> bool:
    return a.dtype.kind == "f"


def reference_norm(norms: np.ndarray, trusted: float | None = None) -> float | None:
    """The norm a relative clip multiplies: the median of three or more norms; of one or two, the
    smallest, lowered to ``trusted`` (a reference from an earlier round) when that is smaller;
    None when there is nothing to go by (one device, no trusted reference)."""
    if len(norms) >= 3:
        return float(np.median(norms))
    candidates = [float(norms.min())] if len(norms) == 2 else []
    if trusted is not None:
        candidates.append(float(trusted))
    return min(candidates) if candidates else None


def _delta(t: np.ndarray, base: np.ndarray) -> np.ndarray:
    return np.asarray(t, dtype=np.float64) - base[leading_block(np.shape(t))]


def _fold_mean(shape: tuple[int, ...], deltas: Iterable[np.ndarray], weights: np.ndarray) -> np.ndarray:
    """Weighted mean per coordinate over the devices holding it (0 where none does): a float64
    running sum in the devices' order, one device's delta at a time."""
    acc = np.zeros(shape, dtype=np.float64)
    held = np.zeros(shape, dtype=np.float64)
    for d, w in zip(deltas, weights, strict=True):
        acc[leading_block(d.shape)] += w * d
        held[leading_block(d.shape)] += w
    return np.divide(acc, held, out=np.zeros(shape, dtype=np.float64), where=held > 0)


def _fold_order(shape: tuple[int, ...], deltas: Sequence[np.ndarray], rule: str, trim: float) -> np.ndarray:
    """Coordinate-wise median or trimmed mean over the devices holding each coordinate (0 where none does)."""
    stack = np.full((len(deltas), *shape), np.nan)
    for i, d in enumerate(deltas):
        stack[(i, *leading_block(d.shape))] = d
    stack.sort(axis=0)  # NaN (not held) last
    k = np.sum(~np.isnan(stack), axis=0)  # holders per coordinate
    if rule == "median":
        lo, hi = np.maximum(k - 1, 0) // 2, k // 2  # the middle one or two
        mid = np.take_along_axis(stack, lo[None], 0)[0] + np.take_along_axis(stack, hi[None], 0)[0]
        return np.where(k > 0, mid / 2, 0.0)
    cut = np.floor(trim * k).astype(np.int64)
    cut = np.where(k >= 3, np.maximum(cut, 1), cut)  # at least one per side from 3 holders
    cut = np.minimum(cut, np.maximum(k - 1, 0) // 2)  # always keep one or two
    sums = np.concatenate([np.zeros((1, *shape)), np.cumsum(np.nan_to_num(stack), axis=0)])
    total = np.take_along_axis(sums, (k - cut)[None], 0)[0] - np.take_along_axis(sums, cut[None], 0)[0]
    count = k - 2 * cut
    return np.divide(total, count, out=np.zeros(shape, dtype=np.float64), where=count > 0)


def robust_aggregate(current: Mapping[str, np.ndarray], tensor_sets: Sequence[Mapping[str, np.ndarray]],
                     weights: Sequence[float], config: RobustConfig,
                     trusted_norm: float | None = None) -> tuple[dict[str, np.ndarray], dict[str, float]]:
    """The new global tensors from the devices' ``tensor_sets``, and metrics of what happened.

    Every set holds every name of ``current``, the whole tensor or a leading block of it.
    ``trusted_norm``: a reference norm from an earlier round of this group, used when fewer than
    three devices report (see :func:`reference_norm`); the metric ``norm_reference`` is this
    round's.
    """
    if len(tensor_sets) == 0:
        raise ValueError("need at least one tensor set")
    w = capped_shares(weights, config.max_share if len(tensor_sets) >= 3 else 1.0)
    metrics: dict[str, float] = {}
    if len(tensor_sets) >= 3 and config.max_share < 1.0:
        raw = np.asarray(list(weights), dtype=np.float64)
        metrics["weight_capped"] = float(np.sum(w < raw * (1 - 1e-12)))
    full = all(np.shape(t[k]) == np.shape(current[k]) for t in tensor_sets for k in current)
    if config.plain and full:
        mean = weighted_average([{k: t[k] for k in current} for t in tensor_sets], w)
        return {k: v if _is_float(np.asarray(current[k])) else np.rint(v).astype(np.asarray(current[k]).dtype)
                for k, v in mean.items()}, metrics
    w = w / w.sum()
    names = [k for k, value in current.items() if _is_float(np.asarray(value))]
    base = {k: np.asarray(current[k], dtype=np.float64) for k in names}
    squares = np.zeros(len(tensor_sets))
    for k in names:  # one tensor at a time: never every device's whole update at once
        for i, t in enumerate(tensor_sets):
            d = _delta(t[k], base[k])
            squares[i] += float(np.vdot(d, d))
    norms = np.sqrt(squares)
    metrics.update(update_norm_median=float(np.median(norms)), update_norm_max=float(norms.max()))
    scales = np.ones(len(tensor_sets))
    if config.clip is not None:
        factor = config.clip_factor
        ref = reference_norm(norms, trusted_norm) if factor is not None else None
        bound = float(config.clip) if factor is None else (None if ref is None else factor * ref)  # type: ignore[arg-type]
        if ref is not None:
            metrics["norm_reference"] = ref
        if bound is not None:
            scales = np.minimum(1.0, bound / np.maximum(norms, 1e-300))
            metrics.update(clip_bound=bound, clipped=float(np.sum(scales < 1.0)))
            if (scales < 1.0).any():  # a screen that scales nothing back changes nothing, to the bit
                w = w * scales  # a clipped update also weighs less in the mean, as much as it was scaled
                w = w / w.sum() if w.sum() > 0 else np.full(len(w), 1.0 / len(w))
    result: dict[str, np.ndarray] = {}
    for k, value in current.items():
        if k not in base:  # counters: the weighted mean over holders, in their own dtype
            old = np.asarray(value)
            mean = _fold_mean(old.shape, [np.asarray(t[k], dtype=np.float64) for t in tensor_sets], w)
            held = np.zeros(old.shape, dtype=bool)
            for t in tensor_sets:
                held[leading_block(np.shape(t[k]))] = True
            result[k] = np.where(held, np.rint(mean), old).astype(old.dtype)
    for k in names:
        ds = (_delta(t[k], base[k]) * s for t, s in zip(tensor_sets, scales, strict=True))
        folded = _fold_mean(base[k].shape, ds, w) if config.rule == "mean" \
            else _fold_order(base[k].shape, list(ds), config.rule, config.trim)
        result[k] = (base[k] + folded).astype(np.float32)
    return {k: result[k] for k in current}, metrics
