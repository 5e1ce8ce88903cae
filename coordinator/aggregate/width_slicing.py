"""What the width methods (FLANC, HeteroFL, FedPara) share on the coordinator: nested slices of
full-width tensors, and BatchNorm statistics pooled over devices."""

from __future__ import annotations

from typing import Mapping

import numpy as np

__all__ = ["leading_block", "pool_bn_stats"]

_MEAN, _VAR = ".running_mean", ".running_var"


def leading_block(shape: tuple[int, ...]) -> tuple[slice, ...]:
    """The index of a leading block of ``shape`` inside a tensor at least as large."""
    return tuple(slice(0, n) for n in shape)


def pool_bn_stats(found: list[tuple[Mapping[str, np.ndarray], int]], names: list[str]) -> dict[str, np.ndarray]:
    """BatchNorm statistics of several data sets pooled as a mixture, weighted by sample counts.

    ``found`` holds ``(tensors, samples)``; ``names`` the ``*.running_mean`` / ``*.running_var``
    names to pool: the mean of the means, and the mean of ``var + mean²`` minus the squared mean.
    """
    total = float(sum(n for _, n in found))
    out: dict[str, np.ndarray] = {}
    for name in [k for k in names if k.endswith(_MEAN)]:
        var_name = name[:-len(_MEAN)] + _VAR
        mean = sum(n * t[name].astype(np.float64) for t, n in found) / total
        second = sum(n * (t[var_name].astype(np.float64) + t[name].astype(np.float64) ** 2)
                     for t, n in found) / total
        out[name] = mean.astype(np.float32)
        out[var_name] = np.maximum(second - mean ** 2, 0.0).astype(np.float32)
    return out
