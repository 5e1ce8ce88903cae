"""FLANC's composed layers and model families: the two forwards agree, W_p is Σ U·V, specs are sane."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from edge_sdk.models.flanc import (FlancConv1d, FlancConv2d, FlancLinear, basis_names, dense_spec, flanc_modules,
                                   orthogonality_penalty, to_dense)
from edge_sdk.models.flanc_zoo import FlancConfig, basis_in_for, flanc_specs
from edge_sdk.models.spec import SpecError, build_model, count_params, validate_spec
from edge_sdk.models.zoo import cnn4


@pytest.mark.parametrize("stride,padding,kernel", [(1, 1, 3), (2, 1, 3), (1, 0, 1), (2, 2, 5)])
def test_conv_two_stage_equals_precomposed(stride, padding, kernel):
    torch.manual_seed(0)
    layer = FlancConv2d(24, 20, basis_in=4, basis_out=5, kernel=kernel, stride=stride, padding=padding)
    x = torch.randn(3, 24, 11, 9)
    two, pre = layer.two_stage(x), layer.precomposed(x)
    assert two.shape == pre.shape == torch.nn.functional.conv2d(
        x, torch.zeros(20, 24, kernel, kernel), stride=stride, padding=padding).shape
    assert torch.allclose(two, pre, atol=1e-5, rtol=0)
    # the gradients reaching V and U agree too
    g_two = torch.autograd.grad(two.square().sum(), [layer.basis, layer.coeff])
    g_pre = torch.autograd.grad(layer.precomposed(x).square().sum(), [layer.basis, layer.coeff])
    for a, b in zip(g_two, g_pre):
        assert torch.allclose(a, b, atol=1e-3, rtol=1e-4)


def test_linear_two_stage_equals_precomposed():
    torch.manual_seed(1)
    layer = FlancLinear(48, 10, basis_in=6, basis_out=4)
    x = torch.randn(7, 48)
    assert torch.allclose(layer.two_stage(x), layer.precomposed(x), atol=1e-5, rtol=0)
    assert layer.composed_weight().shape == (10, 48)


def test_composed_weight_is_the_sum_over_basis_filters():
    torch.manual_seed(2)
    r1, r2, groups = 3, 4, 2
    layer = FlancConv2d(r1 * groups, 5, basis_in=r1, basis_out=r2, kernel=3, padding=1)
    u, v, w = layer.coeff.detach(), layer.basis.detach(), layer.composed_weight().detach()
    for t in range(5):
        for g in range(groups):
            for r in range(r1):
                expected = sum(u[t, g * r2 + b] * v[b, r] for b in range(r2))
                assert torch.allclose(w[t, g * r1 + r], expected, atol=1e-6)


def test_bad_layer_arguments_are_rejected():
    with pytest.raises(ValueError, match="divide"):
        FlancConv2d(10, 4, basis_in=3, basis_out=2, kernel=3)
    spec = cnn4(width=0.25)
    spec["layers"][3] = {"type": "flanc_conv2d", "in": 8, "out": 16, "basis_in": 3, "basis_out": 4,
                         "kernel": 3, "padding": 1}
    with pytest.raises(SpecError, match="divide"):
        validate_spec(spec)
    spec["layers"][3].update(basis_in=4, surprise=1)
    with pytest.raises(SpecError, match="unknown key"):
        validate_spec(spec)


def test_cnn4_family_has_paper_basis_sizes_and_shared_basis_shapes():
    specs = flanc_specs("cnn4", (1, 28, 28), 10)
    assert list(specs) == ["0.25", "0.5", "0.75", "1.0"]
    composed = [layer for layer in specs["1.0"]["layers"] if layer["type"] == "flanc_conv2d"]
    # full-width convs 32->64, 64->64, 64->128: R1 = in/8, R2 = out/4; the image stem stays dense
    assert [(c["basis_in"], c["basis_out"]) for c in composed] == [(4, 16), (8, 16), (8, 32)]
    assert specs["1.0"]["layers"][0]["type"] == "conv2d" and specs["1.0"]["layers"][-1]["type"] == "linear"
    models = {label: build_model(s) for label, s in specs.items()}
    names = basis_names(models["1.0"])
    assert len(names) == 3
    for label, model in models.items():
        state = model.state_dict()
        assert basis_names(model) == names
        assert all(state[n].shape == models["1.0"].state_dict()[n].shape for n in names)
        assert all(m.in_features % m.basis_in == 0 for _, m in flanc_modules(model))
        assert count_params(specs[label]) == count_params(model)
    # composed networks are smaller than the dense ones from p = 0.5 on
    assert count_params(specs["1.0"]) < 0.45 * count_params(cnn4())


def test_basis_in_divides_every_width_and_config_is_validated():
    assert basis_in_for(64, [16, 32, 48, 64], 0.125) == 8
    assert basis_in_for(30, [8, 15, 23, 30], 0.125) == 1  # gcd 1: only whole groups of 1
    assert basis_in_for(40, [10, 20, 30, 40], 0.125) == 5
    specs = flanc_specs("cnn4", (1, 28, 28), 10, FlancConfig(widths=(0.3, 1.0)))
    assert list(specs) == ["0.3", "1.0"]
    with pytest.raises(ValueError):
        FlancConfig(widths=(0.5, 0.25))
    with pytest.raises(ValueError):
        FlancConfig(basis_fraction=0.0)


@pytest.mark.parametrize("stride,padding,kernel", [(1, 2, 5), (2, 1, 3), (1, 0, 1)])
def test_conv1d_two_stage_equals_precomposed(stride, padding, kernel):
    torch.manual_seed(0)
    layer = FlancConv1d(24, 20, basis_in=4, basis_out=5, kernel=kernel, stride=stride, padding=padding)
    assert layer.basis.shape == (5, 4, kernel)
    assert count_params(layer) == 5 * 4 * kernel + 20 * 6 * 5 + 20
    x = torch.randn(3, 24, 37)
    two, pre = layer.two_stage(x), layer.precomposed(x)
    assert two.shape == pre.shape == torch.nn.functional.conv1d(
        x, torch.zeros(20, 24, kernel), stride=stride, padding=padding).shape
    assert torch.allclose(two, pre, atol=1e-5, rtol=0)
    g_two = torch.autograd.grad(two.square().sum(), [layer.basis, layer.coeff])
    g_pre = torch.autograd.grad(layer.precomposed(x).square().sum(), [layer.basis, layer.coeff])
    for a, b in zip(g_two, g_pre):
        assert torch.allclose(a, b, atol=1e-3, rtol=1e-4)


def test_cnn1d_composes_all_but_its_stem_with_one_basis_for_every_width():
    specs = flanc_specs("cnn1d", (2, 64), 4)
    kinds = [layer["type"] for layer in specs["1.0"]["layers"] if "conv" in layer["type"]]
    assert kinds == ["conv1d", "flanc_conv1d", "flanc_conv1d", "flanc_conv1d"]
    shapes = {label: {n: tuple(p.shape) for n, p in build_model(spec).named_parameters()
                      if n in basis_names(build_model(spec))} for label, spec in specs.items()}
    assert len({tuple(sorted(s.items())) for s in shapes.values()}) == 1 and len(shapes["1.0"]) == 3


@pytest.mark.parametrize("family,shape", [("cnn4", (1, 28, 28)), ("resnet_small", (3, 16, 16)),
                                          ("mlp", (1, 8, 8)), ("cnn1d", (2, 64))])
def test_to_dense_computes_the_same_function(family, shape):
    torch.manual_seed(3)
    specs = flanc_specs(family, shape, 10)
    for label in ("0.25", "1.0"):
        spec = specs[label]
        model = build_model(spec).eval()
        dense = to_dense(model).eval()
        assert not any(layer["type"].startswith("flanc") for layer in dense_spec(spec)["layers"])
        x = torch.randn(4, *shape)
        with torch.no_grad():
            for _, m in flanc_modules(model):
                m.precompose = False
            two = model(x)
            for _, m in flanc_modules(model):
                m.precompose = True
            assert torch.allclose(two, model(x), atol=1e-5, rtol=0), label
            assert torch.allclose(two, dense(x), atol=1e-5, rtol=0), label


def test_orthogonality_penalty_starts_near_zero_and_is_differentiable():
    torch.manual_seed(4)
    model = build_model(flanc_specs("cnn4", (1, 28, 28), 10)["0.5"])
    assert float(orthogonality_penalty(model).detach()) < 1e-6  # orthonormal init
    with torch.no_grad():
        for _, m in flanc_modules(model):
            m.basis.mul_(1.5)
    penalty = orthogonality_penalty(model)
    assert float(penalty.detach()) > 1.0
    penalty.backward()
    with torch.no_grad():
        for _, m in flanc_modules(model):
            m.basis.sub_(1e-3 * m.basis.grad)
        assert float(orthogonality_penalty(model)) < float(penalty.detach())


def test_orthogonality_penalty_lives_on_the_bases_device():
    # a device training on cuda computes the penalty there: a tensor made on the CPU stopped
    # every FLANC round on the GPU ("Expected all tensors to be on the same device"). The meta
    # device stands in for cuda here: mixing it with CPU tensors fails the same way.
    model = build_model(flanc_specs("flanc_cnn", (1, 28, 28), 10)["0.5"]).to("meta")
    assert orthogonality_penalty(model).device.type == "meta"


def test_coefficient_inits_have_he_and_torch_default_scales():
    from coordinator.strategies.flanc import Flanc, flanc_config
    from edge_sdk.methods.settings.flanc import FlancSettings
    from coordinator.core.federation import FederationConfig
    from edge_sdk.models.flanc import flanc_modules
    from edge_sdk.models.flanc_zoo import flanc_specs

    specs = flanc_specs("flanc_cnn", (1, 28, 28), 10, flanc_config(FlancSettings()))
    stds = {}
    for scheme in ("he", "torch"):
        strategy = Flanc(FederationConfig(), FlancSettings(coeff_init=scheme), specs)
        model = strategy.models["1.0"]
        stds[scheme] = [(m.coeff.std().item(), m.coeff.shape[1]) for _, m in flanc_modules(model)]
        assert all(m.bias is None or not m.bias.any() for _, m in flanc_modules(model))
        basis = strategy.basis[next(iter(strategy.basis))]
        assert np.allclose(basis, Flanc(FederationConfig(), FlancSettings(), specs).basis[next(iter(strategy.basis))])
    for (he, fan_in), (default, _) in zip(stds["he"], stds["torch"]):
        assert he == pytest.approx((2 / fan_in) ** 0.5, rel=0.05)  # He normal
        assert default == pytest.approx((1 / (3 * fan_in)) ** 0.5, rel=0.05)  # U(±1/sqrt(fan_in))
    with pytest.raises(ValueError, match="coeff_init"):
        Flanc.parse_options({"coeff_init": "xavier"})
