"""Architecture specs: validation of untrusted data, registry, counting, building."""
from __future__ import annotations

import copy

import msgpack
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from torch import nn

from edge_sdk.models.spec import (LAYER_TYPES, SpecError, build_model, count_flops, count_params,
                                  float_field, infer_shapes, layer_stats,
                                  register_layer, unregister_layer, validate_spec)


def small_spec() -> dict:
    """(1,8,8) -> conv 4 -> relu -> residual -> maxpool -> flatten -> linear 10."""
    return {"format": 1, "input_shape": [1, 8, 8], "num_classes": 10, "layers": [
        {"type": "conv2d", "in": 1, "out": 4, "kernel": 3, "padding": 1},
        {"type": "relu"},
        {"type": "residual", "body": [
            {"type": "conv2d", "in": 4, "out": 4, "kernel": 3, "padding": 1, "bias": False},
            {"type": "groupnorm", "groups": 2, "channels": 4}], "shortcut": []},
        {"type": "maxpool2d", "kernel": 2},
        {"type": "flatten"},
        {"type": "linear", "in": 64, "out": 10}]}


def test_validate_returns_same_object_and_shapes() -> None:
    spec = small_spec()
    assert validate_spec(spec) is spec
    assert infer_shapes(spec) == [(4, 8, 8), (4, 8, 8), (4, 8, 8), (4, 4, 4), (64,), (10,)]


def test_build_names_params_and_forward() -> None:
    spec = small_spec()
    model = build_model(spec)
    names = [n for n, _ in model.named_parameters()]
    assert names == ["layers.0.weight", "layers.0.bias", "layers.2.body.0.weight",
                     "layers.2.body.1.weight", "layers.2.body.1.bias", "layers.5.weight",
                     "layers.5.bias"]
    expected = (4 * 9 + 4) + 4 * 4 * 9 + 2 * 4 + (64 * 10 + 10)
    assert count_params(spec) == count_params(model) == expected
    assert model(torch.randn(3, 1, 8, 8)).shape == (3, 10)
    assert [s["params"] for s in layer_stats(spec)] == [40, 0, 152, 0, 0, 650]


def test_count_flops_by_hand() -> None:
    spec = {"format": 1, "input_shape": [2, 9, 9], "num_classes": 5, "layers": [
        {"type": "conv2d", "in": 2, "out": 6, "kernel": 3, "stride": 2, "padding": 1},
        {"type": "conv2d", "in": 6, "out": 6, "kernel": 3, "groups": 3},   # 5x5 -> 3x3
        {"type": "flatten"}, {"type": "linear", "in": 54, "out": 5}]}
    # conv1: out 5x5, MACs = 6*5*5 * 2*9; conv2: 6*3*3 * (6/3)*9; linear 54*5
    macs = 6 * 25 * 18 + 6 * 9 * 18 + 54 * 5
    assert count_flops(spec) == 2 * macs
    assert count_flops(spec, batch=4) == 8 * macs
    assert count_params(spec) == count_params(build_model(spec))
    with pytest.raises(ValueError):
        count_flops(spec, batch=0)


def test_msgpack_round_trip_rebuilds_identical_model() -> None:
    spec = small_spec()
    wire = msgpack.unpackb(msgpack.packb(spec))
    assert wire == spec
    torch.manual_seed(7)
    a = build_model(spec)
    torch.manual_seed(7)
    b = build_model(wire)
    sa, sb = a.state_dict(), b.state_dict()
    assert list(sa) == list(sb)
    assert all(torch.equal(sa[k], sb[k]) for k in sa)


def _nested(depth: int) -> dict:
    layers: list = [{"type": "relu"}]
    for _ in range(depth - 1):
        layers = [{"type": "residual", "body": layers}]
    return {"format": 1, "input_shape": [3], "num_classes": 3, "layers": layers}


def test_nesting_depth_limit() -> None:
    validate_spec(_nested(8))
    with pytest.raises(SpecError, match="deeper"):
        validate_spec(_nested(9))


def _mutated(path: list, value: object) -> dict:
    spec = small_spec()
    target = spec
    for key in path[:-1]:
        target = target[key]
    if value is KeyError:
        del target[path[-1]]
    else:
        target[path[-1]] = value
    return spec


@pytest.mark.parametrize("path, value, match", [
    (["layers", 0, "type"], "conv3d", r"layers\[0\]: unknown layer type"),
    (["layers", 0, "dilation"], 2, r"layers\[0\]: unknown key"),
    (["layers", 0, "in"], 3, r"layers\[0\]: conv2d 'in' is 3 but the input has 1"),
    (["layers", 2, "body", 0, "in"], 5, r"layers\[2\]\.body\[0\]: conv2d 'in'"),
    (["layers", 2, "body", 1, "channels"], 8, r"layers\[2\]\.body\[1\]"),
    (["layers", 2, "shortcut"], [{"type": "maxpool2d", "kernel": 2}], r"layers\[2\]: residual"),
    (["layers", 5, "in"], 63, r"layers\[5\]: linear 'in' is 63"),
    (["layers", 5, "out"], 9, r"final output shape"),
    (["layers", 0, "out"], 10 ** 9, r"out of range"),
    (["layers", 0, "kernel"], 99, r"out of range"),
    (["layers", 0, "padding"], -1, r"out of range"),
    (["layers", 0, "in"], True, r"must be an int, got bool"),
    (["layers", 0, "kernel"], 3.0, r"must be an int, got float"),
    (["layers", 0, "bias"], 1, r"must be a bool"),
    (["layers", 0, "kernel"], KeyError, r"missing required key 'kernel'"),
    (["layers", 3, "kernel"], 9, r"larger than input"),
    (["layers", 2, "body", 1, "groups"], 3, r"must divide"),
    (["layers", 1], "relu", r"layers\[1\]: layer must be a dict"),
    (["layers", 1, "type"], 5, r"'type' must be a string"),
    (["layers", 4, "type"], "global_avgpool", r"linear 'in' is 64 but the input has 4"),
    (["format"], 2, r"unsupported format"),
    (["format"], True, r"unsupported format"),
    (["num_classes"], True, r"num_classes"),
    (["input_shape"], [1, 8, 8, 1, 1], r"input_shape"),
    (["input_shape"], [1, 8.0, 8], r"input_shape"),
    (["extra"], 1, r"unknown key"),
    (["layers"], [], r"at least one layer"),
    (["layers"], {"0": {"type": "relu"}}, r"must be a list"),
    (["meta"], {"k": [1, 2]}, r"meta"),
])
def test_rejections_name_the_problem(path: list, value: object, match: str) -> None:
    with pytest.raises(SpecError, match=match):
        validate_spec(_mutated(path, value))


@pytest.mark.parametrize("bad", [None, [], "spec", 3, b"\x00", {1: 2}])
def test_non_dict_or_garbage_rejected(bad: object) -> None:
    with pytest.raises(SpecError):
        validate_spec(bad)


def test_size_limits() -> None:
    wide = {"format": 1, "input_shape": [8192], "num_classes": 10, "layers": [
        {"type": "linear", "in": 8192, "out": 65536},
        {"type": "linear", "in": 65536, "out": 10}]}
    assert count_params(wide) == 8192 * 65536 + 65536 + 65536 * 10 + 10  # counted, not built
    with pytest.raises(SpecError, match="parameter count exceeds"):
        validate_spec(wide)
    with pytest.raises(SpecError, match="parameter count exceeds"):
        build_model(wide)
    many = {"format": 1, "input_shape": [3], "num_classes": 3, "layers": [{"type": "relu"}] * 300}
    with pytest.raises(SpecError, match="more than 256 layers"):
        validate_spec(many)
    validate_spec(many, max_layers=300)
    huge_act = {"format": 1, "input_shape": [3, 4096, 4096], "num_classes": 3,
                "layers": [{"type": "global_avgpool"}]}
    with pytest.raises(SpecError, match="activation"):
        validate_spec(huge_act)
    nan_p = _mutated(["layers", 1], {"type": "dropout", "p": float("nan")})
    with pytest.raises(SpecError, match="finite"):
        validate_spec(nan_p)


class Scale(nn.Module):
    def __init__(self, factor: float) -> None:
        super().__init__()
        self.factor = factor

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * self.factor


def test_register_custom_layer_with_schema_and_meta_fallback() -> None:
    register_layer("test_scale", lambda a: Scale(a["factor"]),
                   out_shape=lambda a, s: s, params=lambda a: 0,
                   schema={"factor": float_field(-10, 10, 1.0)})
    # schema-less: shape and params come from building on the meta device
    register_layer("test_bilinear", lambda a: nn.Bilinear(a["n"], a["n"], a["m"]),
                   validate=lambda a: None if set(a) == {"type", "n", "m"} else 1 / 0)
    try:
        with pytest.raises(ValueError, match="already registered"):
            register_layer("test_scale", lambda a: Scale(1.0))
        assert "test_scale" in LAYER_TYPES
        spec = {"format": 1, "input_shape": [6], "num_classes": 2, "layers": [
            {"type": "test_scale", "factor": 2}, {"type": "linear", "in": 6, "out": 4},
            {"type": "test_scale"}, {"type": "linear", "in": 4, "out": 2}]}
        model = build_model(spec)
        x = torch.randn(5, 6)
        assert model(x).shape == (5, 2)
        assert torch.allclose(model.layers[0](x), 2 * x)
        with pytest.raises(SpecError, match=r"layers\[0\]: unknown key"):
            validate_spec(_replace_layer(spec, 0, {"type": "test_scale", "f": 1.0}))
        with pytest.raises(SpecError, match=r"layers\[2\]: 'factor' = 50"):
            validate_spec(_replace_layer(spec, 2, {"type": "test_scale", "factor": 50}))

        # nn.Bilinear(n, n, m).forward needs two inputs -> meta forward fails -> SpecError
        bil = _replace_layer(spec, 0, {"type": "test_bilinear", "n": 6, "m": 6})
        with pytest.raises(SpecError, match=r"layers\[0\]: TypeError"):
            validate_spec(bil)
        with pytest.raises(SpecError, match=r"layers\[0\]: ZeroDivisionError"):
            validate_spec(_replace_layer(spec, 0, {"type": "test_bilinear", "n": 6, "x": 1}))
    finally:
        unregister_layer("test_scale")
        unregister_layer("test_bilinear")
    assert "test_scale" not in LAYER_TYPES
    with pytest.raises(ValueError, match="bad layer type name"):
        register_layer("Bad Name", lambda a: nn.ReLU())


def test_meta_fallback_counts_params_without_callbacks() -> None:
    register_layer("test_plain_linear", lambda a: nn.Linear(a["i"], a["o"]))
    try:
        spec = {"format": 1, "input_shape": [7], "num_classes": 3, "layers": [
            {"type": "test_plain_linear", "i": 7, "o": 3}]}
        assert infer_shapes(spec) == [(3,)]
        assert count_params(spec) == 7 * 3 + 3 == count_params(build_model(spec))
        with pytest.raises(SpecError, match=r"layers\[0\]: RuntimeError"):
            validate_spec({**spec, "input_shape": [8]})
        with pytest.raises(SpecError, match="unsupported value type"):
            validate_spec({**spec, "layers": [{"type": "test_plain_linear", "i": 7, "o": {3}}]})
    finally:
        unregister_layer("test_plain_linear")


def _replace_layer(spec: dict, i: int, layer: dict) -> dict:
    out = copy.deepcopy(spec)
    out["layers"][i] = layer
    return out


_plain = st.recursive(
    st.none() | st.booleans() | st.integers(-2, 70000) | st.floats(allow_nan=True)
    | st.sampled_from(["conv2d", "linear", "relu", "residual", "flatten", "body", "in", "out"]),
    lambda inner: st.lists(inner, max_size=4)
    | st.dictionaries(st.sampled_from(["type", "in", "out", "kernel", "body", "shortcut",
                                       "channels", "groups", "p", "stride"]), inner, max_size=5),
    max_leaves=20)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(layers=st.lists(_plain, max_size=4), shape=st.lists(st.integers(-1, 40), max_size=4))
def test_fuzz_only_spec_errors(layers: list, shape: list) -> None:
    spec = {"format": 1, "input_shape": shape, "num_classes": 3, "layers": layers}
    try:
        validate_spec(spec)
    except SpecError:
        return
    assert build_model(spec)(torch.zeros(1, *shape)).shape == (1, 3)


@settings(max_examples=150, deadline=None)
@given(idx=st.integers(0, 5), key=st.sampled_from(["in", "out", "kernel", "stride", "padding",
                                                   "channels", "groups", "p", "bias", "type"]),
       value=st.one_of(st.integers(-3, 70), st.booleans(), st.floats(0, 1), st.none()))
def test_fuzz_mutations_are_rejected_or_work(idx: int, key: str, value: object) -> None:
    spec = small_spec()
    spec["layers"][idx][key] = value
    try:
        validate_spec(spec)
    except SpecError:
        return
    model = build_model(spec)
    assert count_params(model) == count_params(spec)
    assert model(torch.randn(2, 1, 8, 8)).shape == (2, 10)
