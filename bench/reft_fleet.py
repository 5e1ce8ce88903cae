"""REFT against FedAvg on a large fleet with little data per device: bytes and accuracy.

``bench_reft.py`` gives five devices 12,000 images each, so FedAvg needs three rounds and REFT's
one-shot saves nothing. Here the fleet is the FLANC paper's: 100 devices (20 each of 10, 20, 40,
60 and 100 GFLOPS; F_lambda = 100 GFLOPS, so levels 0.9 / 0.8 / 0.6 / 0.4 / 0) with an IID share of
Fashion-MNIST each: 600 images under FedAvg, 540 under REFT, whose public set (a tenth of the
training split, stratified) no device holds.

* FedAvg: dense model, ``--per-round`` devices per round, ``--rounds`` rounds of 1 local epoch,
  SGD; interim accuracy on ``--eval-samples`` stratified test images, the last round on all 10,000.
* REFT: one shot, every device in the one round (its pruned model, ``--reft-epochs`` local epochs,
  Adam), logits on ``public_samples`` public images, distilled into the dense model.

Bytes are the MQTT payload bytes of all rounds (down + up) divided by the fleet size: what the mean
device sends and receives, whether it took part in a round or not. Every job's JSON goes to
``--out`` and a finished job is not run again; the table compares every REFT job there with FedAvg::

    python bench/reft_fleet.py --jobs fedavg --threads 1 --out bench/results/fmnist/reft-fleet
    python bench/reft_fleet.py --jobs reft --reft-epochs 5 --option public_samples=1000 \\
        --option distill_epochs=30 --threads 1 --out bench/results/fmnist/reft-fleet
    python bench/reft_fleet.py --table --out bench/results/fmnist/reft-fleet

On the 2-core development machine the FedAvg job takes about 80 minutes, a REFT job 15 minutes with
1,000 public images and 45 with 6,000 (docs/benchmarks_history.md, "REFT on the FLANC protocol's fleet").
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

from bench_reft import F_LAMBDA, fleet_profiles  # bench/bench_reft.py (scripts run from bench/)
from bench_server_opt import rounds_to
from edge_sdk.methods.settings.options import option_pairs
from simulation.simulate import SimulationConfig, run_simulation, sim_federation
from edge_sdk.training import TrainConfig

from emit import emit  # bench/emit.py

__all__ = ["main", "table"]


def _job_name(args: argparse.Namespace, job: str, options: dict[str, str]) -> str:
    if job == "fedavg":
        return f"fedavg-r{args.rounds}-lr{args.lr:g}-s{args.seed}"
    extra = "-".join(f"{k}{v}" for k, v in sorted(options.items()))
    return f"reft-e{args.reft_epochs}-{extra}-s{args.seed}" if extra else f"reft-e{args.reft_epochs}-s{args.seed}"


def _run(args: argparse.Namespace, job: str, options: dict[str, str], out: Path) -> None:
    name = _job_name(args, job, options)
    path = out / f"{name}.json"
    if path.exists():
        print(f"{name}: done before ({path})")
        return
    started = time.monotonic()
    with tempfile.TemporaryDirectory() as tmp:
        common = dict(clients=args.clients, dataset=args.dataset, data_root=args.data_root, model=args.model,
                      partition="iid", out=str(Path(tmp) / "run"), job=f"reft-fleet-{job}",
                      profiles=fleet_profiles(Path(tmp)), throttle="off", plots=False)
        job_settings = dict(seed=args.seed, round_deadline_s=7200.0)
        if job == "fedavg":
            config = SimulationConfig(method="fedavg", **common, federation=sim_federation(
                rounds=args.rounds, devices_per_round=args.per_round, eval_samples=args.eval_samples,
                train=TrainConfig(epochs=1, batch_size=32, lr=args.lr, threads=args.threads), **job_settings))
        else:
            config = SimulationConfig(method="reft", options={"f_lambda": str(F_LAMBDA), **options}, **common,
                                      federation=sim_federation(rounds=1, **job_settings, train=TrainConfig(
                                          epochs=args.reft_epochs, batch_size=32, threads=args.threads)))
        report = run_simulation(config).to_dict()
    rounds = report["rounds"]
    fleet_bytes = np.cumsum([r["bytes_down"] + r["bytes_up"] for r in rounds]) / args.clients
    accuracy = [float(np.mean(list(r["accuracy"].values()))) if job == "fedavg" else r["accuracy"]["global"]
                for r in rounds]
    result = {"job": job, "name": name, "seed": args.seed, "clients": args.clients, "options": options,
              "accuracy": accuracy, "bytes_per_device": fleet_bytes.tolist(),
              "device_bytes": [d["bytes_down"] + d["bytes_up"] for d in report["devices"]],
              "metrics": rounds[-1]["metrics"], "method_config": report["config"].get("method_config", {}),
              "wall_s": round(time.monotonic() - started, 1)}
    path.write_text(json.dumps(result, indent=1))
    print(f"{name}: accuracy {accuracy[-1]:.4f}, {fleet_bytes[-1] / 1e6:.2f} MB per device, "
          f"{result['wall_s']:.0f} s", flush=True)


def table(out: Path) -> str:
    """Markdown: every REFT job in ``out`` against the FedAvg job of the same seed."""
    jobs = [json.loads(p.read_text()) for p in sorted(out.glob("*.json"))]
    fedavg = {j["seed"]: j for j in jobs if j["job"] == "fedavg"}
    rows = []
    for seed, fed in sorted(fedavg.items()):
        acc, mb = fed["accuracy"], fed["bytes_per_device"]
        rows.append(f"| FedAvg, {len(acc)} rounds (seed {seed}) | {100 * acc[-1]:.1f} | {mb[-1] / 1e6:.2f} | 1 | | |")
    for job in (j for j in jobs if j["job"] == "reft"):
        fed = fedavg.get(job["seed"])
        acc, mb = job["accuracy"][-1], job["bytes_per_device"][-1]
        worst = max(job["device_bytes"])
        if fed is None:
            rows.append(f"| REFT {job['name']} | {100 * acc:.1f} | {mb / 1e6:.2f} | (no FedAvg job) | | |")
            continue
        fed_acc, fed_mb = fed["accuracy"], fed["bytes_per_device"]
        at = rounds_to(fed_acc, acc)
        same = (f"round {at}: {fed_mb[at - 1] / 1e6:.2f} MB = {fed_mb[at - 1] / mb:.1f}× REFT's" if at is not None
                else "never")
        rows.append(f"| REFT {job['name']} | {100 * acc:.1f} ({100 * (acc - fed_acc[-1]):+.1f}) | {mb / 1e6:.2f} "
                    f"(worst device {worst / 1e6:.2f}) | 1/{fed_mb[-1] / mb:.1f} (worst 1/{fed_mb[-1] / worst:.1f}) "
                    f"| {same} | {job['wall_s']:.0f} s |")
    head = ("| job | accuracy % (vs FedAvg's last) | MB per device | vs FedAvg's bytes | FedAvg first at REFT's "
            "accuracy | wall |\n|---|---|---|---|---|---|")
    return head + "\n" + "\n".join(rows)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--jobs", default="fedavg,reft", help="fedavg, reft or both, comma-separated")
    p.add_argument("--clients", type=int, default=100)
    p.add_argument("--per-round", type=int, default=10, help="FedAvg's devices per round")
    p.add_argument("--rounds", type=int, default=100, help="FedAvg's rounds")
    p.add_argument("--lr", type=float, default=0.02, help="FedAvg's SGD lr (flanc_cnn diverges at 0.05)")
    p.add_argument("--eval-samples", type=int, default=2000, help="FedAvg's interim evaluations")
    p.add_argument("--reft-epochs", type=int, default=5, help="local epochs of REFT's one round")
    p.add_argument("--option", action="append", default=[], metavar="KEY=VALUE",
                   help="a REFT option, e.g. public_samples=1000 or distill_epochs=30 (repeatable)")
    p.add_argument("--dataset", default="fashion-mnist")
    p.add_argument("--data-root")
    p.add_argument("--model", default="flanc_cnn")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--threads", type=int, default=1, help="torch threads of training and distillation")
    p.add_argument("--out", default="runs/reft_fleet")
    p.add_argument("--table", action="store_true", help="print the table of the finished jobs and exit")
    args = p.parse_args()
    try:
        options = option_pairs(args.option)
    except ValueError as exc:
        p.error(str(exc))
    jobs = args.jobs.split(",")
    if any(j not in ("fedavg", "reft") for j in jobs):
        p.error(f"--jobs takes fedavg and/or reft, got {args.jobs!r}")
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    torch.set_num_threads(args.threads)  # REFT's distillation runs in this process
    if not args.table:
        for job in jobs:
            _run(args, job, options if job == "reft" else {}, out)
    emit(table(out), None)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
