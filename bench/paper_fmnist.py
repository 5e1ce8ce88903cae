"""FLANC's Fashion-MNIST table, reproduced with `edgefl simulate` (issue 15).

The paper's protocol (the official ``demo.sh`` for ``cnn_flanc``): 100 devices, 10 per round,
200 rounds, 1 local epoch, batch 32, SGD lr 0.01 (momentum 0.9, weight decay 1e-4, as the
official ``option.py``) with ×0.1 after round 100, random horizontal flips, the ``flanc_cnn``
family without norm layers; IID or non-IID (``shards:3``: 3 classes per device); widths 0.25,
0.5, 0.75, 1 either *dynamic* (random per device per round, every width in every round:
``sample=every``) or *static* (25 devices per width, for good). Methods: FLANC, HeteroFL
(without its scaler: it needs norm layers) and FedAvg at the smallest width. Accuracy per width
on the whole 10,000-image test set after the last round (interim evaluations every
``--eval-every`` rounds on ``--eval-samples`` test images).

Run (one process per list of runs; a finished run, i.e. its JSON in ``--out``, is skipped, and
one that was stopped resumes after its last finished round from its checkpoint)::

    apt-get install dataset-fashion-mnist
    python bench/paper_fmnist.py --methods flanc,heterofl --partitions iid --seeds 0
    python bench/paper_fmnist.py --table          # the table of what finished

On 2 cores a round of 10 devices × 600 images takes ~20 s (tens of minutes per 100 rounds);
``--threads`` sets each run's torch threads, so two processes with ``--threads 1`` share a
2-core machine.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import replace
from typing import Any
from pathlib import Path
from unittest import mock

import numpy as np

import simulation.simulate as simulate
from edge_sdk.methods.settings.options import option_pairs
from simulation.simulate import SimulationConfig, run_simulation, sim_federation
from edge_sdk.data.datasets import ImageDataset
from edge_sdk.training import TrainConfig

#: The paper's Table 1, Fashion-MNIST: mean accuracy over widths (%).
PAPER = {("flanc", "iid"): 91.1, ("heterofl", "iid"): 90.4, ("flanc", "shards:3"): 85.1,
         ("heterofl", "shards:3"): 83.2}
#: Four profiles with distinct speeds: ``assign=cluster`` gives each a width (static mode).
STATIC_FLEET = ("raspberry-pi-3b", "raspberry-pi-4b", "jetson-orin-nano", "laptop")
WIDTHS = ("0.25", "0.5", "0.75", "1.0")
#: The official code normalises Fashion-MNIST with MNIST's statistics (pixels in [0, 1]).
MNIST_MEAN, MNIST_STD = 0.1307, 0.3081


def run_name(method: str, partition: str, widths: str, seed: int, options: Sequence[str] = ()) -> str:
    """``flanc-shards3-dynamic-s0``; extra ``--option``s join the name (``...-s0-coeff_init=torch``)."""
    return "-".join([f"{method}-{partition.replace(':', '')}-{widths}-s{seed}", *options])


def simulation(args: argparse.Namespace, method: str, partition: str, widths: str, seed: int,
               out: Path) -> SimulationConfig:
    """The paper's protocol as an `edgefl simulate` job."""
    options = {"norm": "none"}
    if method == "heterofl":  # without norm layers HeteroFL's scaler (×1/p while training) diverges:
        options["scaler"] = "false"  # chance accuracy at widths 0.25/0.5 after 3 rounds (BENCHMARKS.md)
    if method == "fedavg":
        options["width"] = WIDTHS[0]
    elif widths == "dynamic":
        options["sample"] = "every"
    else:
        options["assign"] = "cluster"
    options.update(option_pairs(args.option))
    train = TrainConfig(epochs=1, batch_size=32, lr=args.lr, momentum=0.9, weight_decay=1e-4, augment="hflip",
                        threads=args.threads)
    federation = sim_federation(rounds=args.rounds, seed=seed, devices_per_round=args.per_round,
                                checkpoint_dir=str(out / "checkpoint"), eval_every=args.eval_every,
                                eval_samples=args.eval_samples, train=train,
                                lr_decay=((args.decay_round, 0.1),) if args.decay_round < args.rounds else ())
    return SimulationConfig(method=method, clients=args.clients, dataset="fashion-mnist", data_root=args.data_root,
                            partition=partition, out=str(out), model="flanc_cnn", profiles=STATIC_FLEET, plots=False,
                            options=options, sim_device=args.sim_device, federation=federation)


def variant(args: argparse.Namespace) -> list[str]:
    """What sets a run apart from the protocol: its extra method options, and ``mnist_norm``."""
    return [*args.option, *(["mnist_norm"] if args.mnist_norm else [])]


def normalise_as_official(load: Callable[..., ImageDataset]) -> Callable[..., ImageDataset]:
    """``load_dataset`` whose images are normalised with MNIST's mean and std, as the official code
    does for Fashion-MNIST, instead of the train split's own (an affine change of every pixel)."""
    def loaded(*args: Any, **kw: Any) -> ImageDataset:
        data = load(*args, **kw)
        (mean,), (std,) = data.mean, data.std  # raw pixel scale (0..255)

        def renorm(x: np.ndarray) -> np.ndarray:
            return ((x * std + mean) / 255.0 - MNIST_MEAN) / MNIST_STD

        return replace(data, x_train=renorm(data.x_train).astype(np.float32),
                       x_test=renorm(data.x_test).astype(np.float32),
                       mean=(MNIST_MEAN * 255.0,), std=(MNIST_STD * 255.0,))
    return loaded


def run_one(args: argparse.Namespace, method: str, partition: str, widths: str, seed: int) -> None:
    name = run_name(method, partition, widths, seed, variant(args))
    result_path = Path(args.out) / f"{name}.json"
    if result_path.exists():
        print(f"{name}: done already ({result_path})")
        return
    started = time.monotonic()
    progress = Path(args.out) / f"{name}.progress"

    def on_round(record) -> None:  # one line per evaluated round, to follow a long run
        if record.accuracy:
            with open(progress, "a") as fh:
                fh.write(json.dumps({"round": record.round + 1, "accuracy": record.accuracy,
                                     "elapsed_s": round(time.monotonic() - started, 1)}) + "\n")

    config = simulation(args, method, partition, widths, seed, Path(args.out) / name)
    if args.mnist_norm:
        with mock.patch.object(simulate, "load_dataset", normalise_as_official(simulate.load_dataset)):
            report = run_simulation(config, on_round=on_round)
    else:
        report = run_simulation(config, on_round=on_round)
    rounds = [r for r in report.rounds_as_dicts() if r["accuracy"]]
    final = rounds[-1]["accuracy"]
    result = {"run": name, "method": method, "partition": partition, "widths": widths, "seed": seed,
              "options": variant(args),
              "rounds": args.rounds, "final_accuracy": final, "mean_accuracy": float(np.mean(list(final.values()))),
              "curve": [{"round": r["round"] + 1, "accuracy": r["accuracy"]} for r in rounds],
              "wall_s": round(time.monotonic() - started, 1), "threads": args.threads,
              "sim_device": args.sim_device}
    result_path.write_text(json.dumps(result, indent=1))
    print(f"{name}: mean {result['mean_accuracy']:.4f} {final} in {result['wall_s']} s")


def table(out: Path) -> str:
    """Markdown: per run kind, the mean over seeds of each width and of the mean, beside the paper."""
    results = [json.loads(p.read_text()) for p in sorted(out.glob("*.json"))]
    groups: dict[tuple, list[dict]] = {}
    for r in results:
        method = " ".join([r["method"], *r.get("options", [])])
        groups.setdefault((r["partition"], r["widths"], method, r["rounds"]), []).append(r)
    lines = ["| data | widths | method | rounds | seeds | " + " | ".join(f"p={w}" for w in WIDTHS)
             + " | mean | paper |", "|" + "---|" * (len(WIDTHS) + 7)]
    for (partition, widths, method, rounds), runs in sorted(groups.items()):
        cells = []
        for w in WIDTHS:
            values = [r["final_accuracy"].get(w) for r in runs if w in r["final_accuracy"]]
            cells.append(f"{100 * np.mean(values):.1f}" if values else "")
        means = [100 * r["mean_accuracy"] for r in runs]
        spread = f" ± {np.std(means):.1f}" if len(means) > 1 else ""
        paper = PAPER.get((method.split()[0], partition))
        lines.append(f"| {partition} | {widths} | {method} | {rounds} | {len(runs)} | " + " | ".join(cells)
                     + f" | {np.mean(means):.1f}{spread} | {paper if paper is not None else ''} |")
    return "\n".join(lines)


def progress_table(out: Path, every: int = 10) -> str:
    """Markdown: the interim accuracy (mean over widths, on the interim test subset) of every run,
    finished or not, every ``every`` rounds, so that runs can be compared at equal rounds."""
    curves = {}
    for path in sorted(out.glob("*.progress")):
        rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
        curves[path.stem] = {r["round"]: 100 * float(np.mean(list(r["accuracy"].values()))) for r in rows}
    rounds = sorted({r for c in curves.values() for r in c if r % every == 0 or r == max(c)})
    lines = ["| run | " + " | ".join(str(r) for r in rounds) + " |", "|---|" + "---|" * len(rounds)]
    for name, curve in curves.items():
        lines.append(f"| {name} | " + " | ".join(f"{curve[r]:.1f}" if r in curve else "" for r in rounds) + " |")
    return "\n".join(lines)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--methods", default="flanc,heterofl,fedavg")
    p.add_argument("--partitions", default="iid,shards:3")
    p.add_argument("--widths", default="dynamic", help="dynamic, static or both (comma-separated)")
    p.add_argument("--seeds", default="0,1")
    p.add_argument("--clients", type=int, default=100)
    p.add_argument("--per-round", type=int, default=10)
    p.add_argument("--rounds", type=int, default=200)
    p.add_argument("--decay-round", type=int, default=100, help="lr × 0.1 after this many rounds")
    p.add_argument("--lr", type=float, default=0.01)
    p.add_argument("--eval-every", type=int, default=10)
    p.add_argument("--eval-samples", type=int, default=2000)
    p.add_argument("--threads", type=int, default=None, help="torch threads of each device's training")
    p.add_argument("--data-root", default=None)
    p.add_argument("--sim-device", default="cpu",
                   help="where the simulated devices train and the model is evaluated: cpu, cuda, cuda:N, auto")
    p.add_argument("--mnist-norm", action="store_true",
                   help="normalise the images with MNIST's mean/std (0.1307, 0.3081) as the official code does")
    p.add_argument("--option", action="append", default=[], metavar="KEY=VALUE",
                   help="another method option for every run (e.g. coeff_init=torch); it joins the run's name")
    p.add_argument("--out", default="bench/results/paper_fmnist")
    p.add_argument("--table", action="store_true", help="print the table of the finished runs and exit")
    p.add_argument("--progress", action="store_true",
                   help="print every run's interim mean accuracy per 10 rounds (finished or not) and exit")
    args = p.parse_args()
    try:
        option_pairs(args.option)
    except ValueError as exc:
        p.error(str(exc))
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    if args.table:
        print(table(out))
        return 0
    if args.progress:
        print(progress_table(out))
        return 0
    if args.threads:
        import torch
        torch.set_num_threads(args.threads)  # the coordinator's evaluation too
    for seed in (int(s) for s in args.seeds.split(",")):
        for partition in args.partitions.split(","):
            for widths in args.widths.split(","):
                for method in args.methods.split(","):
                    if method == "fedavg" and widths != args.widths.split(",")[0]:
                        continue  # one width: static and dynamic are the same run
                    run_one(args, method, partition, widths, seed)
    print(table(out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
