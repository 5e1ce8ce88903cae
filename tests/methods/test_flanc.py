"""FLANC's coordinator and device parts: plans, Eq. 4 aggregation, rejections, a real-broker run."""

from __future__ import annotations

import json

import numpy as np
import pytest

from tests.support.labels import assign

from coordinator.core.device_record import DeviceRecord
from coordinator.core.received_update import ReceivedUpdate
from simulation.simulate import SimulationConfig, run_simulation, sim_federation
from coordinator.strategies.flanc import Flanc
from coordinator.core.federation import FederationConfig
from coordinator.strategies.base import StrategyContext
from coordinator.aggregate.validation import UpdateRejected
from edge_sdk.data.datasets import load_dataset
from edge_sdk.methods import DeviceContext, LocalData, device_method
from edge_sdk.models.spec import build_model, count_params
from edge_sdk.tensors import load_numpy_state
from edge_sdk.models.zoo import cnn4
from edge_sdk.profiling import load_profile
from edge_sdk.protocol.messages import Update
from edge_sdk.training import TrainConfig, evaluate

PROFILES = {"0.25": "raspberry-pi-3b", "0.5": "raspberry-pi-4b", "0.75": "jetson-nano", "1.0": "jetson-orin-nano"}


@pytest.fixture(scope="module")
def mnist():
    return load_dataset("mnist-sample")


def make_flanc(mnist, **options) -> Flanc:
    ctx = StrategyContext(FederationConfig(seed=0, train=TrainConfig(epochs=1, lr=0.05)), "cnn4",
                          mnist.input_shape, mnist.num_classes,
                          options={k: str(v) for k, v in options.items()})
    return Flanc.create(ctx)


def fleet(strategy: Flanc) -> dict[str, DeviceRecord]:
    records = {}
    for label, profile in PROFILES.items():
        records[label] = DeviceRecord(f"dev-{label}", load_profile(profile), 300)
        assign(strategy, records[label], records.values())
    return records


def test_options_are_parsed_and_bad_ones_rejected():
    o = Flanc.parse_options({"widths": "0.5,1", "basis_fraction": "0.25", "orth_lambda": "0",
                                   "precompose": "true", "assign": "quantile", "norm": "batchnorm"})
    assert o.width.widths == (0.5, 1.0) and o.basis_fraction == 0.25 and o.orth_lambda == 0.0
    assert o.precompose is True and o.width.assignment.mode == "quantile" and o.width.norm == "batchnorm"
    for bad in ({"colour": "red"}, {"widths": "1,0.5"}, {"widths": "0,1"}, {"basis_count": "x"},
                {"orth_lambda": "-1"}, {"precompose": "maybe"}, {"norm": "layernorm"}, {"assign": "coin"}):
        with pytest.raises(ValueError):
            Flanc.parse_options(bad)


def test_devices_get_their_width_and_download_basis_plus_own_tensors(mnist):
    strategy = make_flanc(mnist)
    records = fleet(strategy)
    assert {label: r.label for label, r in records.items()} == {lab: lab for lab in PROFILES}
    plans = {label: strategy.configure_train(0, r) for label, r in records.items()}
    basis = set(strategy.basis_keys)
    for label, plan in plans.items():
        assert plan.label == label and plan.model_spec["meta"]["flanc_width"] == float(label)
        assert basis <= set(plan.tensors)
        assert set(plan.tensors) - basis == set(strategy.private[label])
        assert plan.train["orth_lambda"] == 0.01
    # the full-width download is well under half of the dense network's weights
    assert sum(t.size for t in plans["1.0"].tensors.values()) < 0.45 * count_params(cnn4(norm="batchnorm"))


def test_random_sampling_plans_widths_up_to_capacity_and_checks_the_planned_one(mnist):
    strategy = make_flanc(mnist, sample="random")
    records = fleet(strategy)
    planned = {label: {strategy.configure_train(rnd, r).label for rnd in range(24)} for label, r in records.items()}
    order = list(PROFILES)
    for capacity, labels in planned.items():
        assert labels <= set(order[:order.index(capacity) + 1])  # never wider than the device affords
    assert planned["0.25"] == {"0.25"} and planned["1.0"] == set(order)
    top = records["1.0"]
    plan = next(p for p in (strategy.configure_train(r, top) for r in range(24, 48)) if p.label != "1.0")
    # an update must be for the width it was sent this round, not its capacity width
    with pytest.raises(UpdateRejected):
        strategy.check_update(top, _update(strategy, "1.0", 0.1, 300))
    strategy.check_update(top, _update(strategy, plan.label, 0.1, 300))


def _update(strategy: Flanc, label: str, value: float, n: int, **changes) -> Update:
    tensors = {k: np.full(v.shape, value, np.float32) for k, v in strategy.tensors(label).items()}
    tensors.update(changes)
    return Update(label, tensors, n, {"loss": 1.0})


def test_aggregation_is_eq4_basis_over_all_coefficients_within_width(mnist):
    strategy = make_flanc(mnist, clip="none", max_share=1)  # Eq. 4 itself: the plain weighted mean, unscreened
    records = fleet(strategy)
    before = {k: v.copy() for k, v in strategy.private["0.75"].items()}
    for label in ("0.25", "1.0"):
        strategy.configure_train(0, records[label])
    updates = [ReceivedUpdate("dev-0.25", 0, _update(strategy, "0.25", 1.0, 100), 0),
               ReceivedUpdate("dev-1.0", 0, _update(strategy, "1.0", 4.0, 300), 0),
               ReceivedUpdate("dev-1.0b", 0, _update(strategy, "1.0", 2.0, 100), 0)]
    metrics = strategy.aggregate(0, updates)
    for v in strategy.basis.values():  # all participants, weighted by samples
        assert np.allclose(v, (1.0 * 100 + 4.0 * 300 + 2.0 * 100) / 500)
    for v in strategy.private["0.25"].values():
        assert np.allclose(v, 1.0)
    for k, v in strategy.private["1.0"].items():  # only the width-1.0 devices
        if k.endswith("running_var"):  # BN statistics pool as a mixture: E[var + mean²] - mean²
            assert np.allclose(v, (300 * (4 + 16) + 100 * (2 + 4)) / 400 - 3.5 ** 2)
        else:
            assert np.allclose(v, (4.0 * 300 + 2.0 * 100) / 400)
    for k, v in strategy.private["0.75"].items():  # nobody trained it: unchanged
        assert np.array_equal(v, before[k])
    assert metrics["devices_1.0"] == 2 and metrics["devices_0.75"] == 0


def test_bad_updates_are_rejected(mnist):
    strategy = make_flanc(mnist)
    records = fleet(strategy)
    with pytest.raises(UpdateRejected, match="no plan"):
        strategy.check_update(records["0.5"], _update(strategy, "0.5", 0.0, 10))
    strategy.configure_train(0, records["0.5"])
    strategy.check_update(records["0.5"], _update(strategy, "0.5", 0.0, 10))  # a good one passes
    name = strategy.basis_keys[0]
    good = strategy.tensors("0.5")
    bad_cases = {
        "wrong_label": _update(strategy, "1.0", 0.0, 10),
        "bad_shape": _update(strategy, "0.5", 0.0, 10, **{name: np.zeros((3, 3), np.float32)}),
        "nonfinite": _update(strategy, "0.5", 0.0, 10, **{name: np.full(good[name].shape, np.nan, np.float32)}),
        "bad_dtype": _update(strategy, "0.5", 0.0, 10, **{name: np.zeros(good[name].shape, np.int32)}),
        "bad_samples": _update(strategy, "0.5", 0.0, 10_000),
    }
    for code, update in bad_cases.items():
        with pytest.raises(UpdateRejected) as err:
            strategy.check_update(records["0.5"], update)
        assert err.value.code == code
    missing = _update(strategy, "0.5", 0.0, 10)
    del missing.tensors[name]
    with pytest.raises(UpdateRejected, match="missing"):
        strategy.check_update(records["0.5"], missing)


def test_device_part_trains_on_real_digits_and_keeps_the_basis_orthogonal(mnist):
    strategy = make_flanc(mnist)
    records = fleet(strategy)
    plan = strategy.configure_train(0, records["0.5"])
    data = LocalData(mnist.x_train[:300], mnist.y_train[:300], 10)
    update = device_method("flanc")(plan, data, DeviceContext("dev-0.5", 0))
    strategy.check_update(records["0.5"], update)  # exactly what was asked for
    model = build_model(plan.model_spec)
    load_numpy_state(model, plan.tensors)
    before = evaluate(model, data.x, data.y)[1]
    load_numpy_state(model, update.tensors)
    after = evaluate(model, data.x, data.y)[1]
    assert after < 0.8 * before, (before, after)
    assert update.metrics["orth"] < 5.0
    assert any(not np.allclose(update.tensors[k], plan.tensors[k]) for k in strategy.basis_keys)
    bad = type(plan)(plan.method, plan.label, plan.model_spec, plan.tensors, {**plan.train, "orth_lambda": -1})
    with pytest.raises(ValueError, match="orth_lambda"):
        device_method("flanc")(bad, data, DeviceContext("dev-0.5", 0))


def test_state_round_trip(mnist):
    strategy = make_flanc(mnist)
    state = strategy.state_tensors()
    other = make_flanc(mnist)
    other.load_state_tensors({k: v + 1 for k, v in state.items()})
    assert all(np.allclose(other.state_tensors()[k], v + 1) for k, v in state.items())
    with pytest.raises(ValueError):
        other.load_state_tensors({k: v for k, v in list(state.items())[1:]})


@pytest.mark.slow
def test_flanc_end_to_end_over_a_real_broker(broker, tmp_path):
    """4 profiled devices, one per width; every width learns; the widths export to ONNX."""
    config = SimulationConfig(method="flanc", clients=4, partition="iid", out=str(tmp_path), broker_url=broker.url,
                              job="flanc-e2e", plots=False, throttle="off", profiles=tuple(PROFILES.values()),
                              options={"export": str(tmp_path / "onnx")},
                              federation=sim_federation(rounds=2, seed=0,
                                                        train=TrainConfig(epochs=1, batch_size=32, lr=0.05)))
    report = run_simulation(config).to_dict()
    assert {d["id"]: d["assignment"] for d in report["devices"]} == {
        "dev000": "0.25", "dev001": "0.5", "dev002": "0.75", "dev003": "1.0"}
    final = report["final"]["accuracy"]
    floor = {"0.25": 0.74, "0.5": 0.83, "0.75": 0.86, "1.0": 0.87}  # 0.777, 0.867, 0.896, 0.903 measured 2026-11-25
    assert set(final) == set(PROFILES) and all(final[w] > floor[w] for w in floor), final
    assert report["rejections"] == []
    models = report["models"]
    assert models["1.0"]["params"] < 0.45 * count_params(cnn4(norm="batchnorm"))
    for label, info in models.items():  # the plan: about 4 bytes per parameter (+ BN statistics, spec)
        assert 4 * info["params"] < info["payload_bytes"] < 4 * info["params"] * 1.2 + 8192
    exported = json.loads((tmp_path / "onnx" / "export.json").read_text())
    assert set(exported) == set(PROFILES)
    assert all(info["max_abs_diff"] < 1e-4 for info in exported.values())
