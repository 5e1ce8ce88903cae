"""bench/bench_ray.py's model of the speed-up that device-to-actor binding allows."""

from __future__ import annotations

import argparse
import importlib.util
from pathlib import Path
from types import SimpleNamespace

import pytest

BENCH = Path(__file__).parents[1] / "bench"


@pytest.fixture()
def bench_ray(monkeypatch):
    monkeypatch.syspath_prepend(str(BENCH))  # the script imports bench/emit.py
    spec = importlib.util.spec_from_file_location("bench_ray", BENCH / "bench_ray.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _report(hosts: list[list[str]], rounds: list[list[str]]) -> SimpleNamespace:
    return SimpleNamespace(config={"ray": {"hosts": [{"devices": h} for h in hosts]}},
                           rounds=[SimpleNamespace(participants=p) for p in rounds])


def test_binding_bound_is_participants_over_the_busiest_actor(bench_ray):
    hosts = [["d0", "d1", "d2"], ["d3", "d4", "d5"]]
    # the first and last rounds are left out (start-up, evaluation), as in the timings
    rounds = [["d0", "d3"], ["d0", "d1", "d2", "d3"], ["d0", "d3", "d4", "d5"], ["d0", "d1", "d3", "d4"], ["d0"]]
    # steady rounds: 4/3, 4/3, 4/2 -> median 4/3
    assert bench_ray.binding_bound(_report(hosts, rounds)) == pytest.approx(4 / 3)


def test_binding_table_one_worker_gains_nothing_and_a_pool_caps_at_participants(bench_ray):
    args = argparse.Namespace(seed=0, devices=20, per_round=4, workers=[1, 2, 4, 8])
    rows = {int(line.split("|")[1]): [c.strip() for c in line.split("|")[2:-1]]
            for line in bench_ray.binding(args, draws=2000).splitlines() if line.startswith("| ") and
            line.split("|")[1].strip().isdigit()}
    assert rows[1][:2] == ["4.00", "1.00x"]
    allowed = [float(rows[w][1].rstrip("x")) for w in (1, 2, 4, 8)]
    assert allowed == sorted(allowed) and allowed[-1] < 4.0  # more workers help, never to the pool's ceiling
    assert [rows[w][3] for w in (1, 2, 4, 8)] == ["1.00x", "2.00x", "4.00x", "4.00x"]
