"""Repeated log lines, rate-limited: a service that runs for months must not write the same
warning every few seconds (a device that keeps sending what is refused, a broker that keeps
refusing). The command line installs `RepeatFilter` on its log handler."""

from __future__ import annotations

import logging
import time
from typing import Callable

__all__ = ["RepeatFilter", "install_repeat_filter"]


class RepeatFilter(logging.Filter):
    """Lets at most ``burst`` records of one kind — logger, level and message template (the
    ``%s`` text before its arguments), WARNING and above — through per ``window_s``; the first one
    let through after some were held back says how many."""

    def __init__(self, burst: int = 5, window_s: float = 60.0, level: int = logging.WARNING,
                 clock: Callable[[], float] = time.monotonic) -> None:
        super().__init__()
        self.burst, self.window_s, self.level, self.clock = burst, window_s, level, clock
        #: kind -> (window start, records let through in it, records held back since the last one let through)
        self._kinds: dict[tuple[str, int, str], tuple[float, int, int]] = {}

    def filter(self, record: logging.LogRecord) -> bool:
        if record.levelno < self.level:
            return True
        kind = (record.name, record.levelno, str(record.msg))
        now = self.clock()
        start, passed, held = self._kinds.get(kind, (now, 0, 0))
        if now - start >= self.window_s:
            start, passed = now, 0
        if passed >= self.burst:
            self._kinds[kind] = (start, passed, held + 1)
            return False
        if held:
            record.msg = f"{record.msg} ({held} more like this held back)"
        self._kinds[kind] = (start, passed + 1, 0)
        if len(self._kinds) > 10_000:  # bounded: the oldest kinds are forgotten
            for stale in list(self._kinds)[:1000]:
                del self._kinds[stale]
        return True


def install_repeat_filter(burst: int = 5, window_s: float = 60.0) -> None:
    """Put a `RepeatFilter` on every handler of the root logger (after ``logging.basicConfig``)."""
    for handler in logging.getLogger().handlers:
        if not any(isinstance(f, RepeatFilter) for f in handler.filters):
            handler.addFilter(RepeatFilter(burst, window_s))
