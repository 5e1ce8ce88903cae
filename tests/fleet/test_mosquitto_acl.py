"""The home server's broker set-up, for real: deploy/homeserver's mosquitto.conf and ACL,
certificates from make-certs.sh and users/bundles from add-device.sh, on a private mosquitto."""

from __future__ import annotations

import subprocess
import time

import pytest

from edge_sdk.config import read_toml
from edge_sdk.protocol.topics import Topics
from edge_sdk.networking.transport import MqttTransport, TransportConfig, TransportError
from tests.support.home_broker import HOME, start_home_broker
from tests.support.requirements import HOME_TOOLS, needs
from tests.support.paths import REPO_ROOT

ROOT = REPO_ROOT
TOPICS = Topics(job="home")

pytestmark = [needs(*HOME_TOOLS), pytest.mark.slow]  # a TLS mosquitto per module, jobs on it


@pytest.fixture(scope="module")
def home(tmp_path_factory):
    home = start_home_broker(tmp_path_factory.mktemp("home"))
    yield {"tmp": home.tmp, "port": home.port, "ca": home.ca, "broker": home.broker, "acl": home.acl,
           "passwd": home.passwd, "home": home}
    home.stop()


def _device(home: dict, name: str) -> MqttTransport:
    """A device connected with the bundle add-device.sh wrote for it (paths made local)."""
    return home["home"].device(name)


def _coordinator(home: dict) -> MqttTransport:
    return home["home"].coordinator()


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


def test_a_device_cannot_take_over_another_clients_id(home):
    """use_username_as_clientid: a device's credentials with another client's id get a connection
    of its own (named after its user), and the device and coordinator keep theirs."""
    a, coord = _device(home, "pi-a"), _coordinator(home)
    coord.subscribe(TOPICS.all_uplinks())
    time.sleep(0.3)
    thieves = [home["home"].device("pi-b", client_id=victim) for victim in ("pi-a", "coord", "edgefl-coordinator-home")]
    try:
        time.sleep(1.0)
        assert a.connected and a.connect_count == 1
        assert coord.connected and coord.connect_count == 1
        a.publish(TOPICS.uplink("pi-a"), b"still here")
        assert a.wait_published(5)
        assert (TOPICS.uplink("pi-a"), b"still here") in _drain(coord, 1.0)
        log = home["broker"].log_text()
        # each thief got a connection named after its own user; no client named pi-a or
        # coordinator was replaced (pi-b's own connections do replace each other: one per user)
        assert "u'pi-b')" in log and "as pi-b (" in log
        assert "Client pi-a already connected" not in log and "Client coordinator already connected" not in log
    finally:
        for t in (a, coord, *thieves):
            t.close()


def test_a_device_whose_id_is_not_its_username_says_so_once_and_exits_3(home, tmp_path):
    """device_id "pi-x" with pi-a's credentials: the ACL refuses every publish under pi-x. The
    device says so in one line naming the topic and exits 3 (the unit does not restart it),
    instead of "broker refused publish ... Not authorized" every 5 s for ever."""
    import sys

    import numpy as np

    bundle = home["tmp"] / "pi-a"
    rng = np.random.default_rng(0)
    np.savez(tmp_path / "data.npz", x_train=rng.random((20, 1, 8, 8), dtype=np.float32),
             y_train=np.arange(20) % 2)
    broker = read_toml(bundle / "client.toml")["broker"]
    config = tmp_path / "client.toml"
    config.write_text(f'device_id = "pi-x"\njob = "home"\nstate_dir = "{tmp_path / "state"}"\n'
                      f'[broker]\nurl = "{broker["url"]}"\nusername = "pi-a"\n'
                      f'password_file = "{bundle / "password"}"\nca_file = "{bundle / "ca.crt"}"\n'
                      f'[device]\nprofile = "raspberry-pi-4b"\n[data]\ndataset = "npz:{tmp_path / "data.npz"}"\n')
    started = time.monotonic()
    run = subprocess.run([sys.executable, "-m", "edge_sdk.cli", "client", "--config", str(config)],
                         capture_output=True, text=True, timeout=120, cwd=tmp_path)
    assert run.returncode == 3, run.stdout + run.stderr
    assert "Not authorized" in run.stderr and "device_id must be its MQTT username" in run.stderr, run.stderr
    assert run.stderr.count("Not authorized") <= 3 and time.monotonic() - started < 60


def test_a_serving_device_reads_exactly_its_sensor_topics_and_writes_none(tmp_path):
    """add-device.sh --reads: pi-a's serving connection has its own user, pi-a.serve (the broker takes
    the username as client id: one connection a user), connected beside pi-a's own without taking it
    over; it reads its plug's zigbee2mqtt topic (a name with a space), not the front door's, not
    through zigbee2mqtt/#, cannot command the plug nor write a device's uplink, and writes pi-a's
    predictions; zigbee2mqtt and Home Assistant on the same broker with the ACL template's lines."""
    plug, door = "zigbee2mqtt/Kitchen plug", "zigbee2mqtt/Front door"
    home = start_home_broker(tmp_path, reads={"pi-a": (plug,)}, homeassistant=True, zigbee2mqtt="z2m-secret")
    bundle = tmp_path / "pi-a"
    assert read_toml(bundle / "client.toml") and '# username = "pi-a.serve"' in (bundle / "client.toml").read_text()
    zigbee = MqttTransport(TransportConfig(url=home.url, client_id="z2m", username="zigbee2mqtt",
                                           password="z2m-secret", ca_file=str(home.ca)))
    serving = MqttTransport(TransportConfig(url=home.url, client_id="pi-a-serve", username="pi-a.serve",
                                            password=(bundle / "serve.password").read_text().strip(),
                                            ca_file=str(home.ca)))
    for peer in (zigbee, serving):
        peer.connect()
    a, b, ha = home.device("pi-a"), home.device("pi-b"), home.homeassistant()
    try:
        text = home.acl.read_text()
        assert text.count(f"\ntopic read {plug}\n") == 1 and "\nuser pi-a.serve\n" in text
        for peer in (a, b, serving):
            for topic in (plug, door, "zigbee2mqtt/#"):
                peer.subscribe(topic)
        ha.subscribe("zigbee2mqtt/#")
        ha.subscribe(TOPICS.prediction("pi-a"))
        zigbee.subscribe(f"{plug}/set")
        time.sleep(0.3)
        zigbee.publish(plug, b'{"power": 2000.5, "state": "ON"}')
        zigbee.publish(door, b'{"contact": false}')
        serving.publish(f"{plug}/set", b'{"state": "OFF"}')  # a serving device commands nothing
        serving.publish(TOPICS.uplink("pi-a"), b"an update from the serving user")  # nor trains
        serving.publish(TOPICS.prediction("pi-a"), b'{"class": "kettle"}', retain=True)
        ha.publish(f"{plug}/set", b'{"state": "ON"}')
        for peer in (zigbee, serving, ha):
            peer.wait_published(5)
        got, got_a, got_b = _drain(serving, 1.0), _drain(a, 0.3), _drain(b, 0.3)
        assert got and set(got) == {(plug, b'{"power": 2000.5, "state": "ON"}')}  # never the door
        assert got_a == [] and got_b == []  # the devices' own users read no sensor
        assert sorted(topic for topic, _ in _drain(ha, 0.3)) == sorted([door, plug, f"{plug}/set",
                                                                        TOPICS.prediction("pi-a")])
        assert _drain(zigbee, 0.3) == [(f"{plug}/set", b'{"state": "ON"}')]  # Home Assistant's command, not pi-a's
        assert serving.failed >= 2  # MQTT 5: "not authorized" to the command and to the uplink
        assert a.connected and serving.connected and a.connect_count == 1 and serving.connect_count == 1
    finally:
        for t in (zigbee, serving, a, b, ha):
            t.close()
        home.stop()


def test_add_device_refuses_a_wildcard_or_an_edgefl_topic_to_read(tmp_path):
    env = {"PATH": "/usr/bin:/bin:/usr/sbin:/sbin"}
    for topic, why in (("zigbee2mqtt/#", "no + or # wildcards"), ("edgefl/home/up/pi-b", "edgefl's own topics"),
                       (" zigbee2mqtt/plug", "no spaces at its ends")):
        proc = subprocess.run([HOME / "add-device.sh", "--passwd", tmp_path / "passwd", "--out", tmp_path / "pi",
                               "--no-reload", "--reads", topic, "pi"], env=env, capture_output=True, text=True)
        assert proc.returncode == 1 and why in proc.stderr and proc.stderr.count("\n") == 1, proc.stderr
    assert not (tmp_path / "passwd").exists()
