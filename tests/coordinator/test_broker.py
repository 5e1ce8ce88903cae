"""EmbeddedBroker: real mosquitto / amqtt processes on free loopback ports."""

from __future__ import annotations

import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from coordinator.runtime.broker import BrokerConfig, BrokerError, EmbeddedBroker, find_mosquitto, free_port
from edge_sdk.networking.transport import MqttTransport, TransportConfig
from tests.support.requirements import needs

KINDS = [pytest.param("mosquitto", marks=needs("mosquitto")), "amqtt"]


def _accepts(port: int) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=0.5):
            return True
    except OSError:
        return False


def _listen_addresses(port: int) -> set[str]:
    """Local addresses with a LISTEN socket on ``port`` (from /proc/net/tcp*)."""
    found = set()
    for name, width in (("/proc/net/tcp", 8), ("/proc/net/tcp6", 32)):
        path = Path(name)
        if not path.exists():
            continue
        for line in path.read_text().splitlines()[1:]:
            fields = line.split()
            addr, hex_port = fields[1].split(":")
            if fields[3] == "0A" and int(hex_port, 16) == port:
                found.add(socket.inet_ntoa(bytes.fromhex(addr)[::-1]) if width == 8 else addr)
    return found


def test_free_port_is_bindable() -> None:
    port = free_port()
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", port))
    assert 0 < port < 65536


def test_config_validation() -> None:
    with pytest.raises(ValueError, match="prefer"):
        BrokerConfig(prefer="rabbitmq")
    with pytest.raises(ValueError, match="127.0.0.1"):
        BrokerConfig(extra_config=("listener 8883 0.0.0.0",))
    with pytest.raises(ValueError, match="127.0.0.1"):
        BrokerConfig(extra_config=("listener 8883",))
    with pytest.raises(ValueError, match="newlines"):
        BrokerConfig(extra_config=("a 1\nlistener 1 0.0.0.0",))
    BrokerConfig(extra_config=("listener 8883 127.0.0.1",))  # allowed
    with pytest.raises(BrokerError, match="not found"):
        EmbeddedBroker(BrokerConfig(prefer="mosquitto", mosquitto_path="/nonexistent/mosquitto"))


def test_auto_prefers_mosquitto_when_installed() -> None:
    b = EmbeddedBroker()
    assert b.kind == ("mosquitto" if find_mosquitto() else "amqtt")
    with pytest.raises(BrokerError, match="start"):
        _ = b.port  # no port before start()


@pytest.mark.parametrize("kind", KINDS)
def test_lifecycle_loopback_only_and_restart_same_port(kind: str) -> None:
    b = EmbeddedBroker(BrokerConfig(prefer=kind))
    b.start()
    try:
        port = b.port
        assert b.kind == kind and b.host == "127.0.0.1" and b.url == f"mqtt://127.0.0.1:{port}"
        assert b.running and _accepts(port)
        assert _listen_addresses(port) == {"127.0.0.1"}
        b.start()  # already running: no-op
        b.restart()
        assert b.port == port and _accepts(port) and b.running
        with MqttTransport(TransportConfig(url=b.url, connect_timeout=5)) as t:
            assert t.connected
        if kind == "mosquitto":
            assert "mosquitto version" in b.log_text()
    finally:
        b.stop()
    assert not b.running and not _accepts(port)
    b.stop()  # idempotent


@pytest.mark.parametrize("kind", KINDS)
def test_port_in_use_is_reported(kind: str) -> None:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen()
        port = sock.getsockname()[1]
        with pytest.raises(BrokerError, match="in use"):
            EmbeddedBroker(BrokerConfig(prefer=kind, port=port)).start()


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("listening", [True, False])
def test_a_free_port_taken_before_the_broker_binds_it_is_replaced(kind: str, listening: bool, monkeypatch) -> None:
    """The race of issue 36: the port `free_port` chose is taken by another program before the
    broker binds it (listening: seen before starting; only bound: the broker's bind fails)."""
    import coordinator.runtime.broker as broker_module

    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        if listening:
            taken.listen()
        ports = iter([taken.getsockname()[1]])
        monkeypatch.setattr(broker_module, "free_port", lambda: next(ports, None) or free_port())
        broker = EmbeddedBroker(BrokerConfig(prefer=kind))
        try:
            broker.start()
            assert broker.port != taken.getsockname()[1] and _accepts(broker.port)
        finally:
            broker.stop()


@pytest.mark.slow
def test_a_broker_failure_is_one_line_at_the_command_line(tmp_path) -> None:
    """No command ends in a traceback for a failure it can name: a broker error keeps its first
    line and the log's last; a broker nobody listens on is one line too."""
    from edge_sdk.cli import one_line

    error = BrokerError("mosquitto exited with code 1 on start:\n1: Opening ipv4 listen socket\n"
                        "1: Error: Address already in use\n")
    assert one_line(error) == "mosquitto exited with code 1 on start: ... 1: Error: Address already in use"
    closed = free_port()
    proc = subprocess.run([sys.executable, "-m", "edge_sdk.cli", "simulate", "--clients", "1", "--rounds", "1",
                           "--out", str(tmp_path), "--broker", f"mqtt://127.0.0.1:{closed}"],
                          capture_output=True, text=True, timeout=120, check=False)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1 and str(closed) in proc.stderr


@needs("mosquitto")
def test_bad_mosquitto_config_error_contains_log() -> None:
    b = EmbeddedBroker(BrokerConfig(prefer="mosquitto", extra_config=("no_such_option 1",)))
    with pytest.raises(BrokerError, match="(?s)exited.*no_such_option"):
        b.start()
    b.stop()


@needs("mosquitto")
def test_mosquitto_persistence_survives_restart(tmp_path: Path) -> None:
    cfg = BrokerConfig(prefer="mosquitto", persistence=True, data_dir=str(tmp_path / "db"))
    with EmbeddedBroker(cfg) as b:
        with MqttTransport(TransportConfig(url=b.url, connect_timeout=5)) as t:
            t.publish("persist/model", b"v1", retain=True)
            assert t.wait_published(5)
        b.restart()
        assert any((tmp_path / "db").iterdir())
        with MqttTransport(TransportConfig(url=b.url, connect_timeout=5)) as t:
            t.subscribe("persist/model")
            msg = t.receive(5)
            assert msg is not None and (msg.payload, msg.retained) == (b"v1", True)


@needs("mosquitto")
def test_without_persistence_restart_forgets_retained() -> None:
    with EmbeddedBroker(BrokerConfig(prefer="mosquitto")) as b:
        with MqttTransport(TransportConfig(url=b.url, connect_timeout=5)) as t:
            t.publish("volatile/x", b"v1", retain=True)
            assert t.wait_published(5)
        b.restart()
        with MqttTransport(TransportConfig(url=b.url, connect_timeout=5)) as t:
            t.subscribe("volatile/x")
            assert t.receive(0.5) is None


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="the kernel's parent-death signal is Linux's")
@needs("mosquitto")
def test_a_killed_job_leaves_no_broker_behind() -> None:
    import psutil

    script = ("import sys, time\nfrom coordinator.runtime.broker import EmbeddedBroker\n"
              "b = EmbeddedBroker(); b.start(); print(b._proc.pid, flush=True); time.sleep(120)\n")
    job = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True)
    try:
        broker_pid = int(job.stdout.readline())
        assert psutil.pid_exists(broker_pid)
        job.kill()  # SIGKILL: no cleanup code runs in the job
        job.wait(10)
        deadline = time.monotonic() + 10
        while psutil.pid_exists(broker_pid) and psutil.Process(broker_pid).status() != psutil.STATUS_ZOMBIE \
                and time.monotonic() < deadline:
            time.sleep(0.1)
        assert not psutil.pid_exists(broker_pid) or psutil.Process(broker_pid).status() == psutil.STATUS_ZOMBIE
    finally:
        job.kill()
