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
(β of FedAvgM), ``beta1``, ``beta2``, ``tau``.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Mapping

import numpy as np

from edge_sdk.methods.batchnorm import STAT_SUFFIXES

from coordinator.options import Option, Schema, choice, number

__all__ = ["OPTIMIZERS", "SERVER_OPT_OPTIONS", "SERVER_OPT_KEYS", "ServerOptConfig", "ServerOptimizer"]

log = logging.getLogger(__name__)

OPTIMIZERS = ("none", "fedavgm", "fedadam", "fedyogi")
#: η when ``server_lr`` is not given, for the adaptive ones: they move each weight by about η per
#: round, so η is a step size (the paper's grid: 10^-3…1). FedAvgM's default is 1 − β (see
#: :attr:`ServerOptConfig.step_size`).
DEFAULT_LR = {"fedadam": 0.01, "fedyogi": 0.01}

SERVER_OPT_OPTIONS = Schema(
    Option("server_opt", choice(*OPTIMIZERS), "none", "server optimizer on the aggregate: none, fedavgm, "
                                                      "fedadam, fedyogi (docs/server_optimizers.md)"),
    Option("server_lr", number(1e-9, 1e3), None, "server learning rate η; default: 1 − server_momentum for "
                                                 "fedavgm, 0.01 for fedadam and fedyogi"),
    Option("server_momentum", number(0.0, 0.999), "0.9", "fedavgm: momentum β"),
    Option("beta1", number(0.0, 0.999), "0.9", "fedadam, fedyogi: β₁ of the first moment"),
    Option("beta2", number(0.0, 0.9999), "0.99", "fedadam, fedyogi: β₂ of the second moment"),
    Option("tau", number(1e-12, 1.0), "0.001", "fedadam, fedyogi: τ, the adaptivity floor"),
)
SERVER_OPT_KEYS = SERVER_OPT_OPTIONS.keys
_USES = {"none": set(), "fedavgm": {"server_lr", "server_momentum"},
         "fedadam": {"server_lr", "beta1", "beta2", "tau"}, "fedyogi": {"server_lr", "beta1", "beta2", "tau"}}


@dataclass(frozen=True)
class ServerOptConfig:
    """Which server optimizer, and its hyper-parameters."""

    name: str = "none"
    lr: float | None = None  # None: the default of `step_size`
    momentum: float = 0.9
    beta1: float = 0.9
    beta2: float = 0.99
    tau: float = 1e-3

    @property
    def active(self) -> bool:
        """False for ``none`` (the aggregate is the new model)."""
        return self.name != "none"

    @property
    def step_size(self) -> float:
        """η: ``server_lr``, else FedAvgM's 1 − β — the step of plain FedAvg once the momentum has
        built up (the paper's η = 1 steps 1/(1 − β) = 10× as far, and diverged on Fashion-MNIST and
        FLANC here, BENCHMARKS.md) — or the adaptive optimizers' :data:`DEFAULT_LR`."""
        if self.lr is not None:
            return self.lr
        return 1.0 - self.momentum if self.name == "fedavgm" else DEFAULT_LR.get(self.name, 1.0)

    @classmethod
    def from_options(cls, options: Mapping[str, str], method: str) -> "ServerOptConfig":
        """The server-optimizer keys of ``options`` (others ignored); a hyper-parameter that the
        chosen optimizer does not use is logged as a warning."""
        parsed = SERVER_OPT_OPTIONS.parse(method, options, subset=True)
        name = parsed.pop("server_opt", "none")
        idle = sorted(set(parsed) - _USES[name])
        if idle:
            log.warning("%s: option(s) %s do nothing with server_opt=%s", method, idle, name)
        renamed = {"server_lr": "lr", "server_momentum": "momentum"}
        return cls(name=name, **{renamed.get(k, k): v for k, v in parsed.items()})


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
