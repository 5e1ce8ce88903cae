"""New rows of the device's own data source whose label is empty, predicted as they come
(``[serve] rows = true``): one source may hold both the rows a device trains on and those it is
asked about — a sensor log whose newest readings nobody has labelled yet. The source (a csv or
sqlite ``[data]`` source, windows included) is read again every ``[data] reread_s``; a row is new
when its key was not in the read before. At the first read only the newest row is predicted (the
state now, for Home Assistant), the older ones are taken as seen."""

from __future__ import annotations

import logging
import time
from typing import Callable

import numpy as np

from edge_sdk.sources.base import DataSource, NoData

__all__ = ["SourceRows"]

log = logging.getLogger(__name__)


class SourceRows:
    """The unlabelled rows of ``source`` not seen before, every ``every_s`` seconds."""

    def __init__(self, source: DataSource, every_s: float = 60.0,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.source, self.every_s, self.clock = source, every_s, clock
        self._seen: set[int] | None = None
        self._next = 0.0
        self.counts = {"rows_read": 0, "rows_new": 0, "rows_failed_reads": 0}

    def due(self) -> bool:
        return self.clock() >= self._next

    def new(self) -> list[tuple[int, np.ndarray]]:
        """``(key, sample)`` of each new unlabelled row, oldest first (none when the read fails:
        one log line, and the next read tries again)."""
        self._next = self.clock() + self.every_s
        try:
            read = self.source.read()
        except NoData:
            return []
        except (ValueError, OSError) as exc:
            self.counts["rows_failed_reads"] += 1
            log.error("reading the unlabelled rows of %s failed: %s", self.source.description, exc)
            return []
        data = read.data
        keys = [int(k) for k in (data.keys if data.keys is not None else range(len(data)))]
        self.counts["rows_read"] += len(keys)
        if self._seen is None:  # the first read: the newest row only (newest first in every read)
            fresh = [0] if keys else []
        else:
            fresh = [i for i, key in enumerate(keys) if key not in self._seen][::-1]
        self._seen = set(keys)  # rows that left the source (max_samples) are forgotten with it
        self.counts["rows_new"] += len(fresh)
        return [(keys[i], data.x[i]) for i in fresh]
