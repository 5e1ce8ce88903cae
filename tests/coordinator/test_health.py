"""A coordinator that cannot write (a full disk, a path it may not write) keeps serving: the error
is one line, the state is ``disk_full`` or ``write_failed`` in report.json and Home Assistant, the
earlier files stay whole, and the next round that can write clears it — over a real broker."""

from __future__ import annotations

import errno
import json
import logging
import shutil

from coordinator.core.federation import FederationConfig
from coordinator.core.health import Health
from coordinator.runtime.job import JobConnection, run_job
from coordinator.runtime.report import RunReport
from coordinator.runtime.state import load_checkpoint
from coordinator.strategies.base import StrategyContext
from coordinator.strategies.fedavg import FedAvg
from edge_sdk.client import ClientConfig, DeviceClient
from edge_sdk.data.datasets import load_dataset
from edge_sdk.data.partition import partition
from edge_sdk.methods import LocalData
from edge_sdk.networking.transport import TransportConfig
from edge_sdk.profiling import load_profile
from edge_sdk.training import TrainConfig
from tests.support.fleet_job import clients_beside
from tests.support.full_disk import full_disk


def test_a_failed_write_is_a_state_said_once_and_cleared_by_the_next_good_one(tmp_path, caplog) -> None:
    seen: list[dict] = []
    health = Health(on_change=seen.append)
    for _ in range(3):  # a full disk, three rounds in a row: one line, one change
        with full_disk(100), health.writing("the checkpoint"):
            (tmp_path / "big").write_bytes(b"x" * 1000)
    assert health.state == "disk_full" and "the checkpoint: File too large" in health.as_dict()["problem"]
    with health.writing("devices.csv"):
        raise PermissionError(errno.EACCES, "Permission denied")
    assert health.state == "disk_full"  # the worse of the two
    with health.writing("the checkpoint"):
        pass
    assert health.state == "write_failed" and health.as_dict()["problem"] == "devices.csv: Permission denied"
    with health.writing("devices.csv"):
        pass
    assert [s["state"] for s in seen] == ["disk_full", "disk_full", "write_failed", "ok"]
    errors = [r for r in caplog.records if r.levelno == logging.ERROR]
    assert len(errors) == 2 and "cannot write the checkpoint: File too large" in errors[0].getMessage()


def test_a_job_goes_on_when_its_checkpoint_cannot_be_written(tmp_path, broker) -> None:
    digits = load_dataset("digits")
    checkpoints = tmp_path / "checkpoints"
    config = FederationConfig(rounds=4, min_devices=2, round_deadline_s=60, seed=0, publish=False,
                              federated_eval=False, checkpoint_dir=str(checkpoints), train=TrainConfig(epochs=1))
    strategy = FedAvg.create(StrategyContext(config, "mlp", digits.input_shape, digits.num_classes))
    clients = [DeviceClient(ClientConfig(device_id=name, job="health", seed=0,
                                         transport=TransportConfig(url=broker.url, client_id=name)),
                            LocalData(digits.x_train[shard], digits.y_train[shard], digits.num_classes),
                            load_profile("raspberry-pi-4b"))
               for name, shard in zip(("pi-a", "pi-b"), partition(digits.y_train, 2, "iid", seed=0), strict=True)]

    devices = clients_beside(clients)

    report = RunReport(method="fedavg", config={})
    states: list[str] = []
    blocker = checkpoints / "checkpoint.tmp"  # where the checkpoint is written first: a folder, not writable

    def on_round(record) -> None:
        states.append(report.health["state"])
        if record.round == 0:
            blocker.mkdir()
        elif record.round == 1:
            assert load_checkpoint(checkpoints).round == 0  # the earlier one, whole
            shutil.rmtree(blocker)

    run_job(strategy, report, JobConnection(TransportConfig(url=broker.url, client_id="health-coordinator"),
                                            "health"), tmp_path / "out", beside=devices, on_round=on_round,
            plots=False, write_every_round=True)
    assert states == ["ok", "write_failed", "ok", "ok"]
    assert len(report.rounds) == 4 and load_checkpoint(checkpoints).round == 3
    written = json.loads((tmp_path / "out" / "report.json").read_text())
    assert written["health"]["state"] == "ok" and written["status"] == "finished"
