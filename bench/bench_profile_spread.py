"""How far `edgefl profile`'s GFLOPS figure swings: the old measurement against the new one, idle and
with busy cores (issue 36, item 2).

    python bench/bench_profile_spread.py [--runs 10] [--busy 2] [--seconds 1.0] [--threads N] [--json FILE]

Each measurement runs in a fresh Python process, as `edgefl profile` does, with torch's default
thread count unless ``--threads`` is given. OLD is the measurement before issue 36 (a copy is kept
below: the first conv batch whose run takes 30 ms, then the median of repetitions filling half of
``--seconds``); NEW is `edge_sdk.profiling.measure_flops_detail` (a size that no longer gains, then
the 90th percentile of 10 short trials, with a busy verdict). The two alternate, ``--runs`` times
each, first on the machine as it is ("idle"), then with ``--busy`` processes spinning in a Python
busy loop. Prints, per condition and method, the conv figure's min / median / max, max/min, the
seconds per measurement, and for NEW how many runs it judged busy; the load average and the CPU
time other processes used during NEW's runs say how idle "idle" was.
"""

from __future__ import annotations

import argparse
import json
import math
import multiprocessing
import os
import statistics
import subprocess
import sys
import time
from typing import Any, Callable

__all__ = ["main", "old_measure_flops_detail"]


# ----------------------------------------------------------------------------- the old measurement
# edge_sdk/profiling.py before issue 36 (git show a8ce8bc^:edge_sdk/profiling.py), conv and matmul.


def _time_once(fn: Callable[[], None]) -> float:
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


def _timed_median(fn: Callable[[], None], budget: float) -> float:
    times: list[float] = []
    start = time.perf_counter()
    while len(times) < 3 or (time.perf_counter() - start < budget and len(times) < 10_000):
        times.append(_time_once(fn))
    return statistics.median(times)


def _scale_up(make: Callable[[int], Callable[[], None]], sizes: tuple[int, ...], target: float):
    for size in sizes:
        fn = make(size)
        _time_once(fn)
        if min(_time_once(fn), _time_once(fn)) >= target or size == sizes[-1]:
            break
    return size, fn


def old_measure_flops_detail(seconds: float = 1.0, threads: int | None = None) -> dict[str, Any]:
    """The pre-issue-36 measurement on the CPU (float32): both figures, from medians."""
    import torch

    target = min(0.03, seconds / 15)
    prev = torch.get_num_threads()
    if threads is not None:
        torch.set_num_threads(threads)
    try:
        gen = torch.Generator(device="cpu").manual_seed(0)

        def make_matmul(n: int) -> Callable[[], None]:
            a, b = torch.randn(n, n, generator=gen), torch.randn(n, n, generator=gen)
            return lambda: (a @ b, None)[1]

        chans, hw, k = 32, 16, 3

        def make_conv(batch: int) -> Callable[[], None]:
            x = torch.randn(batch, chans, hw, hw, generator=gen).requires_grad_()
            w = (torch.randn(chans, chans, k, k, generator=gen) * 0.1).requires_grad_()
            grad = torch.ones(batch, chans, hw, hw)

            def step() -> None:
                x.grad = w.grad = None
                torch.nn.functional.conv2d(x, w, padding=k // 2).backward(grad)
            return step

        n, mm = _scale_up(make_matmul, (256, 384, 512), target)
        mm_s = _timed_median(mm, seconds / 2)
        batch, conv = _scale_up(make_conv, (4, 8, 16, 32, 64, 128, 256), target)
        conv_s = _timed_median(conv, seconds / 2)
    finally:
        torch.set_num_threads(prev)
    conv_flops = 3 * 2 * chans * chans * k * k * hw * hw * batch
    return {"matmul_gflops": 2 * n**3 / mm_s / 1e9, "conv_train_gflops": conv_flops / conv_s / 1e9,
            "conv_batch": batch}


# ----------------------------------------------------------------------------- one measurement


def _one(method: str, seconds: float, threads: int | None) -> dict[str, Any]:
    """Measure once in this (fresh) process; what the driver prints from."""
    load = os.getloadavg()[0]
    start = time.perf_counter()
    if method == "old":
        detail = old_measure_flops_detail(seconds, threads)
        out = {"gflops": detail["conv_train_gflops"], "batch": detail["conv_batch"]}
    else:
        from edge_sdk.profiling import measure_flops_detail

        detail = measure_flops_detail(seconds, threads=threads)
        q = detail["quality"]
        out = {"gflops": detail["conv_train_gflops"], "batch": detail["conv_batch"], "busy": q.busy,
               "reason": q.reason, "others_cpu": q.others_cpu, "spread": q.spread, "trials": q.trials}
    import torch

    return {**out, "seconds": time.perf_counter() - start, "load_avg": load, "threads": torch.get_num_threads()
            if threads is None else threads}


# ----------------------------------------------------------------------------- the driver


def _spin() -> None:  # a busy core: what a person's video call or compile does to a home device
    while True:
        pass


def _measure(method: str, seconds: float, threads: int | None) -> dict[str, Any]:
    cmd = [sys.executable, os.path.abspath(__file__), "--one", method, "--seconds", str(seconds)]
    if threads is not None:
        cmd += ["--threads", str(threads)]
    run = subprocess.run(cmd, capture_output=True, text=True, check=True, timeout=300)
    return json.loads(run.stdout.strip().splitlines()[-1])


def _summary(values: list[float]) -> str:
    lo, mid, hi = min(values), statistics.median(values), max(values)
    return f"min {lo:7.2f}  median {mid:7.2f}  max {hi:7.2f}  max/min {hi / lo:6.2f}"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=10, help="measurements per method and condition")
    parser.add_argument("--busy", type=int, default=2, help="busy-loop processes in the busy condition")
    parser.add_argument("--seconds", type=float, default=1.0, help="edgefl profile's --seconds")
    parser.add_argument("--threads", type=int, help="torch threads (default: torch's, as edgefl profile)")
    parser.add_argument("--json", help="also write every measurement to this JSON file")
    parser.add_argument("--one", choices=["old", "new"], help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.one:
        print(json.dumps(_one(args.one, args.seconds, args.threads)))
        return 0
    print(f"{os.cpu_count()} CPUs, load average {os.getloadavg()[0]:.2f} at the start; {args.runs} runs each, "
          f"--seconds {args.seconds}, threads {args.threads or 'torch default'}", flush=True)
    results: dict[str, dict[str, list[dict[str, Any]]]] = {}
    for condition in ("idle", f"{args.busy} busy"):
        spinners = []
        if condition != "idle":
            spinners = [multiprocessing.Process(target=_spin, daemon=True) for _ in range(args.busy)]
            for p in spinners:
                p.start()
            time.sleep(1.0)
        try:
            runs: dict[str, list[dict[str, Any]]] = {"old": [], "new": []}
            for _ in range(args.runs):
                for method in ("old", "new"):
                    runs[method].append(_measure(method, args.seconds, args.threads))
        finally:
            for p in spinners:
                p.terminate()
                p.join()
        results[condition] = runs
        for method in ("old", "new"):
            rs = runs[method]
            line = (f"{condition:7s} {method.upper():3s} GFLOPS {_summary([r['gflops'] for r in rs])}  "
                    f"{statistics.mean(r['seconds'] for r in rs):.2f} s/run, batches "
                    f"{sorted({r['batch'] for r in rs})}")
            if method == "new":
                others = [r["others_cpu"] for r in rs if r["others_cpu"] is not None]
                line += (f", judged busy {sum(r['busy'] for r in rs)}/{len(rs)}"
                         + (f", other processes {min(others):.2f}-{max(others):.2f} CPUs" if others else ""))
            print(line, flush=True)
        loads = [r["load_avg"] for m in runs.values() for r in m]
        print(f"{condition:7s} load average {min(loads):.2f}-{max(loads):.2f} during the runs", flush=True)
    if args.json:
        with open(args.json, "w", encoding="utf-8") as fh:
            json.dump({"args": vars(args), "results": results}, fh, indent=1,
                      default=lambda v: None if isinstance(v, float) and not math.isfinite(v) else v)
    return 0


if __name__ == "__main__":
    sys.exit(main())
