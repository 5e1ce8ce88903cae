"""A bounded receive queue that is fair between sources.

Messages wait in one queue per source (for a transport: the topic a message arrived on, which
the broker's ACL ties to one client) and are handed out round-robin, one per source in turn,
so a source that floods waits behind its own messages, never in front of the others'. Every
source has budgets — queued messages, queued bytes, and a token bucket of messages per second —
and so has the whole inbox; what is over a budget is dropped at once (cheap: nothing was
decoded yet) and counted per source. When the whole inbox is full, the source queueing the most
gives up its newest message for a source queueing less.
"""

from __future__ import annotations

import threading
import time
from collections import OrderedDict, deque
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Generic, TypeVar

from edge_sdk.networking.token_bucket import TokenBucket

__all__ = ["InboxLimits", "FairInbox"]

T = TypeVar("T")
#: how often `FairInbox.take_dropped` forgets sources that are idle (memory: the sources seen lately)
_SWEEP_EVERY_S = 10.0


@dataclass(frozen=True)
class InboxLimits:
    """Budgets of a `FairInbox`; ``rate``/``burst``: a token bucket of messages per source
    (``rate`` None: unlimited)."""

    max_messages: int = 10_000
    max_bytes: int = 1 << 30
    per_source_messages: int = 2_000
    per_source_bytes: int = 256 << 20
    rate: float | None = None
    burst: int = 2_000

    def __post_init__(self) -> None:
        for name in ("max_messages", "max_bytes", "per_source_messages", "per_source_bytes", "burst"):
            value = getattr(self, name)
            if type(value) is not int or value < 1:
                raise ValueError(f"inbox {name} must be an integer >= 1, got {value!r}")
        if self.per_source_messages > self.max_messages or self.per_source_bytes > self.max_bytes:
            raise ValueError("inbox per-source budgets must not exceed the whole inbox's")
        if self.rate is not None and not (isinstance(self.rate, (int, float)) and 0 < self.rate < float("inf")):
            raise ValueError(f"inbox rate must be a number of messages per second > 0, got {self.rate!r}")


class _Source(Generic[T]):
    __slots__ = ("items", "nbytes", "bucket", "dropped")

    def __init__(self, bucket: TokenBucket | None) -> None:
        self.items: deque[tuple[T, int]] = deque()
        self.nbytes = 0
        self.bucket = bucket
        self.dropped = 0

    @property
    def idle(self) -> bool:
        """Nothing queued, nothing dropped unreported, and a full bucket: it can be forgotten."""
        return not self.items and not self.dropped and (self.bucket is None or self.bucket.full)


class FairInbox(Generic[T]):
    """Thread-safe: `put` from a network thread, `get` from the owner's; see the module doc."""

    def __init__(self, limits: InboxLimits = InboxLimits(), clock: Callable[[], float] = time.monotonic) -> None:
        self.limits = limits
        self._clock = clock
        self._cond = threading.Condition()
        self._sources: dict[str, _Source[T]] = {}
        self._ready: OrderedDict[str, None] = OrderedDict()  # sources with queued items, in turn order
        self._count = 0
        self._bytes = 0
        self._closed = False
        self._wakes = 0  # `wake` calls: a waiting `get` returns when it changes
        self._byte_limits: dict[str, int] = {}
        self._default_bytes = limits.per_source_bytes
        #: messages dropped over a budget, all sources together
        self.dropped = 0
        self._dropping: set[str] = set()  # sources with drops not yet reported
        self._swept_at = clock()

    def __len__(self) -> int:
        with self._cond:
            return self._count

    @property
    def queued_bytes(self) -> int:
        with self._cond:
            return self._bytes

    def set_rate(self, rate: float | None, burst: int) -> None:
        """Every source's token bucket from now on: ``rate`` messages per second up to ``burst``
        (``rate`` None: unlimited)."""
        limits = replace(self.limits, rate=rate, burst=burst)  # validates
        with self._cond:
            self.limits = limits
            for src in self._sources.values():
                src.bucket = None if rate is None else TokenBucket(rate, burst, self._clock)

    def set_default_source_bytes(self, max_bytes: int) -> None:
        """The queued-bytes budget of every source without its own (`set_source_bytes`)."""
        if type(max_bytes) is not int or not 1 <= max_bytes <= self.limits.max_bytes:
            raise ValueError(f"a source's byte budget must be an int in [1, {self.limits.max_bytes}], "
                             f"got {max_bytes!r}")
        with self._cond:
            self._default_bytes = max_bytes

    def set_source_bytes(self, source: str, max_bytes: int | None) -> None:
        """The queued-bytes budget of one source (None: back to the default)."""
        if max_bytes is not None and (type(max_bytes) is not int or not 1 <= max_bytes <= self.limits.max_bytes):
            raise ValueError(f"a source's byte budget must be an int in [1, {self.limits.max_bytes}], "
                             f"got {max_bytes!r}")
        with self._cond:
            if max_bytes is None:
                self._byte_limits.pop(source, None)
            else:
                self._byte_limits[source] = max_bytes

    def set_budget(self, source: str | None, max_bytes: int | None) -> None:
        """The queued-bytes budget of ``source`` (None: the default of every source without its
        own), never above the whole queue's; ``max_bytes`` None: back to the default (for the
        default itself: the configured ``per_source_bytes``)."""
        if source is None:
            self.set_default_source_bytes(min(int(max_bytes or self.limits.per_source_bytes), self.limits.max_bytes))
        else:
            self.set_source_bytes(source, None if max_bytes is None else min(max_bytes, self.limits.max_bytes))

    def put(self, source: str, item: T, nbytes: int) -> bool:
        """Queue ``item`` (``nbytes`` long) from ``source``; False when a budget dropped it."""
        limits = self.limits
        with self._cond:
            if self._closed:
                return False
            src = self._sources.get(source)
            if src is None:
                bucket = None if limits.rate is None else TokenBucket(limits.rate, limits.burst, self._clock)
                src = self._sources[source] = _Source(bucket)
            if src.bucket is not None and not src.bucket.take():
                return self._drop(source, src)
            byte_limit = self._byte_limits.get(source, self._default_bytes)
            if len(src.items) >= limits.per_source_messages or src.nbytes + nbytes > byte_limit:
                return self._drop(source, src)
            while self._count >= limits.max_messages or self._bytes + nbytes > limits.max_bytes:
                if not self._evict_for(source):
                    return self._drop(source, src)
            src.items.append((item, nbytes))
            src.nbytes += nbytes
            self._count += 1
            self._bytes += nbytes
            self._ready.setdefault(source, None)
            self._cond.notify()
            return True

    def get(self, timeout: float | None = None) -> T | None:
        """The next item, taking sources in turn; None on timeout or once closed and empty."""
        deadline = None if timeout is None else self._clock() + timeout
        with self._cond:
            woken = self._wakes
            while not self._ready:
                if self._closed or self._wakes != woken:
                    return None
                remaining = None if deadline is None else deadline - self._clock()
                if remaining is not None and remaining <= 0:
                    return None
                self._cond.wait(remaining)
            source = next(iter(self._ready))
            src = self._sources[source]
            item, nbytes = src.items.popleft()
            src.nbytes -= nbytes
            self._count -= 1
            self._bytes -= nbytes
            del self._ready[source]
            if src.items:
                self._ready[source] = None  # to the back of the line
            return item

    def wake(self) -> None:
        """Make every waiting `get` return (None, unless an item is there)."""
        with self._cond:
            self._wakes += 1
            self._cond.notify_all()

    def close(self) -> None:
        """Wake every waiting `get`; later `put`s are dropped."""
        with self._cond:
            self._closed = True
            self._cond.notify_all()

    def take_dropped(self) -> dict[str, int]:
        """Messages dropped per source since the last call (sources with none left out)."""
        with self._cond:
            out = {}
            for name in self._dropping:
                if (src := self._sources.get(name)) is not None and src.dropped:
                    out[name], src.dropped = src.dropped, 0
            self._dropping.clear()
            if self._clock() - self._swept_at >= _SWEEP_EVERY_S:  # forget idle sources, now and then
                self._swept_at = self._clock()
                for name in [n for n, s in self._sources.items() if s.idle]:
                    del self._sources[name]
            return out

    def _drop(self, source: str, src: _Source[T]) -> bool:
        src.dropped += 1
        self.dropped += 1
        self._dropping.add(source)
        return False

    def _evict_for(self, source: str) -> bool:
        """Make room for one message of ``source`` by dropping the newest message of the source
        that queues the most, if that source queues more than ``source`` does."""
        mine = len(self._sources[source].items)
        heaviest = max(self._ready, key=lambda s: (len(self._sources[s].items), self._sources[s].nbytes), default=None)
        if heaviest is None or len(self._sources[heaviest].items) <= mine:
            return False
        victim = self._sources[heaviest]
        _, nbytes = victim.items.pop()
        victim.nbytes -= nbytes
        self._count -= 1
        self._bytes -= nbytes
        if not victim.items:
            del self._ready[heaviest]
        self._drop(heaviest, victim)
        return True
