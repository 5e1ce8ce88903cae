"""Live readings cut into the windows a served model classifies.

By **count** (``period_s`` None, sources that stream: an ESPHome sensor every second): every reading
of the first channel is a point, the other channels giving their latest value. By **time**
(``period_s``: a plug that reports on change, or every few seconds to minutes): a point every
``period_s`` seconds, each channel holding its last value. A window is ``length`` points; the next
one starts ``stride`` points later (default ``length``: windows do not overlap).

A gap longer than ``max_gap_s`` between readings, a reading older than the one before, or a bad
reading (`note_bad`) starts a new window; each is counted (`WindowCounts`), never raised.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass

import numpy as np

__all__ = ["Window", "WindowBuilder", "WindowCounts"]


@dataclass(frozen=True)
class Window:
    values: np.ndarray  # (channels, length) float32
    start: float  # unix seconds of its first point
    end: float  # and of its last


@dataclass
class WindowCounts:
    readings: int = 0
    windows: int = 0
    bad: int = 0
    gaps: int = 0
    out_of_order: int = 0
    repeats: int = 0


class WindowBuilder:
    """Points from readings, windows from points (see the module's docstring)."""

    def __init__(self, channels: int, length: int, *, period_s: float | None = None, stride: int | None = None,
                 max_gap_s: float = 300.0) -> None:
        if channels < 1 or length < 1:
            raise ValueError(f"a window needs at least one channel and one point, got {channels} x {length}")
        if period_s is not None and not period_s > 0:
            raise ValueError(f"period_s must be > 0, got {period_s!r}")
        self.channels, self.length, self.period_s = channels, length, period_s
        self.stride = length if stride is None else stride
        if not 1 <= self.stride <= length:
            raise ValueError(f"stride must be in 1..{length}, got {stride!r}")
        self.max_gap_s = max_gap_s
        self.counts = WindowCounts()
        self._held: list[float | None] = [None] * channels
        self._points: deque[tuple[float, tuple[float, ...]]] = deque()
        self._last: float | None = None
        self._next_tick: float | None = None

    def reset(self) -> None:
        """Start a new window: the points so far and the held values are dropped."""
        self._points.clear()
        self._held = [None] * self.channels
        self._last = self._next_tick = None

    def note_bad(self) -> None:
        """A reading that was not one (not a number, NaN, no field): counted, and a new window."""
        self.counts.bad += 1
        self.reset()

    def add(self, channel: int, value: float, at: float) -> list[Window]:
        """A reading of ``channel`` at unix time ``at``; returns the windows it completed."""
        self.counts.readings += 1
        if self._last is not None and at < self._last:
            self.counts.out_of_order += 1
            self.reset()
        elif self._last is not None and at - self._last > self.max_gap_s:
            self.counts.gaps += 1
            self.reset()
        done: list[Window] = []
        if self.period_s is None:
            self._held[channel] = value
            if channel == 0 and all(v is not None for v in self._held):
                self._point(at, done)
        else:
            self._ticks(lambda tick: tick < at, done)  # points before this reading hold the old values
            self._held[channel] = value
            if self._next_tick is None and all(v is not None for v in self._held):
                self._next_tick = at
            self._ticks(lambda tick: tick <= at, done)
        self._last = at
        return done

    def _ticks(self, due, done: list[Window]) -> None:
        while self._next_tick is not None and due(self._next_tick):
            self._point(self._next_tick, done)
            self._next_tick += self.period_s  # type: ignore[operator]

    def _point(self, at: float, done: list[Window]) -> None:
        self._points.append((at, tuple(self._held)))  # type: ignore[arg-type]
        if len(self._points) == self.length:
            values = np.array([p for _, p in self._points], dtype=np.float32).T
            done.append(Window(np.ascontiguousarray(values), self._points[0][0], self._points[-1][0]))
            self.counts.windows += 1
            for _ in range(self.stride):
                self._points.popleft()
