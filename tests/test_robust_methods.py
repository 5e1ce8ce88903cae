"""Robust aggregation in every method that averages weights, not only FedAvg.

One round of real local training on digits by 7 devices of mixed widths (FLANC, HeteroFL,
FedPara) or big/small models (FDNNC); device d0 uploads its update sign-flipped and scaled.
Plain averaging is dragged far from the honest aggregate; median, trimmed mean and clipping stay
close. Narrow devices send leading blocks, so each coordinate is combined over its holders; the
width-1.0 coordinates have 4 holders, so the trimmed mean needs trim >= 0.25 to drop one.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from coordinator.strategies import create_strategy
from coordinator.runtime.federation import FederationConfig
from coordinator.strategies.base import StrategyContext
from edge_sdk.data import load_dataset

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "bench"))
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
