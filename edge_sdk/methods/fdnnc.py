"""FDNNC on the device: train the dense or the low-rank network, upload what was asked.

A big device gets the dense spec and uploads every tensor. A small device gets the
spec whose FC layers are ``lowrank_linear`` (``W = A Bᵀ``); under CEFO half upload
the plan asks it for only the ``A`` factors or only the ``B`` factors (plus every
non-factor tensor: biases, convs, the small classifier). What the plan asks of this device
is :class:`edge_sdk.methods.settings.fdnnc.FdnncRound` in ``plan.train``: ``upload`` = ``full`` |
``a`` | ``b`` and ``freeze`` (bool: keep the factor that is not uploaded fixed while training, so
the uploaded one is trained against the factor the server holds).
"""
from __future__ import annotations

from edge_sdk.methods.base import DeviceContext, LocalData, plan_settings, planned_model, round_update
from edge_sdk.methods.settings.fdnnc import FdnncRound
from edge_sdk.models.lowrank import factor_names
from edge_sdk.protocol.messages import Plan, Update
from edge_sdk.tensors import state_to_numpy

__all__ = ["train_fdnnc"]


def train_fdnnc(plan: Plan, data: LocalData, ctx: DeviceContext) -> Update:
    """One local FDNNC round on a dense (big) or low-rank (small) network."""
    config, asked = plan_settings(plan, FdnncRound)
    upload = asked.upload
    model = planned_model(plan)
    a_names, b_names = factor_names(model)
    if upload != "full" and not a_names:
        raise ValueError(f"fdnnc: upload={upload!r} needs a low-rank model, the plan's has no factors")
    dropped = set(b_names if upload == "a" else a_names if upload == "b" else [])
    if asked.freeze:
        for name, param in model.named_parameters():
            param.requires_grad_(name not in dropped)
    result = ctx.train(model, data.x, data.y, config)
    tensors = {k: v for k, v in state_to_numpy(model, copy=True).items() if k not in dropped}
    return round_update(plan, data, ctx, model, result, tensors=tensors)
