"""bench/hostile.py keeps working: one cheap scenario pair (the attacker-free baseline and
``spoof``, one round) on a real TLS mosquitto with the shipped configs gives well-formed results
and a table. It checks the harness, not the defences (those are tested beside the code).

Slow (about a minute on two busy cores: two whole fleets start, each with a coordinator and two
devices importing torch), so it is marked ``bench``: left out unless asked for with ``-m bench``.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support.requirements import HOME_TOOLS, needs
from tests.support.paths import REPO_ROOT

ROOT = REPO_ROOT
BENCH = ROOT / "bench" / "hostile.py"

pytestmark = [pytest.mark.bench, pytest.mark.slow, needs(*HOME_TOOLS)]  # slow too: `-m "not slow"` leaves it out


def test_a_scenario_pair_gives_well_formed_results(tmp_path: Path) -> None:
    out = tmp_path / "results"
    env = dict(os.environ, OMP_NUM_THREADS="1")
    run = subprocess.run([sys.executable, str(BENCH), "--attacks", "spoof", "--spoof-transfers", "20",
                          "--rounds", "1", "--deadline-s", "20",
                          "--out", str(out), "--workdir", str(tmp_path / "fleets")],
                         capture_output=True, text=True, env=env, timeout=280, cwd=ROOT)
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    results = {p.name: json.loads(p.read_text()) for p in out.glob("*.json")}
    assert set(results) == {"none-s0.json", "spoof-s0.json"}
    base, attacked = results["none-s0.json"], results["spoof-s0.json"]
    assert base["run_id"] == attacked["run_id"] and len(base["git"]["commit"]) == 40
    for result in (base, attacked):
        assert result["bench"] == "hostile" and result["settings"]["rounds"] == 1
        assert result["outcome"]["ending"] in ("finished", "crashed", "stalled", "broker_died")
        assert result["rss_peak_mb"]["coordinator"] > 0 and result["rss_peak_mb"]["mosquitto"] > 0
        assert len(result["rounds"]) == result["rounds_completed"] <= 1
        assert 0 <= result["honest_updates_lost"] <= 2
        assert set(result["connections_lost"]) == {"pi-kitchen", "pi-den", "coordinator"}
    # the baseline is a real job: it ran its round with both honest devices
    assert base["outcome"]["ending"] == "finished" and base["honest_updates_lost"] == 0
    assert 0.0 < base["accuracy"]["final"] <= 1.0
    assert base["attacker"] is None and base["settings"]["min_devices"] == 2
    # the attacker really ran: it connected, saw the round start and sent its spoofed chunks
    attacker = attacked["attacker"]
    assert not attacked["outcome"]["attacker_failed"] and attacked["settings"]["min_devices"] == 2
    assert attacker["attacks"] == ["spoof"] and attacker["rounds_seen"] == [0]
    assert attacker["sent"]["spoof"]["messages"] >= 1
    assert set(attacked["blamed_honest"]) == {"pi-kitchen", "pi-den"}
    table = subprocess.run([sys.executable, str(BENCH), "--table", "--out", str(out)], capture_output=True,
                           text=True, check=True, cwd=ROOT).stdout
    assert table.splitlines()[0].split()[:2] == ["scenario", "acc"]
    assert any(line.startswith("spoof ") for line in table.splitlines())
