"""The same jobs' figures on two trees of edgefl: a refactor must not move them.

Runs every method (and FedAvg with a robust rule and a server optimizer) for 2 rounds on the
shipped MNIST sample, 4 simulated devices, 1 torch thread, an lr decay after round 1, and prints
each round's accuracy per model label and loss as JSON lines. Run it on the tree before a change
and on the tree after, and compare (identical lines: no figure moved):

    git worktree add /tmp/before <commit>
    OMP_NUM_THREADS=1 python bench/same_figures.py --tree /tmp/before > before.jsonl
    OMP_NUM_THREADS=1 python bench/same_figures.py > after.jsonl
    diff before.jsonl after.jsonl

A tree from before issue 37 (flat SimulationConfig in coordinator/simulate.py) is run through its
own API; one from after it through simulation/.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path

JOBS = [("fedavg", {}), ("fedprox", {}), ("flanc", {}), ("heterofl", {}), ("fedpara", {}), ("pfedpara", {}),
        ("lowrank", {}), ("fdnnc", {}), ("reft", {}), ("static-prune", {}),
        ("fedavg", {"aggregate": "median", "server_opt": "fedadam"})]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tree", default=str(Path(__file__).parents[1]), help="the edgefl tree to run (a checkout)")
    args = parser.parse_args(argv)
    sys.path.insert(0, args.tree)
    from edge_sdk.training import TrainConfig

    job = dict(rounds=2, lr_decay=((1, 0.5),), train=TrainConfig(epochs=1, batch_size=32, lr=0.05))
    with tempfile.TemporaryDirectory() as out:
        for method, options in JOBS:
            common = dict(method=method, clients=4, out=f"{out}/{method}", threads=1, plots=False, options=options)
            if (Path(args.tree) / "simulation").is_dir():
                from simulation.simulate import SimulationConfig, run_simulation, sim_federation
                config = SimulationConfig(**common, federation=sim_federation(**job))
            else:  # before issue 37
                from coordinator.simulate import SimulationConfig, run_simulation  # type: ignore[no-redef]
                config = SimulationConfig(**common, **job)
            report = run_simulation(config)
            print(json.dumps({"method": method, "options": options,
                              "rounds": [[r.accuracy, r.loss] for r in report.rounds]}), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
