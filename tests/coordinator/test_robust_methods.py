"""Robust aggregation in every method that averages weights, not only FedAvg.

One round of real local training on digits by 7 devices of mixed widths (FLANC, HeteroFL,
FedPara) or big/small models (FDNNC); device d0 uploads its update sign-flipped and scaled.
Plain averaging is dragged far from the honest aggregate; median, trimmed mean and clipping stay
close. Narrow devices send leading blocks, so each coordinate is combined over its holders; the
width-1.0 coordinates have 4 holders, so the trimmed mean needs trim >= 0.25 to drop one.
"""

from __future__ import annotations

import sys

import pytest

from coordinator.strategies import create_strategy
from coordinator.core.federation import FederationConfig
from coordinator.strategies.base import StrategyContext
from edge_sdk.data.datasets import load_dataset

from tests.support.paths import REPO_ROOT
sys.path.insert(0, str(REPO_ROOT / "bench"))
from bench_robust import METHODS, PLAIN, RULES, distance, float_state, poisoned_round  # noqa: E402


@pytest.fixture(scope="module")
def digits():
    return load_dataset("digits")


def _round(method: str, digits, robust: dict[str, str], scale: float | None) -> dict:
    return float_state(poisoned_round(method, digits, robust, scale))


@pytest.mark.parametrize("method", sorted(METHODS))
def test_one_poisoner_among_mixed_widths_moves_the_mean_but_not_the_robust_rules(method, digits):
    start = _round(method, digits, {"clip": "1e-12"}, None)  # (practically) no step at all
    honest = _round(method, digits, PLAIN, None)
    step = distance(honest, start)
    assert step > 0
    off = {name: distance(_round(method, digits, robust, -20.0), honest) / step for name, robust in RULES.items()}
    assert off["mean"] > 1.0, off
    for name in ("median", "trimmed 0.25", "clip auto"):
        assert off[name] < 0.6, (method, name, off)
    # the default screen scales d0 back to 3x the median norm: a third or less of the plain mean's damage
    # (it may still move the mean about one honest step: docs/robust_aggregation.md, "Limits")
    assert off["default (clip 3x)"] < off["mean"] / 3, (method, off)


def test_unknown_robust_values_are_refused_by_every_method(digits):
    for method in METHODS:
        ctx = StrategyContext(FederationConfig(rounds=1), "mlp", digits.input_shape, digits.num_classes,
                              options={**METHODS[method], "aggregate": "mode"})
        with pytest.raises(ValueError, match="aggregate"):
            create_strategy(method, ctx)


def _honest_fedavg_job(digits, options: dict[str, str], rounds: int = 3) -> tuple[float, float]:
    """A small FedAvg job with every default but ``options``: 8 devices of unequal Dirichlet shards
    of digits (47 to 400 samples: local steps, and so update norms, differ), ``rounds`` rounds of
    real local training; the global model's test accuracy and the updates the screen scaled back."""
    from coordinator.core.federation import EvalData
    from coordinator.core.device_record import DeviceRecord
    from coordinator.core.received_update import ReceivedUpdate
    from edge_sdk.methods import DeviceContext, LocalData, device_method
    from edge_sdk.data.partition import partition
    from edge_sdk.profiling import load_profile
    from edge_sdk.training import TrainConfig

    ctx = StrategyContext(FederationConfig(rounds=rounds, seed=0, train=TrainConfig(epochs=2, lr=0.05)), "mlp",
                          digits.input_shape, digits.num_classes, options=options)
    strategy = create_strategy("fedavg", ctx)
    shards = partition(digits.y_train, 8, "dirichlet:0.5", seed=3, min_size=40)
    records = [DeviceRecord(f"d{i}", load_profile("raspberry-pi-4b"), len(s)) for i, s in enumerate(shards)]
    for record in records:
        record.label = strategy.assign(record)
    clipped = 0.0
    for rnd in range(rounds):
        received = []
        for record, shard in zip(records, shards):
            plan = strategy.configure_train(rnd, record)
            update = device_method(plan.method)(plan, LocalData(digits.x_train[shard], digits.y_train[shard], 10),
                                                DeviceContext(record.device_id, rnd, seed=1))
            strategy.check_update(record, update)
            received.append(ReceivedUpdate(record.device_id, rnd, update, 0))
        clipped += strategy.aggregate(rnd, received).get("clipped", 0.0)
    assert min(map(len, shards)) < max(map(len, shards)) / 4, [len(s) for s in shards]
    return strategy.evaluate(rounds - 1, EvalData(digits.x_test, digits.y_test))[0]["global"], clipped


def test_the_default_screen_costs_an_honest_fedavg_fleet_nothing(digits):
    """Issue 56: a default that screens honest updates must not cost the fleet accuracy. The default
    (clip 3x the median norm, max_share 0.5) ends within 0.5 point of the unscreened mean on unequal
    shards (0.875 both, nothing scaled back, measured 2026-11-28); a screen that does bite honest
    updates is caught (clip=0.05, an absolute bound: 0.134; clip=auto, 1x the median: 0.827)."""
    screened, clipped = _honest_fedavg_job(digits, {})
    plain, _ = _honest_fedavg_job(digits, {"clip": "none", "max_share": "1"})
    assert screened >= plain - 0.005, (screened, plain, clipped)
    biting, bitten = _honest_fedavg_job(digits, {"clip": "0.05"})
    assert bitten > 0 and biting < plain - 0.005, (biting, plain)  # what the first assertion guards against
