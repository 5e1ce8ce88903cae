"""FLANC model families: the zoo's networks with their hidden layers composed (see :mod:`.flanc`).

:func:`flanc_specs` builds one spec per width ``p`` of a zoo family (``cnn4`` — the
4-layer CNN for 28×28 inputs —, ``flanc_cnn`` — the paper's own Fashion-MNIST CNN —,
``resnet_small`` for 32×32 inputs, or
``mlp``) and replaces, at the same positions in every width:

- each ``conv2d`` (``conv1d``: ``cnn1d`` on sensor series) with a kernel > 1 whose input or
  output channels scale with the width by a ``flanc_conv2d`` (``flanc_conv1d``) — except the
  stem, the network's first conv, which reads the image
  and stays a dense, width-specific conv (and so do 1×1 shortcut projections, as in the
  paper's code); in ``flanc_cnn`` the stem keeps 64 channels at every width and the first
  composed conv reads those 64 (basis over groups of 8), as the official ``cnn_flanc.py``;
- each ``linear`` whose output scales with the width (hidden layers; the classifier
  stays dense) by a ``flanc_linear``.

Basis sizes come from the *full-width* (p = 1) layer: ``R2 = round(basis_count ×
out_full)`` basis filters of ``R1 ≈ basis_fraction × in_full`` input channels, ``R1``
being the largest divisor of every width's input channel count not above that target
(so every width splits its input into whole groups). Defaults are those of the paper's
code: ``basis_fraction = 1/8``, ``basis_count = 1/4``.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from functools import reduce
from typing import Any, Sequence

from edge_sdk.model_names import width_label
from edge_sdk.models import flanc as _flanc  # noqa: F401  (registers the flanc layer types)
from edge_sdk.models.spec import validate_spec
from edge_sdk.models.zoo import model_for_dataset

__all__ = ["FlancConfig", "flanc_specs", "width_label", "basis_in_for"]


@dataclass(frozen=True)
class FlancConfig:
    """Widths and basis sizes of a FLANC model family."""

    widths: tuple[float, ...] = (0.25, 0.5, 0.75, 1.0)
    basis_fraction: float = 0.125  # R1 ≈ basis_fraction × full-width input channels
    basis_count: float = 0.25  # R2 = basis_count × full-width output channels
    precompose: bool | None = None  # None: per batch, the cheaper forward

    def __post_init__(self) -> None:
        w = self.widths
        if not isinstance(w, tuple) or not w or len(w) > 16 or not all(
                type(p) in (int, float) and math.isfinite(p) and 0 < p <= 1 for p in w):
            raise ValueError(f"widths must be 1-16 numbers in (0, 1], got {w!r}")
        if list(w) != sorted(set(w)):
            raise ValueError(f"widths must be strictly increasing, got {w!r}")
        for name in ("basis_fraction", "basis_count"):
            v = getattr(self, name)
            if type(v) not in (int, float) or not math.isfinite(v) or not 0 < v <= 4:
                raise ValueError(f"{name} must be a number in (0, 4], got {v!r}")
        if self.precompose not in (None, True, False):
            raise ValueError(f"precompose must be None, True or False, got {self.precompose!r}")


def basis_in_for(in_full: int, inputs: Sequence[int], fraction: float) -> int:
    """``R1``: the largest divisor of every entry of ``inputs`` not above ``fraction × in_full``."""
    target = max(1, round(in_full * fraction))
    common = reduce(math.gcd, inputs)
    return max(d for d in range(1, min(target, common) + 1) if common % d == 0)


def _composed(kind: str, full: dict, per_width: dict[float, dict], config: FlancConfig) -> dict[float, dict]:
    r1 = basis_in_for(full["in"], [layer["in"] for layer in per_width.values()], config.basis_fraction)
    r2 = max(1, round(full["out"] * config.basis_count))
    out = {}
    for p, layer in per_width.items():
        new = {"type": f"flanc_{kind}", "in": layer["in"], "out": layer["out"], "basis_in": r1,
               "basis_out": r2, "bias": layer.get("bias", True), "precompose": config.precompose}
        if kind in ("conv1d", "conv2d"):
            new.update(kernel=layer["kernel"], stride=layer.get("stride", 1), padding=layer.get("padding", 0))
        out[p] = new
    return out


def _compose_lists(full: list[dict], per_width: dict[float, list[dict]], config: FlancConfig,
                   top: bool = True) -> dict[float, list]:
    result: dict[float, list] = {p: [] for p in per_width}
    stem = next((i for i, layer in enumerate(full) if layer["type"] in ("conv1d", "conv2d")), None) if top else None
    for i, ref in enumerate(full):
        at = {p: layers[i] for p, layers in per_width.items()}
        kind = ref["type"]
        scaled_in = len({layer.get("in") for layer in at.values()} | {ref.get("in")}) > 1
        scaled_out = len({layer.get("out") for layer in at.values()} | {ref.get("out")}) > 1
        if kind in ("conv1d", "conv2d") and ref["kernel"] > 1 and ref.get("groups", 1) == 1 \
                and (scaled_in or (scaled_out and i != stem)):
            new = _composed(kind, ref, at, config)
        elif kind == "linear" and scaled_out:
            new = _composed("linear", ref, at, config)
        else:
            new = {p: dict(layer) for p, layer in at.items()}
            for key, value in ref.items():
                if isinstance(value, list) and all(isinstance(v, dict) for v in value):
                    nested = _compose_lists(value, {p: at[p][key] for p in at}, config, top=False)
                    for p in at:
                        new[p][key] = nested[p]
        for p in per_width:
            result[p].append(new[p])
    return result


def flanc_specs(family: str, input_shape: Sequence[int], num_classes: int,
                config: FlancConfig = FlancConfig(), **zoo_kw: Any) -> dict[str, dict]:
    """Validated FLANC specs of a zoo family, keyed by width label (``"0.25"`` … ``"1.0"``).

    ``zoo_kw`` goes to the zoo builder (e.g. ``norm=``, ``channels=``). The bases of all
    widths have the same names and shapes; everything else is width-specific.
    """
    full = model_for_dataset(family, input_shape, num_classes, width=1.0, **zoo_kw)
    dense = {p: model_for_dataset(family, input_shape, num_classes, width=p, **zoo_kw)
             for p in config.widths}
    layers = _compose_lists(full["layers"], {p: s["layers"] for p, s in dense.items()}, config)
    if not any(layer["type"].startswith("flanc_") for layer in _flat(layers[config.widths[-1]])):
        raise ValueError(f"{family}: no layer of this network can be composed (nothing scales with width)")
    specs = {}
    for p in config.widths:
        meta = {"flanc_width": float(p), "basis_fraction": float(config.basis_fraction),
                "basis_count": float(config.basis_count)}
        specs[width_label(p)] = validate_spec({
            **dense[p], "layers": layers[p], "name": f"flanc-{dense[p].get('name', family)}-w{p:g}",
            "meta": meta})
    return specs


def _flat(layers: list[dict]) -> list[dict]:
    out = []
    for layer in layers:
        out.append(layer)
        for value in layer.values():
            if isinstance(value, list) and all(isinstance(v, dict) for v in value):
                out.extend(_flat(value))
    return out
