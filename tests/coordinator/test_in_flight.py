"""The plans and updates an asynchronous job holds open at a stop, kept beside its checkpoint
(`coordinator.runtime.in_flight`): written and read back whole, pickle-free; a damaged file is a
one-line ProtocolError. Taken up by a resumed job: tests/fleet/test_async_fleet.py."""

from __future__ import annotations

import numpy as np
import pytest

from coordinator.core.received_update import ReceivedUpdate
from coordinator.runtime.in_flight import (IN_FLIGHT_FILE, InFlightState, OpenPlanState, TakenUpdate, load_in_flight,
                                           save_in_flight)
from edge_sdk.protocol.errors import ProtocolError
from edge_sdk.protocol.messages import Plan, Update

BASE = {"w": np.arange(6, dtype=np.float32).reshape(2, 3), "b": np.zeros(2, np.float64)}


def _state() -> InFlightState:
    plan = Plan("fedavg", "0.5", {"layers": [{"type": "linear"}]}, BASE, {"epochs": 1}, {"mean": [0.0], "std": [1.0]})
    folded = ReceivedUpdate("d1", 7, Update("0.5", {"w": BASE["w"] + 1}, 30, {"loss": 0.5}), 1234)
    held = ReceivedUpdate("d2", 9, Update("0.5", {"w": BASE["w"] * 2, "b": BASE["b"] + 3}, 12, {}), 99)
    return InFlightState(4, 3, {(3, "0.5"): BASE}, [OpenPlanState("d0", 11, (3, "0.5"), plan, 2.5, 40)],
                         [TakenUpdate(folded, (4, "0.5"), 1), TakenUpdate(held, (3, "0.5"), None)], dispatches=1234)


def test_what_a_stop_keeps_reads_back_whole(tmp_path) -> None:
    state = _state()
    path = save_in_flight(tmp_path, state)
    assert path == tmp_path / IN_FLIGHT_FILE and not list(tmp_path.glob("*.tmp"))
    back = load_in_flight(tmp_path)
    assert back is not None and (back.version, back.round, back.dispatches) == (4, 3, 1234)
    (plan,) = back.plans
    assert (plan.device, plan.tag, plan.base, plan.age_s, plan.new_samples) == ("d0", 11, (3, "0.5"), 2.5, 40)
    sent = state.plans[0].plan
    assert (plan.plan.method, plan.plan.label, plan.plan.model_spec, plan.plan.train, plan.plan.preprocessing) == (
        sent.method, sent.label, sent.model_spec, sent.train, sent.preprocessing)
    for name, tensor in BASE.items():  # the plan's tensors are its base's, dtype kept
        assert plan.plan.tensors[name].dtype == tensor.dtype
        np.testing.assert_array_equal(plan.plan.tensors[name], tensor)
    for before, after in zip(state.taken, back.taken, strict=True):
        assert (after.base, after.stale, after.received.device_id, after.received.round, after.received.nbytes) == (
            before.base, before.stale, before.received.device_id, before.received.round, before.received.nbytes)
        assert after.received.update.num_samples == before.received.update.num_samples
        assert after.received.update.metrics == before.received.update.metrics
        assert set(after.received.update.tensors) == set(before.received.update.tensors)
        for name, tensor in before.received.update.tensors.items():
            np.testing.assert_array_equal(after.received.update.tensors[name], tensor)
    assert load_in_flight(tmp_path / "elsewhere") is None


def test_a_plan_or_held_update_on_a_model_not_kept_is_refused() -> None:
    state = _state()
    with pytest.raises(ValueError, match="not kept"):
        InFlightState(state.version, state.round, {}, state.plans, [])
    with pytest.raises(ValueError, match="not kept"):
        InFlightState(state.version, state.round, {}, [], state.taken)


@pytest.mark.parametrize("damage", ["truncated", "not a frame", "another format"])
def test_a_damaged_file_is_a_one_line_error(tmp_path, damage) -> None:
    path = save_in_flight(tmp_path, _state())
    if damage == "truncated":
        path.write_bytes(path.read_bytes()[:-40])
    elif damage == "not a frame":
        path.write_bytes(b"\x00" * 64)
    else:
        from edge_sdk.protocol.codec import encode_frame
        path.write_bytes(encode_frame({"format": 99}))
    with pytest.raises(ProtocolError) as error:
        load_in_flight(tmp_path)
    assert "\n" not in str(error.value)
