"""A participant that takes its plan and never answers stops holding every round to its deadline
(issue 56): once it missed `straggler_after` of its last 4 rounds the round waits for it only as
long again as the others took, once it has its quorum; it is waited for in full again once its
misses age out, and a late update of the latest round takes that miss back."""

from __future__ import annotations

import threading
import time

from edge_sdk.protocol.messages import Update
from tests.raw_devices import registered_fleet, send_as

JOB = "stragglers"
DEADLINE_S = 5.0
QUICK_S = 3.0  # a round that did not wait for its deadline (0.2 s + the others + a 0.5 s grace)


def _round(fleet, strategy, topics, peers, rnd: int, answering: list[str], straggler_after: int = 1):
    """One collection of round ``rnd`` from every peer; ``answering`` send their update at once.
    Returns what was collected and how long the collection took."""
    result: dict = {}
    names = sorted(peers)
    collector = threading.Thread(target=lambda: result.update(collected=fleet.collect(
        rnd, names, DEADLINE_S, strategy.check_update, quorum=2, straggler_after=straggler_after)))
    started = time.monotonic()
    collector.start()
    time.sleep(0.2)
    for d in answering:
        send_as(peers[d], topics, d, Update("global", dict(strategy.weights), 10, {}), rnd)
    collector.join(timeout=DEADLINE_S + 5)
    return result["collected"], time.monotonic() - started


def test_a_silent_participant_is_not_waited_for_once_it_is_a_straggler(broker):
    with registered_fleet(broker.url, JOB, ["a", "b", "silent"]) as (fleet, strategy, topics, peers):
        fleet.straggler_grace_min_s = 0.5
        for rnd in (0, 1):  # its first two misses: waited for until the deadline
            collected, took = _round(fleet, strategy, topics, peers, rnd, ["a", "b"], straggler_after=2)
            assert took >= DEADLINE_S and sorted(collected.updates) == ["a", "b"] and collected.not_waited_for == []
        assert fleet.devices["silent"].missed_rounds == 2 and fleet.devices["a"].missed_rounds == 0
        collected, took = _round(fleet, strategy, topics, peers, 2, ["a", "b"], straggler_after=2)
        assert took < QUICK_S, took  # the quorum, then 0.5 s more for the straggler
        assert sorted(collected.updates) == ["a", "b"] and collected.not_waited_for == ["silent"]
        assert fleet.devices["silent"].missed_rounds == 3
        # its late update of round 3 (rejected: wrong round) takes that miss back: slow, not silent
        send_as(peers["silent"], topics, "silent", Update("global", dict(strategy.weights), 10, {}), 2)
        fleet.pump(0.5)
        assert fleet.devices["silent"].missed_rounds == 2
        send_as(peers["silent"], topics, "silent", Update("global", dict(strategy.weights), 10, {}), 1)
        fleet.pump(0.5)  # an update of an older round takes nothing back
        assert fleet.devices["silent"].missed_rounds == 2
        record = fleet.devices["silent"]
        record.miss_bits, record.last_asked = record.miss_bits | 1, 3  # as if it missed a 4th round
        send_as(peers["silent"], topics, "silent", Update("global", dict(strategy.weights), 10, {}), 3)
        fleet.pump(0.5)  # a second late update within 4 rounds takes nothing back
        assert record.missed_rounds == 3
        fleet.devices["silent"].miss_bits = 0b0010  # 1 of its last 4: waited for in full again
        collected, took = _round(fleet, strategy, topics, peers, 4, ["a", "b"], straggler_after=2)
        assert took >= DEADLINE_S and collected.not_waited_for == []


def test_stragglers_are_waited_for_without_a_quorum_or_when_off(broker):
    with registered_fleet(broker.url, JOB + "-q", ["a", "b", "silent"]) as (fleet, strategy, topics, peers):
        fleet.straggler_grace_min_s = 0.5
        fleet.devices["silent"].miss_bits = 0b1111
        collected, took = _round(fleet, strategy, topics, peers, 0, ["a"])  # 1 update: below the quorum of 2
        assert took >= DEADLINE_S and collected.not_waited_for == []
        collected, took = _round(fleet, strategy, topics, peers, 1, ["a", "b"], straggler_after=0)  # off
        assert took >= DEADLINE_S and collected.not_waited_for == []
        collected, took = _round(fleet, strategy, topics, peers, 2, ["a", "b", "silent"])  # it answers
        assert took < QUICK_S and sorted(collected.updates) == ["a", "b", "silent"]  # at the others' pace
        assert fleet.devices["silent"].missed_rounds == 3  # of its last 4 rounds


def test_a_device_that_drops_out_half_the_time_costs_no_deadline_once_known(broker):
    """Missing every other round, it is a straggler once it missed twice (2 of its last 4): its
    rounds in between, when it answers with the others, cost nothing, and so do its misses from
    the third on (the quorum's time and a grace, not the deadline)."""
    with registered_fleet(broker.url, JOB + "-f", ["a", "b", "flaky"]) as (fleet, strategy, topics, peers):
        fleet.straggler_grace_min_s = 0.5
        took = [_round(fleet, strategy, topics, peers, rnd, ["a", "b"] + (["flaky"] if rnd % 2 else []),
                       straggler_after=2)[1] for rnd in range(5)]
        assert took[0] >= DEADLINE_S and took[2] >= DEADLINE_S, took  # its first two misses: not known yet
        assert max(took[1], took[3], took[4]) < QUICK_S, took  # answered, answered, its third miss
        assert fleet.devices["flaky"].missed_rounds == 2
