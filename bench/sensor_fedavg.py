"""The zoo's series models (``--model cnn1d``, ``minirocket``) on the smart-home sensor datasets
(issues 40, 60): central accuracy (the ceiling) beside FedAvg on 10 devices, IID and
``dirichlet:0.5``, over several seeds.

    pip install -e ".[sensors]"        # the .ts files (sktime)
    OMP_NUM_THREADS=1 python bench/sensor_fedavg.py --datasets plaid,acsf1 --seeds 3
    OMP_NUM_THREADS=1 python bench/sensor_fedavg.py --datasets basicmotions --seeds 5
    OMP_NUM_THREADS=1 python bench/sensor_fedavg.py --datasets plaid --rounds 3 --seeds 1   # a quick look
    OMP_NUM_THREADS=1 python bench/sensor_fedavg.py --datasets plaid --seeds 3 --lr-decay 50:0.3,80:0.3
    OMP_NUM_THREADS=1 python bench/sensor_fedavg.py --datasets plaid --partitions iid --seeds 3 \
        --option server_opt=fedavgm --option server_lr=1      # FedAvg's options (not the central run's)
    OMP_NUM_THREADS=1 python bench/sensor_fedavg.py --model minirocket --methods fedavg,fedpara \
        --option fedpara:gamma=0.1 ...                        # several methods; METHOD:KEY=VALUE for one

The same training everywhere: cnn1d (series_norm, batch norm), SGD lr 0.05 momentum 0.9, batch
32 (``--batch-size``), one torch thread. Central: ``train_local`` on the whole training split for ``rounds`` epochs,
as many passes over the training data as the federated run makes in all (10 of 10 devices a
round, one local epoch each). Federated: ``run_simulation`` (embedded broker, every message over
MQTT), the final global model's accuracy on the archive's test split (FDNNC: its big and small
models', the lower counted). ``--lr-decay R:F,...`` multiplies the lr by F from round R on, and from
epoch R on centrally (trained in phases: the momentum buffer starts afresh at each milestone, as
FedAvg's does every round). Prints each figure's mean, spread (min-max) and the runs.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from edge_sdk.data.datasets import load_dataset  # noqa: E402
from coordinator.strategies.base import seeded_init  # noqa: E402
from edge_sdk.models.minirocket_biases import fleet_biases, series_statistics  # noqa: E402
from edge_sdk.models.spec import build_model  # noqa: E402
from edge_sdk.models.zoo import model_for_dataset  # noqa: E402
from edge_sdk.train_config import TrainConfig  # noqa: E402
from edge_sdk.training import train_local  # noqa: E402
from coordinator.core.lr_schedule import LrDecay, lr_factor, parse_lr_decay  # noqa: E402
from simulation.config import SimulationConfig, sim_federation  # noqa: E402
from simulation.simulate import run_simulation  # noqa: E402

CLIENTS = 10


#: the batch size of every run, central and federated (--batch-size)
BATCH = 32
#: local epochs a round (--local-epochs); the central run trains rounds x this many epochs
LOCAL_EPOCHS = 1
#: evaluate the federated model every this many rounds (--eval-every; None: the last round only)
EVAL_EVERY: int | None = None


#: the training loss of every run (--loss), its learning rate (--lr) and optimizer (--optimizer)
LOSS, LR, OPTIMIZER = "cross_entropy", 0.05, "sgd"


def train_config(epochs: int, factor: float = 1.0) -> TrainConfig:
    return TrainConfig(epochs=epochs, batch_size=BATCH, lr=LR * factor, momentum=0.9, threads=1, loss=LOSS,
                       optimizer=OPTIMIZER)


def central(name: str, epochs: int, seed: int, decay: LrDecay = (), family: str = "cnn1d",
            norm: str | None = None) -> float:
    dataset = load_dataset(name)
    kw = {} if norm is None else {"norm": None if norm == "none" else norm}
    with seeded_init(seed):
        model = build_model(model_for_dataset(family, dataset.input_shape, dataset.num_classes, **kw))
    if family == "minirocket":  # its biases from the training split's statistics, as a one-device fleet's
        layer = model.layers[0]
        stats = series_statistics(layer.plan, dataset.x_train)
        layer.biases.copy_(torch.as_tensor(fleet_biases(layer.plan, stats["shares"], stats["scales"],
                                                        np.ones(layer.plan.channels), seed)))
    edges = [0, *[at for at, _ in decay if at < epochs], epochs]
    for phase, (start, end) in enumerate(zip(edges, edges[1:], strict=False)):
        train_local(model, dataset.x_train, dataset.y_train, train_config(end - start, lr_factor(decay, start)),
                    seed=seed * 1000 + phase)
    model.eval()
    with torch.no_grad():
        predicted = model(torch.from_numpy(np.ascontiguousarray(dataset.x_test))).argmax(1).numpy()
    return float((predicted == dataset.y_test).mean())


def federated(name: str, partition: str, rounds: int, seed: int, work: Path, decay: LrDecay = (),
              options: dict[str, str] | None = None, family: str = "cnn1d", method: str = "fedavg",
              public_fraction: float = 0.1) -> dict:
    out = work / f"{name}-{method}-{partition.replace(':', '-')}-{seed}"
    config = SimulationConfig(method=method, clients=CLIENTS, dataset=name, model=family, partition=partition,
                              out=str(out), plots=False, throttle="off", threads=1, job=f"bench-sensor-{seed}",
                              public_fraction=public_fraction,
                              options=dict(options or {}),
                              # the training and options are this bench's flags, none the family's recipe
                              chosen=tuple(TrainConfig.__dataclass_fields__) + tuple(options or {}),
                              federation=sim_federation(rounds=rounds, devices_per_round=CLIENTS, seed=seed,
                                                        eval_every=EVAL_EVERY or rounds, lr_decay=decay,
                                                        train=train_config(LOCAL_EPOCHS)))
    report = run_simulation(config).to_dict()
    last = report["rounds"][-1]
    if EVAL_EVERY:
        print("    " + " ".join(f"{r['round']}:{_accuracy(r['accuracy']):.3f}" for r in report["rounds"]
                                if r["accuracy"]), flush=True)
    return {"accuracy": _accuracy(last["accuracy"]),
            "by_label": {k: v for k, v in last["accuracy"].items() if k != "global"},
            "bytes_per_round": sum(r["bytes_down"] + r["bytes_up"] for r in report["rounds"]) / len(report["rounds"])}


def _accuracy(by_label: dict[str, float]) -> float:
    """The global model's accuracy; a method with a model per label (FDNNC's big and small): the lowest."""
    return by_label["global"] if "global" in by_label else min(by_label.values())


def _labels(run: dict) -> str:
    return f" ({', '.join(f'{k} {v:.3f}' for k, v in run['by_label'].items())})" if run["by_label"] else ""


def summary(values: list[float]) -> str:
    return f"{statistics.mean(values):.3f} ({min(values):.3f}-{max(values):.3f}, n={len(values)})"


def main() -> None:
    global BATCH, CLIENTS, EVAL_EVERY, LOCAL_EPOCHS, LOSS, LR, OPTIMIZER
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--datasets", default="plaid,acsf1,basicmotions")
    p.add_argument("--partitions", default="iid,dirichlet:0.5")
    p.add_argument("--rounds", type=int, default=100, help="federated rounds = central epochs (default: %(default)s)")
    p.add_argument("--seeds", type=int, default=3)
    p.add_argument("--first-seed", type=int, default=0, help="seeds FIRST .. FIRST + seeds - 1 (default: %(default)s)")
    p.add_argument("--lr-decay", type=parse_lr_decay, default=(), metavar="ROUND:FACTOR[,...]",
                   help="the lr times FACTOR from ROUND (round and epoch) on, centrally and federated alike")
    p.add_argument("--option", action="append", default=[], metavar="[METHOD:]KEY=VALUE",
                   help="an option of the federated runs (repeatable), e.g. server_opt=fedavgm; "
                        "METHOD:KEY=VALUE for one method's runs only")
    p.add_argument("--methods", default="fedavg", help="the federated runs' methods, comma-separated")
    p.add_argument("--no-central", action="store_true", help="federated runs only")
    p.add_argument("--public-fraction", type=float, default=0.1,
                   help="of the training split held out as the public set of a method that distils (REFT)")
    p.add_argument("--clients", type=int, default=CLIENTS, help="the fleet's devices, all in every round")
    p.add_argument("--eval-every", type=int, help="also print the federated accuracy every this many rounds")
    p.add_argument("--batch-size", type=int, default=BATCH, help="of the central and the devices' training")
    p.add_argument("--json", type=Path, help="also write every run here")
    p.add_argument("--model", default="cnn1d", choices=("cnn1d", "minirocket"), help="the model family")
    p.add_argument("--local-epochs", type=int, default=1, help="a round's; central: rounds x this many epochs")
    p.add_argument("--lr", type=float, default=0.05, help="SGD's (momentum 0.9), central and on the devices")
    p.add_argument("--optimizer", default="sgd", choices=("sgd", "adam"),
                   help="central and on the devices (FedPara's runs take their own unless told: --option optimizer=)")
    p.add_argument("--loss", default="cross_entropy", choices=("cross_entropy", "squared"),
                   help="the training loss (squared: a ridge classifier's, on ±1 targets)")
    args = p.parse_args()
    methods = args.methods.split(",")
    pairs = [option.split("=", 1) for option in args.option]
    options = {key: value for key, value in pairs if ":" not in key}
    per_method = {m: {**options, **{key.split(":", 1)[1]: value for key, value in pairs
                                   if key.startswith(f"{m}:")}} for m in methods}
    BATCH, CLIENTS, LOCAL_EPOCHS, LOSS, LR = args.batch_size, args.clients, args.local_epochs, args.loss, args.lr
    EVAL_EVERY, OPTIMIZER = args.eval_every, args.optimizer
    torch.set_num_threads(1)
    print(f"OMP_NUM_THREADS={os.environ.get('OMP_NUM_THREADS')}, torch {torch.__version__}, {args.model}, "
          f"{CLIENTS} devices, {args.rounds} rounds of {LOCAL_EPOCHS} epochs, "
          f"lr decay {args.lr_decay or 'none'}, options {options or 'none'}, batch {BATCH}, loss {LOSS}, lr {LR}, "
          f"{OPTIMIZER}")
    results: dict = {}
    with tempfile.TemporaryDirectory() as tmp:
        for name in args.datasets.split(","):
            runs = [(m, part, f"{part}" if m == "fedavg" else f"{m} {part}")
                    for m in methods for part in args.partitions.split(",")]
            row = results[name] = {"central": [], **{key: [] for _, _, key in runs}}
            for seed in range(args.first_seed, args.first_seed + args.seeds):
                started = time.monotonic()
                if not args.no_central:
                    row["central"].append(central(name, args.rounds * LOCAL_EPOCHS, seed, args.lr_decay,
                                                  args.model, options.get("norm")))
                for method, part, key in runs:
                    row[key].append(federated(name, part, args.rounds, seed, Path(tmp), args.lr_decay,
                                              per_method[method], args.model, method, args.public_fraction))
                shown = ([f"central {row['central'][-1]:.3f}"] if row["central"] else []) + \
                    [f"{key} {row[key][-1]['accuracy']:.3f}{_labels(row[key][-1])}" for _, _, key in runs]
                print(f"  {name} seed {seed}: {', '.join(shown)} ({time.monotonic() - started:.0f} s)", flush=True)
            if row["central"]:
                print(f"{name}: central {summary(row['central'])}")
            for method, part, key in runs:
                accs = [r["accuracy"] for r in row[key]]
                gap = f", {100 * (statistics.mean(accs) - statistics.mean(row['central'])):+.1f} points from " \
                    "central" if row["central"] else ""
                print(f"{name}: {method} {part} {summary(accs)}{gap}, "
                      f"{row[key][0]['bytes_per_round'] / 1e6:.2f} MB per round", flush=True)
    if args.json:
        args.json.write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
