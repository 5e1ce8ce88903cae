"""Training slots shared by the Ray actors of a job, so that any free worker's share of the
cluster trains the next device, whichever actor hosts it.

A simulated device trains in the actor that holds its MQTT connection. With one actor per
worker, a round lasts as long as the actor that drew the most participants (10 of 100 devices
over 4 actors: 2.44x the speed of one, not 4x; ``bench/bench_ray.py binding``). `--backend ray`
therefore starts more actors than workers, each training one device at a time, and lets no
more than the workers' count train at once on a node: an actor asks its node's `ComputeSlots`
for a slot before each round it trains (its training thread: simulation/training_queue.py)
and gives it back after. Waiting actors are served by how many of
their devices wait (the longest queue first), which keeps the round short.
"""

from __future__ import annotations

import asyncio
import heapq
import itertools

__all__ = ["ComputeSlots"]


class ComputeSlots:
    """A priority semaphore of ``slots`` training slots (run as an async Ray actor, one per node;
    plain asyncio otherwise, so it can be tested without Ray)."""

    def __init__(self, slots: int) -> None:
        if slots < 1:
            raise ValueError(f"slots must be >= 1, got {slots}")
        self.slots = slots
        self.in_use = 0
        self.peak = 0  # the most slots held at once: a job checks that it never exceeded `slots`
        self._waiting: list[tuple[int, int, asyncio.Future[None]]] = []
        self._order = itertools.count()

    async def acquire(self, waiting_devices: int = 1) -> None:
        """Take a slot; when none is free, wait, served before callers with fewer waiting devices
        (then first come, first served)."""
        if self.in_use < self.slots and not self._waiting:
            self._take()
            return
        future: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        heapq.heappush(self._waiting, (-waiting_devices, next(self._order), future))
        await future  # `release` hands its slot over: in_use already counts this caller

    async def release(self) -> None:
        """Give a slot back: to the first waiting caller, or to the pool."""
        while self._waiting:
            _, _, future = heapq.heappop(self._waiting)
            if not future.done():  # a caller that gave up (its actor stopped) is skipped
                future.set_result(None)
                return
        self.in_use = max(0, self.in_use - 1)

    async def stats(self) -> dict[str, int]:
        return {"slots": self.slots, "in_use": self.in_use, "peak": self.peak}

    def _take(self) -> None:
        self.in_use += 1
        self.peak = max(self.peak, self.in_use)
