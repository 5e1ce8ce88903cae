"""Labels from the home's own events (`[labels]`): a plug's on/off, Home Assistant's
`mqtt_statestream` of an input_select, dated by the message, by `last_changed` or by arrival — never
by the arrival of a retained state; windows that straddle a change dropped; floods rate-limited."""

from __future__ import annotations

import json

import pytest

from edge_sdk.serving.home_labels import HomeLabels, LabelsConfig, labels_from_toml

CLASSES = ("idle", "kettle")


class Clock:
    def __init__(self, now: float = 1000.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


def plug(state: str, **more) -> bytes:
    return json.dumps({"state": state, "power": 3.0, "linkquality": 90, **more}).encode()


def test_a_plugs_on_and_off_label_the_windows_within_them() -> None:
    clock = Clock()
    labels = HomeLabels(LabelsConfig("zigbee2mqtt/Kettle plug", "state", classes={"ON": "kettle", "OFF": "idle"}),
                        clock)
    labels.on_state(plug("OFF"), retained=False, classes=CLASSES)
    clock.now = 1100.0
    labels.on_state(plug("ON"), retained=False, classes=CLASSES)
    labels.on_state(plug("ON", linkquality=80), retained=False, classes=CLASSES)  # whole state re-sent: no change
    clock.now = 1200.0
    labels.on_state(plug("OFF"), retained=False, classes=CLASSES)
    assert labels.label_for(1010.0, 1090.0) == "idle"
    assert labels.label_for(1100.0, 1190.0) == "kettle"
    assert labels.label_for(1150.0, 1250.0) is None  # straddles the switch off
    assert labels.label_for(1210.0, 1300.0) == "idle"
    assert labels.label_for(900.0, 990.0) is None  # before any state: unknown
    counts = labels.counts
    assert (counts.changes, counts.repeats, counts.labelled, counts.straddled, counts.unlabelled) == (3, 1, 3, 1, 1)


def test_a_retained_state_is_known_from_its_arrival_and_last_changed_dates_it() -> None:
    clock = Clock(5000.0)
    config = LabelsConfig("homeassistant/input_select/appliance/state",
                          time_topic="homeassistant/input_select/appliance/last_changed")
    labels = HomeLabels(config, clock)
    labels.on_state(b"kettle", retained=True, classes=CLASSES)  # set an hour ago? not known: from now on
    assert labels.label_for(4900.0, 4990.0) is None and labels.label_for(5000.0, 5050.0) == "kettle"
    labels.on_time(b"1970-01-01T01:00:00+00:00")  # statestream's last_changed: it changed at 3600
    assert labels.label_for(4000.0, 4990.0) == "kettle"
    clock.now = 6000.0
    labels.on_state(b"kettle", retained=False, classes=CLASSES)  # an attribute-only update repeats the state
    labels.on_time(b"1970-01-01T01:00:00+00:00")
    assert labels.label_for(4000.0, 5990.0) == "kettle"
    labels.on_state(b"unavailable", retained=False, classes=CLASSES)
    assert labels.label_for(6000.0, 6100.0) is None and labels.counts.no_state == 1
    labels.on_state(b"oven", retained=False, classes=CLASSES)
    assert labels.label_for(6000.0, 6100.0) is None and labels.counts.names == {"oven": 1}


def test_a_message_time_dates_a_live_change_but_not_a_retained_one() -> None:
    t = 1_764_000_000.0
    clock = Clock(t + 2000)
    labels = HomeLabels(LabelsConfig("zigbee2mqtt/Kettle plug", "state", "last_seen", classes={"ON": "kettle"}), clock)
    ms = lambda s: int((t + s) * 1000)  # noqa: E731  zigbee2mqtt's last_seen in epoch milliseconds
    labels.on_state(plug("ON", last_seen=ms(1500)), retained=True, classes=CLASSES)  # its last message, not the change
    assert labels.label_for(t + 1600, t + 1900) is None and labels.label_for(t + 2000, t + 2100) == "kettle"
    clock.now = t + 2200
    labels.on_state(plug("OFF", last_seen=ms(2150)), retained=False, classes=CLASSES)  # OFF maps to no class
    assert labels.label_for(t + 2000, t + 2140) == "kettle" and labels.label_for(t + 2000, t + 2160) is None
    assert labels.counts.not_a_class == 1 and labels.counts.straddled == 1


def test_a_label_flood_is_rate_limited_and_leaves_the_label_unknown() -> None:
    clock = Clock()
    labels = HomeLabels(LabelsConfig("home/appliance", max_changes_per_minute=2), clock)
    for i in range(10):
        clock.now += 0.01
        labels.on_state(CLASSES[i % 2].encode(), retained=False, classes=CLASSES)
    assert labels.counts.rate_limited == 8 and labels.current is None
    assert labels.label_for(clock.now + 1, clock.now + 2) is None
    labels.on_state(b"not json", retained=False)  # a plain state is any text: "not json" is a state, not a class
    assert labels.counts.bad == 0


def test_labels_toml_errors_are_one_line() -> None:
    assert labels_from_toml({}) is None
    config = labels_from_toml({"labels": {"topic": "zigbee2mqtt/Kettle plug", "field": "state",
                                          "map": {"ON": "kettle", "OFF": "idle"}}})
    assert config is not None and config.classes == {"ON": "kettle", "OFF": "idle"}
    with pytest.raises(ValueError, match=r"^\[labels\] topic is required"):
        labels_from_toml({"labels": {"field": "state"}})
    with pytest.raises(ValueError, match=r"^\[labels\] topic 'zigbee2mqtt/#' must be one exact topic"):
        labels_from_toml({"labels": {"topic": "zigbee2mqtt/#"}})
    with pytest.raises(ValueError, match=r"^\[labels\] map must map states to class names"):
        labels_from_toml({"labels": {"topic": "a", "map": {"ON": 1}}})
    with pytest.raises(ValueError, match=r"^\[labels\]: unknown keys \['maps'\]"):
        labels_from_toml({"labels": {"topic": "a", "maps": {}}})


def test_labels_need_serve() -> None:
    from edge_sdk.serving.serve_command import serving_tables

    with pytest.raises(ValueError, match=r"^\[labels\] needs a \[serve\] table"):
        serving_tables({"labels": {"topic": "a"}})
    serve, labels = serving_tables({"serve": {"inputs": [{"topic": "a"}], "length": 24}, "labels": {"topic": "a"}})
    assert serve is not None and serve.length == 24 and labels is not None and labels.topic == "a"


def test_what_a_hostile_or_broken_label_topic_sends_is_counted_never_raised() -> None:
    clock = Clock()
    labels = HomeLabels(LabelsConfig("zigbee2mqtt/Kettle plug", "state", "last_seen", "ha/last_changed"), clock)
    for payload in (b"\xff\xfe", b"not json", b'{"power": 3}', b'{"state": {"nested": 1}}', b'{"state": null}',
                    b'{"state": "ON", "last_seen": "yesterday"}', b"[1, 2]"):
        labels.on_state(payload, retained=False)
    assert labels.counts.bad == 7 and labels.current is None
    long_state = {"state": "x" * 10_000, "last_seen": 999_000}  # no class name is that long
    labels.on_state(json.dumps(long_state).encode(), retained=False)
    assert labels.counts.not_a_class == 1 and labels.current is None and len(labels.counts.names) == 1
    labels.on_time(b"not a time")
    labels.on_time(b"\xff")
    assert labels.counts.bad == 9
