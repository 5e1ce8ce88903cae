"""How many full (generation 2) garbage collections a Python script runs, and how long they take.

    OMP_NUM_THREADS=1 python bench/gc_collections.py bench/sim_startup.py --clients 10000

Runs the script in this process (as ``python SCRIPT ARGS`` would) with a ``gc.callbacks`` hook,
printing each full collection as it ends (seconds since start, its duration, objects collected)
and, at exit, every generation's count and total seconds. Issue 39: a 10,000-device start-up ran
12 full collections (1.8 s) before `simulation/long_lived.py`, 7 (0.4 s) after.
"""

from __future__ import annotations

import atexit
import gc
import runpy
import sys
import time

_started: dict[int, float] = {}
_totals = {generation: [0, 0.0] for generation in range(3)}
_T0 = time.perf_counter()


def _hook(phase: str, info: dict) -> None:
    generation, now = info["generation"], time.perf_counter()
    if phase == "start":
        _started[generation] = now
        return
    took = now - _started.get(generation, now)
    _totals[generation][0] += 1
    _totals[generation][1] += took
    if generation == 2:
        print(f"full collection at {now - _T0:.1f} s: {took * 1e3:.0f} ms, {info['collected']} collected", flush=True)


def main() -> None:
    if len(sys.argv) < 2:
        sys.exit("usage: python bench/gc_collections.py SCRIPT [ARGS...]")
    gc.callbacks.append(_hook)
    atexit.register(lambda: print("collections by generation (count, s): "
                                  + ", ".join(f"{g}: ({n}, {s:.2f})" for g, (n, s) in _totals.items()), flush=True))
    sys.argv = sys.argv[1:]
    runpy.run_path(sys.argv[0], run_name="__main__")


if __name__ == "__main__":
    main()
