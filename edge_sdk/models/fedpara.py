"""FedPara layers (Hyeon-Woo, Ye-Bin, Oh, ICLR 2022): low-rank Hadamard products.

A linear layer's ``m × n`` weight is ``W = (X1 Y1ᵀ) ⊙ (X2 Y2ᵀ)`` with ``X_i`` of shape
``(m, R)`` and ``Y_i`` of shape ``(n, R)`` (Proposition 1: ``rank W ≤ R²`` with only
``2R(m + n)`` parameters). A conv's ``O × I × k × k`` kernel is
``(T1 ×1 X1 ×2 Y1) ⊙ (T2 ×1 X2 ×2 Y2)`` with cores ``T_i`` of shape ``(R, R, k, k)``
(Proposition 3; ``2R(O + I + R k²)`` parameters). With ``tanh=True`` each inner
factor goes through ``tanh`` before the product. ``personal=True`` is pFedPara's form
``W = W1 ⊙ (W2 + 1)``: ``W1`` (``x1``, ``y1``, ``t1``) is shared, ``W2`` (``x2``,
``y2``, ``t2``) stays on the device (:func:`personal_names`).

Rank from ``γ ∈ [0, 1]``: ``R = ceil((1 − γ) r_min + γ r_max)`` where ``r_min`` is the
smallest rank that can reach full rank (``r_min² ≥ min(m, n)``; ``O, I`` for convs)
and ``r_max`` the largest whose parameter count does not exceed the dense weight's.
When a layer is so small that ``r_max < r_min`` the parameter budget wins (``R = r_max``,
at least 1).

Initialisation (He, variance-matched through the products): every factor entry is
``N(0, s²)`` with ``s`` chosen so that ``Var(W_ij) = 2 / fan_in`` at initialisation
(``fan_in = n`` or ``I k²``). For FedPara ``Var(W) = (R s⁴)²`` (linear) or ``(R² s⁶)²``
(conv). For pFedPara ``W1`` alone carries the He variance and ``X2 = 0`` (``Y2``,
``T2`` ``N(0, 1/R)``), so a device starts from the shared model exactly (``W = W1``)
and grows its personal modulation from there, LoRA-style; ``∂L/∂X2 ≠ 0`` at once.

A linear layer whose inputs come in ``blocks`` equal blocks of ``block`` features (MiniRocket's
head: one block per kernel, the kernel's dilations and biases within it) may be *folded*: the
``out × blocks·block`` part of its weight is the ``blocks·out × block`` matrix of the product, row
``k·out + c`` holding class ``c``'s weights on block ``k`` (so a narrower layer's blocks are a leading
block of the rows); the ``in − blocks·block`` columns after them (MiniRocket's log scales) are a
dense, shared ``tail``. A row per class leaves an unfolded product nothing to save (``R ≥ 1`` already
costs ``2(m + n)`` of the dense ``m n``); folded, ``R`` near ``√block`` can still reach full rank at a
third of the parameters or less.

Spec layer types ``fedpara_linear`` (keys ``in``, ``out``, ``rank``, ``bias``,
``tanh``, ``personal``, and ``blocks``, ``block`` to fold) and ``fedpara_conv2d`` (plus ``kernel``, ``stride``,
``padding``). FLOPs are those of the dense equivalent (composition is per batch).
:func:`precompose` turns any network of these (or of modules with ``to_dense()``)
into an ordinary dense one, so inference and ONNX export carry no overhead.
"""
from __future__ import annotations

import copy
import math
from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import nn

from edge_sdk.models.dense import dense_conv1d, dense_conv2d, dense_linear
from edge_sdk.models.folding import folded_shape, unfold_weight

from edge_sdk.models.layers import (LAYER_TYPES, MAX_CHANNELS, Shape, SpecError, bool_field, int_field,
                                    register_layer)

__all__ = ["DEFAULT_GAMMA", "MAX_RANK", "FedParaLinear", "FedParaConv1d", "FedParaConv2d", "rank_bounds",
           "rank_from_gamma", "fedpara_weight_params", "linear_params", "personal_names", "precompose",
           "FEDPARA_TYPES"]

DEFAULT_GAMMA = 0.1
#: Var(W) = INIT_GAIN2 / fan_in at init: that of torch's own Linear/Conv2d (kaiming_uniform, a=√5).
INIT_GAIN2 = 1.0 / 3.0
MAX_RANK = 4096
FEDPARA_TYPES = ("fedpara_linear", "fedpara_conv2d", "fedpara_conv1d")
_PERSONAL = ("x2", "y2", "t2")


# ----------------------------------------------------------------- ranks
def _positive_int(name: str, value: object) -> int:
    if type(value) is not int or value < 1:
        raise ValueError(f"{name} must be a positive int, got {value!r}")
    return value


def fedpara_weight_params(out: int, inp: int, rank: int, kernel: int | None = None, dims: int = 2) -> int:
    """Factor parameters of one layer: ``2R(m + n)``, ``2R(O + I + R k²)`` (a conv2d) or
    ``2R(O + I + R k)`` (a conv1d, ``dims=1``); no bias."""
    if kernel is None:
        return 2 * rank * (out + inp)
    return 2 * rank * (out + inp + rank * kernel ** dims)


def rank_bounds(out: int, inp: int, kernel: int | None = None, dims: int = 2) -> tuple[int, int]:
    """``(r_min, r_max)`` of a ``out × inp`` linear (``kernel=None``), a ``k × k`` conv or (``dims=1``)
    a conv1d of kernel ``k``."""
    out, inp = _positive_int("out", out), _positive_int("in", inp)
    if kernel is not None:
        _positive_int("kernel", kernel)
    small = min(out, inp)
    r_min = math.isqrt(small - 1) + 1  # ceil(sqrt(small))
    dense = out * inp * (kernel ** dims if kernel else 1)
    if kernel is None:
        r_max = dense // (2 * (out + inp))
    else:  # largest R with 2 k² R² + 2 (O + I) R - O I k² <= 0 (k, not k², in 1-D)
        a, b = 2 * kernel ** dims, 2 * (out + inp)
        r_max = int((-b + math.sqrt(b * b + 4 * a * dense)) / (2 * a)) + 1
        while r_max > 0 and fedpara_weight_params(out, inp, r_max, kernel, dims) > dense:
            r_max -= 1
    return r_min, r_max


def rank_from_gamma(out: int, inp: int, gamma: float, kernel: int | None = None, dims: int = 2) -> int:
    """``R = ceil((1 − γ) r_min + γ r_max)``, clamped so the layer never outgrows the dense one."""
    if isinstance(gamma, bool) or not isinstance(gamma, (int, float)) or not 0.0 <= gamma <= 1.0:
        raise ValueError(f"gamma must be a number in [0, 1], got {gamma!r}")
    r_min, r_max = rank_bounds(out, inp, kernel, dims)
    hi = max(r_max, 1)
    lo = min(r_min, hi)
    return max(lo, min(hi, math.ceil((1.0 - gamma) * lo + gamma * hi - 1e-9)))


def _resolve_rank(out: int, inp: int, rank: int | None, gamma: float | None,
                  kernel: int | None, dims: int = 2) -> int:
    if rank is not None and gamma is not None:
        raise ValueError("give either rank or gamma, not both")
    if rank is None:
        return rank_from_gamma(out, inp, DEFAULT_GAMMA if gamma is None else gamma, kernel, dims)
    if _positive_int("rank", rank) > MAX_RANK:
        raise ValueError(f"rank must be <= {MAX_RANK}, got {rank}")
    return rank


# ----------------------------------------------------------------- modules
class _FedPara(nn.Module):
    """Shared behaviour: initialisation, combination of the two factors, dense export."""

    rank: int
    personal: bool
    use_tanh: bool

    def _init_factors(self, fan_in: int, factors_per_term: int, r_terms: int) -> None:
        """He init through the products; ``r_terms`` = summands of one inner entry (R or R²)."""
        target = INIT_GAIN2 / fan_in
        if self.personal:  # W1 alone carries Var = target; W2 starts at zero (x2 = 0)
            std1 = (target / r_terms) ** (1.0 / (2 * factors_per_term))
            for name in ("x1", "y1", "t1"):
                if hasattr(self, name):
                    nn.init.normal_(getattr(self, name), 0.0, std1)
            nn.init.zeros_(self.x2)
            for name in ("y2", "t2"):
                if hasattr(self, name):
                    nn.init.normal_(getattr(self, name), 0.0, self.rank ** -0.5)
        else:  # Var(W) = (r_terms s^(2f))^2 = target
            std = (math.sqrt(target) / r_terms) ** (1.0 / (2 * factors_per_term))
            for p in self._factors():
                nn.init.normal_(p, 0.0, std)
        if self.bias is not None:
            nn.init.zeros_(self.bias)

    def _factors(self) -> list[nn.Parameter]:
        return [p for n, p in self.named_parameters(recurse=False) if n not in ("bias", "tail")]

    def _inner(self, index: int) -> torch.Tensor:
        raise NotImplementedError

    def composed_weight(self) -> torch.Tensor:
        """The dense weight this layer applies."""
        w1, w2 = self._inner(1), self._inner(2)
        if self.use_tanh:
            w1, w2 = torch.tanh(w1), torch.tanh(w2)
        return w1 * (w2 + 1.0) if self.personal else w1 * w2

    def factor_params(self) -> int:
        """Trainable factor entries (no bias)."""
        return sum(p.numel() for p in self._factors())


class FedParaLinear(_FedPara):
    """``y = x Wᵀ + b`` with ``W = (X1 Y1ᵀ) ⊙ (X2 Y2ᵀ)`` (or ``W1 ⊙ (W2 + 1)`` if personal); with
    ``blocks``/``block`` the product is the folded ``blocks·out × block`` matrix and a dense ``tail``
    holds the inputs after the blocks."""

    def __init__(self, in_features: int, out_features: int, rank: int | None = None,
                 gamma: float | None = None, tanh: bool = False, bias: bool = True,
                 personal: bool = False, blocks: int = 1, block: int = 0) -> None:
        super().__init__()
        self.in_features = _positive_int("in_features", in_features)
        self.out_features = _positive_int("out_features", out_features)
        self.blocks, self.block = blocks, block
        rows, cols, tail = folded_shape(out_features, in_features, blocks, block)
        self.rank = _resolve_rank(rows, cols, rank, gamma, None)
        self.use_tanh, self.personal = bool(tanh), bool(personal)
        r = self.rank
        for i in (1, 2):
            setattr(self, f"x{i}", nn.Parameter(torch.empty(rows, r)))
            setattr(self, f"y{i}", nn.Parameter(torch.empty(cols, r)))
        self.tail = nn.Parameter(torch.empty(out_features, tail)) if tail else None
        self.bias = nn.Parameter(torch.empty(out_features)) if bias else None
        self._init_factors(in_features, 2, r)
        if self.tail is not None:  # dense: the variance the composed weight starts with
            nn.init.normal_(self.tail, 0.0, math.sqrt(INIT_GAIN2 / in_features))

    def _inner(self, index: int) -> torch.Tensor:
        return getattr(self, f"x{index}") @ getattr(self, f"y{index}").t()

    def composed_weight(self) -> torch.Tensor:
        return unfold_weight(super().composed_weight(), self.out_features, self.blocks, self.block, self.tail)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.linear(x, self.composed_weight(), self.bias)

    def to_dense(self) -> nn.Linear:
        """An ``nn.Linear`` computing exactly this layer."""
        return dense_linear(self.composed_weight(), self.bias)

    def extra_repr(self) -> str:
        fold = f", blocks={self.blocks}, block={self.block}" if self.block else ""
        return (f"in={self.in_features}, out={self.out_features}, rank={self.rank}, "
                f"tanh={self.use_tanh}, personal={self.personal}{fold}")


class _FedParaConv(_FedPara):
    """Conv with ``W = (T1 ×1 X1 ×2 Y1) ⊙ (T2 ×1 X2 ×2 Y2)`` (Proposition 3), cores ``T`` of
    ``R × R`` and the kernel's ``dims`` axes; the subclasses name the convolution."""

    dims: int
    _equation: str  # the einsum composing one term from T, X and Y
    _conv: Callable[..., torch.Tensor]
    _dense: Callable[..., nn.Module]

    def __init__(self, in_channels: int, out_channels: int, kernel_size: int,
                 rank: int | None = None, gamma: float | None = None, tanh: bool = False,
                 stride: int = 1, padding: int = 0, bias: bool = True,
                 personal: bool = False) -> None:
        super().__init__()
        self.in_channels = _positive_int("in_channels", in_channels)
        self.out_channels = _positive_int("out_channels", out_channels)
        self.kernel_size = _positive_int("kernel_size", kernel_size)
        self.stride, self.padding = _positive_int("stride", stride), int(padding)
        if self.padding < 0:
            raise ValueError(f"padding must be >= 0, got {padding!r}")
        self.rank = _resolve_rank(out_channels, in_channels, rank, gamma, kernel_size, self.dims)
        self.use_tanh, self.personal = bool(tanh), bool(personal)
        r, k = self.rank, kernel_size
        for i in (1, 2):
            setattr(self, f"t{i}", nn.Parameter(torch.empty(r, r, *(k,) * self.dims)))
            setattr(self, f"x{i}", nn.Parameter(torch.empty(out_channels, r)))
            setattr(self, f"y{i}", nn.Parameter(torch.empty(in_channels, r)))
        self.bias = nn.Parameter(torch.empty(out_channels)) if bias else None
        self._init_factors(in_channels * k ** self.dims, 3, r * r)

    def _inner(self, index: int) -> torch.Tensor:
        t, x, y = (getattr(self, f"{n}{index}") for n in ("t", "x", "y"))
        return torch.einsum(self._equation, t, x, y)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return type(self)._conv(x, self.composed_weight(), self.bias, self.stride, self.padding)

    def to_dense(self) -> nn.Module:
        """A plain torch convolution computing exactly this layer."""
        return type(self)._dense(self.composed_weight(), self.bias, self.stride, self.padding)

    def extra_repr(self) -> str:
        return (f"in={self.in_channels}, out={self.out_channels}, kernel={self.kernel_size}, "
                f"stride={self.stride}, padding={self.padding}, rank={self.rank}, "
                f"tanh={self.use_tanh}, personal={self.personal}")


class FedParaConv2d(_FedParaConv):
    """A ``k × k`` conv2d with Proposition 3's factors (cores ``R × R × k × k``)."""

    dims, _equation, _conv, _dense = 2, "abhw,oa,ib->oihw", F.conv2d, dense_conv2d


class FedParaConv1d(_FedParaConv):
    """Proposition 3's form with one kernel axis: cores ``R × R × k``, ``2R(O + I + R k)`` factor
    parameters."""

    dims, _equation, _conv, _dense = 1, "abk,oa,ib->oik", F.conv1d, dense_conv1d


def personal_names(model: nn.Module) -> list[str]:
    """State names of the device-only factors (``W2``) of every personal FedPara layer."""
    out = []
    for prefix, module in model.named_modules():
        if isinstance(module, _FedPara) and module.personal:
            out += [f"{prefix}.{n}" if prefix else n for n in _PERSONAL if hasattr(module, n)]
    return out


def precompose(model: nn.Module) -> nn.Module:
    """A deep copy of ``model`` with every module that has ``to_dense()`` replaced by it."""
    dense = copy.deepcopy(model)

    def replace(parent: nn.Module) -> None:
        for name, child in parent.named_children():
            to_dense = getattr(child, "to_dense", None)
            if callable(to_dense):
                setattr(parent, name, to_dense())
            else:
                replace(child)

    if callable(getattr(dense, "to_dense", None)):
        return dense.to_dense()
    replace(dense)
    return dense


# ----------------------------------------------------------------- spec layer types
def _flags(layer: dict) -> dict:
    return {"rank": layer["rank"], "tanh": layer["tanh"], "bias": layer["bias"],
            "personal": layer["personal"]}


def linear_params(layer: dict) -> int:
    """Parameters of a (validated) ``fedpara_linear`` layer: factors, tail and bias."""
    rows, cols, tail = folded_shape(layer["out"], layer["in"], layer["blocks"], layer["block"])
    return fedpara_weight_params(rows, cols, layer["rank"]) + layer["out"] * (tail + layer["bias"])


def _validate_linear(layer: dict) -> None:
    try:
        folded_shape(layer["out"], layer["in"], layer["blocks"], layer["block"])
    except ValueError as exc:
        raise SpecError(f"fedpara_linear: {exc}") from None


def _linear_out(layer: dict, shape: Shape) -> Shape:
    return LAYER_TYPES["linear"].out_shape(layer, shape)  # type: ignore[misc]


def _conv_out(layer: dict, shape: Shape) -> Shape:
    return LAYER_TYPES["conv2d"].out_shape({**layer, "groups": 1}, shape)  # type: ignore[misc]


def _conv_flops(layer: dict, shape: Shape) -> int:
    return LAYER_TYPES["conv2d"].flops({**layer, "groups": 1}, shape)  # type: ignore[misc]


_COMMON = {"out": int_field(1, MAX_CHANNELS), "rank": int_field(1, MAX_RANK),
           "bias": bool_field(True), "tanh": bool_field(False), "personal": bool_field(False)}

register_layer(
    "fedpara_linear",
    lambda a: FedParaLinear(a["in"], a["out"], blocks=a["blocks"], block=a["block"], **_flags(a)),
    _validate_linear, _linear_out, linear_params,
    lambda a, s: 2 * a["in"] * a["out"],
    schema={"in": int_field(1, 1 << 24), "blocks": int_field(1, 4096, 1), "block": int_field(0, 1 << 24, 0),
            **_COMMON})

register_layer(
    "fedpara_conv2d",
    lambda a: FedParaConv2d(a["in"], a["out"], a["kernel"], stride=a["stride"],
                            padding=a["padding"], **_flags(a)),
    None, _conv_out,
    lambda a: fedpara_weight_params(a["out"], a["in"], a["rank"], a["kernel"]) + a["out"] * a["bias"],
    _conv_flops,
    schema={"in": int_field(1, MAX_CHANNELS), "kernel": int_field(1, 15),
            "stride": int_field(1, 15, 1), "padding": int_field(0, 15, 0), **_COMMON})

register_layer(
    "fedpara_conv1d",
    lambda a: FedParaConv1d(a["in"], a["out"], a["kernel"], stride=a["stride"],
                            padding=a["padding"], **_flags(a)),
    None, lambda a, s: LAYER_TYPES["conv1d"].out_shape({**a, "groups": 1}, s),  # type: ignore[misc]
    lambda a: fedpara_weight_params(a["out"], a["in"], a["rank"], a["kernel"], dims=1) + a["out"] * a["bias"],
    lambda a, s: LAYER_TYPES["conv1d"].flops({**a, "groups": 1}, s),  # type: ignore[misc]
    schema={"in": int_field(1, MAX_CHANNELS), "kernel": int_field(1, 63),
            "stride": int_field(1, 63, 1), "padding": int_field(0, 63, 0), **_COMMON})
