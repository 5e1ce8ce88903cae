"""Labels from the home's own events: ``[labels]`` in a client TOML names a topic whose state is the
class in effect, and every window the device serves gets it (docs/serving.md "Labels").

```toml
[labels]
topic = "zigbee2mqtt/Kettle plug"   # or "homeassistant/input_select/appliance/state" (mqtt_statestream)
field = "state"                     # a dotted JSON path (absent: the payload is the state itself)
# time_field = "last_seen"          # the change's time in the message (zigbee2mqtt with last_seen on)
# time_topic = "homeassistant/input_select/appliance/last_changed"   # statestream's publish_timestamps
map = { ON = "kettle", OFF = "idle" }   # state -> class (absent: the state is the class name)
max_changes_per_minute = 30         # more is a flood: the label is unknown until the next change
```

A change is dated by the message's time, by ``time_topic`` (Home Assistant's ``last_changed`` dates
the change, re-dating the state just received) or by its arrival — but never by the arrival of a
retained message: that state is only known from then on. The same state again (zigbee2mqtt's whole
state re-sent, statestream's attribute-only updates) is no change. ``unavailable``, ``unknown`` and
an empty state are no class: the label is unknown until the next state. A state that maps to no class
of the task is skipped and counted. A window is labelled only when one label was in effect from its
first point to its last: windows that straddle a change are dropped (counted)."""

from __future__ import annotations

import json
import time
from collections import deque
from dataclasses import dataclass, field
from typing import Any, Callable

from edge_sdk.config import section, setting
from edge_sdk.data.preprocessing import MAX_CLASS_NAME
from edge_sdk.networking.token_bucket import TokenBucket
from edge_sdk.serving.readings import BadReading, parse_time, value_at
from edge_sdk.serving.serve_config import check_topic, in_table

__all__ = ["HomeLabels", "LabelsConfig", "labels_from_toml"]

_KEYS = {"topic", "field", "time_field", "time_topic", "map", "max_changes_per_minute"}
#: Home Assistant's states that name no class
NO_STATE = frozenset({"unavailable", "unknown", "none", "null", ""})
#: label changes remembered (windows are at most this many changes long)
KEEP_CHANGES = 256


@dataclass(frozen=True)
class LabelsConfig:
    topic: str
    field: str | None = None
    time_field: str | None = None
    time_topic: str | None = None
    classes: dict[str, str] | None = None  # `map`: state -> class name
    max_changes_per_minute: float = 30.0

    def __post_init__(self) -> None:
        check_topic(self.topic)
        check_topic(self.time_topic, "time_topic")
        if self.time_field is not None and self.field is None:
            raise ValueError("time_field needs field (a JSON message)")
        if not 0 < self.max_changes_per_minute < float("inf"):
            raise ValueError(f"max_changes_per_minute must be a number > 0, got {self.max_changes_per_minute!r}")


def labels_from_toml(config: dict[str, Any]) -> LabelsConfig | None:
    """The ``[labels]`` table (None without one); a bad value is one line naming the key."""
    if "labels" not in config:
        return None
    table = section(config, "labels", _KEYS)
    where = "[labels]"
    try:
        mapping = setting(table, "map", dict, None, where)
        if mapping is not None and not all(isinstance(v, str) and v for v in mapping.values()):
            raise ValueError("map must map states to class names, e.g. map = { ON = \"kettle\", OFF = \"idle\" }")
        topic = setting(table, "topic", str, None, where)
        if topic is None:
            raise ValueError("topic is required (the topic whose state names the class in effect)")
        return LabelsConfig(topic, setting(table, "field", str, None, where),
                            setting(table, "time_field", str, None, where),
                            setting(table, "time_topic", str, None, where), mapping,
                            setting(table, "max_changes_per_minute", float, 30.0, where))
    except ValueError as exc:
        raise in_table(where, exc) from None


@dataclass
class LabelCounts:
    changes: int = 0
    repeats: int = 0
    no_state: int = 0  # unavailable, unknown, empty
    not_a_class: int = 0
    bad: int = 0  # not text, no field
    rate_limited: int = 0
    labelled: int = 0  # windows labelled
    straddled: int = 0  # windows dropped: the label changed within them
    unlabelled: int = 0  # windows with no label in effect
    names: dict[str, int] = field(default_factory=dict)  # states that are no class, by name (at most 20)


class HomeLabels:
    """The label in effect over time, from ``[labels]`` messages; `label_for` labels a window."""

    def __init__(self, config: LabelsConfig, clock: Callable[[], float] = time.time) -> None:
        self.config, self.clock = config, clock
        self.counts = LabelCounts()
        self.bucket = TokenBucket(config.max_changes_per_minute / 60.0, max(1, int(config.max_changes_per_minute)),
                                  clock=time.monotonic)
        self._state: str | None = None  # the last state value seen (before the map)
        #: (since, class name or None: unknown), oldest first; since: unix seconds it is known to hold from
        self._changes: deque[tuple[float, str | None]] = deque(maxlen=KEEP_CHANGES)

    @property
    def current(self) -> str | None:
        return self._changes[-1][1] if self._changes else None

    def on_state(self, payload: bytes, retained: bool, classes: tuple[str, ...] = ()) -> None:
        """A message on the label topic; ``classes``: the task's (empty: not known yet, not checked)."""
        try:
            state, when = self._parse(payload)
        except BadReading:
            self.counts.bad += 1
            return
        if state == self._state:
            self.counts.repeats += 1
            return
        self._state = state
        now = self.clock()
        # a retained state held at some time before now, its change undated (last_seen is the last message's time)
        since = now if when is None or retained else min(when, now)
        if not self.bucket.take():
            self.counts.rate_limited += 1
            self._change(since, None)
            return
        label = self._class(state, classes)
        self._change(since, label)

    def on_time(self, payload: bytes) -> None:
        """``time_topic`` (statestream's ``last_changed``): when the state just received changed."""
        try:
            text = payload.decode("utf-8").strip()
            when = parse_time(json.loads(text) if text.startswith('"') else text)
        except (UnicodeDecodeError, ValueError):
            self.counts.bad += 1
            return
        if not self._changes:
            return
        floor = self._changes[-2][0] if len(self._changes) > 1 else float("-inf")
        self._changes[-1] = (min(max(when, floor), self.clock()), self._changes[-1][1])

    def label_for(self, start: float, end: float) -> str | None:
        """The class in effect from ``start`` to ``end`` (None: unknown, or it changed: counted)."""
        label, known = None, False
        for since, name in self._changes:
            if since <= start:
                label, known = name, True
            elif since <= end:
                self.counts.straddled += 1
                return None
        if not known or label is None:
            self.counts.unlabelled += 1
            return None
        self.counts.labelled += 1
        return label

    def _parse(self, payload: bytes) -> tuple[str, float | None]:
        try:
            text = payload.decode("utf-8").strip()
        except UnicodeDecodeError:
            raise BadReading("not UTF-8 text") from None
        if self.config.field is None:
            return text, None
        try:
            obj = json.loads(text)
        except ValueError:
            raise BadReading("not JSON") from None
        value = _field(obj, self.config.field)
        when = parse_time(_field(obj, self.config.time_field)) if self.config.time_field else None
        return (json.dumps(value) if isinstance(value, bool) else str(value)).strip(), when

    def _class(self, state: str, classes: tuple[str, ...]) -> str | None:
        if state.lower() in NO_STATE:
            self.counts.no_state += 1
            return None
        name = self.config.classes.get(state) if self.config.classes is not None else state
        # before a model names the classes, a state no class name could be (too long) is not kept either
        if name is None or classes and name not in classes or len(name) > MAX_CLASS_NAME:
            self.counts.not_a_class += 1
            if len(self.counts.names) < 20 or state in self.counts.names:
                self.counts.names[state[:40]] = self.counts.names.get(state[:40], 0) + 1
            return None
        self.counts.changes += 1
        return name

    def _change(self, since: float, label: str | None) -> None:
        if self._changes and since < self._changes[-1][0]:  # dated before the change it follows: from then
            since = self._changes[-1][0]
        self._changes.append((since, label))


def _field(obj: Any, path: str) -> Any:
    obj = value_at(obj, path)
    if isinstance(obj, (dict, list)) or obj is None:
        raise BadReading(f"field {path!r} is not a state")
    return obj
