"""Server optimizers and FedProx on a non-IID fleet (issue 17): rounds to a target accuracy and
the round-to-round swing of the last rounds, per variant, over seeds.

Protocol (defaults): full Fashion-MNIST (``apt-get install dataset-fashion-mnist``), 100 devices,
10 per round, 3 classes per device (``shards:3``), cnn4, 1 local epoch, batch 32, SGD lr 0.05,
100 rounds, evaluation on 2,000 stratified test images every round (the last on all 10,000).
Variants: plain FedAvg, FedAvgM, FedAdam, FedYogi (their default η) and FedProx (``prox_mu``).
``--method`` applies them to FedAvg (default), FLANC (every width in every round) or FDNNC
SWITCH + HALF (half the devices big; BENCHMARKS.md's figures use ``--model mlp --lr 0.01``:
at lr 0.05 its low-rank devices diverge on these shards).

    python bench/bench_server_opt.py --variants fedavg,fedavgm,fedadam --seeds 0,1,2 --out runs/sopt
    python bench/bench_server_opt.py --method fdnnc --model mlp --lr 0.01 --variants fedavg,fedadam --out runs/sopt
    python bench/bench_server_opt.py --table [--method M] --out runs/sopt

A finished run (its JSON in ``--out``) is skipped; a stopped one resumes from its checkpoint.
``--method-option KEY=VALUE`` adds an option of the method to every variant (runs are named
alike, so give them their own ``--out``), e.g. FLANC with ``norm=groupnorm``.
``--dataset digits --clients 10 --per-round 10 --model mlp --partition shards:2`` is the
minutes-long toy version.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import numpy as np

from edge_sdk.methods.settings.options import option_pairs
from simulation.simulate import SimulationConfig, run_simulation, sim_federation
from edge_sdk.training import TrainConfig

from emit import emit  # bench/emit.py (scripts run from bench/)

#: variant -> the options it adds to the method's
VARIANTS = {
    "fedavg": {},
    "fedavgm": {"server_opt": "fedavgm"},
    "fedavgm-eta0.1": {"server_opt": "fedavgm", "server_lr": "0.1"},  # η = 1 − β: no amplification
    "fedadam": {"server_opt": "fedadam"},
    "fedadam-eta0.03": {"server_opt": "fedadam", "server_lr": "0.03"},  # Reddi et al. tune η on a grid
    "fedyogi": {"server_opt": "fedyogi"},
    "fedprox": {"prox_mu": "0.01"},
}

#: method -> its own options in every variant
METHODS = {
    "fedavg": {},
    "flanc": {"sample": "every"},
    "fdnnc": {"pattern": "switch", "upload": "half", "big_fraction": "0.5"},
}


def _name(method: str, variant: str, seed: int) -> str:
    return f"{variant}-s{seed}" if method == "fedavg" else f"{method}-{variant}-s{seed}"


def _config(args: argparse.Namespace, variant: str, seed: int, out: Path) -> SimulationConfig:
    options = {**METHODS[args.method], **option_pairs(args.method_option), **VARIANTS[variant]}
    return SimulationConfig(method=args.method, clients=args.clients, dataset=args.dataset, data_root=args.data_root,
                            partition=args.partition, out=str(out), model=args.model, plots=False,
                            options=dict(options), sim_device=args.sim_device,
                            federation=sim_federation(rounds=args.rounds, seed=seed,
                                                      devices_per_round=args.per_round,
                                                      eval_samples=args.eval_samples,
                                                      checkpoint_dir=str(out / "checkpoint"),
                                                      train=TrainConfig(epochs=1, batch_size=32, lr=args.lr, threads=args.threads)))


def _run(args: argparse.Namespace, variant: str, seed: int) -> None:
    name = _name(args.method, variant, seed)
    path = Path(args.out) / f"{name}.json"
    if path.exists():
        return
    started = time.monotonic()
    report = run_simulation(_config(args, variant, seed, Path(args.out) / name))
    curve = [float(np.mean(list(r.accuracy.values()))) for r in report.rounds if r.accuracy]
    path.write_text(json.dumps({"method": args.method, "variant": variant, "seed": seed, "curve": curve,
                                "wall_s": round(time.monotonic() - started, 1), "sim_device": args.sim_device}))
    print(f"{name}: final {curve[-1]:.4f} in {time.monotonic() - started:.0f} s", flush=True)


def rounds_to(curve: list[float], target: float) -> int | None:
    """The first round (1-based) whose accuracy reaches ``target``, or None."""
    return next((i + 1 for i, a in enumerate(curve) if a >= target), None)


def table(out: Path, target: float, last: int, method: str = "fedavg") -> str:
    """Markdown: ``method``'s runs per variant, over seeds, rounds to ``target`` and final accuracy (mean ± std),
    the mean absolute round-to-round change over the ``last`` rounds, and the ratios to FedAvg."""
    runs: dict[str, list[list[float]]] = {}
    for path in sorted(out.glob("*.json")):
        data = json.loads(path.read_text())
        if data.get("method", "fedavg") != method:
            continue
        runs.setdefault(data["variant"], []).append(data["curve"])
    rows, base = [], {}
    for variant in [v for v in VARIANTS if v in runs]:
        curves = runs[variant]
        reach = [rounds_to(c, target) for c in curves]
        finals = [100 * c[-1] for c in curves]
        swing = [100 * float(np.mean(np.abs(np.diff(c[-last:])))) for c in curves]
        reached = [r for r in reach if r is not None]
        stats = {"reach": np.mean(reached) if len(reached) == len(reach) else None, "swing": np.mean(swing)}
        if variant == "fedavg":
            base = stats
        ratio_r = (f"{stats['reach'] / base['reach']:.2f}" if stats["reach"] and base.get("reach") else "")
        ratio_s = f"{base['swing'] / stats['swing']:.2f}" if base and stats["swing"] > 0 else ""
        reach_text = "/".join(str(r) if r is not None else "—" for r in reach)
        collapsed = sum(c[-1] < 0.15 for c in curves)  # ended at chance (10 classes)
        note = f"{collapsed} of {len(curves)} ended at chance" if collapsed else ""
        rows.append(f"| {variant} | {len(curves)} | {reach_text} | {ratio_r} | {np.mean(finals):.1f} ± "
                    f"{np.std(finals):.1f} | {np.mean(swing):.2f} | {ratio_s} | {note} |")
    head = (f"| variant | seeds | rounds to {100 * target:.0f} % (per seed) | × FedAvg's | final % | "
            f"mean abs. change over the last {last} rounds (points) | FedAvg's ÷ this | |\n"
            "|---|---|---|---|---|---|---|---|")
    return head + "\n" + "\n".join(rows)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--method", default="fedavg", choices=list(METHODS), help="the method the variants apply to")
    p.add_argument("--method-option", action="append", default=[], metavar="KEY=VALUE",
                   help="another option of the method in every variant (e.g. norm=groupnorm); use its own --out")
    p.add_argument("--variants", default=",".join(VARIANTS))
    p.add_argument("--seeds", default="0,1,2")
    p.add_argument("--dataset", default="fashion-mnist")
    p.add_argument("--data-root")
    p.add_argument("--sim-device", default="cpu",
                   help="where the simulated devices train and the model is evaluated: cpu, cuda, cuda:N, auto")
    p.add_argument("--model", default="cnn4")
    p.add_argument("--partition", default="shards:3")
    p.add_argument("--clients", type=int, default=100)
    p.add_argument("--per-round", type=int, default=10)
    p.add_argument("--rounds", type=int, default=100)
    p.add_argument("--lr", type=float, default=0.05)
    p.add_argument("--eval-samples", type=int, default=2000)
    p.add_argument("--threads", type=int, default=None, help="torch threads of each device's training")
    p.add_argument("--target", type=float, default=0.8, help="accuracy whose first round is counted")
    p.add_argument("--last", type=int, default=20, help="rounds over which the swing is measured")
    p.add_argument("--out", default="runs/server_opt")
    p.add_argument("--table", action="store_true", help="print the table of the finished runs and exit")
    args = p.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    bad = [o for o in args.method_option if "=" not in o]
    if bad:
        p.error(f"--method-option takes KEY=VALUE, got {bad}")
    variants = args.variants.split(",")
    unknown = [v for v in variants if v not in VARIANTS]
    if unknown:
        p.error(f"unknown variant(s) {unknown}; known: {', '.join(VARIANTS)}")
    if not args.table:
        for seed in (int(s) for s in args.seeds.split(",")):
            for variant in variants:
                _run(args, variant, seed)
    emit(table(out, args.target, args.last, args.method), None)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
