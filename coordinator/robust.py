"""Robust aggregation: update-norm clipping, coordinate-wise median, trimmed mean.

A device's *update* is its tensors minus the current global tensors. Clipping
scales every update whose L2 norm (over all its float tensors jointly) exceeds a
bound back to that bound — a fixed number, or ``auto``: the median norm of the
round, so one device can move the model at most as far as a typical one. Then the
rule folds the (clipped) tensors: ``mean`` is the sample-weighted mean (plain
FedAvg); ``median`` and ``trimmed`` are coordinate-wise and *unweighted* — a
device cannot buy influence by claiming more samples. ``trimmed`` drops the
``trim`` fraction of the largest and of the smallest values of every coordinate.
Integer tensors (e.g. BatchNorm's batch counters) always take the weighted mean.

A device may send a *leading block* of a tensor (HeteroFL's and FedPara's narrow
widths hold the first rows/channels): its update covers that block only, each
coordinate is combined over the devices that hold it, and a coordinate nobody
holds keeps its current value. Every method that averages weights takes these
options (FedAvg, FLANC, HeteroFL, FedPara, pFedPara, low-rank, FDNNC, static pruning).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Mapping, Sequence

import numpy as np

from coordinator.aggregation import weighted_average
from coordinator.options import Option, Schema, choice, number
from coordinator.server_opt import SERVER_OPT_OPTIONS, ServerOptConfig
from coordinator.width_slicing import leading_block

__all__ = ["RULES", "ROBUST_KEYS", "ROBUST_OPTIONS", "RobustConfig", "robust_aggregate"]

RULES = ("mean", "median", "trimmed")


def _clip(key: str, text: str) -> float | str:
    return "auto" if text == "auto" else number(1e-12, 1e300)(key, text)


#: The ``--option`` keys of :class:`RobustConfig`: the rule, then the server optimizer applied to
#: what it returns (:mod:`coordinator.server_opt`).
ROBUST_OPTIONS = Schema(
    Option("aggregate", choice(*RULES), "mean", "how updates are combined: mean (sample-weighted), median, trimmed"),
    Option("trim", number(0.0, 0.5, open_hi=True), "0.1", "trimmed: fraction dropped at each end, in [0, 0.5)"),
    Option("clip", _clip, None, "clip update norms to this bound or auto (the round's median); default: no clip"),
    SERVER_OPT_OPTIONS,
)
ROBUST_KEYS = ROBUST_OPTIONS.keys
_RULE_KEYS = ("aggregate", "trim", "clip")


@dataclass(frozen=True)
class RobustConfig:
    """How updates are combined (``--option aggregate=... trim=... clip=...``)."""

    rule: str = "mean"
    trim: float = 0.1  # per side, for ``trimmed``
    clip: float | str | None = None  # None, a bound > 0, or "auto" (the round's median norm)
    server: ServerOptConfig = field(default_factory=ServerOptConfig)  # applied to the rule's result

    def __post_init__(self) -> None:
        if self.rule not in RULES:
            raise ValueError(f"option aggregate: must be one of {'|'.join(RULES)}, got {self.rule!r}")
        if not (isinstance(self.trim, (int, float)) and 0.0 <= self.trim < 0.5):
            raise ValueError(f"option trim: must be in [0, 0.5), got {self.trim!r}")
        if self.clip is not None and self.clip != "auto" and not (
                isinstance(self.clip, (int, float)) and math.isfinite(self.clip) and self.clip > 0):
            raise ValueError(f"option clip: must be auto or a number > 0, got {self.clip!r}")

    @property
    def plain(self) -> bool:
        """True when this is plain sample-weighted averaging."""
        return self.rule == "mean" and self.clip is None

    @classmethod
    def from_options(cls, options: Mapping[str, str], method: str) -> "RobustConfig":
        """Parse the keys ``aggregate``, ``trim``, ``clip`` and the server optimizer's of ``options``
        (others ignored)."""
        parsed = ROBUST_OPTIONS.only(_RULE_KEYS).parse(method, options, subset=True)
        if "aggregate" in parsed:
            parsed["rule"] = parsed.pop("aggregate")
        return cls(**parsed, server=ServerOptConfig.from_options(options, method))


def _is_float(a: np.ndarray) -> bool:
    return a.dtype.kind == "f"


def _fold_mean(shape: tuple[int, ...], deltas: Sequence[np.ndarray], weights: np.ndarray) -> np.ndarray:
    """Weighted mean per coordinate over the devices holding it (0 where none does)."""
    acc = np.zeros(shape, dtype=np.float64)
    held = np.zeros(shape, dtype=np.float64)
    for d, w in zip(deltas, weights):
        acc[leading_block(d.shape)] += w * d
        held[leading_block(d.shape)] += w
    return np.divide(acc, held, out=np.zeros(shape, dtype=np.float64), where=held > 0)


def _fold_order(shape: tuple[int, ...], deltas: Sequence[np.ndarray], rule: str, trim: float) -> np.ndarray:
    """Coordinate-wise median or trimmed mean over the devices holding each coordinate."""
    stack = np.full((len(deltas), *shape), np.nan)
    for i, d in enumerate(deltas):
        stack[(i, *leading_block(d.shape))] = d
    stack.sort(axis=0)  # NaN (not held) last
    k = np.sum(~np.isnan(stack), axis=0)  # holders per coordinate
    if rule == "median":
        lo, hi = np.maximum(k - 1, 0) // 2, k // 2  # the middle one or two
        mid = np.take_along_axis(stack, lo[None], 0)[0] + np.take_along_axis(stack, hi[None], 0)[0]
        return np.where(k > 0, mid / 2, 0.0)
    cut = np.minimum(np.floor(trim * k).astype(np.int64), np.maximum(k - 1, 0) // 2)
    sums = np.concatenate([np.zeros((1, *shape)), np.cumsum(np.nan_to_num(stack), axis=0)])
    total = np.take_along_axis(sums, (k - cut)[None], 0)[0] - np.take_along_axis(sums, cut[None], 0)[0]
    count = k - 2 * cut
    return np.divide(total, count, out=np.zeros(shape, dtype=np.float64), where=count > 0)


def robust_aggregate(current: Mapping[str, np.ndarray], tensor_sets: Sequence[Mapping[str, np.ndarray]],
                     weights: Sequence[float], config: RobustConfig) -> tuple[dict[str, np.ndarray], dict[str, float]]:
    """The new global tensors from the devices' ``tensor_sets``, and metrics of what happened.

    Every set holds every name of ``current``, the whole tensor or a leading block of it.
    """
    if len(tensor_sets) == 0:
        raise ValueError("need at least one tensor set")
    full = all(np.shape(t[k]) == np.shape(current[k]) for t in tensor_sets for k in current)
    if config.plain and full:
        mean = weighted_average([{k: t[k] for k in current} for t in tensor_sets], weights)
        return {k: v if _is_float(np.asarray(current[k])) else np.rint(v).astype(np.asarray(current[k]).dtype)
                for k, v in mean.items()}, {}
    w = np.asarray(list(weights), dtype=np.float64)
    w = w / w.sum()
    result: dict[str, np.ndarray] = {}
    names = []
    for k, value in current.items():
        if _is_float(np.asarray(value)):
            names.append(k)
        else:  # counters: the weighted mean over holders, in their own dtype
            old = np.asarray(value)
            mean = _fold_mean(old.shape, [np.asarray(t[k], dtype=np.float64) for t in tensor_sets], w)
            held = np.zeros(old.shape, dtype=bool)
            for t in tensor_sets:
                held[leading_block(np.shape(t[k]))] = True
            result[k] = np.where(held, np.rint(mean), old).astype(old.dtype)
    base = {k: np.asarray(current[k], dtype=np.float64) for k in names}
    deltas = [{k: np.asarray(t[k], dtype=np.float64) - base[k][leading_block(np.shape(t[k]))] for k in names}
              for t in tensor_sets]
    norms = np.array([math.sqrt(sum(float(np.vdot(d[k], d[k])) for k in names)) for d in deltas])
    metrics: dict[str, float] = {"update_norm_median": float(np.median(norms)),
                                 "update_norm_max": float(norms.max())}
    if config.clip is not None:
        bound = float(np.median(norms)) if config.clip == "auto" else float(config.clip)
        scales = np.minimum(1.0, bound / np.maximum(norms, 1e-12))
        deltas = [{k: v * s for k, v in d.items()} for d, s in zip(deltas, scales)]
        metrics.update(clip_bound=bound, clipped=float(np.sum(scales < 1.0)))
    for k in names:
        ds = [d[k] for d in deltas]
        folded = _fold_mean(base[k].shape, ds, w) if config.rule == "mean" \
            else _fold_order(base[k].shape, ds, config.rule, config.trim)
        result[k] = (base[k] + folded).astype(np.float32)
    return {k: result[k] for k in current}, metrics
