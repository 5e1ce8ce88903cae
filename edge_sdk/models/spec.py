"""Architectures as plain data.

A *spec* is msgpack-safe data (dicts, lists, str, int, float, bool) that the
coordinator and a device both turn into the *same* network::

    {"format": 1, "input_shape": [C, H, W], "num_classes": 10,
     "layers": [{"type": "conv2d", "in": 1, "out": 8, "kernel": 3}, ...]}

Layer types live in a registry (:data:`LAYER_TYPES`) so later methods can add
their own with :func:`register_layer`. Validation (:func:`validate_spec`) treats
the spec as untrusted: it checks types, ranges and unknown keys, propagates
shapes (without batch dimension) from ``input_shape`` and bounds the parameter
count and activation sizes without allocating a tensor.

Shapes: ``(C, H, W)`` for images, ``(C, L)`` for sensor series, ``(F,)`` for features. FLOPs are
``2 x MACs`` of the forward pass of conv/linear layers only (biases, norms,
activations and pooling count as free); see :func:`count_flops`.
"""
from __future__ import annotations

import copy
import math
from dataclasses import dataclass
from typing import Any, Callable

import torch
from torch import nn

from edge_sdk.models.layers import (LAYER_TYPES, Field, LayerType, Shape, SpecError,
                                    bool_field, build_layers, float_field, int_field,
                                    layers_field, register_layer, resolved, unregister_layer)

__all__ = ["FORMAT_VERSION", "MAX_DEPTH", "Shape", "SpecError", "Field", "LayerType",
           "LAYER_TYPES", "int_field", "float_field", "bool_field", "layers_field",
           "register_layer", "unregister_layer", "resolved", "validate_spec", "infer_shapes",
           "layer_stats", "build_model", "build_layers", "count_params", "count_flops",
           "SpecModel"]

FORMAT_VERSION = 1
MAX_DEPTH = 8
MAX_CLASSES = 100_000
_SPEC_KEYS = ("format", "input_shape", "num_classes", "layers", "name", "meta")


# ----------------------------------------------------------------- value checks
def _tname(v: Any) -> str:
    return type(v).__name__


def _check_field(key: str, f: Field, v: Any) -> None:
    if v is None:
        if f.nullable:
            return
        raise SpecError(f"{key!r} must not be null")
    if f.kind == "int":
        if type(v) is not int:
            raise SpecError(f"{key!r} must be an int, got {_tname(v)}")
    elif f.kind == "float":
        if type(v) not in (int, float) or not math.isfinite(v):
            raise SpecError(f"{key!r} must be a finite number, got {_tname(v)}")
    elif f.kind == "bool":
        if type(v) is not bool:
            raise SpecError(f"{key!r} must be a bool, got {_tname(v)}")
        return
    elif f.kind == "layers":
        if not isinstance(v, (list, tuple)):
            raise SpecError(f"{key!r} must be a list of layers, got {_tname(v)}")
        return
    if not f.lo <= v <= f.hi:
        raise SpecError(f"{key!r} = {v} out of range [{f.lo}, {f.hi}]")


def _check_plain(v: Any, depth: int = 0) -> None:
    """Small msgpack-style data only (for schema-less layer types)."""
    if depth > MAX_DEPTH:
        raise SpecError("value nested too deeply")
    if v is None or type(v) in (bool, int):
        return
    if type(v) is float:
        if not math.isfinite(v):
            raise SpecError("non-finite float")
    elif type(v) is str:
        if len(v) > 1024:
            raise SpecError("string too long")
    elif isinstance(v, (list, tuple)):
        if len(v) > 1024:
            raise SpecError("list too long")
        for item in v:
            _check_plain(item, depth + 1)
    elif isinstance(v, dict):
        if len(v) > 256 or not all(type(k) is str for k in v):
            raise SpecError("dict too large or with non-string keys")
        for item in v.values():
            _check_plain(item, depth + 1)
    else:
        raise SpecError(f"unsupported value type {_tname(v)}")


def _check_keys(lt: LayerType, layer: dict) -> None:
    if lt.schema is None:
        for key, value in layer.items():
            if type(key) is not str:
                raise SpecError(f"non-string key {key!r}")
            _check_plain(value)
        return
    unknown = [k for k in layer if k != "type" and k not in lt.schema]
    if unknown:
        names = ", ".join(sorted(repr(k)[:40] for k in unknown))
        raise SpecError(f"unknown key(s) for {lt.name}: {names}")
    for key, f in lt.schema.items():
        if key in layer:
            _check_field(key, f, layer[key])
        elif f.required:
            raise SpecError(f"{lt.name} is missing required key {key!r}")


# ----------------------------------------------------------------- walking
@dataclass
class _Ctx:
    max_layers: int
    max_params: int | None
    max_activation: int
    layers: int = 0
    params: int = 0
    flops: int = 0


def _guard(path: str, fn: Callable[..., Any], *args: Any) -> Any:
    """Call a (possibly plug-in) callback; any failure becomes a SpecError at ``path``."""
    try:
        return fn(*args)
    except SpecError as exc:
        raise SpecError(f"{path}: {exc}") from None
    except Exception as exc:  # plug-in callbacks on untrusted data: report, never crash
        raise SpecError(f"{path}: {type(exc).__name__}: {exc}") from exc


def _meta_build(lt: LayerType, layer: dict) -> nn.Module:
    with torch.device("meta"):
        module = lt.build(resolved(layer))
    if not isinstance(module, nn.Module):
        raise SpecError(f"builder for {lt.name} returned {_tname(module)}, not nn.Module")
    return module


def _meta_out_shape(lt: LayerType, layer: dict, shape: Shape) -> Shape:
    with torch.no_grad():
        y = _meta_build(lt, layer)(torch.empty((1, *shape), device="meta"))
    return tuple(int(d) for d in y.shape[1:])


def _meta_params(lt: LayerType, layer: dict) -> int:
    return sum(p.numel() for p in _meta_build(lt, layer).parameters())


def _check_shape(out: Any, ctx: _Ctx) -> Shape:
    if not isinstance(out, (tuple, list)) or not 1 <= len(out) <= 4 \
            or not all(type(d) is int and d >= 1 for d in out):
        raise SpecError(f"invalid output shape {out!r}")
    if math.prod(out) > ctx.max_activation:
        raise SpecError(f"activation {tuple(out)} exceeds {ctx.max_activation} elements")
    return tuple(out)


def _walk(layers: Any, shape: Shape, path: str, depth: int, ctx: _Ctx,
          stats: list[dict] | None = None) -> Shape:
    if not isinstance(layers, (list, tuple)):
        raise SpecError(f"{path}: must be a list of layers, got {_tname(layers)}")
    if depth > MAX_DEPTH:
        raise SpecError(f"{path}: layers nested deeper than {MAX_DEPTH}")
    ctx.layers += len(layers)
    if ctx.layers > ctx.max_layers:
        raise SpecError(f"{path}: more than {ctx.max_layers} layers in total")
    for i, layer in enumerate(layers):
        params, flops = ctx.params, ctx.flops
        shape = _walk_layer(layer, shape, f"{path}[{i}]", depth, ctx)
        if stats is not None:
            stats.append({"type": layer["type"], "out_shape": shape,
                          "params": ctx.params - params, "flops": ctx.flops - flops})
    return shape


def _walk_layer(layer: Any, shape: Shape, path: str, depth: int, ctx: _Ctx) -> Shape:
    if not isinstance(layer, dict):
        raise SpecError(f"{path}: layer must be a dict, got {_tname(layer)}")
    kind = layer.get("type")
    if type(kind) is not str:
        raise SpecError(f"{path}: 'type' must be a string, got {_tname(kind)}")
    lt = LAYER_TYPES.get(kind)
    if lt is None:
        raise SpecError(f"{path}: unknown layer type {kind[:64]!r}")
    _guard(path, _check_keys, lt, layer)
    if lt.validate is not None:
        _guard(path, lt.validate, resolved(layer))
    if lt.children:
        assert lt.schema is not None and lt.merge is not None
        kids = {k: _walk(layer.get(k, lt.schema[k].default), shape, f"{path}.{k}", depth + 1, ctx)
                for k in lt.children}
        out = _guard(path, lt.merge, resolved(layer), shape, kids)
        own = _guard(path, lt.params, resolved(layer)) if lt.params else 0
    else:
        fn = lt.out_shape or (lambda lay, s: _meta_out_shape(lt, lay, s))
        out = _guard(path, fn, resolved(layer), shape)
        own = _guard(path, lt.params or (lambda lay: _meta_params(lt, lay)), resolved(layer))
    flops = _guard(path, lt.flops, resolved(layer), shape) if lt.flops else 0
    if type(own) is not int or own < 0 or type(flops) is not int or flops < 0:
        raise SpecError(f"{path}: params/flops callbacks must return non-negative ints")
    out = _guard(path, _check_shape, out, ctx)
    ctx.params += own
    ctx.flops += flops
    if ctx.max_params is not None and ctx.params > ctx.max_params:
        raise SpecError(f"{path}: parameter count exceeds {ctx.max_params}")
    return out


def _check_top(spec: Any) -> Shape:
    if not isinstance(spec, dict):
        raise SpecError(f"spec must be a dict, got {_tname(spec)}")
    unknown = [k for k in spec if k not in _SPEC_KEYS]
    if unknown:
        raise SpecError(f"spec: unknown key(s) {', '.join(sorted(repr(k)[:40] for k in unknown))}")
    missing = [k for k in _SPEC_KEYS[:4] if k not in spec]
    if missing:
        raise SpecError(f"spec: missing key(s) {', '.join(missing)}")
    if type(spec["format"]) is not int or spec["format"] != FORMAT_VERSION:
        raise SpecError(f"spec: unsupported format {spec['format']!r} (want {FORMAT_VERSION})")
    shp = spec["input_shape"]
    if not isinstance(shp, (list, tuple)) or not 1 <= len(shp) <= 3 \
            or not all(type(d) is int and 1 <= d <= 65536 for d in shp):
        raise SpecError("spec: input_shape must be 1-3 ints in [1, 65536], e.g. [C, H, W]")
    nc = spec["num_classes"]
    if type(nc) is not int or not 1 <= nc <= MAX_CLASSES:
        raise SpecError(f"spec: num_classes must be an int in [1, {MAX_CLASSES}]")
    if "name" in spec and (type(spec["name"]) is not str or len(spec["name"]) > 200):
        raise SpecError("spec: name must be a string of <= 200 characters")
    meta = spec.get("meta", {})
    if not isinstance(meta, dict) or len(meta) > 64 or not all(
            type(k) is str and len(k) <= 64 and (v is None or type(v) in (bool, int, float, str))
            for k, v in meta.items()):
        raise SpecError("spec: meta must be a dict of <= 64 str -> scalar entries")
    _guard("spec.meta", _check_plain, meta)
    return tuple(shp)


def _analyse(spec: Any, max_layers: int, max_params: int | None, max_activation: int,
             stats: list[dict] | None = None) -> _Ctx:
    shape = _check_top(spec)
    ctx = _Ctx(max_layers, max_params, max_activation)
    _guard("input_shape", _check_shape, shape, ctx)
    if not spec["layers"]:
        raise SpecError("layers: at least one layer is required")
    out = _walk(spec["layers"], shape, "layers", 1, ctx, stats)
    if out != (spec["num_classes"],):
        raise SpecError(f"layers: final output shape {out} != (num_classes,) = "
                        f"({spec['num_classes']},)")
    return ctx


# ----------------------------------------------------------------- public API
def validate_spec(spec: object, max_layers: int = 256, max_params: int = 50_000_000, *,
                  max_activation: int = 1 << 24) -> dict:
    """Strictly validate untrusted spec data; return it unchanged or raise SpecError.

    ``max_layers`` counts nested layers too; ``max_activation`` bounds the element
    count of the input and of every layer's output (per sample).
    """
    _analyse(spec, max_layers, max_params, max_activation)
    return spec  # type: ignore[return-value]


def layer_stats(spec: dict) -> list[dict]:
    """Per top-level layer: ``{"type", "out_shape", "params", "flops"}`` (nested included)."""
    stats: list[dict] = []
    _analyse(spec, 256, None, 1 << 24, stats)
    return stats


def infer_shapes(spec: dict) -> list[Shape]:
    """Output shape (no batch dim) after each top-level layer."""
    return [s["out_shape"] for s in layer_stats(spec)]


def count_flops(spec: dict, batch: int = 1) -> int:
    """Forward FLOPs = 2 x multiply-accumulates of conv/linear layers, times ``batch``.

    conv2d: ``2 * out * H_out * W_out * (in / groups) * k * k``; linear: ``2 * in * out``.
    Biases, norms, activations, pooling and residual additions are not counted.
    """
    if type(batch) is not int or batch < 1:
        raise ValueError(f"batch must be a positive int, got {batch!r}")
    return _analyse(spec, 256, None, 1 << 24).flops * batch


def count_params(spec_or_model: dict | nn.Module) -> int:
    """Trainable parameter count of a built model or (computed, no tensors) of a spec."""
    if isinstance(spec_or_model, nn.Module):
        return sum(p.numel() for p in spec_or_model.parameters())
    return _analyse(spec_or_model, 256, None, 1 << 24).params


class SpecModel(nn.Module):
    """The network for a spec: parameters are named ``layers.<i>...``."""

    def __init__(self, spec: dict) -> None:
        super().__init__()
        self.spec = copy.deepcopy(spec)
        self.input_shape: Shape = tuple(spec["input_shape"])
        self.num_classes: int = spec["num_classes"]
        self.layers = build_layers(spec["layers"])

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.layers(x)


def build_model(spec: dict, *, max_params: int = 50_000_000) -> SpecModel:
    """Validate ``spec`` then build it (deterministic given the torch seed)."""
    validate_spec(spec, max_params=max_params)
    return SpecModel(spec)

