"""Server-side optimizers (Reddi et al., "Adaptive Federated Optimization", ICLR 2021).

A round's aggregate (after the robust rule, :mod:`coordinator.aggregate.robust`) is not taken as the new
global model: the difference ``Δ = aggregate − current`` is treated as a pseudo-gradient and
applied with server momentum (FedAvgM, Hsu et al. 2019) or with Adam / Yogi (FedAdam, FedYogi):

- ``fedavgm``: ``m ← β·m + Δ``; ``w ← w + η·m`` (default η = 1 − β)
- ``fedadam``: ``m ← β₁·m + (1−β₁)·Δ``; ``v ← β₂·v + (1−β₂)·Δ²``; ``w ← w + η·m / (√v + τ)``
- ``fedyogi``: as FedAdam with ``v ← v − (1−β₂)·Δ²·sign(v − Δ²)``

``v`` starts at ``τ²`` as in the paper. Only float weights are optimised: BatchNorm running
statistics and integer counters take the aggregate as it is. State is kept per named tensor of
a *group* (FLANC's basis and each width's coefficients are separate groups) and checkpointed.
Options: ``server_opt`` (none | fedavgm | fedadam | fedyogi), ``server_lr`` (η), ``server_momentum``
(β of FedAvgM), ``beta1``, ``beta2``, ``tau``: :class:`edge_sdk.methods.settings.shared.ServerOptConfig`,
a group of every weight-averaging method's settings, next to (not inside) the robust rule's.
"""

from __future__ import annotations

from typing import Mapping

import numpy as np

from edge_sdk.methods.batchnorm import STAT_SUFFIXES
from edge_sdk.methods.settings.shared import ServerOptConfig

__all__ = ["ServerOptimizer"]


class ServerOptimizer:
    """Applies aggregates as pseudo-gradients; holds the moments of every tensor it has stepped
    (a strategy has one, whichever optimizer its options name)."""

    def __init__(self) -> None:
        self.m: dict[str, np.ndarray] = {}
        self.v: dict[str, np.ndarray] = {}

    def step(self, c: ServerOptConfig, group: str, current: Mapping[str, np.ndarray],
             aggregate: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        """The new tensors of ``group``: ``aggregate`` with every float weight moved from
        ``current`` by optimizer ``c`` instead (``none``: the aggregate as it is)."""
        out = dict(aggregate)
        if not c.active:
            return out
        for name, target in aggregate.items():
            old = np.asarray(current[name])
            if old.dtype.kind != "f" or name.endswith(STAT_SUFFIXES):
                continue
            key = f"{group}/{name}"
            delta = np.asarray(target, dtype=np.float64) - old
            m = self.m.get(key)
            if m is None or m.shape != delta.shape:  # new, or the group's shapes changed: start afresh
                m, self.v[key] = np.zeros_like(delta), np.full_like(delta, c.tau ** 2)
            if c.name == "fedavgm":
                self.m[key] = m = c.momentum * m + delta
                new = old + c.step_size * m
            else:
                v = self.v[key]
                self.m[key] = m = c.beta1 * m + (1 - c.beta1) * delta
                sq = delta * delta
                if c.name == "fedadam":
                    v = c.beta2 * v + (1 - c.beta2) * sq
                else:  # fedyogi
                    v = v - (1 - c.beta2) * sq * np.sign(v - sq)
                self.v[key] = v
                new = old + c.step_size * m / (np.sqrt(v) + c.tau)
            out[name] = new.astype(old.dtype)
        return out

    def state_tensors(self) -> dict[str, np.ndarray]:
        """The moments, as ``m/<group>/<name>`` and ``v/<group>/<name>``."""
        return {**{f"m/{k}": v for k, v in self.m.items()}, **{f"v/{k}": v for k, v in self.v.items()}}

    def load_state_tensors(self, tensors: Mapping[str, np.ndarray]) -> None:
        """Restore what :meth:`state_tensors` returned (other keys are an error)."""
        m, v = {}, {}
        for key, value in tensors.items():
            kind, _, name = key.partition("/")
            if kind not in ("m", "v") or not name:
                raise ValueError(f"server optimizer state: unexpected tensor {key!r}")
            (m if kind == "m" else v)[name] = np.asarray(value, dtype=np.float64)
        self.m, self.v = m, v
