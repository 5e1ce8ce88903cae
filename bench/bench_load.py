"""Load: hundreds of lightweight devices through mosquitto on loopback, several rounds.

Run: ``python bench/bench_load.py`` (defaults: 50 then 200 devices, 5 FedAvg rounds each,
the ``mlp`` model on 8×8 ``digits``, 4 device processes; about 2-4 minutes);
``--model cnn4 --dataset mnist-sample`` ships the 131k-parameter CNN instead.

The coordinator is this process: the real `Fleet`, round loop and FedAvg strategy
over a real mosquitto broker (`EmbeddedBroker`, loopback). Devices are real
`DeviceClient`s (one MQTT connection each) spread over ``--workers`` child
processes; they are *lightweight*: their FedAvg step returns the plan's weights
plus small seeded noise instead of training, so the figures are the protocol's
and the coordinator's, not torch's. Per round it records the coordinator's CPU
time (every thread of this process: round loop, paho network thread, decoding,
validation, aggregation, evaluation), wall time and resident memory, and checks
that every device's update arrived exactly once (participants == devices, no
rejection, no duplicate). The first fleet size is the baseline the larger one is
compared with. Target (issue 8): coordinator overhead ≤ 50 ms per device per round.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import logging
import os
import resource
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np

__all__ = ["main"]

JOB = "load"


def _rss_mb() -> float:
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    return float("nan")


# --------------------------------------------------------------------------- devices
def _echo_update(plan, data, ctx):  # the lightweight device's "training"
    from edge_sdk.protocol.messages import Update
    rng = np.random.default_rng([ctx.seed, ctx.round])
    tensors = {k: (v + rng.normal(0, 1e-3, v.shape)).astype(v.dtype) if v.dtype.kind == "f" else np.array(v)
               for k, v in plan.tensors.items()}
    return Update(label=plan.label, tensors=tensors, num_samples=len(data),
                  metrics={"loss": 1.0, "compute_s": 0.0})


def run_worker(args: argparse.Namespace) -> None:
    """A child process hosting every ``workers``-th device."""
    from edge_sdk import methods
    from edge_sdk.client import ClientConfig, DeviceClient
    from edge_sdk.data.datasets import load_dataset
    from edge_sdk.methods import LocalData
    from edge_sdk.profiling import load_profile
    from edge_sdk.networking.transport import TransportConfig

    methods.DEVICE_METHODS["fedavg"] = _echo_update
    logging.basicConfig(level=logging.ERROR)
    data = load_dataset(args.dataset)
    profile = load_profile("raspberry-pi-4b")
    clients = []
    for i in range(args.worker, args.devices, args.workers):
        take = np.arange(i * 7, i * 7 + 20) % len(data.y_train)
        device_id = f"dev{i:04d}"
        client = DeviceClient(
            ClientConfig(device_id=device_id, transport=TransportConfig(url=args.url, client_id=f"{JOB}-{device_id}"),
                         job=args.job, register_retry_s=5.0, seed=i),
            LocalData(data.x_train[take], data.y_train[take], data.num_classes), profile)
        thread = threading.Thread(target=client.run, name=device_id, daemon=True)
        thread.start()
        clients.append((client, thread))
    for client, thread in clients:
        thread.join()


# --------------------------------------------------------------------------- coordinator
def run_fleet(devices: int, args: argparse.Namespace, url: str) -> dict:
    """One job of ``devices`` devices; returns its figures."""
    from coordinator.runtime.fleet import Fleet
    from coordinator.runtime.report import RunReport
    from coordinator.core.federation import EvalData
    from coordinator.runtime.round_loop import RoundLoop
    from simulation.simulate import SimulationConfig, build_strategy, sim_federation
    from edge_sdk.data.datasets import load_dataset
    from edge_sdk.networking.link import MessageLink
    from edge_sdk.protocol.topics import Topics
    from edge_sdk.training import TrainConfig
    from edge_sdk.networking.transport import MqttTransport, TransportConfig

    job = f"{JOB}{devices}"
    dataset = load_dataset(args.dataset)
    config = SimulationConfig(method="fedavg", clients=devices, dataset=args.dataset, model=args.model,
                              federation=sim_federation(rounds=args.rounds, round_deadline_s=120.0,
                                                        train=TrainConfig(epochs=1)))
    strategy = build_strategy(config, dataset, None)
    strategy.config = dataclasses.replace(strategy.config, register_timeout_s=300.0)
    transport = MqttTransport(TransportConfig(url=url, client_id=f"{job}-coordinator"))
    transport.connect()
    fleet = Fleet(MessageLink(transport), Topics(job=job))
    fleet.start()
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    workers = [subprocess.Popen([sys.executable, __file__, "--worker", str(k), "--workers", str(args.workers),
                                 "--devices", str(devices), "--url", url, "--job", job,
                                 "--dataset", args.dataset], env=env)
               for k in range(args.workers)]
    rows: list[dict] = []
    marks = {"cpu": time.process_time(), "wall": time.monotonic()}

    def on_round(record) -> None:
        cpu, wall = time.process_time(), time.monotonic()
        rows.append({"round": record.round, "updates": len(record.participants), "aggregated": record.aggregated,
                     "cpu_s": cpu - marks["cpu"], "wall_s": wall - marks["wall"], "rss_mb": _rss_mb(),
                     "accuracy": record.accuracy.get("global", float("nan"))})
        marks.update(cpu=cpu, wall=wall)
        print(f"  {devices} devices, round {record.round}: {rows[-1]['updates']} updates, coordinator CPU "
              f"{rows[-1]['cpu_s']:.2f} s, wall {rows[-1]['wall_s']:.2f} s, RSS {rows[-1]['rss_mb']:.0f} MB",
              flush=True)

    started = time.monotonic()
    try:
        fleet.wait_for_devices(devices, 300.0)
        registered = time.monotonic() - started
        marks.update(cpu=time.process_time(), wall=time.monotonic())
        RoundLoop(strategy, fleet, RunReport(method="fedavg", config={}),
                  eval_data=EvalData(dataset.x_test, dataset.y_test), preprocessing=dataset.preprocessing).run(on_round)
        transport.wait_published(10.0)
    finally:
        for worker in workers:
            try:
                worker.wait(timeout=60)
            except subprocess.TimeoutExpired:
                worker.kill()
        transport.close()
    steady = rows[1:] or rows  # round 0 includes first-use costs
    per_device_ms = 1000 * float(np.mean([r["cpu_s"] for r in steady])) / devices
    wall_per_device_ms = 1000 * float(np.mean([r["wall_s"] for r in steady])) / devices
    return {
        "devices": devices, "rounds": rows, "registered_s": registered,
        "lost": sum(devices - r["updates"] for r in rows), "rejections": len(fleet.rejections),
        "cpu_ms_per_device_round": per_device_ms, "wall_ms_per_device_round": wall_per_device_ms,
        "rss_growth_mb": rows[-1]["rss_mb"] - rows[0]["rss_mb"],
        "params": strategy.model_params(),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--fleets", default="50,200", help="fleet sizes; the first is the baseline")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--workers", type=int, default=4, help="device processes")
    ap.add_argument("--model", default="mlp", help="zoo family of the FedAvg model")
    ap.add_argument("--dataset", default="digits")
    ap.add_argument("--json", help="write the figures here")
    ap.add_argument("--worker", type=int, help=argparse.SUPPRESS)
    ap.add_argument("--devices", type=int, help=argparse.SUPPRESS)
    ap.add_argument("--url", help=argparse.SUPPRESS)
    ap.add_argument("--job", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.worker is not None:
        run_worker(args)
        return
    from coordinator.runtime.broker import EmbeddedBroker

    logging.basicConfig(level=logging.ERROR)
    import torch
    torch.set_num_threads(1)
    results = []
    with EmbeddedBroker() as broker:
        print(f"bench_load: broker {broker.kind} at {broker.url}, {args.rounds} FedAvg rounds, {args.model} on "
              f"{args.dataset}, "
              f"{args.workers} device processes, lightweight devices (echo + noise)", flush=True)
        for devices in (int(v) for v in args.fleets.split(",")):
            results.append(run_fleet(devices, args, broker.url))
    print("\n devices  params  lost  rejected  CPU ms/device/round  wall ms/device/round  RSS growth MB  registration s")
    for r in results:
        print(f" {r['devices']:7d} {r['params']['global']:7,d} {r['lost']:5d} {r['rejections']:9d} "
              f"{r['cpu_ms_per_device_round']:20.2f} {r['wall_ms_per_device_round']:20.2f} "
              f"{r['rss_growth_mb']:14.1f} {r['registered_s']:15.1f}")
    base, big = results[0], results[-1]
    if big is not base:
        print(f"\nper-device coordinator CPU at {big['devices']} vs {base['devices']} devices: "
              f"{big['cpu_ms_per_device_round'] / base['cpu_ms_per_device_round']:.2f}x")
    ok = all(r["lost"] == 0 and r["rejections"] == 0 for r in results) and \
        big["cpu_ms_per_device_round"] <= 50.0
    print(f"target: no lost/duplicated update and <= 50 ms coordinator CPU per device per round: "
          f"{'met' if ok else 'NOT met'}")
    print(f"peak RSS of the coordinator process: {resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024:.0f} MB")
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=1, default=str))
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
