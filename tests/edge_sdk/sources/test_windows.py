"""A log of sensor readings (CSV or SQLite) cut into (C, L) windows: the label rules, the keys and
contents that stay put as the log grows, the newest windows kept, and one-line errors."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import numpy as np
import pytest

from edge_sdk.device_config import data_source_from_toml
from edge_sdk.sources import NoData

T0 = 1_700_000_000


def write_log(path: Path, labels: list[str]) -> Path:
    rows = [f"{T0 + i},{i},{-2 * i},{label}" for i, label in enumerate(labels)]
    path.write_text("ts,ax,ay,activity\n" + "\n".join(rows) + "\n")
    return path


def source(path: Path, **data: object):
    return data_source_from_toml({"data": {"csv": str(path), "key": "ts", "label": "activity",
                                           "classes": ["rest", "walk", "run"], **data}})


def test_windows_are_channels_by_readings_newest_first_keyed_by_their_newest_reading(tmp_path) -> None:
    log = write_log(tmp_path / "log.csv", ["rest"] * 7 + ["walk"] * 6)  # 13 readings
    data = source(log, window=4, stride=3).read().data
    assert data.x.shape == (4, 2, 4)  # windows ending at readings 3, 6, 9, 12
    np.testing.assert_array_equal(data.x[0], [[9, 10, 11, 12], [-18, -20, -22, -24]])  # the newest
    np.testing.assert_array_equal(data.keys.astype(np.int64) - T0, [12, 9, 6, 3])
    np.testing.assert_array_equal(data.y, [1, 1, 0, 0])  # "last": the newest reading's label
    assert data.preprocessing is not None and data.preprocessing.input_shape == (2, 4)


@pytest.mark.parametrize(("rule", "labels", "skipped"), [
    ("last", [1, 1, 1], 0), ("majority", [1, 1, 0], 0), ("uniform", [1], 2)])
def test_the_label_rules(tmp_path, rule: str, labels: list[int], skipped: int) -> None:
    # windows of 4, oldest first: [rest rest rest walk] [rest rest walk walk] (a tie) [walk walk walk walk]
    log = write_log(tmp_path / "log.csv", ["rest", "rest", "rest", "walk", "rest", "rest", "walk", "walk",
                                           "walk", "walk", "walk", "walk"])
    read = source(log, window=4, window_label=rule).read()
    np.testing.assert_array_equal(read.data.y, labels)  # newest first
    assert read.skipped.get("window with mixed labels", 0) == skipped


def test_a_tied_majority_goes_to_the_newest_tied_label(tmp_path) -> None:
    log = write_log(tmp_path / "log.csv", ["walk", "rest", "rest", "walk"])
    assert source(log, window=4, window_label="majority").read().data.y.tolist() == [1]


def test_appended_readings_only_add_windows(tmp_path) -> None:
    labels = ["rest"] * 10 + ["run"] * 10
    before = source(write_log(tmp_path / "a.csv", labels[:14]), window=5, stride=2).read().data
    after = source(write_log(tmp_path / "b.csv", labels), window=5, stride=2).read().data
    old = {int(k): (x, y) for k, x, y in zip(before.keys, before.x, before.y, strict=True)}
    new = {int(k): (x, y) for k, x, y in zip(after.keys, after.x, after.y, strict=True)}
    assert set(old) < set(new) and len(new) == len(old) + 3
    for key, (x, y) in old.items():
        np.testing.assert_array_equal(new[key][0], x)
        assert new[key][1] == y


def test_max_samples_keeps_the_newest_windows_and_sqlite_logs_window_too(tmp_path) -> None:
    db = tmp_path / "readings.db"
    with sqlite3.connect(db) as conn:
        conn.execute("CREATE TABLE readings (ts INTEGER, ax REAL, ay REAL, activity TEXT)")
        conn.executemany("INSERT INTO readings VALUES (?, ?, ?, ?)",
                         [(T0 + i, float(i), -2.0 * i, "walk") for i in range(30)])
    read = data_source_from_toml({"data": {"sqlite": str(db), "query": "SELECT ts, ax, ay, activity FROM readings",
                                           "label": "activity", "classes": ["rest", "walk", "run"], "window": 10,
                                           "max_samples": 2}}).read()
    assert read.data.x.shape == (2, 2, 10)
    np.testing.assert_array_equal(read.data.keys.astype(np.int64) - T0, [29, 19])


@pytest.mark.parametrize(("data", "match"), [
    ({"window": 0}, r"\[data\] window must be an integer in \[1, 65536\]"),
    ({"window": 4, "stride": -1}, r"\[data\] stride must be an integer"),
    ({"window": 4, "window_label": "first"}, "window_label must be one of last, majority, uniform"),
    ({"stride": 2}, "stride needs window"),
    ({"window": 4, "input_shape": [4, 2]}, r"input_shape \[4, 2\] does not match windows of 2 channels and 4"),
])
def test_bad_window_settings_are_one_line_errors(tmp_path, data: dict, match: str) -> None:
    log = write_log(tmp_path / "log.csv", ["rest"] * 8)
    with pytest.raises(ValueError, match=match) as info:
        source(log, **data).read()
    assert "\n" not in str(info.value)


def test_windows_need_readings_from_a_table(tmp_path) -> None:
    with pytest.raises(ValueError, match=r"\[data\] window applies to csv and sqlite only, not to npz"):
        data_source_from_toml({"data": {"npz": str(tmp_path / "x.npz"), "window": 4}})
    with pytest.raises(NoData, match="3 valid readings, fewer than one window of 4"):
        source(write_log(tmp_path / "log.csv", ["rest"] * 3), window=4).read()


def test_a_log_whose_windows_would_not_fit_is_refused_before_they_are_copied(tmp_path, monkeypatch) -> None:
    monkeypatch.setattr("edge_sdk.sources.windows.MAX_WINDOW_VALUES", 100)
    log = write_log(tmp_path / "log.csv", ["rest"] * 40)
    with pytest.raises(ValueError, match="11 windows of 2 x 10 values exceed 100 values in all; set "
                                         r"\[data\] max_samples or a longer stride"):
        source(log, window=10, stride=3).read()
    assert source(log, window=10, stride=3, max_samples=5).read().data.x.shape == (5, 2, 10)  # within it
