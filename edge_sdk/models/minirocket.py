"""MiniRocket (Dempster, Schmidt & Webb, KDD 2021) as a fixed layer: a series ``(C, L)`` becomes
about 10,000 features, each the proportion of positive values (PPV) of one dilated convolution
minus one bias. Only the biases depend on data; everything else follows from ``(C, L)``:

- 84 kernels of length 9, weights -1 with 2 at three of the nine places (all ``C(9, 3)`` choices);
- dilations ``2**e`` for ``e`` spread over ``[0, log2((L - 1) / 8)]`` (32 values, repeats merged, the
  features of a kernel shared out by how often a dilation came up);
- every other (dilation, kernel) combination zero-padded ("same" length), the rest counted only
  where the kernel lies inside the series;
- features in kernel-major order (kernel, then dilation, then bias), the kernels in `KERNEL_ORDER`:
  a narrower layer (``kernels`` < 84: HeteroFL's width, `edge_sdk.models.zoo.minirocket`) keeps the
  first ``kernels`` of that order at every dilation, and its features are a prefix of the full
  layer's — same biases, same quantile points — at ``kernels / 84`` of the full layer's FLOPs;
- with several channels, each combination sums a random subset of them (seeded, fixed with the spec);
- the biases of a combination's features: quantiles of its convolution outputs at the
  low-discrepancy points ``(i * golden ratio) mod 1``.

Here the quantiles are of *a distribution the whole fleet shares*, fitted once before the first
round (`edge_sdk.models.minirocket_biases`) and carried as the layer's ``biases`` buffer, so every
device and the published ONNX compute the same features. With ``series_norm`` each series is first
standardised on its own per channel, and the log of each channel's scale is appended to the
features: the biases then do not depend on an appliance's amplitude (a 2 kW heater and a 5 W
charger reach the same kernels), and the amplitude still reaches the classifier.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import cached_property
from itertools import combinations
from typing import Iterator, NamedTuple

import numpy as np
import torch
from torch import nn
from torch.nn import functional

from edge_sdk.models.layers import Shape, SpecError, bool_field, int_field, register_layer, resolved

__all__ = ["KERNEL_LENGTH", "KERNEL_ORDER", "NUM_KERNELS", "Combination", "MiniRocketPlan", "MiniRocket",
           "layer_plan", "quantile_points"]

KERNEL_LENGTH = 9
NUM_KERNELS = 84  # C(9, 3)
_TWOS = tuple(combinations(range(KERNEL_LENGTH), 3))
_GOLDEN = (math.sqrt(5) + 1) / 2
#: the order in which a narrower layer keeps the 84 kernels: spread by the golden ratio, so that any
#: first few are not all alike (C(9, 3)'s own order starts with every kernel that has a 2 first)
KERNEL_ORDER = tuple(int(k) for k in np.argsort((np.arange(NUM_KERNELS) * _GOLDEN) % 1, kind="stable"))


class Combination(NamedTuple):
    """One (dilation, kernel) combination: its dilation's index, its kernel (0..83, the row
    ``dilation_index * 84 + kernel`` of a `series_histograms` answer), the kernel's place among the
    layer's kept kernels (its output channel), and the slice of its features."""

    dilation_index: int
    kernel: int
    rank: int
    features: slice


def quantile_points(n: int) -> np.ndarray:
    """The low-discrepancy quantile points of ``n`` features: ``(i * golden ratio) mod 1``, i = 1..n."""
    return (np.arange(1, n + 1, dtype=np.float64) * _GOLDEN) % 1


@dataclass(frozen=True)
class MiniRocketPlan:
    """Everything but the biases, from the input shape, the feature count and a seed."""

    channels: int
    length: int
    num_features: int = 9_996
    max_dilations: int = 32
    seed: int = 0
    #: the kernels kept, the first of `KERNEL_ORDER` (84: all); ``num_features`` is the full layer's
    kernels: int = NUM_KERNELS

    def __post_init__(self) -> None:
        if self.length < KERNEL_LENGTH:
            raise ValueError(f"MiniRocket needs series of at least {KERNEL_LENGTH} values, got {self.length}")
        if self.num_features < NUM_KERNELS:
            raise ValueError(f"MiniRocket needs at least {NUM_KERNELS} features, got {self.num_features}")
        if not 1 <= self.kernels <= NUM_KERNELS:
            raise ValueError(f"MiniRocket keeps 1 to {NUM_KERNELS} kernels, got {self.kernels}")

    @cached_property
    def dilations(self) -> tuple[tuple[int, int], ...]:
        """``(dilation, features per kernel at it)``, smallest dilation first."""
        per_kernel = self.num_features // NUM_KERNELS
        steps = min(per_kernel, self.max_dilations)
        top = math.log2((self.length - 1) / (KERNEL_LENGTH - 1))
        values, counts = np.unique(np.logspace(0, top, steps, base=2).astype(np.int64), return_counts=True)
        shares = (counts * (per_kernel / steps)).astype(np.int64)
        for i in range(per_kernel - int(shares.sum())):  # the remainder, one each from the smallest
            shares[i % len(shares)] += 1
        return tuple((int(d), int(f)) for d, f in zip(values, shares, strict=True))

    @property
    def per_kernel(self) -> int:
        """A kernel's features over all of its dilations."""
        return sum(f for _, f in self.dilations)

    @property
    def features(self) -> int:
        """PPV features (``kernels`` times `per_kernel`; at most ``num_features``)."""
        return self.kernels * self.per_kernel

    @property
    def combinations(self) -> int:
        """(dilation, kernel) combinations of all 84 kernels: the rows of a `series_histograms` answer,
        which is the same for every width."""
        return NUM_KERNELS * len(self.dilations)

    @property
    def kept_kernels(self) -> tuple[int, ...]:
        """The kernels this layer computes, in feature order."""
        return KERNEL_ORDER[:self.kernels]

    @cached_property
    def channel_masks(self) -> np.ndarray:
        """``(dilations, 84, C)`` 0/1: the channels each combination sums (all of them for one channel)."""
        rng = np.random.default_rng(self.seed)
        masks = np.zeros((len(self.dilations), NUM_KERNELS, self.channels), dtype=np.float32)
        top = math.log2(min(self.channels, 9) + 1)
        for d in range(len(self.dilations)):
            for k in range(NUM_KERNELS):
                n = min(self.channels, int(2 ** rng.uniform(0, top)))
                masks[d, k, rng.choice(self.channels, n, replace=False)] = 1
        return masks

    def padded(self, dilation_index: int, kernel: int) -> bool:
        """Whether a combination counts over the zero-padded ends too (every other one)."""
        return (dilation_index + kernel) % 2 == 0

    def combination_slices(self) -> Iterator[Combination]:
        """Every kept combination, in feature order (kernel-major)."""
        start = 0
        for rank, kernel in enumerate(self.kept_kernels):
            for d, (_, count) in enumerate(self.dilations):
                yield Combination(d, kernel, rank, slice(start, start + count))
                start += count

    def quantiles(self) -> np.ndarray:
        """The quantile point of every feature, in feature order (kernel, dilation, feature)."""
        return quantile_points(self.features)


def _kernel_weights() -> torch.Tensor:
    weights = -torch.ones(NUM_KERNELS, 1, KERNEL_LENGTH)
    for k, twos in enumerate(_TWOS):
        weights[k, 0, list(twos)] = 2.0
    return weights


class MiniRocket(nn.Module):
    """``(N, C, L) -> (N, features [+ C])``: PPV features, then (with ``series_norm``) the log of
    each channel's scale. ``biases`` is a buffer (``features`` values), identical fleet-wide."""

    #: its output depends on its input alone (training computes it once, `edge_sdk.training.fixed_prefix`)
    FIXED_FEATURES = True

    def __init__(self, plan: MiniRocketPlan, series_norm: bool = False) -> None:
        super().__init__()
        self.plan, self.series_norm = plan, series_norm
        kept = list(plan.kept_kernels)
        self.register_buffer("kernels", _kernel_weights()[kept], persistent=False)
        self.register_buffer("masks", torch.from_numpy(plan.channel_masks[:, kept]), persistent=False)
        self.register_buffer("biases", torch.zeros(plan.features))
        # each feature's PPV less the PPV its bias's quantile point gives the fleet's series (1 - q):
        # centred features, without which SGD on the head learned far slower (a trial on PLAID)
        expected = torch.cat([1 - torch.as_tensor(plan.quantiles(), dtype=torch.float32),
                              torch.zeros(plan.channels if series_norm else 0)])
        self.register_buffer("_expected", expected, persistent=False)
        for d in range(len(plan.dilations)):  # the padded kernels, the others, the order restoring kept's
            padded = [r for r, k in enumerate(kept) if plan.padded(d, k)]
            inner = [r for r, k in enumerate(kept) if not plan.padded(d, k)]
            order = torch.argsort(torch.tensor(padded + inner, dtype=torch.long))
            # (long, also when empty: a layer of few kernels may have none of one kind at a dilation)
            self.register_buffer(f"padded_{d}", torch.tensor(padded, dtype=torch.long), persistent=False)
            self.register_buffer(f"inner_{d}", torch.tensor(inner, dtype=torch.long), persistent=False)
            self.register_buffer(f"order_{d}", order, persistent=False)

    def standardised(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Each series standardised per channel (in float64, as `SeriesNorm`), and its log scale."""
        if not self.series_norm:
            return x, None
        wide = x.double()
        mean = wide.mean(dim=2, keepdim=True)
        std = ((wide - mean) ** 2).mean(dim=2, keepdim=True).sqrt() + 1e-8
        return ((wide - mean) / std).to(x.dtype), std.log().squeeze(2).to(x.dtype)

    def convolutions(self, x: torch.Tensor, dilation_index: int) -> torch.Tensor:
        """``(N, kernels, L)``: the kept kernels at one dilation, each over its channels, zero-padded."""
        n, c, length = x.shape
        dilation = self.plan.dilations[dilation_index][0]
        per_channel = functional.conv1d(x.reshape(n * c, 1, length), self.kernels, dilation=dilation,
                                        padding=4 * dilation).reshape(n, c, self.plan.kernels, length)
        if c == 1:
            return per_channel[:, 0]
        return torch.einsum("nckl,kc->nkl", per_channel, self.masks[dilation_index])

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        z, log_scale = self.standardised(x)
        per_dilation, start = [], 0
        length = z.shape[2]
        by_kernel = self.biases.reshape(self.plan.kernels, self.plan.per_kernel)
        for d, (dilation, count) in enumerate(self.plan.dilations):
            out = self.convolutions(z, d)
            biases = by_kernel[:, start:start + count]
            start += count
            padded, inner = getattr(self, f"padded_{d}"), getattr(self, f"inner_{d}")
            edge = 4 * dilation
            ppv_padded = (out[:, padded].unsqueeze(3) > biases[padded].unsqueeze(1)).to(z.dtype).mean(dim=2)
            trimmed = out[:, inner, edge:length - edge]
            ppv_inner = (trimmed.unsqueeze(3) > biases[inner].unsqueeze(1)).to(z.dtype).mean(dim=2)
            per_dilation.append(torch.cat([ppv_padded, ppv_inner], dim=1)[:, getattr(self, f"order_{d}")])
        features = [torch.cat(per_dilation, dim=2).flatten(1)]  # (N, kernels, per_kernel): kernel-major
        if log_scale is not None:
            features.append(log_scale)
        return torch.cat(features, dim=1) - self._expected


# ----------------------------------------------------------------- the spec's layer type
def _plan(layer: dict) -> MiniRocketPlan:
    return MiniRocketPlan(layer["in"], layer["length"], layer["features"], layer["max_dilations"], layer["seed"],
                          layer["kernels"])


def layer_plan(layer: dict) -> MiniRocketPlan:
    """The plan of a spec's (validated) ``minirocket`` layer, its defaults filled in."""
    return _plan(resolved(layer))


def _validate(layer: dict) -> None:
    try:
        _plan(layer)
    except ValueError as exc:
        raise SpecError(str(exc)) from None


def _out_shape(layer: dict, shape: Shape) -> Shape:
    if len(shape) != 2 or shape != (layer["in"], layer["length"]):
        raise SpecError(f"minirocket expects a ({layer['in']}, {layer['length']}) series, got shape {shape}")
    return (_plan(layer).features + (layer["in"] if layer["series_norm"] else 0),)


def _flops(layer: dict, shape: Shape) -> int:
    """2 x 9 multiply-adds per kept kernel, channel and position at every dilation (PPV counts as free)."""
    plan = _plan(layer)
    return 2 * KERNEL_LENGTH * plan.kernels * plan.channels * plan.length * len(plan.dilations)


register_layer(
    "minirocket", lambda a: MiniRocket(_plan(a), a["series_norm"]), _validate, _out_shape, lambda a: 0, _flops,
    schema={"in": int_field(1, 4096), "length": int_field(KERNEL_LENGTH, 65536),
            "features": int_field(NUM_KERNELS, 50_000, 9_996), "max_dilations": int_field(1, 32, 32),
            "seed": int_field(0, (1 << 31) - 1, 0), "series_norm": bool_field(False),
            "kernels": int_field(1, NUM_KERNELS, NUM_KERNELS)})
