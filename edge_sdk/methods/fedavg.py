"""FedAvg on the device: load the global weights, train locally, upload all weights."""

from __future__ import annotations

from edge_sdk.methods.base import DeviceContext, LocalData, compute_seconds
from edge_sdk.models.spec import build_model
from edge_sdk.protocol.messages import Plan, Update
from edge_sdk.tensors import load_numpy_state, state_to_numpy
from edge_sdk.training import TrainConfig

__all__ = ["train_fedavg"]


def train_fedavg(plan: Plan, data: LocalData, ctx: DeviceContext) -> Update:
    """One FedAvg local round (also serves any method whose update is the full model)."""
    model = build_model(plan.model_spec)
    load_numpy_state(model, plan.tensors)
    config = TrainConfig.from_dict(plan.train)
    result = ctx.train(model, data.x, data.y, config)
    compute_s = compute_seconds(ctx, plan.model_spec, result.seconds, trained=result.samples)
    return Update(
        label=plan.label,
        tensors=state_to_numpy(model),
        num_samples=len(data),
        metrics={"loss": result.loss, "train_seconds": result.seconds,
                 "compute_s": compute_s, "steps": float(result.steps)},
    )
