"""SIGTERM as a requested stop: ``systemctl stop`` (or ``kill``) stops a command the way Ctrl-C
does — the round under way is left, the report and checkpoint are written, the devices told —
and the command exits 0 (Ctrl-C: 130)."""

from __future__ import annotations

import signal

__all__ = ["StopRequested", "stop_on_sigterm"]


class StopRequested(KeyboardInterrupt):
    """Raised in the main thread by SIGTERM; every ``except KeyboardInterrupt`` cleans up for it."""


def stop_on_sigterm() -> None:
    """Make SIGTERM raise :class:`StopRequested` in the main thread, once: a second SIGTERM while
    the command winds down is ignored, so that the report it is writing is not lost."""
    def handler(_signum: int, _frame: object) -> None:
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        raise StopRequested("SIGTERM")
    signal.signal(signal.SIGTERM, handler)
