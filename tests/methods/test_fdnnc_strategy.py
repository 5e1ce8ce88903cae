"""FDNNC coordinator and device parts without a broker: options, labels, checks, aggregation."""
from __future__ import annotations

import numpy as np
import pytest

from coordinator.core.device_record import DeviceRecord
from coordinator.core.received_update import ReceivedUpdate
from coordinator.strategies.fdnnc import BIG, SMALL, Fdnnc
from edge_sdk.methods.settings.fdnnc import FdnncSettings
from coordinator.core.federation import EvalData, FederationConfig
from coordinator.strategies.base import StrategyContext
from coordinator.aggregate.validation import UpdateRejected
from edge_sdk.data.datasets import load_dataset
from edge_sdk.methods import DeviceContext, LocalData
from edge_sdk.methods.fdnnc import train_fdnnc
from edge_sdk.models.lowrank import compose, decompose
from edge_sdk.profiling import load_profile
from edge_sdk.protocol.messages import Update
from edge_sdk.training import TrainConfig


@pytest.fixture(scope="module")
def digits():
    return load_dataset("mnist-sample", seed=0)


def _strategy(digits, **options: str) -> Fdnnc:
    ctx = StrategyContext(
        federation=FederationConfig(rounds=4, train=TrainConfig(epochs=1, lr=1e-3, optimizer="adam")),
        model_family="mlp", input_shape=(1, 28, 28), num_classes=10,
        options={"hidden": "64,32", "rank": "8", **options})
    return Fdnnc.create(ctx)


def _device(name: str, profile: str, n: int = 200) -> DeviceRecord:
    return DeviceRecord(name, load_profile(profile), n)


def _plan_and_label(s: Fdnnc, rnd: int, devices: list[DeviceRecord]) -> None:
    for d in devices:
        d.label = s.assign(d)
    s._active = (BIG, SMALL)
    s.begin_round_plans(rnd, s.candidates([d.device_id for d in devices]))


def test_options_are_parsed_and_checked() -> None:
    o = Fdnnc.parse_options({"pattern": "switch", "upload": "full", "rank": "16", "hidden": "100, 50",
                                   "big_fraction": "0.7", "freeze": "false", "big_gflops": "5"})
    assert (o.pattern, o.upload, o.rank, o.hidden, o.big_fraction, o.freeze, o.big_gflops) == \
        ("switch", "full", 16, (100, 50), 0.7, False, 5.0)
    assert Fdnnc.parse_options({}) == FdnncSettings()
    assert Fdnnc.parse_options({"freeze": "True"}).freeze and not Fdnnc.parse_options({"freeze": "no"}).freeze
    for bad, match in [({"patern": "both"}, "unknown option"), ({"pattern": "Both"}, "both|bfirst|switch"),
                       ({"upload": "quarter"}, "full|half"), ({"rank": "0"}, ">= 1"), ({"rank": "x"}, "integer"),
                       ({"big_fraction": "1.5"}, r"\[0, 1\]"), ({"big_fraction": "nan"}, r"\[0, 1\]"),
                       ({"freeze": "maybe"}, "true|false"), ({"hidden": "64,-1"}, ">= 1"),
                       ({"half_split": "layers"}, "devices|rounds")]:
        with pytest.raises(ValueError, match=match):
            Fdnnc.parse_options(bad)


def test_models_labels_and_thresholds(digits) -> None:
    s = _strategy(digits)
    assert s.model_params() == {BIG: 784 * 64 + 64 + 64 * 32 + 32 + 330,
                                SMALL: 8 * (784 + 64) + 64 + 8 * (64 + 32) + 32 + 330}
    assert s.assign(_device("a", "raspberry-pi-3b")) == SMALL  # 1 GFLOPS, 1 GB
    assert s.assign(_device("b", "android-midrange")) == SMALL  # 8 GFLOPS < 10
    assert s.assign(_device("c", "raspberry-pi-5")) == BIG  # 12 GFLOPS, 8 GB
    assert _strategy(digits, big_ram_mb="10000").assign(_device("d", "jetson-orin-nano")) == SMALL  # 8 GB RAM
    with pytest.raises(ValueError, match="no fully-connected layer"):
        _strategy(digits, rank="64")


def test_stages_of_each_pattern(digits) -> None:
    both, bfirst, switch = (_strategy(digits, pattern=p) for p in ("both", "bfirst", "switch"))
    mixed = {BIG, SMALL}
    assert both.stages(0, mixed) == [(BIG, SMALL)]
    assert [bfirst.stages(r, mixed) for r in range(4)] == [[(BIG,)], [(BIG,)], [(SMALL,)], [(SMALL,)]]
    assert bfirst.stages(0, {SMALL}) == [(SMALL,)]  # nobody to pre-train: small devices train
    assert switch.stages(3, mixed) == [(BIG,), (SMALL,)]
    assert switch.stages(3, {BIG}) == [(BIG,)]


def test_half_upload_splits_small_devices_and_check_update_rejects_bad_updates(digits) -> None:
    s = _strategy(digits)
    assert _strategy(digits, freeze="true").settings.freeze is True
    devices = [_device(f"d{i}", "raspberry-pi-4b") for i in range(4)] + [_device("big", "laptop")]
    _plan_and_label(s, 0, devices)
    modes = {d.device_id: s.configure_train(0, d).train["upload"] for d in devices}
    assert modes == {"d0": "a", "d1": "b", "d2": "a", "d3": "b", "big": "full"}
    _plan_and_label(s, 1, devices)
    assert s.configure_train(1, devices[0]).train["upload"] == "b"  # devices alternate A/B per round
    by_rounds = _strategy(digits, half_split="rounds")
    for rnd, factor in ((0, "a"), (1, "b"), (2, "a")):  # every small device sends the same factor
        _plan_and_label(by_rounds, rnd, devices)
        assert {d.device_id: by_rounds.configure_train(rnd, d).train["upload"] for d in devices} == \
            {**{f"d{i}": factor for i in range(4)}, "big": "full"}
    plan = s.configure_train(1, devices[0])
    assert plan.label == SMALL and set(plan.tensors) == set(s.small_tensors()) and plan.train["freeze"] is False
    good = {k: v for k, v in plan.tensors.items() if k not in s.a_names}
    s.check_update(devices[0], Update(SMALL, good, 200, {"loss": 1.0}))  # accepted
    cases = [
        ({**good, "layers.1.A": plan.tensors["layers.1.A"]}, SMALL, 200, "bad_tensors"),  # sent A, asked for B
        ({k: v for k, v in good.items() if k != "layers.1.B"}, SMALL, 200, "bad_tensors"),
        ({**good, "layers.1.B": np.zeros((784, 9), np.float32)}, SMALL, 200, "bad_shape"),
        ({**good, "layers.1.B": np.full((784, 8), np.nan, np.float32)}, SMALL, 200, "nonfinite"),
        ({**good, "layers.1.B": np.zeros((784, 8), np.int32)}, SMALL, 200, "bad_dtype"),
        (good, BIG, 200, "wrong_label"),
        (good, SMALL, 201, "bad_samples"),
    ]
    for tensors, label, n, code in cases:
        with pytest.raises(UpdateRejected) as err:
            s.check_update(devices[0], Update(label, tensors, n, {}))
        assert err.value.code == code
    with pytest.raises(UpdateRejected) as err:
        s.check_update(_device("stranger", "raspberry-pi-4b"), Update(SMALL, good, 1, {}))
    assert err.value.code == "not_asked"


def _update(label: str, tensors: dict, n: int = 100) -> Update:
    return Update(label, {k: np.asarray(v, np.float32) for k, v in tensors.items()}, n, {"loss": 0.5})


def _Received(update: Update) -> ReceivedUpdate:
    return ReceivedUpdate("d", 0, update, 0)


def test_aggregation_formulas(digits) -> None:
    s = _strategy(digits)
    rng = np.random.default_rng(0)
    w_big = {k: rng.normal(size=v.shape) for k, v in s.dense.items()}
    a = {k: rng.normal(size=v.shape) for k, v in s.factors.items()}
    small_a = _update(SMALL, {**{k: w_big[k] for k in s.shared}, **{k: a[k] for k in s.a_names}})
    small_b = _update(SMALL, {**{k: w_big[k] for k in s.shared}, **{k: a[k] for k in s.b_names}})
    big = _update(BIG, w_big)
    # BOTH with half upload: each factor from its sender, then W+ = (A B^T + W) / 2, re-decomposed
    metrics = s.aggregate(0, [_Received(big), _Received(small_a), _Received(small_b)])
    expected_w = (compose(small_a.tensors["layers.1.A"], small_b.tensors["layers.1.B"]) + big.tensors["layers.1.weight"]) / 2
    np.testing.assert_allclose(s.dense["layers.1.weight"], expected_w, atol=1e-5)
    ref_a, ref_b = decompose(s.dense["layers.1.weight"], 8)
    np.testing.assert_allclose(s.factors["layers.1.A"], ref_a, atol=1e-5)
    np.testing.assert_allclose(s.factors["layers.1.B"], ref_b, atol=1e-5)
    assert metrics["up_factor_params_small"] == sum(a[k].size for k in s.a_names + s.b_names)
    assert metrics["n_big"] == 1 and metrics["n_small"] == 2
    # both_weight=samples: W+ = (n_big W + n_small A B^T) / (n_big + n_small)
    weighted = _strategy(digits, both_weight="samples")
    heavy = _update(BIG, w_big, n=300)
    weighted.aggregate(0, [_Received(heavy), _Received(small_a), _Received(small_b)])
    n_small = small_a.num_samples + small_b.num_samples
    low = compose(small_a.tensors["layers.1.A"], small_b.tensors["layers.1.B"])
    np.testing.assert_allclose(weighted.dense["layers.1.weight"],
                               (300 * w_big["layers.1.weight"] + n_small * low) / (300 + n_small), atol=1e-5)
    # only small devices (BFIRST fine-tuning / SWITCH second stage): W+ = A+ B+^T, factors kept
    full = _update(SMALL, {**{k: w_big[k] for k in s.shared}, **a})
    s.aggregate(1, [_Received(full)])
    np.testing.assert_allclose(s.factors["layers.3.A"], a["layers.3.A"], atol=1e-6)
    np.testing.assert_allclose(s.dense["layers.3.weight"], compose(full.tensors["layers.3.A"], full.tensors["layers.3.B"]), atol=1e-5)
    # only big devices: W+ = weighted mean of W, factors = its truncated SVD
    other = _update(BIG, {k: v + 1 for k, v in w_big.items()}, n=300)
    s.aggregate(2, [_Received(big), _Received(other)])
    np.testing.assert_allclose(s.dense["layers.1.weight"], w_big["layers.1.weight"] + 0.75, atol=1e-5)
    np.testing.assert_allclose(compose(s.factors["layers.1.A"], s.factors["layers.1.B"]),
                               compose(*decompose(s.dense["layers.1.weight"], 8)), atol=1e-4)
    # checkpoint round trip
    state = s.state_tensors()
    fresh = _strategy(digits)
    fresh.load_state_tensors(state)
    np.testing.assert_array_equal(fresh.factors["layers.1.B"], s.factors["layers.1.B"])
    with pytest.raises(ValueError, match="do not match"):
        fresh.load_state_tensors({k: v for k, v in state.items() if k != "factors/layers.1.A"})


def test_device_uploads_only_what_it_was_asked(digits) -> None:
    s = _strategy(digits)
    devices = [_device("s0", "raspberry-pi-3b"), _device("s1", "raspberry-pi-3b")]
    _plan_and_label(s, 0, devices)
    data = LocalData(digits.x_train[:200], digits.y_train[:200], 10)
    plan = s.configure_train(0, devices[0])
    update = train_fdnnc(plan, data, DeviceContext("s0", 0))
    assert plan.train["upload"] == "a" and set(update.tensors) == set(s.expected(SMALL, "a"))
    s.check_update(devices[0], update)
    assert not np.allclose(update.tensors["layers.1.A"], plan.tensors["layers.1.A"])  # it trained
    with pytest.raises(ValueError, match=r"^fdnnc: option upload: must be one of full\|a\|b"):
        train_fdnnc(type(plan)(plan.method, plan.label, plan.model_spec, plan.tensors,
                               {**plan.train, "upload": "c"}), data, DeviceContext("s0", 0))
    dense_plan = type(plan)(plan.method, BIG, s.dense_spec, s.dense, {**plan.train, "upload": "b"})
    with pytest.raises(ValueError, match="needs a low-rank model"):
        train_fdnnc(dense_plan, data, DeviceContext("s0", 0))


def test_evaluate_reports_both_models(digits) -> None:
    s = _strategy(digits)
    accuracy, loss = s.evaluate(0, EvalData(digits.x_test[:300], digits.y_test[:300]))
    assert set(accuracy) == {BIG, SMALL} and np.isfinite(loss)
    assert all(0.0 <= v <= 0.3 for v in accuracy.values())  # untrained: near chance


def test_a_minirocket_head_small_devices_train_folded_by_kernel() -> None:
    """On `minirocket` FDNNC factorises the classifier, the only layer that trains, folded by kernel
    (a row per class leaves an unfolded one nothing to save): BOTH averages the composed head with the
    big devices', the log scale's tail over the small devices that sent it; the state keeps the dense
    tensors under their own names (the round loop fits the MiniRocket biases there)."""
    from edge_sdk.models.folding import unfold_weight
    from edge_sdk.models.lowrank import compose_layer, decompose_layer
    from edge_sdk.models.zoo import model_for_dataset

    ctx = StrategyContext(federation=FederationConfig(rounds=2), model_family="minirocket", input_shape=(1, 64),
                          num_classes=3, options={"rank": "4"})
    created = Fdnnc.create(ctx)
    assert [layer["type"] for layer in created.small_spec["layers"]] == ["minirocket", "lowrank_linear"]
    assert created.state_spec() is created.dense_spec and "layers.0.biases" in created.state_tensors()
    assert created.method_config()["hidden"] == []  # the report says the head it trains

    s = Fdnnc(FederationConfig(rounds=2), Fdnnc.parse_options({"rank": "4"}),
              model_for_dataset("minirocket", (1, 64), 3, series_norm=True))
    head = s.small_spec["layers"][1]
    assert s.lowrank == [1] and s.tail_names == ["layers.1.tail"] and head["blocks"] == 84
    assert s.model_params()[SMALL] * 10 < s.model_params()[BIG]
    rng = np.random.default_rng(0)
    w_big = {k: rng.normal(size=v.shape) for k, v in s.dense.items()}
    f1 = {k: rng.normal(size=v.shape) for k, v in s.factors.items()}
    f2 = {k: rng.normal(size=v.shape) for k, v in s.factors.items()}
    shared = {k: w_big[k] for k in s.shared}
    small_a = _update(SMALL, {**shared, "layers.1.A": f1["layers.1.A"], "layers.1.tail": f1["layers.1.tail"]})
    small_b = _update(SMALL, {**shared, "layers.1.B": f2["layers.1.B"], "layers.1.tail": f2["layers.1.tail"]})
    s.aggregate(0, [_Received(_update(BIG, w_big)), _Received(small_a), _Received(small_b)])
    tail = (small_a.tensors["layers.1.tail"] + small_b.tensors["layers.1.tail"]) / 2
    low = compose_layer(small_a.tensors["layers.1.A"], small_b.tensors["layers.1.B"], tail, head)
    expected = (low + np.float32(w_big["layers.1.weight"])) / 2
    np.testing.assert_allclose(s.dense["layers.1.weight"], expected, atol=1e-4)
    a, b, kept_tail = decompose_layer(s.dense["layers.1.weight"], head)
    np.testing.assert_allclose(s.factors["layers.1.A"] @ s.factors["layers.1.B"].T, a @ b.T, atol=1e-4)
    np.testing.assert_allclose(s.factors["layers.1.tail"], expected[:, -1:], atol=1e-5)
    composed = unfold_weight(s.factors["layers.1.A"] @ s.factors["layers.1.B"].T, 3, 84, head["block"],
                             s.factors["layers.1.tail"])
    assert composed.shape == (3, head["in"])

    state = s.state_tensors()
    assert "layers.0.biases" in state and "factors/layers.1.tail" in state
    again = Fdnnc(FederationConfig(rounds=2), Fdnnc.parse_options({"rank": "4"}),
                  model_for_dataset("minirocket", (1, 64), 3, series_norm=True))
    again.load_state_tensors({(k if k.startswith("factors/") else f"dense/{k}"): v for k, v in state.items()})
    np.testing.assert_array_equal(again.dense["layers.1.weight"], s.dense["layers.1.weight"])  # a checkpoint
    np.testing.assert_array_equal(again.factors["layers.1.tail"], s.factors["layers.1.tail"])  # of before
