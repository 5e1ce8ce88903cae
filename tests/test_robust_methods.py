"""Robust aggregation in every method that averages weights, not only FedAvg.

One round of real local training on digits by 7 devices of mixed widths (FLANC, HeteroFL,
FedPara) or big/small models (FDNNC); device d0 uploads its update sign-flipped and scaled.
Plain averaging is dragged far from the honest aggregate; median, trimmed mean and clipping stay
close. Narrow devices send leading blocks, so each coordinate is combined over its holders; the
width-1.0 coordinates have 4 holders, so the trimmed mean needs trim >= 0.25 to drop one.
"""

from __future__ import annotations

import math

import numpy as np
import pytest

from coordinator.fleet import DeviceRecord, ReceivedUpdate
from coordinator.strategies import create_strategy
from coordinator.strategy import FederationConfig, StrategyContext
from edge_sdk.data import load_dataset
from edge_sdk.methods import DeviceContext, LocalData, device_method
from edge_sdk.partition import partition
from edge_sdk.profiling import DeviceProfile
from edge_sdk.protocol.messages import Update
from edge_sdk.training import TrainConfig

DEVICES = 7
WIDE = ("d0", "d1", "d2", "d3")  # width 1.0 (d0 poisons); the others 0.5
METHODS = {
    "heterofl": {"widths": "0.5,1", "norm": "none"},
    "flanc": {"widths": "0.5,1"},
    "fedpara": {"widths": "0.5,1", "gamma": "0.3"},
    "fdnnc": {"big_gflops": "20", "upload": "full", "hidden": "64", "rank": "8"},
}


@pytest.fixture(scope="module")
def digits():
    return load_dataset("digits")


def _options(method: str, robust: dict[str, str]) -> dict[str, str]:
    options = dict(METHODS[method], **robust)
    if method != "fdnnc":
        options["override"] = ",".join(f"d{i}:{'1.0' if f'd{i}' in WIDE else '0.5'}" for i in range(DEVICES))
    return options


def _round(method: str, digits, robust: dict[str, str], scale: float | None) -> dict[str, np.ndarray]:
    """The global state after one round; d0's update scaled by ``scale`` around its plan."""
    ctx = StrategyContext(FederationConfig(rounds=1, seed=0, train=TrainConfig(epochs=1, max_steps=15, lr=0.05)),
                          "mlp", digits.input_shape, digits.num_classes, options=_options(method, robust))
    strategy = create_strategy(method, ctx)
    shards = partition(digits.y_train, DEVICES, "iid", seed=0)
    records = []
    for i in range(DEVICES):
        gflops = 50.0 if f"d{i}" in WIDE else 5.0  # FDNNC: the wide ones are big
        profile = DeviceProfile(name=f"g{gflops:g}", gflops=gflops, ram_mb=4096, cpu_count=4, uplink_mbps=50,
                                downlink_mbps=50)
        record = DeviceRecord(f"d{i}", profile, len(shards[i]))
        record.label = strategy.assign(record)
        records.append(record)
    strategy.begin_stage(0, ("big", "small") if method == "fdnnc" else None)
    strategy.sample([r.device_id for r in records])
    received = []
    for record, shard in zip(records, shards):
        plan = strategy.configure_train(0, record)
        update = device_method(plan.method)(plan, LocalData(digits.x_train[shard], digits.y_train[shard], 10),
                                            DeviceContext(record.device_id, 0, seed=1))
        if record.device_id == "d0" and scale is not None:
            tensors = {k: (plan.tensors[k] + scale * (v - plan.tensors[k])).astype(v.dtype)
                       if v.dtype.kind == "f" and k in plan.tensors and plan.tensors[k].shape == v.shape else v
                       for k, v in update.tensors.items()}
            update = Update(update.label, tensors, update.num_samples, update.metrics)
        strategy.check_update(record, update)
        received.append(ReceivedUpdate(record.device_id, 0, update, 0))
    assert {r.label for r in records} == ({"big", "small"} if method == "fdnnc" else {"0.5", "1.0"})
    strategy.aggregate_train(0, received)
    # FDNNC's factors are re-derived from the dense weights by SVD, whose signs are arbitrary:
    # compare the dense weights they come from
    return {k: np.asarray(v, dtype=np.float64) for k, v in strategy.state_tensors().items()
            if np.asarray(v).dtype.kind == "f" and not k.startswith("factors/")}


def _distance(a: dict, b: dict) -> float:
    return math.sqrt(sum(float(np.sum((a[k] - b[k]) ** 2)) for k in a))


@pytest.mark.parametrize("method", sorted(METHODS))
def test_one_poisoner_among_mixed_widths_moves_the_mean_but_not_the_robust_rules(method, digits):
    start = _round(method, digits, {"clip": "1e-12"}, None)  # (practically) no step at all
    honest = _round(method, digits, {}, None)
    step = _distance(honest, start)
    assert step > 0
    off = {}
    for name, robust in (("mean", {}), ("median", {"aggregate": "median"}),
                         ("trimmed", {"aggregate": "trimmed", "trim": "0.25"}), ("clip", {"clip": "auto"})):
        off[name] = _distance(_round(method, digits, robust, -20.0), honest) / step
    assert off["mean"] > 1.0, off
    for name in ("median", "trimmed", "clip"):
        assert off[name] < 0.6, (method, name, off)


def test_unknown_robust_values_are_refused_by_every_method(digits):
    for method in METHODS:
        ctx = StrategyContext(FederationConfig(rounds=1), "mlp", digits.input_shape, digits.num_classes,
                              options={**METHODS[method], "aggregate": "mode"})
        with pytest.raises(ValueError, match="aggregate"):
            create_strategy(method, ctx)
