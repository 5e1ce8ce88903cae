"""Step decay of the local learning rate over rounds (``--lr-decay 100:0.1``).

A schedule is a tuple of ``(round, factor)`` milestones: after ``round`` rounds the lr
of every plan is multiplied by ``factor`` (milestones compound), as the official FLANC
code's ``--decay step-100`` with ``--gamma 0.1`` (a PyTorch ``MultiStepLR`` stepped once
per round).
"""

from __future__ import annotations

import math
from typing import Sequence

__all__ = ["LrDecay", "parse_lr_decay", "check_lr_decay", "lr_factor"]

#: ``((round, factor), ...)``, rounds strictly increasing.
LrDecay = tuple[tuple[int, float], ...]


def check_lr_decay(decay: Sequence[Sequence[float]]) -> LrDecay:
    """The validated schedule as a tuple; ValueError says what is wrong."""
    out: list[tuple[int, float]] = []
    for item in decay:
        if len(item) != 2:
            raise ValueError(f"lr_decay: each milestone is (round, factor), got {item!r}")
        rnd, factor = item
        if isinstance(rnd, bool) or not isinstance(rnd, int) or rnd < 1:
            raise ValueError(f"lr_decay: a milestone's round must be an integer >= 1, got {rnd!r}")
        if isinstance(factor, bool) or not isinstance(factor, (int, float)) or not math.isfinite(factor) \
                or not 0 < factor <= 10:
            raise ValueError(f"lr_decay: a milestone's factor must be a number in (0, 10], got {factor!r}")
        if out and rnd <= out[-1][0]:
            raise ValueError(f"lr_decay: milestone rounds must increase, got {rnd} after {out[-1][0]}")
        out.append((rnd, float(factor)))
    return tuple(out)


def parse_lr_decay(text: str) -> LrDecay:
    """``"100:0.1"`` or ``"100:0.1,150:0.1"`` (empty: no decay) as a checked schedule."""
    items = []
    for part in (p.strip() for p in str(text).split(",")):
        if not part:
            continue
        rnd, sep, factor = part.partition(":")
        try:
            items.append((int(rnd), float(factor)))
        except ValueError:
            raise ValueError(f"lr_decay: expected ROUND:FACTOR (e.g. 100:0.1), got {part!r}") from None
        if not sep:
            raise ValueError(f"lr_decay: expected ROUND:FACTOR (e.g. 100:0.1), got {part!r}")
    return check_lr_decay(items)


def lr_factor(decay: LrDecay, rnd: int) -> float:
    """The lr multiplier of round ``rnd`` (0-based): the product of the milestones passed."""
    return math.prod(factor for at, factor in decay if rnd >= at)
