"""Plain torch layers holding a composed weight: what factorised layers pre-compose into."""

from __future__ import annotations

from typing import TypeVar

import torch
from torch import nn

__all__ = ["dense_linear", "dense_conv1d", "dense_conv2d"]

L = TypeVar("L", nn.Linear, nn.Conv1d, nn.Conv2d)


def dense_linear(weight: torch.Tensor, bias: torch.Tensor | None) -> nn.Linear:
    """An ``nn.Linear`` with ``weight`` (out × in) and ``bias``, detached copies."""
    weight = weight.detach()
    layer = nn.Linear(weight.shape[1], weight.shape[0], bias=bias is not None,
                      dtype=weight.dtype, device=weight.device)
    return _filled(layer, weight, bias)


def dense_conv2d(weight: torch.Tensor, bias: torch.Tensor | None, stride: int, padding: int) -> nn.Conv2d:
    """An ``nn.Conv2d`` with ``weight`` (out × in × k × k), ``bias``, stride and padding, detached copies."""
    weight = weight.detach()
    out_channels, in_channels, kernel, _ = weight.shape
    layer = nn.Conv2d(in_channels, out_channels, kernel, stride, padding, bias=bias is not None,
                      dtype=weight.dtype, device=weight.device)
    return _filled(layer, weight, bias)


def dense_conv1d(weight: torch.Tensor, bias: torch.Tensor | None, stride: int, padding: int) -> nn.Conv1d:
    """An ``nn.Conv1d`` with ``weight`` (out × in × k), ``bias``, stride and padding, detached copies."""
    weight = weight.detach()
    out_channels, in_channels, kernel = weight.shape
    layer = nn.Conv1d(in_channels, out_channels, kernel, stride, padding, bias=bias is not None,
                      dtype=weight.dtype, device=weight.device)
    return _filled(layer, weight, bias)


def _filled(layer: L, weight: torch.Tensor, bias: torch.Tensor | None) -> L:
    with torch.no_grad():
        layer.weight.copy_(weight)
        if bias is not None:
            layer.bias.copy_(bias)
    return layer
