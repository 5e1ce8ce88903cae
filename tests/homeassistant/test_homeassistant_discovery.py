"""Home Assistant's discovery payloads and the coordinator's bridge without a broker (issue 41):
payloads follow Home Assistant's rules (tests/support/homeassistant_rules.py, transcribed from its source),
ids map to Home Assistant's uniquely and stably, device strings are bounded; and, over a real broker,
the bridge publishes retained, answers a birth message (at most every REPUBLISH_EVERY_S), takes only
two words on its command topic and clears a removed device."""

from __future__ import annotations

import json
import logging
import time
import uuid
from collections.abc import Callable, Iterator

import pytest

from coordinator.homeassistant import HomeAssistantBridge, HomeAssistantConfig
from coordinator.homeassistant.discovery import HaTopics, coordinator_config, device_config
from coordinator.homeassistant.names import MAX_TEXT, clean_text, ha_id
from coordinator.core.device_record import DeviceRecord
from coordinator.runtime.fleet import Fleet
from edge_sdk.networking.link import MessageLink
from edge_sdk.profiling import load_profile
from edge_sdk.protocol.topics import Topics
from edge_sdk.networking.transport import MqttTransport, TransportConfig
from tests.support.homeassistant_rules import VALID_ID_RE, validate_device_discovery


class Observer:
    """Home Assistant's side of a real broker: every message under the discovery prefix and the
    job's ha/ topics, retained ones included."""

    def __init__(self, url: str, prefix: str, job: str) -> None:
        self.transport = MqttTransport(TransportConfig(url=url, client_id=f"observer-{uuid.uuid4().hex[:8]}"))
        self.transport.connect()
        self.transport.subscribe(f"{prefix}/#")
        self.transport.subscribe(f"edgefl/{job}/ha/#")
        self.messages: list[tuple[str, bytes, bool]] = []

    def drain(self, seconds: float = 0.5) -> list[tuple[str, bytes, bool]]:
        end = time.monotonic() + seconds
        while (left := end - time.monotonic()) > 0:
            if (msg := self.transport.receive(timeout=left)) is not None:
                self.messages.append((msg.topic, msg.payload, msg.retained))
        return self.messages

    def last(self, topic: str) -> bytes | None:
        return next((p for t, p, _ in reversed(self.messages) if t == topic), None)


@pytest.fixture
def bridged(broker) -> Iterator[Callable[..., tuple[HomeAssistantBridge, Fleet, Observer]]]:
    """``make(devices, checkpoint_dir)``: a bridge attached to a fleet on a real broker (the devices
    registered already), and Home Assistant's view of it, subscribed after the bridge published."""
    opened: list[MqttTransport] = []
    job, prefix = f"ha-{uuid.uuid4().hex[:8]}", f"ha{uuid.uuid4().hex[:8]}"

    def make(devices=("pi-a",), checkpoint_dir=None) -> tuple[HomeAssistantBridge, Fleet, Observer]:
        transport = MqttTransport(TransportConfig(url=broker.url, client_id=f"{job}-coordinator-{len(opened)}"))
        transport.connect()
        opened.append(transport)
        fleet = Fleet(MessageLink(transport), Topics(job=job))
        for name in devices:
            fleet.devices[name] = DeviceRecord(name, load_profile("raspberry-pi-4b"), 100, label="p0.5")
        bridge = HomeAssistantBridge(HomeAssistantConfig(enabled=True, prefix=prefix, birth_topic=f"{prefix}/status"),
                                     job, "flanc", rounds=5, checkpoint_dir=checkpoint_dir)
        bridge.attach(fleet)
        assert transport.wait_published(5)
        observer = Observer(broker.url, prefix, job)
        opened.append(observer.transport)
        observer.drain()
        return bridge, fleet, observer
    yield make
    for transport in opened:
        transport.close()


def _send(fleet: Fleet, observer: Observer, topic: str, payload: bytes) -> None:
    """Home Assistant publishes ``payload`` on ``topic``; the coordinator handles it."""
    observer.transport.publish(topic, payload, qos=1, retain=False)
    fleet.pump(0.5)


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


def test_the_job_and_its_devices_are_published_retained_on_attach(bridged, monkeypatch):
    bridge, fleet, observer = bridged(devices=("pi-a", "pi-b"))
    topics = bridge.topics
    assert observer.messages and all(retain for _, _, retain in observer.messages)  # all kept by the broker
    for device in ("pi-a", "pi-b"):
        config = topics.discovery(topics.device_node(device))
        assert validate_device_discovery(config, json.loads(observer.last(config)), prefix=topics.prefix) == []
        state = json.loads(observer.last(topics.device_state(device)))
        assert state["online"] is True and state["label"] == "p0.5" and state["last_round"] is None
    assert json.loads(observer.last(topics.coordinator_state))["state"] == "idle"
    # Home Assistant restarts: everything again (another payload on the birth topic: nothing); a flood
    # of birth messages is answered at most every REPUBLISH_EVERY_S
    birth = bridge.config.birth_topic
    monkeypatch.setattr("coordinator.homeassistant.bridge.REPUBLISH_EVERY_S", 3.0)
    time.sleep(3.0)  # since attach published

    def published() -> int:  # what the coordinator published (the observer hears its own birth messages too)
        return sum(1 for topic, _, _ in observer.drain() if topic != birth)
    count = published()
    _send(fleet, observer, birth, b"offline")
    assert published() == count
    _send(fleet, observer, birth, b"online")
    once = published() - count
    assert once >= 1 + 2 * 3  # the job's config, and each device's config, availability and state
    for _ in range(20):
        observer.transport.publish(birth, b"online")
    fleet.pump(0.5)
    assert published() - count == once  # not yet
    time.sleep(2.0)
    fleet.pump(0.5)  # the flood's one re-publish, when its time has come
    assert published() - count == 2 * once


def test_only_pause_and_resume_are_taken_and_a_pause_is_kept(bridged, tmp_path, caplog):
    bridge, fleet, observer = bridged(checkpoint_dir=str(tmp_path))
    command = bridge.topics.command
    for junk in (b"reboot", b"\xff\xfe", b"pause; rm -rf /", b""):
        _send(fleet, observer, command, junk)
    assert not bridge.paused
    assert sum("ignored" in r.getMessage() for r in caplog.records) == 1  # logged once
    _send(fleet, observer, command, b"pause")
    assert bridge.paused and (tmp_path / "paused").exists()
    observer.drain()
    assert json.loads(observer.last(bridge.topics.coordinator_state))["paused"] is True
    restarted, _, _ = bridged(checkpoint_dir=str(tmp_path))
    assert restarted.paused and restarted.job_state == "paused"  # a restarted coordinator stays paused
    _send(fleet, observer, command, b"RESUME\n")
    assert not bridge.paused and not (tmp_path / "paused").exists()


def test_a_removed_device_is_cleared_and_not_published_again(bridged):
    bridge, fleet, observer = bridged(devices=("pi-a", "pi-b"))
    fleet.remove("pi-b")
    observer.drain()
    topics = bridge.topics
    for topic in (topics.discovery(topics.device_node("pi-b")), topics.device_state("pi-b"),
                  topics.device_availability("pi-b")):
        assert observer.last(topic) == b""
    assert fleet.online() == ["pi-a"]
    count = len(observer.messages)
    bridge.device_changed(fleet.devices["pi-b"])  # e.g. a status from it: nothing more about it
    assert len(observer.drain()) == count


def _render(template: str, state: dict) -> str:
    """A value or attributes template as Home Assistant renders it (Jinja, sandboxed)."""
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    return ImmutableSandboxedEnvironment().from_string(template).render(value_json=state)


def test_a_federated_figure_carries_its_weight_and_a_thin_one_reads_unknown(bridged):
    from coordinator.aggregate.evaluation import NOT_ENOUGH, fold_evaluations
    from coordinator.runtime.report import RoundRecord
    from edge_sdk.protocol.messages import Evaluation

    bridge, fleet, observer = bridged(devices=("pi-a", "pi-b"))
    topics = bridge.topics
    config = coordinator_config(topics, name="n", method="flanc", version="1", federated_labels=("p0.5", "p1.0"))
    sensor = config["cmps"]["federated_accuracy_" + ha_id("p0.5")]
    before = json.loads(observer.last(topics.coordinator_state))
    assert _render(sensor["value_template"], before) == "None"  # unknown, no template warning, before any figure
    assert json.loads(_render(sensor["json_attributes_template"], before)) == {}
    folded = fold_evaluations({"pi-a": Evaluation("p0.5", 30, 27, 1.0), "pi-b": Evaluation("p1.0", 3, 3, 0.1)})
    bridge.round_done(RoundRecord(round=0, accuracy={}, loss=None, bytes_down=1, bytes_up=1, seconds=1.0,
                                  host_seconds=0.1, participants=["pi-a", "pi-b"], aggregated=True,
                                  federated_accuracy=folded.accuracy, evaluation=folded.summary(20)))
    fleet.pump(0.5)
    observer.drain()
    state = json.loads(observer.last(topics.coordinator_state))
    assert _render(sensor["value_template"], state) == "90.0"
    weight = json.loads(_render(sensor["json_attributes_template"], state))
    assert weight["samples"] == 30 and weight["devices"] == 1 and weight["note"] == ""
    assert weight["interval_low"] < 90.0 < weight["interval_high"]
    thin = config["cmps"]["federated_accuracy_" + ha_id("p1.0")]
    assert _render(thin["value_template"], state) == "None"  # 1.000 from 3 samples is not shown
    assert NOT_ENOUGH in json.loads(_render(thin["json_attributes_template"], state))["note"]


def test_entity_ids_come_from_unique_ids_not_from_the_order_of_discovery():
    """``pi.a`` and ``pi_a`` were two devices whose entities took each other's ids by discovery
    order; each component now names its entity id (``default_entity_id``, HA 2025.10; ``object_id``
    before), valid, distinct and the same on every run."""
    import re

    topics = HaTopics("home")
    seen: dict[str, str] = {}
    for device in ("pi-a", "pi_a", "pi.a", "PI-A"):
        for component in device_config(topics, device, model="m", sdk_version="1", version="1")["cmps"].values():
            entity = component["default_entity_id"]
            assert re.fullmatch(r"[a-z_]+\.[a-z0-9_]+", entity) and entity == f"{component['p']}.{component['object_id']}"
            assert entity not in seen, (entity, seen.get(entity), device)
            seen[entity] = device
    config = coordinator_config(topics, name="n", method="fedavg", version="1", accuracy_labels=("global",))
    assert all("default_entity_id" in c for c in config["cmps"].values())
    again = device_config(topics, "pi.a", model="m", sdk_version="1", version="1")["cmps"]
    assert {c["default_entity_id"] for c in again.values()} <= set(seen)


def test_a_resumed_job_keeps_its_counters_and_presence_is_said_as_devices_come_and_go(bridged):
    from coordinator.runtime.report import RoundRecord

    bridge, fleet, observer = bridged(devices=("pi-a", "pi-b"))
    topics = bridge.topics
    finished = [RoundRecord(round=r, accuracy={"p0.5": 0.5 + r / 10}, loss=1.0, bytes_down=1000, bytes_up=500,
                            seconds=1.0, host_seconds=0.1, participants=["pi-a"], aggregated=True, version=r + 1,
                            published_version=r) for r in range(3)]
    bridge.restore(finished)  # what a restarted coordinator's checkpoint holds
    fleet.pump(0.3)
    observer.drain()
    state = json.loads(observer.last(topics.coordinator_state))
    assert state["round"] == 3 and state["bytes_down"] == 3000 and state["bytes_up"] == 1500
    assert state["accuracy"]["p0.5"] == 70.0 and state["version"] == 3 and state["published_version"] == 2
    assert state["devices_online"] == 2
    from edge_sdk.protocol.messages import Envelope, Status, encode_envelope

    # pi-b drops (its last will): the job's count follows, not only when the job's state changes
    fleet.start()  # it hears the devices' statuses
    time.sleep(0.3)
    _send(fleet, observer, fleet.topics.status("pi-b"), encode_envelope(Envelope.of(Status("offline", "gone"), "pi-b")))
    time.sleep(2.2)  # PRESENCE_EVERY_S: a burst of changes is said once, the last one by the fleet's ticker
    fleet.pump(0.3)
    observer.drain()
    assert json.loads(observer.last(topics.coordinator_state))["devices_online"] == 1


def test_the_health_sensor_reads_the_coordinators_writes(bridged):
    bridge, fleet, observer = bridged()
    sensor = coordinator_config(bridge.topics, name="n", method="flanc", version="1")["cmps"]["health"]
    assert sensor["device_class"] == "enum" and sensor["options"] == ["ok", "disk_full", "write_failed"]
    state = json.loads(observer.last(bridge.topics.coordinator_state))
    assert _render(sensor["value_template"], state) == "ok"
    bridge.set_health({"state": "disk_full", "problem": "the checkpoint: No space left on device", "since": 12.5})
    fleet.pump(0.5)
    observer.drain()
    state = json.loads(observer.last(bridge.topics.coordinator_state))
    assert _render(sensor["value_template"], state) == "disk_full"
    assert json.loads(_render(sensor["json_attributes_template"], state)) == {
        "problem": "the checkpoint: No space left on device", "since": 12.5}


def test_a_serving_device_has_its_prediction_entities_and_they_follow_the_device_alone():
    from coordinator.homeassistant.discovery import HaTopics, device_config
    from edge_sdk.protocol.topics import Topics

    topics, classes = HaTopics("home"), ("idle", "kettle", "toaster")
    config = device_config(topics, "pi-a", model="m", sdk_version="0.5", version="0.5", serving=classes)
    assert validate_device_discovery(topics.discovery(topics.device_node("pi-a")), config) == []
    plain = device_config(topics, "pi-b", model="m", sdk_version="0.5", version="0.5")
    assert "prediction" not in plain["cmps"]  # a device that does not serve has none
    cmps, edgefl = config["cmps"], Topics(job="home")
    prediction = {"class": "kettle", "index": 1, "probability": 0.8734, "start": "2026-11-28T17:00:00.000+00:00",
                  "end": "2026-11-28T17:02:00.000+00:00", "version": 7, "model": "global",
                  "top": [{"class": "kettle", "probability": 0.8734}]}
    assert cmps["prediction"]["options"] == list(classes) and cmps["prediction"]["state_topic"] == edgefl.prediction("pi-a")
    assert _render(cmps["prediction"]["value_template"], prediction) == "kettle"
    assert _render(cmps["prediction"]["value_template"], {**prediction, "class": "oven"}) == "None"  # never off the list
    assert _render(cmps["confidence"]["value_template"], prediction) == "87.3"
    assert _render(cmps["last_prediction"]["value_template"], prediction) == prediction["end"]
    for key in ("prediction", "confidence", "last_prediction", "correct"):  # not the coordinator's availability
        assert cmps[key]["availability"] == [{"topic": edgefl.serving_availability("pi-a")}]
    select = cmps["correct"]
    assert select["command_topic"] == edgefl.correction("pi-a") and select["state_topic"] == edgefl.correction_state("pi-a")
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    entity = f"sensor.{cmps['prediction']['object_id']}"
    attributes = {entity: {"end": prediction["end"]}}
    sent = ImmutableSandboxedEnvironment().from_string(select["command_template"]).render(
        value="toaster", state_attr=lambda e, a: attributes.get(e, {}).get(a))
    assert json.loads(sent) == {"class": "toaster", "end": prediction["end"]}  # tied to that one prediction
