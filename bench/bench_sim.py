"""How much of the hardware `edgefl simulate` uses: its training throughput against a bare torch
loop doing the same work on the same cores.

    python bench/bench_sim.py [--devices 100] [--per-round 10] [--rounds 5] [--threads 2]
                              [--dataset fashion-mnist] [--sim-device cpu] [--norm batchnorm [--static-bn false]]
                              [--also-concurrent]
                              [--out bench/results/sim.md]

The paper protocol's round: K of N devices (600 Fashion-MNIST images each when N = 100), cnn4,
one local epoch, batch 32, SGD, FedAvg, then an evaluation on the whole test set. The baseline
is the same round without federation: for each of K shards, load the global weights into a
model, train it with `train_local`, average the weights in numpy, evaluate — one process, the
same torch threads. `edgefl simulate` adds what makes it a simulation: a broker, an MQTT
connection per device, encoding, chunking and validation of every plan and update. The ratio
printed is baseline seconds per round / simulate's seconds per round (median over the rounds
after the first, which pays for start-up); 1.0 means the simulation costs nothing extra.
``--also-concurrent`` also times the simulation with every sampled device training at once on
its own thread (no shared training thread: how edgefl simulated at first).
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path
from unittest import mock

import numpy as np
import torch

from simulation import sim_devices
from simulation.simulate import SimulationConfig, run_simulation, sim_federation
from edge_sdk.data.datasets import load_dataset
from edge_sdk.methods.batchnorm import static_bn_stats
from edge_sdk.models.spec import build_model
from edge_sdk.models.zoo import model_for_dataset
from edge_sdk.data.partition import partition
from edge_sdk.tensors import load_numpy_state, state_to_numpy
from edge_sdk.training import TrainConfig, evaluate, train_local

from emit import emit  # bench/emit.py (scripts run from bench/)

__all__ = ["bare_rounds", "simulated_rounds", "main"]

DEBIAN_FMNIST = Path("/usr/share/datasets/fashion-mnist")


def bare_rounds(dataset, devices: int, per_round: int, rounds: int, train: TrainConfig, seed: int,
                device: str, norm: str | None = None, static_bn: bool = True) -> list[float]:
    """Seconds per round of the same work without federation (train K shards, average, evaluate);
    with BatchNorm and ``static_bn`` each shard's statistics are then measured exactly, as FedAvg's
    devices do by default (one more forward pass over the shard)."""
    shards = partition(dataset.y_train, devices, "iid", seed=seed)
    spec = model_for_dataset("cnn4", dataset.input_shape, dataset.num_classes, **({"norm": norm} if norm else {}))
    global_model = build_model(spec)
    rng = np.random.default_rng(seed)
    seconds = []
    for rnd in range(rounds):
        start = time.perf_counter()
        weights = state_to_numpy(global_model, copy=True)
        states, counts = [], []
        for k in sorted(rng.choice(devices, size=per_round, replace=False)):
            model = build_model(spec)
            load_numpy_state(model, weights)
            shard = shards[k]
            train_local(model, dataset.x_train[shard], dataset.y_train[shard], train, seed=rnd, device=device)
            if norm == "batchnorm" and static_bn:
                static_bn_stats(model, torch.as_tensor(dataset.x_train[shard], dtype=torch.float32), train.batch_size)
            states.append(state_to_numpy(model))
            counts.append(len(shard))
        load_numpy_state(global_model, {name: np.average([s[name] for s in states], axis=0, weights=counts)
                                        .astype(weights[name].dtype) for name in weights})
        evaluate(global_model, dataset.x_test, dataset.y_test, device=device)
        seconds.append(time.perf_counter() - start)
    return seconds


def simulated_rounds(dataset_name: str, data_root: str | None, devices: int, per_round: int, rounds: int,
                     train: TrainConfig, seed: int, device: str, norm: str | None = None,
                     threads: int | None = None, static_bn: bool = True) -> tuple[list[float], float]:
    """Host seconds per round of `edgefl simulate` doing that work, and the job's accuracy."""
    with tempfile.TemporaryDirectory() as out:
        report = run_simulation(SimulationConfig(method="fedavg", clients=devices, dataset=dataset_name,
                                                 data_root=data_root, model="cnn4", out=out, plots=False,
                                                 job="bench-sim", sim_device=device, threads=threads,
                                                 options={"norm": norm, "static_bn": str(static_bn).lower()}
                                                 if norm else {},
                                                 federation=sim_federation(devices_per_round=per_round,
                                                                           rounds=rounds, train=train, seed=seed)))
    return [r.host_seconds for r in report.rounds], report.rounds[-1].accuracy["global"]


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--dataset", default="fashion-mnist" if DEBIAN_FMNIST.is_dir() else "mnist-sample")
    parser.add_argument("--data-root", default=str(DEBIAN_FMNIST) if DEBIAN_FMNIST.is_dir() else None)
    parser.add_argument("--devices", type=int, default=100)
    parser.add_argument("--per-round", type=int, default=10)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--threads", type=int, default=torch.get_num_threads())
    parser.add_argument("--sim-device", default="cpu")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--norm", choices=("batchnorm", "groupnorm"),
                        help="cnn4 with these norm layers (FedAvg's --option norm=...; default: none)")
    parser.add_argument("--static-bn", choices=("true", "false"), default="true",
                        help="with batchnorm: devices (and the bare loop) measure exact statistics after training "
                             "(FedAvg's --option static_bn, default true)")
    parser.add_argument("--also-concurrent", action="store_true",
                        help="also time devices training all at once, each on its own thread (no training queue)")
    parser.add_argument("--out", help="also write the result table (markdown) here")
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    train = TrainConfig(epochs=1, batch_size=32, lr=0.05)
    dataset = load_dataset(args.dataset, root=args.data_root, seed=args.seed)
    per_device = len(dataset.y_train) // args.devices
    static_bn = args.static_bn == "true"
    bare = bare_rounds(dataset, args.devices, args.per_round, args.rounds, train, args.seed, args.sim_device,
                       args.norm, static_bn)
    sim, accuracy = simulated_rounds(args.dataset, args.data_root, args.devices, args.per_round, args.rounds,
                                     train, args.seed, args.sim_device, args.norm, args.threads, static_bn)
    rows = [("`edgefl simulate` (broker, MQTT, codec, validation)", sim)]
    if args.also_concurrent:
        with mock.patch.object(sim_devices, "training_queue", lambda: None):
            rows.append(("`edgefl simulate`, devices training at once in their own threads", simulated_rounds(
                args.dataset, args.data_root, args.devices, args.per_round, args.rounds, train, args.seed,
                args.sim_device, args.norm, args.threads, static_bn)[0]))
    bare_s, sim_s = statistics.median(bare[1:] or bare), statistics.median(sim[1:] or sim)
    lines = [
        f"{args.dataset}: {args.devices} devices ({per_device} images each), {args.per_round} per round, "
        f"{args.rounds} rounds, cnn4{f' with {args.norm}' if args.norm else ''}{f' (static_bn={args.static_bn})' if args.norm == 'batchnorm' else ''}, 1 epoch, batch 32, {args.threads} torch threads, on {args.sim_device}; "
        f"test set {len(dataset.y_test)} images",
        "",
        "| | seconds per round (median after round 1) | all rounds |",
        "|---|---|---|",
        f"| bare torch loop (train K shards, average, evaluate) | {bare_s:.2f} | {' '.join(f'{s:.2f}' for s in bare)} |",
        *[f"| {name} | {statistics.median(secs[1:] or secs):.2f} | {' '.join(f'{s:.2f}' for s in secs)} |"
          for name, secs in rows],
        "",
        f"**simulate / bare throughput: {bare_s / sim_s:.2f}x** (accuracy after {args.rounds} rounds {accuracy:.3f})",
        *[f"{name}: {bare_s / statistics.median(secs[1:] or secs):.2f}x" for name, secs in rows[1:]],
    ]
    emit("\n".join(lines), args.out)


if __name__ == "__main__":
    main()
