"""One-shot structured pruning of spec models, on the coordinator only (REFT's variable pruning).

Capacity rule (Desai, Hilal, Eldardiry 2024): a device of measured ``F`` GFLOPS gets the pruning
ratio ``P = max(0, 1 - F / F_lambda)``; ``F_lambda`` is the operator's trade-off between traffic
and accuracy. Ratios are rounded *up* to configurable levels so one pruned model serves every
device of a level (and is computed once).

Pruning is L1-norm filter pruning of every conv and linear layer except the classifier,
dependency-aware (channels joined by a residual addition are pruned together), followed by a
physical shrink so the result has fewer parameters and FLOPs, not masks:

- ``nni``: NNI 3.0 ``L1NormPruner`` + ``ModelSpeedup``. NNI's own tracer fails on torch >= 2.2
  (``'NoneType' object has no attribute 'startswith'``, NNI issue #5768); passing
  ``graph_module=torch.fx.symbolic_trace(model)`` to ``ModelSpeedup`` works around it.
- ``torch-pruning``: the fallback where NNI does not install (no aarch64 wheel): the L1 norm of
  each group's root filters, the same per-layer kept counts as NNI (``ceil(out * (1 - P))``,
  rounded up to whole GroupNorm groups).

The shrunk network is turned back into a spec (:func:`derive_spec`: widths read from the shrunk
modules), rebuilt from that data and loaded by name, and checked to compute exactly what the
shrunk module computes. Only spec data and named tensors travel to devices; nothing is pickled.
"""

from __future__ import annotations

import contextlib
import copy
import functools
import importlib.util
import io
import logging
import math
import warnings
from dataclasses import dataclass
from typing import Iterator, Mapping

import numpy as np
import torch
from torch import nn

from edge_sdk.methods.settings.pruning import BACKENDS, MAX_RATIO
from edge_sdk.models.kernel_subset import is_minirocket, kernel_subset
from edge_sdk.models.minirocket import layer_plan
from edge_sdk.models.spec import build_model, count_flops, count_params, validate_spec
from edge_sdk.tensors import load_numpy_state, state_to_numpy

__all__ = ["KERNEL_SUBSET", "PruneResult", "pruning_ratio", "round_to_level", "level_label", "describe_level",
           "capacity_level", "available_backends", "resolve_backend", "prune_spec", "derive_spec"]

_FREE = frozenset({"relu", "dropout", "flatten", "global_avgpool", "maxpool2d", "avgpool2d", "maxpool1d", "avgpool1d",
                   "series_norm"})  # series_norm: parameter-free, on the input's channels (never pruned)
#: the spec's prunable layer types and their modules: convolutions, linear layers and the norms after them
_MODULES: dict[str, type[nn.Module]] = {"conv2d": nn.Conv2d, "conv1d": nn.Conv1d, "linear": nn.Linear,
                                        "batchnorm2d": nn.BatchNorm2d, "batchnorm1d": nn.BatchNorm1d,
                                        "groupnorm": nn.GroupNorm}
_EPS = 1e-9
#: the "backend" that prunes a MiniRocket model: its first kernels kept (`edge_sdk.models.kernel_subset`)
KERNEL_SUBSET = "kernel-subset"


# ----------------------------------------------------------------- capacity -> level
def pruning_ratio(gflops: float, f_lambda: float) -> float:
    """``max(0, 1 - gflops / f_lambda)``: the share of a model a device of ``gflops`` cannot afford."""
    for name, value in (("gflops", gflops), ("f_lambda", f_lambda)):
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) \
                or value <= 0:
            raise ValueError(f"{name} must be a finite number > 0, got {value!r}")
    return max(0.0, 1.0 - gflops / f_lambda)


def round_to_level(ratio: float, levels: tuple[float, ...] | None) -> float:
    """The smallest level >= ``ratio`` (never a bigger model than the device can afford), or the
    largest level when ``ratio`` exceeds them all; with ``levels=None`` round up to 0.01."""
    if not math.isfinite(ratio) or not 0 <= ratio <= 1:
        raise ValueError(f"ratio must be in [0, 1], got {ratio!r}")
    if levels is None:
        return min(MAX_RATIO, math.ceil(ratio * 100 - 1e-6) / 100)
    for level in levels:
        if level >= ratio - _EPS:
            return level
    return levels[-1]


def level_label(level: float) -> str:
    """The report label of a pruning level: ``p0.9``, ``p0`` for the dense model."""
    return f"p{round(level, 4):g}"


def describe_level(label: str) -> str:
    """A pruning level's label as a person reads it: ``p0.9`` -> ``90% pruned``, ``p0`` -> ``unpruned``."""
    try:
        level = float(label.removeprefix("p"))
    except ValueError:
        return label
    return "unpruned" if level == 0 else f"{level:.0%} pruned"


def capacity_level(gflops: float, f_lambda: float, levels: tuple[float, ...] | None) -> float:
    """The pruning level of a device of ``gflops`` (``round_to_level(pruning_ratio(...))``)."""
    return round_to_level(pruning_ratio(gflops, f_lambda), levels)


# ----------------------------------------------------------------- backends
@functools.lru_cache(maxsize=None)
def _importable(backend: str) -> bool:
    module = {"nni": "nni", "torch-pruning": "torch_pruning"}[backend]
    if importlib.util.find_spec(module) is None:
        return False
    try:
        with _quiet():
            if backend == "nni":
                import nni.compression.pruning  # noqa: F401
                import nni.compression.speedup  # noqa: F401
            else:
                import torch_pruning  # noqa: F401
    except Exception:  # a broken install counts as absent
        return False
    return True


def available_backends() -> list[str]:
    """The pruning backends importable here, preferred first."""
    return [b for b in BACKENDS if _importable(b)]


def resolve_backend(backend: str) -> str:
    """``auto`` -> the first available backend; a named one must be installed."""
    if backend == "auto":
        found = available_backends()
        if not found:
            raise RuntimeError("no pruning backend: pip install nni (x86-64) or torch-pruning")
        return found[0]
    if backend not in BACKENDS:
        raise ValueError(f"pruning backend must be auto, {' or '.join(BACKENDS)}; got {backend!r}")
    if not _importable(backend):
        raise RuntimeError(f"pruning backend {backend!r} is not installed here")
    return backend


@contextlib.contextmanager
def _quiet() -> Iterator[None]:
    """Silence NNI's prints, warnings and INFO logs."""
    nni_log = logging.getLogger("nni")
    level = nni_log.level
    nni_log.setLevel(logging.ERROR)
    try:
        with warnings.catch_warnings(), contextlib.redirect_stdout(io.StringIO()):
            warnings.simplefilter("ignore")
            yield
    finally:
        nni_log.setLevel(level)


def _kept(out: int, ratio: float, block: int) -> int:
    """Channels NNI keeps of ``out`` at ``ratio``, in whole blocks of ``block`` (GroupNorm groups)."""
    keep = max(1, math.ceil(out * (1 - ratio) - _EPS))
    if block > 1 and out % block == 0:
        keep = min(out, max(block, math.ceil(keep / block) * block))
    return keep


def _prune_nni(model: nn.Module, names: list[str], ratio: float, dummy: torch.Tensor,
               coupled: bool) -> None:
    from nni.compression.pruning import L1NormPruner
    from nni.compression.speedup import ModelSpeedup
    from nni.compression.utils import auto_set_denpendency_group_ids  # NNI's spelling

    config = [{"op_names": names, "sparse_ratio": ratio}]
    if coupled:  # NNI's JIT-traced dependency analysis is slow: only where channels are coupled
        config = auto_set_denpendency_group_ids(model, config, dummy)
    pruner = L1NormPruner(model, config)
    _, masks = pruner.compress()
    pruner.unwrap_model()
    # ModelSpeedup logs ~100 INFO lines per model to a logger it forces to INFO unless given one:
    # ours shows them only at debug level (edgefl -vv)
    chatter = logging.getLogger(f"{__name__}.nni_speedup")
    # (and logs "Has not supported replacing module with type: MaxPool1d" as an error, though a pool
    # has nothing to shrink; a module left unshrunk that mattered fails `derive_spec` or the check
    # that the rebuilt network computes the same)
    chatter.setLevel(logging.DEBUG if logging.getLogger().isEnabledFor(logging.DEBUG) else logging.CRITICAL)
    ModelSpeedup(model, dummy, masks, graph_module=torch.fx.symbolic_trace(model), logger=chatter).speedup_model()


def _prune_tp(model: nn.Module, names: list[str], ratio: float, dummy: torch.Tensor,
              classifier: nn.Module) -> None:
    import torch_pruning as tp

    block = math.lcm(*[m.num_groups for m in model.modules() if isinstance(m, nn.GroupNorm)] or [1])
    modules = dict(model.named_modules())
    ratios = {}
    for name in names:
        m = modules[name]
        conv = isinstance(m, (nn.Conv1d, nn.Conv2d))
        out = m.out_channels if conv else m.out_features
        keep = _kept(out, ratio, block if conv else 1)
        ratios[m] = max(0.0, 1 - (keep + 0.5) / out)  # torch-pruning keeps floor(out * (1 - r))
    importance = tp.importance.MagnitudeImportance(p=1, normalizer=None, group_reduction="first",
                                                   target_types=[nn.Conv1d, nn.Conv2d, nn.Linear])
    tp.pruner.MetaPruner(model, dummy, importance=importance, pruning_ratio=ratio,
                         pruning_ratio_dict=ratios, ignored_layers=[classifier]).step()


# ----------------------------------------------------------------- spec <-> shrunk modules
def _check_prunable(layers: list[dict]) -> None:
    for layer in layers:
        kind = layer["type"]
        if kind == "residual":
            _check_prunable(layer["body"])
            _check_prunable(layer.get("shortcut", []))
        elif kind in ("conv1d", "conv2d") and layer.get("groups", 1) != 1:
            raise ValueError("cannot prune grouped convolutions (groups != 1)")
        elif kind not in _FREE | set(_MODULES):
            raise ValueError(f"cannot prune a model with {kind!r} layers")


def _kinds(layers: list[dict]) -> set[str]:
    kinds = set()
    for layer in layers:
        kinds.add(layer["type"])
        if layer["type"] == "residual":
            kinds |= _kinds(layer["body"]) | _kinds(layer.get("shortcut", []))
    return kinds


def _nni_cannot(layers: list[dict]) -> bool:
    """NNI 3.0's speedup fails on GroupNorm after Conv1d (UnBalancedGroupError; fine after Conv2d)."""
    return {"conv1d", "groupnorm"} <= _kinds(layers)


def _coupled(layers: list[dict]) -> bool:
    """Whether channels of different layers must be pruned together (residuals, GroupNorm groups)."""
    return any(layer["type"] in ("residual", "groupnorm") for layer in layers)


def _derive(layers: list[dict], seq: nn.Module, path: str) -> list[dict]:
    if not isinstance(seq, nn.Sequential) or len(seq) != len(layers):
        raise ValueError(f"{path}: the shrunk model no longer matches the spec")
    out = []
    for i, (layer, m) in enumerate(zip(layers, seq, strict=True)):
        new, kind = copy.deepcopy(layer), layer["type"]
        expect = _MODULES.get(kind)
        if expect is not None and not isinstance(m, expect):
            raise ValueError(f"{path}[{i}]: expected {expect.__name__}, found {type(m).__name__}")
        if kind in ("conv1d", "conv2d"):
            new["in"], new["out"] = int(m.in_channels), int(m.out_channels)
        elif kind == "linear":
            new["in"], new["out"] = int(m.in_features), int(m.out_features)
        elif kind in ("batchnorm1d", "batchnorm2d"):
            new["channels"] = int(m.num_features)
        elif kind == "groupnorm":
            new["channels"], new["groups"] = int(m.num_channels), int(m.num_groups)
        elif kind == "residual":
            new["body"] = _derive(layer["body"], m.body, f"{path}[{i}].body")
            new["shortcut"] = _derive(layer.get("shortcut", []), m.shortcut, f"{path}[{i}].shortcut")
        out.append(new)
    return out


def derive_spec(spec: dict, model: nn.Module) -> dict:
    """The spec of a physically shrunk ``SpecModel`` (widths read from its modules), validated."""
    derived = copy.deepcopy(spec)
    derived["layers"] = _derive(spec["layers"], model.layers, "layers")
    return validate_spec(derived)


@dataclass(frozen=True)
class PruneResult:
    """A pruned model as data: its spec, its weights (by name) and which backend ran."""

    spec: dict
    tensors: dict[str, np.ndarray]
    backend: str  # "nni" | "torch-pruning" | "none" (ratio 0)
    ratio: float
    params: int
    flops: int


def prune_spec(spec: dict, tensors: Mapping[str, np.ndarray], ratio: float,
               backend: str = "auto") -> PruneResult:
    """L1-prune the network ``spec`` with weights ``tensors`` at ``ratio``; returns spec + weights.
    A MiniRocket model keeps the features of its first ``ceil(kernels·(1 − ratio))`` kernels instead
    (its transform has no weights to rank; `edge_sdk.models.kernel_subset`), whatever ``backend``."""
    if isinstance(ratio, bool) or not isinstance(ratio, (int, float)) or not 0 <= ratio <= MAX_RATIO:
        raise ValueError(f"ratio must be in [0, {MAX_RATIO}], got {ratio!r}")
    validate_spec(spec)
    if is_minirocket(spec):
        kernels = _kept(layer_plan(spec["layers"][0]).kernels, float(ratio), 1)  # as the pruner keeps channels
        narrow, weights = kernel_subset(spec, tensors, kernels)
        return PruneResult(narrow, weights, KERNEL_SUBSET, float(ratio), count_params(narrow), count_flops(narrow))
    _check_prunable(spec["layers"])
    if ratio == 0:
        weights = {k: np.array(v, dtype=np.float32) for k, v in tensors.items()}
        build = build_model(spec)
        load_numpy_state(build, weights)  # checks names and shapes
        return PruneResult(copy.deepcopy(spec), weights, "none", 0.0, count_params(spec), count_flops(spec))
    chosen = resolve_backend(backend)
    if chosen == "nni" and _nni_cannot(spec["layers"]):
        if backend == "auto" and _importable("torch-pruning"):
            chosen = "torch-pruning"
        else:
            raise ValueError("NNI cannot prune conv1d layers followed by groupnorm (its replacement of the "
                             "GroupNorm finds unbalanced groups); use the torch-pruning backend or batch norm")
    model = build_model(spec)
    load_numpy_state(model, tensors)
    model.eval()
    named = [(n, m) for n, m in model.named_modules() if isinstance(m, (nn.Conv1d, nn.Conv2d, nn.Linear))]
    classifier_name, classifier = named[-1]
    if not isinstance(classifier, nn.Linear) or classifier.out_features != spec["num_classes"]:
        raise ValueError("the model must end in a linear classifier")
    names = [n for n, _ in named if n != classifier_name]
    if not names:
        raise ValueError("nothing to prune: the model has no conv/linear layer besides the classifier")
    dummy = torch.randn((2, *spec["input_shape"]), generator=torch.Generator().manual_seed(0))
    with _quiet(), torch.random.fork_rng(devices=[]):
        if chosen == "nni":
            _prune_nni(model, names, float(ratio), dummy, _coupled(spec["layers"]))
        else:
            _prune_tp(model, names, float(ratio), dummy, classifier)
    model.eval()  # NNI's replacement modules come in training mode (BatchNorm would update)
    pruned_spec = derive_spec(spec, model)
    rebuilt = build_model(pruned_spec)
    weights = {k: np.array(v, dtype=np.float32) for k, v in state_to_numpy(model, copy=True).items()}
    load_numpy_state(rebuilt, weights)
    rebuilt.eval()
    with torch.no_grad():
        if not torch.allclose(rebuilt(dummy), model(dummy), rtol=1e-4, atol=1e-5):
            raise RuntimeError(f"{chosen}: the network rebuilt from the pruned spec computes "
                               "something else than the shrunk module")
    return PruneResult(pruned_spec, weights, chosen, float(ratio), count_params(pruned_spec),
                       count_flops(pruned_spec))
