"""FedProx (Li et al., "Federated Optimization in Heterogeneous Networks", MLSys 2020).

FedAvg whose devices add the proximal term μ/2·‖w − w_global‖² to their local loss, which keeps
a device's model near the global one when its data is unlike the others' (non-IID). The server
side is FedAvg's with one more setting, ``mu``
(:class:`edge_sdk.methods.settings.fedprox.FedProxSettings`): it becomes the run's
``TrainConfig.prox_mu`` — the larger of ``mu`` and ``prox_mu``, the term any method may ask for —
which every plan carries; the device side (:mod:`edge_sdk.methods.fedprox`) trains as FedAvg's,
with that term. It is the smallest method here: docs/methods/adding-a-method.md walks through its
settings, this file and the device's.
"""

from __future__ import annotations

from typing import Any


from coordinator.core.federation import FederationConfig
from coordinator.strategies.base import StrategyContext
from coordinator.strategies.fedavg import FedAvg
from coordinator.strategies.proximal import with_prox_mu

__all__ = ["FedProx"]


class FedProx(FedAvg):
    """FedAvg with a proximal term in every device's local loss."""

    name = "fedprox"

    @classmethod
    def method_federation(cls, ctx: StrategyContext, settings: Any) -> FederationConfig:
        """The proximal weight every plan carries: ``mu``, or ``prox_mu`` when that is larger."""
        return with_prox_mu(ctx.federation, settings.prox, at_least=settings.mu)
