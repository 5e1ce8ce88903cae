"""The server optimizer of a FedPara linear layer stepped on the weight its factors compose.

FedPara (Hyeon-Woo et al., ICLR 2022) averages the factors ``X1, Y1, X2, Y2`` of ``W = (X1 Y1ᵀ) ⊙
(X2 Y2ᵀ)``; a server optimizer on top (FedAvgM's momentum, FedAdam) then extrapolates the factors —
and an extrapolation of four factors moves their product far from the same extrapolation of the
product. On MiniRocket's folded head that cost FedPara 2.5 points with one device under FedAvgM,
where the dense head gains from it (`bench/results/minirocket_fedpara.md`, stop 74). Here the rule
(mean, median, …) still acts on the factors, but the optimizer steps the product: with ``P(f)`` the
product of factors ``f``, the step of ``P(current) → P(aggregate)`` gives a target ``T``, and the
factors are refitted to it, from the aggregate's, by Adam on ``‖P(f) − T‖²`` (`REFIT_STEPS` steps,
a learning rate of `REFIT_LR_SCALE` times the factors' RMS). The optimizer's state is the product's
(its moments live in the server optimizer's state, checkpointed with it). The factors can reach only
a part of the products (``2R(m + n)`` of ``m n`` dimensions), so ``T`` is met up to its projection;
each round's ``refit_error`` is the distance left, relative to the step.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np
import torch

from edge_sdk.methods.settings.shared import ServerOptConfig

from coordinator.aggregate.server_opt import ServerOptimizer

__all__ = ["ComposedLayer", "REFIT_STEPS", "REFIT_LR_SCALE", "composed_step"]

#: Adam steps of a refit, and its learning rate relative to the factors' RMS (the measured setting:
#: 500 steps at 0.001 for factors of RMS ≈ 0.14, MiniRocket's head on PLAID)
REFIT_STEPS = 500
REFIT_LR_SCALE = 0.007
_FACTORS = ("x1", "y1", "x2", "y2")


@dataclass(frozen=True)
class ComposedLayer:
    """A FedPara linear layer whose factors are ``{prefix}x1`` … ``{prefix}y2``."""

    prefix: str
    tanh: bool = False

    def names(self) -> list[str]:
        return [self.prefix + f for f in _FACTORS]

    def product(self, factors: Mapping[str, torch.Tensor]) -> torch.Tensor:
        """``(X1 Y1ᵀ) ⊙ (X2 Y2ᵀ)`` (``tanh`` of each term first when the layer has it)."""
        p = self.prefix
        w1, w2 = factors[p + "x1"] @ factors[p + "y1"].t(), factors[p + "x2"] @ factors[p + "y2"].t()
        return torch.tanh(w1) * torch.tanh(w2) if self.tanh else w1 * w2


def _tensors(source: Mapping[str, np.ndarray], layer: ComposedLayer, grad: bool = False) -> dict[str, torch.Tensor]:
    return {n: torch.tensor(np.asarray(source[n], dtype=np.float32), requires_grad=grad) for n in layer.names()}


def _refit(start: Mapping[str, np.ndarray], target: torch.Tensor, layer: ComposedLayer
           ) -> tuple[dict[str, torch.Tensor], float]:
    """The factors from ``start`` refitted to ``target``, and their product's distance to it; ``start``'s
    own when the fit ends no nearer (e.g. factors all zero, where every gradient is zero)."""
    with torch.enable_grad():  # whatever the caller's mode
        factors = _tensors(start, layer, grad=True)
        rms = float(torch.cat([f.detach().flatten() for f in factors.values()]).pow(2).mean().sqrt())
        optimizer = torch.optim.Adam(factors.values(), lr=REFIT_LR_SCALE * max(rms, 1e-3))
        for _ in range(REFIT_STEPS):
            optimizer.zero_grad()
            loss = (layer.product(factors) - target).pow(2).sum()
            loss.backward()
            optimizer.step()
    fitted, initial = {n: f.detach() for n, f in factors.items()}, _tensors(start, layer)
    with torch.no_grad():
        fitted_gap = float((layer.product(fitted) - target).norm())
        initial_gap = float((layer.product(initial) - target).norm())
    if not np.isfinite(fitted_gap) or fitted_gap > initial_gap:
        return initial, initial_gap
    return fitted, fitted_gap


def composed_step(server_opt: ServerOptimizer, config: ServerOptConfig, group: str, layers: Sequence[ComposedLayer],
                  current: Mapping[str, np.ndarray], aggregate: Mapping[str, np.ndarray]
                  ) -> tuple[dict[str, np.ndarray], dict[str, float]]:
    """``aggregate`` stepped by ``config``'s optimizer from ``current``: the ``layers``' factors through
    their product (module doc), every other tensor as `ServerOptimizer.step` steps it; and the mean
    ``refit_error`` (the distance left to the product's target over the step's length)."""
    composed = {n for layer in layers for n in layer.names()}
    new = server_opt.step(config, group, {k: v for k, v in current.items() if k not in composed},
                          {k: v for k, v in aggregate.items() if k not in composed})
    errors = []
    with torch.no_grad():
        products = [(layer, layer.product(_tensors(current, layer)), layer.product(_tensors(aggregate, layer)))
                    for layer in layers]
    for layer, before, after in products:
        key = f"{layer.prefix}product"
        target = server_opt.step(config, f"{group}:composed", {key: before.numpy()}, {key: after.numpy()})[key]
        target_t = torch.from_numpy(np.asarray(target, dtype=np.float32))
        fitted, gap = _refit(aggregate, target_t, layer)
        step = float((target_t - before).norm())
        errors.append(gap / step if step > 0 else 0.0)
        for name, tensor in fitted.items():
            new[name] = tensor.numpy().astype(np.asarray(aggregate[name]).dtype)
    return new, ({"refit_error": float(np.mean(errors))} if errors else {})
