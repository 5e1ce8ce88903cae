"""HeteroFL's settings (:mod:`coordinator.strategies.heterofl`, :mod:`edge_sdk.methods.heterofl`;
docs/methods/heterofl.md). ``static_bn`` travels in every plan; :class:`HeteroFLRound` is what a
plan asks of one device."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping

from edge_sdk.methods.settings.options import boolean, choice, group, option
from edge_sdk.methods.settings.shared import (ProxSettings, RobustConfig, ServerOptConfig, WidthSettings, prox_group,
                                              robust_group, server_group)

__all__ = ["HeteroFLSettings", "HeteroFLRound"]


@dataclass(frozen=True)
class HeteroFLSettings:
    """HeteroFL (``--option key=value``)."""

    width: WidthSettings = group(WidthSettings)
    scaler: bool = option(True, boolean, "scale the outputs of layers that narrow by 1/p during training",
                          doc="the training-time `1/p` scaler")
    static_bn: bool = option(True, boolean, "with BatchNorm: devices re-measure exact statistics after training",
                             device=True, doc="exact per-width BatchNorm statistics measured on the devices")
    #: "he": He-normal conv/linear weights and zero biases (torch's default otherwise)
    init: str = option("default", choice("default", "he"), "initial weights: torch's default or he (He-normal)",
                       doc="`he`: He-normal conv/linear weights, zero biases (torch's default init otherwise)")
    #: minirocket: a device trains its classifier for its own width and every smaller one
    nested: bool = option(False, boolean, "minirocket: each device trains its classifier for its width and every "
                          "smaller one (the features beyond a width zeroed: ordered dropout)",
                          doc="minirocket only: a device of width p trains the classifier of every width ≤ p on "
                              "its data (FjORD's ordered dropout over the features)")
    robust: RobustConfig = robust_group()
    server: ServerOptConfig = server_group()
    prox: ProxSettings = prox_group()


@dataclass(frozen=True)
class HeteroFLRound:
    """What a HeteroFL plan asks of one device besides training: the smaller widths whose BatchNorm
    statistics it also measures (label -> spec; prefix slices of its trained network), and those
    whose classifier it trains too (``nested``)."""

    #: None: none
    bn_specs: Mapping[str, Any] | None = option(None, device=True)
    #: ``nested``: the kernels of each smaller width's minirocket layer, which the device also trains
    #: the classifier for; None: none
    nested_kernels: tuple[int, ...] | None = option(None, device=True)
