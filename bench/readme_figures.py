"""The README's accuracy figures, from the README's own commands (issue 36).

Runs the quick start's job and the non-IID example exactly as README.md spells them (each in a
fresh ``edgefl`` process, with ``--seed S`` and ``--threads T`` added and ``--out`` moved under
``--work``), and prints every round's accuracy and the figures the README quotes:

    python bench/readme_figures.py                    # both, seeds 0, 1, 2 (about 15 minutes on 2 idle cores)
    python bench/readme_figures.py --only quickstart  # one job, about a minute
    python bench/readme_figures.py --determinism      # the quick start twice at --threads 1, once at 2

A seeded job repeats itself bit for bit on the same machine with the same ``--threads``: the data
split, the initial model, every device's batches and the order in which the coordinator sums the
updates are seeded. A different thread count splits torch's reductions differently, so the
floats, and after a few rounds the accuracies, differ (``--determinism`` shows by how much); so may
another CPU or torch build. The README's figures are those of ``--threads 1`` (the default).
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import subprocess
import sys
import tempfile
import time
from pathlib import Path

#: README.md's commands, verbatim (tests/project/test_readme_figures.py checks that README.md has them)
QUICK_START = "edgefl simulate --method fedavg --clients 8 --rounds 5 --partition iid --out runs/fedavg"
NON_IID = "edgefl simulate --method fedavg --clients 8 --rounds 15 --partition shards:3 --out runs/noniid"
SEEDS = (0, 1, 2)
#: the non-IID figure the README quotes besides the final accuracy: the lowest round from this one on
STEADY_FROM_ROUND = 5

__all__ = ["QUICK_START", "NON_IID", "SEEDS", "run_command", "main"]


def run_command(command: str, work: Path, name: str, seed: int | None = None, threads: int = 1) -> dict:
    """Run the README's ``command`` in a fresh process, its ``--out`` under ``work/name``; return its
    accuracies per round, its final accuracy and the wall-clock seconds it took."""
    args = shlex.split(command)
    assert args[:2] == ["edgefl", "simulate"], command
    args = args[1:]
    if "--out" in args:
        i = args.index("--out")
        del args[i:i + 2]
    out = work / name
    args += ["--out", str(out), "--threads", str(threads)]
    if seed is not None:
        args += ["--seed", str(seed)]
    env = {**os.environ, "OMP_NUM_THREADS": str(threads)}
    start = time.monotonic()
    proc = subprocess.run([sys.executable, "-c", "import sys; from edge_sdk.cli import main; sys.exit(main())",
                           *args], env=env, capture_output=True, text=True)
    if proc.returncode != 0:
        raise SystemExit(f"{command} (seed {seed}) failed ({proc.returncode}):\n{proc.stderr[-2000:]}")
    report = json.loads((out / "report.json").read_text())
    accuracy = [r["accuracy"]["global"] for r in report["rounds"]]
    return {"command": command, "seed": seed, "threads": threads, "accuracy": accuracy,
            "loss": [r["loss"] for r in report["rounds"]], "final": report["final"]["accuracy"]["global"],
            "wall_s": round(time.monotonic() - start, 1)}


def _rounds(accuracy: list[float]) -> str:
    return " → ".join(f"{a:.3f}" for a in accuracy)


def quick_start(work: Path, threads: int) -> dict:
    run = run_command(QUICK_START, work, "quickstart", threads=threads)
    print(f"`{QUICK_START}` (seed 0, --threads {threads}, {run['wall_s']:.0f} s):\n"
          f"  accuracy per round {_rounds(run['accuracy'])}; final {run['final']:.3f}", flush=True)
    return run


def non_iid(work: Path, threads: int, seeds: tuple[int, ...]) -> list[dict]:
    runs = []
    for seed in seeds:
        run = run_command(NON_IID, work, f"noniid-{seed}", seed=seed, threads=threads)
        run["lowest_from_round"] = min(run["accuracy"][STEADY_FROM_ROUND - 1:])
        runs.append(run)
        print(f"`{NON_IID} --seed {seed}` (--threads {threads}, {run['wall_s']:.0f} s):\n"
              f"  accuracy per round {_rounds(run['accuracy'])}", flush=True)
    print(f"non-IID over seeds {' / '.join(str(s) for s in seeds)}: round 1 "
          + " / ".join(f"{r['accuracy'][0]:.3f}" for r in runs)
          + f"; lowest from round {STEADY_FROM_ROUND} on " + " / ".join(f"{r['lowest_from_round']:.3f}" for r in runs)
          + "; final " + " / ".join(f"{r['final']:.3f}" for r in runs), flush=True)
    return runs


def determinism(work: Path, command: str = QUICK_START) -> dict:
    """``command`` twice at one torch thread and once at two: are the accuracies identical?"""
    first = run_command(command, work, "det-1a", threads=1)
    again = run_command(command, work, "det-1b", threads=1)
    two = run_command(command, work, "det-2", threads=2)
    same = first["accuracy"] == again["accuracy"] and first["loss"] == again["loss"]
    differs = max(abs(a - b) for a, b in zip(first["accuracy"], two["accuracy"]))
    print(f"`{command}`:\n  --threads 1, twice: {_rounds(first['accuracy'])} | {_rounds(again['accuracy'])} "
          f"-> {'bit-identical (accuracy and loss)' if same else 'DIFFERENT'}\n"
          f"  --threads 2:        {_rounds(two['accuracy'])} -> largest difference from 1 thread {differs:.3f}",
          flush=True)
    return {"runs": [first, again, two], "same_threads_identical": same, "max_diff_1_vs_2_threads": differs}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--only", choices=["quickstart", "noniid"], help="one of the two figures (default: both)")
    parser.add_argument("--seeds", default=",".join(str(s) for s in SEEDS), help="non-IID seeds")
    parser.add_argument("--threads", type=int, default=1, help="torch threads of every job (the README's: 1)")
    parser.add_argument("--determinism", action="store_true",
                        help="instead: the quick start twice at 1 thread and once at 2, compared")
    parser.add_argument("--work", help="where the jobs' reports go (default: a temporary folder)")
    parser.add_argument("--json", help="also write every run's figures to this file")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="readme-figures-") as tmp:
        work = Path(args.work or tmp)
        if args.determinism:
            result: dict = determinism(work)
        else:
            result = {}
            if args.only in (None, "quickstart"):
                result["quickstart"] = quick_start(work, args.threads)
            if args.only in (None, "noniid"):
                result["noniid"] = non_iid(work, args.threads, tuple(int(s) for s in args.seeds.split(",")))
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
