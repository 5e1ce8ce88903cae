"""Static pruning's settings (:mod:`coordinator.strategies.static_prune`; docs/methods/static-prune.md).
Its devices run FedAvg's device part."""

from __future__ import annotations

from dataclasses import dataclass

from edge_sdk.methods.settings.options import boolean, choice, number, option
from edge_sdk.methods.settings.pruning import MAX_RATIO, PruningSettings
from edge_sdk.methods.settings.shared import (ProxSettings, RobustConfig, ServerOptConfig, prox_group, robust_group,
                                              server_group)

__all__ = ["StaticPruneSettings"]


@dataclass(frozen=True)
class StaticPruneSettings(PruningSettings):
    """Static pruning (``--option key=value``): the pruning settings, the devices' training, aggregation."""

    #: fix the level instead of taking the weakest device's
    ratio: float | None = option(None, number(0.0, MAX_RATIO), "fix the pruning ratio; default: the weakest "
                                 "device's", doc="fix the pruning ratio instead", doc_default="the weakest device's")
    #: as REFT: heavily pruned random-init models stall under SGD
    local_optimizer: str = option("adam", choice("adam", "sgd"), "local optimizer of the pruned model",
                                  doc="local optimizer of the pruned model (pruned random-init models stall under "
                                      "SGD 0.05)")
    local_lr: float = option(0.003, number(1e-7, 10.0), "local learning rate")
    #: its devices run FedAvg's device part, which reads this
    static_bn: bool = option(True, boolean, "with BatchNorm: devices re-measure exact statistics after training",
                             device=True,
                             doc="with BatchNorm layers, each device replaces the running statistics by the exact "
                                 "ones of its data under its trained weights (FedAvg's device part)")
    robust: RobustConfig = robust_group()
    server: ServerOptConfig = server_group()
    prox: ProxSettings = prox_group()

    def own_lr(self) -> str:
        """The learning rate devices train with instead of the run's, said to the user."""
        return f"its own local_lr={self.local_lr:g} (--option local_lr=...)"
