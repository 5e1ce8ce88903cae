"""The settings of buffered asynchronous aggregation that every layer names: the methods that
fold asynchronously, the defaults, and the staleness functions' names (the functions themselves:
`coordinator.aggregate.staleness`)."""

from __future__ import annotations

import math

__all__ = ["ASYNC_METHODS", "BUFFER_SIZE", "MAX_STALENESS", "STALENESS", "STALENESS_RULES", "check_async_method",
           "check_staleness"]

#: methods whose updates are restated and folded asynchronously (REFT distils once from every
#: device: it has no asynchronous form; the others are not restated yet)
ASYNC_METHODS = ("fedavg", "fedprox", "heterofl", "flanc", "fedpara")
#: updates a version folds by default (FedBuff's K = 10)
BUFFER_SIZE = 10
#: updates older than this many versions are refused by default (NVFlare's edge examples' cut-off)
MAX_STALENESS = 100
#: the staleness function by default (FedBuff's)
STALENESS = "sqrt"
#: the staleness functions' names (``poly`` takes its exponent: ``poly:0.5``)
STALENESS_RULES = ("sqrt", "poly:A", "constant")


def check_staleness(rule: object) -> str:
    """``rule`` if it names a staleness function, else a one-line ValueError."""
    if isinstance(rule, str):
        if rule in ("sqrt", "constant"):
            return rule
        name, _, exponent = rule.partition(":")
        if name == "poly":
            try:
                a = float(exponent)
            except ValueError:
                a = float("nan")
            if math.isfinite(a) and 0 <= a <= 10:
                return rule
    raise ValueError(f"staleness must be one of sqrt, constant or poly:A with 0 <= A <= 10, got {rule!r}")


def check_async_method(method: str) -> None:
    """A one-line ValueError unless ``method`` folds asynchronously (`ASYNC_METHODS`)."""
    if method not in ASYNC_METHODS:
        why = "distils once from every device's logits" if method == "reft" else "has no asynchronous form yet"
        raise ValueError(f"asynchronous aggregation is for {', '.join(ASYNC_METHODS)}: {method} {why}")
