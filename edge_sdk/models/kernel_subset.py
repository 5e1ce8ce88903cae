"""A MiniRocket model cut to its first ``kernels`` kernels: REFT's pruning level as a feature subset.

MiniRocket's transform is fixed, so "pruning" it is choosing which features a device computes. A
layer of ``k`` kernels keeps the first ``k`` of `edge_sdk.models.minirocket.KERNEL_ORDER` at every
dilation; its PPV features are a prefix of the wider layer's (the same biases, the same quantile
points), then come the log scales ``series_norm`` appends. The classifier (and a ``batchnorm1d``
before it) keeps the columns of those features, so the subset computes exactly what the wider model
computes with the other features' columns set to zero, at ``k / kernels`` of its transform's FLOPs.

The subset is the prefix rather than the kernels of largest L1 norm in the classifier: every device
then computes a prefix of one fleet-wide feature layout (the biases fitted once for all) and a
narrower layer is a plain ``kernels`` count in the spec.
"""

from __future__ import annotations

import copy
from typing import Mapping

import numpy as np

from edge_sdk.models.minirocket import layer_plan
from edge_sdk.models.spec import build_model, validate_spec
from edge_sdk.tensors import load_numpy_state

__all__ = ["is_minirocket", "feature_columns", "kernel_subset"]


def is_minirocket(spec: Mapping) -> bool:
    """Whether ``spec``'s first layer is a ``minirocket`` transform."""
    layers = spec.get("layers") if isinstance(spec, Mapping) else None
    return bool(layers) and isinstance(layers[0], Mapping) and layers[0].get("type") == "minirocket"


def _checked(spec: dict) -> dict:
    validate_spec(spec)
    if not is_minirocket(spec):
        raise ValueError("a kernel subset needs a model whose first layer is minirocket")
    kinds = [layer["type"] for layer in spec["layers"][1:]]
    if kinds not in (["linear"], ["batchnorm1d", "linear"]):
        raise ValueError(f"a kernel subset needs the classifier straight after the minirocket features (a "
                         f"batchnorm1d between them at most), got {' -> '.join(['minirocket', *kinds])}")
    return spec


def feature_columns(spec: dict, kernels: int) -> np.ndarray:
    """The indices, among ``spec``'s features, of the features its first ``kernels`` kernels keep
    (their PPV features, then every ``series_norm`` log scale)."""
    rocket = _checked(spec)["layers"][0]
    plan = layer_plan(rocket)
    if type(kernels) is not int or not 1 <= kernels <= plan.kernels:
        raise ValueError(f"a subset of a {plan.kernels}-kernel minirocket keeps 1 to {plan.kernels} kernels, "
                         f"got {kernels!r}")
    tail = rocket["in"] if rocket.get("series_norm") else 0
    return np.concatenate([np.arange(kernels * plan.per_kernel), plan.features + np.arange(tail)])


def kernel_subset(spec: dict, tensors: Mapping[str, np.ndarray],
                  kernels: int) -> tuple[dict, dict[str, np.ndarray]]:
    """``spec`` cut to its first ``kernels`` kernels, and its ``tensors`` (a state by name) cut with it:
    the biases' prefix, the kept columns of the classifier and of a batch norm before it."""
    columns = feature_columns(spec, kernels)
    narrow = copy.deepcopy(spec)
    narrow["layers"][0]["kernels"] = kernels
    for layer in narrow["layers"][1:]:
        layer["channels" if layer["type"] == "batchnorm1d" else "in"] = len(columns)
    ppv = kernels * layer_plan(narrow["layers"][0]).per_kernel
    classifier = f"layers.{len(spec['layers']) - 1}.weight"
    norm = "layers.1." if spec["layers"][1]["type"] == "batchnorm1d" else None
    out: dict[str, np.ndarray] = {}
    for name, value in tensors.items():
        value = np.asarray(value)
        if name == "layers.0.biases":  # one per PPV feature: the kept kernels' are the prefix
            out[name] = np.array(value[:ppv], dtype=value.dtype)
        elif name == classifier:
            out[name] = np.ascontiguousarray(value[:, columns])
        elif norm is not None and name.startswith(norm) and value.ndim == 1:  # not num_batches_tracked
            out[name] = np.ascontiguousarray(value[columns])
        else:
            out[name] = np.array(value, copy=True)
    load_numpy_state(build_model(narrow), out)  # every name and shape the narrower model has
    return narrow, out
