"""The CSV data source (issue 38, part 3): columns by name, a key column for order and stable keys,
bad rows skipped and counted in one log line, a missing or empty file is NoData."""

from __future__ import annotations

import logging

import numpy as np
import pytest

from edge_sdk.sources import Columns, CsvSource, NoData, ReadOptions
from edge_sdk.sources.keys import hash_texts

CLASSES = ("off", "on")


def _write(path, lines):
    path.write_text("\n".join(lines) + "\n")
    return path


def _source(path, **options):
    key = options.pop("key", "ts")
    return CsvSource(path, Columns(key=key), ReadOptions(classes=CLASSES, **options))


def test_rows_come_newest_first_with_the_key_column_as_their_keys(tmp_path):
    path = _write(tmp_path / "s.csv", ["ts,temp,humidity,label", "10,20.5,40,off", "30,22.0,45,on",
                                       "20,21.0,42,on"])
    read = _source(path).read()
    assert read.data.keys.tolist() == [30, 20, 10]
    assert read.data.x.tolist() == [[22.0, 45.0], [21.0, 42.0], [20.5, 40.0]]
    assert read.data.y.tolist() == [1, 1, 0]
    assert read.data.x.dtype == np.float32 and read.data.y.dtype == np.int64 and read.data.keys.dtype == np.uint64
    assert read.data.num_classes == 2 and read.test is None and read.skipped == {}
    assert read.data.preprocessing.mean == (0.0, 0.0) and read.data.preprocessing.std == (1.0, 1.0)


def test_iso_timestamps_order_the_rows_and_give_stable_keys(tmp_path):
    path = _write(tmp_path / "s.csv", ["when,t,label", "2024-05-01T12:00:00Z,1,on", "2024-05-01T11:00:00+00:00,2,off",
                                       "2024-05-01T13:00:00,3,on"])
    read = _source(path, key="when").read()
    assert read.data.x[:, 0].tolist() == [3.0, 1.0, 2.0]
    assert int(read.data.keys[1]) == 1714564800 * 1_000_000  # microseconds since the epoch, UTC


def test_keys_do_not_change_as_the_file_grows(tmp_path):
    for key in ("ts", None):  # a key column, or the hash of each row's text
        path = _write(tmp_path / f"grow-{key}.csv", ["ts,temp,label"] + [f"{i},{i * 0.5},on" for i in range(5)])
        before = _source(path, key=key).read().data
        with open(path, "a") as fh:
            fh.write("".join(f"{i},{i * 0.5},off\n" for i in range(5, 8)))
        after = _source(path, key=key).read().data
        assert len(after) == 8
        old = dict(zip(before.keys.tolist(), before.x[:, -1].tolist(), strict=True))
        new = dict(zip(after.keys.tolist(), after.x[:, -1].tolist(), strict=True))
        assert all(new[k] == v for k, v in old.items())  # every old row keeps its key
        assert after.x[0, -1] == 3.5  # the appended last row comes first


def test_without_a_key_column_the_last_row_is_newest_and_keys_hash_the_row(tmp_path):
    path = _write(tmp_path / "s.csv", ["a,b,label", "1,2,on", "3,4,off"])
    read = CsvSource(path, options=ReadOptions(classes=CLASSES)).read()
    assert read.data.x.tolist() == [[3.0, 4.0], [1.0, 2.0]]
    assert read.data.keys.tolist() == hash_texts([["3", "4", "off"], ["1", "2", "on"]]).tolist()


def test_max_samples_keeps_the_newest(tmp_path):
    path = _write(tmp_path / "s.csv", ["ts,t,label"] + [f"{i},{i},on" for i in range(10)])
    read = _source(path, max_samples=3).read()
    assert read.data.keys.tolist() == [9, 8, 7]


def test_bad_rows_are_skipped_and_counted_in_one_log_line(tmp_path, caplog):
    path = _write(tmp_path / "s.csv", ["ts,t,h,label", "1,1,1,on", "2,nan,1,on", "3,1,inf,off", "4,1,1,maybe",
                                       "5,1,1,-1", "6,1", "7,x,1,on", "later,1,1,on", "9,,1,on", "10,2,2,off"])
    with caplog.at_level(logging.WARNING, logger="edge_sdk.sources"):
        read = _source(path).read()
    assert read.data.keys.tolist() == [10, 1]
    assert read.skipped == {"NaN": 2, "label not a class": 2, "not a number": 2, "wrong shape": 1,
                            "key not a number or timestamp": 1}
    lines = [r.getMessage() for r in caplog.records if r.name == "edge_sdk.sources"]
    assert lines == [f"skipped 8 rows of {path}: 2 NaN, 2 label not a class, 2 not a number, "
                     "1 key not a number or timestamp, 1 wrong shape"]


def test_integer_labels_need_no_classes_and_the_class_count_is_the_largest_plus_one(tmp_path):
    path = _write(tmp_path / "s.csv", ["t,label", "1,0", "2,4", "3,2"])
    read = CsvSource(path).read()
    assert read.data.y.tolist() == [2, 4, 0] and read.data.num_classes == 5
    limited = CsvSource(path, options=ReadOptions(num_classes=3)).read()
    assert limited.data.y.tolist() == [2, 0] and limited.skipped == {"label not a class": 1}


def test_string_labels_without_classes_are_one_line_naming_the_key(tmp_path):
    path = _write(tmp_path / "s.csv", ["t,label", "1,on", "2,off"])
    with pytest.raises(ValueError, match=r"add \[data\] classes") as info:
        CsvSource(path).read()
    assert str(path) in str(info.value) and "\n" not in str(info.value)


def test_features_and_input_shape_pick_and_shape_the_columns(tmp_path):
    path = _write(tmp_path / "s.csv", ["ts,a,b,c,d,noise,label", "1,1,2,3,4,99,on"])
    columns = Columns(features=("a", "b", "c", "d"), key="ts")
    read = CsvSource(path, columns, ReadOptions(classes=CLASSES, input_shape=(2, 2))).read()
    assert read.data.x.tolist() == [[[1.0, 2.0], [3.0, 4.0]]]
    assert read.data.preprocessing.mean == (0.0, 0.0)  # 2 channels on axis 1
    with pytest.raises(ValueError, match=r"\[data\] input_shape \[3\] holds 3 values but .* has 4 feature columns"):
        CsvSource(path, columns, ReadOptions(classes=CLASSES, input_shape=(3,))).read()


@pytest.mark.parametrize("columns, words", [
    (Columns(label="kind"), "[data] label 'kind' is not a column of"),
    (Columns(key="time"), "[data] key 'time' is not a column of"),
    (Columns(features=("temp", "pressure")), "[data] features 'pressure' is not a column of"),
])
def test_a_missing_column_is_one_line_naming_the_key_and_the_file(tmp_path, columns, words):
    path = _write(tmp_path / "s.csv", ["ts,temp,label", "1,2,on"])
    with pytest.raises(ValueError) as info:
        CsvSource(path, columns, ReadOptions(classes=CLASSES)).read()
    assert words in str(info.value) and str(path) in str(info.value) and "\n" not in str(info.value)


def test_missing_empty_or_all_bad_is_no_data(tmp_path):
    with pytest.raises(NoData, match="does not exist"):
        _source(tmp_path / "none.csv").read()
    with pytest.raises(NoData, match="is empty"):
        _source(_write(tmp_path / "empty.csv", [""])).read()
    with pytest.raises(NoData, match="has no rows"):
        _source(_write(tmp_path / "header.csv", ["ts,t,label"])).read()
    with pytest.raises(NoData, match=r"no valid rows \(skipped 2 NaN\)"):
        _source(_write(tmp_path / "bad.csv", ["ts,t,label", "1,nan,on", "2,nan,on"])).read()


def test_an_absurdly_long_cell_or_a_folder_is_one_line(tmp_path):
    path = tmp_path / "huge.csv"
    path.write_text("ts,t,label\n1," + "9" * 200_000 + ",on\n")
    with pytest.raises(ValueError, match="line 2: field larger than field limit") as info:
        _source(path).read()
    assert str(path) in str(info.value)
    (tmp_path / "dir.csv").mkdir()
    with pytest.raises(ValueError, match="is a folder"):
        _source(tmp_path / "dir.csv").read()
    (tmp_path / "latin.csv").write_bytes(b"ts,t,label\n1,2,\xe9\n")
    with pytest.raises(ValueError, match="is not UTF-8"):
        _source(tmp_path / "latin.csv").read()


def test_an_unchanged_file_is_not_parsed_again_and_a_changed_one_is(tmp_path):
    path = _write(tmp_path / "s.csv", ["ts,t,label", "1,1,on"])
    source = _source(path)
    first = source.read()
    assert source.read().data is first.data
    with open(path, "a") as fh:
        fh.write("2,2,off\n")
    assert source.read().data.keys.tolist() == [2, 1]
