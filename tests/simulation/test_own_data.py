"""`edgefl simulate --dataset client:FILE`: a device's own [data] as a simulated job's dataset, its
held-out side (by key) the test set, so a user gets a baseline of their task before a device joins."""

from __future__ import annotations

import json
import subprocess

import numpy as np

from edge_sdk.data.holdout import held_out
from simulation.own_data import load_simulation_dataset
from tests.coordinator.test_growing_data import NAMES, _client_toml_text, _digits, _write
from tests.project.test_cli_front_door import EDGEFL


def test_a_client_toml_is_a_dataset_whose_test_set_is_its_held_out_side(tmp_path) -> None:
    x, y = _digits()
    _write(tmp_path / "d0.csv", x[:600], y[:600], start=0)
    toml = tmp_path / "d0.toml"
    toml.write_text(_client_toml_text(tmp_path, "mqtt://127.0.0.1:1", "d0", 0, holdout=0.25))
    dataset = load_simulation_dataset(f"client:{toml}")
    keys = np.arange(600, dtype=np.uint64)  # the CSV's key column "ts"
    held = held_out(keys, 0.25)
    assert (len(dataset.x_train), len(dataset.x_test)) == (int((~held).sum()), int(held.sum()))
    assert dataset.classes == tuple(NAMES) and dataset.x_train.shape[1:] == (1, 8, 8)
    # the test set is exactly the held-out rows: their labels, in the file's order reversed (newest first)
    np.testing.assert_array_equal(np.sort(dataset.y_test), np.sort(y[:600][held]))


def test_simulate_on_ones_own_data_gives_a_baseline(tmp_path) -> None:
    x, y = _digits()
    _write(tmp_path / "d0.csv", x, y, start=0)
    toml = tmp_path / "d0.toml"
    toml.write_text(_client_toml_text(tmp_path, "mqtt://127.0.0.1:1", "d0", 0, holdout=0.2))
    out = tmp_path / "out"
    run = subprocess.run([*EDGEFL, "simulate", "--dataset", f"client:{toml}", "--model", "mlp", "--clients", "3",
                          "--rounds", "3", "--out", str(out), "--seed", "0"], capture_output=True, text=True,
                         timeout=300)
    assert run.returncode == 0, run.stderr[-2000:]
    report = json.loads((out / "report.json").read_text())
    assert report["config"]["dataset"] == f"client:{toml}"
    assert report["final"]["accuracy"]["global"] > 0.8
    missing = subprocess.run([*EDGEFL, "simulate", "--dataset", f"client:{tmp_path / 'none.toml'}"],
                             capture_output=True, text=True, timeout=60)
    assert missing.returncode == 2 and "none.toml" in missing.stderr and "no such file" in missing.stderr
