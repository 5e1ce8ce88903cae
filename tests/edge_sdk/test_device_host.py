"""A simulated device holds no thread: `DeviceClient.step` does one pass of it without waiting, a
`DeviceHost` steps many devices from a few workers when a message for one arrives or its next
duty is due, and ends them all at once when the job is over (the broker publishes their wills)."""

from __future__ import annotations

import os
import time
from dataclasses import replace

import numpy as np

from coordinator.runtime.broker import EmbeddedBroker
from edge_sdk.client import ClientConfig, DeviceClient
from edge_sdk.methods import LocalData
from edge_sdk.networking.network_loop import NetworkLoop
from edge_sdk.profiling import load_profile
from edge_sdk.protocol.messages import Ack, Envelope, Register, Status, Stop, decode_envelope, encode_envelope
from edge_sdk.protocol.topics import Topics
from edge_sdk.networking.transport import MqttTransport, TransportConfig
from simulation.config import SimulationConfig
from simulation.sim_devices import DeviceHost
from simulation.simulate import run_simulation
from tests.support.subscriptions import subscribed


def _threads() -> int:
    return len(os.listdir("/proc/self/task"))


def _device(url: str, name: str, network: NetworkLoop | None = None) -> DeviceClient:
    data = LocalData(np.zeros((4, 1, 8, 8), np.float32), np.array([0, 1, 0, 1]), 2)
    config = ClientConfig(device_id=name, transport=TransportConfig(url=url, connect_timeout=5), job="host",
                          register_retry_s=30.0, heartbeat_s=600.0)
    return DeviceClient(config, data, load_profile("raspberry-pi-4b"), network=network)


def _next_envelope(transport: MqttTransport, kind: type, timeout: float = 5.0) -> Envelope:
    deadline = time.monotonic() + timeout
    while (left := deadline - time.monotonic()) > 0:
        msg = transport.receive(left)
        if msg is not None and isinstance((env := decode_envelope(msg.payload)).body, kind):
            return env
    raise AssertionError(f"no {kind.__name__} within {timeout} s")


def test_a_device_steps_without_a_thread_of_its_own() -> None:
    topics = Topics(job="host")
    with EmbeddedBroker() as broker, MqttTransport(TransportConfig(url=broker.url, connect_timeout=5)) as coordinator:
        subscribed(coordinator, topics.status("stepper"), topics.all_uplinks())
        network = NetworkLoop()
        device = _device(broker.url, "stepper", network)
        woken: list[float] = []
        device.sim.on_ready = lambda: woken.append(time.monotonic())
        try:
            before = _threads()
            device.open()
            assert _threads() == before  # its connection is driven by the shared loop
            wait = device.step()  # registers, then has nothing to do until its retry
            assert isinstance(wait, float) and 20.0 < wait <= 30.0
            env = _next_envelope(coordinator, Register)
            assert env.sender == "stepper" and env.body.num_samples == 4
            ack = Envelope.of(Ack("registered"), "coordinator", reply_to=env.msg_id)
            coordinator.publish(topics.downlink("stepper"), encode_envelope(ack), qos=1)
            deadline = time.monotonic() + 5
            while not woken and time.monotonic() < deadline:
                time.sleep(0.01)
            assert woken
            wait = device.step()  # registered and idle: nothing until its heartbeat (10 min), no wake-up a second
            assert isinstance(wait, float) and 590.0 < wait <= 600.0
            woken.clear()
            stop = Envelope.of(Stop("the job is over"), "coordinator")
            coordinator.publish(topics.downlink("stepper"), encode_envelope(stop), qos=1)
            deadline = time.monotonic() + 5
            while not woken and time.monotonic() < deadline:  # the host learns of the message
                time.sleep(0.01)
            assert woken
            assert device.step() == "the job is over"
            device.finish("the job is over", wait_s=5.0)
            last = _next_envelope(coordinator, Status)  # its birth, then its last words
            if last.body.state == "online":
                last = _next_envelope(coordinator, Status)
            assert (last.body.state, last.body.reason) == ("offline", "the job is over")
        finally:
            network.stop()


def test_a_device_told_a_plan_is_coming_sleeps_until_it_comes() -> None:
    """A device named in a round's announcement waits for its plan without waking each second:
    in a round where 10,000 simulated devices train, plans come minutes after the announcement
    (`coordinator.runtime.plan_pacer`), and 10,000 wake-ups a second crowded the devices' process."""
    from edge_sdk.protocol.messages import RoundStart

    topics = Topics(job="host")
    with EmbeddedBroker() as broker, MqttTransport(TransportConfig(url=broker.url, connect_timeout=5)) as coordinator:
        subscribed(coordinator, topics.all_uplinks())
        network = NetworkLoop()
        device = _device(broker.url, "expecting", network)
        woken: list[float] = []
        device.sim.on_ready = lambda: woken.append(time.monotonic())
        try:
            device.open()
            device.step()
            env = _next_envelope(coordinator, Register)
            for body, rnd in ((Ack("registered"), -1), (RoundStart(60.0, ("expecting",)), 0)):
                woken.clear()
                reply_to = env.msg_id if isinstance(body, Ack) else None
                coordinator.publish(topics.downlink("expecting"),
                                    encode_envelope(Envelope.of(body, "coordinator", round=rnd, reply_to=reply_to)), qos=1)
                deadline = time.monotonic() + 5
                while not woken and time.monotonic() < deadline:
                    time.sleep(0.01)
                assert woken
                wait = device.step()
            assert isinstance(wait, float) and 55.0 < wait <= 60.0  # until its wait for the plan ends, not 1 s
        finally:
            device.finish("done", wait_s=5.0)
            network.stop()


def test_a_host_runs_many_devices_on_a_few_threads_and_ends_them_at_once() -> None:
    before = _threads()
    with EmbeddedBroker() as broker:
        network = NetworkLoop()
        clients = [_device(broker.url, f"many{i:03d}", network) for i in range(120)]
        host = DeviceHost(clients, network=network, workers=4, connectors=2)
        topics = Topics(job="host")
        with MqttTransport(TransportConfig(url=broker.url, connect_timeout=5)) as watcher:
            watcher.subscribe(topics.all_uplinks())
            host.start()
            registered: set[str] = set()
            deadline = time.monotonic() + 30
            while len(registered) < len(clients) and time.monotonic() < deadline:
                msg = watcher.receive(1.0)
                if msg is not None and isinstance((env := decode_envelope(msg.payload)).body, Register):
                    registered.add(env.sender)
            assert len(registered) == len(clients)  # every device registered, driven by the host
            assert _threads() - before <= 4 + 1 + 2 + 2  # workers, timer, connectors, loop and broker reader
            watcher.subscribe(f"{topics.prefix}/status/+")
            started = time.monotonic()
            assert host.stop(wait_s=5.0) == []
            assert time.monotonic() - started < 5.0
            offline: set[str] = set()
            deadline = time.monotonic() + 10
            while len(offline) < len(clients) and time.monotonic() < deadline:
                msg = watcher.receive(1.0)  # the wills the broker published
                if msg is not None and isinstance((env := decode_envelope(msg.payload)).body, Status) \
                        and env.body.state == "offline":
                    offline.add(env.sender)
            assert len(offline) == len(clients)
    assert set(host.reasons) == {c.config.device_id for c in clients}


def test_a_simulated_fleet_holds_no_thread_per_device(tmp_path) -> None:
    threads: list[int] = []
    config = SimulationConfig(method="fedavg", dataset="mnist-sample", clients=150, model="mlp", threads=1,
                              out=str(tmp_path), plots=False)
    config = replace(config, federation=replace(config.federation, rounds=2, devices_per_round=5, eval_every=2))
    report = run_simulation(config, on_round=lambda record: threads.append(_threads()))
    assert report.status == "finished" and len(report.rounds) == 2
    assert all(len(r.participants) == 5 for r in report.rounds)
    assert max(threads) < 60  # 150 devices, and a few dozen threads at most


def test_a_device_stepped_before_its_connection_is_open_waits_for_it() -> None:
    """On a shared connection a message (a roll call) can reach a device between joining and the
    end of its `open`: the host steps it then, and the step waits instead of failing (an
    AssertionError without a message stopped one device of 10,000 and the job waited for it)."""
    device = _device("mqtt://127.0.0.1:1", "early")
    assert device.link is None
    assert device.step() == 1.0


def test_a_device_of_a_host_drops_its_kept_update_once_a_later_round_is_announced() -> None:
    """A device keeps its last update to answer that round's plan if it comes again; in a host,
    the announcement of a later round (to any of its devices) makes the others drop theirs."""
    from edge_sdk.models.spec import build_model
    from edge_sdk.models.zoo import mlp
    from edge_sdk.protocol.messages import Plan, RoundStart, Update
    from edge_sdk.tensors import state_to_numpy

    topics = Topics(job="host")
    spec = mlp(in_features=64, num_classes=2, hidden=(8,), input_shape=(1, 8, 8))
    plan = Plan(method="fedavg", label="global", model_spec=spec, tensors=state_to_numpy(build_model(spec), copy=True),
                train={"epochs": 1, "batch_size": 4, "lr": 0.1})
    with EmbeddedBroker() as broker, MqttTransport(TransportConfig(url=broker.url, connect_timeout=5)) as coordinator:
        subscribed(coordinator, topics.all_uplinks())
        network = NetworkLoop()
        clients = [_device(broker.url, f"keep{i}", network) for i in range(3)]
        host = DeviceHost(clients, network=network, workers=4, connectors=1)
        host.start()
        try:
            for _ in clients:
                env = _next_envelope(coordinator, Register)
                ack = Envelope.of(Ack("registered"), "coordinator", reply_to=env.msg_id)
                coordinator.publish(topics.downlink(env.sender), encode_envelope(ack), qos=1)

            def announce(rnd: int, device: str) -> None:
                start = Envelope.of(RoundStart(60.0, (device,)), "coordinator", round=rnd)
                work = Envelope.of(plan, "coordinator", round=rnd)
                for env in (start, work):
                    coordinator.publish(topics.downlink(device), encode_envelope(env), qos=1)
                assert _next_envelope(coordinator, Update, timeout=20.0).sender == device

            announce(0, "keep0")
            assert clients[0].holds_update and not clients[1].holds_update
            announce(1, "keep1")  # round 0 is over: keep0 need not keep its update any more
            deadline = time.monotonic() + 5
            while clients[0].holds_update and time.monotonic() < deadline:
                time.sleep(0.01)
            assert not clients[0].holds_update
            assert clients[1].holds_update  # round 1's own update stays until a later round begins
            assert not clients[2].holds_update
        finally:
            host.stop(wait_s=5.0)
