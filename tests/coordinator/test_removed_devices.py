"""The coordinator's removed-devices file (coordinator/runtime/removed_devices.py): what
remove-device.sh appends, and what a typo or a hostile line does there."""

from __future__ import annotations

import logging

from coordinator.runtime import removed_devices
from coordinator.runtime.removed_devices import RemovedDevicesFile


def test_each_new_valid_id_is_removed_once_and_junk_is_skipped(tmp_path, monkeypatch, caplog):
    monkeypatch.setattr(removed_devices, "CHECK_EVERY_S", 0.0)
    path = tmp_path / "removed-devices"
    removed: list[str] = []
    watcher = RemovedDevicesFile(path, removed.append)
    watcher.check()  # no file yet: nothing removed, no error
    assert removed == []
    path.write_text("# removed by remove-device.sh\npi-a\n\n  pi-b  \n../../etc/passwd\npi a\n" + "x" * 200 + "\n")
    caplog.set_level(logging.WARNING)
    watcher.check()
    assert removed == ["pi-a", "pi-b"]
    assert sum("is not a device id" in r.getMessage() for r in caplog.records) == 3
    with path.open("a") as file:
        file.write("pi-a\npi-c\npi-kit")  # pi-a again: already out; pi-kitchen still being written
    watcher.check()
    assert removed == ["pi-a", "pi-b", "pi-c"]
    with path.open("a") as file:
        file.write("chen\n")
    watcher.check()
    assert removed == ["pi-a", "pi-b", "pi-c", "pi-kitchen"]
    watcher.check()  # unchanged file: not read again
    assert removed == ["pi-a", "pi-b", "pi-c", "pi-kitchen"]
    assert sum("is not a device id" in r.getMessage() for r in caplog.records) == 3  # junk logged once


def test_the_file_is_looked_at_only_every_few_seconds_and_read_within_a_bound(tmp_path, monkeypatch):
    path = tmp_path / "removed-devices"
    removed: list[str] = []
    watcher = RemovedDevicesFile(path, removed.append)
    watcher.check()
    path.write_text("pi-a\n")
    watcher.check()  # within CHECK_EVERY_S of the last look
    assert removed == []
    monkeypatch.setattr(removed_devices, "CHECK_EVERY_S", 0.0)
    monkeypatch.setattr(removed_devices, "MAX_BYTES", 8)
    path.write_text("pi-a\npi-b-is-past-the-bound\n")
    watcher.check()
    assert removed == ["pi-a"]  # the rest is past the bound
