"""`edgefl simulate --backend ray`: speed-up with worker processes, and a thousand devices.

    python bench/bench_ray.py speedup [--workers 1,2] [--actors-per-worker 2] [--rounds 6]
    python bench/bench_ray.py scale [--devices 1000] [--per-round 100] [--rounds 6] [--workers N]
    python bench/bench_ray.py binding [--workers 1,2,4,8,16] [--actors-per-worker 1,2,4]

speedup: the paper protocol (100 devices with 600 Fashion-MNIST images each, 10 per round, cnn4,
one epoch, batch 32) on Ray with 1 CPU (one torch thread) per training, for each worker count;
seconds per round are the median over the rounds that do not evaluate (the coordinator
evaluates only after the last round), so they measure the devices' side, which is what Ray
spreads. The in-process backend with the same threads in all is the baseline of the same run.
A device trains in the actor that hosts it, one at a time per actor, while any free worker's
slot serves the actor with the most waiting: the last column is the speed-up that this allows,
computed from the participants of the same rounds (participants ÷ the training turns they take).

scale: many devices with a light local step (mlp on the digits, 2 optimizer steps), reporting
the resident memory of the coordinator's process and of every Ray worker after each round:
memory should stay flat once every device has trained.

binding: no training; the speed-up that device-to-actor binding allows on average, by sampling
rounds (participants drawn uniformly, devices split over K actors per worker in contiguous blocks
as `--backend ray` does), beside the ceiling of a pool where any worker could train any device.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import tempfile
import time
from pathlib import Path

import numpy as np
import psutil
import torch

from simulation.simulate import SimulationConfig, run_simulation, sim_federation
from edge_sdk.training import TrainConfig

from emit import emit  # bench/emit.py (scripts run from bench/)

__all__ = ["speedup", "scale", "binding", "binding_bound", "training_turns", "main"]

DEBIAN_FMNIST = Path("/usr/share/datasets/fashion-mnist")


def _steady(rounds: list) -> list:
    """The rounds that are timed: not the first (start-up) nor the last (evaluation)."""
    return rounds[1:-1] or rounds


def _per_round(report) -> tuple[float, list[float]]:
    seconds = [r.host_seconds for r in report.rounds]
    return statistics.median(_steady(seconds)), seconds


def training_turns(loads: list[int], workers: int) -> int:
    """How many training turns a round takes when ``workers`` devices train at once, the actors
    holding ``loads`` participants each train one at a time, and a free worker serves the actor
    with the most waiting (`simulation/compute_slots.py`); devices take equal time."""
    left, turns = sorted(loads, reverse=True), 0
    while left and left[0] > 0:
        left[:workers] = [n - 1 for n in left[:workers]]
        left.sort(reverse=True)
        turns += 1
    return turns


def binding_bound(report) -> float:
    """The speed-up over one worker that device-to-actor binding allows in ``report``'s steady
    rounds: the median over those rounds of participants ÷ their training turns."""
    host_of = {d: i for i, h in enumerate(report.config["ray"]["hosts"]) for d in h["devices"]}
    bounds = []
    for r in _steady(report.rounds):
        loads = [0] * len(report.config["ray"]["hosts"])
        for d in r.participants:
            loads[host_of[d]] += 1
        bounds.append(len(r.participants) / max(training_turns(loads, report.config["ray_workers"]), 1))
    return statistics.median(bounds)


def speedup(args: argparse.Namespace) -> str:
    train = TrainConfig(epochs=1, batch_size=32, lr=0.05)
    base = dict(method="fedavg", clients=args.devices, dataset=args.dataset, data_root=args.data_root, model="cnn4",
                plots=False, federation=sim_federation(devices_per_round=args.per_round, rounds=args.rounds,
                                                       train=train, eval_every=args.rounds, seed=args.seed))
    rows = []
    with tempfile.TemporaryDirectory() as out:
        torch.set_num_threads(max(args.workers))
        local, _ = _per_round(run_simulation(SimulationConfig(**base, out=f"{out}/local", job="bench-local")))
        rows.append((f"in-process backend, {max(args.workers)} torch threads", local, None, None))
        for workers in args.workers:
            report = run_simulation(SimulationConfig(**base, out=f"{out}/ray{workers}", job=f"bench-ray{workers}",
                                                     backend="ray", ray_workers=workers, ray_cpus_per_worker=1,
                                                     ray_actors_per_worker=args.actors_per_worker[0]))
            threads = sorted({h["torch_threads"] for h in report.config["ray"]["hosts"]})
            actors = len(report.config["ray"]["hosts"])
            rows.append((f"Ray, {workers} worker(s) x 1 CPU on {actors} actors (torch threads {threads})",
                         _per_round(report)[0], workers, binding_bound(report)))
    one = next(s for name, s, w, _ in rows if w == min(args.workers))
    lines = [f"{args.dataset}: {args.devices} devices, {args.per_round} per round, {args.rounds} rounds, cnn4, "
             f"1 epoch, batch 32; {os.cpu_count()} CPUs here", "",
             "| backend | seconds per round (median, rounds 2..R-1) | speed-up over 1 worker | / workers "
             "| speed-up the binding allows |",
             "|---|---|---|---|---|"]
    for name, seconds, workers, bound in rows:
        if workers is None:
            lines.append(f"| {name} | {seconds:.2f} | | | |")
        else:
            gain = one / seconds
            lines.append(f"| {name} | {seconds:.2f} | {gain:.2f}x | {gain / workers:.2f} | {bound:.2f}x |")
    return "\n".join(lines)


def binding(args: argparse.Namespace, draws: int = 20000) -> str:
    """Markdown: per worker count and actors per worker, the speed-up that binding allows over
    ``draws`` sampled rounds, beside the ceiling of a pool where any worker trains any device."""
    rng = np.random.default_rng(args.seed)
    per = args.actors_per_worker
    lines = [f"{args.devices} devices, {args.per_round} per round, {draws} sampled rounds; speed-up allowed "
             f"(and / workers) with K actors per worker", "",
             "| workers | " + " | ".join(f"K = {k}" for k in per) + " | a shared pool's ceiling |",
             "|---|" + "---|" * (len(per) + 1)]
    for workers in args.workers:
        cells = []
        for k in per:
            actors = min(args.devices, workers * k)
            owner = np.repeat(np.arange(actors), [len(b) for b in np.array_split(np.arange(args.devices), actors)])
            turns = np.mean([training_turns(np.bincount(owner[rng.choice(args.devices, args.per_round,
                                                                           replace=False)]).tolist(), workers)
                             for _ in range(draws)])
            allowed = args.per_round / turns
            cells.append(f"{allowed:.2f}x ({allowed / workers:.2f})")
        pool = args.per_round / math.ceil(args.per_round / workers)
        lines.append(f"| {workers} | " + " | ".join(cells) + f" | {pool:.2f}x ({pool / workers:.2f}) |")
    return "\n".join(lines)


def _rss_mb(pids: list[int]) -> float:
    total = 0
    for pid in pids:
        try:
            total += psutil.Process(pid).memory_info().rss
        except psutil.NoSuchProcess:
            pass
    return total / 2**20


def scale(args: argparse.Namespace) -> str:
    train = TrainConfig(epochs=1, batch_size=16, lr=0.05, max_steps=2)
    samples: list[tuple[int, float, float]] = []
    workers: list[int] = []

    def on_round(record) -> None:
        samples.append((record.round + 1, _rss_mb([os.getpid()]), _rss_mb(workers)))

    with tempfile.TemporaryDirectory() as out:
        config = SimulationConfig(method="fedavg", clients=args.devices, dataset="digits", model="mlp", plots=False,
                                  out=out, job="bench-scale", backend="ray",
                                  ray_workers=args.workers[0] if args.workers else None,
                                  ray_actors_per_worker=args.actors_per_worker[0],
                                  federation=sim_federation(devices_per_round=args.per_round, rounds=args.rounds,
                                                            train=train, eval_every=1, round_deadline_s=300.0))
        from simulation import ray_devices

        original = ray_devices.RayDevices.start

        def start(self):  # note the actors' pids to sample their memory
            placed = original(self)
            workers.extend(h["pid"] for h in placed)
            return placed
        ray_devices.RayDevices.start = start
        started = time.monotonic()
        try:
            report = run_simulation(config, on_round=on_round)
        finally:
            ray_devices.RayDevices.start = original
        wall = time.monotonic() - started
    lines = [f"{args.devices} devices on {len(workers)} Ray actor processes ({os.cpu_count()} CPUs), {args.per_round} per round, "
             f"{args.rounds} rounds, mlp on digits, 2 local steps; wall {wall:.0f} s; accuracy "
             f"{report.rounds[-1].accuracy['global']:.3f}; participants per round "
             f"{json.dumps([len(r.participants) for r in report.rounds])}", "",
             "| after round | coordinator RSS MB | Ray actors RSS MB (all) |", "|---|---|---|"]
    lines += [f"| {rnd} | {coord:.0f} | {actors:.0f} |" for rnd, coord, actors in samples]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("mode", choices=["speedup", "scale", "binding"])
    parser.add_argument("--dataset", default="fashion-mnist" if DEBIAN_FMNIST.is_dir() else "mnist-sample")
    parser.add_argument("--data-root", default=str(DEBIAN_FMNIST) if DEBIAN_FMNIST.is_dir() else None)
    parser.add_argument("--devices", type=int)
    parser.add_argument("--per-round", type=int)
    parser.add_argument("--rounds", type=int, default=6)
    parser.add_argument("--workers", default=None, help="comma-separated worker counts")
    parser.add_argument("--actors-per-worker", default="1,2,4",
                        help="binding: comma-separated actors per worker; speedup/scale: the first")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", help="also write the table (markdown) here")
    args = parser.parse_args(argv)
    args.actors_per_worker = [int(k) for k in args.actors_per_worker.split(",")]
    if args.mode == "speedup":
        args.devices, args.per_round = args.devices or 100, args.per_round or 10
        args.workers = [int(w) for w in (args.workers or f"1,{os.cpu_count()}").split(",")]
        text = speedup(args)
    elif args.mode == "binding":
        args.devices, args.per_round = args.devices or 100, args.per_round or 10
        args.workers = [int(w) for w in (args.workers or "1,2,4,8,16").split(",")]
        text = binding(args)
    else:
        args.devices, args.per_round = args.devices or 1000, args.per_round or 100
        args.workers = [int(w) for w in args.workers.split(",")] if args.workers else None  # None: as Ray needs
        text = scale(args)
    emit(text, args.out)


if __name__ == "__main__":
    main()
