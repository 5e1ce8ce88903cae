"""A whole FedAvg job over a real MQTT broker on real MNIST digits."""

from __future__ import annotations

import csv
import json

import pytest

from simulation.simulate import SimulationConfig, run_simulation, sim_federation
from edge_sdk.training import TrainConfig

pytestmark = pytest.mark.slow  # a whole simulated job over a real broker


@pytest.fixture(scope="module")
def fedavg_run(tmp_path_factory, broker):
    out = tmp_path_factory.mktemp("fedavg")
    config = SimulationConfig(method="fedavg", clients=4, dataset="mnist-sample", partition="iid", out=str(out),
                              broker_url=broker.url, job="e2e",
                              federation=sim_federation(rounds=3, seed=0,
                                                        train=TrainConfig(epochs=2, batch_size=32, lr=0.05)))
    return out, run_simulation(config)


def test_fedavg_learns_real_digits(fedavg_run):
    out, report = fedavg_run
    accuracies = [r.accuracy["global"] for r in report.rounds]
    assert len(accuracies) == 3
    assert accuracies[-1] >= 0.90, accuracies  # 4,000 training digits, 4 devices, 3 rounds
    assert all(r.aggregated and len(r.participants) == 4 for r in report.rounds)


def test_report_schema_and_byte_accounting(fedavg_run):
    out, report = fedavg_run
    data = json.loads((out / "report.json").read_text())
    assert data["method"] == "fedavg"
    assert {"method", "config", "devices", "rounds", "models", "final"} <= set(data)
    assert len(data["devices"]) == 4
    assert {d["assignment"] for d in data["devices"]} == {"global"}
    assert all(d["flops"] > 0 for d in data["devices"])
    model = data["models"]["global"]
    # each device downloads one plan and uploads one update of about the model's size each round
    raw = model["params"] * 4
    assert raw <= model["payload_bytes"] <= 1.01 * raw + 4096
    for r in data["rounds"]:
        assert {"round", "accuracy", "loss", "bytes_down", "bytes_up", "seconds", "participants"} <= set(r)
        assert 4 * raw <= r["bytes_up"] <= 4 * (1.01 * raw + 4096)
        assert 4 * model["payload_bytes"] <= r["bytes_down"]
        assert r["seconds"] > 0
    assert data["final"]["bytes_up_total"] == sum(r["bytes_up"] for r in data["rounds"])
    rows = list(csv.DictReader(open(out / "metrics.csv")))
    assert [(int(r["round"]), int(r["round_index"])) for r in rows] == [(1, 0), (2, 1), (3, 2)]
    assert (out / "accuracy.png").stat().st_size > 1000 and (out / "bytes.png").stat().st_size > 1000
    assert data["rejections"] == []
