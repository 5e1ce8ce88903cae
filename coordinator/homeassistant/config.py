"""`[homeassistant]` of coordinator.toml: whether and where the coordinator publishes the fleet to
Home Assistant."""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from edge_sdk.config import section, setting

__all__ = ["HomeAssistantConfig", "homeassistant_from_toml"]

#: A discovery prefix or birth topic: MQTT topic levels of Home Assistant's id characters, no
#: wildcards (Home Assistant's own default prefix is "homeassistant").
_TOPIC = re.compile(r"[A-Za-z0-9_-]+(/[A-Za-z0-9_-]+)*")
_KEYS = {"enabled", "prefix", "birth_topic", "birth_payload", "name"}


@dataclass(frozen=True)
class HomeAssistantConfig:
    """Home Assistant's MQTT discovery for the job and its devices (off unless ``enabled``)."""

    enabled: bool = False
    #: Home Assistant's discovery prefix (its MQTT integration's setting; "homeassistant" by default)
    prefix: str = "homeassistant"
    #: where Home Assistant says it (re)started: discovery is published again when ``birth_payload``
    #: arrives there (set separately from the prefix in Home Assistant's MQTT options)
    birth_topic: str = "homeassistant/status"
    birth_payload: str = "online"
    #: the coordinator's device name in Home Assistant (default: "edgefl <job>")
    name: str | None = None

    def __post_init__(self) -> None:
        for key in ("prefix", "birth_topic"):
            value = getattr(self, key)
            if not isinstance(value, str) or _TOPIC.fullmatch(value) is None:
                raise ValueError(f"[homeassistant] {key} {value!r} is not a topic of [A-Za-z0-9_-] levels "
                                 f"(no wildcards, no leading or trailing /)")
        if not self.birth_payload or len(self.birth_payload) > 64:
            raise ValueError("[homeassistant] birth_payload must be 1-64 characters")
        if self.name is not None and not 1 <= len(self.name) <= 64:
            raise ValueError("[homeassistant] name must be 1-64 characters")


def homeassistant_from_toml(config: dict[str, Any]) -> HomeAssistantConfig:
    """The `[homeassistant]` table (absent: off); a bad value is a one-line ValueError."""
    table = section(config, "homeassistant", _KEYS)
    where = "[homeassistant]"
    return HomeAssistantConfig(
        enabled=setting(table, "enabled", bool, False, where),
        prefix=setting(table, "prefix", str, "homeassistant", where),
        birth_topic=setting(table, "birth_topic", str, "homeassistant/status", where),
        birth_payload=setting(table, "birth_payload", str, "online", where),
        name=setting(table, "name", str, None, where),
    )
