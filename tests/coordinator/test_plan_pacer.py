"""A round's plans go out as its participants answer, within a byte budget, not all at once."""

from __future__ import annotations

import threading

import pytest

from coordinator.runtime.device_budgets import FleetLimits
from coordinator.runtime.plan_pacer import PlanPacer
from edge_sdk.protocol.messages import Ack, Plan, Update, decode_envelope
from edge_sdk.networking.transport import MqttTransport
from tests.support.raw_devices import registered_fleet, send_as

JOB = "plan-pacing"


def test_plans_go_while_the_unanswered_ones_are_under_budget():
    sent: list[str] = []
    pacer = PlanPacer(["a", "b", "c", "d", "e"], lambda d: sent.append(d) or 400, max_bytes=1000)
    assert pacer.send_more({"a", "b", "c", "d", "e"}) == 3  # 400, 800, then 1,200: the budget is passed
    assert sent == ["a", "b", "c"] and pacer.bytes_in_flight == 1200
    assert pacer.send_more({"a", "b", "c", "d", "e"}) == 0  # nobody answered: nothing more
    assert pacer.send_more({"b", "c", "d", "e"}) == 1  # "a" answered: 800 in flight, so "d" goes
    assert sent == ["a", "b", "c", "d"] and pacer.bytes_in_flight == 1200 and pacer.pending


def test_an_answer_or_a_departure_lets_the_next_plan_go():
    sent: list[str] = []
    pacer = PlanPacer(["a", "b", "c"], lambda d: sent.append(d) or 400, max_bytes=1)
    assert pacer.send_more({"a", "b", "c"}) == 1 and sent == ["a"]  # one plan goes whatever the budget
    assert pacer.send_more({"a", "b", "c"}) == 0
    assert pacer.send_more({"b", "c"}) == 1 and sent == ["a", "b"]  # "a" answered (or went offline)
    assert pacer.pending
    assert pacer.send_more({"c"}) == 1 and sent == ["a", "b", "c"] and not pacer.pending


def test_a_plan_to_a_participant_no_longer_waited_for_holds_no_budget():
    pacer = PlanPacer(["a", "b"], lambda d: 400, max_bytes=1)
    assert pacer.send_more({"b"}) == 2  # "a" is not waited for (gone): its plan goes, and "b"'s after it
    assert pacer.bytes_in_flight == 400


def test_fleet_limits_refuse_a_plan_budget_below_one_byte():
    with pytest.raises(ValueError, match="plan_bytes_in_flight"):
        FleetLimits(plan_bytes_in_flight=0)
    with pytest.raises(ValueError, match="plan_bytes_in_flight"):
        FleetLimits(plan_bytes_in_flight=1.5)




def _next_body(transport: MqttTransport, timeout: float):
    incoming = transport.receive(timeout)
    return None if incoming is None else decode_envelope(incoming.payload).body


def test_a_fleet_with_room_for_one_plan_sends_the_next_when_the_last_is_answered(broker):
    """Over a real broker: with a budget of one byte, the second participant gets its plan only
    once the first has sent its update, and the round still collects all three."""
    names = ["first", "second", "third"]
    with registered_fleet(broker.url, JOB, names, FleetLimits(plan_bytes_in_flight=1)) as (fleet, strategy, topics, peers):
        sent: list[str] = []

        def send_plan(device: str) -> int:
            sent.append(device)
            return fleet.send(device, strategy.configure_train(0, fleet.devices[device]), 0)
        result: dict = {}
        collector = threading.Thread(target=lambda: result.update(
            fleet.collect(0, names, 20.0, strategy.check_update, send_plan).updates))
        collector.start()
        for i, d in enumerate(names):
            assert isinstance(_next_body(peers[d], 5.0), Plan), f"{d} got no plan"
            for later in names[i + 1:]:  # no plan for the others while this one's is unanswered
                assert _next_body(peers[later], 0.3) is None, f"{later} got a plan before {d} answered"
            assert sent == names[:i + 1]
            send_as(peers[d], topics, d, Update("global", dict(strategy.weights), 10, {}), 0)
            assert isinstance(_next_body(peers[d], 5.0), Ack)
        collector.join(timeout=20)
        assert list(result) == names
