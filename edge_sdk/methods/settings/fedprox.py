"""FedProx's settings: FedAvg's and the weight μ of the proximal term (docs/methods/fedprox.md).

One road to the term: the coordinator puts ``max(mu, prox_mu)`` (``prox_mu``: the run's, or
``--option prox_mu``) into the run's ``TrainConfig.prox_mu``, which every plan carries; the device
trains as FedAvg's (:func:`edge_sdk.training.train_local` adds the term).
"""

from __future__ import annotations

from dataclasses import dataclass

from edge_sdk.methods.settings.fedavg import FedAvgSettings
from edge_sdk.methods.settings.options import number, option

__all__ = ["FedProxSettings"]


@dataclass(frozen=True)
class FedProxSettings(FedAvgSettings):
    """FedAvg's settings and the proximal weight."""

    mu: float = option(0.01, number(0.0, 1e4), "weight μ of the proximal term μ/2·‖w − w_global‖² (0: FedAvg)",
                       doc="weight μ of the proximal term μ/2·‖w − w_global‖² (0: exactly FedAvg's local "
                           "training; with `prox_mu` too, the larger of the two)")

