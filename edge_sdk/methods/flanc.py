"""FLANC on the device: train the composed network of one width, upload basis and coefficients.

The plan carries the width's spec (composed layers, :mod:`edge_sdk.models.flanc`), the
shared bases and the width's own tensors. The device trains them all on its data with
cross-entropy plus ``orth_lambda · Σ_layers ‖V Vᵀ − I‖²_F`` and uploads exactly the tensors
it received. With ``static_bn`` BatchNorm statistics are re-measured exactly on the local data
after training (:func:`edge_sdk.methods.batchnorm.static_bn_stats`). Both come in ``plan.train``
and are read with FLANC's settings (:class:`edge_sdk.methods.settings.flanc.FlancSettings`), whose
defaults (0.01, true) are the coordinator's.
"""
from __future__ import annotations

import time

import torch

from edge_sdk.methods.base import DeviceContext, LocalData, plan_settings, planned_model, round_update
from edge_sdk.methods.batchnorm import static_bn_stats
from edge_sdk.methods.settings.flanc import FlancSettings
from edge_sdk.models.flanc import basis_names, orthogonality_penalty
from edge_sdk.protocol.messages import Plan, Update

__all__ = ["train_flanc"]


def train_flanc(plan: Plan, data: LocalData, ctx: DeviceContext) -> Update:
    """One local FLANC round on the width the plan names."""
    config, settings = plan_settings(plan, FlancSettings)
    lam = settings.orth_lambda
    model = planned_model(plan)
    if not basis_names(model):
        raise ValueError("flanc: the plan's model has no composed (flanc_*) layers")

    def regularizer(m: torch.nn.Module) -> torch.Tensor:
        return lam * orthogonality_penalty(m)

    result = ctx.train(model, data.x, data.y, config, regularizer=regularizer if lam > 0 else None)
    start = time.perf_counter()
    if settings.static_bn:
        static_bn_stats(model, torch.tensor(data.x, dtype=torch.float32), config.batch_size)
    bn_seconds = time.perf_counter() - start
    with torch.no_grad():
        orth = float(orthogonality_penalty(model))
    return round_update(plan, data, ctx, model, result, extra_seconds=bn_seconds,
                        forward=len(data) if settings.static_bn else 0, orth=orth)
