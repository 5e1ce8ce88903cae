"""Federated accuracy beside central accuracy for the same model (issue 38's target).

Runs ``edgefl simulate`` on Fashion-MNIST (``apt-get install dataset-fashion-mnist``), 20 devices,
30 rounds, FedAvg, every device holding out ``--holdout`` of its data, IID and ``shards:3``; each
round's central accuracy (the 10,000 test images) and federated accuracy (the devices' held-out
samples) are of the same aggregated model. Prints, per partition, the final gap and the largest
gap over the last 10 rounds, and what a federated evaluation costs the coordinator's host against
the round's training (``evaluation.host_seconds`` over the rest of the round's ``host_seconds``):

    OMP_NUM_THREADS=1 python bench/federated_eval.py                 # both, ~25 minutes on 2 cores
    OMP_NUM_THREADS=1 python bench/federated_eval.py --rounds 3 --partitions iid   # a quick look
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path


def run(partition: str, rounds: int, clients: int, holdout: float, seed: int, work: Path) -> dict:
    out = work / partition.replace(":", "-")
    command = [sys.executable, "-m", "edge_sdk.cli", "simulate", "--method", "fedavg", "--dataset", "fashion-mnist",
               "--clients", str(clients), "--rounds", str(rounds), "--partition", partition, "--holdout", str(holdout),
               "--seed", str(seed), "--threads", "1", "--out", str(out)]
    subprocess.run(command, check=True, stdout=subprocess.DEVNULL)
    report = json.loads((out / "report.json").read_text())
    rows = []
    for r in report["rounds"]:
        ev = r["evaluation"]
        rows.append({"round": r["round"], "central": r["accuracy"]["global"],
                     "federated": r["federated_accuracy"]["global"], "samples": ev["samples"],
                     "eval_s": ev["host_seconds"], "train_s": r["host_seconds"] - ev["host_seconds"]})
    return {"partition": partition, "command": " ".join(command[2:]), "rounds": rows}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rounds", type=int, default=30)
    p.add_argument("--clients", type=int, default=20)
    p.add_argument("--holdout", type=float, default=0.2)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--partitions", default="iid,shards:3")
    p.add_argument("--json", help="also write the results here")
    args = p.parse_args()
    results = []
    with tempfile.TemporaryDirectory() as tmp:
        for partition in args.partitions.split(","):
            result = run(partition, args.rounds, args.clients, args.holdout, args.seed, Path(tmp))
            results.append(result)
            rows = result["rounds"]
            last = rows[-1]
            tail = rows[-10:]
            cost = statistics.median(r["eval_s"] / r["train_s"] for r in rows)
            print(f"{partition}: final central {last['central']:.4f} federated {last['federated']:.4f} "
                  f"(gap {100 * (last['federated'] - last['central']):+.2f} points, {last['samples']} held-out "
                  f"samples); largest gap over the last {len(tail)} rounds "
                  f"{100 * max(abs(r['federated'] - r['central']) for r in tail):.2f} points; "
                  f"evaluation / training host seconds: median {cost:.3f} "
                  f"(max {max(r['eval_s'] / r['train_s'] for r in rows):.3f})", flush=True)
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
