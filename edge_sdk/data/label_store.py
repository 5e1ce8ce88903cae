"""The device's own labelled windows: ``<state_dir>/labels.sqlite``, written while it serves, read
by its training every round (`edge_sdk.sources.StoreSource`). Raw data: it never leaves the device.

A row is one window of readings (channels x length, float32), the class name in effect, its time
span and where its label came from: a home event (``[labels]``, `HomeLabels`), a person's
correction of its prediction, or both (an event-labelled window corrected: the person's class wins).
Its key, a hash of the window's end and readings, is stable: the federated-evaluation holdout is chosen by it as
for every source (edge_sdk/data/holdout.py). **Corrections and the holdout**: a corrected window no
event labelled always trains — a correction is a scarce label, and one picked because the model was
wrong (held out, it would pull the device's figure towards its errors); a corrected event window
stays on the side its key put it (a held-out row never moves).

The store is bounded (``max_rows``): past it the oldest training rows go first; held-out rows only
beyond their share of the bound (they never move to training). Torch-free: a device that only serves
writes it."""

from __future__ import annotations

import hashlib
import json
import math
import sqlite3
import threading
from dataclasses import dataclass
from datetime import datetime, timedelta, timezone
from pathlib import Path

import numpy as np

from edge_sdk.data.holdout import held_out

__all__ = ["CORRECTED_EVENT", "CORRECTION", "EVENT", "STORE_FILENAME", "LabelStore", "StoredRows", "window_key"]

STORE_FILENAME = "labels.sqlite"
_EPOCH = datetime(1970, 1, 1, tzinfo=timezone.utc)
EVENT, CORRECTION, CORRECTED_EVENT = "event", "correction", "event+correction"

_SCHEMA = """
CREATE TABLE IF NOT EXISTS windows (
    key INTEGER PRIMARY KEY,        -- window_key(end, readings), as a signed 64-bit integer
    start REAL NOT NULL,            -- unix seconds of the window's first point
    end REAL NOT NULL,              -- and of its last
    label TEXT NOT NULL,            -- the class name
    origin TEXT NOT NULL,           -- event, correction or event+correction
    channels INTEGER NOT NULL,
    length INTEGER NOT NULL,
    readings BLOB NOT NULL          -- channels x length little-endian float32
);
CREATE INDEX IF NOT EXISTS windows_by_end ON windows (end);
CREATE TABLE IF NOT EXISTS meta (name TEXT PRIMARY KEY, value TEXT NOT NULL);
"""


def window_key(end: float, values: np.ndarray) -> int:
    """A window's stable key (uint64): a hash of its end (in microseconds) and its readings — two
    windows that end at the same time (a burst of readings, a sensor's coarse timestamps) are two
    rows; the same window labelled twice (an event, then a correction) is one."""
    micros = (datetime.fromtimestamp(end, timezone.utc) - _EPOCH) // timedelta(microseconds=1)  # as its ISO end
    digest = hashlib.blake2b(str(micros).encode(), digest_size=8)
    digest.update(np.ascontiguousarray(values, dtype="<f4").tobytes())
    return int.from_bytes(digest.digest(), "little")


def _signed(key: int) -> int:
    return key - (1 << 64) if key >= 1 << 63 else key


@dataclass(frozen=True)
class StoredRows:
    """Every row of a store, newest first (by window end)."""

    values: np.ndarray  # (N, channels, length) float32
    labels: tuple[str, ...]
    keys: np.ndarray  # uint64
    origins: tuple[str, ...]
    classes: tuple[str, ...]  # the class names of the model that served when the rows were labelled
    other_shape: int = 0  # rows left out: windows of another shape than the newest (another model's)

    def __len__(self) -> int:
        return len(self.labels)


class LabelStore:
    """The store in ``state_dir``; ``holdout``: the device's held-out fraction (0: none), the share
    of ``max_rows`` its held-out rows keep when the store is bounded."""

    def __init__(self, state_dir: str | Path, max_rows: int = 10_000, holdout: float | None = 0.0) -> None:
        if type(max_rows) is not int or max_rows < 1:
            raise ValueError(f"store_rows must be an integer >= 1, got {max_rows!r}")
        self.path = Path(state_dir) / STORE_FILENAME
        self.max_rows, self.holdout = max_rows, holdout or 0.0
        self._lock = threading.Lock()
        try:
            self._db = sqlite3.connect(self.path, timeout=10.0, check_same_thread=False)
            with self._db:
                self._db.execute("PRAGMA journal_mode=WAL")  # training reads while serving writes
                self._db.executescript(_SCHEMA)
        except sqlite3.Error as exc:  # an unwritable state_dir, a file that is not a database: one line
            raise ValueError(f"the label store {self.path} cannot be opened: {' '.join(str(exc).split())}") from None
        self.added = {EVENT: 0, CORRECTION: 0, CORRECTED_EVENT: 0}
        self.dropped = 0

    def close(self) -> None:
        self._db.close()

    def set_classes(self, classes: tuple[str, ...]) -> None:
        """The class names labels are checked against (the served model's), kept for training."""
        with self._lock, self._db:
            self._db.execute("INSERT OR REPLACE INTO meta VALUES ('classes', ?)", (json.dumps(list(classes)),))

    def add(self, start: float, end: float, values: np.ndarray, label: str, origin: str = EVENT) -> str:
        """Keep one window labelled ``label``; returns the row's origin now. An event label never
        overwrites a row already there; a correction does (and marks an event row corrected)."""
        if origin not in (EVENT, CORRECTION):
            raise ValueError(f"origin must be {EVENT} or {CORRECTION}, got {origin!r}")
        values = np.ascontiguousarray(values, dtype="<f4")
        channels, length = values.shape
        key = _signed(window_key(end, values))
        with self._lock, self._db:
            row = self._db.execute("SELECT origin FROM windows WHERE key = ?", (key,)).fetchone()
            if row is not None and origin == EVENT:
                return row[0]
            now = origin if row is None else (CORRECTED_EVENT if row[0] in (EVENT, CORRECTED_EVENT) else CORRECTION)
            self._db.execute("INSERT OR REPLACE INTO windows VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
                             (key, start, end, label, now, channels, length, values.tobytes()))
            self.added[now] += 1
            self._bound()
        return now

    def count(self) -> int:
        with self._lock:
            return int(self._db.execute("SELECT count(*) FROM windows").fetchone()[0])

    def _bound(self) -> None:
        """Past ``max_rows`` the oldest training rows go first; held-out rows (never moved to
        training) go, oldest first, only beyond their share of ``max_rows`` (else they would crowd
        out every training row in a long-running home)."""
        excess = int(self._db.execute("SELECT count(*) FROM windows").fetchone()[0]) - self.max_rows
        if excess <= 0:
            return
        rows = self._db.execute("SELECT key, origin FROM windows ORDER BY end").fetchall()
        keys = np.array([k for k, _ in rows], dtype=np.int64).view(np.uint64)
        held = held_out(keys, self.holdout) if self.holdout else np.zeros(len(rows), dtype=bool)
        held &= np.array([origin != CORRECTION for _, origin in rows])
        training, held_rows = np.flatnonzero(~held), np.flatnonzero(held)
        drop_held = min(excess, max(0, len(held_rows) - math.ceil(self.holdout * self.max_rows)))
        drop_training = min(excess - drop_held, len(training))
        drop_held = excess - drop_training
        order = np.concatenate([training[:drop_training], held_rows[:drop_held]])
        self._db.executemany("DELETE FROM windows WHERE key = ?", [(rows[i][0],) for i in order])
        self.dropped += len(order)

    @staticmethod
    def read(path: str | Path) -> StoredRows:
        """Every row of the store at ``path``, newest first (FileNotFoundError: none yet). Rows whose
        shape differs from the newest row's are left out (a model of another input served before)."""
        path = Path(path)
        if not path.is_file():
            raise FileNotFoundError(f"{path} does not exist yet")
        db = sqlite3.connect(path, timeout=10.0)
        try:
            rows = db.execute("SELECT key, label, origin, channels, length, readings FROM windows "
                              "ORDER BY end DESC").fetchall()
            meta = db.execute("SELECT value FROM meta WHERE name = 'classes'").fetchone()
        finally:
            db.close()
        classes = tuple(json.loads(meta[0])) if meta else ()
        total = len(rows)
        shape = rows[0][3:5] if rows else (0, 0)
        rows = [r for r in rows if r[3:5] == shape and len(r[5]) == 4 * shape[0] * shape[1]]
        values = np.frombuffer(b"".join(r[5] for r in rows), dtype="<f4").reshape(len(rows), *shape)
        keys = np.array([r[0] for r in rows], dtype=np.int64).view(np.uint64)
        return StoredRows(values.astype(np.float32), tuple(r[1] for r in rows), keys, tuple(r[2] for r in rows),
                          classes, total - len(rows))
