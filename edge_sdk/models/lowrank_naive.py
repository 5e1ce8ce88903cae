"""The naive low-rank baseline of FedPara's paper: ``W = X Yᵀ`` (one product, rank ≤ r).

A linear ``m × n`` weight is ``X Yᵀ`` with ``X`` of shape ``(m, r)`` and ``Y`` of shape
``(n, r)`` (``r(m + n)`` parameters); a conv kernel is its ``O × (I k²)`` unfolding
``X Yᵀ`` with ``Y`` stored as ``(I, k, k, r)`` (``r(O + I k²)`` parameters), so a
narrower network's tensors are prefix slices of a wider one's, as for FedPara.
:func:`naive_rank_matching` gives the rank whose parameter count equals a FedPara
layer's (exactly ``2R`` for linear layers, the nearest integer for convs).

Initialisation: entries ``N(0, s²)`` with ``r s⁴ = 2 / fan_in`` (He variance of ``W``).
Spec layer types ``lowrank_naive_linear`` and ``lowrank_naive_conv2d`` (keys as the
FedPara types, without ``tanh``/``personal``); both have ``to_dense()`` so
:func:`edge_sdk.models.fedpara.precompose` flattens them too.
"""
from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import nn

from edge_sdk.models.dense import dense_conv1d, dense_conv2d, dense_linear
from edge_sdk.models.fedpara import INIT_GAIN2, MAX_RANK, fedpara_weight_params
from edge_sdk.models.layers import LAYER_TYPES, MAX_CHANNELS, Shape, bool_field, int_field, register_layer

__all__ = ["NaiveLowRankLinear", "NaiveLowRankConv1d", "NaiveLowRankConv2d", "naive_weight_params",
           "naive_rank_matching", "NAIVE_TYPES"]

NAIVE_TYPES = ("lowrank_naive_linear", "lowrank_naive_conv2d", "lowrank_naive_conv1d")


def naive_weight_params(out: int, inp: int, rank: int, kernel: int | None = None, dims: int = 2) -> int:
    """``r(m + n)``, ``r(O + I k²)`` or (``dims=1``) ``r(O + I k)``."""
    return rank * (out + inp * (kernel ** dims if kernel else 1))


def naive_rank_matching(out: int, inp: int, fedpara_rank: int, kernel: int | None = None, dims: int = 2) -> int:
    """The naive rank with (as nearly as an integer allows) a FedPara layer's parameter count."""
    target = fedpara_weight_params(out, inp, fedpara_rank, kernel, dims)
    per_rank = naive_weight_params(out, inp, 1, kernel, dims)
    return min(MAX_RANK, max(1, round(target / per_rank)))


class _Naive(nn.Module):
    def _init(self, fan_in: int) -> None:
        std = (INIT_GAIN2 / (fan_in * self.rank)) ** 0.25
        nn.init.normal_(self.x, 0.0, std)
        nn.init.normal_(self.y, 0.0, std)
        if self.bias is not None:
            nn.init.zeros_(self.bias)


class NaiveLowRankLinear(_Naive):
    """``y = x (X Yᵀ)ᵀ + b``."""

    def __init__(self, in_features: int, out_features: int, rank: int, bias: bool = True) -> None:
        super().__init__()
        if min(in_features, out_features, rank) < 1 or rank > MAX_RANK:
            raise ValueError(f"need positive sizes and 1 <= rank <= {MAX_RANK}")
        self.in_features, self.out_features, self.rank = in_features, out_features, rank
        self.x = nn.Parameter(torch.empty(out_features, rank))
        self.y = nn.Parameter(torch.empty(in_features, rank))
        self.bias = nn.Parameter(torch.empty(out_features)) if bias else None
        self._init(in_features)

    def composed_weight(self) -> torch.Tensor:
        return self.x @ self.y.t()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.linear(x @ self.y, self.x, self.bias)  # never forms W: (x Y) Xᵀ

    def to_dense(self) -> nn.Linear:
        """An ``nn.Linear`` computing exactly this layer."""
        return dense_linear(self.composed_weight(), self.bias)


class _NaiveConv(_Naive):
    """Conv whose ``O × (I kᵈ)`` kernel unfolding is ``X Yᵀ`` (``d`` = ``dims`` kernel axes); the
    subclasses name the convolution."""

    dims: int
    _equation: str  # the einsum composing the kernel from X and Y
    _conv: Callable[..., torch.Tensor]
    _dense: Callable[..., nn.Module]

    def __init__(self, in_channels: int, out_channels: int, kernel_size: int, rank: int,
                 stride: int = 1, padding: int = 0, bias: bool = True) -> None:
        super().__init__()
        if min(in_channels, out_channels, kernel_size, rank, stride) < 1 or padding < 0 \
                or rank > MAX_RANK:
            raise ValueError(f"need positive sizes, padding >= 0 and 1 <= rank <= {MAX_RANK}")
        self.in_channels, self.out_channels, self.kernel_size = in_channels, out_channels, kernel_size
        self.rank, self.stride, self.padding = rank, stride, padding
        self.x = nn.Parameter(torch.empty(out_channels, rank))
        self.y = nn.Parameter(torch.empty(in_channels, *(kernel_size,) * self.dims, rank))
        self.bias = nn.Parameter(torch.empty(out_channels)) if bias else None
        self._init(in_channels * kernel_size ** self.dims)

    def composed_weight(self) -> torch.Tensor:
        return torch.einsum(self._equation, self.x, self.y)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return type(self)._conv(x, self.composed_weight(), self.bias, self.stride, self.padding)

    def to_dense(self) -> nn.Module:
        """A plain torch convolution computing exactly this layer."""
        return type(self)._dense(self.composed_weight(), self.bias, self.stride, self.padding)


class NaiveLowRankConv2d(_NaiveConv):
    """Conv2d whose ``O × (I k²)`` kernel unfolding is ``X Yᵀ``."""

    dims, _equation, _conv, _dense = 2, "oa,ihwa->oihw", F.conv2d, dense_conv2d


class NaiveLowRankConv1d(_NaiveConv):
    """Conv1d whose ``O × (I k)`` kernel unfolding is ``X Yᵀ``."""

    dims, _equation, _conv, _dense = 1, "oa,ika->oik", F.conv1d, dense_conv1d


_COMMON = {"out": int_field(1, MAX_CHANNELS), "rank": int_field(1, MAX_RANK), "bias": bool_field(True)}


def _linear_out(layer: dict, shape: Shape) -> Shape:
    return LAYER_TYPES["linear"].out_shape(layer, shape)  # type: ignore[misc]


def _conv_out(layer: dict, shape: Shape) -> Shape:
    return LAYER_TYPES["conv2d"].out_shape({**layer, "groups": 1}, shape)  # type: ignore[misc]


register_layer(
    "lowrank_naive_linear",
    lambda a: NaiveLowRankLinear(a["in"], a["out"], a["rank"], a["bias"]),
    None, _linear_out,
    lambda a: naive_weight_params(a["out"], a["in"], a["rank"]) + a["out"] * a["bias"],
    lambda a, s: 2 * a["rank"] * (a["in"] + a["out"]),
    schema={"in": int_field(1, 1 << 24), **_COMMON})

register_layer(
    "lowrank_naive_conv2d",
    lambda a: NaiveLowRankConv2d(a["in"], a["out"], a["kernel"], a["rank"], a["stride"],
                                 a["padding"], a["bias"]),
    None, _conv_out,
    lambda a: naive_weight_params(a["out"], a["in"], a["rank"], a["kernel"]) + a["out"] * a["bias"],
    lambda a, s: LAYER_TYPES["conv2d"].flops({**a, "groups": 1}, s),  # type: ignore[misc]
    schema={"in": int_field(1, MAX_CHANNELS), "kernel": int_field(1, 15),
            "stride": int_field(1, 15, 1), "padding": int_field(0, 15, 0), **_COMMON})


register_layer(
    "lowrank_naive_conv1d",
    lambda a: NaiveLowRankConv1d(a["in"], a["out"], a["kernel"], a["rank"], a["stride"],
                                 a["padding"], a["bias"]),
    None, lambda a, s: LAYER_TYPES["conv1d"].out_shape({**a, "groups": 1}, s),  # type: ignore[misc]
    lambda a: naive_weight_params(a["out"], a["in"], a["rank"], a["kernel"], dims=1) + a["out"] * a["bias"],
    lambda a, s: LAYER_TYPES["conv1d"].flops({**a, "groups": 1}, s),  # type: ignore[misc]
    schema={"in": int_field(1, MAX_CHANNELS), "kernel": int_field(1, 63),
            "stride": int_field(1, 63, 1), "padding": int_field(0, 63, 0), **_COMMON})
