"""Stale updates in buffered asynchronous aggregation: their weight and their restatement."""

from __future__ import annotations

import numpy as np
import pytest

from coordinator.aggregate.staleness import restate_update, staleness_weight
from coordinator.core.asynchronous import check_staleness


def test_fedbuffs_weight_is_one_over_the_root_of_one_plus_the_staleness() -> None:
    assert staleness_weight("sqrt", 0) == 1.0
    assert staleness_weight("sqrt", 3) == pytest.approx(0.5)
    assert staleness_weight("poly:1", 3) == pytest.approx(0.25)
    assert staleness_weight("poly:0.5", 8) == pytest.approx(staleness_weight("sqrt", 8))
    assert staleness_weight("constant", 50) == 1.0


@pytest.mark.parametrize("rule", ["", "square", "poly:", "poly:x", "poly:-1", "poly:nan", 3, None])
def test_an_unknown_staleness_rule_is_a_one_line_error(rule) -> None:
    with pytest.raises(ValueError, match="staleness must be one of"):
        check_staleness(rule)


def test_a_stale_update_moves_the_current_model_by_its_weighted_change() -> None:
    then = {"w": np.array([1.0, 2.0], np.float32), "n": np.array(3, np.int64)}
    now = {"w": np.array([5.0, 5.0], np.float32), "n": np.array(9, np.int64)}
    update = {"w": np.array([2.0, 0.0], np.float32), "n": np.array(4, np.int64)}
    out = restate_update(now, then, update, staleness_weight("sqrt", 3))
    np.testing.assert_allclose(out["w"], [5.5, 4.0])  # now + 0.5 * (update - then)
    assert out["w"].dtype == np.float32
    assert int(out["n"]) == 4  # a counter is taken as sent


def test_a_fresh_update_is_restated_as_itself() -> None:
    base = {"w": np.arange(4, dtype=np.float32)}
    update = {"w": np.array([0.5, 1.5, 2.5, 3.5], np.float32)}
    np.testing.assert_array_equal(restate_update(base, base, update, 1.0)["w"], update["w"])


@pytest.mark.parametrize("update", [{"w": np.zeros(3, np.float32)}, {"other": np.zeros(2, np.float32)}])
def test_an_update_not_of_what_was_sent_cannot_be_restated(update) -> None:
    sent = {"w": np.zeros(2, np.float32)}
    with pytest.raises(ValueError, match="does not match what the device was sent"):
        restate_update(sent, sent, update, 1.0)
