"""Tests of tests/support/homeassistant_rules.py, the hand-transcribed Home Assistant device-discovery rules."""

from __future__ import annotations

import copy
from typing import Any

import pytest

from tests.support.homeassistant_rules import (
    DEVICE_CLASS_STATE_CLASSES,
    DISCOVERY_TOPIC_RE,
    SENSOR_DEVICE_CLASS_NAMES,
    SENSOR_DEVICE_CLASSES,
    VALID_ID_RE,
    discovery_topic_re,
    validate_clear,
    validate_device_discovery,
)

TOPIC = "homeassistant/device/ea334450945afc/config"

#: The device-based discovery example of home-assistant.io source/_integrations/mqtt.markdown
#: (commit 0a314403e71f72c2fa6fdcb51b28d4876b4ab7c2), without the docs' {% raw %} markup.
DOCS_EXAMPLE: dict[str, Any] = {
    "dev": {"ids": "ea334450945afc", "name": "Kitchen", "mf": "Bla electronics", "mdl": "xya", "sw": "1.0",
            "sn": "ea334450945afc", "hw": "1.0rev2"},
    "o": {"name": "bla2mqtt", "sw": "2.1", "url": "https://bla2mqtt.example.com/support"},
    "cmps": {
        "some_unique_component_id1": {"p": "sensor", "device_class": "temperature", "unit_of_measurement": "°C",
                                      "value_template": "{{ value_json.temperature}}", "unique_id": "temp01ae_t"},
        "some_unique_id2": {"p": "sensor", "device_class": "humidity", "unit_of_measurement": "%",
                            "value_template": "{{ value_json.humidity}}", "unique_id": "temp01ae_h"},
    },
    "state_topic": "sensorBedroom/state",
    "qos": 2,
}


def _payload(**components: dict[str, Any]) -> dict[str, Any]:
    payload = copy.deepcopy(DOCS_EXAMPLE)
    payload["cmps"].update(copy.deepcopy(components))
    return payload


def _problems_about(problems: list[str], *words: str) -> list[str]:
    return [p for p in problems if all(w in p for w in words)]


def test_docs_example_is_valid() -> None:
    assert validate_device_discovery(TOPIC, copy.deepcopy(DOCS_EXAMPLE)) == []


def test_long_keys_and_all_four_platforms_are_valid() -> None:
    payload = {
        "device": {"identifiers": ["node1"], "name": "Node 1"},
        "origin": {"name": "edgefl", "sw_version": "0.1"},
        "availability": [{"topic": "edgefl/job/ha/availability"}],
        "components": {
            "sent": {"platform": "sensor", "unique_id": "n1_sent", "state_topic": "edgefl/s",
                     "device_class": "data_size", "unit_of_measurement": "MiB", "state_class": "total_increasing"},
            "round_time": {"platform": "sensor", "unique_id": "n1_rt", "state_topic": "edgefl/s",
                           "device_class": "duration", "unit_of_measurement": "s", "state_class": "measurement"},
            "phase": {"platform": "sensor", "unique_id": "n1_phase", "state_topic": "edgefl/s",
                      "device_class": "enum", "options": ["idle", "training"], "entity_category": "diagnostic"},
            "online": {"platform": "binary_sensor", "unique_id": "n1_on", "state_topic": "edgefl/s",
                       "device_class": "connectivity"},
            "pause": {"platform": "switch", "unique_id": "n1_pause", "command_topic": "edgefl/job/ha/command",
                      "entity_category": "config"},
            "restart": {"platform": "button", "unique_id": "n1_restart", "command_topic": "edgefl/job/ha/command",
                        "device_class": "restart"},
        },
    }
    assert validate_device_discovery("homeassistant/device/node1/config", payload) == []


def test_missing_origin_name() -> None:
    payload = copy.deepcopy(DOCS_EXAMPLE)
    del payload["o"]["name"]
    assert _problems_about(validate_device_discovery(TOPIC, payload), "origin.name")
    del payload["o"]
    assert _problems_about(validate_device_discovery(TOPIC, payload), "origin")


def test_unit_not_allowed_for_data_size() -> None:
    payload = _payload(sent={"p": "sensor", "uniq_id": "sent", "dev_cla": "data_size", "unit_of_meas": "bytes"})
    assert _problems_about(validate_device_discovery(TOPIC, payload), "unit_of_measurement", "'bytes'", "data_size")


def test_invalid_character_in_component_id() -> None:
    payload = _payload(**{"cpu.load": {"p": "sensor", "unique_id": "cpu_load"}})
    assert _problems_about(validate_device_discovery(TOPIC, payload), "components.cpu.load", "'cpu.load'")


def test_duplicated_unique_ids() -> None:
    payload = _payload(again={"p": "sensor", "unique_id": "temp01ae_t"})
    assert _problems_about(validate_device_discovery(TOPIC, payload), "components.again.unique_id", "temp01ae_t")


def test_switch_without_command_topic() -> None:
    payload = _payload(pause={"p": "switch", "unique_id": "pause"})
    assert _problems_about(validate_device_discovery(TOPIC, payload), "components.pause.command_topic", "required")


def test_state_class_on_enum_sensor() -> None:
    payload = _payload(phase={"p": "sensor", "unique_id": "phase", "device_class": "enum",
                              "options": ["idle", "training"], "state_class": "measurement"})
    assert _problems_about(validate_device_discovery(TOPIC, payload), "components.phase", "state_class")


def test_missing_unique_id_and_bad_topics() -> None:
    payload = _payload(x={"p": "sensor", "state_topic": "a/+/b"}, y={"p": "button", "unique_id": "y",
                                                                      "cmd_t": "a/#"})
    problems = validate_device_discovery(TOPIC, payload)
    assert _problems_about(problems, "components.x.unique_id", "required")
    assert _problems_about(problems, "components.y.command_topic", "wildcards")
    assert not _problems_about(problems, "components.x.state_topic")  # a whole-level + is a valid subscription


def test_topic_regex() -> None:
    assert DISCOVERY_TOPIC_RE.match("homeassistant/device/node/obj_1-a/config")["node_id"] == "node"
    assert DISCOVERY_TOPIC_RE.match("homeassistant/device/obj/config")["object_id"] == "obj"
    assert DISCOVERY_TOPIC_RE.match("homeassistant/device/ob.j/config") is None
    assert discovery_topic_re("ha/x").match("ha/x/device/n1/config")["component"] == "device"
    assert VALID_ID_RE.fullmatch("a-b_C9") and not VALID_ID_RE.fullmatch("a b")
    assert _problems_about(validate_device_discovery("homeassistant/sensor/x/config", DOCS_EXAMPLE), "'device'")


def test_clear() -> None:
    assert validate_clear(TOPIC, b"") == []
    assert _problems_about(validate_clear(TOPIC, b"{}"), "not empty")


@pytest.mark.parametrize("device_class", ["data_size", "duration"])
def test_tables_cover_every_class(device_class: str) -> None:
    assert set(DEVICE_CLASS_STATE_CLASSES) == SENSOR_DEVICE_CLASS_NAMES and len(SENSOR_DEVICE_CLASS_NAMES) == 52
    assert DEVICE_CLASS_STATE_CLASSES[device_class] == {"measurement", "total", "total_increasing"}
    assert "B" in SENSOR_DEVICE_CLASSES["data_size"] and "s" in SENSOR_DEVICE_CLASSES["duration"]


def test_a_select_needs_its_options_and_a_command_topic() -> None:
    payload = copy.deepcopy(DOCS_EXAMPLE)
    payload["cmps"]["pick"] = {"p": "select", "unique_id": "n1_pick", "command_topic": "edgefl/job/correct/n1",
                               "state_topic": "edgefl/job/predict/n1/correction", "options": ["a", "b"]}
    assert validate_device_discovery(TOPIC, payload) == []
    payload["cmps"]["pick"].update(options=[], device_class="outlet")
    del payload["cmps"]["pick"]["command_topic"]
    problems = validate_device_discovery(TOPIC, payload)
    assert _problems_about(problems, "pick.options") and _problems_about(problems, "pick.device_class")
    assert _problems_about(problems, "pick.command_topic")
