"""Readings in the conventions home devices publish in; a bad one is a one-line BadReading."""

from __future__ import annotations

import json
from datetime import datetime, timezone

import pytest

from edge_sdk.serving.readings import BadReading, parse_reading


def test_plain_numbers_as_esphome_and_shelly_gen1_send_them() -> None:
    assert parse_reading(b"23.5").value == 23.5 and parse_reading(b" 7\n").value == 7.0
    assert parse_reading(b"23.5").time is None


def test_zigbee2mqtt_tasmota_and_shelly_gen2_json() -> None:
    z2m = {"power": 41.2, "state": "ON", "linkquality": 120, "last_seen": "2026-11-28T17:00:00.000Z"}
    reading = parse_reading(json.dumps(z2m).encode(), "power", "last_seen")
    assert reading.value == 41.2
    assert reading.time == datetime(2026, 11, 28, 17, 0, tzinfo=timezone.utc).timestamp()
    epoch_ms = parse_reading(json.dumps({**z2m, "last_seen": 1795885200000}).encode(), "power", "last_seen")
    assert epoch_ms.time == 1795885200.0  # zigbee2mqtt's last_seen "epoch": milliseconds
    tasmota = {"Time": "2026-11-28T18:00:00", "ENERGY": {"Power": 12, "Voltage": 230}}
    local = parse_reading(json.dumps(tasmota).encode(), "ENERGY.Power", "Time")
    assert local.value == 12.0 and local.time == datetime(2026, 11, 28, 18, 0).astimezone().timestamp()
    assert parse_reading(b'{"id": 0, "apower": 1500.5, "voltage": 231}', "apower").value == 1500.5


@pytest.mark.parametrize("payload, field, why", [
    (b"nan", None, "the payload is nan"),
    (b"inf", None, "the payload is inf"),
    (b"on", None, "the payload is not a number"),
    (b"\xff\xfe", None, "not UTF-8"),
    (b'{"state": "ON"}', "power", "no field 'power'"),
    (b'{"power": null}', "power", "field 'power' is not a number"),
    (b'{"power": true}', "power", "field 'power' is not a number"),
    (b"{not json", "power", "not JSON"),
    (b'{"ENERGY": 5}', "ENERGY.Power", "no field 'ENERGY.Power'"),
])
def test_a_bad_reading_says_why(payload: bytes, field: str | None, why: str) -> None:
    with pytest.raises(BadReading, match=why.replace("(", r"\(")):
        parse_reading(payload, field)
