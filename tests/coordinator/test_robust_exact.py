"""Exact values of the robust rules, the weight shares and the norm screen (issue 35).

Every expected value below is worked out by hand in the comment beside it, on arrays small
enough to check on paper; all of them are exact in binary floating point unless the comment says
otherwise (then ``assert_allclose`` with a tight tolerance). A tensor a device sends is its
*model*, not its update: the tests write ``base + delta`` so that the deltas the rules see are
the small integers in the comments.
"""

from __future__ import annotations

import dataclasses
import math
import re

import numpy as np
import pytest

from coordinator.aggregate.averaging import capped_shares, check_weights, mean_train_loss, weighted_average
from coordinator.aggregate.robust import reference_norm, robust_aggregate
from edge_sdk.methods.settings.fedavg import FedAvgSettings
from edge_sdk.methods.settings.options import parse
from edge_sdk.methods.settings.shared import RobustConfig
from edge_sdk.protocol.messages import Update

F32 = np.float32


def vec(*values: float) -> np.ndarray:
    return np.array(values, dtype=F32)


def agg(current: dict, sets: list[dict], weights: list[float], trusted: float | None = None,
        **config) -> tuple[dict[str, np.ndarray], dict[str, float]]:
    return robust_aggregate(current, sets, weights, RobustConfig(**config), trusted_norm=trusted)


def one_coordinate(values: list[float], **config) -> float:
    """The rule's result for one coordinate (base 0) held by one device per value, equal weights."""
    out, _ = agg({"w": vec(0.0)}, [{"w": vec(v)} for v in values], [1.0] * len(values), **config)
    assert out["w"].dtype == F32 and out["w"].shape == (1,)
    return float(out["w"][0])


# ------------------------------------------------------------------------------- median

@pytest.mark.parametrize("values, expected", [
    ([7.0], 7.0),                          # 1 holder: its value
    ([1.0, 4.0], 2.5),                     # 2 holders: (1 + 4) / 2
    ([5.0, -3.0, 1.0], 1.0),               # 3: sorted -3 1 5 -> 1
    ([1.0, 3.0, 2.0, 10.0], 2.5),          # 4: sorted 1 2 3 10 -> (2 + 3) / 2 (another order statistic: 2 or 3)
    ([5.0, 1.0, 4.0, 2.0, 3.0], 3.0),      # 5: the third of 1..5
    ([100.0, 6.0, 0.0, 2.0, 1.0], 2.0),    # 5, lopsided: sorted 0 1 2 6 100 -> 2 (trimmed would give 3)
    ([100.0, 1.0, 5.0, 2.0, 4.0, 3.0], 3.5),  # 6: sorted 1 2 3 4 5 100 -> (3 + 4) / 2
    ([0.0, 1.0, 2.0, 4.0, 8.0, 100.0], 3.0),  # 6, lopsided: (2 + 4) / 2 (trimmed would give 3.75)
    ([-8.0, -1.0, -4.0, -2.0], -3.0),      # 4 negative: sorted -8 -4 -2 -1 -> (-4 + -2) / 2
])
def test_median_of_one_to_six_holders(values, expected):
    assert one_coordinate(values, rule="median", clip=None) == expected


def test_median_per_coordinate_ignores_weights():
    base = vec(10.0, 20.0, 30.0)
    deltas = [(1, 5, -2), (3, -1, 0), (2, 2, 7)]
    sets = [{"w": base + vec(*d)} for d in deltas]
    # columns: (1, 3, 2) -> 2; (5, -1, 2) -> 2; (-2, 0, 7) -> 0; the 100x weight of the third buys nothing
    out, _ = agg({"w": base}, sets, [1.0, 1.0, 100.0], rule="median", clip=None)
    np.testing.assert_array_equal(out["w"], vec(12.0, 22.0, 30.0))


# ------------------------------------------------------------------------------- trimmed mean

@pytest.mark.parametrize("values, trim, expected", [
    ([7.0], 0.1, 7.0),                     # 1 holder: nothing to trim
    ([1.0, 4.0], 0.4, 2.5),                # 2 holders: floor(0.8) = 0 trimmed -> (1 + 4) / 2
    ([9.0, 0.0, 3.0], 0.1, 3.0),           # 3 holders: floor(0.3) = 0, but at least 1 per side -> 3
    ([9.0, 0.0, 3.0], 0.0, 3.0),           # even trim=0 drops one per side from 3 holders
    ([0.0, 1.0, 3.0, 100.0], 0.1, 2.0),    # 4: 1 per side -> (1 + 3) / 2
    ([0.0, 1.0, 3.0, 100.0], 0.3, 2.0),    # 4: floor(1.2) = 1 -> (1 + 3) / 2
    ([0.0, 1.0, 2.0, 6.0, 100.0], 0.1, 3.0),   # 5: 1 per side -> (1 + 2 + 6) / 3
    ([0.0, 1.0, 2.0, 6.0, 100.0], 0.2, 3.0),   # 5: floor(1.0) = 1 -> (1 + 2 + 6) / 3
    ([0.0, 1.0, 2.0, 6.0, 100.0], 0.4, 2.0),   # 5: floor(2.0) = 2 -> the middle one, 2
    ([100.0, 8.0, 4.0, 2.0, 1.0, 0.0], 0.1, 3.75),  # 6: floor(0.6) = 0 -> 1 per side: (1+2+4+8) / 4
    ([100.0, 8.0, 4.0, 2.0, 1.0, 0.0], 0.34, 3.0),  # 6: floor(2.04) = 2 -> (2 + 4) / 2
    ([float(i) for i in (9, 0, 8, 1, 7, 2, 6, 3, 5, 4)], 0.49, 4.5),  # 10: floor(4.9) = 4 -> (4 + 5) / 2
    ([float(i) for i in (40, 0, 8, 1, 7, 2, 6, 3, 5, 4)], 0.2, 4.5),  # 10: floor(2.0) = 2 per side: (2+3+4+5+6+7)/6
])
def test_trimmed_mean_of_one_to_ten_holders(values, trim, expected):
    assert one_coordinate(values, rule="trimmed", trim=trim, clip=None) == expected


def test_trim_just_below_half_keeps_the_middle():
    # trim = 0.5 - 2**-54: floor(trim * k) is k/2 - 1 for even k (never k/2: the middle two stay),
    # (k - 1) / 2 for odd k (the middle one stays)
    trim = math.nextafter(0.5, 0.0)
    assert one_coordinate([1.0, 2.0, 3.0, 4.0, 50.0, -60.0], rule="trimmed", trim=trim, clip=None) == 2.5
    assert one_coordinate([1.0, 2.0, 3.0, 4.0, 50.0], rule="trimmed", trim=trim, clip=None) == 3.0


# ------------------------------------------------------------------------------- leading blocks

def _blocks():
    """A base of 4 coordinates; A holds the first 3, B the first 2, C the first 1, nobody the 4th."""
    base = vec(0.5, -1.0, 2.0, 7.0)
    sets = [{"w": base[:3] + vec(3.0, 6.0, 9.0)},   # A
            {"w": base[:2] + vec(1.0, 2.0)},        # B
            {"w": base[:1] + vec(5.0)}]             # C
    return {"w": base}, sets, base


@pytest.mark.parametrize("rule", ["median", "trimmed"])
def test_order_rules_over_blocks_of_different_sizes(rule):
    current, sets, base = _blocks()
    # coordinate 0: deltas 3, 1, 5 (3 holders) -> median 3, trimmed (one per side) 3
    # coordinate 1: 6, 2 (2 holders) -> 4 both; coordinate 2: 9 (1 holder) -> 9; coordinate 3: nobody -> 0
    out, _ = agg(current, sets, [1.0, 2.0, 3.0], rule=rule, clip=None)
    np.testing.assert_array_equal(out["w"], base + vec(3.0, 4.0, 9.0, 0.0))


@pytest.mark.parametrize("max_share", [1.0, 0.5])
def test_weighted_mean_over_blocks_of_different_sizes(max_share):
    current, sets, base = _blocks()
    # weights A=1, B=2, C=3 (no share is above 1/2: 3/6). Each coordinate averages its holders:
    # 0: (1*3 + 2*1 + 3*5) / 6 = 20/6; 1: (1*6 + 2*2) / 3 = 10/3; 2: 9 (A alone); 3: kept
    out, _ = agg(current, sets, [1.0, 2.0, 3.0], rule="mean", clip=None, max_share=max_share)
    np.testing.assert_allclose(out["w"], base + np.array([10 / 3, 10 / 3, 9.0, 0.0]), rtol=1e-6)
    assert out["w"][3] == base[3]  # exactly kept


def test_a_2d_tensor_with_row_and_column_blocks():
    base = np.arange(6, dtype=F32).reshape(2, 3)  # [[0 1 2] [3 4 5]]
    sets = [{"w": base[:1, :1] + 10}, {"w": base[:2, :2] + 2}, {"w": base[:1, :3] + 4}]
    # (0,0): deltas 10, 2, 4 -> median 4; (0,1): 2, 4 -> 3; (0,2): 4; (1,0), (1,1): 2 (B alone); (1,2): kept
    out, _ = agg({"w": base}, sets, [1.0, 1.0, 1.0], rule="median", clip=None)
    np.testing.assert_array_equal(out["w"], base + np.array([[4, 3, 4], [2, 2, 0]], dtype=F32))


# ------------------------------------------------------------------------------- weighted mean

def test_unequal_sample_counts_weight_the_mean():
    base = vec(1.0, 1.0)
    sets = [{"w": base + vec(4.0, 0.0)}, {"w": base + vec(8.0, -4.0)}]
    # (1 * (4, 0) + 3 * (8, -4)) / 4 = (28, -12) / 4 = (7, -3); two devices: no share cap
    for config in ({"clip": None, "max_share": 1.0},   # plain: weighted_average
                   {"clip": None, "max_share": 0.5}):  # the robust path (a cap that does not apply at 2)
        out, metrics = agg({"w": base}, sets, [1.0, 3.0], **config)
        np.testing.assert_array_equal(out["w"], base + vec(7.0, -3.0))
        assert "weight_capped" not in metrics  # no cap below 3 devices


def test_share_cap_from_three_devices():
    base = vec(0.0)
    sets = [{"w": vec(4.0)}, {"w": vec(8.0)}, {"w": vec(0.0)}]
    # weights 1, 1, 8 with max_share 1/2: the 8 is lowered to 2 (2 = 1/2 of 1 + 1 + 2) -> (4 + 8 + 0) / 4 = 3
    out, metrics = agg({"w": base}, sets, [1.0, 1.0, 8.0], clip=None, max_share=0.5)
    np.testing.assert_array_equal(out["w"], vec(3.0))
    assert metrics["weight_capped"] == 1.0
    # no cap: (4 + 8 + 0 * 8) / 10 = 1.2
    out, metrics = agg({"w": base}, sets, [1.0, 1.0, 8.0], clip=None, max_share=1.0)
    np.testing.assert_allclose(out["w"], vec(1.2), rtol=1e-7)
    assert "weight_capped" not in metrics
    # a cap that holds already: 1, 1, 2 -> nothing capped, (4 + 8) / 4 = 3
    out, metrics = agg({"w": base}, sets, [1.0, 1.0, 2.0], clip=None, max_share=0.5)
    np.testing.assert_array_equal(out["w"], vec(3.0))
    assert metrics["weight_capped"] == 0.0


def test_share_cap_with_four_devices_and_its_tolerance():
    sets = [{"w": vec(float(v))} for v in (1.0, 2.0, 3.0, 30.0)]
    # weights 1, 1, 1, 9 with max_share 1/2: 9 is lowered to c = (3 + c) / 2 -> 3: (1 + 2 + 3 + 3*30) / 6 = 16
    out, metrics = agg({"w": vec(0.0)}, sets, [1.0, 1.0, 1.0, 9.0], clip=None, max_share=0.5)
    np.testing.assert_array_equal(out["w"], vec(16.0))
    assert metrics["weight_capped"] == 1.0
    # fractional weights 0.1, 0.1, 0.8: the 0.8 is lowered to 0.2 (= 1/2 of 0.4), counted as capped
    _, metrics = agg({"w": vec(0.0)}, sets[:3], [0.1, 0.1, 0.8], clip=None, max_share=0.5)
    assert metrics["weight_capped"] == 1.0
    # weights 0.5, b, 1 with b = x - 0.5 and x = the double nearest 1 - 1e-12: the 1 is lowered to
    # c = 0.5 + b = x exactly, i.e. by 1e-12 of itself: within the tolerance, so not counted as capped
    x = 1 - 1e-12
    _, metrics = agg({"w": vec(0.0)}, sets[:3], [0.5, x - 0.5, 1.0], clip=None, max_share=0.5)
    assert metrics["weight_capped"] == 0.0


def test_the_plain_path_reports_no_norms():
    # plain averaging of whole tensors is the cheap path: no norms are computed or reported
    full = [{"w": vec(1.0, 2.0)}, {"w": vec(3.0, 4.0)}]
    out, metrics = agg({"w": vec(0.0, 0.0)}, full, [1.0, 1.0], clip=None, max_share=1.0)
    assert metrics == {}
    np.testing.assert_array_equal(out["w"], vec(2.0, 3.0))
    # a leading block takes the general path, which reports them: norms sqrt(5) and 3 (the block (3,))
    block = [{"w": vec(1.0, 2.0)}, {"w": vec(3.0)}]
    out, metrics = agg({"w": vec(0.0, 0.0)}, block, [1.0, 1.0], clip=None, max_share=1.0)
    assert metrics["update_norm_max"] == 3.0 and set(metrics) == {"update_norm_median", "update_norm_max"}
    np.testing.assert_array_equal(out["w"], vec(2.0, 2.0))  # (1 + 3) / 2, then 2 alone


def test_integer_tensors_take_the_rounded_weighted_mean_and_unheld_keep_their_value():
    current = {"w": vec(0.0), "n": np.array([10, 20, 30], dtype=np.int64)}
    sets = [{"w": vec(1.0), "n": np.array([11, 21], dtype=np.int64)},   # weight 1, holds n[:2]
            {"w": vec(1.0), "n": np.array([15], dtype=np.int64)}]       # weight 2, holds n[:1]
    # n[0]: (1*11 + 2*15) / 3 = 41/3 = 13.67 -> 14 (rounded, not truncated); n[1]: 21 (A alone); n[2]: kept 30
    for rule in ("mean", "median", "trimmed"):  # integers always take the weighted mean
        out, _ = agg(current, sets, [1.0, 2.0], rule=rule, clip=None)
        assert out["n"].dtype == np.int64
        np.testing.assert_array_equal(out["n"], [14, 21, 30])


def test_integer_tensors_on_the_plain_path_are_rounded():
    current = {"w": vec(0.0), "n": np.array([0, 0], dtype=np.int32)}
    sets = [{"w": vec(2.0), "n": np.array([10, 7], dtype=np.int32)},
            {"w": vec(4.0), "n": np.array([13, 7], dtype=np.int32)}]
    # equal weights: (10 + 13) / 2 = 11.5 -> 12 (round half to even; truncation would give 11); 7
    out, _ = agg(current, sets, [5.0, 5.0], clip=None, max_share=1.0)
    assert out["n"].dtype == np.int32 and out["w"].dtype == F32
    np.testing.assert_array_equal(out["n"], [12, 7])
    np.testing.assert_array_equal(out["w"], vec(3.0))


def test_no_tensor_sets_is_refused():
    for weights in ([], [1.0]):
        with pytest.raises(ValueError, match="need at least one tensor set"):
            agg({"w": vec(0.0)}, [], weights)


def test_a_zero_weight_leaves_a_device_out_of_the_mean():
    sets = [{"w": vec(2.0)}, {"w": vec(4.0)}]
    # weights 0 and 5 on two devices (no share cap below 3): the mean is the second's, 4
    for config in ({"clip": None}, {"clip": None, "max_share": 1.0}, {"clip": 100.0}):
        out, _ = agg({"w": vec(0.0)}, sets, [0.0, 5.0], **config)
        np.testing.assert_array_equal(out["w"], vec(4.0))


def test_bool_tensors_take_the_rounded_weighted_mean():
    current = {"w": vec(0.0), "flag": np.array([False, True, True])}
    sets = [{"w": vec(1.0), "flag": np.array([True, True, False])},   # weight 1
            {"w": vec(1.0), "flag": np.array([False, True])}]         # weight 3, holds flag[:2]
    # flag[0]: (1*1 + 3*0) / 4 = 0.25 -> False; flag[1]: 1 -> True; flag[2]: A alone, False
    out, _ = agg(current, sets, [1.0, 3.0], clip=None)
    assert out["flag"].dtype == np.bool_
    np.testing.assert_array_equal(out["flag"], [False, True, False])


def test_one_device_with_a_zero_trusted_reference():
    current = {"w": vec(1.0, 1.0), "n": np.array([5, 6])}
    # bound 0 * 1: the update (3, 4) is scaled to nothing and so is its weight; the counters then take
    # the plain mean over the devices: the one device's (7, 9)
    out, metrics = agg(current, [{"w": vec(4.0, 5.0), "n": np.array([7, 9])}], [3.0], clip="auto", trusted=0.0)
    np.testing.assert_array_equal(out["w"], vec(1.0, 1.0))
    np.testing.assert_array_equal(out["n"], [7, 9])
    assert (metrics["clip_bound"], metrics["clipped"]) == (0.0, 1.0)


def test_names_built_at_run_time_are_recognised():
    # strings read from a file or the command line are not the interned literals of the code:
    # the rules and "auto" must be compared by value
    median, trimmed, mean, auto = ("".join(p) for p in (("med", "ian"), ("trim", "med"), ("me", "an"), ("au", "to")))
    assert RobustConfig(clip=auto).clip_factor == 1.0
    assert RobustConfig(rule=mean, clip=None, max_share=1.0).plain
    assert one_coordinate([100.0, 6.0, 0.0, 2.0, 1.0], rule=median, clip=None) == 2.0  # trimmed: 3
    assert one_coordinate([0.0, 1.0, 2.0, 6.0, 100.0], rule=trimmed, clip=None) == 3.0
    assert one_coordinate([0.0, 1.0, 2.0, 6.0, 111.0], rule=mean, clip=None) == 24.0  # 120 / 5
    assert parse(RobustConfig, "fedavg", {"clip": auto, "aggregate": median}).clip_factor == 1.0
    current, sets = _two()
    _, metrics = agg(current, sets, [1.0, 1.0], clip=auto)
    assert metrics["clip_bound"] == 5.0


# ------------------------------------------------------------------------------- norm screen

def _two():
    """Two devices on base (0, 0): A's update (3, 4) has norm 5, B's (0, 20) norm 20."""
    return {"w": vec(0.0, 0.0)}, [{"w": vec(3.0, 4.0)}, {"w": vec(0.0, 20.0)}]


def test_clip_with_a_number_scales_and_down_weights():
    current, sets = _two()
    # bound 5: A (norm 5) is kept whole, B is scaled by 5/20 = 1/4 to (0, 5) and its weight 1 by 1/4:
    # weights 1 : 1/4 -> 4/5 : 1/5; mean = 4/5 (3, 4) + 1/5 (0, 5) = (2.4, 4.2)
    out, metrics = agg(current, sets, [1.0, 1.0], clip=5.0)
    np.testing.assert_allclose(out["w"], vec(2.4, 4.2), rtol=1e-7)
    assert metrics["clip_bound"] == 5.0 and metrics["clipped"] == 1.0  # a norm equal to the bound is not clipped
    assert metrics["update_norm_median"] == 12.5 and metrics["update_norm_max"] == 20.0
    assert "norm_reference" not in metrics  # an absolute bound needs no reference
    # the median rule takes the scaled updates, unweighted: ((3 + 0) / 2, (4 + 5) / 2)
    out, _ = agg(current, sets, [1.0, 1.0], clip=5.0, rule="median")
    np.testing.assert_array_equal(out["w"], vec(1.5, 4.5))


def test_clip_below_one_with_small_norms():
    current = {"w": vec(0.0, 0.0)}
    sets = [{"w": vec(0.3, 0.4)}, {"w": vec(0.0, 0.0)}]  # norms 0.5 and 0
    # bound 0.25: A scaled by 1/2 to (0.15, 0.2), weight 1/2; B (no change) kept, weight 1:
    # mean = (1/2 (0.15, 0.2) + 1 (0, 0)) / (3/2) = (0.05, 0.2/3)
    out, metrics = agg(current, sets, [1.0, 1.0], clip=0.25)
    np.testing.assert_allclose(out["w"], vec(0.05, 0.2 / 3), rtol=1e-6)
    assert metrics["clipped"] == 1.0


def test_clip_auto_and_kx_with_three_devices():
    current = {"w": vec(0.0, 0.0)}
    sets = [{"w": vec(3.0, 4.0)}, {"w": vec(0.0, 2.0)}, {"w": vec(30.0, 40.0)}]  # norms 5, 2, 50
    # auto: bound = the median norm 5; C scaled by 1/10 to (3, 4), weight 1/10:
    # ((3, 4) + (0, 2) + 0.1 (3, 4)) / 2.1 = (3.3, 6.4) / 2.1 = (11/7, 64/21)
    out, metrics = agg(current, sets, [1.0, 1.0, 1.0], clip="auto", trusted=1.0)  # trusted: unused from 3
    np.testing.assert_allclose(out["w"], [11 / 7, 64 / 21], rtol=1e-6)
    assert (metrics["norm_reference"], metrics["clip_bound"], metrics["clipped"]) == (5.0, 5.0, 1.0)
    # 2x: bound 10; C scaled by 1/5 to (6, 8), weight 1/5: (3 + 0 + 1.2, 4 + 2 + 1.6) / 2.2 = (21/11, 38/11)
    out, metrics = agg(current, sets, [1.0, 1.0, 1.0], clip="2x")
    np.testing.assert_allclose(out["w"], [21 / 11, 38 / 11], rtol=1e-6)
    assert (metrics["norm_reference"], metrics["clip_bound"]) == (5.0, 10.0)
    # 1.5x with sample weights 2, 1, 1: bound 7.5, C scaled by 0.15 to (4.5, 6), weight 0.15:
    # (2 (3, 4) + (0, 2) + 0.15 (4.5, 6)) / 3.15 = (6.675, 10.9) / 3.15
    out, _ = agg(current, sets, [2.0, 1.0, 1.0], clip="1.5x")
    np.testing.assert_allclose(out["w"], [6.675 / 3.15, 10.9 / 3.15], rtol=1e-6)


def test_clip_auto_with_two_devices_and_a_trusted_reference():
    current, sets = _two()  # norms 5 and 20
    # no trusted reference: the smaller norm, 5 -> as with the bound 5 above: (2.4, 4.2)
    out, metrics = agg(current, sets, [1.0, 1.0], clip="auto")
    np.testing.assert_allclose(out["w"], vec(2.4, 4.2), rtol=1e-7)
    assert metrics["norm_reference"] == 5.0
    # a larger trusted reference does not raise it
    _, metrics = agg(current, sets, [1.0, 1.0], clip="auto", trusted=100.0)
    assert metrics["norm_reference"] == 5.0 and metrics["clip_bound"] == 5.0
    # trusted 2 lowers it: A scaled by 2/5 to (1.2, 1.6), B by 1/10 to (0, 2); weights 0.4 : 0.1 -> 0.8 : 0.2
    # mean = 0.8 (1.2, 1.6) + 0.2 (0, 2) = (0.96, 1.68)
    out, metrics = agg(current, sets, [1.0, 1.0], clip="auto", trusted=2.0)
    np.testing.assert_allclose(out["w"], vec(0.96, 1.68), rtol=1e-6)
    assert (metrics["norm_reference"], metrics["clip_bound"], metrics["clipped"]) == (2.0, 2.0, 2.0)


def test_clip_auto_with_one_device():
    current = {"w": vec(0.0, 0.0)}
    alone = [{"w": vec(3.0, 4.0)}]
    # nothing to go by: the update passes whole and no bound is reported
    out, metrics = agg(current, alone, [7.0], clip="auto")
    np.testing.assert_array_equal(out["w"], vec(3.0, 4.0))
    assert "clip_bound" not in metrics and "norm_reference" not in metrics
    # a trusted reference 2, at 3x: bound 6 > 5, kept; at 1x (auto): scaled to (1.2, 1.6)
    out, metrics = agg(current, alone, [7.0], clip="3x", trusted=2.0)
    np.testing.assert_array_equal(out["w"], vec(3.0, 4.0))
    assert (metrics["clip_bound"], metrics["clipped"]) == (6.0, 0.0)
    out, metrics = agg(current, alone, [7.0], clip="auto", trusted=2.0)
    np.testing.assert_allclose(out["w"], vec(1.2, 1.6), rtol=1e-6)
    assert (metrics["norm_reference"], metrics["clip_bound"], metrics["clipped"]) == (2.0, 2.0, 1.0)


def test_a_zero_median_norm_stops_every_float_update():
    current = {"w": vec(1.0, 1.0), "n": np.array([0], dtype=np.int64)}
    sets = [{"w": vec(1.0, 1.0), "n": np.array([10])}, {"w": vec(1.0, 1.0), "n": np.array([20])},
            {"w": vec(4.0, 5.0), "n": np.array([40])}]
    # norms 0, 0, 5: median 0, so the bound is 0 and every scale is 0 (0 / 0 counts as 0, never NaN);
    # the float tensor stays where it was; all weights being 0, counters take the plain mean
    # (10 + 20 + 40) / 3 = 23.3 -> 23
    out, metrics = agg(current, sets, [1.0, 1.0, 1.0], clip="auto")
    np.testing.assert_array_equal(out["w"], vec(1.0, 1.0))
    np.testing.assert_array_equal(out["n"], [23])
    assert (metrics["clip_bound"], metrics["clipped"]) == (0.0, 3.0)


def test_norms_span_every_float_tensor_and_skip_integers():
    current = {"a": vec(0.0), "b": vec(0.0, 0.0), "n": np.array([0])}
    sets = [{"a": vec(2.0), "b": vec(1.0, 2.0), "n": np.array([1000])},        # sqrt(4 + 1 + 4) = 3
            {"a": vec(0.0), "b": vec(0.0, 6.0), "n": np.array([0])}]           # 6; the counter is not a norm
    # bound 3: the second scaled by 1/2 to (0, (0, 3)), weight 1/2: a = 2/3 * 2 = 4/3,
    # b = (2/3 (1, 2) + 1/3 (0, 3)) = (2/3, 7/3); n = 2/3 * 1000 + 1/3 * 0 = 666.7 -> 667
    out, metrics = agg(current, sets, [1.0, 1.0], clip=3.0)
    assert metrics["update_norm_max"] == 6.0 and metrics["update_norm_median"] == 4.5
    np.testing.assert_allclose(out["a"], [4 / 3], rtol=1e-6)
    np.testing.assert_allclose(out["b"], [2 / 3, 7 / 3], rtol=1e-6)
    np.testing.assert_array_equal(out["n"], [667])


@pytest.mark.parametrize("norms, trusted, expected", [
    ([5.0], None, None), ([5.0], 3.0, 3.0), ([5.0], 9.0, 9.0),   # one: only the trusted reference
    ([5.0, 2.0], None, 2.0), ([5.0, 2.0], 1.0, 1.0), ([5.0, 2.0], 9.0, 2.0),  # two: the smaller
    ([1.0, 9.0, 4.0], None, 4.0), ([1.0, 9.0, 4.0], 0.5, 4.0),  # three: the median, trusted ignored
    ([1.0, 9.0, 4.0, 6.0], None, 5.0),                          # four: (4 + 6) / 2
])
def test_reference_norm(norms, trusted, expected):
    assert reference_norm(np.array(norms), trusted) == expected


# ------------------------------------------------------------------------------- RobustConfig

@pytest.mark.parametrize("kwargs", [
    {"clip": -1.0}, {"clip": 0.0}, {"clip": 0}, {"clip": float("nan")}, {"clip": float("inf")}, {"clip": True},
    {"clip": "0.5x"}, {"clip": "x"}, {"clip": "3xx"}, {"clip": "1e6x"}, {"clip": "1000000x"}, {"clip": "2000000x"},
    {"clip": "-2x"},
    {"clip": "none"}, {"clip": "3"}, {"clip": [3]},
    {"trim": True}, {"trim": False}, {"trim": -0.1}, {"trim": 0.5}, {"trim": 0.7}, {"trim": "0.1"}, {"trim": float("nan")},
    {"max_share": 0}, {"max_share": 0.0}, {"max_share": 1.5}, {"max_share": -0.5}, {"max_share": True},
    {"max_share": float("nan")}, {"max_share": "0.5"},
    {"rule": "mode"}, {"rule": "Median"},
])
def test_robust_config_refuses_bad_values_built_directly(kwargs):
    with pytest.raises(ValueError):
        RobustConfig(**kwargs)


def test_robust_config_accepts_the_edges():
    assert RobustConfig(clip="1x").clip_factor == 1.0
    assert RobustConfig(clip="999999x").clip_factor == 999999.0
    assert RobustConfig(clip="2.5x").clip_factor == 2.5 and RobustConfig(clip="1.x").clip_factor == 1.0
    assert RobustConfig(clip="auto").clip_factor == 1.0
    assert RobustConfig(clip=1e-12).clip_factor is None and RobustConfig(clip=None).clip_factor is None
    assert RobustConfig(clip=3).clip == 3  # an int bound
    assert RobustConfig(trim=0).trim == 0 and RobustConfig(trim=0.49).trim == 0.49
    assert RobustConfig(max_share=1).max_share == 1 and RobustConfig(max_share=1e-9).max_share == 1e-9
    assert RobustConfig(rule="trimmed").rule == "trimmed"
    assert RobustConfig(clip=None, max_share=1.0).plain
    assert not RobustConfig(clip=None, max_share=0.99).plain
    assert not RobustConfig(clip=5.0, max_share=1.0).plain
    assert not RobustConfig(rule="median", clip=None, max_share=1.0).plain
    defaults = RobustConfig()
    assert (defaults.rule, defaults.trim, defaults.clip, defaults.max_share) == ("mean", 0.1, "3x", 0.5)


def test_robust_config_is_an_immutable_value():
    config = RobustConfig(rule="median")
    with pytest.raises(dataclasses.FrozenInstanceError):
        config.rule = "mean"  # type: ignore[misc]
    assert len({config, RobustConfig(rule="median"), RobustConfig()}) == 2


def test_robust_config_from_options_edges():
    def rule(options: dict[str, str], method: str) -> RobustConfig:
        return parse(RobustConfig, method, options)

    assert rule({"clip": "off"}, "fedavg").clip is None
    assert rule({"clip": "1x"}, "fedavg").clip == "1x"
    assert rule({"clip": "0.5"}, "fedavg").clip == 0.5 and rule({"clip": "1e-12"}, "fedavg").clip == 1e-12
    assert rule({"trim": "0"}, "fedavg").trim == 0.0 and rule({"trim": "0.25"}, "fedavg").trim == 0.25
    assert rule({"max_share": "0.25"}, "fedavg").max_share == 0.25 and rule({"max_share": "1"}, "fedavg").max_share == 1
    assert rule({"aggregate": "trimmed"}, "fedavg").rule == "trimmed"
    # the rule is a group of every weight-averaging method's settings, parsed with them
    assert parse(FedAvgSettings, "fedavg", {"aggregate": "median", "width": "0.5"}).robust.rule == "median"
    with pytest.raises(ValueError, match=r"option clip: expected none, auto, a multiple such as 3x, or a number > 0, got 'x'$"):
        rule({"clip": "x"}, "fedavg")
    for bad in ("0", "0x", "0.99x", "1e6x", "auto2", "", "1e301"):
        with pytest.raises(ValueError, match="option clip: "):
            rule({"clip": bad}, "fedavg")
    # the option parser names the accepted range and the text it was given
    with pytest.raises(ValueError, match=r"option clip: expected none, auto, a multiple such as 3x, or a number > 0, got '0'$"):
        rule({"clip": "0"}, "fedavg")
    with pytest.raises(ValueError, match=r"option clip: a multiple Kx needs 1 <= K < 1e6, got '0\.5x'$"):
        rule({"clip": "0.5x"}, "fedavg")
    for key, text, bounds in (("trim", "-0.1", r"\[0, 0\.5\)"), ("trim", "0.5", r"\[0, 0\.5\)"),
                              ("max_share", "-0.5", r"\[0, 1\]"), ("max_share", "1.5", r"\[0, 1\]")):
        with pytest.raises(ValueError, match=rf"option {key}: must be in {bounds}, got '{re.escape(text)}'$"):
            rule({key: text}, "fedavg")
    with pytest.raises(ValueError, match=r"^fedavg: option max_share: must be in \(0, 1\], got 0\.0$"):
        rule({"max_share": "0"}, "fedavg")  # 0 parses, and the config refuses it


# ------------------------------------------------------------------------------- aggregation.py

@pytest.mark.parametrize("weights, max_share, expected", [
    ([1.0, 2.0, 3.0], 0.5, [1.0, 2.0, 3.0]),          # 3 is exactly 1/2 of 6: unchanged
    ([1.0, 1.0, 8.0], 0.5, [1.0, 1.0, 2.0]),          # one capped: c = (1 + 1 + c) / 2 -> c = 2
    ([1.0, 1.0, 1.0, 1.0, 10.0, 10.0], 0.25, [1.0, 1.0, 1.0, 1.0, 2.0, 2.0]),  # two: c = (4 + 2c) / 4 -> 2
    ([1.0, 2.0, 3.0, 10.0, 20.0, 30.0], 0.25, [1.0, 2.0, 3.0, 6.0, 6.0, 6.0]),  # three: c = (6 + 3c) / 4 -> 6
    ([1.0, 5.0], 0.5, [1.0, 1.0]),                    # two weights at 1/2: c = 1 + c... -> both 1
    ([1.0, 2.0, 9.0], 0.3, [4.0, 4.0, 4.0]),          # 3 < 1/0.3 weights: the cap cannot hold -> equal, same sum
    ([2.0, 6.0], 0.4, [4.0, 4.0]),                    # 2 < 1/0.4: equal
    ([3.0], 0.5, [3.0]),                              # one weight: equal to itself
    ([1.0, 2.0, 9.0], 1.0, [1.0, 2.0, 9.0]),          # max_share 1: never capped
])
def test_capped_shares(weights, max_share, expected):
    got = capped_shares(weights, max_share)
    np.testing.assert_allclose(got, expected, rtol=1e-12)
    if len(weights) * max_share >= 1:
        assert got.max() <= max_share * got.sum() * (1 + 1e-12)


def test_a_weight_exactly_at_the_cap_is_left_bit_for_bit():
    # 3 is exactly 0.6 of 5 (0.6 * 5 == 3.0 in binary): nothing to cap. Capping anyway would compute
    # c = 0.6 * 2 / 0.4, which rounds to 2.9999999999999996
    got = capped_shares([2.0, 3.0], 0.6)
    np.testing.assert_array_equal(got, [2.0, 3.0])


def test_capped_shares_with_zero_weights():
    # one positive weight among three: no cap can hold it to 1/2 but the all-zero one (c = 0, a total of 0,
    # which made robust_aggregate's mean NaN), so the weights become equal, as when too few report
    np.testing.assert_array_equal(capped_shares([0.0, 0.0, 3.0], 0.5), [1.0, 1.0, 1.0])
    np.testing.assert_array_equal(capped_shares([0.0, 0.0, 1.0, 1.0], 0.4), [0.5, 0.5, 0.5, 0.5])
    # zeros beside enough positive weights are fine: 0, 1, 1, 8 at 1/2 -> 8 lowered to c = (2 + c) / 2 = 2
    np.testing.assert_array_equal(capped_shares([0.0, 1.0, 1.0, 8.0], 0.5), [0.0, 1.0, 1.0, 2.0])
    sets = [{"w": vec(2.0)}, {"w": vec(4.0)}, {"w": vec(9.0)}]
    out, _ = agg({"w": vec(0.0)}, sets, [0.0, 0.0, 5.0], clip=None)  # equal weights: (2 + 4 + 9) / 3 = 5
    np.testing.assert_array_equal(out["w"], vec(5.0))


def test_capped_shares_holds_the_cap_through_rounding():
    # max_share 1/3 and 2, 1, 1, 1e-20: exactly, c = 1 caps the 2 (1/3 of 3); in binary every cap tried
    # rounds to 0.9999999999999998, below the next weight, so the weights become equal. Either way no
    # weight may end above a third of the total
    got = capped_shares([1e-20, 1.0, 1.0, 2.0], 1 / 3)
    assert got.max() <= got.sum() / 3 * (1 + 1e-12)


def test_capped_shares_refuses_bad_max_share():
    for bad in (0.0, -0.5, 1.5, float("nan")):
        with pytest.raises(ValueError):
            capped_shares([1.0, 2.0, 3.0], bad)


@pytest.mark.parametrize("weights", [[], [-1.0, 2.0], [0.0, 0.0], [1.0, float("nan")], [1.0, float("inf")],
                                     [float("-inf"), 1.0], [[1.0, 2.0]], [-0.0]])
def test_check_weights_refuses(weights):
    with pytest.raises(ValueError):
        check_weights(weights)
    with pytest.raises(ValueError):
        weighted_average([{"w": vec(1.0)}] * max(1, len(weights)), weights)
    with pytest.raises(ValueError):
        capped_shares(weights, 0.5)


def test_check_weights_messages():
    with pytest.raises(ValueError, match="^need a non-empty list of weights$"):
        check_weights([])
    with pytest.raises(ValueError, match="^weights must be finite and non-negative with a positive sum$"):
        check_weights([0.0])


def test_check_weights_accepts_zeros_beside_a_positive_one():
    w = check_weights(iter([0, 2, 1e-300]))
    assert w.dtype == np.float64
    np.testing.assert_array_equal(w, [0.0, 2.0, 1e-300])


def test_weighted_average_exact():
    sets = [{"a": vec(4.0, 0.0), "b": np.array([[1.0]], dtype=F32)},
            {"a": vec(8.0, -4.0), "b": np.array([[5.0]], dtype=F32)}]
    # weights 1 : 3 -> a = (1*(4, 0) + 3*(8, -4)) / 4 = (7, -3); b = (1 + 15) / 4 = 4
    out = weighted_average(sets, [1.0, 3.0])
    assert set(out) == {"a", "b"} and out["a"].dtype == F32 and out["b"].shape == (1, 1)
    np.testing.assert_array_equal(out["a"], vec(7.0, -3.0))
    np.testing.assert_array_equal(out["b"], [[4.0]])
    # a zero weight leaves its set out: (0*(4, 0) + 2*(8, -4)) / 2
    np.testing.assert_array_equal(weighted_average(sets, [0.0, 2.0])["a"], vec(8.0, -4.0))
    # one set: itself; 300 sets of k: (1 + 2 + ... + 300) / 300 = 150.5
    np.testing.assert_array_equal(weighted_average(sets[:1], [2.0])["a"], vec(4.0, 0.0))
    many = [{"a": vec(float(k))} for k in range(1, 301)]
    np.testing.assert_array_equal(weighted_average(many, [1.0] * 300)["a"], vec(150.5))
    for weights in ([1.0], [1.0, 1.0, 1.0]):  # one weight for two sets, three for two: said so, not zip's error
        with pytest.raises(ValueError, match="^need one weight per tensor set"):
            weighted_average(sets, weights)
    with pytest.raises(ValueError):
        weighted_average(sets, [1.0, 1.0, 1.0])


def test_mean_train_loss_weights_by_samples():
    a = Update("l", {}, 1, {"loss": 1.0})
    b = Update("l", {}, 3, {"loss": 3.0})
    assert mean_train_loss([a, b]) == 2.5  # (1*1 + 3*3) / 4
    assert math.isnan(mean_train_loss([a, Update("l", {}, 2, {})]))  # one did not report its loss
