"""Simulated devices on one shared MQTT connection (`--connections shared`): each publishes and
subscribes on its own topics as over a connection of its own — the coordinator sees the same
messages —, a message for one device reaches that device only, the fleet's broadcast reaches all,
and the host says what the broker would have said for them (their births, and their wills when they
are aborted; on the job's own broker, neither). A job learns the same on shared connections as on
connections of their own."""

from __future__ import annotations

import os
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import replace

import numpy as np
import pytest

from coordinator.runtime.broker import EmbeddedBroker
from edge_sdk.client import ClientConfig, DeviceClient
from edge_sdk.methods import LocalData
from edge_sdk.networking.network_loop import NetworkLoop
from edge_sdk.profiling import load_profile
from edge_sdk.protocol.messages import Ack, Envelope, Register, Status, decode_envelope, encode_envelope
from edge_sdk.protocol.topics import Topics
from edge_sdk.networking.transport import MqttTransport, TransportConfig, TransportError
from simulation.config import SimulationConfig
from simulation.shared_connection import OWN_CONNECTIONS_UP_TO, SharedConnection
from simulation.sim_devices import DEVICES_PER_CONNECTION, DeviceHost, host_connections
from simulation.simulate import run_simulation

JOB = "shared"


def _open_fds() -> int:
    return len(os.listdir("/proc/self/fd"))


def _device(shared: SharedConnection, name: str, network: NetworkLoop) -> DeviceClient:
    data = LocalData(np.zeros((4, 1, 8, 8), np.float32), np.array([0, 1, 0, 1]), 2)
    config = ClientConfig(device_id=name, transport=TransportConfig(url="mqtt://unused:1", connect_timeout=5), job=JOB,
                          register_retry_s=60.0, heartbeat_s=600.0)
    return DeviceClient(config, data, load_profile("raspberry-pi-4b"), network=network, connect_via=shared.channel)


@contextmanager
def _devices_on_one_connection(prefix: str, count: int, presence: bool = True
                               ) -> Iterator[tuple[Topics, MqttTransport, list[DeviceClient], DeviceHost]]:
    """A real broker, a coordinator's connection watching every uplink and status, and ``count``
    devices named ``prefix000``... on one shared connection, hosted (not started yet)."""
    topics = Topics(job=JOB)
    with EmbeddedBroker() as broker, MqttTransport(TransportConfig(url=broker.url, connect_timeout=5)) as coordinator:
        coordinator.subscribe(topics.all_uplinks())
        coordinator.subscribe(f"{topics.prefix}/status/+")
        network = NetworkLoop()
        shared = SharedConnection(TransportConfig(url=broker.url, client_id=f"host-{prefix}", connect_timeout=5),
                                  network, presence=presence)
        clients = [_device(shared, f"{prefix}{i:03d}", network) for i in range(count)]
        yield topics, coordinator, clients, DeviceHost(clients, network=network, workers=4, connectors=1,
                                                       shared=[shared])


def _collect(watcher: MqttTransport, want: int, accept, timeout: float = 20.0,
             key=lambda env: env.sender) -> dict:
    """Envelopes ``accept`` takes, by ``key`` (the sender), until ``want`` keys or the timeout."""
    got: dict = {}
    deadline = time.monotonic() + timeout
    while len(got) < want and (left := deadline - time.monotonic()) > 0:
        msg = watcher.receive(min(left, 1.0))
        if msg is not None and accept(env := decode_envelope(msg.payload)):
            got[key(env)] = env
    return got


def test_devices_on_one_connection_talk_on_their_own_topics() -> None:
    with _devices_on_one_connection("sh", 60) as (topics, coordinator, clients, host):
        before = _open_fds()
        host.start()
        seen = _collect(coordinator, 2 * len(clients), lambda env: isinstance(env.body, (Register, Status)),
                        key=lambda env: (env.sender, type(env.body).__name__))
        registers = {name: env for (name, kind), env in seen.items() if kind == "Register"}
        births = {name: env for (name, kind), env in seen.items() if kind == "Status" and env.body.state == "online"}
        assert set(registers) == {c.config.device_id for c in clients}  # each on its own uplink topic
        assert set(births) == set(registers)  # each device's birth message on its own status topic
        assert _open_fds() - before <= 3  # one socket for all of them, not one each
        assert len({env.body.connection for env in births.values()}) == len(clients)  # a stamp each
        # an ack for one device registers that device only
        lucky = registers["sh007"]
        ack = Envelope.of(Ack("registered"), "coordinator", reply_to=lucky.msg_id)
        coordinator.publish(topics.downlink("sh007"), encode_envelope(ack), qos=1)
        deadline = time.monotonic() + 5
        while not clients[7]._registered and time.monotonic() < deadline:
            time.sleep(0.02)
        assert clients[7]._registered
        assert not any(c._registered for i, c in enumerate(clients) if i != 7)
        # a roll call on the broadcast topic reaches every device; only the registered one answers it
        coordinator.publish(topics.broadcast(), encode_envelope(Envelope.of(Status("online", "roll call"),
                                                                            "coordinator")), qos=1)
        answers = _collect(coordinator, 2, lambda env: isinstance(env.body, Status) and env.body.state == "idle",
                           timeout=3.0)
        assert set(answers) == {"sh007"}
        # the end: every device's will, as the broker would publish it for a lost connection
        assert host.stop(wait_s=5.0) == []
        wills = _collect(coordinator, len(clients), lambda env: isinstance(env.body, Status)
                         and env.body.state == "offline")
        assert len(wills) == len(clients)
        assert all(env.body.reason == "connection lost" and env.body.connection == births[name].body.connection
                   for name, env in wills.items())
        with pytest.raises(TransportError):
            clients[0].link.transport.publish(topics.uplink("sh000"), b"x")


def test_on_the_jobs_own_broker_devices_register_without_births_or_wills() -> None:
    with _devices_on_one_connection("np", 20, presence=False) as (_topics, coordinator, clients, host):
        host.start()
        seen = _collect(coordinator, 2 * len(clients), lambda env: isinstance(env.body, (Register, Status)),
                        key=lambda env: (env.sender, type(env.body).__name__), timeout=5.0)
        assert {name for name, kind in seen if kind == "Register"} == {c.config.device_id for c in clients}
        assert not [key for key in seen if key[1] == "Status"]  # no birth
        assert host.stop(wait_s=5.0) == []
        assert not _collect(coordinator, 1, lambda env: isinstance(env.body, Status), timeout=2.0)  # no will


def test_a_job_learns_the_same_on_shared_connections(tmp_path) -> None:
    outcomes = []
    for connections in ("own", "shared"):
        config = SimulationConfig(method="fedavg", dataset="mnist-sample", clients=12, model="mlp", threads=1,
                                  out=str(tmp_path / connections), plots=False, connections=connections)
        config = replace(config, federation=replace(config.federation, rounds=2, devices_per_round=4, eval_every=2))
        report = run_simulation(config)
        assert report.status == "finished" and len(report.rounds) == 2
        outcomes.append(([r.participants for r in report.rounds], report.rounds[-1].accuracy,
                         report.rounds[-1].bytes_up))
    assert outcomes[0] == outcomes[1]


def test_connections_setting() -> None:
    assert not SimulationConfig(clients=OWN_CONNECTIONS_UP_TO).shared_connections
    assert SimulationConfig(clients=OWN_CONNECTIONS_UP_TO + 1).shared_connections
    assert SimulationConfig(clients=3, connections="shared").shared_connections
    assert not SimulationConfig(clients=20_000, connections="own", backend="ray").shared_connections
    SimulationConfig(clients=20_000)  # one process holds them on a shared connection
    with pytest.raises(ValueError, match="at most 10000"):
        SimulationConfig(clients=20_000, connections="own")
    with pytest.raises(ValueError, match="connections must be one of auto, own, shared"):
        SimulationConfig(connections="many")


@pytest.mark.parametrize("clients", [2_000, 10_000, 100_000])
def test_a_shared_connection_pings_before_the_broker_gives_up_on_it(clients: int) -> None:
    """paho pings once a connection sent nothing for its keep-alive, when the network thread
    looks (every `misc_every_s`); the broker drops it after 1.5 × its keep-alive. A shared
    connection at a real device's 30 s, looked at every 30 s, lost that race while idle."""
    network, shared = host_connections(SimulationConfig(clients=clients), "mqtt://127.0.0.1:1", range(clients))
    try:
        assert len(shared) == -(-clients // DEVICES_PER_CONNECTION)
        for connection in shared:
            keepalive = connection.transport.config.keepalive
            assert keepalive + network.misc_every_s < 1.5 * keepalive
    finally:
        network.stop()  # its thread: started with it
