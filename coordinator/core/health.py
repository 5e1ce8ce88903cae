"""The coordinator's health: whether it can write what it must keep (checkpoint, report, metrics,
kept versions). A failed write — a full disk, a folder made read-only — does not stop a job that
serves for months: the model stays in memory, the devices keep serving the published version, the
earlier files stay whole (`coordinator.runtime.safe_files`), and every later round tries again. The
state (``ok``, ``disk_full``, ``write_failed``) is in report.json and Home Assistant's *Health*."""

from __future__ import annotations

import errno
import logging
import time
from contextlib import contextmanager
from typing import Any, Callable, Iterator

__all__ = ["HEALTH_STATES", "Health"]

log = logging.getLogger(__name__)

HEALTH_STATES = ("ok", "disk_full", "write_failed")
#: a write that keeps failing is logged again at most this often
SAY_AGAIN_S = 600.0
_DISK_FULL = {errno.ENOSPC, errno.EDQUOT, errno.EFBIG}


class Health:
    """What the coordinator could not write, and since when."""

    def __init__(self, on_change: Callable[[dict[str, Any]], None] | None = None) -> None:
        self.failing: dict[str, tuple[str, str]] = {}  # what -> (state, problem)
        self.since = time.time()
        self.on_change = on_change  # told `as_dict()` whenever the state or the problem changes
        self._said: dict[str, float] = {}

    @property
    def state(self) -> str:
        states = {state for state, _ in self.failing.values()}
        return "disk_full" if "disk_full" in states else "write_failed" if states else "ok"

    def as_dict(self) -> dict[str, Any]:
        problem = "; ".join(f"{what}: {why}" for what, (_, why) in sorted(self.failing.items()))
        return {"state": self.state, "problem": problem, "since": round(self.since, 3)}

    @contextmanager
    def writing(self, what: str) -> Iterator[None]:
        """Write ``what`` inside: an OSError is logged (at most every `SAY_AGAIN_S` while it lasts),
        sets the state and is not raised; a later success clears it."""
        try:
            yield
        except OSError as exc:
            state = "disk_full" if exc.errno in _DISK_FULL else "write_failed"
            why = exc.strerror or str(exc)
            if what not in self.failing or time.monotonic() - self._said.get(what, 0.0) >= SAY_AGAIN_S:
                log.error("cannot write %s: %s (%s); the job goes on with its model in memory and tries again "
                          "after the next round", what, why, getattr(exc, "filename", None) or "?")
                self._said[what] = time.monotonic()
            self._set(what, (state, why))
        else:
            if what in self.failing:
                log.warning("%s is written again", what)
                self._set(what, None)

    def _set(self, what: str, failure: tuple[str, str] | None) -> None:
        before = self.as_dict()
        if failure is None:
            self.failing.pop(what, None)
        else:
            self.failing[what] = failure
        now = self.as_dict()
        if (now["state"], now["problem"]) != (before["state"], before["problem"]):
            self.since = time.time()
            if self.on_change is not None:
                self.on_change(self.as_dict())
