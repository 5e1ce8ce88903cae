"""metrics.csv: one row per round, appended as rounds end and never rewritten, so that a job of
months costs the same to write per round on its first day and its last.

Its columns are fixed by the first row written; a round that brings a label the header lacks (a
new width, a label first evaluated) starts a new file with the wider header, the old one kept as
``metrics-<n>.csv``; so does a file past `MAX_BYTES` (rotated: at most `KEEP_FILES` kept).
"""

from __future__ import annotations

import csv
from collections import deque
from pathlib import Path
from typing import Any

from coordinator.runtime.safe_files import appending, rewriting

#: a round's record (`coordinator.runtime.report.RoundRecord`, which imports this module)
RoundRecord = Any

__all__ = ["MAX_BYTES", "KEEP_FILES", "MetricsFile", "metrics_columns"]

#: a metrics file past this size is rotated
MAX_BYTES = 64 << 20
#: rotated files kept beside it (metrics-1.csv newest)
KEEP_FILES = 5
#: what metrics.csv says of each label's federated accuracy besides the figure (`evaluation.by_label`)
WEIGHT_COLUMNS = ("samples", "devices", "low", "high")


def metrics_columns(labels: list[str], federated: list[str]) -> list[str]:
    """The header for central ``labels`` and ``federated`` labels."""
    weights = [f"federated_{what}_{k}" for k in federated for what in WEIGHT_COLUMNS]
    return ["round", "round_index", *[f"accuracy_{k}" for k in labels], "loss",
            *[f"federated_accuracy_{k}" for k in federated],
            *(["federated_loss", "federated_samples", "federated_devices"] if federated else []),
            *weights, "bytes_down", "bytes_up", "seconds", "host_seconds", "participants", "version"]


def _row(r: RoundRecord, labels: list[str], federated: list[str]) -> list[Any]:
    fed: list[Any] = [r.federated_accuracy.get(k, "") for k in federated]
    if federated:
        fed += ["" if r.federated_loss is None else r.federated_loss, r.evaluation.get("samples", ""),
                r.evaluation.get("devices", "") if r.federated_accuracy else ""]
        by_label = r.evaluation.get("by_label") or {}
        fed += [by_label.get(k, {}).get(what, "") for k in federated for what in WEIGHT_COLUMNS]
    return [r.round + 1, r.round, *[r.accuracy.get(k, "") for k in labels],
            "" if r.loss is None else r.loss, *fed, r.bytes_down, r.bytes_up, round(r.seconds, 3),
            round(r.host_seconds, 3), len(r.participants), r.version]


class MetricsFile:
    """Appends rounds to ``path``: a fresh file (any earlier one replaced), or with
    ``continue_existing`` (a resumed job) after the rows already there."""

    def __init__(self, path: Path, continue_existing: bool = False) -> None:
        self.path = path
        self.labels: list[str] = []
        self.federated: list[str] = []
        self.last_round = -1  # the latest round written
        self._started = False
        if continue_existing and path.exists():
            self._read_existing()

    def _read_existing(self) -> None:
        """The header's labels and the last row's round of the file a resumed job goes on with."""
        with open(self.path, newline="") as fh:
            reader = csv.reader(fh)
            header = next(reader, None)
            last = deque(reader, maxlen=1)[0] if header else None
        if not header or header[:2] != ["round", "round_index"]:
            return  # not ours: started afresh
        self.labels = [c[len("accuracy_"):] for c in header if c.startswith("accuracy_")]
        self.federated = [c[len("federated_accuracy_"):] for c in header if c.startswith("federated_accuracy_")]
        self.last_round = int(last[1]) if last and last[1].isdigit() else -1
        self._started = True

    def append(self, records: list[RoundRecord], complete: bool = False) -> None:
        """Write the rounds of ``records`` not written yet, in order. ``complete``: ``records`` hold
        every round the file has, so a header that must widen is rewritten in place (else the file
        is rotated and a new one started)."""
        new = [r for r in records if r.round > self.last_round]
        if not new:
            return
        labels = sorted(set(self.labels) | {k for r in new for k in r.accuracy})
        federated = sorted(set(self.federated) | {k for r in new for k in r.federated_accuracy})
        widened = self._started and (labels != self.labels or federated != self.federated)
        if widened and complete:
            new, self._started = list(records), False  # rewritten whole: a short job keeps one file
        elif widened or (self._started and self.path.exists() and self.path.stat().st_size > MAX_BYTES):
            self._rotate()
        fresh = not self._started or not self.path.exists()
        self.labels, self.federated = labels, federated
        self.path.parent.mkdir(parents=True, exist_ok=True)
        with (rewriting if fresh else appending)(self.path) as fh:
            writer = csv.writer(fh)
            if fresh:
                writer.writerow(metrics_columns(labels, federated))
            writer.writerows(_row(r, labels, federated) for r in new)
        self._started, self.last_round = True, new[-1].round

    def _rotate(self) -> None:
        """metrics.csv -> metrics-1.csv (the older ones one further, the oldest dropped)."""
        stem, parent = self.path.stem, self.path.parent
        (parent / f"{stem}-{KEEP_FILES}.csv").unlink(missing_ok=True)
        for n in range(KEEP_FILES - 1, 0, -1):
            if (older := parent / f"{stem}-{n}.csv").exists():
                older.rename(parent / f"{stem}-{n + 1}.csv")
        if self.path.exists():
            self.path.rename(parent / f"{stem}-1.csv")
