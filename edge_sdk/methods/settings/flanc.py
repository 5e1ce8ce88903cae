"""FLANC's settings (:mod:`coordinator.strategies.flanc`, :mod:`edge_sdk.methods.flanc`;
docs/methods/flanc.md). ``orth_lambda`` and ``static_bn`` travel in every plan."""

from __future__ import annotations

from dataclasses import dataclass

from edge_sdk.methods.settings.options import boolean, choice, group, number, option
from edge_sdk.model_names import COEFF_INITS
from edge_sdk.methods.settings.shared import (ProxSettings, RobustConfig, ServerOptConfig, WidthSettings, prox_group,
                                              robust_group, server_group)

__all__ = ["FlancSettings"]

# How coefficients start (COEFF_INITS): ``he`` (edgefl's, He-normal) or ``torch`` (PyTorch's default for
# the 1×1 conv, ``kaiming_uniform_(a=√5)``: U(±1/√(G·R2)), √6× smaller; the official code's)
# (:func:`edge_sdk.models.flanc.init_coefficients`).


def _precompose(key: str, text: str) -> bool | None:
    return None if text == "auto" else boolean(key, text)


@dataclass(frozen=True)
class FlancSettings:
    """FLANC (``--option key=value``); the width settings are shared with HeteroFL and FedPara."""

    width: WidthSettings = group(WidthSettings)
    basis_fraction: float = option(0.125, number(1e-3, 4.0), "a basis filter's share of the full width's input "
                                   "channels", doc="`R1 ≈ basis_fraction × in_full`")
    basis_count: float = option(0.25, number(1e-3, 4.0), "basis filters per layer, as a share of its full-width "
                                "outputs", doc="`R2 = basis_count × out_full`")
    #: λ of λ·Σ‖V Vᵀ − I‖²_F on the device
    orth_lambda: float = option(0.01, number(0.0, 1e4), "λ of the device's orthogonality penalty λ·Σ‖V Vᵀ − I‖²",
                                device=True)
    #: None: the cheaper forward per batch
    precompose: bool | None = option(None, _precompose, "compose weights before the forward pass: true, false, "
                                     "auto (cheaper)", none="auto",
                                     doc="`true`: always one dense conv; `false`: always two-stage; `auto`: the "
                                         "cheaper")
    #: with BatchNorm: devices re-measure exact statistics after training (and the server pools them)
    static_bn: bool = option(True, boolean, "with BatchNorm: devices re-measure exact statistics after training",
                             device=True)
    coeff_init: str = option("he", choice(*COEFF_INITS), "initial coefficients: he, or torch (PyTorch's default "
                             "for a 1x1 conv, as the paper's code: sqrt(6)x smaller)",
                             doc="initial coefficients: `he` (He-normal, so the composed kernels have He's scale), "
                                 "or `torch` (PyTorch's default for a 1×1 conv, √6× smaller — the official code's)")
    robust: RobustConfig = robust_group()
    server: ServerOptConfig = server_group()
    prox: ProxSettings = prox_group()
