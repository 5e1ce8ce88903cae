"""REFT's bytes and accuracy against the size of its public set (the inputs every device downloads).

On Fashion-MNIST the 6,000 held-out public images (4.7 MB as uint8) are most of what a REFT device
receives, so the public set decides whether REFT can send ≤ 1/10 of FedAvg's bytes. This runs
only one-shot REFT (the fleet, data and harness of ``bench_reft.py``) once per ``public_samples``
and prints, per size, the mean and worst device's bytes and the distilled model's accuracy; compare
with FedAvg's figures from ``bench_reft.py --json``::

    python bench/reft_public_set.py --dataset fashion-mnist --model flanc_cnn --threads 2 \\
        --reft-epochs 2 --sizes 1000,300 --option distill_epochs=30 --json bench/results/fmnist/reft-public.json
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch

from bench_reft import DATA, F_LAMBDA, fleet_profiles, run  # bench/bench_reft.py (scripts run from bench/)
from edge_sdk.methods.settings.options import option_pairs
from edge_sdk.training import TrainConfig

__all__ = ["main"]


def one_size(samples: int, profiles: tuple[str, ...], out: Path, train: TrainConfig,
             options: dict[str, str]) -> dict[str, Any]:
    """One one-shot REFT job with `samples` public inputs: bytes per device and accuracy."""
    report = run(f"reft-{samples}", "reft", 1, profiles, out, train,
                 {"f_lambda": str(F_LAMBDA), **options, "public_samples": str(samples)})
    totals = [d["bytes_down"] + d["bytes_up"] for d in report["devices"]]
    method = report["config"]["method_config"]
    return {"public_samples": method["public_samples"], "public_bytes": method["public_bytes"],
            "mean_device_bytes": float(np.mean(totals)), "worst_device_bytes": int(max(totals)),
            "accuracy": report["final"]["accuracy"]["global"], "metrics": report["rounds"][0]["metrics"],
            "wall_seconds": report["wall_seconds"]}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--sizes", default="1000,300", help="public_samples values, comma-separated")
    parser.add_argument("--reft-epochs", type=int, default=2, help="local epochs of the one REFT round")
    parser.add_argument("--dataset", default="fashion-mnist")
    parser.add_argument("--data-root", default=None)
    parser.add_argument("--model", default="flanc_cnn")
    parser.add_argument("--threads", type=int, default=1, help="torch threads of training and distillation")
    parser.add_argument("--option", action="append", default=[], metavar="KEY=VALUE",
                        help="a REFT option, e.g. distill_epochs=30 (repeatable)")
    parser.add_argument("--json", default=None)
    args = parser.parse_args()
    try:
        options = option_pairs(args.option)
        sizes = [int(s) for s in args.sizes.split(",")]
    except ValueError as exc:
        parser.error(str(exc))
    DATA.update(dataset=args.dataset, data_root=args.data_root, model=args.model)
    torch.set_num_threads(args.threads)
    train = TrainConfig(epochs=args.reft_epochs, batch_size=32, threads=args.threads)
    print(f"# REFT one-shot by public set size ({time.strftime('%Y-%m-%d %H:%M')}, {args.dataset}, {args.model}, "
          f"{args.threads} threads, options {options})")
    print(f"{'public':>7} {'public B':>10} {'mean device B':>14} {'worst device B':>15} {'accuracy':>9} {'s':>6}")
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        profiles = fleet_profiles(Path(tmp))
        for samples in sizes:
            row = one_size(samples, profiles, Path(tmp), train, options)
            rows.append(row)
            print(f"{row['public_samples']:>7} {row['public_bytes']:>10,} {row['mean_device_bytes']:>14,.0f} "
                  f"{row['worst_device_bytes']:>15,} {row['accuracy']:>9.3f} {row['wall_seconds']:>6.0f}", flush=True)
    if args.json:
        Path(args.json).write_text(json.dumps({"args": vars(args), "runs": rows}, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
