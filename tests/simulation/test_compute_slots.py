"""Training slots shared by the Ray actors of a job (simulation/compute_slots.py), without Ray."""

from __future__ import annotations

import asyncio

import pytest

from simulation.compute_slots import ComputeSlots


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
