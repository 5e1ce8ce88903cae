"""One input normalisation per job: devices convert their data to it, the plan carries it, and the
published model applies it itself, so `edgefl predict` takes raw inputs (issue 36, item 1)."""

from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
import pytest
import torch

from coordinator.runtime.export import export_onnx
from coordinator.runtime.coordinator_command import coordinator_config_from_toml, job_preprocessing
from edge_sdk.client import ClientConfig, DeviceClient
from edge_sdk.data.datasets import load_dataset
from edge_sdk.inference import OnnxClassifier
from edge_sdk.methods import LocalData
from edge_sdk.models.spec import build_model
from edge_sdk.models.zoo import model_for_dataset
from edge_sdk.data.preprocessing import Preprocessing
from edge_sdk.profiling import load_profile
from edge_sdk.protocol.errors import ProtocolError
from edge_sdk.protocol.messages import Envelope, Plan, decode_envelope, encode_envelope
from edge_sdk.training import TrainConfig, train_local
from tests.support.requirements import require

NO_TORCH = "import sys; sys.modules['torch'] = None; from edge_sdk.cli import main; sys.exit(main(sys.argv[1:]))"


def _raw_images(seed: int, n: int, mean: float, spread: float) -> np.ndarray:
    return np.random.default_rng(seed).normal(mean, spread, size=(n, 1, 4, 4)).clip(0, 255).astype(np.float32)


def test_bad_preprocessing_is_one_line_naming_what_is_wrong():
    for data, words in [({"mean": [1.0]}, "needs 'std'"), ({"mean": [1.0], "std": [0.0]}, "> 0"),
                        ({"mean": [1.0, 2.0], "std": [1.0]}, "2 means but 1 stds"),
                        ({"mean": [float("nan")], "std": [1.0]}, "finite"),
                        ({"mean": "12", "std": [1.0]}, "list of 1..1024 numbers"),
                        ({"mean": [1.0], "std": [1.0], "scale": 2}, "unknown key(s) 'scale'"),
                        ({"mean": [1.0], "std": [1.0], "classes": ["x" * 65]}, "names of 1..64"),
                        ({"mean": [1.0], "std": [1.0], "input_shape": [3, 8, 8]}, "has 3"),
                        ({"mean": [1.0], "std": [1.0], "resample": 1}, "resample must be true or false"),
                        ({"mean": [1.0], "std": [1.0], "input_shape": [1, 8, 8], "resample": True},
                         "resample needs a series input_shape")]:
        with pytest.raises(ValueError, match="preprocessing") as info:
            Preprocessing.from_dict(data)
        assert words in str(info.value) and "\n" not in str(info.value)
    prep = Preprocessing([1, 2], [3, 4], ("a", "b"), (2, 5, 5))
    assert Preprocessing.from_json(prep.to_json()) == prep and prep.normalisation() == {"mean": [1.0, 2.0],
                                                                                         "std": [3.0, 4.0]}


def test_data_normalised_with_its_own_statistics_converts_to_the_jobs():
    raw = _raw_images(0, 50, 90.0, 40.0)
    own = Preprocessing([float(raw.mean())], [float(raw.std())])
    job = Preprocessing([33.0], [78.0])
    data = LocalData(own.apply(raw), np.zeros(50, np.int64), 10, own)
    converted = data.normalised_as(job)
    assert converted.preprocessing == job and converted.y is data.y
    np.testing.assert_allclose(converted.x, job.apply(raw), rtol=1e-5, atol=1e-5)
    assert converted.normalised_as(job) is converted  # already in the job's normalisation: no copy
    assert LocalData(raw, data.y, 10).normalised_as(job).x is raw  # unknown own normalisation: kept as it is


def test_a_plan_carries_the_normalisation_and_a_bad_one_is_refused():
    plan = Plan("fedavg", "global", {"layers": []}, {}, {"lr": 0.1}, {"mean": [33.0], "std": [78.0]})
    env = decode_envelope(encode_envelope(Envelope("plan", "coordinator", plan, 0)))
    assert env.body.preprocessing == {"mean": [33.0], "std": [78.0]}
    old = decode_envelope(encode_envelope(Envelope("plan", "coordinator", Plan("fedavg", "global", {}, {}, {}), 0)))
    assert old.body.preprocessing is None  # a coordinator that sends none: the device keeps its own
    bad = Plan("fedavg", "global", {}, {}, {}, {"mean": [1.0], "std": [-1.0]})
    with pytest.raises(ProtocolError, match="> 0"):
        decode_envelope(encode_envelope(Envelope("plan", "coordinator", bad, 0)))


def test_two_devices_with_different_data_train_on_the_same_scale(tmp_path):
    """Two devices whose raw pixels differ (a bright and a dark camera) each normalise with their own
    statistics when loaded; the job's plan brings both to the job's normalisation."""
    profile = load_profile("raspberry-pi-4b")
    job = Preprocessing([100.0], [50.0])
    plan = Plan("fedavg", "global", {}, {}, {}, job.normalisation())
    inputs = []
    for seed, brightness in ((1, 60.0), (2, 160.0)):
        raw = _raw_images(seed, 40, brightness, 30.0)
        own = Preprocessing([float(raw.mean())], [float(raw.std())])
        client = DeviceClient(ClientConfig(device_id=f"cam{seed}"),
                              LocalData(own.apply(raw), np.zeros(40, np.int64), 10, own), profile)
        data = client.local.for_plan(plan)
        assert client.local.for_plan(plan) is data  # converted once per job
        np.testing.assert_allclose(data.x, job.apply(raw), atol=1e-4)
        inputs.append(float(data.x.mean()))
    assert inputs[0] < -0.5 < 0.5 < inputs[1]  # the dark camera's inputs stay darker: one scale, not two


def test_the_coordinator_task_table_sets_the_jobs_normalisation(tmp_path):
    path = tmp_path / "coordinator.toml"
    path.write_text('dataset = "digits"\n[task]\nmean = [33.0]\nstd = [78.0]\nclasses = ["zero","one","two","three","four","five",'
                    '"six","seven","eight","nine"]\n')
    task = coordinator_config_from_toml(path).task
    data = load_dataset("digits")
    prep, eval_x = job_preprocessing(data, task)
    assert prep.mean == (33.0,) and prep.classes[3] == "three" and prep.input_shape == data.input_shape
    raw = data.x_test * np.float32(data.std[0]) + np.float32(data.mean[0])
    np.testing.assert_allclose(eval_x, (raw - 33.0) / 78.0, atol=1e-4)
    assert job_preprocessing(data, None) == (data.preprocessing, data.x_test)
    path.write_text('dataset = "digits"\n[task]\nmean = [33.0]\nstd = [0]\n')
    with pytest.raises(ValueError, match=r"coordinator.toml: \[task\] preprocessing std must hold finite numbers > 0"):
        coordinator_config_from_toml(path)
    path.write_text('dataset = "digits"\n[task]\nmean = [33.0]\nstd = [1.0]\nclasses = ["a", "b"]\n')
    with pytest.raises(ValueError, match="classes names 2 classes; the data has 10"):
        job_preprocessing(data, coordinator_config_from_toml(path).task)


@pytest.fixture(scope="module")
def published(tmp_path_factory):
    """A cnn4 trained on real 8x8 digits, exported as the coordinator publishes it (with the job's
    preprocessing), and the same network exported as before (no preprocessing)."""
    require("onnxruntime")
    data = load_dataset("digits")
    torch.manual_seed(0)
    model = build_model(model_for_dataset("cnn4", data.input_shape, data.num_classes, width=0.5))
    train_local(model, data.x_train, data.y_train, TrainConfig(epochs=2, batch_size=32, lr=0.05, momentum=0.9))
    folder = tmp_path_factory.mktemp("models")
    prep = Preprocessing(data.mean, data.std, tuple(f"digit {c}" for c in data.classes), data.input_shape)
    assert export_onnx(model, folder / "new.onnx", data.x_test[:16], preprocessing=prep) < 1e-3
    export_onnx(model, folder / "old.onnx", data.x_test[:16])
    model.eval()
    with torch.no_grad():
        expected = model(torch.from_numpy(data.x_test)).argmax(1).numpy()
    raw = data.x_test * np.float32(data.std[0]) + np.float32(data.mean[0])
    np.save(folder / "raw.npy", raw)
    return data, folder, expected, prep


def _predict(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", NO_TORCH, "predict", *args], capture_output=True, text=True)


def test_a_published_model_takes_raw_inputs_and_names_its_classes(published):
    data, folder, expected, prep = published
    classifier = OnnxClassifier(folder / "new.onnx")
    assert classifier.preprocessing == prep
    proc = _predict("--model", str(folder / "new.onnx"), str(folder / "raw.npy"))
    assert proc.returncode == 0, proc.stderr
    rows = [json.loads(line) for line in proc.stdout.splitlines()]
    assert [r["class"] for r in rows] == expected.tolist()
    # a model that learned (0.680 measured 2026-11-25; chance: 0.1), on raw pixels
    assert np.mean(expected == data.y_test) > 0.65
    assert rows[0]["label"] == f"digit {rows[0]['class']}"
    shown = json.loads(_predict("--model", str(folder / "new.onnx"), "--show").stdout)
    assert shown["inputs"] == "raw" and shown["input_shape"] == [1, 8, 8] and shown["dtype"] == "float32"
    assert shown["preprocessing"]["mean"] == list(prep.mean) and len(shown["preprocessing"]["classes"]) == 10
    twice = _predict("--model", str(folder / "new.onnx"), "--mean", "7", "--std", "5", str(folder / "raw.npy"))
    assert twice.returncode == 2 and "normalises raw inputs itself" in twice.stderr and "drop --mean/--std" in twice.stderr
    assert len(twice.stderr.strip().splitlines()) == 1


def test_a_model_without_preprocessing_asks_for_it_instead_of_guessing(published):
    data, folder, expected, _ = published
    proc = _predict("--model", str(folder / "old.onnx"), str(folder / "raw.npy"))
    assert proc.returncode == 2 and proc.stdout == ""
    assert "carries no preprocessing" in proc.stderr and "--mean" in proc.stderr
    ok = _predict("--model", str(folder / "old.onnx"), "--mean", str(data.mean[0]), "--std", str(data.std[0]),
                  str(folder / "raw.npy"))
    assert ok.returncode == 0, ok.stderr
    assert [json.loads(line)["class"] for line in ok.stdout.splitlines()] == expected.tolist()
    np.save(folder / "normalised.npy", data.x_test)
    already = _predict("--model", str(folder / "old.onnx"), "--normalised", str(folder / "normalised.npy"))
    assert [json.loads(line)["class"] for line in already.stdout.splitlines()] == expected.tolist()
