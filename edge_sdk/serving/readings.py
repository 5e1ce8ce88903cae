"""One sensor reading from an MQTT message, in the conventions home devices publish in:

- a plain number (ESPHome ``<node>/sensor/<name>/state``, Shelly Gen1 ``shellies/<id>/relay/0/power``,
  Home Assistant's ``mqtt_statestream``);
- a JSON object with the value at a dotted ``field`` path (zigbee2mqtt ``zigbee2mqtt/<name>``:
  ``power``; Tasmota ``tele/<topic>/SENSOR``: ``ENERGY.Power``; Shelly Gen2
  ``<id>/status/switch:0``: ``apower``), its time optionally at ``time_field`` (zigbee2mqtt's
  ``last_seen`` when that is on, Tasmota's ``Time``): ISO 8601 or epoch seconds / milliseconds.

A reading that is not a finite number, or lacks its field, is a `BadReading` naming why.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import Any

__all__ = ["BadReading", "Reading", "parse_reading", "parse_time", "value_at"]

#: an epoch time above this is in milliseconds (year 2286 in seconds)
_MS_ABOVE = 1e10


class BadReading(ValueError):
    """A message that holds no usable reading (str: why, e.g. "not a number")."""


@dataclass(frozen=True)
class Reading:
    value: float
    time: float | None  # unix seconds the message says; None: it says none (the arrival time is used)


def value_at(obj: Any, path: str) -> Any:
    """The value at a dotted ``path`` in a JSON object (BadReading: no such field)."""
    for part in path.split("."):
        if not isinstance(obj, dict) or part not in obj:
            raise BadReading(f"no field {path!r}")
        obj = obj[part]
    return obj


def _number(value: Any, what: str) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float, str)):
        raise BadReading(f"{what} is not a number")
    try:
        number = float(value)
    except ValueError:
        raise BadReading(f"{what} is not a number") from None
    if not math.isfinite(number):
        raise BadReading(f"{what} is {number}")
    return number


def parse_time(value: Any) -> float:
    """Unix seconds from ISO 8601 (no zone: local time) or epoch seconds / milliseconds."""
    if isinstance(value, str):
        try:
            stamp = datetime.fromisoformat(value.replace("Z", "+00:00"))
        except ValueError:
            return parse_time(_number(value, "the time"))
        if stamp.tzinfo is None:  # Tasmota's Time is local without an offset
            stamp = stamp.astimezone()
        return stamp.astimezone(timezone.utc).timestamp()
    seconds = _number(value, "the time")
    return seconds / 1000.0 if seconds > _MS_ABOVE else seconds


def parse_reading(payload: bytes, field: str | None = None, time_field: str | None = None) -> Reading:
    """The reading in ``payload`` (``field``: its dotted JSON path; None: the payload is the number)."""
    try:
        text = payload.decode("utf-8").strip()
    except UnicodeDecodeError:
        raise BadReading("not UTF-8 text") from None
    if field is None:
        return Reading(_number(text, "the payload"), None)
    try:
        obj = json.loads(text)
    except ValueError:
        raise BadReading("not JSON") from None
    value = _number(value_at(obj, field), f"field {field!r}")
    when = None
    if time_field is not None:
        when = parse_time(value_at(obj, time_field))
    return Reading(value, when)
