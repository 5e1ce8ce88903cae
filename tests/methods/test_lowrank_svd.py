"""SVD low-rank linear layers: the layer type, decompose/compose and the spec conversion."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from edge_sdk.models import SpecError, build_model, count_flops, count_params, validate_spec
from edge_sdk.models.lowrank import (LowRankLinear, compose, compressible, decompose, factor_names,
                                     lowrank_layers, lowrank_spec)
from edge_sdk.models.zoo import mlp
from edge_sdk.tensors import load_numpy_state, state_to_numpy


def _spec(rank: int = 4, **extra: object) -> dict:
    return {"format": 1, "input_shape": [20], "num_classes": 3, "layers": [
        {"type": "lowrank_linear", "in": 20, "out": 16, "rank": rank, **extra}, {"type": "relu"},
        {"type": "linear", "in": 16, "out": 3}]}


def test_decompose_is_u_sqrt_s_and_v_sqrt_s() -> None:
    w = np.random.default_rng(0).normal(size=(30, 50)).astype(np.float32)
    a, b = decompose(w, 30)  # full rank: exact
    assert a.shape == (30, 30) and b.shape == (50, 30) and a.dtype == np.float32
    np.testing.assert_allclose(compose(a, b), w, atol=1e-4)
    s = np.linalg.svd(w.astype(np.float64), compute_uv=False)
    # balanced factors: AᵀA = BᵀB = S (columns orthogonal, scaled by the singular values)
    np.testing.assert_allclose(a.T @ a, np.diag(s), atol=1e-3)
    np.testing.assert_allclose(b.T @ b, np.diag(s), atol=1e-3)


def test_truncation_is_the_best_rank_r_approximation() -> None:
    w = np.random.default_rng(1).normal(size=(40, 24)).astype(np.float32)
    s = np.linalg.svd(w.astype(np.float64), compute_uv=False)
    for rank in (1, 5, 12):
        error = np.linalg.norm(w - compose(*decompose(w, rank)))
        assert error == pytest.approx(np.sqrt(np.sum(s[rank:] ** 2)), rel=1e-4)  # Eckart-Young


@pytest.mark.parametrize("bad, rank, match", [
    (np.ones(5, np.float32), 1, "2-D"), (np.full((3, 3), np.nan, np.float32), 1, "NaN"),
    (np.ones((3, 4), np.float32), 4, "rank"), (np.ones((3, 4), np.float32), 0, "rank"),
    (np.ones((3, 4), np.int64), 1, "float"), (np.ones((3, 4), np.float32), True, "rank"),
])
def test_decompose_rejects_bad_input(bad: np.ndarray, rank: int, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        decompose(bad, rank)


def test_compose_rejects_mismatched_ranks() -> None:
    with pytest.raises(ValueError, match="rank"):
        compose(np.ones((4, 2), np.float32), np.ones((5, 3), np.float32))


def test_layer_type_counts_builds_and_computes_x_b_at_plus_bias() -> None:
    spec = validate_spec(_spec())
    assert count_params(spec) == 4 * (20 + 16) + 16 + 16 * 3 + 3
    assert count_flops(spec) == 2 * 4 * (20 + 16) + 2 * 16 * 3
    model = build_model(spec)
    assert count_params(model) == count_params(spec)
    assert factor_names(model) == (["layers.0.A"], ["layers.0.B"])
    layer = model.layers[0]
    assert isinstance(layer, LowRankLinear) and layer.A.shape == (16, 4) and layer.B.shape == (20, 4)
    x = torch.randn(5, 20)
    expected = x @ (layer.A @ layer.B.T).T + layer.bias
    torch.testing.assert_close(layer(x), expected)
    assert not torch.allclose(layer.A, torch.zeros_like(layer.A))  # initialised, not empty memory


def test_layer_without_bias() -> None:
    model = build_model(_spec(bias=False))
    assert "layers.0.bias" not in state_to_numpy(model)


@pytest.mark.parametrize("layer, match", [
    ({"type": "lowrank_linear", "in": 20, "out": 16, "rank": 17}, "exceeds min"),
    ({"type": "lowrank_linear", "in": 21, "out": 16, "rank": 4}, "input has 20"),
    ({"type": "lowrank_linear", "in": 20, "out": 16, "rank": 4, "scale": 2}, "unknown key"),
    ({"type": "lowrank_linear", "in": 20, "out": 16, "rank": "4"}, "must be an int"),
    ({"type": "lowrank_linear", "in": 20, "out": 16}, "missing required key 'rank'"),
])
def test_bad_layers_are_rejected(layer: dict, match: str) -> None:
    spec = _spec()
    spec["layers"][0] = layer
    with pytest.raises(SpecError, match=match):
        validate_spec(spec)


def test_lowrank_spec_replaces_only_the_layers_it_compresses() -> None:
    dense = mlp(784, 10, hidden=(512, 256), input_shape=[1, 28, 28])
    assert lowrank_layers(dense, 32) == [1, 3]  # 256 -> 10 classifier stays dense
    small = lowrank_spec(dense, 32)
    assert [layer["type"] for layer in small["layers"]] == \
        ["flatten", "lowrank_linear", "relu", "lowrank_linear", "relu", "linear"]
    assert dense["layers"][1]["type"] == "linear"  # the input spec is not modified
    assert count_params(dense) == 535_818
    assert count_params(small) == 32 * (784 + 512) + 512 + 32 * (512 + 256) + 256 + 2570
    assert compressible(784, 512, 32) and not compressible(256, 10, 32) and not compressible(8, 8, 4)
    with pytest.raises(ValueError, match="no fully-connected layer"):
        lowrank_spec(dense, 400)


def test_factors_of_a_rank_r_dense_layer_give_the_same_outputs() -> None:
    dense = mlp(64, 3, hidden=(48,))
    torch.manual_seed(0)
    big = build_model(dense)
    weights = state_to_numpy(big, copy=True)
    rng = np.random.default_rng(0)
    weights["layers.1.weight"] = (rng.normal(size=(48, 8)) @ rng.normal(size=(8, 64)) / 20).astype(np.float32)
    load_numpy_state(big, weights)
    small = build_model(lowrank_spec(dense, 8))  # the layer has rank 8: its factors are exact
    tensors = {k: v for k, v in weights.items() if k != "layers.1.weight"}
    tensors["layers.1.A"], tensors["layers.1.B"] = decompose(weights["layers.1.weight"], 8)
    load_numpy_state(small, tensors)
    x = torch.randn(8, 64)
    torch.testing.assert_close(small(x), big(x), atol=1e-4, rtol=1e-4)


def test_a_minirocket_head_is_factorised_folded_by_kernel_and_composes_back_exactly() -> None:
    """A row per class: unfolded, no rank saves anything on a head of 3 outputs; folded by kernel
    (`edge_sdk.models.folding`) rank 4 keeps a fraction of it, the log scale as a dense tail, and a
    weight whose folded matrix has rank 4 is its factors exactly, outputs included."""
    from edge_sdk.models.lowrank import compose_layer, decompose_layer
    from edge_sdk.models.minirocket import MiniRocketPlan
    from edge_sdk.models.zoo import model_for_dataset

    per_kernel = MiniRocketPlan(1, 64).per_kernel
    dense = model_for_dataset("minirocket", (1, 64), 3, series_norm=True)
    assert not compressible(dense["layers"][-1]["in"], 3, 4)  # unfolded
    small = lowrank_spec(dense, 4)
    head = small["layers"][-1]
    assert (head["type"], head["blocks"], head["block"], head["in"]) == \
        ("lowrank_linear", 84, per_kernel, 84 * per_kernel + 1)
    assert count_params(small) == 4 * (84 * 3 + per_kernel) + 3 * (1 + 1) and \
        count_params(small) * 10 < count_params(dense)

    rng = np.random.default_rng(1)
    folded = rng.normal(size=(84 * 3, 4)) @ rng.normal(size=(4, per_kernel))  # rank 4
    weight = np.concatenate([folded.reshape(84, 3, per_kernel).transpose(1, 0, 2).reshape(3, -1),
                             rng.normal(size=(3, 1))], axis=1).astype(np.float32)
    a, b, tail = decompose_layer(weight, head)
    assert a.shape == (84 * 3, 4) and b.shape == (per_kernel, 4) and tail.shape == (3, 1)
    np.testing.assert_allclose(compose_layer(a, b, tail, head), weight, atol=1e-4)
    torch.manual_seed(0)
    big, low = build_model(dense), build_model(small)
    weights = state_to_numpy(big, copy=True)
    weights["layers.1.weight"] = weight
    load_numpy_state(big, weights)
    load_numpy_state(low, {**{k: v for k, v in weights.items() if k != "layers.1.weight"},
                           "layers.1.A": a, "layers.1.B": b, "layers.1.tail": tail})
    layer = low.layers[-1]
    product = (layer.A @ layer.B.t()).detach()
    for c in range(3):  # class c on kernel k: row k·3 + c of the folded matrix
        for k in (0, 41, 83):
            assert torch.equal(layer.weight().detach()[c, k * per_kernel:(k + 1) * per_kernel], product[3 * k + c])
    big.eval()
    low.eval()
    x = torch.randn(4, 1, 64)
    torch.testing.assert_close(low(x), big(x), atol=1e-4, rtol=1e-4)
    # a hostile fold is counted before anything is built
    huge = {"type": "lowrank_linear", "in": 16384, "out": 4096, "rank": 4, "blocks": 4096, "block": 4}
    with pytest.raises(SpecError, match="parameter count exceeds"):  # 67 million: 4 · (4096 · 4096 + 4)
        validate_spec({"format": 1, "input_shape": [16384], "num_classes": 4096, "layers": [huge]})
    with pytest.raises(SpecError, match="a fold of 3 blocks of 8 does not fit 20 inputs"):
        validate_spec(_spec(blocks=3, block=8))
