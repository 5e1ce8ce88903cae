"""Where REFT's one-shot accuracy on MiniRocket goes (issue 60), without the broker: ten devices train
their kernel subsets on PLAID's IID shards, then the teachers' ensemble, the head distilled on the
public share, each level's published model (the head cut to it, then distilled), and a head fitted to the public
series' own labels are scored on the test split.

    OMP_NUM_THREADS=1 python bench/minirocket_reft_probe.py [--seed 0] [--epochs 150] [--public-fraction 0.1]

The same pieces as a REFT job (`prune_spec`'s kernel subsets, `ensemble_logits`, `distill` with REFT's
defaults, the recipe's SGD on a squared loss), the levels p0 / p0.3 / p0.9 in turn, biases from the
devices' series; the public share is split off as the simulation does (stratified, seeded).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from coordinator.strategies.base import seeded_init  # noqa: E402
from coordinator.strategies.distillation import DistillConfig, distill, ensemble_logits  # noqa: E402
from coordinator.strategies.pruning import prune_spec  # noqa: E402
from edge_sdk.data.datasets import load_dataset  # noqa: E402
from edge_sdk.models.minirocket_biases import fleet_biases, series_statistics  # noqa: E402
from edge_sdk.models.spec import build_model  # noqa: E402
from edge_sdk.models.zoo import model_for_dataset  # noqa: E402
from edge_sdk.tensors import load_numpy_state, state_to_numpy  # noqa: E402
from edge_sdk.train_config import TrainConfig  # noqa: E402
from edge_sdk.training import train_local  # noqa: E402

DEVICES = 10
LEVELS = (0.0, 0.3, 0.9)


def accuracy(model: torch.nn.Module, x: np.ndarray, y: np.ndarray) -> float:
    model.eval()
    with torch.no_grad():
        return float((model(torch.from_numpy(x)).argmax(1).numpy() == y).mean())


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--epochs", type=int, default=150, help="each device's local epochs (one round)")
    p.add_argument("--public-fraction", type=float, default=0.1)
    args = p.parse_args()
    torch.set_num_threads(1)
    ds = load_dataset("plaid")
    rng = np.random.default_rng(args.seed)
    public = np.concatenate([rng.permutation(np.flatnonzero(ds.y_train == c))[
        :int(round(args.public_fraction * np.sum(ds.y_train == c)))] for c in range(ds.num_classes)])
    private = rng.permutation(np.setdiff1d(np.arange(len(ds.y_train)), public))
    spec = model_for_dataset("minirocket", ds.input_shape, ds.num_classes)
    with seeded_init(args.seed):
        model = build_model(spec)
    layer = model.layers[0]
    stats = series_statistics(layer.plan, ds.x_train[private])
    layer.biases.copy_(torch.as_tensor(fleet_biases(layer.plan, stats["shares"], stats["scales"],
                                                    np.ones(layer.plan.channels), args.seed)))
    initial = state_to_numpy(model, copy=True)
    train = TrainConfig(epochs=args.epochs, batch_size=32, lr=0.004, momentum=0.9, threads=1, loss="squared")
    x_public = ds.x_train[public]
    on_public, on_test, counts = [], [], []
    for i, shard in enumerate(np.array_split(private, DEVICES)):
        level = LEVELS[i % len(LEVELS)]
        pruned = prune_spec(spec, initial, level)
        device = build_model(pruned.spec)
        load_numpy_state(device, pruned.tensors)
        train_local(device, ds.x_train[shard], ds.y_train[shard], train, seed=args.seed * 100 + i)
        device.eval()
        with torch.no_grad():
            on_public.append(device(torch.from_numpy(x_public)).numpy())
            on_test.append(device(torch.from_numpy(ds.x_test)).numpy())
        counts.append(np.bincount(ds.y_train[shard], minlength=ds.num_classes))
        print(f"device {i} (p{level:g}, {len(shard)} series): {accuracy(device, ds.x_test, ds.y_test):.3f}", flush=True)
    counts = np.stack(counts)
    teachers = float((ensemble_logits(on_test, counts).argmax(1) == ds.y_test).mean())
    student = build_model(spec)
    load_numpy_state(student, initial)
    result = distill(student, x_public, ensemble_logits(on_public, counts), DistillConfig(epochs=150))
    print(f"the distilled global head: {accuracy(student, ds.x_test, ds.y_test):.3f}")
    teacher = ensemble_logits(on_public, counts)
    for level in LEVELS[1:]:  # what REFT publishes to a device of a level: the global head cut, then distilled
        cut = prune_spec(spec, state_to_numpy(student, copy=True), level)
        model = build_model(cut.spec)
        load_numpy_state(model, cut.tensors)
        as_cut = accuracy(model, ds.x_test, ds.y_test)
        distill(model, x_public, teacher, DistillConfig(epochs=150))
        after = accuracy(model, ds.x_test, ds.y_test)
        print(f"p{level:g}: the distilled head cut {as_cut:.3f}, then distilled {after:.3f}")
    own = build_model(spec)
    load_numpy_state(own, initial)
    train_local(own, x_public, ds.y_train[public], train, seed=args.seed)
    print(f"PLAID seed {args.seed}, {len(public)} public series: teachers' ensemble {teachers:.3f}, distilled head "
          f"{accuracy(student, ds.x_test, ds.y_test):.3f} (agreement on the public set {result.agreement:.2f}), "
          f"a head fitted to the public series' labels {accuracy(own, ds.x_test, ds.y_test):.3f}")


if __name__ == "__main__":
    main()
