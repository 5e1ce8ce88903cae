"""FedAvg's settings (:mod:`coordinator.strategies.fedavg`; docs/methods/fedavg.md)."""

from __future__ import annotations

from dataclasses import dataclass

from edge_sdk.methods.settings.options import boolean, choice, number, option
from edge_sdk.methods.settings.shared import (NORMS, ProxSettings, RobustConfig, ServerOptConfig, prox_group,
                                              robust_group, server_group)

__all__ = ["FedAvgSettings"]


@dataclass(frozen=True)
class FedAvgSettings:
    """FedAvg (``--option key=value``): one model, its width and norm layers, how updates are combined."""

    #: None: the family's full network (label ``global``)
    width: float | None = option(None, number(1e-3, 1.0), "train the model family at this width p in (0, 1] "
                                 "(label p); default: the full model (label global)",
                                 doc="train the zoo family at this width in (0, 1] (the baseline \"FedAvg at the "
                                     "smallest width\"; label: the width)",
                                 doc_default="– (the full network: label `global`)")
    #: None: the family's
    norm: str | None = option(None, choice(*NORMS), "norm layers; default: the model family's",
                              doc="`none`, `batchnorm`, `groupnorm`", doc_default="the family's")
    static_bn: bool = option(True, boolean, "with BatchNorm: devices re-measure exact statistics after training",
                             device=True,
                             doc="with BatchNorm layers, each device replaces the running statistics by the exact "
                                 "ones of its data under its trained weights (sBN, as HeteroFL and FLANC do)")
    robust: RobustConfig = robust_group()
    server: ServerOptConfig = server_group()
    prox: ProxSettings = prox_group()
