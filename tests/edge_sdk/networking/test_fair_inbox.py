"""The receive queue that is fair between sources (edge_sdk/networking/fair_inbox.py): exact orders and drops."""

from __future__ import annotations

import threading

import pytest

from edge_sdk.networking.fair_inbox import FairInbox, InboxLimits
from tests.support.fake_clock import FakeClock




def _drain(inbox: FairInbox) -> list:
    out = []
    while (item := inbox.get(0)) is not None:
        out.append(item)
    return out


def test_sources_are_served_in_turn_so_a_flood_waits_behind_itself() -> None:
    inbox: FairInbox[str] = FairInbox()
    for i in range(5):
        inbox.put("evil", f"e{i}", 1)
    inbox.put("a", "a0", 1)
    inbox.put("b", "b0", 1)
    inbox.put("a", "a1", 1)
    assert _drain(inbox) == ["e0", "a0", "b0", "e1", "a1", "e2", "e3", "e4"]
    assert len(inbox) == 0 and inbox.queued_bytes == 0


def test_per_source_budgets_drop_only_that_sources_messages() -> None:
    inbox: FairInbox[int] = FairInbox(InboxLimits(per_source_messages=3, per_source_bytes=100))
    assert [inbox.put("evil", i, 10) for i in range(5)] == [True, True, True, False, False]
    assert inbox.put("a", 0, 10) is True
    assert inbox.put("big", 0, 101) is False and inbox.put("big", 1, 100) is True
    inbox.set_source_bytes("evil", 5)
    assert inbox.get(0) == 0 and inbox.put("evil", 9, 6) is False  # its own budget lowered
    assert inbox.take_dropped() == {"evil": 3, "big": 1}
    assert inbox.take_dropped() == {}
    assert inbox.dropped == 4
    inbox.set_default_source_bytes(50)
    assert inbox.put("new", 0, 51) is False and inbox.put("new", 1, 50) is True


def test_a_full_inbox_takes_from_the_source_queueing_the_most() -> None:
    inbox: FairInbox[str] = FairInbox(InboxLimits(max_messages=4, per_source_messages=4))
    for i in range(4):
        assert inbox.put("evil", f"e{i}", 1)
    assert inbox.put("a", "a0", 1) is True  # evil's newest made room
    assert inbox.put("a", "a1", 1) is True
    assert inbox.put("a", "a2", 1) is False  # a queues as much as evil now: no eviction, a's own drop
    assert _drain(inbox) == ["e0", "a0", "e1", "a1"]
    assert inbox.take_dropped() == {"evil": 2, "a": 1}


def test_the_rate_budget_is_a_token_bucket_per_source() -> None:
    clock = FakeClock()
    inbox: FairInbox[int] = FairInbox(InboxLimits(rate=2.0, burst=3), clock=clock)
    assert [inbox.put("a", i, 1) for i in range(5)] == [True, True, True, False, False]
    assert inbox.put("b", 0, 1) is True  # b has its own bucket
    clock.now += 1.0  # two more tokens for a
    assert [inbox.put("a", i, 1) for i in range(3)] == [True, True, False]


def test_get_waits_for_a_message_and_close_wakes_it() -> None:
    inbox: FairInbox[str] = FairInbox()
    got: list = []
    waiter = threading.Thread(target=lambda: got.append(inbox.get(5.0)))
    waiter.start()
    inbox.put("a", "hello", 5)
    waiter.join(2)
    assert got == ["hello"]
    waiter = threading.Thread(target=lambda: got.append(inbox.get(None)))
    waiter.start()
    inbox.close()
    waiter.join(2)
    assert got == ["hello", None] and inbox.put("a", "late", 1) is False


@pytest.mark.parametrize("bad", [{"max_messages": 0}, {"per_source_bytes": 0}, {"rate": 0.0}, {"rate": float("inf")},
                                 {"per_source_messages": 20_000}, {"burst": 1.5}])
def test_impossible_limits_are_refused(bad) -> None:
    with pytest.raises(ValueError):
        InboxLimits(**bad)
