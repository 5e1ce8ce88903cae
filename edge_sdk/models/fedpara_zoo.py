"""Zoo networks with every conv/linear layer factorised: FedPara, pFedPara and naive low-rank.

:func:`fedpara_spec` takes a zoo family (``cnn4``, ``resnet_small``, ``mlp``) at width
``p`` and replaces every ``conv2d`` and ``conv1d`` (``groups = 1``) and every ``linear`` — stem,
shortcut projections and classifier included — by a ``fedpara_*`` layer. Ranks come
from the *full-width* layer at the same position and the layer's ``γ`` (one ``gamma``
for all layers, ``layer_gammas={index: γ}`` overrides by position in walk order), so
every width has the same ranks and cores: a width-``p`` network holds the first
``ceil(p·m)`` rows of each ``X`` and ``ceil(p·n)`` rows of each ``Y``, and its composed
weights are exactly the top-left blocks of the full network's. ``minirocket``'s head is folded by
kernel (`edge_sdk.models.fedpara`: its rows ``kernel·classes + class``, its columns one kernel's
features; a narrower width keeps the leading kernels' rows), its rank from the folded full-width matrix.
:func:`naive_lowrank_spec` does the same with ``W = X Yᵀ`` layers whose parameter
count matches FedPara's at the same ``γ``.
"""
from __future__ import annotations

from typing import Any, Callable, Mapping, Sequence

from edge_sdk.models.fedpara import DEFAULT_GAMMA, FEDPARA_TYPES, rank_from_gamma
from edge_sdk.models.folding import folded_shape, head_fold
from edge_sdk.models.lowrank_naive import NAIVE_TYPES, naive_rank_matching
from edge_sdk.models.spec import validate_spec
from edge_sdk.models.zoo import model_for_dataset

__all__ = ["fedpara_spec", "naive_lowrank_spec", "factorisable_count", "layer_ranks"]

_Maker = Callable[[dict, dict, int], dict]  # (full-width layer, width-p layer, index) -> new layer


def _factorisable(layer: dict) -> bool:
    return layer["type"] == "linear" or (layer["type"] in ("conv1d", "conv2d") and layer.get("groups", 1) == 1)


def _walk(full: list[dict], layers: list[dict], make: _Maker, counter: list[int]) -> list[dict]:
    out = []
    for ref, layer in zip(full, layers, strict=True):
        if _factorisable(ref):
            out.append(make(ref, layer, counter[0]))
            counter[0] += 1
            continue
        new = dict(layer)
        for key, value in ref.items():
            if isinstance(value, list) and all(isinstance(v, dict) for v in value):
                new[key] = _walk(value, layer[key], make, counter)
        out.append(new)
    return out


def _gammas(gamma: float, layer_gammas: Mapping[int, float] | None, count: int) -> list[float]:
    for g in [gamma, *(layer_gammas or {}).values()]:
        if isinstance(g, bool) or not isinstance(g, (int, float)) or not 0.0 <= g <= 1.0:
            raise ValueError(f"gamma must be a number in [0, 1], got {g!r}")
    bad = [i for i in (layer_gammas or {}) if type(i) is not int or not 0 <= i < count]
    if bad:
        raise ValueError(f"layer_gammas: indices {bad} out of range; the network has {count} "
                         f"factorised layers (0..{count - 1})")
    return [float((layer_gammas or {}).get(i, gamma)) for i in range(count)]


def _base(family: str, input_shape: Sequence[int], num_classes: int, width: float,
          zoo_kw: dict[str, Any]) -> tuple[dict, dict]:
    full = model_for_dataset(family, input_shape, num_classes, width=1.0, **zoo_kw)
    return full, model_for_dataset(family, input_shape, num_classes, width=width, **zoo_kw)


def factorisable_count(family: str, input_shape: Sequence[int], num_classes: int, **zoo_kw: Any) -> int:
    """How many layers of the family's network get factorised (the valid ``layer_gammas`` keys)."""
    full = model_for_dataset(family, input_shape, num_classes, **zoo_kw)
    counter = [0]
    _walk(full["layers"], full["layers"], lambda a, b, i: b, counter)
    return counter[0]


def _kernel(layer: dict) -> dict[str, int | None]:
    """The ``kernel`` and ``dims`` of a layer's rank formulas (``kernel=None``: a linear layer)."""
    if layer["type"] in ("conv1d", "conv2d"):
        return {"kernel": layer["kernel"], "dims": 1 if layer["type"] == "conv1d" else 2}
    return {"kernel": None}


#: the factorised layer type that replaces each dense one
_FEDPARA = dict(zip(("linear", "conv2d", "conv1d"), FEDPARA_TYPES, strict=True))
_NAIVE = dict(zip(("linear", "conv2d", "conv1d"), NAIVE_TYPES, strict=True))


def _shape_keys(layer: dict) -> dict[str, Any]:
    keys = {"in": layer["in"], "out": layer["out"], "bias": layer.get("bias", True)}
    if layer["type"] in ("conv1d", "conv2d"):
        keys.update(kernel=layer["kernel"], stride=layer.get("stride", 1),
                    padding=layer.get("padding", 0))
    return keys


def _finish(width_spec: dict, layers: list[dict], name: str, meta: dict) -> dict:
    return validate_spec({**width_spec, "layers": layers,
                          "name": f"{name}-{width_spec.get('name', 'net')}",
                          "meta": {**width_spec.get("meta", {}), **meta}})


def fedpara_spec(family: str, input_shape: Sequence[int], num_classes: int,
                 gamma: float = DEFAULT_GAMMA, *, width: float = 1.0, tanh: bool = False,
                 personal: bool = False, layer_gammas: Mapping[int, float] | None = None,
                 **zoo_kw: Any) -> dict:
    """The FedPara (``personal=True``: pFedPara) network of a zoo family at ``width``."""
    full, spec = _base(family, input_shape, num_classes, width, zoo_kw)
    gammas = _gammas(gamma, layer_gammas, factorisable_count(family, input_shape, num_classes, **zoo_kw))

    full_fold, fold = head_fold(full), head_fold(spec)

    def make(ref: dict, layer: dict, i: int) -> dict:
        folded = fold if layer["type"] == "linear" else {}  # minirocket's head, its one linear layer
        if folded:
            rows, cols, _ = folded_shape(ref["out"], ref["in"], **full_fold)
            rank = rank_from_gamma(rows, cols, gammas[i])
        else:
            rank = rank_from_gamma(ref["out"], ref["in"], gammas[i], **_kernel(ref))
        return {"type": _FEDPARA[layer["type"]], **_shape_keys(layer), "rank": rank, "tanh": bool(tanh),
                "personal": bool(personal), **folded}

    layers = _walk(full["layers"], spec["layers"], make, [0])
    meta = {"fedpara_gamma": float(gamma), "fedpara_width": float(width),
            "fedpara_personal": bool(personal), "fedpara_tanh": bool(tanh)}
    return _finish(spec, layers, "pfedpara" if personal else "fedpara", meta)


def naive_lowrank_spec(family: str, input_shape: Sequence[int], num_classes: int,
                       gamma: float = DEFAULT_GAMMA, *, width: float = 1.0,
                       layer_gammas: Mapping[int, float] | None = None, **zoo_kw: Any) -> dict:
    """The ``W = X Yᵀ`` network with FedPara's parameter count at the same ``γ``."""
    full, spec = _base(family, input_shape, num_classes, width, zoo_kw)
    gammas = _gammas(gamma, layer_gammas, factorisable_count(family, input_shape, num_classes, **zoo_kw))

    def make(ref: dict, layer: dict, i: int) -> dict:
        kernel = _kernel(ref)
        fedpara_rank = rank_from_gamma(ref["out"], ref["in"], gammas[i], **kernel)
        rank = naive_rank_matching(ref["out"], ref["in"], fedpara_rank, **kernel)
        return {"type": _NAIVE[layer["type"]], **_shape_keys(layer), "rank": rank}

    layers = _walk(full["layers"], spec["layers"], make, [0])
    return _finish(spec, layers, "lowrank", {"lowrank_gamma": float(gamma), "lowrank_width": float(width)})


def layer_ranks(spec: dict) -> list[int]:
    """The rank of every factorised layer of ``spec``, in walk order."""
    ranks: list[int] = []

    def visit(layers: list[dict]) -> None:
        for layer in layers:
            if layer["type"] in FEDPARA_TYPES or layer["type"] in NAIVE_TYPES:
                ranks.append(layer["rank"])
            for value in layer.values():
                if isinstance(value, list) and all(isinstance(v, dict) for v in value):
                    visit(value)

    visit(spec["layers"])
    return ranks
