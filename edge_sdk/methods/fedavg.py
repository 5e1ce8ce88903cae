"""FedAvg on the device: load the global weights, train locally, upload all weights.

With BatchNorm layers and ``static_bn`` (a device setting of FedAvg, FedProx and static pruning,
whose devices run this part; true by default), the running statistics are then replaced by the exact ones of
the device's data under its trained weights (:func:`edge_sdk.methods.batchnorm.static_bn_stats`,
one more forward pass): a few local steps a round move the momentum averages only part of the way
to the weights' statistics, and the averaged model evaluated with them jumped by 10-20 points from
round to round (cnn1d on PLAID).
"""

from __future__ import annotations

import torch

from edge_sdk.methods.base import DeviceContext, LocalData, plan_settings, reused_model, round_update
from edge_sdk.methods.batchnorm import static_bn_stats
from edge_sdk.methods.settings.fedavg import FedAvgSettings
from edge_sdk.protocol.messages import Plan, Update
from edge_sdk.tensors import state_to_numpy

__all__ = ["train_fedavg"]


def train_fedavg(plan: Plan, data: LocalData, ctx: DeviceContext) -> Update:
    """One FedAvg local round (also serves any method whose update is the full model)."""
    config, settings = plan_settings(plan, FedAvgSettings)
    model = reused_model(plan)  # kept by this thread for its next round: the update is a copy
    result = ctx.train(model, data.x, data.y, config)
    measured = settings.static_bn and static_bn_stats(model, torch.tensor(data.x, dtype=torch.float32),
                                                      config.batch_size)
    return round_update(plan, data, ctx, model, result, forward=len(data) if measured else 0,
                        tensors=state_to_numpy(model, copy=True))
