"""What every data source returns, and the two ways a read can fail."""

from __future__ import annotations

import logging
from collections import Counter
from dataclasses import dataclass, field
from typing import Protocol

import numpy as np

from edge_sdk.data.local_data import LocalData

__all__ = ["DataSource", "NoData", "Skipped", "SourceRead"]

log = logging.getLogger("edge_sdk.sources")


class NoData(Exception):
    """The source is missing or empty (the device answers no_data and stays in the fleet); str(exc)
    is one line naming the file or key."""


@dataclass(frozen=True)
class SourceRead:
    """One read of a source."""

    #: every valid sample, newest first, at most ``max_samples`` of them; ``keys`` set (one stable
    #: uint64 per sample); ``num_classes`` the task's class count as the device knows it
    data: LocalData
    #: a held-out set the source itself names (an npz's x_test/y_test), else None
    test: LocalData | None = None
    #: reason -> rows skipped, e.g. {"NaN": 1, "label not a class": 3}
    skipped: dict[str, int] = field(default_factory=dict)
    #: True for each sample of ``data`` that is never held out (a person's corrections:
    #: edge_sdk/data/label_store.py); None: every sample goes by its key
    train_only: np.ndarray | None = None


class DataSource(Protocol):
    """Where a device's data lives; read again at the start of every round the device trains."""

    #: one line for logs, e.g. "csv /var/lib/x.csv (label column 'label')"
    description: str

    def read(self) -> SourceRead:
        """Every valid sample, newest first. Raises NoData for a missing or empty source and a
        one-line ValueError naming the file and key for a broken one."""
        ...


class Skipped(Counter):
    """Rows skipped in one read, by reason; `report` logs them in one line."""

    def report(self, where: str, unit: str = "rows") -> dict[str, int]:
        """Log ``skipped N rows of WHERE: 2 NaN, 1 label not a class`` (nothing when none) and
        return the counts as a plain dict."""
        counts = {reason: int(n) for reason, n in sorted(self.items(), key=lambda kv: (-kv[1], kv[0])) if n}
        if counts:
            total = sum(counts.values())
            log.warning("skipped %d %s of %s: %s", total, unit if total != 1 else unit.rstrip("s"), where,
                        self.summary())
        return counts

    def summary(self) -> str:
        """``2 NaN, 1 label not a class`` (largest first)."""
        return ", ".join(f"{n} {reason}" for reason, n in sorted(self.items(), key=lambda kv: (-kv[1], kv[0])) if n)
