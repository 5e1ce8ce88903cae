"""The home server's broker set-up, for real: deploy/homeserver's mosquitto.conf and ACL,
certificates from make-certs.sh and users/bundles from add-device.sh, on a private mosquitto."""

from __future__ import annotations

import shutil
import subprocess
import time
from pathlib import Path

import pytest

from coordinator.broker import BrokerConfig, EmbeddedBroker, find_mosquitto, free_port
from edge_sdk.config import read_toml, transport_from_toml
from edge_sdk.protocol.topics import Topics
from edge_sdk.transport import MqttTransport, TransportConfig, TransportError

ROOT = Path(__file__).resolve().parents[1]
HOME = ROOT / "deploy" / "homeserver"
TOPICS = Topics(job="home")

pytestmark = pytest.mark.skipif(find_mosquitto() is None or shutil.which("mosquitto_passwd") is None
                                or shutil.which("openssl") is None,
                                reason="mosquitto, mosquitto_passwd and openssl are needed")


def _conf_lines(tls_port: int, passwd: Path, acl: Path, certs: Path) -> tuple[str, ...]:
    """deploy/homeserver/mosquitto.conf with its paths and port moved into the test's sandbox."""
    subst = {"/etc/mosquitto/edgefl.passwd": str(passwd), "/etc/mosquitto/edgefl.acl": str(acl),
             "/etc/mosquitto/certs": str(certs), "listener 8883": f"listener {tls_port} 127.0.0.1"}
    lines = []
    for line in (HOME / "mosquitto.conf").read_text().splitlines():
        if line.strip() and not line.lstrip().startswith("#"):
            for old, new in subst.items():
                line = line.replace(old, new)
            lines.append(line)
    return tuple(lines)


@pytest.fixture(scope="module")
def home(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("home")
    certs, passwd = tmp / "certs", tmp / "edgefl.passwd"
    subprocess.run([HOME / "make-certs.sh", "edgefl-test", "--out", certs], check=True, capture_output=True)
    port = free_port()
    env = {"PATH": "/usr/bin:/bin:/usr/sbin:/sbin", "EDGEFL_CA_FILE": str(certs / "ca.crt")}
    for args in (["pi-a"], ["pi-b"], ["--coordinator"]):
        name = args[-1].lstrip("-")
        subprocess.run([HOME / "add-device.sh", "--passwd", passwd, "--out", tmp / name, "--no-reload",
                        "--broker-url", f"mqtts://127.0.0.1:{port}", *args], check=True, env=env,
                       capture_output=True)
    # add-device.sh made tmp/edgefl.acl (next to the password file) from deploy/homeserver/edgefl.acl
    acl = tmp / "edgefl.acl"
    broker = EmbeddedBroker(BrokerConfig(prefer="mosquitto", extra_config=_conf_lines(port, passwd, acl, certs)))
    broker.start()
    broker.wait_for_listener(port)  # the broker waited for its own plain listener; the TLS one too
    yield {"tmp": tmp, "port": port, "ca": certs / "ca.crt", "broker": broker, "acl": acl, "passwd": passwd}
    broker.stop()


def _device(home: dict, name: str) -> MqttTransport:
    """A device connected with the bundle add-device.sh wrote for it (paths made local)."""
    bundle = home["tmp"] / name
    config = read_toml(bundle / "client.toml")
    config["broker"].update(password_file=str(bundle / "password"), ca_file=str(bundle / "ca.crt"))
    transport = MqttTransport(transport_from_toml(config, client_id=name))
    transport.connect()
    return transport


def _coordinator(home: dict) -> MqttTransport:
    password = (home["tmp"] / "coordinator" / "coordinator.password").read_text().strip()
    transport = MqttTransport(TransportConfig(url=f"mqtts://127.0.0.1:{home['port']}", client_id="coord",
                                              username="coordinator", password=password,
                                              ca_file=str(home["ca"])))
    transport.connect()
    return transport


def _drain(transport: MqttTransport, seconds: float) -> list[tuple[str, bytes]]:
    end, got = time.monotonic() + seconds, []
    while (left := end - time.monotonic()) > 0:
        msg = transport.receive(timeout=left)
        if msg is not None:
            got.append((msg.topic, msg.payload))
    return got


def test_bundle_is_a_complete_device_config(home):
    config = read_toml(home["tmp"] / "pi-a" / "client.toml")
    assert config["device_id"] == config["broker"]["username"] == "pi-a"
    assert config["broker"]["url"] == f"mqtts://127.0.0.1:{home['port']}"
    assert (home["tmp"] / "pi-a" / "password").stat().st_mode & 0o077 == 0


def test_unauthenticated_and_wrong_password_are_refused(home):
    url = f"mqtts://127.0.0.1:{home['port']}"
    for username, password in ((None, None), ("pi-a", "not-the-password")):
        transport = MqttTransport(TransportConfig(url=url, username=username, password=password,
                                                  ca_file=str(home["ca"]), connect_timeout=3))
        with pytest.raises(TransportError, match="(?i)not authori[sz]ed|bad user name or password"):
            transport.connect()
        transport.close()


def test_plain_mqtt_on_the_tls_port_is_refused(home):
    transport = MqttTransport(TransportConfig(url=f"mqtt://127.0.0.1:{home['port']}", username="pi-a",
                                              password=(home["tmp"] / "pi-a" / "password").read_text().strip(),
                                              connect_timeout=2, protocol="5"))
    with pytest.raises(TransportError):
        transport.connect()
    transport.close()


def test_device_reads_only_its_own_downlink(home):
    a, b, coord = _device(home, "pi-a"), _device(home, "pi-b"), _coordinator(home)
    try:
        a.subscribe(TOPICS.downlink("pi-b"))
        a.subscribe(f"{TOPICS.prefix}/down/#")
        a.subscribe(TOPICS.downlink("pi-a"))
        b.subscribe(TOPICS.downlink("pi-b"))
        time.sleep(0.3)
        coord.publish(TOPICS.downlink("pi-b"), b"plan for b")
        coord.publish(TOPICS.downlink("pi-a"), b"plan for a")
        assert coord.wait_published(5)
        got_b, got_a = _drain(b, 1.0), _drain(a, 0.5)
        assert got_b == [(TOPICS.downlink("pi-b"), b"plan for b")]
        # its own (once per overlapping subscription: 'down/#' and 'down/pi-a'), never b's
        assert got_a and set(got_a) == {(TOPICS.downlink("pi-a"), b"plan for a")}
    finally:
        for t in (a, b, coord):
            t.close()


def test_device_cannot_write_another_uplink_and_coordinator_reads_all(home):
    a, b, coord = _device(home, "pi-a"), _device(home, "pi-b"), _coordinator(home)
    try:
        coord.subscribe(TOPICS.all_uplinks())
        a.subscribe(TOPICS.all_uplinks())  # a device must not see other devices' updates
        time.sleep(0.3)
        a.publish(TOPICS.uplink("pi-b"), b"forged by a")
        a.publish(TOPICS.downlink("pi-b"), b"fake plan by a")
        a.publish(TOPICS.uplink("pi-a"), b"update a")
        b.publish(TOPICS.uplink("pi-b"), b"update b")
        a.wait_published(5)
        b.wait_published(5)
        got = sorted(_drain(coord, 1.0))
        assert got == [(TOPICS.uplink("pi-a"), b"update a"), (TOPICS.uplink("pi-b"), b"update b")]
        assert a.failed >= 2  # MQTT 5: the broker answered "not authorized" to both forgeries
        assert _drain(a, 0.3) == []
    finally:
        for t in (a, b, coord):
            t.close()


def test_mosquitto_accepts_the_acl_without_warnings(home):
    log = home["broker"].log_text()
    assert "Opening ipv4 listen socket on port" in log  # the log is the broker's start-up log
    # (a test run as root also gets "Warning: Mosquitto should not be run as root")
    warnings = [line for line in log.splitlines() if "Warning" in line and "run as root" not in line]
    assert warnings == [], log


def test_add_device_writes_each_device_once_into_the_acl(home):
    text = home["acl"].read_text()
    template = (HOME / "edgefl.acl").read_text()
    assert text.startswith(template)
    assert text.count("\nuser pi-a\n") == 1 and text.count("\nuser pi-b\n") == 1
    assert text.count("\nuser coordinator\n") == 1
    # again for pi-a (a new password): the ACL keeps one block for it
    env = {"PATH": "/usr/bin:/bin:/usr/sbin:/sbin", "EDGEFL_CA_FILE": str(home["ca"])}
    subprocess.run([HOME / "add-device.sh", "--passwd", home["passwd"], "--out", home["tmp"] / "pi-a-again",
                    "--no-reload", "pi-a"], check=True, env=env, capture_output=True)
    assert home["acl"].read_text() == text


def test_every_device_reads_the_broadcast(home):
    a, b, coord = _device(home, "pi-a"), _device(home, "pi-b"), _coordinator(home)
    try:
        for device in (a, b):
            device.subscribe(TOPICS.broadcast())
        time.sleep(0.3)
        coord.publish(TOPICS.broadcast(), b"round 0 starts")
        a.publish(TOPICS.broadcast(), b"forged broadcast by a")  # devices only read it
        assert coord.wait_published(5)
        a.wait_published(5)
        for device in (a, b):
            assert _drain(device, 0.7) == [(TOPICS.broadcast(), b"round 0 starts")]
    finally:
        for t in (a, b, coord):
            t.close()
