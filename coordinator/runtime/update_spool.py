"""Where the fleet keeps the updates it accepted until they are aggregated: in memory up to a byte
budget, the rest in files (`coordinator.core.spooled_tensors.SpooledTensors`).

A round in which 10,000 devices train holds 10,000 updates until its last one arrives (5.2 GB of
cnn4 tensors); an asynchronous simulation holds every update in flight. With a budget
(`FleetLimits.updates_in_memory_bytes`, 512 MB) the coordinator's memory stays bounded whatever the
fleet: updates beyond it go to a spool directory (by default an ``update-spool-*`` folder in the job's output
folder, on disk, not in a RAM-backed /tmp) and are read back one tensor at a time when aggregated.
Nothing else changes: the same updates, aggregated in the same order with the same arithmetic, so
every figure stays the same to the bit; the price is the disk (the spilled updates' bytes, once
written and read once or twice a round) and a file per update, removed when it was aggregated.
"""

from __future__ import annotations

import logging
import shutil
import tempfile
import threading
import weakref
from dataclasses import replace
from pathlib import Path

from coordinator.core.received_update import ReceivedUpdate
from coordinator.core.spooled_tensors import SpooledTensors

__all__ = ["UpdateSpool"]

log = logging.getLogger(__name__)
_PREFIX = "update-spool-"


class UpdateSpool:
    """Accepted updates in memory up to ``memory_bytes`` (all of them alive at once), the rest in
    files under ``directory`` (None: a temporary directory); see the module doc."""

    def __init__(self, memory_bytes: int, directory: str | Path | None = None) -> None:
        self.memory_bytes = memory_bytes
        self.directory = None if directory is None else Path(directory)
        self.in_memory = 0  # bytes of the updates kept in memory that are still alive
        self.spilled = 0  # updates written to files, ever
        self.write_failures = 0  # updates kept in memory because their file could not be written
        self._lock = threading.Lock()
        self._made: Path | None = None
        self._cleanup: weakref.finalize | None = None

    def keep(self, received: ReceivedUpdate) -> ReceivedUpdate:
        """``received`` as it is while the budget holds it, else with its tensors in a file."""
        tensors = received.update.tensors
        size = sum(int(getattr(a, "nbytes", 0)) for a in tensors.values())
        with self._lock:
            fits = self.in_memory + size <= self.memory_bytes
            if fits:
                self.in_memory += size
        if fits:
            weakref.finalize(received, self._release, size)
            return received
        try:
            spooled = SpooledTensors.write(tensors, self._spool_dir())
        except OSError as exc:  # a full or read-only disk: keep it in memory rather than lose it
            if not self.write_failures:
                log.warning("could not keep an update in a file (%s): it stays in memory", exc)
            self.write_failures += 1
            return received
        if not self.spilled:
            log.info("updates beyond %d MB are kept in files under %s until they are aggregated",
                     self.memory_bytes >> 20, self._spool_dir())
        self.spilled += 1
        return replace(received, update=replace(received.update, tensors=spooled))

    def clear_stale(self) -> int:
        """Remove the spool folders a job killed before it could clean up left in ``directory``
        (called once, before this job's first update); returns how many."""
        if self.directory is None or not self.directory.is_dir():
            return 0
        stale = [p for p in self.directory.glob(f"{_PREFIX}*") if p.is_dir() and p != self._made]
        for path in stale:
            shutil.rmtree(path, ignore_errors=True)
        if stale:
            log.info("removed %d spool folder(s) an earlier job left in %s", len(stale), self.directory)
        return len(stale)

    def _release(self, size: int) -> None:
        with self._lock:
            self.in_memory -= size

    def _spool_dir(self) -> Path:
        if self._made is None:
            if self.directory is not None:
                self.directory.mkdir(parents=True, exist_ok=True)
            self._made = Path(tempfile.mkdtemp(prefix=_PREFIX, dir=self.directory))
            self._cleanup = weakref.finalize(self, shutil.rmtree, self._made, True)
        return self._made

    def close(self) -> None:
        """Remove the spool directory (a spilled update still referenced can no longer be read)."""
        if self._cleanup is not None:
            self._cleanup()
        self._made = self._cleanup = None
