"""A linear layer's weight folded by blocks of its inputs, for the factorised heads of FedPara and FDNNC.

MiniRocket's head reads ``blocks`` equal blocks of ``block`` features (one block per kernel, its
dilations and biases within it), then ``in − blocks·block`` more (the log scales of `series_norm`).
Its ``out × in`` weight has one row per class, so a factorisation of it saves nothing (rank 1 already
costs ``out + in`` of the dense ``out·in``). Folded, the ``out × blocks·block`` part is the
``blocks·out × block`` matrix whose row ``k·out + c`` holds class ``c``'s weights on block ``k`` (a
narrower network's blocks are its leading rows), and the columns after the blocks stay a dense
``tail``: a factorisation of the folded matrix can reach full rank at a fraction of the parameters.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from edge_sdk.models.minirocket import layer_plan

__all__ = ["folded_shape", "fold_weight", "unfold_weight", "head_fold"]


def folded_shape(out: int, inp: int, blocks: int = 1, block: int = 0) -> tuple[int, int, int]:
    """``(rows, columns, tail)`` of a linear layer's product matrix and its dense tail: ``(out, in, 0)``
    unfolded, ``(blocks·out, block, in − blocks·block)`` folded (``block = 0``: unfolded)."""
    if block == 0:
        if blocks != 1:
            raise ValueError(f"blocks={blocks} needs the block's size (block > 0)")
        return out, inp, 0
    if blocks < 1 or block < 1 or blocks * block > inp:
        raise ValueError(f"a fold of {blocks} blocks of {block} does not fit {inp} inputs")
    return blocks * out, block, inp - blocks * block


def unfold_weight(product: Any, out: int, blocks: int, block: int, tail: Any = None) -> Any:
    """The ``out × in`` weight of a folded ``product`` (``blocks·out × block``) and its ``tail``
    (``out × rest`` or None); a torch tensor or a numpy array, as given. Unfolded (``block = 0``):
    ``product`` itself."""
    if block == 0:
        return product
    if isinstance(product, torch.Tensor):
        weight = product.reshape(blocks, out, block).permute(1, 0, 2).reshape(out, blocks * block)
        return weight if tail is None else torch.cat([weight, tail], dim=1)
    weight = np.asarray(product).reshape(blocks, out, block).transpose(1, 0, 2).reshape(out, blocks * block)
    return weight if tail is None else np.concatenate([weight, np.asarray(tail)], axis=1)


def fold_weight(weight: np.ndarray, blocks: int, block: int) -> tuple[np.ndarray, np.ndarray | None]:
    """The inverse of `unfold_weight`: ``(product, tail)`` of an ``out × in`` weight (tail None when
    the blocks cover every input; ``(weight, None)`` unfolded)."""
    if block == 0:
        return weight, None
    out, inp = weight.shape
    rows, cols, rest = folded_shape(out, inp, blocks, block)
    product = weight[:, :blocks * block].reshape(out, blocks, block).transpose(1, 0, 2).reshape(rows, cols)
    return np.ascontiguousarray(product), (np.ascontiguousarray(weight[:, blocks * block:]) if rest else None)


def head_fold(spec: dict) -> dict[str, int]:
    """The fold of a ``minirocket`` network's head (``blocks``: its kept kernels, ``block``: the features
    of one); ``{}`` for any other network."""
    rocket = next((layer for layer in spec["layers"] if layer["type"] == "minirocket"), None)
    if rocket is None:
        return {}
    plan = layer_plan(rocket)
    return {"blocks": plan.kernels, "block": plan.per_kernel}
