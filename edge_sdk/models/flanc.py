"""FLANC's composed layers (Mei et al., NeurIPS 2022): a shared neural basis, per-width coefficients.

A composed convolution holds a *basis* ``V`` of ``R2`` filters over ``R1`` input
channels (``R2 × R1 × k × k``, shared by every width) and *coefficients* ``U``
(``out × G·R2``, one per width) where ``G = in / R1``. Two equivalent forwards:

- two-stage (as in the paper's code): split the input into ``G`` groups of ``R1``
  channels, convolve each group with ``V`` (stride and padding apply here), then mix
  the ``G·R2`` maps with the 1×1 convolution ``U`` (+ bias);
- pre-composed: one dense kernel ``W[t, g·R1 + r] = Σ_b U[t, g·R2 + b] · V[b, r]``
  (:meth:`FlancConv2d.composed_weight`) and a plain convolution.

``precompose=None`` (auto) picks per batch: the pre-composed forward unless the
two-stage one needs :data:`TWO_STAGE_ADVANTAGE` times fewer multiply-adds (on a CPU the
single dense conv is faster per multiply-add). Both give the same outputs and gradients
up to float rounding. :class:`FlancLinear`
is the ``k = 1`` variant for ``(N, F)`` inputs and :class:`FlancConv1d` the one for series
``(N, C, L)``. Spec layer types: ``flanc_conv2d``, ``flanc_conv1d``
(keys ``in out basis_in basis_out kernel stride padding bias precompose``) and
``flanc_linear`` (``in out basis_in basis_out bias precompose``); parameters are
named ``basis``, ``coeff`` and ``bias``. :func:`to_dense` turns a FLANC model into a
plain dense model of the same width (for export).
"""
from __future__ import annotations

import copy
from typing import Any, Iterator

import torch
import torch.nn.functional as F
from torch import nn

from edge_sdk.models.layers import (MAX_CHANNELS, Field, Shape, SpecError, bool_field, int_field,
                                    register_layer)
from edge_sdk.model_names import COEFF_INITS
from edge_sdk.models.spec import SpecModel, build_model

__all__ = ["FlancConv2d", "FlancConv1d", "FlancLinear", "FLANC_LAYERS", "TWO_STAGE_ADVANTAGE", "COEFF_INITS",
           "prefer_composed", "flanc_modules", "basis_names", "init_coefficients", "orthogonality_penalty",
           "dense_spec", "to_dense"]


#: Auto mode runs the two-stage forward only when it needs this many times fewer multiply-adds:
#: measured on a 2-core x86 CPU (torch 2.13), a two-stage training step of the cnn4 family
#: is 1.3-1.9x slower than the pre-composed one although it has fewer multiply-adds.
TWO_STAGE_ADVANTAGE = 3.0


def _macs_both(in_f: int, out_f: int, r1: int, r2: int, k2: int, positions: int) -> tuple[int, int]:
    """Multiply-adds of ``(two-stage, pre-composed)`` forwards over ``positions`` output pixels."""
    gr2 = in_f // r1 * r2
    two_stage = positions * (gr2 * r1 * k2 + out_f * gr2)
    composed = out_f * gr2 * r1 * k2 + positions * out_f * in_f * k2
    return two_stage, composed


def prefer_composed(two_stage_macs: int, composed_macs: int) -> bool:
    """True unless the two-stage forward is :data:`TWO_STAGE_ADVANTAGE` times cheaper."""
    return two_stage_macs * TWO_STAGE_ADVANTAGE >= composed_macs


def _init_basis(basis: torch.Tensor) -> None:
    """Orthonormal basis rows (as the paper's code), so ``U``'s default init sets ``W``'s scale."""
    with torch.no_grad():
        nn.init.orthogonal_(basis.view(basis.shape[0], -1))


def _init_coeff(coeff: torch.Tensor, bias: torch.Tensor | None) -> None:
    """He init of the 1×1 coefficient conv (``G·R2`` inputs): with orthonormal basis rows the
    composed kernel then has He's variance ``2 / (in·k·k)``, so signals keep their scale
    through stacks of composed layers without norm layers."""
    nn.init.kaiming_normal_(coeff, nonlinearity="relu")
    if bias is not None:
        nn.init.zeros_(bias)


class _Composed(nn.Module):
    """Shared bookkeeping of the conv and linear variants."""

    basis: nn.Parameter
    coeff: nn.Parameter
    bias: nn.Parameter | None

    def __init__(self, in_features: int, out_features: int, basis_in: int, basis_out: int,
                 kernel: int, bias: bool, precompose: bool | None, kernel_dims: int = 2) -> None:
        super().__init__()
        if in_features % basis_in:
            raise ValueError(f"basis_in={basis_in} must divide in={in_features}")
        self.in_features, self.out_features = in_features, out_features
        self.basis_in, self.basis_out, self.kernel = basis_in, basis_out, kernel
        self.kernel_dims = kernel_dims  # 2: a k × k conv2d kernel, 1: a conv1d's k taps
        self.groups = in_features // basis_in
        self.precompose = precompose
        shape = (basis_out, basis_in, *(kernel,) * kernel_dims) if kernel else (basis_out, basis_in)
        self.basis = nn.Parameter(torch.empty(shape))
        self.coeff = nn.Parameter(torch.empty(out_features, self.groups * basis_out))
        self.bias = nn.Parameter(torch.empty(out_features)) if bias else None
        _init_basis(self.basis)
        _init_coeff(self.coeff, self.bias)

    def composed_weight(self) -> torch.Tensor:
        """The dense kernel ``W[t, g·R1 + r] = Σ_b U[t, g·R2 + b] · V[b, r]`` (differentiable)."""
        u = self.coeff.view(self.out_features, self.groups, self.basis_out)
        v = self.basis.reshape(self.basis_out, -1)
        w = torch.einsum("tgb,bk->tgk", u, v)
        return w.reshape(self.out_features, self.in_features, *self.basis.shape[2:])

    def _use_composed(self, batch_positions: int) -> bool:
        """Auto mode: see :func:`prefer_composed` (``batch_positions`` = batch × output pixels)."""
        if self.precompose is not None:
            return self.precompose
        k2 = self.kernel ** self.kernel_dims if self.kernel else 1
        return prefer_composed(*_macs_both(self.in_features, self.out_features, self.basis_in,
                                           self.basis_out, k2, batch_positions))

    def extra_repr(self) -> str:
        return (f"in={self.in_features}, out={self.out_features}, basis_in={self.basis_in}, "
                f"basis_out={self.basis_out}, groups={self.groups}, precompose={self.precompose}")


class FlancConv2d(_Composed):
    """A convolution composed from a shared basis ``V`` and width-specific coefficients ``U``."""

    def __init__(self, in_channels: int, out_channels: int, basis_in: int, basis_out: int,
                 kernel: int, stride: int = 1, padding: int = 0, bias: bool = True,
                 precompose: bool | None = None) -> None:
        super().__init__(in_channels, out_channels, basis_in, basis_out, kernel, bias, precompose)
        self.stride, self.padding = stride, padding

    def two_stage(self, x: torch.Tensor) -> torch.Tensor:
        """Basis conv on each group of ``R1`` channels, then the 1×1 coefficient conv."""
        n, _, h, w = x.shape
        y = F.conv2d(x.reshape(n * self.groups, self.basis_in, h, w), self.basis,
                     stride=self.stride, padding=self.padding)
        y = y.reshape(n, self.groups * self.basis_out, y.shape[2], y.shape[3])
        return F.conv2d(y, self.coeff[:, :, None, None], self.bias)

    def precomposed(self, x: torch.Tensor) -> torch.Tensor:
        """One dense convolution with :meth:`composed_weight`."""
        return F.conv2d(x, self.composed_weight(), self.bias, self.stride, self.padding)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        ho = (x.shape[2] + 2 * self.padding - self.kernel) // self.stride + 1
        wo = (x.shape[3] + 2 * self.padding - self.kernel) // self.stride + 1
        return self.precomposed(x) if self._use_composed(x.shape[0] * ho * wo) else self.two_stage(x)


class FlancConv1d(_Composed):
    """`FlancConv2d` over series ``(N, C, L)``: a basis of ``R2 × R1 × k`` filters."""

    def __init__(self, in_channels: int, out_channels: int, basis_in: int, basis_out: int,
                 kernel: int, stride: int = 1, padding: int = 0, bias: bool = True,
                 precompose: bool | None = None) -> None:
        super().__init__(in_channels, out_channels, basis_in, basis_out, kernel, bias, precompose, kernel_dims=1)
        self.stride, self.padding = stride, padding

    def two_stage(self, x: torch.Tensor) -> torch.Tensor:
        """Basis conv on each group of ``R1`` channels, then the 1-tap coefficient conv."""
        n, _, length = x.shape
        y = F.conv1d(x.reshape(n * self.groups, self.basis_in, length), self.basis,
                     stride=self.stride, padding=self.padding)
        y = y.reshape(n, self.groups * self.basis_out, y.shape[2])
        return F.conv1d(y, self.coeff[:, :, None], self.bias)

    def precomposed(self, x: torch.Tensor) -> torch.Tensor:
        """One dense convolution with :meth:`composed_weight`."""
        return F.conv1d(x, self.composed_weight(), self.bias, self.stride, self.padding)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        lo = (x.shape[2] + 2 * self.padding - self.kernel) // self.stride + 1
        return self.precomposed(x) if self._use_composed(x.shape[0] * lo) else self.two_stage(x)


class FlancLinear(_Composed):
    """The ``k = 1`` variant for ``(N, F)`` inputs: ``y = U · blockdiag(V, …, V) · x + b``."""

    def __init__(self, in_features: int, out_features: int, basis_in: int, basis_out: int,
                 bias: bool = True, precompose: bool | None = None) -> None:
        super().__init__(in_features, out_features, basis_in, basis_out, 0, bias, precompose)

    def two_stage(self, x: torch.Tensor) -> torch.Tensor:
        """Basis projection of each group of ``R1`` features, then the coefficient mix."""
        y = x.reshape(x.shape[0], self.groups, self.basis_in) @ self.basis.t()
        return F.linear(y.reshape(x.shape[0], self.groups * self.basis_out), self.coeff, self.bias)

    def precomposed(self, x: torch.Tensor) -> torch.Tensor:
        """One dense linear layer with :meth:`composed_weight`."""
        return F.linear(x, self.composed_weight(), self.bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.precomposed(x) if self._use_composed(x.shape[0]) else self.two_stage(x)


FLANC_LAYERS = (FlancConv2d, FlancConv1d, FlancLinear)


# ----------------------------------------------------------------- helpers on built models
def flanc_modules(model: nn.Module) -> Iterator[tuple[str, _Composed]]:
    """``(name, module)`` of every composed layer of ``model``."""
    for name, module in model.named_modules():
        if isinstance(module, FLANC_LAYERS):
            yield name, module


def basis_names(model: nn.Module) -> list[str]:
    """State names of the shared bases (everything else is width-specific)."""
    return [f"{name}.basis" for name, _ in flanc_modules(model)]


def init_coefficients(model: nn.Module, scheme: str) -> None:
    """Draw every composed layer's coefficients (and zero its bias) anew by ``scheme``."""
    if scheme not in COEFF_INITS:
        raise ValueError(f"coefficient init must be one of {', '.join(COEFF_INITS)}, got {scheme!r}")
    with torch.no_grad():
        for _, module in flanc_modules(model):
            if scheme == "he":
                _init_coeff(module.coeff, module.bias)
            else:
                nn.init.kaiming_uniform_(module.coeff, a=5 ** 0.5)
                if module.bias is not None:
                    nn.init.zeros_(module.bias)


def orthogonality_penalty(model: nn.Module) -> torch.Tensor:
    """``Σ_layers ‖V Vᵀ − I‖²_F`` with each basis ``V`` flattened to ``R2 × (R1·k·k)``.

    A basis with more filters than dimensions (``R2 > R1·k·k``) cannot have orthonormal
    rows; it is pushed towards orthonormal columns (``‖Vᵀ V − I‖²``) instead.
    """
    terms = []
    for _, module in flanc_modules(model):  # on the bases' device: a model trained on cuda stays there
        v = module.basis.reshape(module.basis_out, -1)
        gram = v @ v.t() if v.shape[0] <= v.shape[1] else v.t() @ v
        terms.append(((gram - torch.eye(gram.shape[0], dtype=gram.dtype, device=gram.device)) ** 2).sum())
    return torch.stack(terms).sum() if terms else torch.zeros(())


def _dense_layer(layer: dict) -> dict:
    kind = layer.get("type")
    if kind in ("flanc_conv1d", "flanc_conv2d"):
        return {"type": kind.removeprefix("flanc_"), "in": layer["in"], "out": layer["out"],
                "kernel": layer["kernel"], "stride": layer.get("stride", 1), "padding": layer.get("padding", 0),
                "bias": layer.get("bias", True)}
    if kind == "flanc_linear":
        return {"type": "linear", "in": layer["in"], "out": layer["out"], "bias": layer.get("bias", True)}
    out = dict(layer)
    for key, value in layer.items():
        if isinstance(value, list) and all(isinstance(v, dict) and "type" in v for v in value):
            out[key] = [_dense_layer(v) for v in value]
    return out


def dense_spec(spec: dict) -> dict:
    """The same network with every composed layer replaced by a plain ``conv2d``/``linear``."""
    out = copy.deepcopy(spec)
    out["layers"] = [_dense_layer(layer) for layer in spec["layers"]]
    if "name" in out:
        out["name"] = f"{out['name']}-dense"[:200]
    return out


def to_dense(model: SpecModel) -> SpecModel:
    """A plain dense model computing what ``model`` computes (composed kernels pre-multiplied)."""
    dense = build_model(dense_spec(model.spec))
    state = {k: v for k, v in model.state_dict().items()}
    with torch.no_grad():
        for name, module in flanc_modules(model):
            state.pop(f"{name}.basis")
            state.pop(f"{name}.coeff")
            state[f"{name}.weight"] = module.composed_weight().detach().clone()
    dense.load_state_dict(state, strict=True)
    return dense.train(model.training)


# ----------------------------------------------------------------- spec layer types
def _check(layer: dict) -> None:
    if layer["in"] % layer["basis_in"]:
        raise SpecError(f"basis_in={layer['basis_in']} must divide in={layer['in']}")


def _groups_out(layer: dict) -> int:
    return layer["in"] // layer["basis_in"] * layer["basis_out"]


def _params(layer: dict, k2: int) -> int:
    return (layer["basis_out"] * layer["basis_in"] * k2 + layer["out"] * _groups_out(layer)
            + layer["out"] * layer["bias"])


def _macs(layer: dict, positions: int, k2: int) -> int:
    """Per-sample multiply-adds of the forward auto mode picks (for a batch of 32)."""
    two_stage, composed = _macs_both(layer["in"], layer["out"], layer["basis_in"], layer["basis_out"],
                                     k2, 32 * positions)
    return (composed if prefer_composed(two_stage, composed) else two_stage) // 32


def _conv_out(layer: dict, shape: Shape) -> Shape:
    if len(shape) != 3:
        raise SpecError(f"flanc_conv2d needs a (C, H, W) input, got shape {shape}")
    c, h, w = shape
    if c != layer["in"]:
        raise SpecError(f"flanc_conv2d 'in' is {layer['in']} but the input has {c}")
    k, s, p = layer["kernel"], layer["stride"], layer["padding"]
    ho, wo = (h + 2 * p - k) // s + 1, (w + 2 * p - k) // s + 1
    if ho < 1 or wo < 1:
        raise SpecError(f"kernel {k} does not fit input {h}x{w} with padding {p}")
    return (layer["out"], ho, wo)


def _conv_flops(layer: dict, shape: Shape) -> int:
    _, ho, wo = _conv_out(layer, shape)
    return 2 * _macs(layer, ho * wo, layer["kernel"] ** 2)


def _conv1d_out(layer: dict, shape: Shape) -> Shape:
    if len(shape) != 2:
        raise SpecError(f"flanc_conv1d needs a (C, L) input, got shape {shape}")
    c, length = shape
    if c != layer["in"]:
        raise SpecError(f"flanc_conv1d 'in' is {layer['in']} but the input has {c}")
    lo = (length + 2 * layer["padding"] - layer["kernel"]) // layer["stride"] + 1
    if lo < 1:
        raise SpecError(f"kernel {layer['kernel']} does not fit input length {length} with padding {layer['padding']}")
    return (layer["out"], lo)


def _linear_out(layer: dict, shape: Shape) -> Shape:
    if len(shape) != 1:
        raise SpecError(f"flanc_linear needs a flat (F,) input, got shape {shape}; add 'flatten'")
    if shape[0] != layer["in"]:
        raise SpecError(f"flanc_linear 'in' is {layer['in']} but the input has {shape[0]}")
    return (layer["out"],)


_PRECOMPOSE = Field("bool", default=None, nullable=True)
_COMMON: dict[str, Any] = {
    "in": int_field(1, 1 << 24), "out": int_field(1, MAX_CHANNELS),
    "basis_in": int_field(1, MAX_CHANNELS), "basis_out": int_field(1, MAX_CHANNELS),
    "bias": bool_field(True), "precompose": _PRECOMPOSE}

register_layer(
    "flanc_conv2d",
    lambda a: FlancConv2d(a["in"], a["out"], a["basis_in"], a["basis_out"], a["kernel"],
                          a["stride"], a["padding"], a["bias"], a["precompose"]),
    _check, _conv_out, lambda a: _params(a, a["kernel"] ** 2), _conv_flops,
    schema={**_COMMON, "in": int_field(1, MAX_CHANNELS), "kernel": int_field(1, 15),
            "stride": int_field(1, 15, 1), "padding": int_field(0, 15, 0)})
register_layer(
    "flanc_conv1d",
    lambda a: FlancConv1d(a["in"], a["out"], a["basis_in"], a["basis_out"], a["kernel"],
                          a["stride"], a["padding"], a["bias"], a["precompose"]),
    _check, _conv1d_out, lambda a: _params(a, a["kernel"]),
    lambda a, s: 2 * _macs(a, _conv1d_out(a, s)[1], a["kernel"]),
    schema={**_COMMON, "in": int_field(1, MAX_CHANNELS), "kernel": int_field(1, 63),
            "stride": int_field(1, 63, 1), "padding": int_field(0, 63, 0)})
register_layer(
    "flanc_linear",
    lambda a: FlancLinear(a["in"], a["out"], a["basis_in"], a["basis_out"], a["bias"], a["precompose"]),
    _check, _linear_out, lambda a: _params(a, 1), lambda a, s: 2 * _macs(a, 1, 1), schema=_COMMON)
