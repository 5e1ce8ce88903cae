"""bench/bench_ray.py's model of the speed-up that device-to-actor binding allows."""

from __future__ import annotations

import argparse
import importlib.util
from types import SimpleNamespace

import pytest
from tests.support.paths import REPO_ROOT

BENCH = REPO_ROOT / "bench"


@pytest.fixture()
def bench_ray(monkeypatch):
    monkeypatch.syspath_prepend(str(BENCH))  # the script imports bench/emit.py
    spec = importlib.util.spec_from_file_location("bench_ray", BENCH / "bench_ray.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _report(hosts: list[list[str]], rounds: list[list[str]], workers: int) -> SimpleNamespace:
    return SimpleNamespace(config={"ray": {"hosts": [{"devices": h} for h in hosts]}, "ray_workers": workers},
                           rounds=[SimpleNamespace(participants=p) for p in rounds])


def test_training_turns_serve_the_longest_queue_first(bench_ray):
    assert bench_ray.training_turns([3, 1, 1, 1], 2) == 3  # 6 devices, 2 at once, the 3 never wait
    assert bench_ray.training_turns([2, 2, 2], 2) == 3
    assert bench_ray.training_turns([4, 1], 4) == 4  # one actor trains one device at a time
    assert bench_ray.training_turns([0, 0], 2) == 0


def test_binding_bound_is_participants_over_their_training_turns(bench_ray):
    hosts = [["d0", "d1", "d2"], ["d3", "d4", "d5"]]
    # the first and last rounds are left out (start-up, evaluation), as in the timings
    rounds = [["d0", "d3"], ["d0", "d1", "d2", "d3"], ["d0", "d3", "d4", "d5"], ["d0", "d1", "d3", "d4"], ["d0"]]
    # steady rounds with 2 workers, one actor each: 4/3, 4/3, 4/2 -> median 4/3
    assert bench_ray.binding_bound(_report(hosts, rounds, 2)) == pytest.approx(4 / 3)
    # one worker: every round takes as many turns as participants
    assert bench_ray.binding_bound(_report(hosts, rounds, 1)) == pytest.approx(1.0)


def test_binding_table_more_actors_per_worker_come_closer_to_the_pool(bench_ray):
    args = argparse.Namespace(seed=0, devices=20, per_round=4, workers=[1, 2, 4], actors_per_worker=[1, 2, 4])
    rows = {int(line.split("|")[1]): [c.strip().split()[0] for c in line.split("|")[2:-1]]
            for line in bench_ray.binding(args, draws=2000).splitlines() if line.startswith("| ") and
            line.split("|")[1].strip().isdigit()}
    assert rows[1] == ["1.00x"] * 4  # one worker gains nothing, however many actors
    for w in (2, 4):
        allowed = [float(c.rstrip("x")) for c in rows[w][:3]]
        assert allowed == sorted(allowed) and allowed[0] < allowed[2]  # more actors per worker help
        assert allowed[2] <= float(rows[w][3].rstrip("x"))  # never past the pool's ceiling
    assert [rows[w][3] for w in (1, 2, 4)] == ["1.00x", "2.00x", "4.00x"]
