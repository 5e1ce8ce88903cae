"""Windows by count and by time; a gap, an out-of-order time or a bad reading starts a new window
and is counted."""

from __future__ import annotations

import numpy as np

from edge_sdk.serving.windows import WindowBuilder


def test_windows_by_count_with_a_stride() -> None:
    builder = WindowBuilder(1, 4, stride=2)
    windows = [w for t in range(10) for w in builder.add(0, float(t), 100.0 + t)]
    assert [w.values[0].tolist() for w in windows] == [[0, 1, 2, 3], [2, 3, 4, 5], [4, 5, 6, 7], [6, 7, 8, 9]]
    assert (windows[0].start, windows[0].end) == (100.0, 103.0) and builder.counts.windows == 4


def test_windows_by_time_hold_the_last_value_of_a_plug_that_reports_on_change() -> None:
    builder = WindowBuilder(1, 5, period_s=10.0)
    out = []
    for at, watts in ((0.0, 0.0), (23.0, 1500.0), (31.0, 1480.0), (55.0, 0.0)):  # on change only
        out += builder.add(0, watts, at)
    # points at 0, 10, 20, 30, 40: the value in effect at each
    (window,) = out
    np.testing.assert_array_equal(window.values[0], [0.0, 0.0, 0.0, 1500.0, 1480.0])
    assert (window.start, window.end) == (0.0, 40.0)


def test_two_channels_by_time() -> None:
    builder = WindowBuilder(2, 3, period_s=1.0)
    out = []
    for channel, value, at in ((0, 1.0, 0.0), (1, 10.0, 0.5), (0, 2.0, 1.5), (1, 20.0, 2.2), (0, 3.0, 3.1)):
        out += builder.add(channel, value, at)
    (window,) = out  # the first point when both channels have a value: 0.5, then 1.5, 2.5
    np.testing.assert_array_equal(window.values, [[1.0, 2.0, 2.0], [10.0, 10.0, 20.0]])


def test_a_gap_an_old_reading_and_a_bad_one_each_start_a_new_window() -> None:
    builder = WindowBuilder(1, 3, max_gap_s=5.0)
    assert builder.add(0, 1.0, 0.0) == [] and builder.add(0, 2.0, 1.0) == []
    assert builder.add(0, 3.0, 60.0) == []  # a gap: 1, 2 dropped
    assert builder.add(0, 4.0, 59.0) == []  # older than the one before
    builder.note_bad()
    out = [w for t in range(3) for w in builder.add(0, 10.0 + t, 70.0 + t)]
    assert [w.values[0].tolist() for w in out] == [[10.0, 11.0, 12.0]]
    counts = builder.counts
    assert (counts.gaps, counts.out_of_order, counts.bad, counts.windows) == (1, 1, 1, 1)
