"""FedProx on the device: FedAvg's local round with the proximal term μ/2·‖w − w_global‖².

The plan's training settings carry the weight as ``prox_mu`` (the coordinator puts FedProx's
``mu`` there: :class:`edge_sdk.methods.settings.fedprox.FedProxSettings`);
:func:`edge_sdk.training.train_local` adds the term over the trainable parameters against their
values as the plan delivered them (the global model). Any method's plan can ask for the same term
(``--option prox_mu=…``): this is FedAvg's device part under FedProx's name.
"""

from __future__ import annotations

from edge_sdk.methods.base import DeviceContext, LocalData
from edge_sdk.methods.fedavg import train_fedavg
from edge_sdk.protocol.messages import Plan, Update

__all__ = ["train_fedprox"]


def train_fedprox(plan: Plan, data: LocalData, ctx: DeviceContext) -> Update:
    """One FedProx local round: the plan's model trained with its ``prox_mu``, all weights back."""
    return train_fedavg(plan, data, ctx)
