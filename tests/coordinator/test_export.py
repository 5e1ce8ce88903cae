"""ONNX export: onnxruntime computes what torch computes, for plain and pre-composed FLANC networks."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from coordinator.runtime.export import export_onnx, onnx_max_abs_diff
from edge_sdk.data.datasets import load_dataset
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
    from edge_sdk.data.preprocessing import Preprocessing

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


def test_a_resampling_series_model_takes_any_length_and_resamples_as_the_loader_did(tmp_path):
    """PLAID's series vary in length: the loader resampled each to the model's (sensor_datasets.resample);
    the published model does the same in its graph, so `edgefl predict` takes a series of any length."""
    from edge_sdk.inference import OnnxClassifier
    from edge_sdk.models.zoo import cnn1d
    from edge_sdk.data.preprocessing import Preprocessing
    from edge_sdk.data.sensor_datasets import resample

    torch.manual_seed(0)
    model = build_model(cnn1d(in_channels=1, num_classes=3, length=60)).eval()
    preprocessing = Preprocessing((2.0,), (3.0,), ("fan", "fridge", "heater"), (1, 60), resample=True)
    rng = np.random.default_rng(0)
    train = preprocessing.apply(rng.normal(2, 3, (8, 1, 60)).astype(np.float32))
    export_onnx(model, tmp_path / "m.onnx", train, preprocessing=preprocessing)
    classifier = OnnxClassifier(tmp_path / "m.onnx")
    assert classifier.preprocessing == preprocessing  # carried in the metadata, resample included
    for length in (2, 17, 60, 123, 1344):  # (a 1-value series is constant: series_norm divides by its eps)
        raw = (2 + 3 * np.sin(np.linspace(0, 9, length)) + rng.normal(0, 0.5, length)).astype(np.float32)
        as_loaded = preprocessing.apply(resample(raw[None], 60)[None])  # what the model trained on
        with torch.no_grad():
            expected = model(torch.from_numpy(as_loaded)).numpy()
        got = classifier.logits(raw[None])  # one raw series of this length, (N, L) for one channel
        assert np.allclose(got, expected, atol=1e-4 * max(1.0, float(np.abs(expected).max()))), length
        assert np.allclose(classifier.logits(raw[None, None]), got)  # (N, C, L) alike
    with pytest.raises(ValueError, match="series of 1 channel"):
        classifier.logits(np.zeros((1, 2, 50), np.float32))
    with pytest.raises(ValueError, match="resample needs a series input_shape"):
        Preprocessing((0.0,), (1.0,), (), (1, 28, 28), resample=True)


def test_a_repeating_series_model_takes_any_length_and_repeats_as_the_loader_did(tmp_path):
    """PLAID's windows: a shorter series repeated end to end, a longer one cut (sensor_datasets.repeat_to);
    the published MiniRocket model does the same in its graph."""
    from edge_sdk.data.preprocessing import Preprocessing
    from edge_sdk.data.sensor_datasets import repeat_to
    from edge_sdk.inference import OnnxClassifier
    from edge_sdk.models.minirocket_biases import fleet_biases, series_statistics
    from edge_sdk.models.zoo import minirocket

    torch.manual_seed(0)
    model = build_model(minirocket(in_channels=1, num_classes=3, length=60, features=840)).eval()
    preprocessing = Preprocessing((2.0,), (3.0,), ("fan", "fridge", "heater"), (1, 60), repeat=True)
    rng = np.random.default_rng(0)
    train = preprocessing.apply(rng.normal(2, 3, (8, 1, 60)).astype(np.float32))
    plan = model.layers[0].plan
    stats = series_statistics(plan, train)
    model.layers[0].biases.copy_(torch.as_tensor(fleet_biases(plan, stats["shares"], stats["scales"], np.ones(1), 0)))
    export_onnx(model, tmp_path / "m.onnx", train, preprocessing=preprocessing)
    classifier = OnnxClassifier(tmp_path / "m.onnx")
    assert classifier.preprocessing == preprocessing  # carried in the metadata, repeat included
    for length in (7, 59, 60, 61, 1344):
        raw = (2 + 3 * np.sin(np.linspace(0, 9, length)) + rng.normal(0, 0.5, length)).astype(np.float32)
        as_loaded = preprocessing.apply(repeat_to(raw[None], 60)[None])  # what the model trained on
        with torch.no_grad():
            expected = model(torch.from_numpy(as_loaded)).numpy()
        assert np.allclose(classifier.logits(raw[None]), expected, atol=1e-4 * max(1.0, float(np.abs(expected).max())))
    assert np.array_equal(repeat_to(np.arange(3.0)[None], 7), [[0, 1, 2, 0, 1, 2, 0]])
    with pytest.raises(ValueError, match="resample or repeat, not both"):
        Preprocessing((0.0,), (1.0,), (), (1, 60), resample=True, repeat=True)


def test_exporting_with_preprocessing_leaves_the_model_in_its_mode(tmp_path):
    from edge_sdk.data.preprocessing import Preprocessing

    model = build_model(resnet_small(in_channels=1, num_classes=3, image_size=8))
    x = np.random.default_rng(0).normal(size=(4, 1, 8, 8)).astype(np.float32)
    for training in (False, True):
        model.train(training)
        export_onnx(model, tmp_path / "m.onnx", x, preprocessing=Preprocessing((0.5,), (2.0,), (), (1, 8, 8)))
        assert all(m.training == training for m in model.modules())  # BatchNorm's statistics untouched by eval
