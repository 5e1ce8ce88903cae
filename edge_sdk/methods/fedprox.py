"""FedProx on the device: FedAvg's local round with the proximal term μ/2·‖w − w_global‖².

The plan's ``train`` settings carry ``mu``; :func:`edge_sdk.training.train_local` adds the term
over the trainable parameters against their values as the plan delivered them (the global model).
Any method's plan can ask for the same term with ``prox_mu`` (``--option prox_mu=…``).
"""

from __future__ import annotations

from dataclasses import replace

from edge_sdk.methods.base import DeviceContext, LocalData, plan_settings, planned_model, round_update
from edge_sdk.protocol.messages import Plan, Update

__all__ = ["train_fedprox"]


def train_fedprox(plan: Plan, data: LocalData, ctx: DeviceContext) -> Update:
    """One FedProx local round: the plan's model trained with the proximal term, all weights back."""
    config, own = plan_settings(plan, mu=0.0)
    if own["mu"] < 0:
        raise ValueError(f"fedprox: mu must be >= 0, got {own['mu']!r}")
    model = planned_model(plan)
    result = ctx.train(model, data.x, data.y, replace(config, prox_mu=max(config.prox_mu, own["mu"])))
    return round_update(plan, data, ctx, model, result)
