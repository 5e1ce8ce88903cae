"""One thread per process runs the torch work of its simulated devices.

Every OS thread that runs a multi-threaded torch operation gets an OpenMP thread team of its
own, and once a process holds more OpenMP threads than cores, libgomp stops spin-waiting
between parallel regions: every operation then pays for waking its team. Measured on 2 cores
(BENCHMARKS.md, issue 14): cnn4 trained on 600 images in 0.149 s in a process whose only torch
thread did it, in 0.223 s once one other thread had run torch with 2 threads. Simulated devices
are threads of one process, so each hands the torch part of its round (the whole device method:
building the model, training, reading the update back) to a `TrainingQueue`, which runs the
rounds one at a time, first come first served, on the one thread that serves it, with all of
torch's threads: the coordinator's own thread in the in-process backend (it serves the queue
while it waits for updates, and evaluates on the same thread), a dedicated thread in each Ray
actor.
"""

from __future__ import annotations

import contextlib
import threading
from collections import deque
from collections.abc import Callable
from typing import Any, Generic, TypeVar

from edge_sdk.training import TrainingStopped

__all__ = ["TrainingQueue"]

T = TypeVar("T")

#: What a Ray actor holds while it trains (one of its node's slots), given how many of its
#: devices wait: a context manager factory; None holds nothing.
Slot = Callable[[int], contextlib.AbstractContextManager[Any]]


class _Job(Generic[T]):
    """A device's round waiting for the serving thread, and then its outcome."""

    def __init__(self, work: Callable[[], T]) -> None:
        self.work = work
        self.done = threading.Event()
        self.value: T | None = None
        self.error: BaseException | None = None

    def finish(self, value: T | None = None, error: BaseException | None = None) -> None:
        self.value, self.error = value, error
        self.done.set()

    def outcome(self) -> T:
        self.done.wait()
        if self.error is not None:
            raise self.error
        return self.value  # type: ignore[return-value]


class TrainingQueue:
    """Device threads `run` their rounds here; one thread `serve`s them, one at a time."""

    def __init__(self, slot: Slot | None = None) -> None:
        self._slot = slot
        self._jobs: deque[_Job[Any]] = deque()
        self._changed = threading.Condition()
        self._closed = False
        self.served = 0  # rounds run so far
        self.server_threads: set[int] = set()  # the threads that ran them (one, unless misused)

    @property
    def waiting(self) -> int:
        """Rounds queued and not started."""
        return len(self._jobs)

    def run(self, work: Callable[[], T]) -> T:
        """Run ``work`` on the serving thread and return what it returned (or raise what it
        raised); TrainingStopped when the queue closes before it starts."""
        job = _Job(work)
        with self._changed:
            if self._closed:
                raise TrainingStopped("the simulation is stopping")
            self._jobs.append(job)
            self._changed.notify_all()
        return job.outcome()

    def serve(self, timeout: float) -> bool:
        """Run the next queued round on this thread, waiting up to ``timeout`` s for one;
        whether one ran. A KeyboardInterrupt while it runs stops that round and propagates."""
        with self._changed:
            if not self._jobs and not self._closed:
                self._changed.wait(timeout)
            if not self._jobs:
                return False
            job = self._jobs.popleft()
        self.server_threads.add(threading.get_ident())
        try:
            with self._slot(len(self._jobs) + 1) if self._slot is not None else contextlib.nullcontext():
                value = job.work()
        except Exception as exc:  # the device's own failure: it gets it back
            job.finish(error=exc)
        except BaseException:  # Ctrl-C on the serving thread: the device stops, the server goes on unwinding
            job.finish(error=TrainingStopped("interrupted"))
            raise
        else:
            job.finish(value)
        self.served += 1
        return True

    def serve_until_closed(self) -> None:
        """Serve rounds until `close` (a Ray actor's training thread)."""
        while not self.closed:
            self.serve(1.0)

    @property
    def closed(self) -> bool:
        return self._closed

    def close(self) -> None:
        """Refuse new rounds and stop the queued ones (their devices get TrainingStopped)."""
        with self._changed:
            self._closed = True
            pending, self._jobs = list(self._jobs), deque()
            self._changed.notify_all()
        for job in pending:
            job.finish(error=TrainingStopped("the simulation is stopping"))
