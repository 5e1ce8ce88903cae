"""The pruning settings REFT and static pruning share: which level a device's measured FLOPS
affords (``P = max(0, 1 - F/F_lambda)``, rounded up to a level) and which pruner makes it
(:mod:`coordinator.strategies.pruning`)."""

from __future__ import annotations

import math
from dataclasses import dataclass

from edge_sdk.methods.settings.options import choice, number, option

__all__ = ["BACKENDS", "DEFAULT_LEVELS", "MAX_RATIO", "parse_levels", "option_levels", "PruningSettings"]

BACKENDS = ("nni", "torch-pruning")
DEFAULT_LEVELS: tuple[float, ...] = tuple(i / 10 for i in range(10))  # 0, 0.1, ..., 0.9
#: The largest ratio ever applied (``levels=exact`` rounds to 0.01 and caps here).
MAX_RATIO = 0.99


def parse_levels(text: str) -> tuple[float, ...] | None:
    """``"0,0.5,0.9"`` -> sorted unique levels in [0, 1); ``"exact"`` -> None (no rounding)."""
    text = text.strip()
    if text == "exact":
        return None
    try:
        levels = sorted({float(x) for x in text.split(",") if x.strip()})
    except ValueError:
        raise ValueError(f"levels must be comma-separated ratios or 'exact', got {text!r}") from None
    if not levels or not all(math.isfinite(v) and 0 <= v <= MAX_RATIO for v in levels):
        raise ValueError(f"levels must be ratios in [0, {MAX_RATIO}], got {text!r}")
    return tuple(levels)


def option_levels(key: str, text: str) -> tuple[float, ...] | None:
    """Pruning levels (``0,0.5,0.9`` or ``exact``), as :func:`parse_levels`."""
    try:
        return parse_levels(text)
    except ValueError as exc:
        raise ValueError(f"option {key}: {exc}") from None


@dataclass(frozen=True)
class PruningSettings:
    """Which level a device trains and which pruner makes it."""

    f_lambda: float = option(100.0, number(1e-6, 1e9), "GFLOPS at which a device trains the dense model "
                             "(pruning ratio P = 1 − F/F_λ)")
    #: None: exact ratios (to 0.01)
    levels: tuple[float, ...] | None = option(DEFAULT_LEVELS, option_levels, "pruning levels a ratio is rounded up "
                                              "to, or exact (to 0.01)", none="exact")
    backend: str = option("auto", choice("auto", *BACKENDS), "pruner: auto (nni where importable), "
                          + ", ".join(BACKENDS))
