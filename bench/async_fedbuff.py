"""Buffered asynchronous aggregation against synchronous rounds, side by side (issue 61).

One job, every mode: Fashion-MNIST (60,000 training images, IID over 100 devices), a home fleet
of Raspberry Pis, phones and a Jetson Nano on its CPU (1 to 12 GFLOPS: a 12x speed spread),
a fifth of the devices online only half of every 10 simulated minutes (``--offline``), central
test-set accuracy (interim: a fixed 2,000-image subset every ``--eval-every`` rounds/versions).

- ``sync``: FedAvg, 10 devices a round (``--per-round``), waiting for all of them;
- ``sync-1.5x`` / ``sync-2x`` / ``sync-3x``: with a simulated deadline of that many times the
  median round time of ``sync`` of the same seed (later updates dropped);
- ``async``: FedBuff, ``--per-round`` devices training at once, a version every 10 updates,
  staleness weight 1/sqrt(1+s);
- ``async-long``: ``async`` for 3x the versions, to compare with the synchronous job at its end;
- ``sync-hostile`` / ``async-hostile``: ``sync`` / ``async`` with one hostile member, the fleet's
  fastest device class (a Pi 5), uploading its change sign-flipped x20 (the default screen on).

Figures: the simulated time to ``--target`` accuracy (each seed, median), and each mode's accuracy
at the simulated time the synchronous job ended. Every run's JSON in ``--out`` (a finished run is
skipped). Two processes share a 2-core machine::

    apt-get install dataset-fashion-mnist
    OMP_NUM_THREADS=1 python bench/async_fedbuff.py --modes sync,sync-1.5x,sync-2x,sync-3x --seeds 0,1,2 &
    OMP_NUM_THREADS=1 python bench/async_fedbuff.py --modes async --seeds 0,1,2
    OMP_NUM_THREADS=1 python bench/async_fedbuff.py --modes async --seeds 0,1,2 --buffer-size 5   # "async-K5"
    python bench/async_fedbuff.py --table
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from contextlib import contextmanager, nullcontext
from dataclasses import replace
from pathlib import Path
from typing import Any, Iterator
from unittest import mock

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from simulation.config import SimulationConfig, sim_federation  # noqa: E402
from simulation.simulate import run_simulation  # noqa: E402

PROFILES = ("raspberry-pi-3b", "raspberry-pi-4b", "raspberry-pi-5", "android-midrange", "jetson-nano-cpu")
MODES = ("sync", "sync-1.5x", "sync-2x", "sync-3x", "async", "async-long", "sync-hostile", "async-hostile")
#: ``async-long`` runs this many times ``--rounds`` versions: as long in simulated time as the synchronous job
LONG = 3
#: the hostile member of ``*-hostile``: a Raspberry Pi 5, the fleet's fastest profile (the devices
#: take the profiles in turn), which uploads its change sign-flipped and 20 times as long
HOSTILE, HOSTILE_SCALE = "dev002", -20.0


@contextmanager
def hostile_member(device_id: str, scale: float) -> Iterator[None]:
    """FedAvg's devices as they are, but ``device_id`` uploads what it was sent plus ``scale``
    times its change (bench/bench_robust.py's attack)."""
    from edge_sdk.methods import DEVICE_METHODS

    honest = DEVICE_METHODS["fedavg"]

    def train(plan: Any, data: Any, ctx: Any) -> Any:
        update = honest(plan, data, ctx)
        if ctx.device_id != device_id:
            return update
        tensors = {k: (plan.tensors[k] + scale * (v - plan.tensors[k])).astype(v.dtype) if v.dtype.kind == "f" else v
                   for k, v in update.tensors.items()}
        return replace(update, tensors=tensors)
    with mock.patch.dict(DEVICE_METHODS, {"fedavg": train}):
        yield


def run_one(mode: str, seed: int, args: argparse.Namespace) -> dict[str, Any]:
    """One job of ``mode``; its accuracy curve over simulated time."""
    deadline = None
    if mode.startswith("sync-") and mode.endswith("x"):
        base = json.loads((Path(args.out) / f"{args.method}-sync-seed{seed}.json").read_text())
        deadline = float(mode.removeprefix("sync-").removesuffix("x")) * base["median_round_s"]
    asynchronous = mode.startswith("async")
    rounds = args.rounds * (LONG if mode == "async-long" else 1)
    federation = sim_federation(rounds=rounds, seed=seed, eval_every=args.eval_every, eval_samples=2000,
                                devices_per_round=None if asynchronous else args.per_round,
                                asynchronous=asynchronous,
                                concurrency=(args.concurrency or args.per_round) if asynchronous else None,
                                buffer_size=args.buffer_size, staleness=args.staleness)
    options = dict(o.split("=", 1) for o in args.option)
    if asynchronous:
        options.update(dict(o.split("=", 1) for o in args.async_option))
    with tempfile.TemporaryDirectory() as out:
        config = SimulationConfig(method=args.method, clients=args.clients, dataset="fashion-mnist", partition="iid",
                                  out=out, profiles=PROFILES, plots=False, holdout=0.0, threads=1,
                                  federation=federation, options=options, offline=args.offline,
                                  sim_deadline_s=deadline, chosen=tuple(options))
        started = time.monotonic()
        with hostile_member(HOSTILE, HOSTILE_SCALE) if mode.endswith("-hostile") else nullcontext():
            report = run_simulation(config)
    rounds = report.rounds
    # one figure a version: the model's accuracy (FLANC, HeteroFL: the mean over their widths)
    curve = [(r.metrics["sim_time_s"], statistics.mean(r.accuracy.values())) for r in rounds if r.accuracy]
    return {"mode": mode + variant(mode, args), "seed": seed, "method": args.method, "deadline_s": deadline,
            "median_round_s": statistics.median(r.seconds for r in rounds), "curve": curve,
            "versions": len(rounds), "host_s": time.monotonic() - started,
            "dropped_late": sum(r.metrics.get("late", 0.0) for r in rounds),
            "stale_refused": sum(r.metrics.get("stale_refused", 0.0) for r in rounds),
            "staleness_mean": statistics.mean(r.metrics.get("staleness_mean", 0.0) for r in rounds),
            "config": {"clients": args.clients, "per_round": args.per_round, "offline": args.offline,
                       "buffer_size": args.buffer_size, "staleness": args.staleness, "options": options,
                       "concurrency": (args.concurrency or args.per_round) if asynchronous else None}}


def variant(mode: str, args: argparse.Namespace) -> str:
    """An asynchronous mode's suffix when its buffer or concurrency is not the default's
    (``-K5``: a version every 5 updates; ``-C20``: 20 devices training at once)."""
    if not mode.startswith("async"):
        return ""
    return (f"-K{args.buffer_size}" if args.buffer_size != 10 else "") + (
        f"-C{args.concurrency}" if args.concurrency and args.concurrency != args.per_round else "")


def time_to(curve: list[list[float]], target: float) -> float | None:
    """The first simulated time the accuracy reached ``target`` (None: never)."""
    return next((t for t, acc in curve if acc >= target), None)


def accuracy_at(curve: list[list[float]], t: float) -> float | None:
    """The latest evaluated accuracy at or before simulated time ``t``."""
    seen = [acc for at, acc in curve if at <= t + 1e-9]
    return seen[-1] if seen else None


SYNC_MODES = ("sync", "sync-1.5x", "sync-2x", "sync-3x")


def table(out: Path, method: str, target: float) -> str:
    """Each mode's time to ``target`` and its accuracy when the best synchronous mode (least median
    time to target) ended, seed by seed ("<": the run ended before that, its last figure)."""
    runs = [json.loads(p.read_text()) for p in sorted(out.glob(f"{method}-*.json"))]
    if not runs:
        return "no runs"
    by_mode: dict[str, dict[int, dict[str, Any]]] = {}
    for run in runs:
        by_mode.setdefault(run["mode"], {})[run["seed"]] = run
    medians: dict[str, float] = {}
    for mode, seeds in by_mode.items():
        times = [time_to(r["curve"], target) for r in seeds.values()]
        if all(t is not None for t in times):
            medians[mode] = statistics.median(times)  # type: ignore[arg-type]
    best = min((m for m in SYNC_MODES if m in medians), key=medians.__getitem__, default=None)
    lines = [f"{method}: simulated seconds to {target:.0%} per seed and their median; the ratio to the best "
             f"synchronous mode ({best}); the accuracy when that mode's job ended, per seed",
             "| mode | seeds | time to target | median | ratio | accuracy at its end | versions |",
             "|---|---|---|---|---|---|---|"]
    for mode in MODES + tuple(sorted(set(by_mode) - set(MODES))):
        seeds = by_mode.get(mode)
        if not seeds:
            continue
        order = sorted(seeds)
        times = [time_to(seeds[s]["curve"], target) for s in order]
        ends = []
        for seed in order:
            reference = by_mode.get(best or "", {}).get(seed)
            if reference is None:
                ends.append("-")
                continue
            end, curve = reference["curve"][-1][0], seeds[seed]["curve"]
            acc = accuracy_at(curve, end)
            ends.append("-" if acc is None else f"{acc:.3f}" + ("<" if curve[-1][0] < end else ""))
        median = medians.get(mode)
        ratio = f"{median / medians[best]:.2f}" if median is not None and best else "-"
        lines.append(f"| {mode} | {', '.join(map(str, order))} | "
                     f"{', '.join('never' if t is None else f'{t:.0f}' for t in times)} | "
                     f"{'-' if median is None else f'{median:.0f}'} | {ratio} | {', '.join(ends)} | "
                     f"{', '.join(str(seeds[s]['versions']) for s in order)} |")
    return "\n".join(lines)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--modes", default=",".join(MODES))
    p.add_argument("--seeds", default="0")
    p.add_argument("--method", default="fedavg")
    p.add_argument("--clients", type=int, default=100)
    p.add_argument("--per-round", type=int, default=10, help="sync: devices a round; async: concurrency")
    p.add_argument("--rounds", type=int, default=80, help="rounds (sync) or versions (async)")
    p.add_argument("--buffer-size", type=int, default=10)
    p.add_argument("--concurrency", type=int, default=None, help="async: devices training at once (--per-round)")
    p.add_argument("--staleness", default="sqrt")
    p.add_argument("--offline", default="0.2:0.5:600")
    p.add_argument("--eval-every", type=int, default=2)
    p.add_argument("--target", type=float, default=0.85)
    p.add_argument("--option", action="append", default=[], help="a method option for every mode")
    p.add_argument("--async-option", action="append", default=[], help="a method option for async only")
    p.add_argument("--out", default="bench/results/async_fedbuff")
    p.add_argument("--table", action="store_true")
    args = p.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    if not args.table:
        for seed in (int(s) for s in args.seeds.split(",")):
            for mode in args.modes.split(","):
                path = out / f"{args.method}-{mode}{variant(mode, args)}-seed{seed}.json"
                if path.exists():
                    continue
                result = run_one(mode, seed, args)
                path.write_text(json.dumps(result))
                print(f"{mode} seed {seed}: {time_to(result['curve'], args.target)} s to {args.target:.0%}; "
                      f"final {result['curve'][-1]}; host {result['host_s']:.0f} s", flush=True)
    print(table(out, args.method, args.target))


if __name__ == "__main__":
    main()
