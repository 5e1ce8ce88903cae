"""What a newcomer meets at the command line: impossible options are one-line errors, Ctrl-C
stops a job cleanly and keeps the report of its finished rounds, -v and --version work where
people type them, and NNI's INFO chatter stays out of a normal run."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from edge_sdk.cli import build_parser
from tests.support.requirements import expected_pruning_backend
from tests.support.paths import REPO_ROOT

EDGEFL = [sys.executable, "-m", "edge_sdk.cli"]


def _run(*args: str, timeout: float = 60) -> subprocess.CompletedProcess:
    return subprocess.run([*EDGEFL, *args], capture_output=True, text=True, timeout=timeout)


@pytest.mark.parametrize("args, message", [
    (["--rounds", "0"], "argument --rounds: must be >= 1, got 0"),
    (["--rounds", "-1"], "argument --rounds: must be >= 1, got -1"),
    (["--clients", "0"], "argument --clients: must be >= 1, got 0"),
    (["--lr", "nan"], "argument --lr: must be a finite number > 0"),
    (["--local-epochs", "two"], "argument --local-epochs: expected an integer, got 'two'"),
    (["--backend", "ray", "--ray-actors-per-worker", "0"], "argument --ray-actors-per-worker: must be >= 1, got 0"),
    (["--dataset", "mnistt"], "argument --dataset: unknown dataset 'mnistt'; choose from mnist-sample"),
    (["--dataset", "npz:/nonexistent.npz"], "argument --dataset: '/nonexistent.npz': no such file"),
    (["--model", "cnnn"], "argument --model: unknown model family 'cnnn'; choose from auto, cnn4"),
    (["--model", "spec:/nonexistent.json"], "argument --model: '/nonexistent.json': no such file"),
])
def test_impossible_simulate_options_are_one_line_errors(tmp_path: Path, args: list[str], message: str) -> None:
    started = time.monotonic()
    run = _run("simulate", "--out", str(tmp_path / "out"), *args)
    assert run.returncode == 2 and message in run.stderr, run.stderr
    assert "Traceback" not in run.stderr and time.monotonic() - started < 30
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("args, message", [
    (["simulate", "--round", "3"], "unrecognized arguments: --round 3"),
    (["simulate", "--rouds", "3"], "unrecognized arguments: --rouds 3"),
    (["coordinator", "--conf", "x.toml"], "the following arguments are required: --config"),  # not --config
    (["client", "--config", "c.toml", "--bogus"], "unrecognized arguments: --bogus"),
])
def test_a_bad_flag_is_the_sub_commands_error_with_its_usage_and_never_abbreviated(args, message) -> None:
    """``--round 3`` is not taken for ``--rounds 3``; the error shows the sub-command's usage."""
    run = _run(*args)
    assert run.returncode == 2 and f"usage: edgefl {args[0]}" in run.stderr, run.stderr
    assert f"edgefl {args[0]}: error: {message}" in run.stderr, run.stderr


def test_impossible_federation_settings_are_rejected_by_the_config_too() -> None:
    from simulation.simulate import SimulationConfig
    from coordinator.core.federation import FederationConfig

    for bad in ({"rounds": 0}, {"rounds": -1}, {"min_devices": 0}, {"quorum": 0.0}, {"quorum": 1.5},
                {"devices_per_round": 0}, {"round_deadline_s": float("nan")}):
        with pytest.raises(ValueError, match=next(iter(bad))):
            FederationConfig(**bad)
    with pytest.raises(ValueError, match="clients"):
        SimulationConfig(clients=0)
    with pytest.raises(ValueError, match="throttle"):
        SimulationConfig(throttle="fast")


def test_version_and_verbose_after_the_sub_command() -> None:
    run = _run("--version")
    assert run.returncode == 0 and run.stdout.startswith("edgefl ")
    parser = build_parser()
    assert parser.parse_args(["simulate", "-v", "--rounds", "2"]).verbose == 1
    assert parser.parse_args(["-vv", "simulate"]).verbose == 2
    assert parser.parse_args(["predict", "-vv"]).verbose == 2
    assert parser.parse_args(["simulate"]).verbose == 0


def test_simulate_help_shows_defaults_and_where_method_options_are_documented() -> None:
    text = " ".join(_run("simulate", "--help").stdout.split())
    assert "federated rounds (default: 3)" in text and "local SGD learning rate (default: 0.05; minirocket: 0.004)" in text
    assert "docs/methods/METHOD.md" in text
    root = REPO_ROOT
    assert (root / "docs" / "methods").is_dir()


@pytest.mark.slow
@pytest.mark.parametrize("sig, code, said", [(signal.SIGINT, 130, "interrupted after"),
                                             (signal.SIGTERM, 0, "stopped (SIGTERM) after")])
def test_ctrl_c_or_sigterm_stops_the_job_mid_round_and_keeps_the_finished_rounds(tmp_path: Path, sig, code,
                                                                                  said) -> None:
    """Ctrl-C exits 130; SIGTERM (systemctl stop) is a requested stop and exits 0: both without
    waiting for the round under way, the finished rounds' report written."""
    out = tmp_path / "run"
    proc = subprocess.Popen([*EDGEFL, "simulate", "--clients", "3", "--rounds", "500", "--dataset", "digits",
                             "--model", "mlp", "--local-epochs", "1", "--out", str(out)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env={**os.environ, "COLUMNS": "200", "PYTHONUNBUFFERED": "1"},
                            # as in a terminal, even when the suite runs as a background job (SIGINT ignored)
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    lines = []
    try:
        assert proc.stdout is not None
        for line in proc.stdout:
            lines.append(line)
            if line.startswith("round 2/500"):
                break
        proc.send_signal(sig)
        interrupted = time.monotonic()
        rest, err = proc.communicate(timeout=60)
    finally:
        proc.kill()
    assert proc.returncode == code, "".join(lines) + rest + err
    assert time.monotonic() - interrupted < 30
    assert "Traceback" not in err and "terminate called" not in err, err
    assert said in rest and "report of those rounds" in rest, rest
    report = json.loads((out / "report.json").read_text())
    assert report["status"] == "interrupted" and len(report["rounds"]) >= 2
    assert [d["id"] for d in report["devices"]] == ["dev000", "dev001", "dev002"]


@pytest.mark.slow
def test_pruning_methods_do_not_print_nni_info_logs(tmp_path: Path) -> None:
    run = _run("simulate", "--method", "static-prune", "--clients", "2", "--rounds", "1", "--dataset", "digits",
               "--model", "mlp", "--local-epochs", "1", "--out", str(tmp_path), timeout=240)
    assert run.returncode == 0, run.stderr
    output = run.stdout + run.stderr
    assert "nni" not in output.lower(), output
    # ...and NNI did the pruning where it should (a broken NNI must not pass as torch-pruning under CI)
    report = json.loads((tmp_path / "report.json").read_text())
    assert report["config"]["method_config"]["pruning_backend"] == expected_pruning_backend()
    assert "round 1/1: accuracy" in output and "pruned" in output  # labels read as pruning levels


def test_a_new_coordinator_job_keeps_the_previous_jobs_report(tmp_path: Path) -> None:
    from coordinator.runtime.report import keep_previous_report as _keep_previous_report

    (tmp_path / "report.json").write_text('{"status": "finished"}')
    _keep_previous_report(tmp_path)
    kept = list(tmp_path.glob("report-*.json"))
    assert len(kept) == 1 and json.loads(kept[0].read_text()) == {"status": "finished"}
    assert not (tmp_path / "report.json").exists()
    _keep_previous_report(tmp_path)  # nothing to keep: nothing happens
    assert len(list(tmp_path.glob("report-*.json"))) == 1


def test_a_coordinator_that_cannot_connect_leaves_the_last_report_where_it_was(tmp_path: Path) -> None:
    """A failed start (a wrong password, or as here a broker that is not there) touches no earlier
    report: it is still report.json, not moved aside."""
    import socket

    with socket.socket() as probe:  # a free port: the connection is refused
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    out = tmp_path / "report"
    out.mkdir()
    (out / "report.json").write_text('{"status": "finished"}')
    config = tmp_path / "coordinator.toml"
    config.write_text(f'method = "fedavg"\njob = "gone"\nout = "{out}"\n[broker]\nurl = "mqtt://127.0.0.1:{port}"\n'
                      f'connect_retry_s = 1\n[task]\ninput_shape = [1, 8, 8]\nnum_classes = 10\nmean = [0.5]\n'
                      f'std = [0.25]\n')
    run = _run("coordinator", "--config", str(config), timeout=120)
    assert run.returncode == 2 and "Traceback" not in run.stderr, run.stdout + run.stderr
    assert (out / "report.json").read_text() == '{"status": "finished"}'
    assert not list(out.glob("report-*.json"))
