"""report.json and the plots: written the same, faster, however many devices."""

from __future__ import annotations

import json
from pathlib import Path

from coordinator.runtime.report import RoundRecord, RunReport, report_json


def _report(devices: int) -> RunReport:
    report = RunReport(method="fedavg", config={"clients": devices, "devices": []})
    for rnd in range(2):
        report.add_round(RoundRecord(round=rnd, accuracy={"full": 0.5 + rnd / 10}, loss=1.0 - rnd / 10,
                                     bytes_down=100, bytes_up=90, seconds=1.0, host_seconds=0.5,
                                     participants=["dev000"], aggregated=True))
    report.devices = [{"id": f"dev{i:03d}", "profile": "laptop", "flops": 1e9, "measured": False,
                       "assignment": "full", "bytes_down": 0, "bytes_up": 0} for i in range(devices)]
    return report


def test_report_json_is_the_report_with_a_line_per_device() -> None:
    report = _report(3).to_dict()
    # a device's own text (its evaluation's label) may hold what separates entries, and a newline
    report["devices"][1]["evaluation"] = {"round": 1, "label": "}, {\n\"id\": 1", "samples": 2, "accuracy": 0.5}
    text = report_json(report)
    assert json.loads(text) == report
    d0, d1, d2 = (json.dumps(d) for d in report["devices"])
    assert text.splitlines()[-6:] == ['  "devices": [', f"    {d0},", f"    {d1},", f"    {d2}", "  ]", "}"]
    empty = {"method": "fedavg", "devices": []}
    assert json.loads(report_json(empty)) == empty


def test_the_plots_imports_made_ahead_are_waited_for_and_the_plots_written(tmp_path: Path) -> None:
    report = _report(2)
    report.prepare_plots()
    report.prepare_plots()  # once is enough
    thread = report._plots_import
    assert thread is not None
    report.write_outcome(tmp_path, finished=True)
    assert not thread.is_alive()
    assert (tmp_path / "accuracy.png").stat().st_size > 0 and (tmp_path / "bytes.png").stat().st_size > 0
    assert json.loads((tmp_path / "report.json").read_text())["devices"][1]["id"] == "dev001"


def test_an_interrupted_job_without_rounds_waits_for_the_imports_and_writes_nothing(tmp_path: Path) -> None:
    report = RunReport(method="fedavg", config={})
    report.prepare_plots()
    report.write_outcome(tmp_path / "out", finished=False)
    assert report._plots_import is not None and not report._plots_import.is_alive()
    assert not (tmp_path / "out").exists()
