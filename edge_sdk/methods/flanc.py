"""FLANC on the device: train the composed network of one width, upload basis and coefficients.

The plan carries the width's spec (composed layers, :mod:`edge_sdk.models.flanc`), the
shared bases and the width's own tensors. The device trains them all on its data with
cross-entropy plus ``orth_lambda · Σ_layers ‖V Vᵀ − I‖²_F`` (``plan.train``'s
``orth_lambda``, default 0) and uploads exactly the tensors it received. With
``static_bn`` (default false) BatchNorm statistics are re-measured exactly on the local
data after training (:func:`edge_sdk.methods.heterofl.static_bn_stats`).
"""
from __future__ import annotations

import math
import time

import torch

from edge_sdk.methods.base import DeviceContext, LocalData, compute_seconds
from edge_sdk.methods.batchnorm import static_bn_stats
from edge_sdk.models.flanc import basis_names, orthogonality_penalty
from edge_sdk.models.spec import build_model
from edge_sdk.protocol.messages import Plan, Update
from edge_sdk.tensors import load_numpy_state, state_to_numpy
from edge_sdk.training import TrainConfig

__all__ = ["train_flanc"]


def train_flanc(plan: Plan, data: LocalData, ctx: DeviceContext) -> Update:
    """One local FLANC round on the width the plan names."""
    train = dict(plan.train)
    lam = train.pop("orth_lambda", 0.0)
    static_bn = train.pop("static_bn", False)
    if type(static_bn) is not bool:
        raise ValueError(f"flanc: static_bn must be a bool, got {type(static_bn).__name__}")
    if type(lam) not in (int, float) or not math.isfinite(lam) or lam < 0:
        raise ValueError(f"flanc: orth_lambda must be a finite number >= 0, got {lam!r}")
    config = TrainConfig.from_dict(train)
    model = build_model(plan.model_spec)
    if not basis_names(model):
        raise ValueError("flanc: the plan's model has no composed (flanc_*) layers")
    load_numpy_state(model, plan.tensors)

    def regularizer(m: torch.nn.Module) -> torch.Tensor:
        return lam * orthogonality_penalty(m)

    result = ctx.train(model, data.x, data.y, config, regularizer=regularizer if lam > 0 else None)
    seconds = result.seconds
    if static_bn:
        start = time.perf_counter()
        static_bn_stats(model, torch.tensor(data.x, dtype=torch.float32), config.batch_size)
        seconds += time.perf_counter() - start
    compute_s = compute_seconds(ctx, plan.model_spec, seconds, trained=result.samples,
                                forward=len(data) if static_bn else 0)
    with torch.no_grad():
        orth = float(orthogonality_penalty(model))
    return Update(
        label=plan.label, tensors=state_to_numpy(model), num_samples=len(data),
        metrics={"loss": result.loss, "orth": orth, "train_seconds": seconds,
                 "compute_s": compute_s, "steps": float(result.steps)},
    )
