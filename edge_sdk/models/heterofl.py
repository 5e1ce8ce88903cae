"""HeteroFL's networks (Diao et al., ICLR 2021): zoo models with a scaler after each scaled layer.

A width-``p`` HeteroFL network is the zoo network of width ``p`` (its tensors are
prefix slices of the full-width network's) with a ``scaler`` layer after every
``conv2d`` and every hidden ``linear`` that is narrower than at full width (not the
classifier, nor a layer such as ``flanc_cnn``'s head that keeps its width): in training mode it
divides its input by ``p`` so the sub-network's activations keep the full network's
scale; in eval mode it is the identity. Spec layer type ``scaler`` (key ``rate``).
"""
from __future__ import annotations

from typing import Any, Sequence

import torch
from torch import nn

from edge_sdk.models.layers import float_field, register_layer
from edge_sdk.models.spec import validate_spec
from edge_sdk.models.zoo import model_for_dataset

__all__ = ["Scaler", "heterofl_spec", "SCALED_TYPES"]

#: Layer types followed by a scaler.
SCALED_TYPES = ("conv2d", "linear")


class Scaler(nn.Module):
    """``x / rate`` while training, ``x`` in eval mode."""

    def __init__(self, rate: float) -> None:
        super().__init__()
        self.rate = float(rate)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x / self.rate if self.training else x

    def extra_repr(self) -> str:
        return f"rate={self.rate}"


register_layer("scaler", lambda a: Scaler(a["rate"]), None, lambda a, s: s, lambda a: 0,
               schema={"rate": float_field(1e-3, 1.0)})


def _with_scalers(layers: list[dict], full: list[dict], narrow: list[dict], rate: float,
                  top: bool) -> list[dict]:
    """``layers`` with a scaler after each conv/linear whose width scales (its output differs
    between the ``full`` and a ``narrow`` network of the family; a layer that keeps its width,
    such as ``flanc_cnn``'s head, needs no compensation), except the classifier. Every width
    gets the same structure, so tensor names match across widths."""
    out: list[dict] = []
    last = len(layers) - 1
    for i, (layer, ref, small) in enumerate(zip(layers, full, narrow, strict=True)):  # one structure
        layer = dict(layer)
        for key, value in layer.items():
            if isinstance(value, list) and all(isinstance(v, dict) for v in value):
                layer[key] = _with_scalers(value, ref[key], small[key], rate, top=False)
        out.append(layer)
        if layer["type"] in SCALED_TYPES and not (top and i == last) and small["out"] != ref["out"]:
            out.append({"type": "scaler", "rate": float(rate)})
    return out


def heterofl_spec(family: str, input_shape: Sequence[int], num_classes: int, width: float = 1.0,
                  scaler: bool = True, **zoo_kw: Any) -> dict:
    """The width-``width`` HeteroFL network of a zoo family (``zoo_kw``: e.g. ``norm=``).

    With ``scaler=False`` it is exactly the zoo network. The layer structure (and so every
    tensor name) is the same at every width.
    """
    base = model_for_dataset(family, input_shape, num_classes, width=width, **zoo_kw)
    if not scaler:
        return base
    full = model_for_dataset(family, input_shape, num_classes, width=1.0, **zoo_kw)["layers"]
    narrow = model_for_dataset(family, input_shape, num_classes, width=0.5, **zoo_kw)["layers"]
    meta = {**base.get("meta", {}), "heterofl_width": float(width)}
    return validate_spec({**base, "layers": _with_scalers(base["layers"], full, narrow, width, top=True),
                          "name": f"heterofl-{base.get('name', family)}-w{width:g}", "meta": meta})
