"""Asynchronous aggregation against synchronous rounds on a real fleet, in wall-clock time (issue 61).

`bench/async_fedbuff.py` compares the two in *simulated* time. Here both run as `edgefl coordinator`
runs them — `RoundLoop` and `FleetAsyncLoop` behind `run_job`, without a simulated clock — over a
real broker (mosquitto on a free loopback port, else the embedded one), with real devices
(`DeviceClient`, one thread each in this process) whose training and links take their profile's
time (`Throttle` in ``"sleep"`` mode: a Raspberry Pi 3B sleeps out what its 1 GFLOPS would need,
a Pi 5 a twelfth of that). Fashion-MNIST, IID over ``--devices`` devices (3,000 images each with
20), the ``mlp`` family, FedAvg; central accuracy on 2,000 test images after every round/version.

- ``sync``: ``--per-round`` devices a round (seeded draws), waiting for all of them;
- ``async``: ``--per-round`` devices training at once, a version every ``--buffer-size`` updates
  (staleness weight 1/sqrt(1+s)), as many updates in all as ``sync``;
- ``async-long``: ``async`` for `LONG` times the versions, to compare with ``sync`` when it ended.

Figures: wall-clock seconds from the first plan to ``--target`` accuracy, per seed and median, and
each mode's accuracy when the synchronous job ended. Every run's JSON in ``--out``; a finished
run is skipped. One process at a time (the devices sleep most of the time; the figures are wall
clock, so nothing heavy beside it)::

    apt-get install dataset-fashion-mnist
    OMP_NUM_THREADS=1 python bench/real_fleet_async.py --modes sync,async --seeds 0,1,2
    python bench/real_fleet_async.py --table
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from coordinator.core.federation import EvalData, FederationConfig  # noqa: E402
from coordinator.runtime.broker import BrokerConfig, EmbeddedBroker  # noqa: E402
from coordinator.runtime.job import JobConnection, run_job  # noqa: E402
from coordinator.runtime.report import RoundRecord, RunReport  # noqa: E402
from coordinator.strategies import create_strategy  # noqa: E402
from coordinator.strategies.base import StrategyContext  # noqa: E402
from edge_sdk.client import ClientConfig, DeviceClient  # noqa: E402
from edge_sdk.data.datasets import load_dataset  # noqa: E402
from edge_sdk.data.partition import partition  # noqa: E402
from edge_sdk.methods import LocalData  # noqa: E402
from edge_sdk.networking.transport import TransportConfig  # noqa: E402
from edge_sdk.profiling import load_profile  # noqa: E402
from edge_sdk.throttle import Throttle  # noqa: E402
from edge_sdk.training import TrainConfig  # noqa: E402

PROFILES = ("raspberry-pi-3b", "raspberry-pi-4b", "raspberry-pi-5", "android-midrange", "jetson-nano-cpu")
MODES = ("sync", "async", "async-long")
#: ``async-long`` runs this many times ``async``'s versions (async took about a quarter of sync's time)
LONG = 4
EVAL_IMAGES = 2000


def run(mode: str, seed: int, args: argparse.Namespace) -> dict[str, Any]:
    """One job of ``mode``; returns its record: per round/version the wall-clock seconds since the
    first plan went out and the accuracy."""
    data = load_dataset("fashion-mnist", seed=0)
    shards = partition(data.y_train, args.devices, "iid", seed=seed)
    asynchronous = mode.startswith("async")
    rounds = args.rounds * args.per_round // args.buffer_size if asynchronous else args.rounds
    rounds *= LONG if mode == "async-long" else 1
    federation = FederationConfig(
        rounds=rounds, min_devices=args.devices, seed=seed, round_deadline_s=600, register_timeout_s=120,
        federated_eval=False, devices_per_round=None if asynchronous else args.per_round,
        asynchronous=asynchronous, concurrency=args.per_round, buffer_size=args.buffer_size,
        train=TrainConfig(epochs=1, batch_size=32, lr=0.05, threads=1))
    strategy = create_strategy("fedavg", StrategyContext(federation=federation, model_family="mlp",
                                                         input_shape=data.input_shape, num_classes=data.num_classes))
    job = f"realasync-{mode}-{seed}"
    times: list[float] = []
    first_plan: list[float] = []

    def on_round(record: RoundRecord) -> None:
        if not first_plan:  # the first round/version began this long before it was recorded
            first_plan.append(time.monotonic() - record.seconds)
        times.append(time.monotonic() - first_plan[0])
        print(f"{mode} seed {seed}: {record.version:3d}  {times[-1]:7.1f} s  {record.accuracy}", flush=True)

    with EmbeddedBroker(BrokerConfig()) as broker, tempfile.TemporaryDirectory() as out:
        clients = []
        for i, shard in enumerate(shards):
            profile = load_profile(PROFILES[i % len(PROFILES)])
            config = ClientConfig(device_id=f"dev{i:03d}", transport=TransportConfig(url=broker.url), job=job,
                                  heartbeat_s=600.0, register_retry_s=1.0)
            clients.append(DeviceClient(config, LocalData(data.x_train[shard], data.y_train[shard],
                                                          data.num_classes), profile, throttle=Throttle(profile,
                                                                                                       "sleep")))
        threads = [threading.Thread(target=c.run, kwargs={"timeout_s": 7200}, daemon=True) for c in clients]
        for thread in threads:
            thread.start()
        report = run_job(strategy, RunReport("fedavg", {}),
                         JobConnection(TransportConfig(url=broker.url, client_id=f"{job}-coordinator"), job),
                         out, eval_data=EvalData(data.x_test[:EVAL_IMAGES], data.y_test[:EVAL_IMAGES]),
                         preprocessing=data.preprocessing, on_round=on_round, plots=False)
        for client in clients:
            client.stop()
        for thread in threads:
            thread.join(30)
    label = next(iter(report.rounds[0].accuracy))
    return {"mode": mode, "seed": seed, "devices": args.devices, "per_round": args.per_round,
            "buffer_size": args.buffer_size if asynchronous else None, "profiles": list(PROFILES),
            "seconds": times, "accuracy": [r.accuracy[label] for r in report.rounds],
            "updates": [len(r.participants) for r in report.rounds],
            "staleness_mean": [r.metrics.get("staleness_mean") for r in report.rounds],
            "date": time.strftime("%Y-%m-%d")}


def time_to(result: dict[str, Any], target: float) -> float | None:
    return next((t for t, a in zip(result["seconds"], result["accuracy"], strict=True) if a >= target), None)


def accuracy_at(result: dict[str, Any], seconds: float) -> float:
    """The accuracy of the latest round/version recorded by ``seconds``."""
    done = [a for t, a in zip(result["seconds"], result["accuracy"], strict=True) if t <= seconds]
    return done[-1] if done else float("nan")


def table(out: Path, target: float) -> None:
    results = [json.loads(p.read_text()) for p in sorted(out.glob("*.json"))]
    by = {(r["mode"], r["seed"]): r for r in results}
    seeds = sorted({r["seed"] for r in results})
    print(f"| mode | {' | '.join(f'seed {s}: s to {target:.0%}' for s in seeds)} | median | "
          f"accuracy when sync ended (per seed) | s at its end |")
    print("|---|" + "---|" * (len(seeds) + 3))
    medians = {}
    for mode in MODES:
        got = [by.get((mode, s)) for s in seeds]
        if not any(got):
            continue
        reached = [time_to(r, target) if r else None for r in got]
        known = [t for t in reached if t is not None]
        medians[mode] = statistics.median(known) if len(known) == len(seeds) else None
        at_end = []  # "<": the run had ended before the synchronous one did, its last figure
        for r, s in zip(got, seeds, strict=True):
            end = by[("sync", s)]["seconds"][-1] if ("sync", s) in by else None
            at_end.append("–" if r is None or end is None else
                          f"{accuracy_at(r, end):.3f}{'<' if r['seconds'][-1] < end else ''}")
        cells = ["–" if r is None else f"{t:.0f}" if t is not None else "not reached"
                 for r, t in zip(got, reached, strict=True)]
        median = f"{medians[mode]:.0f}" if medians[mode] is not None else "–"
        ends = " / ".join(f"{r['seconds'][-1]:.0f}" for r in got if r)
        print(f"| {mode} | {' | '.join(cells)} | {median} | {' / '.join(at_end)} | {ends} |")
    if medians.get("sync") and medians.get("async"):
        print(f"\nasync / sync (medians): {medians['async'] / medians['sync']:.2f}x")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--modes", default="sync,async")
    parser.add_argument("--seeds", default="0")
    parser.add_argument("--devices", type=int, default=20)
    parser.add_argument("--per-round", type=int, default=10)
    parser.add_argument("--buffer-size", type=int, default=5)
    parser.add_argument("--rounds", type=int, default=30, help="synchronous rounds (async: as many updates)")
    parser.add_argument("--target", type=float, default=0.80)
    parser.add_argument("--out", default="bench/results/real_fleet_async")
    parser.add_argument("--table", action="store_true")
    args = parser.parse_args(argv)
    out = Path(args.out)
    if args.table:
        table(out, args.target)
        return
    out.mkdir(parents=True, exist_ok=True)
    for seed in (int(s) for s in args.seeds.split(",")):
        for mode in args.modes.split(","):
            if mode not in MODES:
                parser.error(f"--modes: {mode!r} is not one of {', '.join(MODES)}")
            path = out / f"{mode}-{seed}.json"
            if path.exists():
                continue
            path.write_text(json.dumps(run(mode, seed, args), indent=1))


if __name__ == "__main__":
    main()
