"""The one thread per process that runs simulated devices' rounds (simulation/training_queue.py)."""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Iterator

import pytest

from simulation.training_queue import TrainingQueue
from edge_sdk.training import TrainingStopped


def _wait_for(condition, timeout: float = 5.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.005)


def _submit(queue: TrainingQueue, work, results: list) -> threading.Thread:
    def device() -> None:
        try:
            results.append(queue.run(work))
        except BaseException as exc:  # noqa: BLE001 - the test looks at what the device got
            results.append(exc)

    thread = threading.Thread(target=device)
    thread.start()
    return thread


def test_rounds_run_on_the_serving_thread_one_at_a_time_first_come_first_served() -> None:
    queue = TrainingQueue()
    ran_on: list[int] = []
    order: list[int] = []
    results: list = []
    devices = []
    for i in range(3):
        devices.append(_submit(queue, lambda i=i: (ran_on.append(threading.get_ident()), order.append(i), i * 10)[2],
                               results))
        _wait_for(lambda: queue.waiting == i + 1)  # queued in this order
    while queue.served < 3:
        queue.serve(1.0)
    for d in devices:
        d.join(5)
    assert ran_on == [threading.get_ident()] * 3  # none ran on the devices' own threads
    assert order == [0, 1, 2] and sorted(results) == [0, 10, 20]
    assert queue.server_threads == {threading.get_ident()}


def test_serve_waits_only_as_long_as_it_is_told_when_nothing_is_queued() -> None:
    queue = TrainingQueue()
    start = time.monotonic()
    assert queue.serve(0.05) is False
    assert 0.04 <= time.monotonic() - start < 1.0


def test_a_round_that_fails_raises_on_its_device_and_the_server_goes_on() -> None:
    queue = TrainingQueue()
    results: list = []
    device = _submit(queue, lambda: 1 / 0, results)
    _wait_for(lambda: queue.waiting == 1)
    assert queue.serve(1.0) is True
    device.join(5)
    assert isinstance(results[0], ZeroDivisionError)


def test_closing_stops_the_queued_rounds_and_refuses_new_ones() -> None:
    queue = TrainingQueue()
    results: list = []
    device = _submit(queue, lambda: "never", results)
    _wait_for(lambda: queue.waiting == 1)
    queue.close()
    device.join(5)
    assert isinstance(results[0], TrainingStopped)
    with pytest.raises(TrainingStopped):
        queue.run(lambda: "too late")
    assert queue.serve(0.01) is False


def test_ctrl_c_while_a_round_runs_stops_that_device_and_reaches_the_server() -> None:
    queue = TrainingQueue()
    results: list = []

    def interrupted() -> None:
        raise KeyboardInterrupt

    device = _submit(queue, interrupted, results)
    _wait_for(lambda: queue.waiting == 1)
    with pytest.raises(KeyboardInterrupt):
        queue.serve(1.0)
    device.join(5)
    assert isinstance(results[0], TrainingStopped)


def test_each_round_holds_the_slot_asking_with_how_many_rounds_wait() -> None:
    asked: list[int] = []
    held = threading.Event()

    @contextlib.contextmanager
    def slot(waiting: int) -> Iterator[None]:
        asked.append(waiting)
        held.set()
        try:
            yield
        finally:
            held.clear()

    queue = TrainingQueue(slot)
    inside: list[bool] = []
    results: list = []
    devices = [_submit(queue, lambda: inside.append(held.is_set()), results) for _ in range(3)]
    _wait_for(lambda: queue.waiting == 3)
    server = threading.Thread(target=queue.serve_until_closed)
    server.start()
    _wait_for(lambda: queue.served == 3)
    queue.close()
    server.join(5)
    for d in devices:
        d.join(5)
    assert inside == [True, True, True] and not server.is_alive()
    assert asked == [3, 2, 1]  # the round itself and those behind it


def test_a_simulation_runs_every_devices_round_on_the_coordinators_thread(tmp_path, broker, monkeypatch) -> None:
    """The in-process backend: the coordinator's thread (here, the test's) trains the devices while
    it waits for them and evaluates on the same thread, so torch has one OpenMP team in the process."""
    import edge_sdk.device.device_rounds as rounds_module
    from simulation.simulate import SimulationConfig, run_simulation, sim_federation
    from edge_sdk.training import TrainConfig

    ran_on: list[int] = []
    original = rounds_module.device_method

    def recording(name: str):
        method = original(name)

        def run(*args, **kwargs):
            ran_on.append(threading.get_ident())
            return method(*args, **kwargs)

        return run

    monkeypatch.setattr(rounds_module, "device_method", recording)
    report = run_simulation(SimulationConfig(method="fedavg", clients=4, dataset="digits", model="mlp",
                                             partition="iid", out=str(tmp_path / "job"), broker_url=broker.url,
                                             job="queue-thread", plots=False,
                                             federation=sim_federation(rounds=2,
                                                                       train=TrainConfig(epochs=1, batch_size=32, lr=0.05))))
    assert [len(r.participants) for r in report.rounds] == [4, 4]
    assert ran_on == [threading.get_ident()] * 8


def test_a_sleeping_throttle_sleeps_on_the_devices_thread_not_the_shared_one(monkeypatch) -> None:
    """`--throttle sleep`: a device's round runs on the shared thread with a counting throttle,
    and the device sleeps what it owes afterwards on its own thread, so slow devices overlap."""
    from edge_sdk.client import ClientConfig, DeviceClient
    from edge_sdk.data.datasets import load_dataset
    from edge_sdk.methods import LocalData
    from edge_sdk.models.spec import build_model
    from edge_sdk.models.zoo import model_for_dataset
    from edge_sdk.profiling import load_profile
    from edge_sdk.protocol.messages import Plan
    from edge_sdk.tensors import state_to_numpy
    from edge_sdk.throttle import Throttle

    data = load_dataset("digits")
    spec = model_for_dataset("mlp", data.input_shape, data.num_classes)
    plan = Plan(method="fedavg", label="global", model_spec=spec, tensors=state_to_numpy(build_model(spec)),
                train={"epochs": 1, "batch_size": 32, "lr": 0.05})
    settled: list[tuple[int, float, float]] = []
    monkeypatch.setattr(Throttle, "settle", lambda self, simulated, host: settled.append(
        (threading.get_ident(), simulated, host)) if self.mode == "sleep" else None)
    queue = TrainingQueue()
    server = threading.Thread(target=queue.serve_until_closed)
    server.start()
    profile = load_profile("raspberry-pi-3b")
    client = DeviceClient(ClientConfig(device_id="d0", device="cpu"), LocalData(data.x_train[:64], data.y_train[:64], 10),
                          profile, Throttle(profile, mode="sleep"), run_compute=queue.run)
    sent: list = []
    monkeypatch.setattr(client, "_send_update", lambda body, rnd: sent.append(body))
    monkeypatch.setattr(client.uplink, "status", lambda *a, **k: None)
    try:
        update = client._train(0, plan)
    finally:
        queue.close()
        server.join(5)
    assert update is not None and sent == [update]
    assert queue.server_threads and threading.get_ident() not in queue.server_threads
    # one settlement, on this (the device's) thread: the round itself counted without sleeping
    assert len(settled) == 1 and settled[0][0] == threading.get_ident()
    assert settled[0][1] == update.metrics["compute_s"] > 0 and settled[0][2] == update.metrics["train_seconds"]
