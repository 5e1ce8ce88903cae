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
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Mapping, Sequence

import numpy as np

from coordinator.aggregation import weighted_average

__all__ = ["RULES", "RobustConfig", "robust_aggregate"]

RULES = ("mean", "median", "trimmed")


@dataclass(frozen=True)
class RobustConfig:
    """How updates are combined (``--option aggregate=... trim=... clip=...``)."""

    rule: str = "mean"
    trim: float = 0.1  # per side, for ``trimmed``
    clip: float | str | None = None  # None, a bound > 0, or "auto" (the round's median norm)

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
        """Parse the keys ``aggregate``, ``trim`` and ``clip`` of ``options`` (others ignored)."""
        kw: dict = {}
        if "aggregate" in options:
            kw["rule"] = options["aggregate"].strip()
        try:
            if "trim" in options:
                kw["trim"] = float(options["trim"])
            if "clip" in options:
                text = options["clip"].strip()
                kw["clip"] = "auto" if text == "auto" else float(text)
        except ValueError as exc:
            raise ValueError(f"{method}: {exc}") from None
        try:
            return cls(**kw)
        except ValueError as exc:
            raise ValueError(f"{method} {exc}") from None


def _is_float(a: np.ndarray) -> bool:
    return a.dtype.kind == "f"


def robust_aggregate(current: Mapping[str, np.ndarray], tensor_sets: Sequence[Mapping[str, np.ndarray]],
                     weights: Sequence[float], config: RobustConfig) -> tuple[dict[str, np.ndarray], dict[str, float]]:
    """The new global tensors from the devices' ``tensor_sets``, and metrics of what happened."""
    if len(tensor_sets) == 0:
        raise ValueError("need at least one tensor set")
    if config.plain:
        return weighted_average(tensor_sets, weights), {}
    names = [k for k in current if _is_float(np.asarray(current[k]))]
    base = {k: np.asarray(current[k], dtype=np.float64) for k in names}
    deltas = [{k: np.asarray(t[k], dtype=np.float64) - base[k] for k in names} for t in tensor_sets]
    norms = np.array([math.sqrt(sum(float(np.vdot(d[k], d[k])) for k in names)) for d in deltas])
    metrics: dict[str, float] = {"update_norm_median": float(np.median(norms)),
                                 "update_norm_max": float(norms.max())}
    if config.clip is not None:
        bound = float(np.median(norms)) if config.clip == "auto" else float(config.clip)
        scales = np.minimum(1.0, bound / np.maximum(norms, 1e-12))
        deltas = [{k: v * s for k, v in d.items()} for d, s in zip(deltas, scales)]
        metrics.update(clip_bound=bound, clipped=float(np.sum(scales < 1.0)))
    if config.rule == "mean":
        w = np.asarray(list(weights), dtype=np.float64)
        w = w / w.sum()
        folded = {k: sum(wi * d[k] for wi, d in zip(w, deltas)) for k in names}
    else:
        folded = {}
        for k in names:
            stack = np.stack([d[k] for d in deltas])
            if config.rule == "median":
                folded[k] = np.median(stack, axis=0)
            else:
                n = len(deltas)
                cut = min(int(math.floor(config.trim * n)), (n - 1) // 2)
                folded[k] = np.sort(stack, axis=0)[cut:n - cut].mean(axis=0)
    result = weighted_average([{k: t[k] for k in current if k not in base} for t in tensor_sets], weights) \
        if len(base) < len(current) else {}
    result.update({k: (base[k] + folded[k]).astype(np.float32) for k in names})
    return {k: result[k] for k in current}, metrics
