"""MQTT topic layout of one edgefl job (see docs/protocol.md, "Topics")."""

from __future__ import annotations

import re
from dataclasses import dataclass

__all__ = ["Topics", "ID_PATTERN", "is_valid_id", "validate_id"]

#: Device ids, job names and the topic root: no slashes, no MQTT wildcards, no spaces.
ID_PATTERN = re.compile(r"[A-Za-z0-9_.-]{1,128}")


def is_valid_id(value: object) -> bool:
    """True when ``value`` is a str matching :data:`ID_PATTERN`."""
    return isinstance(value, str) and ID_PATTERN.fullmatch(value) is not None


def validate_id(value: object, what: str = "id") -> str:
    """Return ``value`` or raise ValueError if it is not a valid id."""
    if not is_valid_id(value):
        raise ValueError(f"invalid {what} {value!r}: must match [A-Za-z0-9_.-]{{1,128}}")
    return value  # type: ignore[return-value]


@dataclass(frozen=True)
class Topics:
    """Topic names under ``{root}/{job}/``.

    ``down/{device}``: coordinator -> one device; ``up/{device}``: device -> coordinator;
    ``coord``: coordinator -> all devices; ``status/{device}``: retained online/offline
    presence (also the device's last will).
    """

    job: str = "default"
    root: str = "edgefl"

    def __post_init__(self) -> None:
        validate_id(self.job, "job name")
        validate_id(self.root, "topic root")

    @property
    def prefix(self) -> str:
        return f"{self.root}/{self.job}"

    def downlink(self, device: str) -> str:
        return f"{self.prefix}/down/{validate_id(device, 'device id')}"

    def uplink(self, device: str) -> str:
        return f"{self.prefix}/up/{validate_id(device, 'device id')}"

    def all_uplinks(self) -> str:
        return f"{self.prefix}/up/+"

    def broadcast(self) -> str:
        return f"{self.prefix}/coord"

    def status(self, device: str) -> str:
        return f"{self.prefix}/status/{validate_id(device, 'device id')}"

    def prediction(self, device: str) -> str:
        """The device's latest prediction (retained; docs/serving.md)."""
        return f"{self.prefix}/predict/{validate_id(device, 'device id')}"

    def serving_availability(self, device: str) -> str:
        """``online`` / ``offline`` (retained; the serving connection's birth and last will)."""
        return f"{self.prediction(device)}/available"

    def correction_state(self, device: str) -> str:
        """What Home Assistant's correction select shows: ``None`` once the device took a correction."""
        return f"{self.prediction(device)}/correction"

    def correction(self, device: str) -> str:
        """A person's correction of the device's last prediction (Home Assistant's select)."""
        return f"{self.prefix}/correct/{validate_id(device, 'device id')}"

    def all_status(self) -> str:
        return f"{self.prefix}/status/+"

    def device_from_topic(self, topic: str) -> str | None:
        """Device id of an ``up/`` or ``status/`` topic of this job, else None."""
        if not isinstance(topic, str):
            return None
        parts = topic.split("/")
        if len(parts) != 4 or parts[0] != self.root or parts[1] != self.job:
            return None
        if parts[2] not in ("up", "status") or not is_valid_id(parts[3]):
            return None
        return parts[3]
