"""A token bucket: so many events per second, with a burst."""

from __future__ import annotations

import time
from collections.abc import Callable

__all__ = ["TokenBucket"]


class TokenBucket:
    """``rate`` tokens per second up to ``burst``; `take` spends one when there is one."""

    def __init__(self, rate: float, burst: int, clock: Callable[[], float] = time.monotonic) -> None:
        if not rate >= 0 or burst < 1:
            raise ValueError(f"need rate >= 0 and burst >= 1, got {rate!r} and {burst!r}")
        self.rate, self.burst, self._clock = rate, burst, clock
        self._tokens = float(burst)
        self._stamp = clock()

    def _refill(self) -> None:
        now = self._clock()
        self._tokens = min(float(self.burst), self._tokens + (now - self._stamp) * self.rate)
        self._stamp = now

    def take(self) -> bool:
        """True (and one token spent) when a token is available."""
        self._refill()
        if self._tokens >= 1.0:
            self._tokens -= 1.0
            return True
        return False

    @property
    def full(self) -> bool:
        """True when the bucket has refilled to its burst (it has been idle long enough)."""
        self._refill()
        return self._tokens >= self.burst
