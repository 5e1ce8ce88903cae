"""The image-folder data source (issue 38, part 3): class sub-folders, keys hash the file bytes,
the newest file first, images of another size skipped (never resized), Pillow optional."""

from __future__ import annotations

import logging
import os
import sys

import numpy as np
import pytest

from edge_sdk.device_config import data_source_from_toml
from edge_sdk.sources import ImageFolderSource, NoData, ReadOptions
from edge_sdk.sources.keys import hash_bytes

Image = pytest.importorskip("PIL.Image")
GREY = ReadOptions(input_shape=(1, 4, 4), classes=("cat", "dog"))


def _image(path, value, size=(4, 4), mode="L", mtime=None):
    path.parent.mkdir(parents=True, exist_ok=True)
    colour = value if mode == "L" else (value, value // 2, 255 - value)
    Image.new(mode, size, colour).save(path)
    if mtime is not None:
        os.utime(path, (mtime, mtime))
    return path


def test_class_folders_give_labels_keys_and_newest_first(tmp_path):
    a = _image(tmp_path / "cat" / "a.png", 10, mtime=1000)
    b = _image(tmp_path / "dog" / "b.png", 20, mtime=3000)
    c = _image(tmp_path / "cat" / "c.png", 30, mtime=2000)
    read = ImageFolderSource(tmp_path, GREY).read()
    assert read.data.x.shape == (3, 1, 4, 4) and read.data.x.dtype == np.float32
    assert read.data.x[:, 0, 0, 0].tolist() == [20.0, 30.0, 10.0]  # raw pixel values, newest file first
    assert read.data.y.tolist() == [1, 0, 0] and read.data.num_classes == 2
    assert read.data.keys.tolist() == hash_bytes([p.read_bytes() for p in (b, c, a)], 3).tolist()
    assert read.data.preprocessing.mean == (0.0,) and read.test is None


def test_rgb_images_come_channels_first(tmp_path):
    _image(tmp_path / "dog" / "a.png", 200, mode="RGB")
    read = ImageFolderSource(tmp_path, ReadOptions(input_shape=(3, 4, 4), classes=("cat", "dog"))).read()
    assert read.data.x.shape == (1, 3, 4, 4) and read.data.x[0, :, 0, 0].tolist() == [200.0, 100.0, 55.0]


def test_keys_do_not_change_as_images_are_added_and_max_samples_keeps_the_newest(tmp_path):
    for i in range(4):
        _image(tmp_path / "cat" / f"{i}.png", i * 10, mtime=1000 + i)
    source = ImageFolderSource(tmp_path, GREY)
    before = source.read().data.keys.tolist()
    new = _image(tmp_path / "dog" / "new.png", 99, mtime=5000)
    after = source.read().data
    assert after.keys.tolist() == hash_bytes([new.read_bytes()], 1).tolist() + before
    newest = ImageFolderSource(tmp_path, ReadOptions(input_shape=(1, 4, 4), classes=("cat", "dog"),
                                                     max_samples=2)).read().data
    assert newest.keys.tolist() == after.keys[:2].tolist()


def test_other_sizes_non_images_and_unknown_classes_are_skipped_in_one_log_line(tmp_path, caplog):
    _image(tmp_path / "cat" / "ok.png", 1)
    _image(tmp_path / "cat" / "big.png", 1, size=(8, 8))
    (tmp_path / "dog" / "notes.txt").parent.mkdir()
    (tmp_path / "dog" / "notes.txt").write_text("not an image")
    _image(tmp_path / "bird" / "x.png", 1)
    _image(tmp_path / "loose.png", 1)
    (tmp_path / "cat" / ".hidden.png").write_bytes(b"ignored")
    with caplog.at_level(logging.WARNING, logger="edge_sdk.sources"):
        read = ImageFolderSource(tmp_path, GREY).read()
    assert len(read.data) == 1
    assert read.skipped == {"wrong shape": 1, "not an image": 1, "label not a class": 1, "not in a class folder": 1}
    assert [r.getMessage() for r in caplog.records if r.name == "edge_sdk.sources"] == [
        f"skipped 4 files of {tmp_path}: 1 label not a class, 1 not an image, 1 not in a class folder, "
        "1 wrong shape"]


def test_integer_folder_names_need_no_classes_and_names_without_classes_are_one_line(tmp_path):
    _image(tmp_path / "ints" / "0" / "a.png", 1)
    _image(tmp_path / "ints" / "2" / "b.png", 1)
    assert ImageFolderSource(tmp_path / "ints", ReadOptions(input_shape=(1, 4, 4))).read().data.num_classes == 3
    _image(tmp_path / "names" / "cat" / "a.png", 1)
    with pytest.raises(ValueError, match=r"add \[data\] classes") as info:
        ImageFolderSource(tmp_path / "names", ReadOptions(input_shape=(1, 4, 4))).read()
    assert "\n" not in str(info.value)


def test_a_missing_or_empty_folder_is_no_data(tmp_path):
    with pytest.raises(NoData, match="does not exist"):
        ImageFolderSource(tmp_path / "none", GREY).read()
    (tmp_path / "empty" / "cat").mkdir(parents=True)
    with pytest.raises(NoData, match="no images"):
        ImageFolderSource(tmp_path / "empty", GREY).read()


def test_images_need_an_image_input_shape(tmp_path):
    for shape in (None, (16,), (5, 4, 4)):
        with pytest.raises(ValueError, match=r"\[data\] images needs input_shape = \[C, H, W\]"):
            ImageFolderSource(tmp_path, ReadOptions(input_shape=shape))


def test_without_pillow_it_is_one_line_naming_the_extra(tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "PIL", None)
    monkeypatch.setitem(sys.modules, "PIL.Image", None)
    with pytest.raises(ValueError) as info:
        ImageFolderSource(tmp_path, GREY)
    assert str(info.value) == "[data] images needs Pillow: pip install 'edgefl[images]'"
    with pytest.raises(ValueError, match=r"pip install 'edgefl\[images\]'"):
        data_source_from_toml({"data": {"images": str(tmp_path), "input_shape": [1, 4, 4]}})
