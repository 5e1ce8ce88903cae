"""The npz data source (issue 38, part 3): keys hash each sample's raw values, the last rows are
the newest, x_test/y_test come back as the source's own held-out set, never unpickled."""

from __future__ import annotations

import logging

import numpy as np
import pytest

from edge_sdk.sources import NoData, NpzSource, ReadOptions
from edge_sdk.sources.keys import hash_samples


def _images(n, seed=0):
    rng = np.random.default_rng(seed)
    return rng.integers(0, 256, size=(n, 6, 6), dtype=np.uint8), rng.integers(0, 3, size=n)


def test_keys_hash_the_raw_samples_and_the_last_row_is_newest(tmp_path):
    x, y = _images(8)
    np.savez(tmp_path / "d.npz", x_train=x, y_train=y)
    read = NpzSource(tmp_path / "d.npz").read()
    assert read.data.x.shape == (8, 1, 6, 6) and read.test is None
    assert read.data.y.tolist() == y[::-1].tolist()
    assert read.data.keys.tolist() == hash_samples(x[::-1, None].astype(np.float32)).tolist()
    assert len(set(read.data.keys.tolist())) == 8
    # normalised with its own statistics (today's behaviour), which the data carries
    mean = read.data.preprocessing.mean[0]
    assert abs(mean - float(x.mean())) < 1e-3 and abs(float(read.data.x.mean())) < 1e-4
    # the same raw values stored as float32 give the same keys
    np.savez(tmp_path / "f.npz", x_train=x.astype(np.float32), y_train=y)
    assert NpzSource(tmp_path / "f.npz").read().data.keys.tolist() == read.data.keys.tolist()


def test_keys_do_not_change_as_the_file_grows_and_max_samples_keeps_the_newest(tmp_path):
    x, y = _images(20)
    path = tmp_path / "d.npz"
    np.savez(path, x_train=x[:12], y_train=y[:12])
    source = NpzSource(path)
    before = source.read().data.keys
    np.savez(path, x_train=x, y_train=y)  # the device appended 8 samples
    after = source.read().data.keys
    assert set(before.tolist()) <= set(after.tolist()) and len(after) == 20
    assert after[:8].tolist() == hash_samples(x[12:][::-1, None].astype(np.float32)).tolist()
    newest = NpzSource(path, ReadOptions(max_samples=5)).read().data
    assert newest.keys.tolist() == after[:5].tolist()


def test_the_test_split_comes_back_normalised_like_the_training_data(tmp_path):
    x, y = _images(10)
    tx, ty = _images(4, seed=1)
    np.savez(tmp_path / "d.npz", x_train=x, y_train=y, x_test=tx, y_test=ty, classes=np.array(["a", "b", "c", "d"]))
    read = NpzSource(tmp_path / "d.npz").read()
    assert read.test is not None and read.test.x.shape == (4, 1, 6, 6)
    assert read.test.preprocessing == read.data.preprocessing
    raw = read.test.x * read.test.preprocessing.std[0] + read.test.preprocessing.mean[0]
    assert np.allclose(raw[::-1, 0], tx, atol=1e-3)
    assert read.data.num_classes == read.test.num_classes == 4  # the file's class names fix K
    assert read.test.keys.dtype == np.uint64


def test_bad_samples_are_skipped_and_counted_in_one_log_line(tmp_path, caplog):
    x = np.ones((6, 3), np.float32)
    x[1, 0] = np.nan
    x[2, 2] = np.inf
    y = np.array([0, 1, 1, 2, 5, 1])
    tx = np.ones((2, 3), np.float32)
    tx[0] = np.nan
    np.savez(tmp_path / "d.npz", x_train=x, y_train=y, x_test=tx, y_test=np.array([0, 1]))
    with caplog.at_level(logging.WARNING, logger="edge_sdk.sources"):
        read = NpzSource(tmp_path / "d.npz", ReadOptions(num_classes=3)).read()
    assert read.data.x.shape == (3, 3) and read.data.y.tolist() == [1, 2, 0]
    assert read.skipped == {"NaN": 2, "label not a class": 1, "NaN (test)": 1}
    assert [r.getMessage() for r in caplog.records if r.name == "edge_sdk.sources"] == [
        f"skipped 4 rows of {tmp_path / 'd.npz'}: 2 NaN, 1 NaN (test), 1 label not a class"]


def test_string_labels_map_through_the_classes(tmp_path):
    x, _ = _images(4)
    np.savez(tmp_path / "d.npz", x_train=x, y_train=np.array(["cat", "dog", "cow", "cat"]))
    read = NpzSource(tmp_path / "d.npz", ReadOptions(classes=("dog", "cat"))).read()
    assert read.data.y.tolist() == [1, 0, 1] and read.skipped == {"label not a class": 1}
    with pytest.raises(ValueError, match=r"add \[data\] classes"):
        NpzSource(tmp_path / "d.npz").read()


def test_input_shape_reshapes_the_samples(tmp_path):
    np.savez(tmp_path / "d.npz", x_train=np.arange(24, dtype=np.float32).reshape(2, 12), y_train=np.array([0, 1]))
    assert NpzSource(tmp_path / "d.npz", ReadOptions(input_shape=(3, 4))).read().data.x.shape == (2, 3, 4)
    with pytest.raises(ValueError, match=r"input_shape \[5\] does not hold"):
        NpzSource(tmp_path / "d.npz", ReadOptions(input_shape=(5,))).read()


def test_missing_or_empty_is_no_data_and_a_broken_file_is_one_line(tmp_path):
    with pytest.raises(NoData, match="not found"):
        NpzSource(tmp_path / "none.npz").read()
    np.savez(tmp_path / "empty.npz", x_train=np.zeros((0, 4), np.float32), y_train=np.zeros(0, np.int64))
    with pytest.raises(NoData, match="x_train is empty"):
        NpzSource(tmp_path / "empty.npz").read()
    np.savez(tmp_path / "objects.npz", x_train=np.array([np.zeros(2), "a"], dtype=object), y_train=np.array([0, 1]))
    np.savez(tmp_path / "half.npz", x_train=np.zeros((2, 2)), y_train=np.array([0, 1]), x_test=np.zeros((1, 2)))
    np.savez(tmp_path / "nolabels.npz", x_train=np.zeros((2, 2)))
    (tmp_path / "text.npz").write_text("x,y\n")
    for name, words in (("objects", "cannot read array 'x_train'"), ("half", "x_test and y_test come together"),
                        ("nolabels", "missing array 'y_train'"), ("text", "is not an .npz file")):
        with pytest.raises(ValueError, match=words) as info:
            NpzSource(tmp_path / f"{name}.npz").read()
        assert str(tmp_path / f"{name}.npz") in str(info.value) and "\n" not in str(info.value)
