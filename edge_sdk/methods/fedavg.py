"""FedAvg on the device: load the global weights, train locally, upload all weights."""

from __future__ import annotations

from edge_sdk.methods.base import DeviceContext, LocalData, plan_settings, planned_model, round_update
from edge_sdk.protocol.messages import Plan, Update

__all__ = ["train_fedavg"]


def train_fedavg(plan: Plan, data: LocalData, ctx: DeviceContext) -> Update:
    """One FedAvg local round (also serves any method whose update is the full model)."""
    config = plan_settings(plan)[0]
    model = planned_model(plan)
    return round_update(plan, data, ctx, model, ctx.train(model, data.x, data.y, config))
