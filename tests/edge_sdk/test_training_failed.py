"""A simulated job whose every device fails its training stops with the devices' error after
a few rounds, instead of running all its rounds at chance accuracy (as FLANC on CUDA once did)."""

from __future__ import annotations

import json

import pytest

from simulation.simulate import STOP_AFTER_FAILED_ROUNDS, SimulationConfig, run_simulation, sim_federation
from coordinator.core.federation import FederationConfig, TrainingFailed
from edge_sdk.cli import main as edgefl
from edge_sdk.methods import base
from edge_sdk.training import TrainConfig


def _failing(every: int = 1):
    """train_local that raises on every `every`-th call (1: always)."""
    original, calls = base.train_local, []

    def train(*args, **kwargs):
        calls.append(1)
        if len(calls) % every == 0:
            raise RuntimeError("Expected all tensors to be on the same device")
        return original(*args, **kwargs)
    return train, calls


def _config(tmp_path, broker, rounds: int = 10) -> SimulationConfig:
    return SimulationConfig(clients=3, dataset="digits", model="mlp", plots=False, out=str(tmp_path / "run"),
                            broker_url=broker.url, job="failing", throttle="off",
                            federation=sim_federation(rounds=rounds, train=TrainConfig(epochs=1, batch_size=32)))


@pytest.mark.slow
def test_a_job_whose_every_device_fails_stops_with_their_error(tmp_path, broker, monkeypatch) -> None:
    train, calls = _failing()
    monkeypatch.setattr(base, "train_local", train)
    with pytest.raises(TrainingFailed, match="every device failed its training in the last 3 rounds "
                                             r"\(to round 3\): Expected all tensors"):
        run_simulation(_config(tmp_path, broker))
    assert len(calls) == 3 * STOP_AFTER_FAILED_ROUNDS
    report = json.loads((tmp_path / "run" / "report.json").read_text())
    assert len(report["rounds"]) == STOP_AFTER_FAILED_ROUNDS and report["status"] != "finished"


def test_a_job_where_some_devices_fail_runs_to_the_end(tmp_path, broker, monkeypatch) -> None:
    train, calls = _failing(every=2)  # about half the trainings of each round fail
    monkeypatch.setattr(base, "train_local", train)
    report = run_simulation(_config(tmp_path, broker, rounds=5))
    assert len(report.rounds) == 5 and len(calls) == 15


@pytest.mark.slow
def test_simulate_says_it_in_one_line(tmp_path, broker, monkeypatch, capsys) -> None:
    monkeypatch.setattr(base, "train_local", _failing()[0])
    code = edgefl(["simulate", "--clients", "3", "--rounds", "10", "--dataset", "digits", "--model", "mlp",
                   "--broker", broker.url, "--out", str(tmp_path / "cli"), "--throttle", "off"])
    out = capsys.readouterr()
    assert code == 2
    lines = [line for line in out.out.splitlines() if "error" in line]
    assert len(lines) == 1 and "Expected all tensors to be on the same device" in lines[0]
    assert "Traceback" not in out.out + out.err


@pytest.mark.parametrize("bad", [-1, 1.5, "3"])
def test_the_limit_is_a_count_of_rounds(bad) -> None:
    with pytest.raises(ValueError, match="stop_after_failed_rounds must be an integer >= 0"):
        FederationConfig(stop_after_failed_rounds=bad)
