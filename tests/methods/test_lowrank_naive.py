"""The naive low-rank baseline (W = X Yᵀ) at FedPara's parameter count, and its strategy."""

from __future__ import annotations

import pytest
import torch

from coordinator.strategies.naive_lowrank import LowRank
from coordinator.core.federation import FederationConfig
from coordinator.strategies.base import StrategyContext
from edge_sdk.models.fedpara import FedParaLinear, precompose, rank_from_gamma
from edge_sdk.models.fedpara_zoo import fedpara_spec, layer_ranks, naive_lowrank_spec
from edge_sdk.models.lowrank_naive import (NaiveLowRankConv1d, NaiveLowRankConv2d, NaiveLowRankLinear,
                                           naive_rank_matching)
from edge_sdk.models.spec import SpecError, build_model, count_params, validate_spec


def test_equal_parameters_but_rank_bounded_by_r() -> None:
    torch.manual_seed(0)
    fedpara = FedParaLinear(64, 64, rank=8, bias=False)
    naive = NaiveLowRankLinear(64, 64, naive_rank_matching(64, 64, 8), bias=False)
    assert naive.rank == 16
    assert sum(p.numel() for p in naive.parameters()) == sum(p.numel() for p in fedpara.parameters()) == 2048
    naive_rank = int(torch.linalg.matrix_rank(naive.double().composed_weight().detach()))
    fedpara_rank = int(torch.linalg.matrix_rank(fedpara.double().composed_weight().detach()))
    assert naive_rank == 16 < fedpara_rank  # same budget, FedPara reaches a higher rank


def test_naive_layers_compute_their_composed_weight() -> None:
    torch.manual_seed(1)
    lin = NaiveLowRankLinear(10, 6, 3)
    x = torch.randn(4, 10)
    assert torch.allclose(lin(x), x @ (lin.x @ lin.y.T).T + lin.bias, atol=1e-6)
    conv = NaiveLowRankConv2d(3, 5, 3, 2, padding=1)
    unfolded = conv.composed_weight().reshape(5, -1)
    assert torch.allclose(unfolded, conv.x @ conv.y.reshape(-1, 2).T, atol=1e-6)
    assert int(torch.linalg.matrix_rank(conv.double().composed_weight().reshape(5, -1).detach())) == 2
    dense = precompose(conv)
    image = torch.randn(2, 3, 8, 8, dtype=torch.float64)
    assert torch.allclose(dense(image), conv(image), atol=1e-5)
    with pytest.raises(ValueError, match="rank"):
        NaiveLowRankLinear(4, 4, 0)
    bad = {"format": 1, "input_shape": [4], "num_classes": 2,
           "layers": [{"type": "lowrank_naive_linear", "in": 4, "out": 2, "rank": 1, "tanh": True}]}
    with pytest.raises(SpecError, match="unknown key"):
        validate_spec(bad)


@pytest.mark.parametrize("gamma", [0.1, 0.3, 0.5])
def test_naive_network_has_fedpara_parameter_count(gamma: float) -> None:
    fedpara = fedpara_spec("cnn4", (1, 28, 28), 10, gamma)
    naive = naive_lowrank_spec("cnn4", (1, 28, 28), 10, gamma)
    assert count_params(naive) == pytest.approx(count_params(fedpara), rel=0.02)
    assert count_params(build_model(naive)) == count_params(naive)
    for r, (kind, ref) in zip(layer_ranks(naive), [("conv", (32, 1)), ("conv", (64, 32)), ("conv", (64, 64)),
                                                    ("conv", (128, 64)), ("linear", (10, 128))]):
        kernel = 3 if kind == "conv" else None
        assert r == naive_rank_matching(*ref, rank_from_gamma(*ref, gamma, kernel), kernel)


def test_a_naive_conv1d_is_rank_r_and_matches_fedpara_on_cnn1d() -> None:
    torch.manual_seed(2)
    conv = NaiveLowRankConv1d(3, 6, 5, 2, padding=2)
    unfolded = conv.double().composed_weight().reshape(6, -1).detach()
    assert torch.allclose(unfolded, conv.x @ conv.y.reshape(-1, 2).T) and int(torch.linalg.matrix_rank(unfolded)) == 2
    series = torch.randn(2, 3, 30, dtype=torch.float64)
    assert torch.allclose(precompose(conv)(series), conv(series), atol=1e-8)
    fedpara, naive = fedpara_spec("cnn1d", (1, 300), 11, 0.3), naive_lowrank_spec("cnn1d", (1, 300), 11, 0.3)
    assert count_params(naive) == pytest.approx(count_params(fedpara), rel=0.02)
    assert [layer["type"] for layer in naive["layers"]].count("lowrank_naive_conv1d") == 4


def test_lowrank_strategy_uses_naive_layers_and_rejects_tanh() -> None:
    ctx = StrategyContext(federation=FederationConfig(), model_family="cnn4", input_shape=(1, 28, 28),
                          num_classes=10, options={"gamma": "0.1"})
    strategy = LowRank.create(ctx)
    assert "lowrank_naive_conv2d" in repr(strategy.specs["global"]["layers"])
    assert strategy.model_params()["global"] == count_params(naive_lowrank_spec("cnn4", (1, 28, 28), 10, 0.1))
    with pytest.raises(ValueError, match="unknown option"):
        LowRank.create(StrategyContext(federation=FederationConfig(), model_family="cnn4",
                                       input_shape=(1, 28, 28), num_classes=10, options={"tanh": "true"}))
