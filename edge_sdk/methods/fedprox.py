"""FedProx on the device: FedAvg's local round with the proximal term μ/2·‖w − w_global‖².

The plan's ``train`` settings carry ``mu``; the term is taken over the trainable parameters
against their values as the plan delivered them (the global model).
"""

from __future__ import annotations

from typing import Callable

import torch

from edge_sdk.methods.base import DeviceContext, LocalData, plan_settings, planned_model, round_update
from edge_sdk.protocol.messages import Plan, Update

__all__ = ["train_fedprox", "proximal_term"]


def proximal_term(model: torch.nn.Module, mu: float) -> Callable[[torch.nn.Module], torch.Tensor]:
    """``μ/2·‖w − w₀‖²`` as a training regularizer, ``w₀`` the trainable parameters' values now
    (moved to the model's device on first use)."""
    anchor = [p.detach().clone() for p in model.parameters() if p.requires_grad]

    def term(m: torch.nn.Module) -> torch.Tensor:
        params = [p for p in m.parameters() if p.requires_grad]
        if anchor and anchor[0].device != params[0].device:
            anchor[:] = [a.to(params[0].device) for a in anchor]
        return 0.5 * mu * sum((p - a).pow(2).sum() for p, a in zip(params, anchor))

    return term


def train_fedprox(plan: Plan, data: LocalData, ctx: DeviceContext) -> Update:
    """One FedProx local round: the plan's model trained with the proximal term, all weights back."""
    config, own = plan_settings(plan, mu=0.0)
    if own["mu"] < 0:
        raise ValueError(f"fedprox: mu must be >= 0, got {own['mu']!r}")
    model = planned_model(plan)
    regularizer = proximal_term(model, own["mu"]) if own["mu"] > 0 else None
    return round_update(plan, data, ctx, model, ctx.train(model, data.x, data.y, config, regularizer=regularizer))
