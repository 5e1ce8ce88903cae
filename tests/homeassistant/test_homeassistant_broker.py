"""Home Assistant on the home server's broker (issue 41), for real: deploy/homeserver's ACL gives Home
Assistant's user (add-device.sh --homeassistant) the fleet's discovery, state and availability and the
one command topic, and devices neither; remove-device.sh revokes a device and tells the coordinator;
and the bridge lines of docs/homeassistant.md carry exactly those topics between two mosquittos."""

from __future__ import annotations

import re
import subprocess
import time
from pathlib import Path

import pytest

from coordinator.homeassistant.discovery import HaTopics
from coordinator.runtime.broker import BrokerConfig, EmbeddedBroker
from edge_sdk.protocol.topics import Topics
from edge_sdk.networking.transport import MqttTransport, TransportConfig, TransportError
from tests.support.home_broker import HOME, start_home_broker
from tests.support.requirements import HOME_TOOLS, needs, require
from tests.support.paths import REPO_ROOT

pytestmark = [needs(*HOME_TOOLS), pytest.mark.slow]  # a TLS mosquitto per module

ROOT = REPO_ROOT
HA = HaTopics("home")
TOPICS = Topics(job="home")


@pytest.fixture(scope="module")
def home(tmp_path_factory):
    home = start_home_broker(tmp_path_factory.mktemp("ha-home"), devices=("pi-a", "pi-b", "pi-c"), homeassistant=True)
    yield home
    home.stop()


def _drain(transport: MqttTransport, seconds: float) -> list[tuple[str, bytes]]:
    end, got = time.monotonic() + seconds, []
    while (left := end - time.monotonic()) > 0:
        if (msg := transport.receive(timeout=left)) is not None:
            got.append((msg.topic, msg.payload))
    return got


def test_home_assistant_reads_the_fleet_and_writes_only_its_switch_and_birth(home):
    coordinator, ha, device = home.coordinator(), home.homeassistant(), home.device("pi-a")
    try:
        coordinator.subscribe(HA.command)
        coordinator.subscribe("homeassistant/status")
        coordinator.subscribe(TOPICS.all_uplinks())
        ha.subscribe("homeassistant/#")
        ha.subscribe("edgefl/+/ha/#")
        ha.subscribe("edgefl/+/up/+")  # not granted: nothing arrives
        ha.subscribe("edgefl/+/down/+")
        time.sleep(0.3)
        config = HA.discovery(HA.coordinator_node)
        for topic, payload in ((config, b"{}"), (HA.coordinator_state, b'{"state":"training"}'),
                               (HA.device_availability("pi-a"), b"online"),
                               (TOPICS.downlink("pi-a"), b"a plan")):
            coordinator.publish(topic, payload, retain=False)
        device.publish(TOPICS.uplink("pi-a"), b"an update")
        seen = dict(_drain(ha, 1.0))
        assert seen.keys() == {config, HA.coordinator_state, HA.device_availability("pi-a")}, seen.keys()
        ha.publish(HA.command, b"pause")
        ha.publish("homeassistant/status", b"online")
        ha.publish(TOPICS.uplink("homeassistant"), b"posing as a device")  # the deny lines refuse it
        ha.publish(HA.device_state("pi-b"), b'{"online":false}')  # only the coordinator writes state
        got = _drain(coordinator, 1.0)
        assert (HA.command, b"pause") in got and ("homeassistant/status", b"online") in got
        assert ("edgefl/home/up/homeassistant", b"posing as a device") not in got
        assert (TOPICS.uplink("pi-a"), b"an update") in got
    finally:
        for t in (coordinator, ha, device):
            t.close()


def test_a_device_can_neither_press_the_switch_nor_read_the_fleet_state(home):
    coordinator, device = home.coordinator(), home.device("pi-a")
    try:
        coordinator.subscribe(HA.command)
        for topic in ("homeassistant/#", "edgefl/+/ha/#", HA.coordinator_state):
            device.subscribe(topic)
        time.sleep(0.3)
        device.publish(HA.command, b"pause")
        device.publish(HA.discovery("edgefl-dev-pi-b"), b"{}")
        coordinator.publish(HA.coordinator_state, b'{"state":"training"}')
        coordinator.publish(HA.device_state("pi-b"), b'{"online":true}')
        assert _drain(coordinator, 1.0) == []
        assert [t for t, _ in _drain(device, 0.5) if "/ha/" in t or t.startswith("homeassistant/")] == []
    finally:
        coordinator.close()
        device.close()


def test_a_serving_device_publishes_its_own_predictions_and_home_assistant_corrects_them(home):
    ha, device, other = home.homeassistant(), home.device("pi-a"), home.device("pi-b")
    try:
        ha.subscribe("edgefl/+/predict/#")
        device.subscribe(TOPICS.correction("pi-a"))
        device.subscribe(TOPICS.correction("pi-b"))  # not granted: another device's corrections
        other.subscribe(TOPICS.correction("pi-a"))
        time.sleep(0.3)
        device.publish(TOPICS.prediction("pi-a"), b'{"class": "kettle"}', retain=False)
        device.publish(TOPICS.serving_availability("pi-a"), b"online", retain=False)
        device.publish(TOPICS.prediction("pi-b"), b'{"class": "posing as pi-b"}', retain=False)
        seen = _drain(ha, 1.0)
        assert (TOPICS.prediction("pi-a"), b'{"class": "kettle"}') in seen
        assert (TOPICS.serving_availability("pi-a"), b"online") in seen
        assert all(t != TOPICS.prediction("pi-b") for t, _ in seen)
        ha.publish(TOPICS.correction("pi-a"), b'{"class": "idle", "end": "x"}', qos=0)
        ha.publish(TOPICS.correction("pi-b"), b'{"class": "idle", "end": "y"}', qos=0)
        other.publish(TOPICS.correction("pi-a"), b'{"class": "forged"}', qos=0)  # a device corrects no one
        assert _drain(device, 1.0) == [(TOPICS.correction("pi-a"), b'{"class": "idle", "end": "x"}')]
        assert _drain(other, 0.3) == []
    finally:
        for t in (ha, device, other):
            t.close()


def test_add_device_keeps_home_assistants_user_apart(home, tmp_path):
    env = {"PATH": "/usr/bin:/bin:/usr/sbin:/sbin"}
    for args, why in ((["homeassistant"], "'homeassistant' is reserved"),
                      (["--coordinator", "homeassistant"], "'homeassistant' is a homeassistant user"),
                      (["--homeassistant", "pi-a"], "'pi-a' is a device user")):
        run = subprocess.run([HOME / "add-device.sh", "--passwd", home.passwd, "--acl", home.acl, "--out",
                              tmp_path / "x", "--no-reload", *args], env=env, capture_output=True, text=True)
        assert run.returncode != 0 and why in run.stderr, (args, run.stderr)
    assert "mosquitto_passwd" not in home.acl.read_text()


def test_remove_device_revokes_it_and_tells_the_coordinator(home, tmp_path):
    removed = tmp_path / "state" / "removed-devices"
    run = subprocess.run([HOME / "remove-device.sh", "--passwd", home.passwd, "--acl", home.acl, "--removed", removed,
                          "--no-reload", "pi-c"], capture_output=True, text=True, env={"PATH": "/usr/bin:/bin"})
    assert run.returncode == 0, run.stderr
    assert removed.read_text() == "pi-c\n"
    acl = home.acl.read_text()
    assert "user pi-c" not in acl and "user pi-b\ntopic read edgefl/+/coord" in acl
    assert not re.search(r"^pi-c:", home.passwd.read_text(), re.M)
    home.broker.restart()  # mosquitto reads users and the ACL again (systemctl reload on a real server)
    home.broker.wait_for_listener(home.port)
    with pytest.raises(TransportError):
        home.device("pi-c", connect_timeout=5.0)
    home.device("pi-b").close()  # the others stay
    # no error in the reloaded configuration; the listener probe's bare TCP connection (no TLS) may
    # leave an OpenSSL "unexpected eof" under load (failed once in a full run): not a configuration error
    log_lines = home.broker.log_text().split("mosquitto version")[-1].splitlines()
    assert not [line for line in log_lines if "Error" in line and "unexpected eof while reading" not in line]
    for name, why in (("coordinator", "is not a device"), ("nobody", "no user 'nobody'")):
        run = subprocess.run([HOME / "remove-device.sh", "--passwd", home.passwd, "--acl", home.acl, "--removed",
                              removed, "--no-reload", name], capture_output=True, text=True)
        assert run.returncode != 0 and why in run.stderr, run.stderr


def _bridge_lines(docs: Path) -> list[str]:
    """The bridge block of docs/homeassistant.md (the fenced block after "connection homeassistant")."""
    text = docs.read_text()
    block = re.search(r"```\n(connection homeassistant\n.*?)```", text, re.S)
    assert block, "docs/homeassistant.md has no bridge block"
    return [line for line in block.group(1).splitlines() if line and not line.startswith("#")]


def test_the_documented_bridge_carries_only_home_assistants_topics():
    require("mosquitto")
    with EmbeddedBroker(BrokerConfig(prefer="mosquitto")) as ha_broker:
        lines = [line.replace("ha-broker.local:1883", f"127.0.0.1:{ha_broker.port}") for line in
                 _bridge_lines(ROOT / "docs" / "homeassistant.md") if not line.startswith("remote_")]
        with EmbeddedBroker(BrokerConfig(prefer="mosquitto", extra_config=tuple(lines))) as edgefl_broker:
            ha = MqttTransport(TransportConfig(url=ha_broker.url, client_id="ha"))
            coordinator = MqttTransport(TransportConfig(url=edgefl_broker.url, client_id="coordinator"))
            for t in (ha, coordinator):
                t.connect()
            try:
                ha.subscribe("#")
                coordinator.subscribe("#")
                deadline = time.monotonic() + 10
                config = HA.discovery(HA.coordinator_node)
                while time.monotonic() < deadline and not any(t == config for t, _ in _drain(ha, 0.3)):
                    coordinator.publish(config, b"{}", retain=True)  # until the bridge is up
                for topic in (HA.coordinator_state, HA.device_availability("pi-a"), TOPICS.uplink("pi-a"),
                              TOPICS.downlink("pi-a"), TOPICS.status("pi-a")):
                    coordinator.publish(topic, b"x")
                out = {t for t, _ in _drain(ha, 1.0)}
                assert out == {HA.coordinator_state, HA.device_availability("pi-a")} or \
                    out == {config, HA.coordinator_state, HA.device_availability("pi-a")}, out
                _drain(coordinator, 0.5)  # its own messages
                for topic in (HA.command, "homeassistant/status", TOPICS.downlink("pi-a"), "edgefl/home/up/ha"):
                    ha.publish(topic, b"online" if "status" in topic else b"pause")
                came_in = {t for t, _ in _drain(coordinator, 1.0)}
                assert came_in == {HA.command, "homeassistant/status"}, came_in
            finally:
                ha.close()
                coordinator.close()
