"""Training slots shared by the Ray actors of a job (coordinator/compute_slots.py), without Ray."""

from __future__ import annotations

import asyncio
import threading
import time

import pytest

from coordinator.compute_slots import ComputeSlots, SharedSlot


def test_no_more_than_the_slots_are_held_and_the_longest_queue_is_served_first() -> None:
    async def scenario() -> list[str]:
        slots = ComputeSlots(2)
        await slots.acquire()
        await slots.acquire()
        served: list[str] = []

        async def wait(name: str, waiting: int) -> None:
            await slots.acquire(waiting)
            served.append(name)

        tasks = [asyncio.create_task(wait("one", 1)), asyncio.create_task(wait("three", 3)),
                 asyncio.create_task(wait("one-later", 1))]
        await asyncio.sleep(0)
        assert served == [] and (await slots.stats())["in_use"] == 2
        for _ in range(3):
            await slots.release()
            await asyncio.sleep(0)
        await asyncio.gather(*tasks)
        stats = await slots.stats()
        assert stats["peak"] == 2 and stats["in_use"] == 2
        return served

    assert asyncio.run(scenario()) == ["three", "one", "one-later"]


def test_a_released_slot_goes_back_to_the_pool_when_nobody_waits() -> None:
    async def scenario() -> dict[str, int]:
        slots = ComputeSlots(1)
        await slots.acquire()
        await slots.release()
        await slots.acquire()  # would wait forever if the slot had been lost
        return await slots.stats()

    assert asyncio.run(scenario()) == {"slots": 1, "in_use": 1, "peak": 1}


def test_zero_slots_is_an_error() -> None:
    with pytest.raises(ValueError, match="slots must be >= 1"):
        ComputeSlots(0)


def test_devices_of_one_actor_train_one_at_a_time_and_say_how_many_wait() -> None:
    asked: list[int] = []
    released: list[int] = []
    slot = SharedSlot(asked.append, lambda: released.append(1))
    inside = threading.Event()
    leave = threading.Event()
    overlap: list[bool] = []

    def train() -> None:
        with slot:
            overlap.append(inside.is_set())
            inside.set()
            leave.wait(5)
            inside.clear()

    threads = [threading.Thread(target=train) for _ in range(3)]
    for t in threads:
        t.start()
    deadline = time.monotonic() + 5
    while slot.waiting < 3 and time.monotonic() < deadline:
        time.sleep(0.01)
    assert slot.waiting == 3  # one training, two waiting for this actor's lock
    leave.set()
    for t in threads:
        t.join(5)
    assert overlap == [False, False, False]
    assert asked[1:] == [2, 1]  # after the first: its two then one waiting devices
    assert len(asked) == len(released) == 3 and slot.waiting == 0


def test_a_failed_slot_request_leaves_nothing_held() -> None:
    def refuse(waiting: int) -> None:
        raise RuntimeError("slots actor is gone")

    slot = SharedSlot(refuse, lambda: None)
    with pytest.raises(RuntimeError):
        with slot:
            pass
    assert slot.waiting == 0
    assert slot._lock.acquire(timeout=1)  # the actor's lock was given back
