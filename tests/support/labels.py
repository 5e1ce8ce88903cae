"""What the round loop does with a device's label when it (re-)registers, for tests that drive a
method or a `LevelAssigner` without one: the device's own label, and the labels of the others that
the assignment changed (`Strategy.relabelled`, `LevelAssigner.take_relabelled`)."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from coordinator.core.device_record import DeviceRecord

__all__ = ["assign", "observe", "reassign"]


def _write(relabelled: dict[str, str], records: Iterable[DeviceRecord]) -> None:
    for record in records:
        if record.device_id in relabelled:
            record.label = relabelled[record.device_id]


def assign(strategy: Any, record: DeviceRecord, records: Iterable[DeviceRecord]) -> str:
    """``record`` registers with ``strategy``: its label, then the others' that changed."""
    record.label = strategy.assign(record)
    _write(strategy.relabelled(), records)
    return record.label


def reassign(strategy: Any, record: DeviceRecord, records: Iterable[DeviceRecord]) -> str:
    """``record`` measured itself again: its label, then the others' that changed."""
    record.label = strategy.reassign(record)
    _write(strategy.relabelled(), records)
    return record.label


def observe(assigner: Any, record: DeviceRecord, records: Iterable[DeviceRecord]) -> str:
    """``record`` (re-)registers with a `LevelAssigner`: its level, then the others' that changed."""
    record.label = assigner.observe(record)
    _write(assigner.take_relabelled(), records)
    return record.label
