"""Every federated accuracy with what it rests on: samples, devices, a 95 % interval, and
"not enough held-out data" below ``min_eval_samples``."""

from __future__ import annotations

import csv
import json
from pathlib import Path

import pytest

from coordinator.aggregate.evaluation import NOT_ENOUGH, fold_evaluations
from coordinator.aggregate.interval import wilson_interval
from coordinator.cli import federated_figures
from coordinator.core.federation import FederationConfig
from coordinator.runtime.report import RoundRecord, RunReport
from edge_sdk.protocol.messages import Evaluation


def test_the_wilson_interval_matches_its_textbook_values() -> None:
    low, high = wilson_interval(8, 10)  # Newcombe (1998), table I: 0.4902-0.9433
    assert low == pytest.approx(0.4902, abs=1e-4) and high == pytest.approx(0.9433, abs=1e-4)
    assert wilson_interval(0, 5)[0] == 0.0 and wilson_interval(5, 5)[1] == 1.0
    assert wilson_interval(2, 2)[0] < 0.5  # 1.000 from two samples is not a certainty
    narrow, wide = wilson_interval(900, 1000), wilson_interval(9, 10)
    assert narrow[1] - narrow[0] < (wide[1] - wide[0]) / 5
    with pytest.raises(ValueError):
        wilson_interval(11, 10)


def _folded():
    reports = {"a": Evaluation("full", 10, 9, 1.0), "b": Evaluation("full", 30, 24, 3.0),
               "c": Evaluation("half", 5, 5, 0.1), "d": Evaluation("half", 0, 0, 0.0, reason="too few")}
    return fold_evaluations(reports)


def test_each_label_says_how_many_samples_and_devices_it_rests_on() -> None:
    figures = _folded().figures(min_samples=20)
    assert figures["full"]["samples"] == 40 and figures["full"]["devices"] == 2 and figures["full"]["enough"]
    assert figures["half"]["samples"] == 5 and figures["half"]["devices"] == 1 and not figures["half"]["enough"]
    assert figures["full"]["low"] < 33 / 40 < figures["full"]["high"]
    summary = _folded().summary(20)
    assert summary["enough"] is False and summary["min_samples"] == 20 and "Wilson" in summary["interval"]


def test_the_console_reads_not_enough_below_the_minimum_and_the_interval_above_it() -> None:
    folded = _folded()
    line = federated_figures(folded.accuracy, folded.summary(20), str)
    assert "full 0.825 [" in line and f"half: {NOT_ENOUGH} (5 samples, at least 20)" in line
    assert "45 held-out samples on 3 devices" in line
    assert "half 1.000" not in line


def test_min_eval_samples_is_checked() -> None:
    with pytest.raises(ValueError, match="min_eval_samples must be an integer >= 1"):
        FederationConfig(min_eval_samples=0)


def test_report_json_metrics_csv_and_the_plot_carry_the_weight(tmp_path: Path) -> None:
    folded = _folded()
    report = RunReport(method="fedavg", config={})
    for rnd in range(2):
        report.add_round(RoundRecord(round=rnd, accuracy={}, loss=None, bytes_down=1, bytes_up=1, seconds=1.0,
                                     host_seconds=0.1, participants=["a"], aggregated=True,
                                     federated_accuracy=folded.accuracy, evaluation=folded.summary(20)))
    report.write(tmp_path)
    final = json.loads((tmp_path / "report.json").read_text())["final"]
    weight = final["federated_evaluation"]
    assert weight["by_label"]["half"]["enough"] is False and weight["by_label"]["full"]["samples"] == 40
    assert weight["min_samples"] == 20 and weight["devices"] == 3
    rows = list(csv.DictReader(open(tmp_path / "metrics.csv")))
    assert rows[1]["federated_samples_full"] == "40" and rows[1]["federated_devices_half"] == "1"
    assert float(rows[1]["federated_low_full"]) < float(rows[1]["federated_accuracy_full"]) \
        < float(rows[1]["federated_high_full"])
    assert (tmp_path / "accuracy.png").stat().st_size > 0


def test_a_plot_with_only_thin_figures_is_still_written(tmp_path: Path) -> None:
    thin = fold_evaluations({"a": Evaluation("full", 3, 3, 0.1)})
    report = RunReport(method="fedavg", config={})
    report.add_round(RoundRecord(round=0, accuracy={}, loss=None, bytes_down=1, bytes_up=1, seconds=1.0,
                                 host_seconds=0.1, participants=["a"], aggregated=True,
                                 federated_accuracy=thin.accuracy, evaluation=thin.summary(20)))
    report.write(tmp_path)
    assert (tmp_path / "accuracy.png").stat().st_size > 0
