"""One NetworkLoop thread drives many MQTT connections (paho's external-loop API on epoll):
past select()'s 1,024 file descriptors, no thread per connection, reconnects after a broker
restart with its subscriptions, and a crash still publishes the will."""

from __future__ import annotations

import contextlib
import os
import resource
import time

import pytest

from coordinator.runtime.broker import BrokerConfig, EmbeddedBroker
from edge_sdk.networking.network_loop import NetworkLoop
from edge_sdk.networking.transport import MqttTransport, TransportConfig, Will
from tests.support.requirements import needs

CONNECTIONS = 1100  # file descriptors above 1,024: out of select()'s reach


def _threads() -> int:
    return len(os.listdir("/proc/self/task"))


@pytest.fixture()
def loop():
    network = NetworkLoop()
    yield network
    network.stop()


@pytest.fixture()
def many_fds():
    """Raise this process's (and so the broker's) open-file limit for the connections' sockets."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    want = 4 * CONNECTIONS
    if hard != resource.RLIM_INFINITY and hard < want:
        pytest.skip(f"the open-file hard limit {hard} is below {want}")
    resource.setrlimit(resource.RLIMIT_NOFILE, (max(soft, want), hard))
    yield
    resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))


@needs("mosquitto")
def test_one_thread_drives_more_connections_than_select_can(loop, many_fds) -> None:
    with EmbeddedBroker(BrokerConfig(prefer="mosquitto")) as broker:
        before = _threads()
        transports = []
        try:
            for i in range(CONNECTIONS):
                t = MqttTransport(TransportConfig(url=broker.url, client_id=f"many-{i}", protocol="3.1.1",
                                                  connect_timeout=10), network=loop)
                t.subscribe(f"many/{i}")
                t.connect()
                transports.append(t)
            assert _threads() == before  # no network thread per connection
            assert max(int(fd) for fd in os.listdir("/proc/self/fd")) > 1024
            assert len(loop) == CONNECTIONS
            for i in (1, CONNECTIONS - 1):  # a message reaches exactly the connection it is for
                transports[0].publish(f"many/{i}", f"to {i}".encode(), qos=1)
            got = transports[CONNECTIONS - 1].receive(5.0)
            assert got is not None and got.payload == f"to {CONNECTIONS - 1}".encode()
            assert transports[1].receive(5.0).payload == b"to 1"
            assert transports[2].receive(0.2) is None
        finally:
            started = time.monotonic()
            for t in transports:
                t.close()
            closed = time.monotonic() - started
        assert closed < 5.0
        deadline = time.monotonic() + 5
        while len(loop) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert len(loop) == 0  # every closed connection forgotten


@needs("mosquitto")
def test_a_connection_on_the_loop_comes_back_after_a_broker_restart(loop) -> None:
    with EmbeddedBroker(BrokerConfig(prefer="mosquitto")) as broker:
        config = TransportConfig(url=broker.url, client_id="back", connect_timeout=5, reconnect_min_delay=0.2,
                                 reconnect_max_delay=1.0)
        t = MqttTransport(config, network=loop)
        t.subscribe("back/in")
        t.connect()
        broker.restart()
        deadline = time.monotonic() + 15
        while t.connect_count < 2 and time.monotonic() < deadline:
            time.sleep(0.05)
        assert t.connect_count == 2 and t.connected
        with MqttTransport(TransportConfig(url=broker.url, connect_timeout=5)) as sender:
            sender.publish("back/in", b"after the restart", qos=1)
            msg = t.receive(5.0)
        assert msg is not None and msg.payload == b"after the restart"  # subscribed again
        t.close()


@needs("mosquitto")
def test_a_crash_on_the_loop_publishes_the_will(loop) -> None:
    with EmbeddedBroker(BrokerConfig(prefer="mosquitto")) as broker:
        with MqttTransport(TransportConfig(url=broker.url, connect_timeout=5)) as watcher:
            watcher.subscribe("wills/#")
            dying = MqttTransport(TransportConfig(url=broker.url, client_id="dying", connect_timeout=5,
                                                  will=Will("wills/dying", b"gone", qos=1)), network=loop)
            dying.connect()
            dying._simulate_crash()
            msg = watcher.receive(5.0)
            assert msg is not None and msg.payload == b"gone"


@needs("mosquitto")
def test_stopping_the_loop_drops_the_connections_still_on_it() -> None:
    """A host that stops its loop with connections still open (their devices were not closed)
    drops them: the broker sees each connection end without a DISCONNECT and publishes its will."""
    network = NetworkLoop()
    with EmbeddedBroker(BrokerConfig(prefer="mosquitto")) as broker:
        with MqttTransport(TransportConfig(url=broker.url, connect_timeout=5)) as watcher:
            watcher.subscribe("wills/#")
            left = [MqttTransport(TransportConfig(url=broker.url, client_id=f"left{i}", connect_timeout=5,
                                                  will=Will(f"wills/left{i}", b"gone", qos=1)), network=network)
                    for i in range(3)]
            for transport in left:
                transport.connect()
            assert len(network) == 3
            network.stop()
            assert len(network) == 0
            wills = {m.topic for m in (watcher.receive(5.0) for _ in left) if m is not None}
            assert wills == {f"wills/left{i}" for i in range(3)}


def _time_wait_port_pairs() -> set[frozenset[int]]:
    """The two ports of each of this machine's TCP connections in TIME_WAIT (either end's view)."""
    pairs: set[frozenset[int]] = set()
    for name in ("/proc/net/tcp", "/proc/net/tcp6"):
        with contextlib.suppress(OSError), open(name) as table:
            for line in list(table)[1:]:
                fields = line.split()
                if fields[3] == "06":
                    pairs.add(frozenset(int(address.rsplit(":", 1)[1], 16) for address in fields[1:3]))
    return pairs


@needs("mosquitto")
def test_an_aborted_connection_is_reset_and_leaves_no_time_wait(loop) -> None:
    """A simulated fleet ends by aborting thousands of connections: each is reset (its will is
    published) and none lingers in TIME_WAIT, where thousands slowed every later connection's
    search for a free port (a run right after another took several times as long to start)."""
    with EmbeddedBroker(BrokerConfig(prefer="mosquitto")) as broker:
        with MqttTransport(TransportConfig(url=broker.url, connect_timeout=5)) as watcher:
            watcher.subscribe("wills/#")
            transports = [MqttTransport(TransportConfig(url=broker.url, client_id=f"reset{i}", connect_timeout=5,
                                                        will=Will(f"wills/reset{i}", b"gone", qos=1)),
                                        network=loop if i % 2 else None) for i in range(6)]
            ports = []
            for transport in transports:  # half on the loop, half with paho's own thread
                transport.connect()
                ports.append(transport._client.socket().getsockname()[1])
            for transport in transports:
                transport.abort()
            wills = {(m.topic, m.payload) for m in (watcher.receive(5.0) for _ in transports) if m is not None}
            assert wills == {(f"wills/reset{i}", b"gone") for i in range(6)}
            deadline = time.monotonic() + 5.0
            while len(loop) and time.monotonic() < deadline:  # the loop has closed its sockets
                time.sleep(0.02)
            time.sleep(0.2)
            broker_port = int(broker.url.rsplit(":", 1)[1])
            assert not {frozenset((port, broker_port)) for port in ports} & _time_wait_port_pairs()
