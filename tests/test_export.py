"""ONNX export: onnxruntime computes what torch computes, for plain and pre-composed FLANC networks."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from coordinator.runtime.export import export_onnx, onnx_max_abs_diff
from edge_sdk.data import load_dataset
from edge_sdk.models.flanc import to_dense
from edge_sdk.models.flanc_zoo import flanc_specs
from edge_sdk.models.spec import build_model
from edge_sdk.models.zoo import resnet_small


def test_export_matches_torch_with_a_dynamic_batch(tmp_path):
    torch.manual_seed(0)
    model = build_model(resnet_small(in_channels=3, image_size=16, width=0.5))
    x = np.random.default_rng(0).standard_normal((9, 3, 16, 16)).astype(np.float32)
    diff = export_onnx(model, tmp_path / "resnet.onnx", x)
    assert diff < 1e-4
    assert (tmp_path / "resnet.onnx").stat().st_size > 4 * 1000
    assert model.training  # mode restored
    assert onnx_max_abs_diff(model, tmp_path / "resnet.onnx", x[:2]) < 1e-4


def test_precomposed_flanc_width_exports_and_matches(tmp_path):
    digits = load_dataset("mnist-sample")
    torch.manual_seed(1)
    model = build_model(flanc_specs("cnn4", (1, 28, 28), 10, norm="batchnorm")["0.75"]).eval()
    dense = to_dense(model)
    diff = export_onnx(dense, tmp_path / "flanc.onnx", digits.x_test[:32])
    assert diff < 1e-4
    with torch.no_grad():  # and the dense network is the composed one
        x = torch.from_numpy(digits.x_test[:32])
        assert torch.allclose(model(x), dense(x), atol=1e-5)


@pytest.mark.parametrize("bad", [np.zeros((0, 3, 16, 16), np.float32), np.zeros(5, np.float32),
                                 np.full((2, 3, 16, 16), np.nan, np.float32), np.array([["a"]])])
def test_bad_inputs_are_rejected(tmp_path, bad):
    model = build_model(resnet_small(in_channels=3, image_size=16, width=0.25))
    with pytest.raises(ValueError):
        export_onnx(model, tmp_path / "x.onnx", bad)


def test_a_1d_model_with_series_norm_exports_and_matches_on_quiet_series(tmp_path):
    from edge_sdk.models.zoo import cnn1d
    from edge_sdk.preprocessing import Preprocessing

    torch.manual_seed(0)
    model = build_model(cnn1d(in_channels=2, num_classes=5, length=120)).eval()
    rng = np.random.default_rng(0)
    level = rng.uniform(5, 50, size=(64, 2, 1))
    scale = 10.0 ** rng.uniform(-3, 0, size=(64, 2, 1))  # some series barely move around their level
    raw = (level + scale * rng.standard_normal((64, 2, 120))).astype(np.float32)
    preprocessing = Preprocessing((20.0, 20.0), (10.0, 10.0), tuple("abcde"), (2, 120))
    normalised = preprocessing.apply(raw)
    diff = export_onnx(model, tmp_path / "m.onnx", normalised, preprocessing=preprocessing)
    with torch.no_grad():
        top = float(model(torch.from_numpy(normalised)).abs().max())
    assert diff <= 1e-5 * top  # in float32, the quiet series put torch and onnxruntime 1e-3 apart


def test_exporting_with_preprocessing_leaves_the_model_in_its_mode(tmp_path):
    from edge_sdk.preprocessing import Preprocessing

    model = build_model(resnet_small(in_channels=1, num_classes=3, image_size=8))
    x = np.random.default_rng(0).normal(size=(4, 1, 8, 8)).astype(np.float32)
    for training in (False, True):
        model.train(training)
        export_onnx(model, tmp_path / "m.onnx", x, preprocessing=Preprocessing((0.5,), (2.0,), (), (1, 8, 8)))
        assert all(m.training == training for m in model.modules())  # BatchNorm's statistics untouched by eval
