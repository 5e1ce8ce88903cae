"""``[serve]`` in a client TOML: which MQTT topics a device reads as the channels of the windows
its model classifies, and how (docs/serving.md).

```toml
[serve]
inputs = [{ topic = "zigbee2mqtt/Kitchen plug", field = "power", time_field = "last_seen" }]
period_s = 5         # windows by time: a point every 5 s, the last value held (absent: by count)
# length = 24        # points per window (default: the model's input length)
# stride = 12        # a window every 12 points (default: length, no overlap)
max_gap_s = 300      # a longer silence starts a new window
max_per_s = 1        # at most one prediction a second
log_lines = 10000    # the rolling log in state_dir/predictions.jsonl
store_rows = 10000   # labelled windows kept in state_dir/labels.sqlite (corrections, [labels])
rows = false         # also predict new rows of the [data] source (csv, sqlite) whose label is empty
# username = "pi-kitchen.serve"   # the serving connection's own MQTT user (default: [broker]'s)
# password_file = "/etc/edgefl/serve.password"
```
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from edge_sdk.config import section, setting

__all__ = ["ServeConfig", "ServeInput", "check_topic", "in_table", "serve_from_toml"]

_KEYS = {"inputs", "period_s", "length", "stride", "max_gap_s", "max_per_s", "log_lines", "threads", "store_rows",
         "rows", "username", "password_file"}
_INPUT_KEYS = {"topic", "field", "time_field"}


def check_topic(topic: str | None, name: str = "topic") -> None:
    """One exact MQTT topic a device reads (a wildcard would expose every sensor of the home)."""
    if topic is not None and (not topic or "+" in topic or "#" in topic or "\0" in topic):
        raise ValueError(f"{name} {topic!r} must be one exact topic (no + or # wildcards)")


def in_table(where: str, exc: ValueError) -> ValueError:
    """``exc`` as one line naming the table ``where`` (once)."""
    message = str(exc)
    return ValueError(message if message.startswith(where) else f"{where} {message}")


@dataclass(frozen=True)
class ServeInput:
    """One channel: an MQTT topic, and where its value (and time) is in a message."""

    topic: str
    field: str | None = None  # a dotted JSON path; None: the payload is a plain number
    time_field: str | None = None  # a dotted JSON path to the reading's time; None: its arrival

    def __post_init__(self) -> None:
        check_topic(self.topic)
        if self.time_field is not None and self.field is None:
            raise ValueError(f"topic {self.topic!r}: time_field needs field (a JSON message)")


@dataclass(frozen=True)
class ServeConfig:
    inputs: tuple[ServeInput, ...]
    period_s: float | None = None
    length: int | None = None
    stride: int | None = None
    max_gap_s: float = 300.0
    max_per_s: float = 1.0
    log_lines: int = 10_000
    threads: int = 1
    store_rows: int = 10_000
    rows: bool = False
    #: the serving connection's own MQTT user (a broker that takes the username as client id holds
    #: one connection a user: add-device.sh --reads makes NAME.serve); None: [broker]'s
    username: str | None = None
    password_file: str | None = None

    def __post_init__(self) -> None:
        if not self.inputs and not self.rows:
            raise ValueError("inputs must name at least one topic (or rows = true: the [data] source's rows)")
        if len({i.topic for i in self.inputs}) != len(self.inputs):
            raise ValueError("inputs name a topic twice (one topic, one channel)")
        for name, value in (("period_s", self.period_s), ("max_gap_s", self.max_gap_s), ("max_per_s", self.max_per_s)):
            if value is not None and not 0 < value < float("inf"):
                raise ValueError(f"{name} must be a number > 0, got {value!r}")
        for name, value in (("length", self.length), ("stride", self.stride), ("log_lines", self.log_lines),
                            ("threads", self.threads), ("store_rows", self.store_rows)):
            if value is not None and (type(value) is not int or value < 1):
                raise ValueError(f"{name} must be an integer >= 1, got {value!r}")


def serve_from_toml(config: dict[str, Any]) -> ServeConfig | None:
    """The ``[serve]`` table (None when there is none); errors name the table and the key."""
    if "serve" not in config:
        return None
    table = section(config, "serve", _KEYS)
    where = "[serve]"
    raw = setting(table, "inputs", list, [], where)
    rows = setting(table, "rows", bool, False, where)
    if not raw and not rows:
        raise ValueError(f"{where} inputs must list at least one {{ topic = ... }} (or rows = true)")
    try:
        inputs = []
        for i, item in enumerate(raw):
            if not isinstance(item, dict) or set(item) - _INPUT_KEYS or "topic" not in item:
                raise ValueError(f"inputs[{i}] must be a table of {', '.join(sorted(_INPUT_KEYS))} with topic")
            inputs.append(ServeInput(**{k: setting(item, k, str, None, f"{where} inputs[{i}]") for k in item}))
        return ServeConfig(tuple(inputs), setting(table, "period_s", float, None, where),
                           setting(table, "length", int, None, where), setting(table, "stride", int, None, where),
                           setting(table, "max_gap_s", float, 300.0, where),
                           setting(table, "max_per_s", float, 1.0, where),
                           setting(table, "log_lines", int, 10_000, where), setting(table, "threads", int, 1, where),
                           setting(table, "store_rows", int, 10_000, where), rows,
                           setting(table, "username", str, None, where),
                           setting(table, "password_file", str, None, where))
    except ValueError as exc:
        raise in_table(where, exc) from None
