"""REFT's capacity rule and one-shot structured pruning (NNI and torch-pruning backends)."""

from __future__ import annotations

import math

import msgpack
import numpy as np
import pytest
import torch

from coordinator.strategies.pruning import (KERNEL_SUBSET, capacity_level, derive_spec, level_label, prune_spec,
                                           pruning_ratio, resolve_backend, round_to_level)
from edge_sdk.methods.settings.pruning import DEFAULT_LEVELS, parse_levels
from edge_sdk.models.spec import build_model, count_flops, count_params, validate_spec
from edge_sdk.models.kernel_subset import feature_columns
from edge_sdk.models.zoo import cnn4, minirocket, mlp, resnet_small
from edge_sdk.tensors import load_numpy_state, state_to_numpy
from tests.support.requirements import needs



def _weights(spec: dict, seed: int = 0) -> dict[str, np.ndarray]:
    torch.manual_seed(seed)
    return state_to_numpy(build_model(spec), copy=True)


def test_the_issue_example_holds() -> None:
    gflops = [10, 20, 40, 60, 100]
    assert [capacity_level(f, 100.0, DEFAULT_LEVELS) for f in gflops] == [0.9, 0.8, 0.6, 0.4, 0.0]
    assert [level_label(capacity_level(f, 100.0, DEFAULT_LEVELS)) for f in gflops] == \
        ["p0.9", "p0.8", "p0.6", "p0.4", "p0"]
    assert pruning_ratio(250.0, 100.0) == 0.0  # stronger than F_lambda: dense
    assert math.isclose(pruning_ratio(15.0, 100.0), 0.85)


def test_ratios_round_up_to_levels() -> None:
    levels = (0.0, 0.5, 0.9)
    assert round_to_level(0.3, levels) == 0.5  # never a bigger model than the device affords
    assert round_to_level(0.5, levels) == 0.5
    assert round_to_level(0.97, levels) == 0.9  # beyond the last level: the last level
    assert round_to_level(0.0, levels) == 0.0
    assert round_to_level(0.851, None) == 0.86 and round_to_level(0.999, None) == 0.99
    assert capacity_level(1.0, 100.0, DEFAULT_LEVELS) == 0.9


@pytest.mark.parametrize("bad", [0, -1.0, float("nan"), float("inf"), True, "10"])
def test_bad_capacity_inputs_raise(bad: object) -> None:
    with pytest.raises(ValueError):
        pruning_ratio(bad, 100.0)  # type: ignore[arg-type]
    with pytest.raises(ValueError):
        pruning_ratio(10.0, bad)  # type: ignore[arg-type]


def test_parse_levels() -> None:
    assert parse_levels("0.9, 0, 0.5,0.5") == (0.0, 0.5, 0.9)
    assert parse_levels("exact") is None
    for bad in ("", "a,b", "1.0", "-0.1", "nan"):
        with pytest.raises(ValueError):
            parse_levels(bad)


def test_ninety_percent_cnn4_is_physically_small_and_rebuilds_from_data() -> None:
    spec = cnn4()
    result = prune_spec(spec, _weights(spec), 0.9, backend="torch-pruning")
    assert result.backend == "torch-pruning"
    assert result.params <= 0.15 * count_params(spec)
    assert result.flops <= 0.15 * count_flops(spec)
    assert result.params == count_params(result.spec) == sum(a.size for a in result.tensors.values())
    # the spec is plain data: it survives msgpack and rebuilds exactly the pruned network
    spec2 = msgpack.unpackb(msgpack.packb(result.spec), raw=False)
    model = build_model(validate_spec(spec2))
    load_numpy_state(model, result.tensors)
    assert model(torch.randn(3, 1, 28, 28)).shape == (3, 10)
    convs = [layer for layer in result.spec["layers"] if layer["type"] == "conv2d"]
    assert [c["out"] for c in convs] == [4, 7, 7, 13]  # ceil(out * 0.1)
    assert result.spec["layers"][-1]["out"] == 10  # the classifier keeps every class


@needs("nni")
def test_nni_and_torch_pruning_agree_on_cnn4() -> None:
    spec = cnn4()
    weights = _weights(spec, seed=3)
    by_nni = prune_spec(spec, weights, 0.9, backend="nni")
    by_tp = prune_spec(spec, weights, 0.9, backend="torch-pruning")
    assert by_nni.backend == "nni" and resolve_backend("auto") == "nni"
    assert by_nni.spec == by_tp.spec
    for name, array in by_nni.tensors.items():  # the same L1 criterion keeps the same filters
        np.testing.assert_allclose(array, by_tp.tensors[name], rtol=0, atol=1e-6)
    # kept filters are the largest-L1 ones of the dense first conv
    dense = np.abs(weights["layers.0.weight"]).sum(axis=(1, 2, 3))
    kept = np.abs(by_nni.tensors["layers.0.weight"]).sum(axis=(1, 2, 3))
    np.testing.assert_allclose(np.sort(kept), np.sort(dense)[-4:], rtol=1e-6)


@needs("nni")
def test_nni_prunes_residual_channels_together_like_torch_pruning() -> None:
    spec = resnet_small(in_channels=1, image_size=12, channels=(8, 16), norm="batchnorm")
    weights = _weights(spec, seed=1)
    by_nni = prune_spec(spec, weights, 0.5, backend="nni")
    by_tp = prune_spec(spec, weights, 0.5, backend="torch-pruning")
    assert by_nni.spec == by_tp.spec  # same widths, residual groups included
    assert by_nni.params == by_tp.params < 0.35 * count_params(spec)
    model = build_model(by_nni.spec)
    load_numpy_state(model, by_nni.tensors)  # names and shapes match the rebuilt network


@pytest.mark.parametrize("norm", ["groupnorm", "batchnorm"])
def test_residual_channels_are_pruned_together(norm: str) -> None:
    spec = resnet_small(in_channels=1, image_size=28, norm=norm)
    result = prune_spec(spec, _weights(spec), 0.5, backend="torch-pruning")
    layers = result.spec["layers"]
    stem_out = layers[0]["out"]
    block = layers[3]  # identity shortcut: the body must end at the stem's width
    assert block["type"] == "residual" and block["shortcut"] == []
    assert [lay for lay in block["body"] if lay["type"] == "conv2d"][-1]["out"] == stem_out
    assert result.params < 0.4 * count_params(spec)
    if norm == "groupnorm":  # whole GroupNorm groups survive
        gns = [lay for lay in layers if lay["type"] == "groupnorm"]
        assert all(g["channels"] % g["groups"] == 0 for g in gns)


def test_mlp_hidden_layers_shrink_but_not_the_classifier() -> None:
    spec = mlp(64, 10, hidden=(100, 50))
    result = prune_spec(spec, _weights(spec), 0.6, backend="torch-pruning")
    linears = [lay for lay in result.spec["layers"] if lay["type"] == "linear"]
    assert [(lay["in"], lay["out"]) for lay in linears] == [(64, 40), (40, 20), (20, 10)]


def test_ratio_zero_is_the_dense_model() -> None:
    spec = cnn4()
    weights = _weights(spec)
    result = prune_spec(spec, weights, 0.0)
    assert result.backend == "none" and result.spec == spec and result.params == count_params(spec)
    assert all(np.array_equal(result.tensors[k], v) for k, v in weights.items())


def test_bad_pruning_requests_raise() -> None:
    spec = cnn4()
    weights = _weights(spec)
    for ratio in (-0.1, 1.0, float("nan"), True):
        with pytest.raises(ValueError):
            prune_spec(spec, weights, ratio)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="backend"):
        prune_spec(spec, weights, 0.5, backend="magic")
    with pytest.raises(ValueError, match="shape"):
        prune_spec(spec, {**weights, "layers.0.weight": np.zeros((3, 3))}, 0.5, backend="torch-pruning")
    grouped = validate_spec({**spec, "layers": [
        {"type": "conv2d", "in": 1, "out": 4, "kernel": 3}, {"type": "relu"},
        {"type": "conv2d", "in": 4, "out": 4, "kernel": 3, "groups": 2}, {"type": "flatten"},
        {"type": "linear", "in": 4 * 24 * 24, "out": 10}]})
    with pytest.raises(ValueError, match="grouped"):
        prune_spec(grouped, _weights(grouped), 0.5, backend="torch-pruning")


def test_derive_spec_rejects_a_model_that_does_not_match() -> None:
    spec = cnn4()
    other = build_model(mlp(784, 10, input_shape=(1, 28, 28)))
    with pytest.raises(ValueError, match="no longer matches"):
        derive_spec(spec, other)


@needs("nni")
@pytest.mark.parametrize("norm", ["batchnorm", None])
def test_a_1d_model_prunes_alike_with_nni_and_torch_pruning(norm: str | None) -> None:
    from edge_sdk.models.zoo import cnn1d

    spec = cnn1d(in_channels=6, num_classes=4, length=100, norm=norm)  # series_norm first, then conv1d
    weights = _weights(spec, seed=2)
    by_nni = prune_spec(spec, weights, 0.5, backend="nni")
    by_tp = prune_spec(spec, weights, 0.5, backend="torch-pruning")
    assert by_nni.spec == by_tp.spec
    assert [layer["out"] for layer in by_nni.spec["layers"] if layer["type"] == "conv1d"] == [16, 32, 32, 64]
    assert by_nni.spec["layers"][1]["in"] == 12  # the series and their log scales: never pruned
    for name, array in by_nni.tensors.items():
        np.testing.assert_allclose(array, by_tp.tensors[name], rtol=0, atol=1e-6)
    assert by_nni.flops < 0.3 * count_flops(spec)


@needs("nni")
def test_groupnorm_after_conv1d_goes_to_torch_pruning_or_is_refused_by_nni() -> None:
    from edge_sdk.models.zoo import cnn1d

    spec = cnn1d(in_channels=1, num_classes=3, length=64, norm="groupnorm")
    weights = _weights(spec)
    assert prune_spec(spec, weights, 0.5, backend="auto").backend == "torch-pruning"
    with pytest.raises(ValueError, match="NNI cannot prune conv1d layers followed by groupnorm"):
        prune_spec(spec, weights, 0.5, backend="nni")


@pytest.mark.parametrize("series_norm,norm", [(False, None), (True, "batchnorm")])
def test_a_minirocket_model_is_pruned_to_its_first_kernels_and_computes_what_the_full_one_does(series_norm,
                                                                                              norm) -> None:
    """REFT's levels on MiniRocket: a feature subset (the first kernels of every dilation, then the
    series' log scales), the classifier's columns of those features; exactly the full model with the
    other features' columns zeroed."""
    spec = minirocket(2, 5, 64, norm=norm, series_norm=series_norm)
    full = build_model(spec)
    weights = state_to_numpy(full, copy=True)
    rng = np.random.default_rng(0)
    for name, value in weights.items():  # biases, and a batch norm's statistics and affine map, all distinct
        if value.ndim == 1 and (name == "layers.0.biases" or norm is not None and name.startswith("layers.1.")):
            weights[name] = rng.uniform(0.5, 1.5, value.shape).astype(np.float32)
    load_numpy_state(full, weights)
    full.eval()
    x = torch.randn(4, 2, 64, generator=torch.Generator().manual_seed(1))
    for ratio, kernels in ((0.0, 84), (0.6, 34), (0.9, 9), (0.99, 1)):  # ceil(84 (1 - P)); 1: no padded kernel
        result = prune_spec(spec, weights, ratio, backend="nni")  # a backend is not needed, whichever is named
        assert result.backend == KERNEL_SUBSET and result.spec["layers"][0]["kernels"] == kernels
        columns = feature_columns(spec, kernels)
        assert len(columns) == result.spec["layers"][-1]["in"] == kernels * 119 + (2 if series_norm else 0)
        pruned = build_model(result.spec)
        load_numpy_state(pruned, result.tensors)
        pruned.eval()
        head = full.layers[-1]
        mask = torch.zeros(head.in_features)
        mask[torch.as_tensor(columns)] = 1.0
        with torch.no_grad():
            expected = full.layers[:-1](x) @ (head.weight * mask).T + head.bias
            np.testing.assert_allclose(pruned(x).numpy(), expected.numpy(), rtol=1e-5, atol=1e-5)
        assert result.flops < count_flops(spec) * (kernels / 84 + 0.01) and result.params == count_params(result.spec)
    with pytest.raises(ValueError, match="classifier straight after"):
        spec_hidden = minirocket(2, 5, 64)
        spec_hidden["layers"][1:1] = [{"type": "linear", "in": spec_hidden["layers"][1]["in"], "out": 8},
                                      {"type": "relu"}]
        spec_hidden["layers"][-1]["in"] = 8
        prune_spec(spec_hidden, state_to_numpy(build_model(spec_hidden)), 0.5)
    with pytest.raises(ValueError, match="1 to 84 kernels"):
        feature_columns(spec, 85)
