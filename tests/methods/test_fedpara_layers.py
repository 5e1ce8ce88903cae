"""FedPara layers: parameter counts, ranks from γ, composition, init, slicing, dense export."""

from __future__ import annotations

import math

import numpy as np
import onnx
import pytest
import torch

from coordinator.runtime.export import export_onnx
from edge_sdk.models.fedpara import (INIT_GAIN2, FedParaConv1d, FedParaConv2d, FedParaLinear, linear_params,
                                     personal_names, precompose, rank_bounds, rank_from_gamma)
from edge_sdk.models.minirocket import MiniRocketPlan
from edge_sdk.models.fedpara_zoo import factorisable_count, fedpara_spec, layer_ranks
from edge_sdk.models.spec import SpecError, build_model, count_params, validate_spec
from edge_sdk.models.zoo import model_for_dataset
from edge_sdk.tensors import load_numpy_state, state_to_numpy

FAMILIES = [("cnn4", (1, 28, 28)), ("resnet_small", (3, 32, 32)), ("mlp", (1, 28, 28)), ("cnn1d", (2, 64)),
            ("minirocket", (1, 64))]


def test_the_issue_parameter_counts() -> None:
    linear = FedParaLinear(256, 256, rank=16, bias=False)
    conv = FedParaConv2d(256, 256, 3, rank=16, bias=False)
    assert sum(p.numel() for p in linear.parameters()) == 16_384  # 2R(m + n)
    assert sum(p.numel() for p in conv.parameters()) == 20_992  # 2R(O + I + R k²)
    spec = {"format": 1, "input_shape": [256, 8, 8], "num_classes": 10, "layers": [
        {"type": "fedpara_conv2d", "in": 256, "out": 256, "kernel": 3, "padding": 1, "rank": 16, "bias": False},
        {"type": "global_avgpool"},
        {"type": "fedpara_linear", "in": 256, "out": 10, "rank": 4}]}
    assert count_params(spec) == 20_992 + 2 * 4 * 266 + 10 == count_params(build_model(spec))


@pytest.mark.parametrize("out,inp,kernel", [(256, 256, None), (10, 128, None), (200, 784, None),
                                            (64, 32, 3), (32, 1, 3), (256, 256, 3), (32, 16, 1), (7, 5, 5)])
def test_rank_bounds_are_tight(out: int, inp: int, kernel: int | None) -> None:
    r_min, r_max = rank_bounds(out, inp, kernel)
    assert r_min ** 2 >= min(out, inp) > (r_min - 1) ** 2
    dense = out * inp * (kernel or 1) ** 2
    count = (lambda r: 2 * r * (out + inp)) if kernel is None else (lambda r: 2 * r * (out + inp + r * kernel ** 2))
    assert count(r_max) <= dense < count(r_max + 1)
    ranks = [rank_from_gamma(out, inp, g, kernel) for g in np.linspace(0, 1, 11)]
    assert ranks == sorted(ranks)
    if r_min <= r_max:
        assert ranks[0] == r_min and ranks[-1] == r_max
    assert all(count(r) <= max(dense, count(1)) for r in ranks)  # never larger than the dense layer


@pytest.mark.parametrize("out,inp,kernel", [(64, 32, 5), (32, 2, 5), (128, 64, 3), (16, 16, 1)])
def test_1d_rank_bounds_count_one_kernel_axis(out: int, inp: int, kernel: int) -> None:
    r_min, r_max = rank_bounds(out, inp, kernel, dims=1)
    count = lambda r: 2 * r * (out + inp + r * kernel)  # noqa: E731
    assert count(r_max) <= out * inp * kernel < count(r_max + 1)
    conv = FedParaConv1d(inp, out, kernel, rank=r_max, padding=kernel // 2)
    assert conv.factor_params() == count(r_max)
    assert conv.composed_weight().shape == (out, inp, kernel)
    w1 = torch.einsum("abk,oa,ib->oik", conv.t1, conv.x1, conv.y1)
    w2 = torch.einsum("abk,oa,ib->oik", conv.t2, conv.x2, conv.y2)
    assert torch.allclose(conv.composed_weight(), w1 * w2)
    x = torch.randn(3, inp, 40)
    assert torch.allclose(conv(x), conv.to_dense()(x), atol=1e-6)


def test_gamma_and_rank_inputs_are_checked() -> None:
    with pytest.raises(ValueError, match="either rank or gamma"):
        FedParaLinear(8, 8, rank=2, gamma=0.5)
    for bad in (-0.1, 1.5, float("nan"), True):
        with pytest.raises(ValueError, match="gamma"):
            FedParaLinear(8, 8, gamma=bad)
    with pytest.raises(ValueError, match="rank"):
        FedParaConv2d(8, 8, 3, rank=0)
    for layer, match in [({"rank": 0}, "rank"), ({"rank": 2, "colour": 1}, "unknown key"),
                         ({"rank": 2, "personal": "yes"}, "bool")]:
        spec = {"format": 1, "input_shape": [8], "num_classes": 4,
                "layers": [{"type": "fedpara_linear", "in": 8, "out": 4, **layer}]}
        with pytest.raises(SpecError, match=match):
            validate_spec(spec)


def test_composition_is_the_hadamard_product_of_the_propositions() -> None:
    torch.manual_seed(0)
    lin = FedParaLinear(12, 9, rank=3)
    w = (lin.x1 @ lin.y1.T) * (lin.x2 @ lin.y2.T)
    assert torch.allclose(lin.composed_weight(), w)
    x = torch.randn(5, 12)
    assert torch.allclose(lin(x), x @ w.T + lin.bias, atol=1e-6)
    conv = FedParaConv2d(4, 6, 3, rank=2, padding=1)
    ref = torch.zeros(6, 4, 3, 3)
    for i in (1, 2):
        t, xf, yf = getattr(conv, f"t{i}"), getattr(conv, f"x{i}"), getattr(conv, f"y{i}")
        part = torch.zeros(6, 4, 3, 3)
        for a in range(2):
            for b in range(2):
                part += xf[:, a, None, None, None] * yf[None, :, b, None, None] * t[a, b]
        ref = part if i == 1 else ref * part
    assert torch.allclose(conv.composed_weight(), ref, atol=1e-6)


def test_hadamard_rank_exceeds_the_inner_rank() -> None:
    torch.manual_seed(1)
    w = FedParaLinear(64, 64, rank=8, bias=False).double().composed_weight().detach()
    rank = int(torch.linalg.matrix_rank(w))
    assert 8 < rank <= 64  # Proposition 1: up to R² = 64 with 2R(m+n) = 2,048 parameters
    tanh = FedParaLinear(64, 64, rank=8, tanh=True)
    assert torch.allclose(tanh.composed_weight(),
                          torch.tanh(tanh.x1 @ tanh.y1.T) * torch.tanh(tanh.x2 @ tanh.y2.T))


@pytest.mark.parametrize("make,fan_in", [(lambda: FedParaLinear(512, 256, gamma=0.1), 512),
                                         (lambda: FedParaConv2d(64, 128, 3, gamma=0.3), 576),
                                         (lambda: FedParaConv2d(64, 128, 3, gamma=0.3, personal=True), 576),
                                         (lambda: FedParaConv1d(64, 128, 5, gamma=0.3), 320)])
def test_initial_weights_have_the_dense_layers_variance(make, fan_in: int) -> None:
    torch.manual_seed(2)
    stds = [float(make().composed_weight().detach().std()) for _ in range(3)]
    assert np.mean(stds) == pytest.approx(math.sqrt(INIT_GAIN2 / fan_in), rel=0.2)


def test_personal_layer_starts_as_the_shared_one_and_names_its_w2() -> None:
    conv = FedParaConv2d(8, 16, 3, gamma=0.5, personal=True)
    w1 = torch.einsum("abhw,oa,ib->oihw", conv.t1, conv.x1, conv.y1)
    assert torch.equal(conv.composed_weight(), w1)  # X2 = 0: W = W1 ⊙ (0 + 1)
    with torch.no_grad():
        conv.x2.normal_()
    assert not torch.allclose(conv.composed_weight(), w1)
    model = build_model(fedpara_spec("cnn4", (1, 28, 28), 10, 0.1, personal=True))
    names = personal_names(model)
    assert len(names) == 3 * 4 + 2 and all(n.rsplit(".", 1)[1] in ("x2", "y2", "t2") for n in names)
    assert personal_names(build_model(fedpara_spec("cnn4", (1, 28, 28), 10, 0.1))) == []


@pytest.mark.parametrize("family,shape", FAMILIES)
def test_every_layer_is_factorised_and_gamma_shrinks_the_model(family: str, shape: tuple) -> None:
    dense = count_params(model_for_dataset(family, shape, 10))
    spec = fedpara_spec(family, shape, 10, 0.1)
    assert validate_spec(spec) is spec
    text = repr(spec["layers"])
    assert "'conv2d'" not in text and "'conv1d'" not in text and "'linear'" not in text
    assert len(layer_ranks(spec)) == factorisable_count(family, shape, 10)
    sizes = [count_params(fedpara_spec(family, shape, 10, g)) for g in (0.0, 0.1, 0.5, 1.0)]
    assert sizes == sorted(sizes) and sizes[-1] <= dense and sizes[1] * 3 < dense
    per_layer = fedpara_spec(family, shape, 10, 0.1, layer_gammas={0: 1.0})
    assert layer_ranks(per_layer)[0] >= layer_ranks(spec)[0] and layer_ranks(per_layer)[1:] == layer_ranks(spec)[1:]
    with pytest.raises(ValueError, match="out of range"):
        fedpara_spec(family, shape, 10, 0.1, layer_gammas={99: 0.5})


def test_a_narrow_network_is_exactly_the_top_left_block() -> None:
    torch.manual_seed(3)
    full = build_model(fedpara_spec("cnn4", (1, 28, 28), 10, 0.3))
    half = build_model(fedpara_spec("cnn4", (1, 28, 28), 10, 0.3, width=0.5))
    weights = state_to_numpy(full, copy=True)
    shapes = {k: v.shape for k, v in state_to_numpy(half).items()}
    load_numpy_state(half, {k: weights[k][tuple(slice(0, n) for n in s)] for k, s in shapes.items()})
    for big, small in zip(full.layers, half.layers):
        if hasattr(big, "composed_weight"):
            w, v = big.composed_weight().detach(), small.composed_weight().detach()
            assert torch.allclose(w[tuple(slice(0, n) for n in v.shape)], v)
            assert big.rank == small.rank


@pytest.mark.parametrize("family,shape", FAMILIES)
def test_precomposed_dense_network_and_onnx_match(tmp_path, family: str, shape: tuple) -> None:
    torch.manual_seed(4)
    model = build_model(fedpara_spec(family, shape, 10, 0.3, tanh=family == "mlp")).eval()
    dense = precompose(model).eval()
    assert count_params(dense) == count_params(model_for_dataset(family, shape, 10))
    x = torch.randn(16, *shape)
    with torch.no_grad():
        assert torch.allclose(model(x), dense(x), atol=1e-5)
    path = tmp_path / f"{family}.onnx"
    assert export_onnx(dense, path, x.numpy()) < 1e-4
    reference = build_model(model_for_dataset(family, shape, 10))  # the plain dense network
    export_onnx(reference, tmp_path / "reference.onnx", x.numpy())
    def ops(file: object) -> list[str]:  # Identity: the exporter's alias for equal (zero) biases
        return sorted(n.op_type for n in onnx.load(str(file)).graph.node if n.op_type != "Identity")

    assert "Einsum" not in ops(path) and "Tanh" not in ops(path)  # no composition left
    assert ops(path) == ops(tmp_path / "reference.onnx")  # the same graph as the dense network's


def test_a_folded_linear_holds_class_c_on_block_k_in_row_k_out_plus_c_and_a_dense_tail() -> None:
    torch.manual_seed(5)
    layer = FedParaLinear(3 * 5 + 2, 4, rank=2, blocks=3, block=5)
    assert (layer.x1.shape, layer.y1.shape, layer.tail.shape) == ((12, 2), (5, 2), (4, 2))
    product = ((layer.x1 @ layer.y1.t()) * (layer.x2 @ layer.y2.t())).detach()
    weight = layer.composed_weight().detach()
    for c in range(4):
        for k in range(3):
            assert torch.equal(weight[c, 5 * k:5 * k + 5], product[4 * k + c])
    assert torch.equal(weight[:, 15:], layer.tail.detach())
    layout = {"in": 17, "out": 4, "rank": 2, "bias": True, "blocks": 3, "block": 5}
    assert sum(p.numel() for p in layer.parameters()) == linear_params(layout) == 2 * 2 * 17 + 4 * 2 + 4
    assert sum(p.numel() for p in FedParaLinear(17, 4, rank=2, blocks=3, block=5, personal=True).parameters()) \
        == linear_params(layout)  # the tail is shared, like the bias
    for blocks, block, why in ((3, 6, "a fold of 3 blocks of 6 does not fit 17 inputs"),
                               (2, 0, "blocks=2 needs the block's size"), (0, 5, "blocks")):
        with pytest.raises(SpecError, match=f"^layers\\[0\\]: .*{why}") as error:
            validate_spec({"format": 1, "input_shape": [17], "num_classes": 4, "layers": [
                {"type": "fedpara_linear", "in": 17, "out": 4, "rank": 2, "blocks": blocks, "block": block}]})
        assert "\n" not in str(error.value)
    # 32,768 parameters unfolded, 67 million folded (4096 · 4096 rows): a hostile fold is counted, never built
    huge = {"type": "fedpara_linear", "in": 4096, "out": 4096, "rank": 2, "blocks": 4096, "block": 1}
    with pytest.raises(SpecError, match="parameter count exceeds"):
        validate_spec({"format": 1, "input_shape": [4096], "num_classes": 4096, "layers": [huge]})


def test_minirockets_head_folds_by_kernel_and_a_narrow_width_holds_the_leading_kernels_rows() -> None:
    """A row per class: unfolded, FedPara could save nothing; folded by kernel its rank comes from a
    (kernels · classes) × (a kernel's features) matrix, the same for every width."""
    torch.manual_seed(6)
    per_kernel = MiniRocketPlan(1, 64).per_kernel
    spec = fedpara_spec("minirocket", (1, 64), 3, 0.1, series_norm=True)
    head = spec["layers"][-1]
    assert (head["blocks"], head["block"], head["in"]) == (84, per_kernel, 84 * per_kernel + 1)
    assert head["rank"] == rank_from_gamma(84 * 3, per_kernel, 0.1)
    assert count_params(spec) * 2.5 < count_params(model_for_dataset("minirocket", (1, 64), 3, series_norm=True))
    full = build_model(spec)
    half = build_model(fedpara_spec("minirocket", (1, 64), 3, 0.1, width=0.5, series_norm=True))
    assert half.layers[-1].blocks == 42 and half.layers[-1].rank == head["rank"]
    weights = state_to_numpy(full, copy=True)
    shapes = {k: v.shape for k, v in state_to_numpy(half).items()}
    load_numpy_state(half, {k: weights[k][tuple(slice(0, n) for n in s)] for k, s in shapes.items()})
    w, v = full.layers[-1].composed_weight().detach(), half.layers[-1].composed_weight().detach()
    assert torch.equal(v[:, :42 * per_kernel], w[:, :42 * per_kernel])  # the leading kernels' features
    assert torch.equal(v[:, -1], w[:, -1])  # and the log scale, the same tail
