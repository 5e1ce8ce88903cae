"""Kept model versions and rollback: every published version is kept (state + ONNX) up to
`keep_versions`, and ``edgefl coordinator --rollback N`` makes a job serve version N again and train
on from it — over a real broker, across a restart."""

from __future__ import annotations

import json
import threading

import numpy as np
import pytest

from coordinator.core.federation import FederationConfig
from coordinator.runtime.fleet import Fleet
from coordinator.runtime.kept_versions import ROLLBACK_FILE, keep_version, kept_versions, pending_rollback, \
    request_rollback, version_tensors
from coordinator.runtime.report import RunReport
from coordinator.runtime.round_loop import RoundLoop
from coordinator.runtime.task import Task
from coordinator.strategies.base import StrategyContext
from coordinator.strategies.fedavg import FedAvg
from edge_sdk.data.preprocessing import Preprocessing
from edge_sdk.networking.link import MessageLink
from edge_sdk.networking.transport import MqttTransport, TransportConfig
from edge_sdk.protocol.topics import Topics
from edge_sdk.training import TrainConfig
from tests.coordinator.test_growing_data import NAMES, _client, _digits, _write

JOB = "kept"


def test_versions_are_kept_up_to_the_bound_and_a_rollback_names_a_kept_one(tmp_path) -> None:
    state = {"w": np.arange(4, dtype=np.float32)}
    for version in range(1, 5):
        keep_version(tmp_path, version, version - 1, "fedavg", {"w": state["w"] * version},
                     {"p1": 0.5 + version / 10}, {"p1": b"onnx%d" % version}, keep=2)
    kept = kept_versions(tmp_path)
    assert [v.version for v in kept] == [3, 4]
    assert kept[1].figures == {"p1": pytest.approx(0.9)} and kept[1].labels == ("p1",)
    assert (kept[1].path / "p1.onnx").read_bytes() == b"onnx4"
    np.testing.assert_array_equal(version_tensors(tmp_path, 3)["w"], state["w"] * 3)
    with pytest.raises(ValueError, match=r"version 1 is not kept .*\(kept: 3, 4\)"):
        request_rollback(tmp_path, 1)
    assert pending_rollback(tmp_path) is None
    request_rollback(tmp_path, 3)
    assert pending_rollback(tmp_path)["to"] == 3
    (tmp_path / ROLLBACK_FILE).write_text(json.dumps({"to": 1}))  # edited by hand: not kept
    assert pending_rollback(tmp_path) is None and not (tmp_path / ROLLBACK_FILE).exists()


def _loop(tmp_path, broker_url: str, rounds: int, snapshots: dict[int, dict[str, np.ndarray]]):
    federation = FederationConfig(rounds=rounds, min_devices=2, round_deadline_s=60, seed=0, publish_every=1,
                                  checkpoint_dir=str(tmp_path / "ckpt"), keep_versions=2, eval_every=100,
                                  train=TrainConfig(epochs=1, lr=0.05, batch_size=16, threads=1))
    strategy = FedAvg.create(StrategyContext(federation, "mlp", (1, 8, 8), 10))
    transport = MqttTransport(TransportConfig(url=broker_url, client_id=f"{JOB}-coordinator"))
    transport.connect()
    fleet = Fleet(MessageLink(transport), Topics(job=JOB), task=Task((1, 8, 8), 10))
    fleet.start()
    loop = RoundLoop(strategy, fleet, RunReport("fedavg", {}),
                     preprocessing=Preprocessing((4.88,), (6.02,), tuple(NAMES), (1, 8, 8)))

    def snapshot(rnd: int) -> None:  # the state each round starts from
        snapshots[rnd] = {k: np.array(v, copy=True) for k, v in strategy.state_tensors().items()}

    loop.before_round = snapshot
    return loop, transport


def _run(loop, clients) -> None:
    threads = [threading.Thread(target=c.run, daemon=True) for c in clients]
    for thread in threads:
        thread.start()
    try:
        loop.run()
    finally:
        for c in clients:
            c.stop()
        for thread in threads:
            thread.join(timeout=20)


def test_a_rollback_serves_a_kept_version_again_and_training_goes_on_from_it(tmp_path, broker) -> None:
    x, y = _digits()
    for i, name in enumerate(("d0", "d1")):
        _write(tmp_path / f"{name}.csv", x[i * 300:(i + 1) * 300], y[i * 300:(i + 1) * 300], start=0)
    snapshots: dict[int, dict[str, np.ndarray]] = {}
    loop, transport = _loop(tmp_path, broker.url, 3, snapshots)
    try:
        _run(loop, [_client(tmp_path, broker.url, n, i, job=JOB) for i, n in enumerate(("d0", "d1"))])
    finally:
        transport.close()
    checkpoint_dir = tmp_path / "ckpt"
    assert [v.version for v in kept_versions(checkpoint_dir)] == [2, 3]  # versions 1..3 published, 2 kept
    request_rollback(checkpoint_dir, 2)

    # the next start (the job now capped at 5 rounds): round 4 starts from version 2, which the devices get
    loop, transport = _loop(tmp_path, broker.url, 5, snapshots)
    try:
        _run(loop, [_client(tmp_path, broker.url, n, i, job=JOB) for i, n in enumerate(("d0", "d1"))])
    finally:
        transport.close()
    for key, value in snapshots[3].items():  # round 4 (0-based 3) began from round 3's start: version 2
        np.testing.assert_array_equal(value, snapshots[2][key])
    assert any(not np.array_equal(snapshots[3][k], snapshots[4][k]) for k in snapshots[3])  # and trained on
    rounds = loop.report.rounds
    assert [(r.round + 1, r.version, r.published_version) for r in rounds[-2:]] == [(4, 4, 2), (5, 5, 4)]
    assert not (checkpoint_dir / ROLLBACK_FILE).exists()  # done once its round was checkpointed
    assert [v.version for v in kept_versions(checkpoint_dir)] == [4, 5] and loop.published_version == 5


def test_the_versions_and_rollback_commands(tmp_path) -> None:
    from tests.coordinator.test_config_errors import _edgefl

    checkpoint_dir = tmp_path / "ckpt"
    config = tmp_path / "coordinator.toml"
    config.write_text(f'job = "home"\n[task]\ninput_shape = [1, 8, 8]\nclasses = {NAMES!r}\nmean = [4.88]\n'
                      f'std = [6.02]\n[federation]\ncheckpoint_dir = "{checkpoint_dir}"\nmin_new_samples = 50\n'
                      .replace("'", '"'))
    empty = _edgefl("coordinator", "--config", str(config), "--versions")
    assert empty.returncode == 0 and "no kept versions" in empty.stdout
    for version in (3, 4):
        keep_version(checkpoint_dir, version, version - 1, "fedavg", {"w": np.zeros(2, np.float32)},
                     {"global": 0.8 + version / 100}, {"global": b"onnx"}, keep=5)
    listed = _edgefl("coordinator", "--config", str(config), "--versions")
    assert listed.returncode == 0 and "global 0.830" in listed.stdout and "global 0.840" in listed.stdout
    missing = _edgefl("coordinator", "--config", str(config), "--rollback", "2")
    assert missing.returncode == 2 and "version 2 is not kept" in missing.stderr and "(kept: 3, 4)" in missing.stderr
    assert "Traceback" not in missing.stderr and not (checkpoint_dir / ROLLBACK_FILE).exists()
    asked = _edgefl("coordinator", "--config", str(config), "--rollback", "3")
    assert asked.returncode == 0 and "asked for version 3" in asked.stdout
    assert pending_rollback(checkpoint_dir)["to"] == 3
