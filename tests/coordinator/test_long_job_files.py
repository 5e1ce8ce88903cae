"""A job of many versions writes the same per version on its last day as on its first: the report
and checkpoint keep the latest rounds (with the count and totals of all), metrics.csv and
history.jsonl are appended, metrics.csv is rotated when a label appears, and a write that fails
(a full disk) leaves the earlier file whole."""

from __future__ import annotations

import csv
import json
from pathlib import Path

import numpy as np
import pytest

import coordinator.runtime.report as report_module
from coordinator.runtime.report import RoundRecord, RunReport
from coordinator.runtime.safe_files import appending, write_atomically
from tests.support.full_disk import full_disk
from coordinator.runtime.state import load_checkpoint, save_checkpoint


def _record(rnd: int, labels=("global",)) -> RoundRecord:
    return RoundRecord(round=rnd, accuracy={label: 0.5 + rnd / 1000 for label in labels}, loss=0.5, bytes_down=100,
                       bytes_up=50, seconds=2.0, host_seconds=0.1, participants=["a", "b"], aggregated=True,
                       version=rnd + 1, published_version=rnd + 1)


def test_the_report_and_checkpoint_keep_the_latest_rounds_and_the_totals_of_all(tmp_path, monkeypatch) -> None:
    monkeypatch.setattr(report_module, "KEEP_ROUNDS", 10)
    report = RunReport("fedavg", {})
    for rnd in range(50):
        report.add_round(_record(rnd))
        report.write(tmp_path / "out", plots=False)
        save_checkpoint(tmp_path / "ck", "fedavg", rnd, report.rounds_as_dicts(), {"w": np.zeros(3, np.float32)},
                        rounds_total=report.rounds_total, totals=report.totals)
    written = json.loads((tmp_path / "out" / "report.json").read_text())
    assert written["rounds_total"] == 50 and [r["round"] for r in written["rounds"]] == list(range(41, 51))
    assert written["final"]["bytes_down_total"] == 5000 and written["final"]["seconds_total"] == 100.0
    assert written["final"]["version"] == 50
    assert len(report.rounds) <= 11  # in memory: the latest, not all 50
    rows = list(csv.DictReader(open(tmp_path / "out" / "metrics.csv")))
    assert [int(r["round"]) for r in rows] == list(range(1, 51))  # every round, appended
    checkpoint = load_checkpoint(tmp_path / "ck")
    assert checkpoint is not None and len(checkpoint.rounds) == 10 and checkpoint.rounds_total == 50
    resumed = RunReport("fedavg", {})
    resumed.restore_rounds(checkpoint.rounds, checkpoint.rounds_total, checkpoint.totals)
    resumed.add_round(_record(50))
    assert resumed.rounds_total == 51 and resumed.totals["bytes_up"] == 51 * 50
    assert resumed.to_dict()["final"]["version"] == 51


def test_a_new_label_widens_a_short_jobs_file_and_rotates_a_long_ones(tmp_path, monkeypatch) -> None:
    def run(out: Path) -> None:
        report = RunReport("flanc", {})
        for rnd in range(3):
            report.add_round(_record(rnd, ("0.5",)))
            report.write(out, plots=False)
        report.add_round(_record(3, ("0.5", "1.0")))  # a width first evaluated now
        report.write(out, plots=False)

    run(tmp_path / "short")  # every round still in memory: one file, its header widened
    rows = list(csv.DictReader(open(tmp_path / "short" / "metrics.csv")))
    assert [r["round"] for r in rows] == ["1", "2", "3", "4"] and rows[0]["accuracy_1.0"] == ""
    assert not (tmp_path / "short" / "metrics-1.csv").exists()
    monkeypatch.setattr(report_module, "KEEP_ROUNDS", 1)  # a long job: its first rounds left memory
    run(tmp_path / "long")
    old = list(csv.DictReader(open(tmp_path / "long" / "metrics-1.csv")))
    new = list(csv.DictReader(open(tmp_path / "long" / "metrics.csv")))
    assert [r["round"] for r in old] == ["1", "2", "3"] and "accuracy_1.0" not in old[0]
    assert [r["round"] for r in new] == ["4"] and new[0]["accuracy_1.0"] != ""


def test_a_resumed_job_goes_on_after_the_rows_already_written(tmp_path) -> None:
    first = RunReport("fedavg", {})
    for rnd in range(3):
        first.add_round(_record(rnd))
        first.write(tmp_path, plots=False)
    resumed = RunReport("fedavg", {})
    resumed.restore_rounds(first.rounds_as_dicts()[-1:], 3, first.totals)  # the checkpoint kept the latest
    resumed.add_round(_record(3))
    resumed.write(tmp_path, plots=False)
    rows = list(csv.DictReader(open(tmp_path / "metrics.csv")))
    assert [r["round"] for r in rows] == ["1", "2", "3", "4"]


def test_a_failed_write_leaves_the_earlier_file_whole(tmp_path) -> None:
    target = tmp_path / "report.json"
    write_atomically(target, '{"status": "finished"}')
    with full_disk(1000), pytest.raises(OSError, match="too large"):
        write_atomically(target, '{"status": "half", "pad": "' + "x" * 5000 + '"}')
    assert target.read_text() == '{"status": "finished"}'
    assert [p.name for p in tmp_path.iterdir()] == ["report.json"]  # no temporary file left behind


def test_a_failed_append_leaves_no_half_row(tmp_path) -> None:
    target = tmp_path / "metrics.csv"
    with appending(target) as fh:
        fh.write("round,accuracy\n1,0.5\n")
    whole = target.read_bytes()
    with full_disk(len(whole) + 10), pytest.raises(OSError, match="too large"), appending(target) as fh:
        fh.write("2,0.6\n" * 100)  # the first 10 bytes fit: they are taken back
    assert target.read_bytes() == whole
    with appending(target) as fh:  # room again: appended as usual
        fh.write("2,0.6\n")
    assert target.read_bytes() == whole + b"2,0.6\n"


def test_a_failed_checkpoint_keeps_the_earlier_one(tmp_path) -> None:
    save_checkpoint(tmp_path, "fedavg", 3, [], {"w": np.ones(4, np.float32)})
    with full_disk(2000), pytest.raises(OSError):
        save_checkpoint(tmp_path, "fedavg", 4, [], {"w": np.ones(10_000, np.float32)})
    checkpoint = load_checkpoint(tmp_path)
    assert checkpoint is not None and checkpoint.round == 3 and checkpoint.tensors["w"].shape == (4,)
    assert [p.name for p in tmp_path.iterdir()] == ["checkpoint.msgpack"]
