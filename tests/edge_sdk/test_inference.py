"""On-device inference: an ONNX export of a model trained on real digits, run by onnxruntime
(in-process and through `edgefl predict` in a process where torch cannot be imported)."""

from __future__ import annotations

import io
import json
import subprocess
import sys

import numpy as np
import pytest
import torch

from edge_sdk.data.datasets import load_dataset
from edge_sdk.inference import OnnxClassifier, default_model_path, load_batch, normalize
from edge_sdk.models.spec import build_model
from edge_sdk.models.zoo import model_for_dataset
from edge_sdk.training import TrainConfig, train_local
from tests.support.requirements import needs, require

pytestmark = needs("onnxruntime")

NO_TORCH = "import sys; sys.modules['torch'] = None; from edge_sdk.cli import main; sys.exit(main(sys.argv[1:]))"


def _export(model: torch.nn.Module, path, shape) -> None:
    model.eval()
    torch.onnx.export(model, torch.zeros((2, *shape)), str(path), dynamo=False, input_names=["x"],
                      output_names=["logits"], dynamic_axes={"x": {0: "n"}, "logits": {0: "n"}})


@pytest.fixture(scope="module")
def digits_model(tmp_path_factory):
    """A cnn4 (width 0.5) trained for two epochs on scikit-learn's real 8x8 digits, exported to ONNX."""
    data = load_dataset("digits")
    torch.manual_seed(0)
    model = build_model(model_for_dataset("cnn4", data.input_shape, data.num_classes, width=0.5))
    train_local(model, data.x_train, data.y_train, TrainConfig(epochs=2, batch_size=32, lr=0.05, momentum=0.9))
    state_dir = tmp_path_factory.mktemp("state")
    _export(model, default_model_path(state_dir), data.input_shape)
    with torch.no_grad():
        expected = model(torch.from_numpy(data.x_test)).numpy()
    return data, model, state_dir, expected


def test_onnxruntime_matches_torch_on_real_digits(digits_model):
    data, _, state_dir, expected = digits_model
    clf = OnnxClassifier(default_model_path(state_dir), threads=1)
    assert clf.sample_shape == data.input_shape
    logits = clf.logits(data.x_test, batch_size=100)  # several batches
    np.testing.assert_allclose(logits, expected, rtol=1e-4, atol=1e-4)
    pred = clf.predict(data.x_test)
    assert (pred.classes == expected.argmax(1)).all()
    assert np.allclose(pred.probabilities.sum(1), 1.0, atol=1e-5)
    assert (pred.classes == data.y_test).mean() > 0.65  # it learned the digits: 0.680 measured 2026-11-25


def test_flat_rows_are_reshaped_and_bad_inputs_refused(digits_model):
    data, _, state_dir, expected = digits_model
    clf = OnnxClassifier(default_model_path(state_dir))
    flat = data.x_test[:5].reshape(5, -1)
    assert (clf.predict(flat).classes == expected[:5].argmax(1)).all()
    with pytest.raises(ValueError, match="expects"):
        clf.predict(np.zeros((2, 10), np.float32))
    bad = data.x_test[:2].copy()
    bad[0, 0, 0, 0] = np.nan
    with pytest.raises(ValueError, match="NaN"):
        clf.predict(bad)
    with pytest.raises(FileNotFoundError, match="published"):
        OnnxClassifier(state_dir / "nope.onnx")
    (state_dir / "garbage.onnx").write_bytes(b"not a model")
    with pytest.raises(ValueError, match="not a usable ONNX model"):
        OnnxClassifier(state_dir / "garbage.onnx")


def test_model_from_the_coordinators_exporter(digits_model, tmp_path):
    require("onnx")
    from coordinator.runtime import export

    data, model, _, expected = digits_model
    path = default_model_path(tmp_path)
    assert export.export_onnx(model, path, data.x_test[:8]) < 1e-4
    assert (OnnxClassifier(path).predict(data.x_test).classes == expected.argmax(1)).all()


def test_load_batch_formats(tmp_path):
    x = np.arange(12, dtype=np.float32).reshape(3, 4)
    buf = io.BytesIO()
    np.save(buf, x)
    assert np.array_equal(load_batch(buf.getvalue()), x)
    np.savez(tmp_path / "b.npz", x_test=x, other=x * 2)
    assert np.array_equal(load_batch(tmp_path / "b.npz"), x)
    assert np.array_equal(load_batch(tmp_path / "b.npz", key="other"), x * 2)
    assert np.array_equal(load_batch(b"0, 1, 2, 3\n# comment\n4 5 6 7\n8,9,10,11\n"), x)
    assert np.array_equal(load_batch(json.dumps(x.tolist()).encode()), x)
    assert load_batch(b"[1, 2, 3]").shape == (1, 3)  # one sample
    obj = io.BytesIO()
    np.save(obj, np.array([{"a": 1}], dtype=object), allow_pickle=True)
    for bad in (obj.getvalue(), b"1 2\n3\n", b"", b"1 two 3", b"\xff\xfe"):
        with pytest.raises(ValueError):
            load_batch(bad)
    with pytest.raises(ValueError, match="choose one"):
        load_batch(tmp_path / "b.npz", key="missing")


def test_normalize_per_channel():
    x = np.stack([np.full((2, 2), 10.0), np.full((2, 2), 20.0)])[None]  # 1 x 2 x 2 x 2
    out = normalize(x, [10.0, 10.0], [1.0, 5.0])
    assert out.dtype == np.float32 and np.allclose(out[0, 0], 0.0) and np.allclose(out[0, 1], 2.0)
    with pytest.raises(ValueError):
        normalize(x, [1.0], [1.0])
    with pytest.raises(ValueError):
        normalize(x, [1.0, 2.0], [1.0, 0.0])


def test_cli_predict_from_stdin_without_torch(digits_model, tmp_path):
    data, _, state_dir, expected = digits_model
    config = tmp_path / "client.toml"
    config.write_text(f'device_id = "pi"\nstate_dir = "{state_dir}"\n')
    # raw 0..16 pixels on stdin as text rows; the device normalises them like its training data
    raw = data.x_test[:6] * np.asarray(data.std)[None, :, None, None] + np.asarray(data.mean)[None, :, None, None]
    text = "\n".join(" ".join(f"{v:.6f}" for v in row) for row in raw.reshape(6, -1)).encode()
    proc = subprocess.run([sys.executable, "-c", NO_TORCH, "predict", "--config", str(config), "--top", "3",
                           "--mean", str(data.mean[0]), "--std", str(data.std[0])],
                          input=text, capture_output=True, check=False)
    assert proc.returncode == 0, proc.stderr.decode()
    rows = [json.loads(line) for line in proc.stdout.decode().splitlines()]
    assert [r["class"] for r in rows] == expected[:6].argmax(1).tolist()
    assert all(r["index"] == i and len(r["top"]) == 3 and 0 < r["score"] <= 1 for i, r in enumerate(rows))


def test_cli_predict_errors(tmp_path):
    npy = tmp_path / "x.npy"
    np.save(npy, np.zeros((1, 1, 8, 8), np.float32))
    missing = subprocess.run([sys.executable, "-c", NO_TORCH, "predict", "--model", str(tmp_path / "m.onnx"),
                              str(npy)], capture_output=True, text=True)
    assert missing.returncode == 2 and "does not exist" in missing.stderr
    no_ort = NO_TORCH.replace("sys.modules['torch'] = None", "sys.modules['torch'] = sys.modules['onnxruntime'] = None")
    (tmp_path / "m.onnx").write_bytes(b"x")
    proc = subprocess.run([sys.executable, "-c", no_ort, "predict", "--model", str(tmp_path / "m.onnx"), str(npy)],
                          capture_output=True, text=True)
    assert proc.returncode == 2 and "pip install onnxruntime" in proc.stderr
