"""`--backend process`: the simulated devices in one child process beside the coordinator's. The
job is the same job as with every device in this process (same participants, same accuracy, same
bytes), the child maps the devices' data from the folder saved for it, and nothing of it is left
behind: not the process, not the folder."""

from __future__ import annotations

import json
import os
from dataclasses import replace

import psutil
import pytest

from simulation.config import SimulationConfig
from simulation.process_devices import ProcessDevices
from simulation.simulate import run_simulation


def _job(tmp_path, backend: str, connections: str = "auto") -> SimulationConfig:
    config = SimulationConfig(method="fedavg", dataset="mnist-sample", clients=12, model="mlp", threads=1,
                              out=str(tmp_path / f"{backend}-{connections}"), plots=False, backend=backend,
                              connections=connections)
    return replace(config, federation=replace(config.federation, rounds=2, devices_per_round=4, eval_every=2))


@pytest.mark.parametrize("connections", ["own", "shared"])
def test_devices_in_a_child_process_run_the_same_job(tmp_path, connections) -> None:
    outcomes = []
    for backend in ("local", "process"):
        report = run_simulation(_job(tmp_path, backend, connections))
        assert report.status == "finished" and len(report.rounds) == 2
        outcomes.append(([r.participants for r in report.rounds], report.rounds[-1].accuracy,
                         report.rounds[-1].bytes_up))
        if backend == "process":
            written = json.loads((tmp_path / f"process-{connections}" / "report.json").read_text())["config"]
            assert written["devices_backend"] == "process"
            placed = written["process"]
            assert placed["data"] == "mapped" and placed["torch_threads"] == 1
            assert not psutil.pid_exists(placed["pid"]) or psutil.Process(placed["pid"]).status() == "zombie"
            assert not list((tmp_path / f"process-{connections}").glob(".device-shards-*"))  # the saved data went
    assert outcomes[0] == outcomes[1]


def test_a_child_that_cannot_start_is_one_line(tmp_path) -> None:
    devices = ProcessDevices(_job(tmp_path, "process"))
    devices.prepare()
    with pytest.raises(ChildProcessError, match="the simulated devices' process did not start: FileNotFoundError: "
                                           "the devices' data folder .*no-such-folder is missing") as raised:
        devices.start("mqtt://127.0.0.1:1", (), str(tmp_path / "no-such-folder"))
    assert "\n" not in str(raised.value)
    devices.stop(0.0)  # nothing left to stop: no error
    devices.close()


def test_children_that_could_not_be_started_are_one_line_at_start(tmp_path, monkeypatch) -> None:
    """`prepare` starts the children on a thread; what went wrong there is `start`'s error."""
    import simulation.process_devices as process_devices

    def no_pipe(*args, **kwargs):
        raise OSError("Too many open files")

    monkeypatch.setattr(process_devices, "_Child", no_pipe)
    devices = ProcessDevices(_job(tmp_path, "process"))
    devices.prepare()
    with pytest.raises(ChildProcessError, match="^the simulated devices' process did not start: "
                                                "OSError: Too many open files$"):
        devices.start("mqtt://127.0.0.1:1", (), str(tmp_path))
    devices.close()


def test_children_prepared_but_never_started_are_ended_by_close(tmp_path, monkeypatch) -> None:
    """A job that ends before its devices start (a bad dataset, Ctrl-C while loading) leaves no
    child behind, even one the preparing thread is still starting."""
    import simulation.process_devices as process_devices

    started = []

    class Recorded(process_devices._Child):
        def __init__(self, *args) -> None:
            super().__init__(*args)
            started.append(self)

    monkeypatch.setattr(process_devices, "_Child", Recorded)
    devices = ProcessDevices(_job(tmp_path, "process"), processes=2)
    devices.prepare()
    devices.close()
    assert len(started) == 2 and not devices._children
    assert all(child.process.exitcode is not None for child in started)  # ended (killed), not left running


def test_the_auto_backend_puts_a_fleet_past_a_thousand_devices_in_a_child_process():
    assert SimulationConfig().backend == "auto"
    assert SimulationConfig(clients=1_000).devices_backend == "local"
    assert SimulationConfig(clients=1_001).devices_backend == "process"
    assert SimulationConfig(clients=5_000, backend="local").devices_backend == "local"
    assert SimulationConfig(clients=5, backend="process").devices_backend == "process"
    assert SimulationConfig(clients=20_000, backend="ray", connections="own").devices_backend == "ray"
    with pytest.raises(ValueError, match="use --connections shared"):  # own connections, one process: capped
        SimulationConfig(clients=20_000, connections="own")


def test_devices_in_two_child_processes_run_the_same_job(tmp_path) -> None:
    """`--device-processes 2`: device i lives in child i mod 2; the job is the one of a single child
    (participants, accuracy, bytes), both children are gone afterwards."""
    outcomes = []
    for processes in (1, 2):
        config = replace(_job(tmp_path, "process", "shared"), device_processes=processes,
                         out=str(tmp_path / f"children-{processes}"))
        report = run_simulation(config)
        assert report.status == "finished" and len(report.rounds) == 2
        outcomes.append(([r.participants for r in report.rounds], report.rounds[-1].accuracy,
                         report.rounds[-1].bytes_up))
        placed = json.loads((tmp_path / f"children-{processes}" / "report.json").read_text())["config"]["process"]
        pids = placed.get("pids", [placed["pid"]])
        assert len(set(pids)) == processes
        assert all(not psutil.pid_exists(p) or psutil.Process(p).status() == "zombie" for p in pids)
    assert outcomes[0] == outcomes[1]


def test_device_processes_must_be_a_positive_integer() -> None:
    with pytest.raises(ValueError, match="device_processes must be an integer >= 1, got 0"):
        SimulationConfig(device_processes=0)


def test_two_device_processes_by_default_where_two_cpus_may_run_them(monkeypatch) -> None:
    from simulation.config import default_device_processes

    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {0}, raising=False)
    assert default_device_processes() == 1 and SimulationConfig().device_processes == 1
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {0, 1, 2, 3}, raising=False)
    assert default_device_processes() == 2 and SimulationConfig().device_processes == 2
