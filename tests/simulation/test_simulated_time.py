"""Simulated time is a property of the job and the fleet's profiles, not of this machine:
the same job run twice, once on an idle host and once with every core busy, reports the
same simulated seconds, and they follow from the FLOPs and bytes of each device's work."""

from __future__ import annotations

import os
import subprocess
import sys
import time

import pytest

from simulation.simulate import SimulationConfig, run_simulation, sim_federation
from edge_sdk.data.datasets import load_dataset
from edge_sdk.methods import DeviceContext, LocalData
from edge_sdk.methods.fedavg import train_fedavg
from edge_sdk.models.spec import build_model, count_flops
from edge_sdk.models.zoo import model_for_dataset
from edge_sdk.profiling import load_profile
from edge_sdk.protocol.messages import Plan
from edge_sdk.tensors import state_to_numpy
from edge_sdk.throttle import TRAIN_FLOPS_PER_FORWARD, Throttle
from edge_sdk.training import TrainConfig

PROFILES = ("raspberry-pi-3b", "jetson-nano", "laptop")


def _job(tmp_path, broker, name: str, **kw):
    config = SimulationConfig(
        method="fedavg", clients=3, dataset="digits", model="mlp", partition="iid",
        out=str(tmp_path / name), broker_url=broker.url, job=f"simtime-{name}", profiles=PROFILES,
        federation=sim_federation(rounds=2, train=TrainConfig(epochs=1, batch_size=32, lr=0.05)), plots=False, **kw,
    )
    return run_simulation(config)


def _busy_cores() -> list[subprocess.Popen]:
    spin = "import time\nend = time.time() + 120\nwhile time.time() < end: pass"
    return [subprocess.Popen([sys.executable, "-c", spin]) for _ in range(os.cpu_count() or 2)]


@pytest.mark.slow
def test_the_same_job_reports_the_same_simulated_seconds_under_load(tmp_path, broker) -> None:
    idle = _job(tmp_path, broker, "idle")
    spinners = _busy_cores()
    try:
        time.sleep(0.3)
        loaded = _job(tmp_path, broker, "loaded")
    finally:
        for proc in spinners:
            proc.kill()
            proc.wait()
    assert [r.seconds for r in idle.rounds] == [r.seconds for r in loaded.rounds]
    assert [r.bytes_up for r in idle.rounds] == [r.bytes_up for r in loaded.rounds]
    assert all(r.seconds > 0 for r in idle.rounds)


def test_a_devices_compute_time_is_its_training_flops_at_its_profiles_speed() -> None:
    data = load_dataset("digits")
    spec = model_for_dataset("mlp", data.input_shape, data.num_classes)
    weights = state_to_numpy(build_model(spec), copy=True)
    plan = Plan("fedavg", "global", spec, weights, TrainConfig(epochs=2, batch_size=32).to_dict())
    local = LocalData(data.x_train[:200], data.y_train[:200], data.num_classes)
    pi = load_profile("raspberry-pi-3b")
    update = train_fedavg(plan, local, DeviceContext("d", round=0, throttle=Throttle(pi)))
    flops = TRAIN_FLOPS_PER_FORWARD * count_flops(spec) * 2 * 200  # 2 epochs of 200 samples
    assert update.metrics["compute_s"] == pytest.approx(flops / (pi.gflops * 1e9))
    unthrottled = train_fedavg(plan, local, DeviceContext("d", round=0))  # a real device: its own time
    assert unthrottled.metrics["compute_s"] == unthrottled.metrics["train_seconds"]
