"""MiniRocket's widths on a mixed fleet (issue 60): HeteroFL, where each device's measured FLOPS picks
how many of the 84 kernels it computes (a prefix of the full width's features, the classifier's
columns a prefix of the full classifier's), beside FedAvg at full width on every device and FedAvg
at the smallest width on every device, in one run, on the same partition and seed; ``heterofl
nested``: each device trains the classifier of its width and of every smaller one.

    OMP_NUM_THREADS=1 python bench/minirocket_widths.py --seeds 1 --rounds 30
    OMP_NUM_THREADS=1 python bench/minirocket_widths.py --seeds 3 --json widths.json

The default mixed fleet (21 devices, 3 of each of the 7 default profiles), PLAID windows of 500,
IID; every run takes minirocket's default training (`edge_sdk.family_recipe`: squared loss, lr
0.004, momentum 0.9, FedAvgM with η = 1; ``heterofl`` is plain HeteroFL, ``nested=false``) and
``--local-epochs`` local epochs. Prints each width's
accuracy on the archive's test split after the last round, the devices at each width, and the
bytes a round (down + up, the whole fleet) from each job's report.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from edge_sdk.train_config import TrainConfig  # noqa: E402
from simulation.simulate import DEFAULT_FLEET, SimulationConfig, run_simulation, sim_federation  # noqa: E402

#: name -> (method, options)
RUNS = {"heterofl": ("heterofl", {"nested": "false"}), "heterofl nested": ("heterofl", {"nested": "true"}),
        "fedavg full width": ("fedavg", {}),
        "fedavg p=0.25 all": ("fedavg", {"width": "0.25"})}


def run(name: str, seed: int, args: argparse.Namespace, work: Path) -> dict:
    method, options = RUNS[name]
    config = SimulationConfig(
        method=method, clients=args.clients, dataset=args.dataset, model="minirocket", partition=args.partition,
        profiles=DEFAULT_FLEET, out=str(work / f"{name.replace(' ', '_')}-{seed}"), plots=False, throttle="off",
        threads=1, job=f"bench-widths-{seed}", options=dict(options),
        federation=sim_federation(rounds=args.rounds, seed=seed, eval_every=args.rounds,
                                  train=TrainConfig(epochs=args.local_epochs)))
    started = time.perf_counter()
    report = run_simulation(config).to_dict()
    rounds = report["rounds"]
    return {"accuracy": report["final"]["accuracy"], "seconds": time.perf_counter() - started,
            "bytes_per_round": sum(r["bytes_down"] + r["bytes_up"] for r in rounds) / len(rounds),
            "devices": {label: sum(d["assignment"] == label for d in report["devices"])
                        for label in report["final"]["accuracy"]},
            "recipe": report["config"].get("family_recipe")}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--dataset", default="plaid")
    p.add_argument("--partition", default="iid")
    p.add_argument("--clients", type=int, default=21)
    p.add_argument("--rounds", type=int, default=30)
    p.add_argument("--local-epochs", type=int, default=5)
    p.add_argument("--seeds", type=int, default=1)
    p.add_argument("--first-seed", type=int, default=0, help="seeds first-seed .. first-seed + seeds - 1")
    p.add_argument("--runs", default=",".join(RUNS), help="which of: " + ", ".join(RUNS))
    p.add_argument("--json", type=Path, help="also write every run here")
    args = p.parse_args()
    names = args.runs.split(",")
    print(f"{args.dataset} ({args.partition}), {args.clients} devices, {args.rounds} rounds x {args.local_epochs} "
          f"local epochs, seeds {args.first_seed}..{args.first_seed + args.seeds - 1}", flush=True)
    results: dict[str, list[dict]] = {name: [] for name in names}
    with tempfile.TemporaryDirectory() as tmp:
        for seed in range(args.first_seed, args.first_seed + args.seeds):
            for name in names:
                result = run(name, seed, args, Path(tmp))
                results[name].append(result)
                cells = ", ".join(f"{label} {acc:.3f}" for label, acc in result["accuracy"].items())
                print(f"  seed {seed} {name}: {cells}; devices {result['devices']}; "
                      f"{result['bytes_per_round'] / 1e6:.2f} MB a round; {result['seconds']:.0f} s", flush=True)
    print("\nmean over seeds (per seed)")
    for name, runs in results.items():
        for label in runs[0]["accuracy"]:
            values = [r["accuracy"][label] for r in runs]
            print(f"  {name:<20} width {label:<5} {statistics.mean(values):.3f} "
                  f"({', '.join(f'{v:.3f}' for v in values)})")
        print(f"  {name:<20} {statistics.mean(r['bytes_per_round'] for r in runs) / 1e6:.2f} MB a round")
    if args.json:
        args.json.write_text(json.dumps({"args": vars(args) | {"json": str(args.json)}, "results": results}, indent=1))


if __name__ == "__main__":
    main()
