"""Arrays too large to hold live in a temporary file, memory-mapped: the same values as in
memory, pages mapped only where read, the file gone with the array; the loaders and the
simulated devices' shards use them for large datasets."""

from __future__ import annotations

import gc
import os
from pathlib import Path

import numpy as np
import pytest

import edge_sdk.data.datasets as data_module
from edge_sdk.data import spilled_arrays
from edge_sdk.data.datasets import load_dataset
from edge_sdk.data.spilled_arrays import copy_spilled, is_spilled, spill, spill_rows
from simulation.config import SimulationConfig, split_public
from simulation.device_shards import DeviceShards


def _resident_kb(filename: str | Path) -> int:
    """Resident kB of this process's mappings of ``filename`` (/proc/self/smaps)."""
    total, inside = 0, False
    for line in Path("/proc/self/smaps").read_text().splitlines():
        head = line.split()
        if head and "-" in head[0] and len(head) >= 5:  # a mapping's first line
            inside = line.endswith(str(filename))
        elif inside and line.startswith("Rss:"):
            total += int(head[1])
    return total


def _chunks(array: np.ndarray, rows: int):
    for i in range(0, len(array), rows):
        yield array[i:i + rows]


def test_a_spilled_array_holds_the_chunks_read_only_and_its_file_goes_with_it() -> None:
    values = np.random.default_rng(0).standard_normal((1000, 3, 4)).astype(np.float32)
    array = spill(values.shape, np.float32, _chunks(values, 64))
    assert is_spilled(array) and not is_spilled(array[1:]) and not is_spilled(values)
    np.testing.assert_array_equal(array, values)
    assert not array.flags.writeable
    folder = Path(array.filename).parent
    view = array[10:20]
    del array
    gc.collect()
    assert folder.exists()  # a view keeps the file
    np.testing.assert_array_equal(view, values[10:20])
    del view
    gc.collect()
    assert not folder.exists()


def test_chunks_that_do_not_fit_are_refused_and_leave_no_file(tmp_path, monkeypatch) -> None:
    monkeypatch.setenv("TMPDIR", str(tmp_path))
    monkeypatch.setattr("tempfile.tempdir", None)
    with pytest.raises(ValueError, match="gave 64 rows, the array has 100"):
        spill((100, 2), np.float32, [np.zeros((64, 2))])
    with pytest.raises(ValueError, match="does not fit"):
        spill((100, 2), np.float32, [np.zeros((64, 3))])
    assert list(tmp_path.iterdir()) == []


def _peak_rss_kb_during(action) -> int:
    """The most this process' resident memory rose above its start while ``action`` ran (the
    kernel's high-water mark, reset first through /proc/self/clear_refs)."""
    def status(key: str) -> int:
        line = next(x for x in Path("/proc/self/status").read_text().splitlines() if x.startswith(key))
        return int(line.split()[1])
    Path("/proc/self/clear_refs").write_text("5")  # the peak RSS starts again from the current RSS
    before = status("VmRSS:")
    action()
    return status("VmHWM:") - before


def test_rows_are_gathered_without_mapping_the_source_or_holding_the_result(monkeypatch) -> None:
    monkeypatch.setattr(spilled_arrays, "_CHUNK_BYTES", 1024 * 1024)
    values = np.random.default_rng(1).standard_normal((40_000, 784)).astype(np.float32)  # 125 MB
    source = spill(values.shape, np.float32, _chunks(values, 4096))
    rows = np.random.default_rng(2).permutation(len(values))
    taken: list[np.ndarray] = []
    rose = _peak_rss_kb_during(lambda: taken.append(spill_rows(source, rows)))
    # a gather through a mapping of the source maps most of its 125 MB; row by row, a chunk or two
    assert rose < 16 * 1024, f"resident memory rose {rose} kB while gathering"
    assert is_spilled(taken[0]) and taken[0].shape == values.shape
    assert _resident_kb(source.filename) == 0 and _resident_kb(taken[0].filename) == 0
    np.testing.assert_array_equal(taken[0], values[rows])
    assert _resident_kb(taken[0].filename) > 100_000  # the check can see pages that are read
    plain = spill_rows(values, rows[:100])
    assert not isinstance(plain, np.memmap)
    np.testing.assert_array_equal(plain, values[rows[:100]])
    with pytest.raises(IndexError, match="rows must lie in"):
        spill_rows(source, np.array([0, len(values)]))


def test_a_spilled_array_is_saved_by_link_not_by_reading_it(tmp_path) -> None:
    values = np.arange(4000, dtype=np.float32).reshape(1000, 4)
    array = spill(values.shape, np.float32, [values])
    copy_spilled(array, tmp_path / "x.npy")
    assert _resident_kb(array.filename) == 0
    assert os.stat(tmp_path / "x.npy").st_ino == os.stat(array.filename).st_ino
    np.testing.assert_array_equal(np.load(tmp_path / "x.npy"), values)
    copy_spilled(values[::2], tmp_path / "y.npy")  # an ordinary array is saved
    np.testing.assert_array_equal(np.load(tmp_path / "y.npy"), values[::2])


def test_a_large_training_split_is_spilled_with_the_same_values_and_so_are_its_shards(tmp_path, monkeypatch) -> None:
    held = load_dataset("mnist-sample", seed=0)
    monkeypatch.setattr(data_module, "SPILL_BYTES", held.x_train.nbytes - 1)
    spilled = load_dataset("mnist-sample", seed=0)
    assert is_spilled(spilled.x_train) and not is_spilled(spilled.x_test)  # the test split is smaller
    np.testing.assert_array_equal(spilled.x_train, held.x_train)  # bit for bit
    np.testing.assert_array_equal(spilled.x_test, held.x_test)

    config = SimulationConfig(method="fedavg", dataset="mnist-sample", clients=9, partition="dirichlet:0.5")
    private, _ = split_public(config, spilled)
    shards = DeviceShards.build(config, spilled, private)
    in_memory = DeviceShards.build(config, held, private)
    assert is_spilled(shards.x) and not is_spilled(in_memory.x)
    for device in range(config.clients):
        np.testing.assert_array_equal(shards.local_data(device).x, in_memory.local_data(device).x)
        assert np.shares_memory(shards.local_data(device).x, shards.x)
    opened = DeviceShards.open(shards.save(tmp_path / "shards"))
    np.testing.assert_array_equal(opened.x, in_memory.x)
