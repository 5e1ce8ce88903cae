"""HeteroFL on the device: train the width-p sub-network, then measure BatchNorm statistics.

Training is FedAvg's (the ``scaler`` layers of the spec divide activations by ``p``
while training). Static BatchNorm (sBN, Diao et al. 2021): running statistics are not
learned with a momentum during training; after training, with the final weights, the
device computes the exact mean and variance of every BatchNorm input over its whole
data set (network in eval mode, so the scalers behave as at inference). Statistics
depend on the width (a channel's input differs between sub-networks), so the device
also measures them for every smaller width the plan lists (``plan.train``'s
``bn_specs``: label -> spec; the sub-network is the prefix slice of its trained one)
and uploads them as ``bn/<label>/<name>``. ``static_bn`` turns this on; both are read with
:class:`edge_sdk.methods.settings.heterofl.HeteroFLSettings` and ``HeteroFLRound``.
"""
from __future__ import annotations

import logging
import time
from dataclasses import replace

import numpy as np
import torch
from torch import nn

from edge_sdk.methods.base import DeviceContext, LocalData, plan_settings, planned_model, round_update
from edge_sdk.methods.batchnorm import BN_PREFIX, STAT_SUFFIXES, static_bn_stats
from edge_sdk.methods.settings.heterofl import HeteroFLRound, HeteroFLSettings
from edge_sdk.models.minirocket import MiniRocket
from edge_sdk.models.spec import build_model
from edge_sdk.protocol.messages import Plan, Update
from edge_sdk.tensors import load_numpy_state, state_to_numpy
from edge_sdk.train_config import TrainConfig
from edge_sdk.training import MAX_FIXED_FEATURES, TrainResult, fixed_features, fixed_prefix

__all__ = ["nested_masks", "train_heterofl"]

log = logging.getLogger(__name__)

def _sub_stats(model: nn.Module, specs: object, x: torch.Tensor, batch_size: int) -> dict[str, np.ndarray]:
    """BatchNorm statistics of each smaller-width prefix slice of ``model`` on ``x``."""
    if not isinstance(specs, dict) or len(specs) > 16:
        raise ValueError("heterofl: bn_specs must be a map of at most 16 width labels to specs")
    state = state_to_numpy(model)
    out: dict[str, np.ndarray] = {}
    for label, spec in specs.items():
        sub = build_model(spec)
        shapes = {k: v.shape for k, v in state_to_numpy(sub).items()}
        if set(shapes) != set(state) or any(
                len(s) != state[k].ndim or any(a > b for a, b in zip(s, state[k].shape, strict=True))
                for k, s in shapes.items()):
            raise ValueError(f"heterofl: bn_specs[{label!r}] is not a prefix slice of the trained network")
        load_numpy_state(sub, {k: state[k][tuple(slice(0, n) for n in s)] for k, s in shapes.items()})
        static_bn_stats(sub, x, batch_size)
        out.update({f"{BN_PREFIX}{label}/{k}": v for k, v in state_to_numpy(sub, copy=True).items()
                    if k.endswith(STAT_SUFFIXES)})
    return out


def nested_masks(layer: MiniRocket, kernels: object, width: int) -> torch.Tensor:
    """``(1 + len(kernels), width)`` 0/1: every feature, then each smaller width's (the features of
    its first ``k`` kernels, and the series' log scales a ``series_norm`` layer appends after them)."""
    plan = layer.plan
    if not (isinstance(kernels, (list, tuple)) and len(kernels) <= 16
            and all(type(k) is int and 1 <= k < plan.kernels for k in kernels)):
        raise ValueError(f"heterofl: nested_kernels must be at most 16 kernel counts under {plan.kernels}, "
                         f"got {kernels!r}")
    masks = torch.ones(1 + len(kernels), width)
    for row, k in enumerate(kernels, start=1):
        masks[row, k * plan.per_kernel:plan.features] = 0
    return masks


def _train_nested(model: nn.Module, data: LocalData, ctx: DeviceContext, config: TrainConfig,
                  kernels: object) -> TrainResult:
    """``nested``: the classifier of a minirocket model trained for its width and every smaller one
    at once — each sample once per width, the features beyond that width zeroed (a narrower model
    has no such columns: its logits are the wider classifier's over the kept features)."""
    split = fixed_prefix(model)
    if split is None or not isinstance(split[0][0], MiniRocket):
        raise ValueError("heterofl: nested needs a minirocket model")
    prefix, head = split
    features = fixed_features(prefix, torch.as_tensor(np.asarray(data.x, np.float32)), config.batch_size)
    masks = nested_masks(split[0][0], kernels, features.shape[1] if features is not None else 0)
    if features is None or features.numel() * len(masks) > MAX_FIXED_FEATURES:
        log.warning("heterofl: %d samples are too many to train every smaller width's classifier on at once "
                    "(over %s feature values); this round trains this width's alone", len(data),
                    f"{MAX_FIXED_FEATURES:,}")
        return ctx.train(model, data.x, data.y, config)
    stacked = (features.unsqueeze(0) * masks.unsqueeze(1)).reshape(-1, features.shape[1])
    result = ctx.train(head, stacked.numpy(), np.tile(np.asarray(data.y), len(masks)), config)
    # the device's time is counted as for one width (the transform, the costly part, ran once)
    return replace(result, samples=result.samples // len(masks))


def train_heterofl(plan: Plan, data: LocalData, ctx: DeviceContext) -> Update:
    """One local HeteroFL round on the sub-network the plan describes."""
    config, settings, asked = plan_settings(plan, HeteroFLSettings, HeteroFLRound)
    bn_specs = {} if asked.bn_specs is None else asked.bn_specs
    model = planned_model(plan)
    if asked.nested_kernels:
        result = _train_nested(model, data, ctx, config, asked.nested_kernels)
    else:
        result = ctx.train(model, data.x, data.y, config)
    tensors = state_to_numpy(model)
    start = time.perf_counter()
    if settings.static_bn:
        x = torch.tensor(data.x, dtype=torch.float32)
        static_bn_stats(model, x, config.batch_size)
        tensors.update(_sub_stats(model, bn_specs, x, config.batch_size))
    # static BN: one pass over the data for this width and one per smaller width (counted at this width)
    passes = 1 + len(bn_specs) if settings.static_bn else 0
    return round_update(plan, data, ctx, model, result, extra_seconds=time.perf_counter() - start,
                        forward=passes * len(data), tensors=tensors)
