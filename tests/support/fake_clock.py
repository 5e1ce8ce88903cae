"""A clock that tests move by hand: pass it where code takes ``clock: Callable[[], float]``."""

from __future__ import annotations

__all__ = ["FakeClock"]


class FakeClock:
    """``now`` seconds; ``clock.now += 5`` moves time on."""

    def __init__(self, now: float = 0.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now
