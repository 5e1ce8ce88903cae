"""What the default update screen costs an honest fleet, method by method (issue 56).

Every method's default job (``edgefl simulate --method M --clients 8 --rounds R``, MNIST sample,
the mixed profile fleet, every default) run twice per seed and partition: with the default screen
and with ``--option clip=none``. Each job in a fresh process, two at a time:

    python bench/screen_cost.py --out bench/results/screen_cost.jsonl          # the whole table (~1 h on 2 cores)
    python bench/screen_cost.py --methods reft --seeds 1 --partitions iid      # one cell

Every screened job runs first, then the unscreened ones. Results go to a JSON-lines file (one job a line; jobs already in it are not run again) and the
table is printed from it: the final accuracy (``global``, or the mean over a method's widths /
levels / devices when it has no global model) with and without the screen, and the difference in
points, and how many updates the screen scaled back in the screened jobs (``clipped``, REFT's
``teachers_clipped``: 0 means the screen never acted). A difference above 0.5 point is the issue's bug.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

__all__ = ["METHODS", "SCREENS", "job_args", "final_accuracy", "main"]

METHODS = ("fedavg", "fedprox", "flanc", "heterofl", "fedpara", "pfedpara", "lowrank", "fdnnc", "static-prune", "reft")
#: the default screen, and none
SCREENS = {"default": (), "clip=none": ("--option", "clip=none")}
ROUNDS = 5  # REFT is one-shot: 1


def job_args(method: str, seed: int, partition: str, screen: str, out: Path, rounds: int) -> list[str]:
    """The ``edgefl simulate`` arguments of one job."""
    return ["simulate", "--method", method, "--clients", "8", "--rounds", str(1 if method == "reft" else rounds),
            "--partition", partition, "--seed", str(seed), "--out", str(out), *SCREENS[screen]]


def final_accuracy(report: dict) -> float:
    """The last evaluation's global accuracy, or the mean over its labels when there is no global model."""
    accuracy = report["final"]["accuracy"]
    if "global" in accuracy:
        return float(accuracy["global"])
    return sum(accuracy.values()) / len(accuracy)


def _run(key: tuple, rounds: int, work: Path) -> dict:
    method, seed, partition, screen = key
    out = work / f"{method}-{seed}-{partition.replace(':', '')}-{screen.replace('=', '')}"
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    proc = subprocess.run([sys.executable, "-c", "import sys; from edge_sdk.cli import main; sys.exit(main())",
                           *job_args(method, seed, partition, screen, out, rounds)],
                          env=env, capture_output=True, text=True)
    if proc.returncode != 0:
        return {"method": method, "seed": seed, "partition": partition, "screen": screen,
                "error": proc.stderr.strip().splitlines()[-1:]}
    report = json.loads((out / "report.json").read_text())
    return {"method": method, "seed": seed, "partition": partition, "screen": screen, "rounds": rounds,
            "accuracy": final_accuracy(report), "labels": report["final"]["accuracy"],
            "clipped": screened(report)}


def screened(report: dict) -> int:
    """How many updates (or teachers) the screen scaled back over the whole job."""
    return int(sum(r.get("metrics", {}).get(key, 0) for r in report["rounds"] for key in ("clipped", "teachers_clipped")))


def table(rows: list[dict]) -> str:
    """The markdown table: one line per method and partition, seeds side by side."""
    cells: dict[tuple, dict] = {}
    for r in rows:
        if "accuracy" in r:
            cells.setdefault((r["method"], r["partition"]), {})[(r["seed"], r["screen"])] = r["accuracy"]
    clipped: dict[tuple, int] = {}
    for r in rows:
        if r.get("screen") == "default" and "clipped" in r:
            clipped[(r["method"], r["partition"])] = clipped.get((r["method"], r["partition"]), 0) + r["clipped"]
    lines = ["| method | partition | seeds | default screen | clip=none | difference (points) | worst seed | "
             "updates screened |", "| --- | --- | --- | --- | --- | --- | --- | --- |"]
    for (method, partition), got in sorted(cells.items(), key=lambda kv: (METHODS.index(kv[0][0]), kv[0][1])):
        seeds = sorted({s for s, screen in got if (s, "default") in got and (s, "clip=none") in got})
        if not seeds:
            continue
        on = [got[(s, "default")] for s in seeds]
        off = [got[(s, "clip=none")] for s in seeds]
        diffs = [100 * (a - b) for a, b in zip(on, off)]
        lines.append(f"| {method} | {partition} | {','.join(map(str, seeds))} | "
                     f"{' / '.join(f'{a:.3f}' for a in on)} | {' / '.join(f'{b:.3f}' for b in off)} | "
                     f"{sum(diffs) / len(diffs):+.1f} | {min(diffs):+.1f} | {clipped.get((method, partition), '?')} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=Path("bench/results/screen_cost.jsonl"))
    parser.add_argument("--methods", default=",".join(METHODS))
    parser.add_argument("--seeds", default="0,1,2")
    parser.add_argument("--partitions", default="iid,shards:3")
    parser.add_argument("--rounds", type=int, default=ROUNDS)
    parser.add_argument("--jobs", type=int, default=2, help="jobs at once (default: 2)")
    args = parser.parse_args(argv)
    rows = [json.loads(line) for line in args.out.read_text().splitlines()] if args.out.exists() else []
    done = {(r["method"], r["seed"], r["partition"], r["screen"]) for r in rows if "accuracy" in r}
    todo = [(m, int(s), p, screen) for screen in SCREENS for m in args.methods.split(",")  # every screened job first
            for p in args.partitions.split(",") for s in args.seeds.split(",") if (m, int(s), p, screen) not in done]
    args.out.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as work, ThreadPoolExecutor(args.jobs) as pool, args.out.open("a") as sink:
        for row in pool.map(lambda key: _run(key, args.rounds, Path(work)), todo):
            print(json.dumps(row), file=sink, flush=True)
            print(row, flush=True)
            rows.append(row)
    print(table(rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
