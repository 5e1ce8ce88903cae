"""Home Assistant's discovery payloads and the coordinator's bridge without a broker (issue 41):
payloads follow Home Assistant's rules (tests/homeassistant_rules.py, transcribed from its source),
ids map to Home Assistant's uniquely and stably, device strings are bounded, and the command topic
takes only its two words."""

from __future__ import annotations

import json
import logging

from coordinator.homeassistant import HomeAssistantBridge, HomeAssistantConfig
from coordinator.homeassistant.discovery import HaTopics, coordinator_config, device_config
from coordinator.homeassistant.names import MAX_TEXT, clean_text, ha_id
from coordinator.runtime.fleet import DeviceRecord, Fleet
from edge_sdk.link import MessageLink
from edge_sdk.profiling import load_profile
from edge_sdk.protocol.topics import Topics
from tests.homeassistant_rules import VALID_ID_RE, validate_device_discovery


class RecordingTransport:
    """What the bridge publishes and subscribes, without a broker."""

    connect_count = 1
    connected = True

    def __init__(self) -> None:
        self.published: list[tuple[str, bytes, bool]] = []
        self.subscribed: list[str] = []

    def publish(self, topic: str, payload: bytes, qos: int = 1, retain: bool = False) -> None:
        self.published.append((topic, payload, retain))

    def subscribe(self, topic: str, qos: int = 1) -> None:
        self.subscribed.append(topic)

    def last(self, topic: str) -> bytes | None:
        return next((p for t, p, _ in reversed(self.published) if t == topic), None)


def _bridge(tmp_path=None, devices=("pi-a",)) -> tuple[HomeAssistantBridge, Fleet, RecordingTransport]:
    transport = RecordingTransport()
    fleet = Fleet(MessageLink(transport), Topics(job="home"))  # type: ignore[arg-type]
    for name in devices:
        fleet.devices[name] = DeviceRecord(name, load_profile("raspberry-pi-4b"), 100, label="p0.5")
    bridge = HomeAssistantBridge(HomeAssistantConfig(enabled=True), "home", "flanc", rounds=5,
                                 checkpoint_dir=str(tmp_path) if tmp_path else None)
    bridge.attach(fleet)
    return bridge, fleet, transport


def test_every_payload_follows_home_assistants_rules():
    topics = HaTopics("home.lab")
    payloads = {topics.discovery(topics.coordinator_node): coordinator_config(
        topics, name="edgefl home", method="flanc", version="0.4.0", accuracy_labels=("p0.25", "p1.0"),
        federated_labels=("p0.25",))}
    for device in ("pi-a", "kitchen.plug", "x" * 128):
        payloads[topics.discovery(topics.device_node(device))] = device_config(
            topics, device, model="raspberry-pi-4b", sdk_version="0.4.0\x00\n" + "9" * 200, version="0.4.0")
    unique_ids = []
    for topic, payload in payloads.items():
        assert validate_device_discovery(topic, json.loads(json.dumps(payload))) == [], topic
        unique_ids += [c["unique_id"] for c in payload["cmps"].values()]
    assert len(unique_ids) == len(set(unique_ids))  # across the job and its devices too
    config = payloads[topics.discovery(topics.coordinator_node)]
    assert {"accuracy_p0_25_" + ha_id("p0.25").rsplit("_", 1)[1], "federated_accuracy_" + ha_id("p0.25")} <= set(
        config["cmps"])
    # a device's entities are its own, whatever job it is in; the job's are the job's
    def ids(job: str) -> list[str]:
        return [c["unique_id"] for c in device_config(HaTopics(job), "pi-a", model="m", sdk_version="1",
                                                      version="1")["cmps"].values()]
    assert ids("a") == ids("b")
    assert HaTopics("a").coordinator_node != HaTopics("b").coordinator_node


def test_ids_map_to_home_assistant_ids_uniquely_and_stably():
    ids = ["pi-a", "pi.a", "pi_a", "a.b.c", "a_b.c", "A" * 128]
    mapped = [ha_id(i) for i in ids]
    assert all(VALID_ID_RE.fullmatch(m) for m in mapped)
    assert len(set(mapped)) == len(ids)
    assert ha_id("pi-a") == "pi-a" and ha_id("pi.a") == ha_id("pi.a")  # unchanged when valid; the same every run
    assert HaTopics("home").device_node("pi.a") != HaTopics("home").device_node("pi_a")
    assert HaTopics("home").device_node("home") != HaTopics("home").coordinator_node


def test_device_strings_are_cut_and_logged_once(caplog):
    caplog.set_level(logging.INFO)
    hostile = "v1\x1b[31m" + "9" * 500
    first, second = clean_text(hostile, "SDK version", "pi-z"), clean_text(hostile, "SDK version", "pi-z")
    assert first == second and len(first) == MAX_TEXT and first.isprintable() and "\x1b" not in first
    assert sum("SDK version of device pi-z cut" in r.getMessage() for r in caplog.records) == 1
    assert clean_text("0.4.0", "SDK version", "pi-y") == "0.4.0"


def test_the_job_and_its_devices_are_published_retained_on_attach():
    bridge, fleet, transport = _bridge(devices=("pi-a", "pi-b"))
    topics = bridge.topics
    assert {"homeassistant/status", topics.command} <= set(transport.subscribed)
    assert all(retain for _, _, retain in transport.published)
    for device in ("pi-a", "pi-b"):
        assert validate_device_discovery(topics.discovery(topics.device_node(device)),
                                         json.loads(transport.last(topics.discovery(topics.device_node(device))))) == []
        state = json.loads(transport.last(topics.device_state(device)))
        assert state["online"] is True and state["label"] == "p0.5" and state["last_round"] is None
    assert json.loads(transport.last(topics.coordinator_state))["state"] == "idle"
    # Home Assistant restarts: everything again; another payload on the birth topic: nothing
    count = len(transport.published)
    fleet.link.plain_topics["homeassistant/status"]("homeassistant/status", b"offline")
    assert len(transport.published) == count
    fleet.link.plain_topics["homeassistant/status"]("homeassistant/status", b"online")
    assert transport.last(topics.discovery(topics.device_node("pi-b"))) is not None
    assert len(transport.published) > count + 4


def test_only_pause_and_resume_are_taken_and_a_pause_is_kept(tmp_path, caplog):
    bridge, fleet, transport = _bridge(tmp_path)
    command = fleet.link.plain_topics[bridge.topics.command]
    for junk in (b"reboot", b"\xff\xfe", b"pause; rm -rf /", b""):
        command(bridge.topics.command, junk)
    assert not bridge.paused
    assert sum("ignored" in r.getMessage() for r in caplog.records) == 1  # logged once
    command(bridge.topics.command, b"pause")
    assert bridge.paused and (tmp_path / "paused").exists()
    assert json.loads(transport.last(bridge.topics.coordinator_state))["paused"] is True
    restarted, _, _ = _bridge(tmp_path)
    assert restarted.paused and restarted.job_state == "paused"  # a restarted coordinator stays paused
    command(bridge.topics.command, b"RESUME\n")
    assert not bridge.paused and not (tmp_path / "paused").exists()


def test_a_removed_device_is_cleared_and_refused(tmp_path):
    bridge, fleet, transport = _bridge(devices=("pi-a", "pi-b"))
    fleet.remove("pi-b")
    topics = bridge.topics
    for topic in (topics.discovery(topics.device_node("pi-b")), topics.device_state("pi-b"),
                  topics.device_availability("pi-b")):
        assert transport.last(topic) == b""
    assert fleet.online() == ["pi-a"]
    count = len(transport.published)
    bridge.device_changed(fleet.devices["pi-b"])  # e.g. a status from it: nothing more about it
    assert len(transport.published) == count
