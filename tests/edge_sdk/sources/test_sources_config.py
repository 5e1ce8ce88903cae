"""The client TOML's [data] table (issue 38, part 3): which source it names, the shared keys,
`holdout`, and one-line errors naming the key."""

from __future__ import annotations

import sqlite3

import numpy as np
import pytest

from edge_sdk.data.datasets import load_dataset
from edge_sdk.device_config import (
    DEFAULT_HOLDOUT, client_from_toml, data_source_from_toml, holdout_from_toml,
)
from edge_sdk.data.partition import partition
from edge_sdk.sources import CsvSource, DatasetSource, NoData, NpzSource, PythonSource, SqliteSource


def _npz(path, test=True):
    x, y = np.zeros((6, 2, 2), np.uint8) + np.arange(6)[:, None, None].astype(np.uint8), np.arange(6) % 2
    arrays = {"x_train": x, "y_train": y}
    if test:
        arrays.update(x_test=x[:2], y_test=y[:2])
    np.savez(path, **arrays)
    return str(path)


def test_each_source_key_names_its_source(tmp_path):
    (tmp_path / "s.csv").write_text("ts,t,label\n1,2,on\n")
    folder = tmp_path / "py"
    folder.mkdir()
    cases = {
        "csv": ({"csv": str(tmp_path / "s.csv"), "key": "ts", "classes": ["off", "on"]}, CsvSource),
        "sqlite": ({"sqlite": str(tmp_path / "s.db"), "query": "SELECT ts, t, label FROM r"}, SqliteSource),
        "npz": ({"npz": _npz(tmp_path / "a.npz")}, NpzSource),
        "dataset npz": ({"dataset": "npz:" + _npz(tmp_path / "b.npz")}, NpzSource),
        "python": ({"python": "my_loader:load", "python_path": str(folder)}, PythonSource),
        "default": ({}, DatasetSource),
    }
    for name, (table, kind) in cases.items():
        source = data_source_from_toml({"data": table})
        assert isinstance(source, kind), name
        assert "\n" not in source.description and source.description
    csv = data_source_from_toml({"data": cases["csv"][0]}).read()
    assert csv.data.y.tolist() == [1] and csv.data.keys.tolist() == [1]


def test_the_data_table_names_a_source_that_reads(tmp_path):
    (tmp_path / "s.csv").write_text("ts,t,label\n1,2,0\n2,3,1\n")
    data = data_source_from_toml({"data": {"csv": str(tmp_path / "s.csv"), "key": "ts", "max_samples": 1}}).read().data
    assert data.x.tolist() == [[3.0]] and data.keys.tolist() == [2]
    with pytest.raises(NoData):
        data_source_from_toml({"data": {"csv": str(tmp_path / "none.csv")}}).read()


def test_a_public_dataset_shard_is_todays_shard_with_its_indices_as_keys():
    config = {"seed": 3, "data": {"dataset": "digits", "partition": "shards:2", "shard": 1, "shards": 4}}
    data = data_source_from_toml(config).read().data
    dataset = load_dataset("digits")
    part = partition(dataset.y_train, 4, "shards:2", seed=3)[1]
    assert np.array_equal(data.x, dataset.x_train[part]) and np.array_equal(data.y, dataset.y_train[part])
    assert data.keys.tolist() == np.asarray(part).tolist() and data.preprocessing == dataset.preprocessing


@pytest.mark.parametrize("table, words", [
    ({"csv": "/a.csv", "npz": "/b.npz"}, "[data] names 2 sources (npz, csv); give one"),
    ({"csv": "/a.csv", "query": "SELECT 1"}, "[data] query applies to sqlite only, not to csv"),
    ({"npz": "/a.npz", "shard": 1}, "[data] shard applies to dataset only, not to npz"),
    ({"python": "m:f", "label": "y"}, "[data] label applies to csv and sqlite only, not to python"),
    ({"sqlite": "/a.db"}, '[data] sqlite needs query = "SELECT ..."'),
    ({"sqlite": "/a.db", "query": "DELETE FROM readings"}, "[data] query must be a single SELECT statement"),
    ({"csv": ""}, "[data] csv must not be empty"),
    ({"csv": 3}, "[data] csv must be a string"),
    ({"csv": "/a.csv", "features": []}, "[data] features must be a list of names"),
    ({"csv": "/a.csv", "classes": ["on", "on"]}, "[data] classes must be distinct names"),
    ({"csv": "/a.csv", "classes": "on,off"}, "[data] classes must be a list"),
    ({"csv": "/a.csv", "input_shape": [1, 0]}, "[data] input_shape must be 1 to 3 positive integers"),
    ({"csv": "/a.csv", "input_shape": [1, 2, 3, 4]}, "[data] input_shape must be 1 to 3 positive integers"),
    ({"csv": "/a.csv", "max_samples": 0}, "[data] max_samples must be an integer >= 1, got 0"),
    ({"csv": "/a.csv", "max_samples": 1.5}, "[data] max_samples must be an integer"),
    ({"csv": "/a.csv", "num_classes": 3, "classes": ["a", "b"]}, "[data] num_classes = 3 but classes names 2"),
    ({"python": "loader"}, '[data] python must be "module:function"'),
    ({"python": "m:f", "python_path": "/nonexistent/dir"}, "[data] python_path /nonexistent/dir is not a folder"),
    ({"images": "/pics"}, "[data] images needs input_shape = [C, H, W]"),
    ({"dataset": "imagenet"}, "[data] dataset must be one of"),
    ({"dataset": "digits", "classes": ["a"]}, "[data] classes does not apply to a public dataset"),
    ({"dataset": "digits", "shard": 4, "shards": 4}, "[data] shard must be in 0..3, got 4"),
    ({"csv": "/a.csv", "lable": "y"}, "[data]: unknown keys ['lable']"),
])
def test_a_bad_data_table_is_one_line_naming_the_key(table, words):
    with pytest.raises(ValueError) as info:
        data_source_from_toml({"data": table})
    assert str(info.value).startswith(words) and "\n" not in str(info.value)


def test_a_client_config_names_the_file_and_the_data_key(tmp_path):
    path = tmp_path / "client.toml"
    path.write_text('device_id = "d"\n[data]\ncsv = "/x.csv"\nquery = "SELECT 1"\n')
    with pytest.raises(ValueError) as info:
        client_from_toml(path)
    assert str(info.value) == f"{path}: [data] query applies to sqlite only, not to csv"


def test_holdout_defaults_and_the_npz_test_set(tmp_path):
    assert DEFAULT_HOLDOUT == 0.2
    assert holdout_from_toml({"data": {"csv": "/a.csv"}}) == 0.2
    assert holdout_from_toml({}) == 0.2
    assert holdout_from_toml({"data": {"csv": "/a.csv", "holdout": 0.5}}) == 0.5
    assert holdout_from_toml({"data": {"csv": "/a.csv", "holdout": 0.9}}) == 0.9
    with_test, without = _npz(tmp_path / "t.npz"), _npz(tmp_path / "n.npz", test=False)
    assert holdout_from_toml({"data": {"npz": with_test}}) is None  # the file's own x_test/y_test
    assert holdout_from_toml({"data": {"dataset": f"npz:{with_test}"}}) is None
    assert holdout_from_toml({"data": {"npz": with_test, "holdout": 0.3}}) == 0.3
    assert holdout_from_toml({"data": {"npz": without}}) == 0.2
    assert holdout_from_toml({"data": {"npz": str(tmp_path / "missing.npz")}}) == 0.2
    read = data_source_from_toml({"data": {"npz": with_test}}).read()
    assert read.test is not None and len(read.test) == 2


@pytest.mark.parametrize("value", [0, 0.0, 0.95, 1, -0.1, "0.2", True, float("nan")])
def test_a_holdout_outside_0_to_0_9_is_one_line_naming_the_key(value):
    with pytest.raises(ValueError) as info:
        holdout_from_toml({"data": {"csv": "/a.csv", "holdout": value}})
    assert str(info.value).startswith("[data] holdout must be a fraction in (0, 0.9], got ")
    assert "\n" not in str(info.value)


def test_sqlite_from_toml_reads_with_a_named_key(tmp_path):
    with sqlite3.connect(tmp_path / "s.db") as db:
        db.execute("CREATE TABLE r (v REAL, label TEXT, ts INTEGER)")
        db.executemany("INSERT INTO r VALUES (?, ?, ?)", [(1.0, "on", 5), (2.0, "off", 6)])
    db.close()
    read = data_source_from_toml({"data": {"sqlite": str(tmp_path / "s.db"), "query": "SELECT * FROM r",
                                           "key": "ts", "classes": ["off", "on"]}}).read()
    assert read.data.keys.tolist() == [6, 5] and read.data.y.tolist() == [0, 1]


def test_a_public_dataset_whose_files_are_missing_is_one_line(tmp_path):
    source = data_source_from_toml({"data": {"dataset": "fashion-mnist", "root": str(tmp_path)}})
    with pytest.raises(ValueError) as info:
        source.read()
    assert str(info.value).startswith("dataset 'fashion-mnist': train-images-idx3-ubyte[.gz] not found in")
    assert "\n" not in str(info.value)
