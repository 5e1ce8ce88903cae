"""A job's fixed tensors (a MiniRocket layer's biases) travel once: each device's first plan carries
them, its update names them by digest, and its later plans and evaluation requests leave them out —
over a real broker, with a device that forgets them (it is sent the plan or the request whole) and
one that names a digest its plan did not (refused)."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

from coordinator.aggregate.validation import UpdateRejected
from coordinator.runtime.fixed_tensors import FixedTensors
from edge_sdk.protocol.fixed_tensors import tensor_digest
from edge_sdk.device.fixed_cache import FixedCache
from edge_sdk.protocol.messages import Evaluate, Plan, Update
from tests.coordinator.test_series_features import run_waves_job

BIASES = np.linspace(-1, 1, 12, dtype=np.float32)
HEAD = np.ones((2, 12), np.float32)


def test_a_plan_declares_its_fixed_tensors_and_leaves_out_those_a_device_holds() -> None:
    fixed = FixedTensors()
    whole = Plan("fedavg", "global", {}, {"head": HEAD, "biases": BIASES}, {})
    assert fixed.declare(whole) is whole  # nothing is fixed yet
    fixed.names = frozenset({"biases"})
    declared = fixed.declare(whole)
    assert declared.fixed == {"biases": tensor_digest(BIASES)} and declared.tensors == whole.tensors
    assert fixed.for_device("d0", declared) is declared  # it holds nothing yet
    update = Update("global", {"head": HEAD * 2}, 4, {}, dict(declared.fixed))
    restored = fixed.restore(update, declared)
    assert restored.fixed == {} and restored.tensors["biases"] is BIASES
    fixed.holds("d0", update.fixed)
    assert set(fixed.for_device("d0", declared).tensors) == {"head"}
    assert set(fixed.for_device("d1", declared).tensors) == {"head", "biases"}
    other = fixed.declare(replace(whole, tensors={"head": HEAD, "biases": BIASES + 1}))  # refitted: a new digest
    assert set(fixed.for_device("d0", other).tensors) == {"head", "biases"}
    fixed.forget("d0")
    assert set(fixed.for_device("d0", declared).tensors) == {"head", "biases"}


def test_an_evaluations_baseline_leaves_out_the_fixed_tensors_it_shares_and_the_device_fills_them() -> None:
    fixed = FixedTensors()
    fixed.names = frozenset({"biases"})
    plan = Plan("fedavg", "global", {}, {"head": HEAD, "biases": BIASES}, {})
    served = {"head": HEAD * 3, "biases": BIASES.copy()}  # the published version: other weights, the same biases
    request = fixed.declare(Evaluate.of(plan, baseline=served))
    assert request.fixed == {"biases": tensor_digest(BIASES)} and set(request.baseline) == {"head"}
    fixed.holds("d0", dict(request.fixed))
    sent = fixed.for_device("d0", request)
    assert set(sent.tensors) == {"head"} and set(sent.baseline) == {"head"}  # the biases travel in neither
    cache = FixedCache()
    cache.remember(Plan("fedavg", "global", {}, {"biases": BIASES}, {}, None, dict(request.fixed)))
    filled = cache.resolve(sent)
    for tensors in (filled.tensors, filled.baseline):
        np.testing.assert_array_equal(tensors["biases"], BIASES)
    np.testing.assert_array_equal(filled.baseline["head"], HEAD * 3)
    refitted = fixed.declare(Evaluate.of(plan, baseline={"head": HEAD, "biases": BIASES + 1}))
    np.testing.assert_array_equal(refitted.baseline["biases"], BIASES + 1)  # not the request's: it travels
    assert cache.resolve(fixed.for_device("d0", refitted)).baseline["biases"][0] == BIASES[0] + 1


@pytest.mark.parametrize("why", ["no plan", "wrong digest", "not fixed", "sent as well"])
def test_an_update_naming_a_fixed_tensor_its_plan_did_not_is_refused(why) -> None:
    fixed = FixedTensors()
    fixed.names = frozenset({"biases"})
    declared = fixed.declare(Plan("fedavg", "global", {}, {"head": HEAD, "biases": BIASES}, {}))
    claim = {"wrong digest": {"biases": "0" * 64}, "not fixed": {"head": tensor_digest(HEAD)}}.get(
        why, dict(declared.fixed))
    tensors = {"head": HEAD, **({"biases": BIASES} if why == "sent as well" else {})}
    with pytest.raises(UpdateRejected) as refused:
        fixed.restore(Update("global", tensors, 4, {}, claim), None if why == "no plan" else declared)
    assert refused.value.code == "bad_tensors"


def test_over_a_broker_the_biases_travel_once_a_device_that_forgets_them_is_sent_them(broker) -> None:
    from edge_sdk.client import DeviceClient
    from edge_sdk.device.fixed_cache import FixedCache

    key = "layers.0.biases"

    class Device(DeviceClient):
        """Its own cache (not the process's, which the test's three devices would share); records
        whether each plan and each evaluation request (every round: federated evaluation) it was
        handed carried the biases."""

        def __init__(self, *args, **kwargs) -> None:
            super().__init__(*args, **kwargs)
            self.rounds.fixed_cache = FixedCache()
            self.plans: list[tuple[int, bool]] = []
            self.requests: list[tuple[int, bool]] = []
            evaluate = self.rounds.evaluate

            def recorded(env) -> None:
                self.requests.append((env.round, key in env.body.tensors))
                evaluate(env)
                self.evaluated(env.round)
            self.rounds.evaluate = recorded

        def _train(self, rnd: int, plan: Plan) -> Update | None:
            self.plans.append((rnd, key in plan.tensors))
            return super()._train(rnd, plan)

        def evaluated(self, rnd: int) -> None:
            pass

    class Forgetful(Device):
        """Restarts, as far as its cache goes, after its update of round 1 and after its evaluation of round 2."""

        def _send_update(self, update: Update, rnd: int) -> None:
            super()._send_update(update, rnd)
            if rnd == 0:
                self.rounds.fixed_cache.clear()

        def evaluated(self, rnd: int) -> None:
            if rnd == 1:
                self.rounds.fixed_cache.clear()

    class WrongDigest(Device):
        """Names, in round 2, a digest its plan did not (refused), then sends its update as it is."""

        def _send_update(self, update: Update, rnd: int) -> None:
            if rnd == 1 and update.fixed:
                super()._send_update(replace(update, fixed={name: "0" * 64 for name in update.fixed}), rnd)
            super()._send_update(update, rnd)

    report, loop, fleet, clients = run_waves_job(broker, "rocket-fixed", (Device, WrongDigest, Forgetful), rounds=3)
    strategy = loop.strategy
    steady, wrong, forgetful = clients
    assert steady.plans == [(0, True), (1, False), (2, False)]  # once, then never again
    assert steady.requests == [(0, False), (1, False), (2, False)]  # its first update proved it holds them
    assert wrong.plans == steady.plans and wrong.requests == steady.requests  # the refused update changed nothing
    # a request or a plan without them that it cannot fill is answered unknown_fixed and sent again whole;
    # the coordinator then sends them until an update proves it holds them again
    assert forgetful.requests == [(0, False), (0, True), (1, False), (2, False)]
    assert forgetful.plans == [(0, True), (1, True), (2, False), (2, True)]
    assert [r.participants for r in report.rounds] == [["d0", "d1", "d2"]] * 3
    assert [(d, code) for d, code, _ in fleet.rejections] == [("d1", "bad_tensors")]
    assert np.array_equal(strategy.state_tensors()[key], loop._rocket_biases[key]) and np.any(loop._rocket_biases[key])
    head, biases = strategy.model_params()["global"] * 4, loop._rocket_biases[key].nbytes
    assert 3 * head < report.rounds[0].bytes_up < 3 * (head + biases // 2)  # no update carried them
    assert report.rounds[-1].accuracy["global"] >= 0.9
