"""Low-rank fully-connected layers (FDNNC, Li et al. 2022) and their SVD helpers.

A dense ``linear`` layer ``y = x Wᵀ + b`` with ``W`` of shape ``(out, in)`` becomes
two projections ``y = (x B) Aᵀ + b`` with ``A`` of shape ``(out, r)`` and ``B`` of
shape ``(in, r)``, so ``W ≈ A Bᵀ``. From a truncated SVD ``W ≈ U S Vᵀ`` the factors
are ``A = U S^½`` and ``B = V S^½`` (:func:`decompose`); :func:`compose` multiplies
them back. The spec layer type is ``lowrank_linear`` with keys ``in``, ``out``,
``rank`` and ``bias``; its parameters are named ``A``, ``B`` and ``bias``.
:func:`lowrank_spec` turns a dense spec into the compressed one, replacing each
top-level ``linear`` layer for which rank ``r`` actually saves parameters.

A MiniRocket head (one row per class: a rank-``r`` ``A Bᵀ`` of it saves nothing) is factorised
*folded* (`edge_sdk.models.folding`, keys ``blocks`` and ``block``): ``A Bᵀ`` is the
``blocks·out × block`` folded matrix, ``A`` of shape ``(blocks·out, r)``, ``B`` of shape
``(block, r)``, and the inputs after the blocks keep a dense ``tail`` (``out × rest``).
"""
from __future__ import annotations

import copy
import math

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from edge_sdk.models.folding import fold_weight, folded_shape, head_fold, unfold_weight
from edge_sdk.models.layers import SpecError, Shape, bool_field, int_field, register_layer

__all__ = ["LowRankLinear", "decompose", "compose", "decompose_layer", "compose_layer", "compressible",
           "lowrank_spec", "lowrank_layers", "factor_names"]


class LowRankLinear(nn.Module):
    """``y = x B Aᵀ + bias``: a rank-``rank`` fully-connected layer (``W = A Bᵀ``); folded
    (``block > 0``), ``W`` is `unfold_weight` of ``A Bᵀ`` and its ``tail``."""

    def __init__(self, in_features: int, out_features: int, rank: int, bias: bool = True,
                 blocks: int = 1, block: int = 0) -> None:
        super().__init__()
        self.in_features, self.out_features, self.rank = in_features, out_features, rank
        self.blocks, self.block = blocks, block
        rows, cols, rest = folded_shape(out_features, in_features, blocks, block)
        self.A = nn.Parameter(torch.empty(rows, rank))
        self.B = nn.Parameter(torch.empty(cols, rank))
        self.tail = nn.Parameter(torch.empty(out_features, rest)) if rest else None
        self.bias = nn.Parameter(torch.empty(out_features)) if bias else None
        # Var(A Bᵀ)_ij = r Var(A) Var(B) = 1 / (3 in): the variance of nn.Linear's default init.
        bound = math.sqrt(3.0) * (1.0 / (3.0 * in_features * rank)) ** 0.25
        nn.init.uniform_(self.A, -bound, bound)
        nn.init.uniform_(self.B, -bound, bound)
        if self.tail is not None:
            nn.init.uniform_(self.tail, -1 / math.sqrt(in_features), 1 / math.sqrt(in_features))
        if self.bias is not None:
            nn.init.uniform_(self.bias, -1 / math.sqrt(in_features), 1 / math.sqrt(in_features))

    def weight(self) -> torch.Tensor:
        """The dense ``out × in`` weight this layer applies."""
        return unfold_weight(self.A @ self.B.t(), self.out_features, self.blocks, self.block, self.tail)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.block:
            return F.linear(x, self.weight(), self.bias)
        y = (x @ self.B) @ self.A.t()
        return y + self.bias if self.bias is not None else y

    def extra_repr(self) -> str:
        fold = f", blocks={self.blocks}, block={self.block}" if self.block else ""
        return f"in={self.in_features}, out={self.out_features}, rank={self.rank}{fold}"


# ----------------------------------------------------------------- spec layer type
def _check(layer: dict) -> None:
    try:
        rows, cols, _ = folded_shape(layer["out"], layer["in"], layer["blocks"], layer["block"])
    except ValueError as exc:
        raise SpecError(f"lowrank_linear: {exc}") from None
    if layer["rank"] > min(rows, cols):
        raise SpecError(f"rank {layer['rank']} exceeds min(rows, columns) = {min(rows, cols)}"
                        f"{' of the folded matrix' if layer['block'] else ''}")


def _out(layer: dict, shape: Shape) -> Shape:
    if len(shape) != 1:
        raise SpecError(f"lowrank_linear needs a flat (F,) input, got shape {shape}; add 'flatten'")
    if shape[0] != layer["in"]:
        raise SpecError(f"lowrank_linear 'in' is {layer['in']} but the input has {shape[0]}")
    return (layer["out"],)


def _params(layer: dict) -> int:
    rows, cols, rest = folded_shape(layer["out"], layer["in"], layer["blocks"], layer["block"])
    return layer["rank"] * (rows + cols) + layer["out"] * (rest + layer["bias"])


register_layer(
    "lowrank_linear",
    lambda a: LowRankLinear(a["in"], a["out"], a["rank"], a["bias"], a["blocks"], a["block"]),
    _check, _out, _params,
    lambda a, s: 2 * a["in"] * a["out"] if a["block"] else 2 * a["rank"] * (a["in"] + a["out"]),
    schema={"in": int_field(1, 1 << 24), "out": int_field(1, 65536), "rank": int_field(1, 65536),
            "bias": bool_field(True), "blocks": int_field(1, 4096, 1), "block": int_field(0, 1 << 24, 0)})


# ----------------------------------------------------------------- SVD helpers
def _matrix(name: str, a: np.ndarray) -> np.ndarray:
    if not isinstance(a, np.ndarray) or a.ndim != 2 or a.size == 0 or a.dtype.kind != "f":
        raise ValueError(f"{name} must be a non-empty 2-D float array, got "
                         f"{getattr(a, 'shape', type(a).__name__)}")
    if not np.isfinite(a).all():
        raise ValueError(f"{name} contains NaN or Inf")
    return a.astype(np.float64)


def decompose(weight: np.ndarray, rank: int) -> tuple[np.ndarray, np.ndarray]:
    """Rank-``rank`` factors ``(A, B)`` of ``weight`` (out × in): ``A = U S^½``, ``B = V S^½``.

    ``A @ B.T`` is the best rank-``rank`` approximation of ``weight`` (Eckart–Young).
    Returns float32 arrays of shapes ``(out, rank)`` and ``(in, rank)``.
    """
    w = _matrix("weight", weight)
    if type(rank) is not int or not 1 <= rank <= min(w.shape):
        raise ValueError(f"rank must be an int in [1, {min(w.shape)}], got {rank!r}")
    u, s, vt = np.linalg.svd(w, full_matrices=False)
    root = np.sqrt(s[:rank])
    return ((u[:, :rank] * root).astype(np.float32), (vt[:rank].T * root).astype(np.float32))


def compose(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """``A @ B.T`` (out × in, float32) from factors of shapes ``(out, r)`` and ``(in, r)``."""
    a64, b64 = _matrix("A", a), _matrix("B", b)
    if a64.shape[1] != b64.shape[1]:
        raise ValueError(f"A has rank {a64.shape[1]} but B has rank {b64.shape[1]}")
    return (a64 @ b64.T).astype(np.float32)


def compose_layer(a: np.ndarray, b: np.ndarray, tail: np.ndarray | None, layer: dict) -> np.ndarray:
    """The dense ``out × in`` weight of a ``lowrank_linear`` spec ``layer`` from its factors (and tail)."""
    return unfold_weight(compose(a, b), layer["out"], layer.get("blocks", 1), layer.get("block", 0),
                         None if tail is None else np.asarray(tail, dtype=np.float32))


def decompose_layer(weight: np.ndarray, layer: dict) -> tuple[np.ndarray, np.ndarray, np.ndarray | None]:
    """``(A, B, tail)`` of a ``lowrank_linear`` spec ``layer`` for the dense ``weight`` (out × in): the SVD
    of its (folded) product matrix, the columns after the blocks as they are (None: no tail)."""
    product, tail = fold_weight(weight, layer.get("blocks", 1), layer.get("block", 0))
    a, b = decompose(np.ascontiguousarray(product), layer["rank"])
    return a, b, None if tail is None else tail.astype(np.float32)


def compressible(in_features: int, out_features: int, rank: int, blocks: int = 1, block: int = 0) -> bool:
    """True when rank ``rank`` (of the folded matrix, with ``block``) has fewer weights than the
    dense ``out × in`` matrix."""
    rows, cols, rest = folded_shape(out_features, in_features, blocks, block)
    return rank <= min(rows, cols) and rank * (rows + cols) + out_features * rest < in_features * out_features


def _folds(spec: dict) -> dict[int, dict[str, int]]:
    """The fold of each top-level linear layer of ``spec``: a MiniRocket network's head, the first."""
    fold = head_fold(spec)
    first = next((i for i, layer in enumerate(spec["layers"]) if layer.get("type") == "linear"), None)
    return {first: fold} if fold and first is not None else {}


def lowrank_layers(spec: dict, rank: int) -> list[int]:
    """Indices of the top-level ``linear`` layers of ``spec`` that rank ``rank`` compresses (a
    MiniRocket network's head folded)."""
    if type(rank) is not int or rank < 1:
        raise ValueError(f"rank must be a positive int, got {rank!r}")
    folds = _folds(spec)
    return [i for i, layer in enumerate(spec["layers"])
            if layer.get("type") == "linear" and compressible(layer["in"], layer["out"], rank, **folds.get(i, {}))]


def lowrank_spec(spec: dict, rank: int) -> dict:
    """A copy of ``spec`` whose compressible top-level ``linear`` layers are ``lowrank_linear``.

    Other layers (convs, norms, small classifiers) are unchanged, so their parameter
    names and shapes are the same in both specs. Raises ValueError if nothing compresses.
    """
    indices = lowrank_layers(spec, rank)
    if not indices:
        raise ValueError(f"no fully-connected layer of {spec.get('name', 'the model')!r} is "
                         f"compressed by rank {rank}; lower the rank or widen the FC layers")
    out, folds = copy.deepcopy(spec), _folds(spec)
    for i in indices:
        dense = out["layers"][i]
        out["layers"][i] = {"type": "lowrank_linear", "in": dense["in"], "out": dense["out"],
                            "rank": rank, "bias": dense.get("bias", True), **folds.get(i, {})}
    out["name"] = f"{spec.get('name', 'model')}-lowrank{rank}"[:200]
    return out


def factor_names(model: nn.Module) -> tuple[list[str], list[str]]:
    """State names of every ``A`` and every ``B`` factor in ``model`` (in module order)."""
    a_names, b_names = [], []
    for prefix, module in model.named_modules():
        if isinstance(module, LowRankLinear):
            dot = f"{prefix}." if prefix else ""
            a_names.append(f"{dot}A")
            b_names.append(f"{dot}B")
    return a_names, b_names
