"""The device's label store: stable keys, a correction over an event label, bounded by dropping
the oldest training rows (never a held-out one), read as a data source whose corrections always
train."""

from __future__ import annotations

import numpy as np
import pytest

from edge_sdk.data.holdout import held_out
from edge_sdk.device.device_data import DeviceData
from edge_sdk.data.label_store import CORRECTED_EVENT, CORRECTION, EVENT, LabelStore, window_key
from edge_sdk.sources import NoData
from edge_sdk.sources.label_store_source import LabelStoreSource
from edge_sdk.sources.options import ReadOptions

CLASSES = ("idle", "kettle")


def window(i: int) -> np.ndarray:
    return np.full((1, 4), float(i), dtype=np.float32)


def test_a_correction_wins_over_an_event_label_and_keys_are_stable(tmp_path) -> None:
    store = LabelStore(tmp_path, holdout=0.2)
    store.set_classes(CLASSES)
    assert store.add(0.0, 10.0, window(1), "idle") == EVENT
    assert store.add(0.0, 10.0, window(1), "kettle") == EVENT  # an event never overwrites a row
    assert store.add(0.0, 10.0, window(1), "kettle", CORRECTION) == CORRECTED_EVENT
    assert store.add(10.0, 20.0, window(2), "kettle", CORRECTION) == CORRECTION
    rows = LabelStore.read(store.path)
    assert rows.labels == ("kettle", "kettle") and rows.origins == (CORRECTION, CORRECTED_EVENT)  # newest first
    assert [int(k) for k in rows.keys] == [window_key(20.0, window(2)), window_key(10.0, window(1))]
    assert rows.classes == CLASSES
    store.add(9.0, 20.0, window(3), "idle")  # another window that ends at the same time: another row
    assert store.count() == 3
    store.close()
    store = LabelStore(tmp_path, holdout=0.2)
    np.testing.assert_array_equal(rows.values[:, 0, 0], [2.0, 1.0])
    with pytest.raises(ValueError, match="origin must be"):
        store.add(0.0, 1.0, window(1), "idle", "guess")


def test_bounded_the_oldest_training_rows_go_and_held_out_rows_keep_their_share(tmp_path) -> None:
    store = LabelStore(tmp_path, max_rows=50, holdout=0.3)
    ends = np.arange(1, 301, dtype=np.float64)
    keys = np.array([window_key(e, window(int(e))) for e in ends], dtype=np.uint64)
    held = held_out(keys, 0.3)
    for end in ends:
        store.add(end - 1, end, window(int(end)), "idle")
    kept = np.array(sorted(int(k) for k in LabelStore.read(store.path).keys), dtype=np.uint64)
    assert len(kept) == 50 and store.dropped == 250
    kept_held = np.isin(keys, kept) & held
    assert kept_held.sum() == 15  # 0.3 of 50: held-out rows are dropped only beyond their share
    assert np.isin(keys[held][-15:], kept).all() and np.isin(keys[~held][-35:], kept).all()  # the newest of each


def test_the_store_as_a_source_corrections_always_train(tmp_path) -> None:
    source = LabelStoreSource(tmp_path)
    with pytest.raises(NoData, match="no labelled windows yet"):
        source.read()
    store = LabelStore(tmp_path)
    store.set_classes(CLASSES)
    for end in range(1, 101):
        store.add(end - 1.0, float(end), window(end), CLASSES[end % 2])
    corrected = [float(end) for end in range(101, 141)]
    for end in corrected:
        store.add(end - 1.0, end, window(int(end)), "kettle", CORRECTION)
    store.add(200.0, 201.0, window(201), "oven")  # a name no class of the task: skipped, counted
    read = source.read()
    assert len(read.data) == 140 and read.skipped == {"label not a class": 1}
    assert read.data.x.shape == (140, 1, 4) and read.data.num_classes == 2
    assert read.train_only is not None and int(read.train_only.sum()) == 40
    device = DeviceData("pi", 0.5, source, read)
    corrected_keys = np.array([window_key(e, window(int(e))) for e in corrected], dtype=np.uint64)
    assert device.holdout is not None and not np.isin(device.holdout.keys, corrected_keys).any()
    assert np.isin(corrected_keys, device.data.keys).all()  # a person's corrections all train
    assert 20 < len(device.holdout) < 80  # event windows held out by key
    explicit = LabelStoreSource(tmp_path, ReadOptions(classes=("kettle", "idle"))).read()  # [data] classes first
    assert explicit.data.y[0] == 0 and read.data.y[0] == 1


def test_a_windows_key_follows_from_the_end_its_prediction_names() -> None:
    from datetime import datetime, timezone

    values = window(1)
    for end in np.random.default_rng(0).uniform(1.7e9, 1.9e9, size=2000):
        named = datetime.fromtimestamp(end, timezone.utc).isoformat(timespec="microseconds")  # the prediction's end
        assert window_key(datetime.fromisoformat(named).timestamp(), values) == window_key(float(end), values)


def test_a_store_that_cannot_be_opened_is_one_line(tmp_path) -> None:
    (tmp_path / "labels.sqlite").write_bytes(b"not a database, a file someone left here" * 100)
    with pytest.raises(ValueError, match=r"the label store .*labels.sqlite cannot be opened: file is not a database"):
        LabelStore(tmp_path)
