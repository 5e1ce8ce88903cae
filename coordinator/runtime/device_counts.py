"""devices.csv: per device and round, how many samples it trained on and how many held-out
samples it evaluated — the weight behind every figure, device by device.

Long format (one row per device and round it trained or evaluated in), appended after every round
and never rewritten, so a job of many rounds costs a row per device per round and nothing more;
a resumed job appends to it, a new job's earlier file is kept aside with its report
(:func:`coordinator.runtime.report.keep_previous_report`).
"""

from __future__ import annotations

import csv
from dataclasses import astuple, dataclass, fields
from pathlib import Path

from coordinator.runtime.safe_files import appending

__all__ = ["DeviceCount", "DeviceCountsFile"]


@dataclass(frozen=True)
class DeviceCount:
    """One device in one round: ``trained`` samples its accepted update weighed (None: it sent
    none), ``held_out`` samples it evaluated and ``correct`` of them (None: not evaluated)."""

    round: int  # counted from 1, as everywhere a person reads it
    device: str
    label: str
    trained: int | None = None
    held_out: int | None = None
    correct: int | None = None


COLUMNS = tuple(f.name for f in fields(DeviceCount))


class DeviceCountsFile:
    """Appends each round's :class:`DeviceCount` rows to ``path`` (the header once)."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def append(self, rows: list[DeviceCount]) -> None:
        if not rows:
            return
        self.path.parent.mkdir(parents=True, exist_ok=True)
        new = not self.path.exists() or self.path.stat().st_size == 0
        with appending(self.path) as fh:
            writer = csv.writer(fh)
            if new:
                writer.writerow(COLUMNS)
            writer.writerows(["" if v is None else v for v in astuple(row)] for row in rows)
