"""Layer-type registry and the built-in layer types of architecture specs.

Each layer type declares a schema (keys, types, ranges, defaults), a builder
returning an ``nn.Module`` and shape/parameter/FLOP callbacks, so validation
never needs to allocate a tensor. Later methods plug in with
:func:`register_layer`; see :class:`LayerType` for the callback contract.
"""
from __future__ import annotations

import math
import re
from dataclasses import dataclass
from typing import Any, Callable, Mapping, Sequence

import torch
from torch import nn

__all__ = ["Shape", "SpecError", "Field", "LayerType", "LAYER_TYPES", "int_field",
           "float_field", "bool_field", "layers_field", "register_layer", "unregister_layer",
           "resolved", "build_layers", "Residual", "GlobalAvgPool", "SeriesNorm", "MAX_CHANNELS"]

Shape = tuple[int, ...]
MAX_CHANNELS = 65536
_REQUIRED: Any = object()
_NAME_RE = re.compile(r"^[a-z][a-z0-9_]{0,63}$")


class SpecError(ValueError):
    """An architecture spec is malformed, inconsistent or too large."""


@dataclass(frozen=True)
class Field:
    """Schema entry of one layer key: ``kind`` is int | float | bool | layers."""

    kind: str
    lo: float = 0
    hi: float = 0
    default: Any = _REQUIRED
    nullable: bool = False

    @property
    def required(self) -> bool:
        return self.default is _REQUIRED


def int_field(lo: int, hi: int, default: Any = _REQUIRED, nullable: bool = False) -> Field:
    """An int in ``[lo, hi]`` (bools rejected), optionally ``None``."""
    return Field("int", lo, hi, default, nullable)


def float_field(lo: float, hi: float, default: Any = _REQUIRED) -> Field:
    """A finite float (or int) in ``[lo, hi]``."""
    return Field("float", lo, hi, default)


def bool_field(default: Any = _REQUIRED) -> Field:
    return Field("bool", default=default)


def layers_field(default: Any = _REQUIRED) -> Field:
    """A nested layer list, walked from the container's input shape."""
    return Field("layers", default=default)


@dataclass(frozen=True)
class LayerType:
    """Everything the spec machinery knows about one layer type.

    ``validate(layer)`` checks cross-key constraints; ``out_shape(layer, in_shape)``
    propagates shapes (and raises on mismatch); ``params(layer)`` counts trainable
    parameters; ``flops(layer, in_shape)`` counts forward FLOPs per sample.
    Container types (with ``layers`` fields) get each nested list walked from their
    input shape and use ``merge(layer, in_shape, {key: out_shape})`` instead of
    ``out_shape``; nested params/FLOPs are added automatically. Callbacks get the
    layer with schema defaults filled in (:func:`resolved`) and report problems by
    raising :class:`SpecError` (any other exception is wrapped into one).
    """

    name: str
    build: Callable[[dict], nn.Module]
    validate: Callable[[dict], None] | None = None
    out_shape: Callable[[dict, Shape], Shape] | None = None
    params: Callable[[dict], int] | None = None
    flops: Callable[[dict, Shape], int] | None = None
    schema: Mapping[str, Field] | None = None
    merge: Callable[[dict, Shape, dict[str, Shape]], Shape] | None = None

    @property
    def children(self) -> tuple[str, ...]:
        return tuple(k for k, f in (self.schema or {}).items() if f.kind == "layers")


LAYER_TYPES: dict[str, LayerType] = {}


def register_layer(type_name: str, build: Callable[[dict], nn.Module],
                   validate: Callable[[dict], None] | None = None,
                   out_shape: Callable[[dict, Shape], Shape] | None = None,
                   params: Callable[[dict], int] | None = None,
                   flops: Callable[[dict, Shape], int] | None = None, *,
                   schema: Mapping[str, Field] | None = None,
                   merge: Callable[[dict, Shape, dict[str, Shape]], Shape] | None = None,
                   replace: bool = False) -> None:
    """Register a layer type.

    With a ``schema`` unknown keys are rejected and values type/range checked
    before ``validate`` runs; without one, ``validate`` must do that (values are
    still required to be small plain data). Missing ``out_shape``/``params`` fall
    back to building the layer on the ``meta`` device (no memory); missing
    ``flops`` counts as 0. Re-registering a name needs ``replace=True``.
    """
    if not isinstance(type_name, str) or not _NAME_RE.match(type_name):
        raise ValueError(f"bad layer type name {type_name!r} (want [a-z][a-z0-9_]*, <= 64 chars)")
    if type_name in LAYER_TYPES and not replace:
        raise ValueError(f"layer type {type_name!r} is already registered")
    lt = LayerType(type_name, build, validate, out_shape, params, flops,
                   dict(schema) if schema is not None else None, merge)
    if lt.children and merge is None:
        raise ValueError(f"container layer type {type_name!r} needs merge=")
    LAYER_TYPES[type_name] = lt


def unregister_layer(type_name: str) -> None:
    """Remove a registered layer type (mainly for tests)."""
    LAYER_TYPES.pop(type_name, None)


def resolved(layer: Mapping[str, Any]) -> dict[str, Any]:
    """The layer's keys with schema defaults filled in (for builders/callbacks)."""
    out = dict(layer)
    lt = LAYER_TYPES.get(layer.get("type"))  # type: ignore[arg-type]
    for key, f in ((lt.schema or {}) if lt else {}).items():
        if key not in out and not f.required:
            out[key] = f.default
    return out




def build_layers(layers: Sequence[dict]) -> nn.Sequential:
    """Build an already validated list of layers (container builders use this)."""
    modules = []
    for layer in layers:
        module = LAYER_TYPES[layer["type"]].build(resolved(layer))
        if not isinstance(module, nn.Module):
            raise SpecError(f"builder for {layer['type']} returned {type(module).__name__}")
        modules.append(module)
    return nn.Sequential(*modules)


# ----------------------------------------------------------------- modules
class Residual(nn.Module):
    """``body(x) + shortcut(x)``; an empty shortcut is the identity."""

    def __init__(self, body: nn.Sequential, shortcut: nn.Sequential) -> None:
        super().__init__()
        self.body = body
        self.shortcut = shortcut

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.body(x) + self.shortcut(x)


class GlobalAvgPool(nn.Module):
    """Mean over every axis after the channels: ``(N, C, H, W) -> (N, C)``, ``(N, C, L) -> (N, C)``."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x.flatten(2).mean(dim=2)  # not x.dim(): NNI's tracer cannot take a traced int


class SeriesNorm(nn.Module):
    """Each series standardised on its own, per channel, over time: ``(x - mean) / std`` along L.
    With ``log_scale`` the log of each channel's std is appended as channels of their own (constant
    over time), so the model keeps the amplitude the standardisation took away:
    ``(N, C, L) -> (N, 2C, L)``. As a layer, the published model does it too."""

    def __init__(self, log_scale: bool, eps: float = 1e-8) -> None:
        super().__init__()
        self.log_scale, self.eps = log_scale, eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # in float64: a quiet stretch of a series (a std of 1e-3 of its level) turns float32's
        # rounding of the mean into visible noise, and torch and onnxruntime round it differently
        # (0.1% of the outputs apart at random weights, 0.8% trained: the model went unpublished)
        wide = x.double()
        mean = wide.mean(dim=2, keepdim=True)
        # eps on the std, not the variance: PLAID's smallest currents have a std near 1e-3 of the
        # largest, and sqrt(var + 1e-6) flattened them (0.72 central accuracy, not 0.86)
        std = ((wide - mean) ** 2).mean(dim=2, keepdim=True).sqrt() + self.eps
        z = (wide - mean) / std
        if self.log_scale:
            z = torch.cat([z, std.log().expand_as(z)], dim=1)
        return z.to(x.dtype)


# ----------------------------------------------------------------- shape helpers
def _chw(shape: Shape, what: str) -> tuple[int, int, int]:
    if len(shape) != 3:
        raise SpecError(f"{what} needs a (C, H, W) input, got shape {shape}")
    return shape[0], shape[1], shape[2]


def _cl(shape: Shape, what: str) -> tuple[int, int]:
    if len(shape) != 2:
        raise SpecError(f"{what} needs a (C, L) input, got shape {shape}")
    return shape[0], shape[1]


def _expect(actual: int, expected: int, key: str, what: str) -> None:
    if actual != expected:
        raise SpecError(f"{what} {key!r} is {expected} but the input has {actual}")


def _window(size: int, kernel: int, stride: int, padding: int) -> int:
    out = (size + 2 * padding - kernel) // stride + 1
    if out < 1:
        raise SpecError(f"kernel {kernel} does not fit input size {size} with padding {padding}")
    return out


_CH = int_field(1, MAX_CHANNELS)
_K = int_field(1, 15)


# conv2d ------------------------------------------------------------------------
def _conv_out(layer: dict, shape: Shape) -> Shape:
    c, h, w = _chw(shape, "conv2d")
    _expect(c, layer["in"], "in", "conv2d")
    k, s, p = layer["kernel"], layer["stride"], layer["padding"]
    return (layer["out"], _window(h, k, s, p), _window(w, k, s, p))


def _conv_check(layer: dict) -> None:
    g = layer["groups"]
    if layer["in"] % g or layer["out"] % g:
        raise SpecError(f"groups={g} must divide in={layer['in']} and out={layer['out']}")


def _conv_params(layer: dict) -> int:
    k = layer["kernel"]
    return layer["out"] * (layer["in"] // layer["groups"]) * k * k + layer["out"] * layer["bias"]


def _conv_flops(layer: dict, shape: Shape) -> int:
    _, ho, wo = _conv_out(layer, shape)
    k = layer["kernel"]
    return 2 * layer["out"] * ho * wo * (layer["in"] // layer["groups"]) * k * k


register_layer(
    "conv2d",
    lambda a: nn.Conv2d(a["in"], a["out"], a["kernel"], a["stride"], a["padding"],
                        groups=a["groups"], bias=a["bias"]),
    _conv_check, _conv_out, _conv_params, _conv_flops,
    schema={"in": _CH, "out": _CH, "kernel": _K, "stride": int_field(1, 15, 1),
            "padding": int_field(0, 15, 0), "groups": int_field(1, MAX_CHANNELS, 1),
            "bias": bool_field(True)})


# conv1d (sensor series, (C, L)) ---------------------------------------------------
def _conv1d_out(layer: dict, shape: Shape) -> Shape:
    c, length = _cl(shape, "conv1d")
    _expect(c, layer["in"], "in", "conv1d")
    return (layer["out"], _window(length, layer["kernel"], layer["stride"], layer["padding"]))


def _conv1d_params(layer: dict) -> int:
    return layer["out"] * (layer["in"] // layer["groups"]) * layer["kernel"] + layer["out"] * layer["bias"]


def _conv1d_flops(layer: dict, shape: Shape) -> int:
    _, lo = _conv1d_out(layer, shape)
    return 2 * layer["out"] * lo * (layer["in"] // layer["groups"]) * layer["kernel"]


register_layer(
    "conv1d",
    lambda a: nn.Conv1d(a["in"], a["out"], a["kernel"], a["stride"], a["padding"],
                        groups=a["groups"], bias=a["bias"]),
    _conv_check, _conv1d_out, _conv1d_params, _conv1d_flops,
    schema={"in": _CH, "out": _CH, "kernel": int_field(1, 63), "stride": int_field(1, 63, 1),
            "padding": int_field(0, 63, 0), "groups": int_field(1, MAX_CHANNELS, 1),
            "bias": bool_field(True)})


# linear ------------------------------------------------------------------------
def _linear_out(layer: dict, shape: Shape) -> Shape:
    if len(shape) != 1:
        raise SpecError(f"linear needs a flat (F,) input, got shape {shape}; add 'flatten'")
    _expect(shape[0], layer["in"], "in", "linear")
    return (layer["out"],)


register_layer(
    "linear", lambda a: nn.Linear(a["in"], a["out"], bias=a["bias"]), None, _linear_out,
    lambda a: a["in"] * a["out"] + a["out"] * a["bias"],
    lambda a, s: 2 * a["in"] * a["out"],
    schema={"in": int_field(1, 1 << 24), "out": _CH, "bias": bool_field(True)})


# shape-preserving / parameter-free -----------------------------------------------
def _same(layer: dict, shape: Shape) -> Shape:
    return shape


register_layer("relu", lambda a: nn.ReLU(), None, _same, lambda a: 0, schema={})
register_layer("dropout", lambda a: nn.Dropout(a["p"]), None, _same, lambda a: 0,
               schema={"p": float_field(0.0, 0.99)})
register_layer("flatten", lambda a: nn.Flatten(), None, lambda a, s: (math.prod(s),),
               lambda a: 0, schema={})


def _gap_out(layer: dict, shape: Shape) -> Shape:
    if len(shape) not in (2, 3):
        raise SpecError(f"global_avgpool needs a (C, H, W) or (C, L) input, got shape {shape}")
    return (shape[0],)


register_layer("global_avgpool", lambda a: GlobalAvgPool(), None, _gap_out, lambda a: 0,
               schema={})


def _pool_out(layer: dict, shape: Shape) -> Shape:
    c, h, w = _chw(shape, layer["type"])
    k = layer["kernel"]
    s = layer["stride"] or k
    if h < k or w < k:
        raise SpecError(f"{layer['type']} kernel {k} larger than input {h}x{w}")
    return (c, _window(h, k, s, 0), _window(w, k, s, 0))


_POOL = {"kernel": _K, "stride": int_field(1, 15, None, nullable=True)}
register_layer("maxpool2d", lambda a: nn.MaxPool2d(a["kernel"], a["stride"]), None, _pool_out,
               lambda a: 0, schema=_POOL)
register_layer("avgpool2d", lambda a: nn.AvgPool2d(a["kernel"], a["stride"]), None, _pool_out,
               lambda a: 0, schema=_POOL)


def _pool1d_out(layer: dict, shape: Shape) -> Shape:
    c, length = _cl(shape, layer["type"])
    k = layer["kernel"]
    if length < k:
        raise SpecError(f"{layer['type']} kernel {k} larger than input length {length}")
    return (c, _window(length, k, layer["stride"] or k, 0))


_POOL1D = {"kernel": int_field(1, 63), "stride": int_field(1, 63, None, nullable=True)}
register_layer("maxpool1d", lambda a: nn.MaxPool1d(a["kernel"], a["stride"]), None, _pool1d_out,
               lambda a: 0, schema=_POOL1D)
register_layer("avgpool1d", lambda a: nn.AvgPool1d(a["kernel"], a["stride"]), None, _pool1d_out,
               lambda a: 0, schema=_POOL1D)


# normalisation -------------------------------------------------------------------
def _series_norm_out(layer: dict, shape: Shape) -> Shape:
    c, length = _cl(shape, "series_norm")
    return (2 * c if layer["log_scale"] else c, length)


register_layer("series_norm", lambda a: SeriesNorm(a["log_scale"]), None, _series_norm_out, lambda a: 0,
               schema={"log_scale": bool_field(True)})


def _bn_out(layer: dict, shape: Shape) -> Shape:
    _expect(_chw(shape, "batchnorm2d")[0], layer["channels"], "channels", "batchnorm2d")
    return shape


def _bn1d_out(layer: dict, shape: Shape) -> Shape:
    """(C, L) or features (C,): torch's BatchNorm1d takes both."""
    _expect((shape[0] if len(shape) == 1 else _cl(shape, "batchnorm1d")[0]), layer["channels"], "channels",
            "batchnorm1d")
    return shape


def _gn_out(layer: dict, shape: Shape) -> Shape:
    if len(shape) not in (1, 2, 3):
        raise SpecError(f"groupnorm needs a (C,), (C, L) or (C, H, W) input, got shape {shape}")
    _expect(shape[0], layer["channels"], "channels", "groupnorm")
    return shape


def _gn_check(layer: dict) -> None:
    if layer["channels"] % layer["groups"]:
        raise SpecError(f"groups={layer['groups']} must divide channels={layer['channels']}")


register_layer(
    "batchnorm2d",
    lambda a: nn.BatchNorm2d(a["channels"], track_running_stats=a["track_running_stats"]),
    None, _bn_out, lambda a: 2 * a["channels"],
    schema={"channels": _CH, "track_running_stats": bool_field(True)})
register_layer(
    "batchnorm1d",
    lambda a: nn.BatchNorm1d(a["channels"], track_running_stats=a["track_running_stats"]),
    None, _bn1d_out, lambda a: 2 * a["channels"],
    schema={"channels": _CH, "track_running_stats": bool_field(True)})
register_layer("groupnorm", lambda a: nn.GroupNorm(a["groups"], a["channels"]), _gn_check,
               _gn_out, lambda a: 2 * a["channels"], schema={"groups": _CH, "channels": _CH})


# residual ------------------------------------------------------------------------
def _residual_merge(layer: dict, shape: Shape, kids: dict[str, Shape]) -> Shape:
    if kids["body"] != kids["shortcut"]:
        raise SpecError(f"residual body output {kids['body']} does not match "
                        f"shortcut output {kids['shortcut']}")
    return kids["body"]


register_layer(
    "residual", lambda a: Residual(build_layers(a["body"]), build_layers(a["shortcut"])),
    schema={"body": layers_field(), "shortcut": layers_field([])}, merge=_residual_merge)
