"""Stale updates in buffered asynchronous aggregation (FedBuff, Nguyen et al., AISTATS 2022).

A device trained on model version ``v``; by the time its update is folded the model is at
``v + s`` (``s``: its *staleness*). Its change ``Δ = update − what it was sent`` is weighted by a
staleness function and applied to what it would be sent now::

    restated = sent_now + weight(s) · (update − sent_then)

so every method's own aggregate — FedAvg's weighted mean, FLANC's basis and coefficients,
HeteroFL's leading blocks, the robust screen and the server optimizer — takes a buffer of
restated updates as it takes a round's updates. Staleness functions (``staleness``):

- ``sqrt`` (default, FedBuff's): ``1 / √(1 + s)``
- ``poly:A``: ``(1 + s) ** -A`` (FedAsync's polynomial form; ``poly:0.5`` is ``sqrt``)
- ``constant``: 1 (no discount; ``max_staleness`` still refuses the stalest)
"""

from __future__ import annotations

from typing import Mapping

import numpy as np

__all__ = ["restate_update", "staleness_weight"]


def staleness_weight(rule: str, staleness: int) -> float:
    """The weight of an update ``staleness`` versions old under ``rule``."""
    if staleness < 0:
        raise ValueError(f"staleness must be >= 0, got {staleness}")
    if rule == "constant":
        return 1.0
    exponent = 0.5 if rule == "sqrt" else float(rule.partition(":")[2])
    return float((1.0 + staleness) ** -exponent)


def restate_update(sent_now: Mapping[str, np.ndarray], sent_then: Mapping[str, np.ndarray],
                   update: Mapping[str, np.ndarray], weight: float) -> dict[str, np.ndarray]:
    """The update of a device sent ``sent_then``, as if it had been sent ``sent_now``, its change
    weighted by ``weight``. Integer tensors (counters) are taken as sent. A tensor the device was
    not sent, or of another shape than it was sent, is a ValueError (the update cannot be restated)."""
    out: dict[str, np.ndarray] = {}
    for name, value in update.items():
        then, now = sent_then.get(name), sent_now.get(name)
        if then is None or now is None or np.shape(then) != np.shape(value) or np.shape(now) != np.shape(value):
            raise ValueError(f"tensor {name!r} of the update does not match what the device was sent")
        value = np.asarray(value)
        if value.dtype.kind != "f":
            out[name] = value
            continue
        delta = value.astype(np.float64) - np.asarray(then, dtype=np.float64)
        out[name] = (np.asarray(now, dtype=np.float64) + weight * delta).astype(value.dtype)
    return out
