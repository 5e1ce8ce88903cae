"""The fleet's open collection (asynchronous aggregation on a real fleet): many plans out at once,
each device answering its own plan's tag, updates handed on in the order they arrive; a plan
closed (its deadline, its device gone) refuses the update that comes after, counted."""

from __future__ import annotations

import threading
import time

import pytest

from edge_sdk.protocol.errors import ErrorCode
from edge_sdk.protocol.messages import Error, Evaluation, Update
from tests.support.raw_devices import registered_fleet, send_as

JOB = "open-collection"


def _arrivals(fleet, want: int, timeout: float = 10.0):
    """Everything that arrived until ``want`` updates or declines are in."""
    updates, declined, failed = {}, [], {}
    end = time.monotonic() + timeout
    while len(updates) + len(declined) + len(failed) < want and time.monotonic() < end:
        got = fleet.arrivals(0.5)
        updates.update(got.updates)
        declined += got.declined
        failed.update(got.failed)
    return updates, declined, failed


def _rejected(fleet, device: str, timeout: float = 10.0) -> tuple[str, str, str]:
    """The latest rejection of ``device``'s input, waiting for it (it may come over another connection)."""
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        mine = [r for r in fleet.rejections if r[0] == device]
        if mine:
            fleet.rejections.clear()
            return mine[-1]
        fleet.pump(0.1)
    raise AssertionError(f"no rejection of {device}")


def test_plans_of_their_own_tags_answered_in_arrival_order(broker):
    with registered_fleet(broker.url, JOB, ["a", "b", "c"]) as (fleet, strategy, topics, peers):
        fleet.open_collection(strategy.check_update)
        for tag, device in ((7, "a"), (8, "b"), (9, "c")):
            fleet.ask(device, tag, strategy.configure_train(0, fleet.devices[device]))
        update = Update("global", dict(strategy.weights), 10, {})
        send_as(peers["c"], topics, "c", update, 9)  # c answers first, then a
        assert list(_arrivals(fleet, 1)[0]) == ["c"]
        send_as(peers["a"], topics, "a", update, 7)
        send_as(peers["b"], topics, "b", update, 7)  # a's tag is not b's: refused
        updates, _, _ = _arrivals(fleet, 1)
        assert list(updates) == ["a"] and updates["a"].round == 7
        assert _rejected(fleet, "b") == ("b", ErrorCode.WRONG_ROUND,
                                         "update for round 8; collecting: its plan of round 9")
        send_as(peers["a"], topics, "a", update, 7)  # its plan is answered: closed
        assert _rejected(fleet, "a") == ("a", ErrorCode.WRONG_ROUND,
                                         "update for round 8; collecting: no plan of this device is open")
        fleet.close_collection()


def test_a_closed_plan_refuses_its_late_update_and_a_decline_closes_the_plan(broker):
    with registered_fleet(broker.url, JOB + "-late", ["a", "b", "c"]) as (fleet, strategy, topics, peers):
        fleet.open_collection(strategy.check_update)
        for tag, device in enumerate("abc"):
            fleet.ask(device, tag, strategy.configure_train(0, fleet.devices[device]))
        fleet.close_plan("a")  # e.g. its deadline passed
        assert fleet.devices["a"].missed_rounds == 1
        update = Update("global", dict(strategy.weights), 10, {})
        before = fleet.rejection_count
        send_as(peers["a"], topics, "a", update, 0)
        send_as(peers["b"], topics, "b", Error(ErrorCode.NOT_TRAINING, "outside its window"), 1)
        send_as(peers["c"], topics, "c", Error(ErrorCode.TRAIN_FAILED, "out of memory"), 2)
        updates, declined, failed = _arrivals(fleet, 2)
        assert updates == {} and declined == ["b"] and failed == {"c": "out of memory"}
        assert _rejected(fleet, "a")[:2] == ("a", ErrorCode.WRONG_ROUND) and fleet.rejection_count == before + 1
        # asked again under new tags: the old ones are refused, the new ones taken
        fleet.ask("b", 5, strategy.configure_train(1, fleet.devices["b"]))
        send_as(peers["b"], topics, "b", update, 1)
        send_as(peers["b"], topics, "b", update, 5)
        updates, _, _ = _arrivals(fleet, 1)
        assert list(updates) == ["b"] and updates["b"].round == 5
        assert _rejected(fleet, "b")[2] == "update for round 2; collecting: its plan of round 6"
        fleet.close_collection()
        with pytest.raises(RuntimeError, match="no open collection"):
            fleet.arrivals(0.0)
        send_as(peers["b"], topics, "b", update, 5)  # no collection: refused, counted
        assert _rejected(fleet, "b") == ("b", ErrorCode.WRONG_ROUND, "update for round 6; collecting: none")


def test_an_evaluation_beside_open_plans_loses_no_update(broker):
    """A version's federated evaluation collects the devices' evaluations while their training
    plans stay open: an update that arrives meanwhile waits in the open collection."""
    with registered_fleet(broker.url, JOB + "-eval", ["a", "b"]) as (fleet, strategy, topics, peers):
        fleet.open_collection(strategy.check_update)
        for tag, device in ((3, "a"), (4, "b")):
            fleet.ask(device, tag, strategy.configure_train(0, fleet.devices[device]))
        with pytest.raises(RuntimeError, match="while an open collection runs"):
            fleet.collect(5, ["a"], 1.0, strategy.check_update)
        result: dict = {}
        evaluating = threading.Thread(target=lambda: result.update(got=fleet.collect_evaluations(
            10, ["a", "b"], 10.0, lambda record, evaluation: None)))
        evaluating.start()
        time.sleep(0.2)
        update = Update("global", dict(strategy.weights), 10, {})
        send_as(peers["a"], topics, "a", update, 3)  # its training, done during the evaluation
        send_as(peers["a"], topics, "a", Evaluation("global", 12, 9, 3.0), 10)
        send_as(peers["b"], topics, "b", Evaluation("global", 8, 8, 1.0), 10)
        evaluating.join(15.0)
        assert sorted(result["got"].reports) == ["a", "b"] and result["got"].reports["a"].correct == 9
        updates, _, _ = _arrivals(fleet, 1)
        assert list(updates) == ["a"] and updates["a"].round == 3  # kept for the next version
        send_as(peers["b"], topics, "b", update, 4)  # b's plan is still open after the evaluation
        updates, _, _ = _arrivals(fleet, 1)
        assert list(updates) == ["b"] and fleet.rejection_count == 0, list(fleet.rejections)
        fleet.close_collection()
