"""`edgefl simulate --backend ray`: simulated devices on Ray actors, still talking MQTT.

The cluster test starts two Ray nodes on this machine's loopback the way a user would
(`ray start --head`, then `ray start --address`), runs a job that joins it, and checks that
devices ran on both nodes and the job learned as the in-process backend does."""

from __future__ import annotations

import json
import os
import secrets
import shutil
import socket
import subprocess
import sys
import tempfile
from pathlib import Path

import psutil
import pytest

from simulation.ray_devices import _ray
from simulation.simulate import SimulationConfig, run_simulation, sim_federation
from edge_sdk.training import TrainConfig
from tests.support.requirements import needs

RAY = Path(sys.executable).with_name("ray")
needs_ray = needs("ray")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _stop_cluster(marks: tuple[str, ...]) -> list[psutil.Process]:
    """Stop this test's Ray processes (those naming its temp dir or port, and their children)
    without `ray stop`, which would stop every Ray cluster of this machine."""
    procs: dict[int, psutil.Process] = {}
    for proc in psutil.process_iter(["cmdline"]):
        if any(m in " ".join(proc.info["cmdline"] or ()) for m in marks):
            for p in [proc, *proc.children(recursive=True)]:
                procs[p.pid] = p
    for proc in procs.values():
        try:
            proc.terminate()
        except psutil.NoSuchProcess:
            pass
    _, alive = psutil.wait_procs(list(procs.values()), timeout=5)
    for proc in alive:
        proc.kill()
    return psutil.wait_procs(alive, timeout=5)[1]


@pytest.fixture(scope="module")
def two_nodes():
    temp = tempfile.mkdtemp(prefix="ray", dir="/tmp")  # Ray's socket paths must stay short
    port = _free_port()
    token = secrets.token_hex(32)  # this cluster's own token: a new machine has no ~/.ray/auth_token
    env = {**os.environ, "RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN": token, "RAY_USAGE_STATS_ENABLED": "0"}
    common = ["--node-ip-address=127.0.0.1", "--num-cpus=1", "--disable-usage-stats"]
    try:
        subprocess.run([RAY, "start", "--head", f"--port={port}", "--include-dashboard=false", f"--temp-dir={temp}",
                        *common], env=env, check=True, capture_output=True, timeout=120)
        subprocess.run([RAY, "start", f"--address=127.0.0.1:{port}", *common], env=env, check=True,
                       capture_output=True, timeout=120)
        yield f"127.0.0.1:{port}", token
    finally:
        left = _stop_cluster((temp, f":{port} ", f":{port}"))
        shutil.rmtree(temp, ignore_errors=True)
        assert not left, f"Ray processes left running: {[p.pid for p in left]}"


def _config(tmp_path: Path, **kw) -> SimulationConfig:
    return SimulationConfig(method="fedavg", clients=4, dataset="digits", model="mlp", plots=False,
                            federation=sim_federation(rounds=2, train=TrainConfig(epochs=1, batch_size=32, lr=0.05)),
                            out=str(tmp_path), **kw)


@pytest.mark.slow
@needs_ray
def test_a_job_runs_with_devices_on_both_nodes_of_a_loopback_cluster(two_nodes, tmp_path, monkeypatch) -> None:
    address, token = two_nodes
    monkeypatch.setenv("RAY_AUTH_MODE", "token")
    monkeypatch.setenv("RAY_AUTH_TOKEN", token)
    report = run_simulation(_config(tmp_path / "ray", backend="ray", ray_address=address, job="ray2"))
    hosts = report.config["ray"]["hosts"]
    assert len({h["node"] for h in hosts}) == 2  # both nodes host devices
    assert sorted(d for h in hosts for d in h["devices"]) == ["dev000", "dev001", "dev002", "dev003"]
    assert all(h["pid"] != os.getpid() for h in hosts)
    assert {h["data"] for h in hosts} == {"mapped"}  # one machine: every actor maps the driver's saved shards
    assert len(hosts) == 4  # two actors per worker (one CPU each, one worker per node)
    slots = report.config["ray"]["slots"]  # one slot per node, never more held at once
    assert sorted(s["slots"] for s in slots.values()) == [1, 1] and all(s["peak"] == 1 for s in slots.values())
    assert [len(r.participants) for r in report.rounds] == [4, 4]  # every device reported over MQTT
    assert not list((tmp_path / "ray").glob(".device-shards-*"))  # the actors' shared data is gone with the job
    for device in ("dev000", "dev001", "dev002", "dev003"):  # each installed the model signed for it
        assert len(json.loads((tmp_path / "ray" / "devices" / device / "model.json").read_text())["key_id"]) == 16
    local = run_simulation(_config(tmp_path / "local", job="local2"))
    assert report.rounds[-1].accuracy["global"] == pytest.approx(local.rounds[-1].accuracy["global"], abs=0.02)
    assert report.rounds[-1].bytes_up == local.rounds[-1].bytes_up


def test_the_settings_cross_to_an_actor_as_json_and_come_back_equal() -> None:
    config = SimulationConfig(method="flanc", clients=7, partition="shards:2", backend="ray", ray_workers=3,
                              ray_actors_per_worker=3, options={"sample": "any"},
                              federation=sim_federation(train=TrainConfig(epochs=2, lr=0.01)))
    assert SimulationConfig.from_plain(json.loads(json.dumps(config.to_plain()))) == config


def test_without_ray_the_backend_is_a_one_line_error(monkeypatch) -> None:
    monkeypatch.setitem(sys.modules, "ray", None)
    with pytest.raises(ValueError, match=r"pip install 'edgefl\[ray\]'"):
        _ray()


def test_ray_options_need_the_ray_backend() -> None:
    with pytest.raises(ValueError, match="need backend 'ray'"):
        SimulationConfig(ray_workers=2)
    with pytest.raises(ValueError, match="backend must be one of auto, local, process, ray"):
        SimulationConfig(backend="dask")


@pytest.mark.parametrize("value", [0, -1, 1.5, "2"])
def test_actors_per_worker_must_be_a_positive_integer(value) -> None:
    with pytest.raises(ValueError, match="ray_actors_per_worker must be an integer >= 1"):
        SimulationConfig(backend="ray", ray_actors_per_worker=value)
