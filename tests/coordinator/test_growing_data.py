"""A fleet whose data grows on the devices, and a device with no data yet, over a real broker:
each device re-reads its CSV every round it trains; the new rows count (within the growth
`FleetLimits` allows, beyond it at the weight allowed); a device whose source is missing answers
`no_data`, stays in the fleet, is not waited for, and trains once its file appears; the devices'
held-out rows measure the model (federated evaluation; the coordinator has no data)."""

from __future__ import annotations

import csv
from pathlib import Path

import numpy as np

from coordinator.core.federation import FederationConfig
from coordinator.runtime.fleet import Fleet
from coordinator.runtime.report import RunReport
from coordinator.runtime.round_loop import RoundLoop
from coordinator.runtime.task import Task
from coordinator.strategies.base import StrategyContext
from coordinator.strategies.fedavg import FedAvg
from edge_sdk.device_config import client_from_toml
from edge_sdk.networking.link import MessageLink
from edge_sdk.data.preprocessing import Preprocessing
from edge_sdk.protocol.topics import Topics
from edge_sdk.training import TrainConfig
from edge_sdk.networking.transport import MqttTransport, TransportConfig

JOB = "growing"
FEATURES = [f"p{i}" for i in range(64)]
NAMES = ["zero", "one", "two", "three", "four", "five", "six", "seven", "eight", "nine"]


def _digits() -> tuple[np.ndarray, np.ndarray]:
    from sklearn.datasets import load_digits
    digits = load_digits()
    return digits.data.astype(np.float32), digits.target.astype(np.int64)


def _write(path: Path, x: np.ndarray, y: np.ndarray, start: int, append: bool = False) -> None:
    with open(path, "a" if append else "w", newline="") as fh:
        writer = csv.writer(fh)
        if not append:
            writer.writerow(["ts", *FEATURES, "label"])
        for i, (row, label) in enumerate(zip(x, y, strict=True)):
            writer.writerow([start + i, *[f"{v:g}" for v in row], NAMES[label]])


def _client_toml_text(tmp: Path, url: str, name: str, seed: int, job: str = JOB, top: str = "", data: str = "",
                      holdout: float = 0.25) -> str:
    """A client TOML of a device reading ``<tmp>/<name>.csv``."""
    return f"""
device_id = "{name}"
job = "{job}"
seed = {seed}
{top}
[broker]
url = "{url}"
[device]
profile = "raspberry-pi-4b"
[data]
csv = "{tmp / name}.csv"
key = "ts"
input_shape = [1, 8, 8]
classes = {NAMES!r}
holdout = {holdout}
{data}
""".replace("'", '"')


def _client(tmp: Path, url: str, name: str, seed: int, job: str = JOB, top: str = "", data: str = ""):
    """A device reading ``<tmp>/<name>.csv`` (``top``, ``data``: more lines for the TOML's top and
    its ``[data]`` table)."""
    toml = tmp / f"{name}.toml"
    toml.write_text(_client_toml_text(tmp, url, name, seed, job, top, data))
    return client_from_toml(toml)


def test_data_that_grows_counts_and_a_device_without_data_stays(tmp_path, broker) -> None:
    x, y = _digits()
    order = np.random.default_rng(0).permutation(len(x))
    parts = {"d0": order[:700], "d1": order[700:1400], "late": order[1400:1797]}
    for name in ("d0", "d1"):
        _write(tmp_path / f"{name}.csv", x[parts[name][:400]], y[parts[name][:400]], start=0)
    # "late" has no file yet: it registers with no data and answers no_data
    clients = [_client(tmp_path, broker.url, name, i) for i, name in enumerate(("d0", "d1", "late"))]
    appended: dict[str, int] = {"d0": 400, "d1": 400}

    def grow(name: str):
        def after_round(trained) -> None:  # 60 new rows after each round: within a round's growth
            rows = parts[name][appended[name]:appended[name] + 60]
            _write(tmp_path / f"{name}.csv", x[rows], y[rows], start=appended[name], append=True)
            appended[name] += len(rows)
            if name == "d0" and trained.round == 0:  # the late device's file appears after round 1
                _write(tmp_path / "late.csv", x[parts["late"]], y[parts["late"]], start=0)
        return after_round
    clients[0].on_round, clients[1].on_round = grow("d0"), grow("d1")
    assert len(clients[2].data) == 0 and clients[2].holdout is None

    federation = FederationConfig(rounds=4, min_devices=3, round_deadline_s=60, seed=0,
                                  train=TrainConfig(epochs=2, lr=0.05, batch_size=16, threads=1))
    strategy = FedAvg.create(StrategyContext(federation, "mlp", (1, 8, 8), 10))
    transport = MqttTransport(TransportConfig(url=broker.url, client_id=f"{JOB}-coordinator"))
    transport.connect()
    fleet = Fleet(MessageLink(transport), Topics(job=JOB), task=Task((1, 8, 8), 10))
    fleet.start()
    import threading
    threads = [threading.Thread(target=c.run, daemon=True) for c in clients]
    for thread in threads:
        thread.start()
    try:
        report = RoundLoop(strategy, fleet, RunReport("fedavg", {}),
                           preprocessing=Preprocessing((4.88,), (6.02,), tuple(NAMES), (1, 8, 8))).run()
    finally:
        for thread in threads:
            thread.join(timeout=20)
        transport.close()
    rounds = report.rounds
    assert all(r.accuracy == {} for r in rounds)  # the coordinator has no data of its own
    # round 1: the late device said no_data (not waited for: the two others' updates made the round)
    assert rounds[0].participants == ["d0", "d1"]
    assert rounds[0].evaluation["no_evaluation"] == 1 and rounds[0].evaluation["devices"] == 2
    # from round 2 on it trains: its 397 rows count as far as growth from 0 allows, more each round
    assert rounds[1].participants == ["d0", "d1", "late"]
    assert rounds[-1].evaluation["devices"] == 3 and rounds[-1].evaluation["no_evaluation"] == 0
    assert rounds[-1].federated_accuracy["global"] > 0.8, [r.federated_accuracy for r in rounds]
    # the late device's ~300 training rows came at once: it weighed what growth from 0 allows
    # (sample_growth_min = 64 per round since it registered), 128, 192, then 256, catching up
    assert fleet.devices["late"].num_samples == 4 * 64 < len(clients[2].data)
    # d0's training count grew with its file (~300 of 400 rows at first, ~0.75 of 580 at the end)
    assert fleet.devices["d0"].num_samples > 400 and len(clients[0].data) == fleet.devices["d0"].num_samples
    # nothing it holds out was ever trained on: holdout and training keys are disjoint, held-out share ~0.25
    c0 = clients[0]
    assert not set(c0.holdout.keys.tolist()) & set(c0.data.keys.tolist())
    assert 0.18 < len(c0.holdout) / (len(c0.holdout) + len(c0.data)) < 0.32
    assert not [r for r in fleet.rejections if r[1] != "not_training"], list(fleet.rejections)
