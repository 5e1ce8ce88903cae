"""What torch threads cost: (1) a second torch thread in a process, (2) threads on a busy machine.

(1) Local training before and after another thread has run a multi-threaded torch operation
(why simulated devices hand their rounds to one thread, simulation/training_queue.py):

    python bench/bench_torch_threads.py [--threads 2] [--repeats 7]

Every thread that runs a parallel torch operation keeps an OpenMP team of its own; with more
OpenMP threads in the process than cores, libgomp no longer spins between parallel regions.
Prints the median seconds of training cnn4 on 600 images (one epoch, batch 32, SGD) in this
process' main thread: first while it is the only torch thread, then after one other thread ran
one operation with ``--threads`` threads (that thread stays alive, idle, as a simulated device
would), and the ratio. The order matters, since a team once made stays: one process, one run.

(2) ``--matrix``: one device's round of the README's quick start (cnn4, 500 images, 2 epochs,
batch 32) with 1 torch thread, 2, and torch's default (one per core), on this machine as it is
("idle"), then with N busy-loop processes competing for the cores, for each N of ``--busy``
(default: one per core); every cell is a fresh process, median of ``--repeats``:

    python bench/bench_torch_threads.py --matrix [--variants 1,2,default] [--busy 1,2] [--repeats 5]

A variant is a thread count or ``default`` (no OMP_NUM_THREADS, no ``set_num_threads``), and may
end in ``:passive`` to run with ``OMP_WAIT_POLICY=PASSIVE`` (OpenMP threads sleep instead of
spinning while they wait).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import threading
import time

import numpy as np
import torch

from edge_sdk.models.spec import build_model
from edge_sdk.models.zoo import model_for_dataset
from edge_sdk.training import TrainConfig, train_local

__all__ = ["main"]


def _round_times(spec: dict, x: np.ndarray, y: np.ndarray, config: TrainConfig, repeats: int) -> list[float]:
    """Seconds of ``repeats`` local trainings of a fresh model (after one that warms up)."""
    times = []
    for i in range(repeats + 1):
        model = build_model(spec)
        start = time.perf_counter()
        train_local(model, x, y, config, seed=i)
        times.append(time.perf_counter() - start)
    return times[1:]


def _train_seconds(spec: dict, x: np.ndarray, y: np.ndarray, repeats: int) -> float:
    return statistics.median(_round_times(spec, x, y, TrainConfig(epochs=1, batch_size=32, lr=0.05), repeats))


#: one device's round of the README's quick start: 4,000 training digits over 8 devices, 2 epochs
ROUND_SAMPLES, ROUND_EPOCHS = 500, 2


def _one_cell(threads: int | None, repeats: int) -> dict:
    """Median seconds of one device round in this (fresh) process; ``threads`` None: torch's default."""
    if threads is not None:
        torch.set_num_threads(threads)
    rng = np.random.default_rng(0)
    x = rng.random((ROUND_SAMPLES, 1, 28, 28), dtype=np.float32)
    y = rng.integers(0, 10, ROUND_SAMPLES)
    spec = model_for_dataset("cnn4", (1, 28, 28), 10)
    times = _round_times(spec, x, y, TrainConfig(epochs=ROUND_EPOCHS, batch_size=32), repeats)
    return {"threads": torch.get_num_threads(), "median_s": statistics.median(times), "max_s": max(times)}


def _cell_in_subprocess(variant: str, repeats: int) -> dict:
    count, _, policy = variant.partition(":")
    env = {k: v for k, v in os.environ.items() if k not in ("OMP_NUM_THREADS", "OMP_WAIT_POLICY")}
    if policy == "passive":
        env["OMP_WAIT_POLICY"] = "PASSIVE"
    elif policy:
        raise SystemExit(f"unknown variant {variant!r}: THREADS[:passive]")
    args = [sys.executable, __file__, "--cell", "--repeats", str(repeats)]
    if count != "default":
        args += ["--threads", str(int(count))]
    out = subprocess.run(args, env=env, capture_output=True, text=True, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def _busy_loops(n: int) -> list[subprocess.Popen]:
    """``n`` processes that spin a core each until terminated (a loaded machine)."""
    return [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(n)]


def matrix(variants: list[str], busy: list[int], repeats: int) -> list[dict]:
    """Every variant idle, then with each count of ``busy`` loops; prints a markdown table and
    returns the rows."""
    rows = {v: {"variant": v} for v in variants}
    loads = [("idle", 0)] + [(f"{n} busy", n) for n in busy]
    for label, n in loads:
        load_before = os.getloadavg()[0]
        loops = _busy_loops(n)
        try:
            time.sleep(1.0 if n else 0.0)
            for v in variants:
                cell = _cell_in_subprocess(v, repeats)
                rows[v]["threads"] = cell["threads"]
                rows[v][label] = cell["median_s"]
                rows[v][label + "_max"] = cell["max_s"]
                print(f"  {label:6s} {v:12s} {cell['threads']} threads: median {cell['median_s']:.3f} s "
                      f"(max {cell['max_s']:.3f}); load average before {load_before:.2f}", flush=True)
        finally:
            for p in loops:
                p.terminate()
            for p in loops:
                p.wait()
    print(f"\ncnn4, one quick-start device round ({ROUND_SAMPLES} images, {ROUND_EPOCHS} epochs, batch 32), "
          f"{os.cpu_count()} CPUs, median of {repeats} (seconds; N busy = N busy-loop processes):\n")
    print("| torch threads | " + " | ".join(label for label, _ in loads) + " |")
    print("|---|" + "---:|" * len(loads))
    for r in rows.values():
        print(f"| {r['variant']} ({r['threads']}) | " + " | ".join(
            f"{r[label]:.2f}" + (f" ({r[label] / r['idle']:.1f}×)" if n else "") for label, n in loads) + " |")
    return list(rows.values())


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's)")
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--matrix", action="store_true", help="threads × idle/loaded, each in a fresh process")
    parser.add_argument("--variants", default="1,2,default", help="--matrix: comma-separated THREADS[:passive]")
    parser.add_argument("--busy", default=str(os.cpu_count() or 1),
                        help="--matrix: comma-separated counts of busy-loop processes, one loaded case each "
                             "(default: one per core)")
    parser.add_argument("--cell", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.cell:
        print(json.dumps(_one_cell(args.threads, args.repeats)))
        return
    if args.matrix:
        matrix(args.variants.split(","), [int(n) for n in args.busy.split(",")], args.repeats)
        return
    if args.threads is None:
        args.threads = torch.get_num_threads()
    torch.set_num_threads(args.threads)
    rng = np.random.default_rng(0)
    x = rng.random((600, 1, 28, 28), dtype=np.float32)  # the timing does not depend on the pixels
    y = rng.integers(0, 10, 600)
    spec = model_for_dataset("cnn4", (1, 28, 28), 10)
    alone = _train_seconds(spec, x, y, args.repeats)

    release = threading.Event()

    def other_torch_thread() -> None:
        torch.set_num_threads(args.threads)
        torch.ones(1000, 1000).add_(1.0)  # one parallel region: this thread now has a team
        release.wait()

    other = threading.Thread(target=other_torch_thread, daemon=True)
    other.start()
    time.sleep(0.5)
    shared = _train_seconds(spec, x, y, args.repeats)
    release.set()
    print(f"cnn4, 600 images, 1 epoch, batch 32, {args.threads} torch threads, median of {args.repeats}:")
    print(f"  the only torch thread of the process:        {alone:.3f} s")
    print(f"  after one other thread ran a torch operation: {shared:.3f} s")
    print(f"**training is {shared / alone:.2f}x slower once another thread has run torch**")


if __name__ == "__main__":
    main()
