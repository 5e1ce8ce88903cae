"""Spec layers for sensor series (C, L): conv1d, 1-D pooling, 1-D batch norm, group norm and the
global average over time — their shapes, parameters and FLOPs against torch's own; the cnn1d
family; refusals that name the layer."""
from __future__ import annotations

import pytest
import torch
from torch.utils.flop_counter import FlopCounterMode

from edge_sdk.models.spec import SpecError, build_model, count_flops, count_params, infer_shapes, validate_spec
from edge_sdk.models.zoo import cnn1d, model_for_dataset


def series_spec(length: int = 37) -> dict:
    return {"format": 1, "input_shape": [3, length], "num_classes": 5, "layers": [
        {"type": "conv1d", "in": 3, "out": 8, "kernel": 5, "stride": 2, "padding": 2},
        {"type": "batchnorm1d", "channels": 8},
        {"type": "relu"},
        {"type": "maxpool1d", "kernel": 2},
        {"type": "conv1d", "in": 8, "out": 8, "kernel": 3, "groups": 4, "bias": False},
        {"type": "groupnorm", "groups": 2, "channels": 8},
        {"type": "avgpool1d", "kernel": 3, "stride": 1},
        {"type": "global_avgpool"},
        {"type": "linear", "in": 8, "out": 5}]}


@pytest.mark.parametrize("length", [21, 37, 300])
def test_shapes_params_and_flops_match_torch(length: int) -> None:
    spec = validate_spec(series_spec(length))
    model = build_model(spec).eval()
    x = torch.randn(2, 3, length)
    shapes, out = [], x
    for layer in model.layers:
        out = layer(out)
        shapes.append(tuple(out.shape[1:]))
    assert infer_shapes(spec) == shapes
    assert count_params(spec) == sum(p.numel() for p in model.parameters())
    with FlopCounterMode(display=False) as counter:
        model(torch.randn(1, 3, length))
    assert count_flops(spec) == counter.get_total_flops()  # conv and linear, 2 x MACs, as torch counts


def test_cnn1d_is_length_agnostic_in_size_and_runs_at_every_width() -> None:
    assert count_params(cnn1d(1, 11, length=300)) == count_params(cnn1d(1, 11, length=1460))
    assert count_flops(cnn1d(1, 11, length=1460)) > 4 * count_flops(cnn1d(1, 11, length=300))
    for width in (0.25, 0.5, 1.0):
        for norm in (None, "batchnorm", "groupnorm"):
            spec = model_for_dataset("cnn1d", (6, 100), 4, width=width, norm=norm)
            assert build_model(spec)(torch.randn(2, 6, 100)).shape == (2, 4)
    assert count_params(cnn1d(1, 11, width=0.5)) < count_params(cnn1d(1, 11)) / 3


@pytest.mark.parametrize(("layer", "shape", "match"), [
    ({"type": "conv1d", "in": 3, "out": 4, "kernel": 3}, [3, 8, 8], r"conv1d needs a \(C, L\) input"),
    ({"type": "conv1d", "in": 2, "out": 4, "kernel": 3}, [3, 8], "conv1d 'in' is 2 but the input has 3"),
    ({"type": "conv1d", "in": 3, "out": 4, "kernel": 9}, [3, 8], "kernel 9 does not fit input size 8"),
    ({"type": "maxpool1d", "kernel": 9}, [3, 8], "maxpool1d kernel 9 larger than input length 8"),
    ({"type": "batchnorm1d", "channels": 4}, [3, 8], "batchnorm1d 'channels' is 4 but the input has 3"),
    ({"type": "conv2d", "in": 3, "out": 4, "kernel": 3}, [3, 8], r"conv2d needs a \(C, H, W\) input"),
])
def test_a_layer_on_the_wrong_shape_is_refused_by_name(layer: dict, shape: list, match: str) -> None:
    with pytest.raises(SpecError, match=match):
        validate_spec({"format": 1, "input_shape": shape, "num_classes": 2, "layers": [layer]})


def test_image_families_refuse_a_series_and_cnn1d_an_image() -> None:
    with pytest.raises(ValueError, match=r"for a \(C, L\) series use cnn1d"):
        model_for_dataset("cnn4", (1, 300), 11)
    with pytest.raises(ValueError, match=r"cnn1d needs a \(C, L\) series"):
        model_for_dataset("cnn1d", (1, 28, 28), 10)


def test_series_norm_standardises_each_series_and_keeps_its_log_scale() -> None:
    spec = validate_spec({"format": 1, "input_shape": [2, 50], "num_classes": 3, "layers": [
        {"type": "series_norm"}, {"type": "global_avgpool"}, {"type": "linear", "in": 4, "out": 3}]})
    assert infer_shapes(spec)[0] == (4, 50) and count_params(spec) == 15
    norm = build_model(spec).layers[0]
    x = torch.randn(3, 2, 50, dtype=torch.float64) * torch.tensor([[[1e-3]], [[1.0]], [[1e3]]], dtype=torch.float64) + 5
    out = norm(x)
    torch.testing.assert_close(out[:, :2].mean(dim=2), torch.zeros(3, 2, dtype=torch.float64), atol=1e-6, rtol=0)
    torch.testing.assert_close(out[:, :2].std(dim=2, unbiased=False), torch.ones(3, 2, dtype=torch.float64),
                               atol=1e-4, rtol=0)  # a series with a std of 1e-3 too: eps sits on the std
    torch.testing.assert_close(out[:, 2:, 0], x.std(dim=2, unbiased=False).log(), atol=1e-4, rtol=0)
    assert cnn1d(1, 11)["layers"][0] == {"type": "series_norm", "log_scale": True}
    assert cnn1d(1, 11, series_norm=False)["layers"][0]["type"] == "conv1d"
