"""Where a device trains: the torch device it names (auto | cpu | cuda[:N]) is where the model,
the batches and the optimizer state live, what its profile measures, and updates still come
back on the CPU for the wire. CUDA cases run where torch sees a GPU."""

from __future__ import annotations

import threading
import time
from types import SimpleNamespace

import numpy as np
import pytest
import torch

from edge_sdk.accelerator import resolve_device
from edge_sdk.cli import main as edgefl
from edge_sdk.device_config import client_from_toml
from edge_sdk.models.spec import build_model
from edge_sdk.models.zoo import mlp
from edge_sdk.training import TrainConfig, evaluate, train_local

needs_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="torch sees no CUDA GPU here")
no_cuda = pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has a CUDA GPU")


def _data(n: int = 96, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    y = rng.integers(0, 3, n)
    return (rng.normal(size=(n, 8)) + y[:, None]).astype(np.float32), y


def _model() -> torch.nn.Module:
    torch.manual_seed(0)
    return build_model(mlp(8, 3, hidden=(16,)))


def test_auto_is_cuda_when_torch_sees_a_gpu_else_the_cpu() -> None:
    assert resolve_device("auto").type == ("cuda" if torch.cuda.is_available() else "cpu")
    assert resolve_device("cpu") == torch.device("cpu")


@pytest.mark.parametrize("name", ["gpu", "", "CUDA", "cuda:x", "mps", None])
def test_unknown_devices_are_one_line_errors_listing_the_choices(name) -> None:
    with pytest.raises(ValueError, match="auto, cpu, cuda"):
        resolve_device(name)


@no_cuda
def test_cuda_without_a_gpu_says_so_in_one_line() -> None:
    with pytest.raises(ValueError, match="sees no CUDA GPU") as err:
        resolve_device("cuda")
    assert "\n" not in str(err.value)


def test_training_on_a_named_device_leaves_the_model_where_it_was() -> None:
    x, y = _data()
    model = _model()
    result = train_local(model, x, y, TrainConfig(epochs=2, batch_size=16, lr=0.1), device="cpu")
    assert result.steps == 12 and all(p.device.type == "cpu" for p in model.parameters())
    assert evaluate(model, x, y, device="cpu")[0] > 0.67  # 0.708 measured 2026-11-25


@needs_cuda
def test_training_on_cuda_matches_the_cpu_and_comes_back_to_the_cpu() -> None:
    x, y = _data()
    config = TrainConfig(epochs=2, batch_size=16, lr=0.1)
    on_cpu, on_gpu = _model(), _model()
    train_local(on_cpu, x, y, config, seed=3, device="cpu")
    seen = []
    train_local(on_gpu, x, y, config, seed=3, device="cuda",
                regularizer=lambda m: seen.append(next(m.parameters()).device.type) or torch.zeros((), device="cuda"))
    assert set(seen) == {"cuda"}  # it really trained there
    assert all(p.device.type == "cpu" for p in on_gpu.parameters())
    for a, b in zip(on_cpu.parameters(), on_gpu.parameters()):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-4)
    assert evaluate(on_gpu, x, y, device="cuda") == pytest.approx(evaluate(on_cpu, x, y), abs=1e-4)


@needs_cuda
def test_flanc_with_its_orthogonality_penalty_trains_on_cuda() -> None:
    from edge_sdk.models.flanc import orthogonality_penalty
    from edge_sdk.models.flanc_zoo import flanc_specs

    torch.manual_seed(0)
    model = build_model(flanc_specs("flanc_cnn", (1, 28, 28), 10)["0.5"])
    rng = np.random.default_rng(0)
    x, y = rng.normal(size=(64, 1, 28, 28)).astype(np.float32), rng.integers(0, 10, 64)
    before = [p.detach().clone() for p in model.parameters()]
    train_local(model, x, y, TrainConfig(epochs=1, batch_size=16, lr=0.05), device="cuda",
                regularizer=lambda m: 0.1 * orthogonality_penalty(m))
    assert all(p.device.type == "cpu" for p in model.parameters())
    assert any(not torch.equal(a, b) for a, b in zip(before, model.parameters()))


@pytest.mark.slow
def test_simulated_devices_of_a_process_train_one_at_a_time(tmp_path, broker, monkeypatch) -> None:
    from simulation.simulate import SimulationConfig, run_simulation, sim_federation
    from edge_sdk.methods import base

    calls: list[tuple[str, float, float]] = []  # (thread, start, end) of every local training
    original = base.train_local

    def recorded(*args, **kwargs):
        start = time.perf_counter()
        try:
            return original(*args, **kwargs)
        finally:
            calls.append((threading.current_thread().name, start, time.perf_counter()))
    monkeypatch.setattr(base, "train_local", recorded)
    run_simulation(SimulationConfig(clients=4, dataset="digits", model="mlp", plots=False, out=str(tmp_path),
                                    broker_url=broker.url, job="one-at-a-time",
                                    federation=sim_federation(rounds=2, train=TrainConfig(epochs=2, batch_size=16))))
    assert len(calls) == 8
    # on the coordinator's thread (here the test's), which serves the devices' training queue
    assert {name for name, _, _ in calls} == {threading.current_thread().name}
    spans = sorted((a, b) for _, a, b in calls)
    assert all(first[1] <= second[0] for first, second in zip(spans, spans[1:]))  # never two at once


def test_a_client_config_names_its_training_device(tmp_path) -> None:
    path = tmp_path / "client.toml"
    base = 'device_id = "pi"\n[data]\ndataset = "digits"\n[device]\nprofile = "raspberry-pi-4b"\n'
    path.write_text(base + 'device = "cpu"\n')
    assert client_from_toml(path).torch_device == torch.device("cpu")
    path.write_text(base + 'device = "gpu"\n')
    with pytest.raises(ValueError, match="device must be one of auto, cpu, cuda"):
        client_from_toml(path)


def test_profile_measures_the_named_device(capsys) -> None:
    assert edgefl(["profile", "--device", "cpu", "--seconds", "0.2"]) == 0
    assert "float32 on cpu" in capsys.readouterr().out
    assert edgefl(["profile", "--device", "tpu", "--seconds", "0.2"]) == 2
    assert "device must be one of auto, cpu, cuda" in capsys.readouterr().err


def test_the_coordinator_evaluates_where_simulated_devices_train() -> None:
    from simulation.simulate import SimulationConfig, build_strategy
    from coordinator.core.federation import EvalData, FederationConfig
    from coordinator.runtime.report import RunReport
    from coordinator.runtime.round_loop import RoundLoop
    from edge_sdk.data.datasets import load_dataset

    dataset = load_dataset("digits", seed=0)
    strategy = build_strategy(SimulationConfig(model="mlp", dataset="digits", sim_device="auto"), dataset, None)
    assert strategy.config.eval_device == "auto"
    accuracy, loss = strategy.evaluate_model(strategy.model, EvalData(dataset.x_test, dataset.y_test))
    assert 0 <= accuracy <= 1 and loss > 0
    assert next(strategy.model.parameters()).device.type == "cpu"  # moved back after evaluating
    if not torch.cuda.is_available():
        config = FederationConfig(eval_device="cuda")  # validating the settings asks torch nothing...
        on_cuda = build_strategy(SimulationConfig(model="mlp", dataset="digits", sim_device="cuda"), dataset, None)
        assert config.eval_device == on_cuda.config.eval_device == "cuda"
        with pytest.raises(ValueError, match="sees no CUDA GPU"):  # ...the job refuses before its first round
            RoundLoop(on_cuda, SimpleNamespace(), RunReport(method="fedavg", config={}))
