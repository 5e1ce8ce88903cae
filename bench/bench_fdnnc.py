"""FDNNC figures: accuracy on big and small devices and uploads, per pattern x upload x big fraction.

Every run is a real federated job (embedded broker, one MQTT client per device, real
MNIST digits). Prints one row per run, then the issue's targets: HALF vs FULL
(factor uploads of small devices ≈ 1/2, accuracy loss ≤ 1 point) and which pattern
gives the best accuracy / upload trade-off. The all-big run (F = 1, the dense model
trained by FedAvg) is the baseline the ratios refer to.

    python bench/bench_fdnnc.py [--clients 10] [--rounds 10] [--json bench/results/fdnnc.json]

HALF vs FULL over seeds (BENCHMARKS.md, issue 17): one ``--json`` per seed, then ``--summary``::

    python bench/bench_fdnnc.py --partition shards:2 --fractions 0.5 --patterns switch --rounds 30 --seed S --json sS.json
    python bench/bench_fdnnc.py --summary s0.json s1.json ...
"""

from __future__ import annotations

import argparse
import json
import logging
import time
from pathlib import Path
from tempfile import TemporaryDirectory
from typing import Any

import numpy as np

from coordinator.runtime.broker import EmbeddedBroker
from simulation.simulate import SimulationConfig, run_simulation, sim_federation
from edge_sdk.training import TrainConfig

__all__ = ["main"]


def _canonical(pattern: str, upload: str, fraction: float) -> tuple[str, str, float]:
    """Runs that are provably the same job: without small devices the upload mode and the
    pattern do nothing; without big devices every pattern trains small devices every round."""
    if fraction >= 1.0:
        return ("both", "full", fraction)
    if fraction <= 0.0:
        return ("both", upload, fraction)
    return (pattern, upload, fraction)


def _run(args: argparse.Namespace, url: str, pattern: str, upload: str, fraction: float, tmp: str) -> dict[str, Any]:
    options = {"pattern": pattern, "upload": upload, "big_fraction": str(fraction), "rank": str(args.rank),
               "freeze": args.freeze, "half_split": args.half_split,
               "both_weight": args.both_weight}
    if args.server_opt != "none":
        options["server_opt"] = args.server_opt
    config = SimulationConfig(method="fdnnc", clients=args.clients, dataset=args.dataset, partition=args.partition,
                              out=str(Path(tmp) / f"{pattern}-{upload}-{fraction}"), broker_url=url, model="mlp",
                              throttle="off", plots=False, sim_device=args.sim_device,
                              job=f"bench-fdnnc-{pattern}-{upload}-{int(fraction * 100)}", options=options,
                              federation=sim_federation(rounds=args.rounds, seed=args.seed,
                                                        train=TrainConfig(epochs=args.epochs, batch_size=32, lr=args.lr, optimizer=args.optimizer)))
    started = time.monotonic()
    report = run_simulation(config)
    tail = report.rounds[-3:]
    total = lambda key: float(sum(r.metrics.get(key, 0.0) for r in report.rounds))  # noqa: E731
    return {
        "pattern": pattern, "upload": upload, "fraction": fraction,
        "n_big": sum(d["assignment"] == "big" for d in report.devices),
        "acc_big": float(np.mean([r.accuracy["big"] for r in tail])),
        "acc_small": float(np.mean([r.accuracy["small"] for r in tail])),
        "final_big": report.rounds[-1].accuracy["big"], "final_small": report.rounds[-1].accuracy["small"],
        "curve_big": [r.accuracy["big"] for r in report.rounds],
        "curve_small": [r.accuracy["small"] for r in report.rounds],
        "up_params": total("up_params_big") + total("up_params_small"),
        "up_params_small": total("up_params_small"),
        "up_factor_params_small": total("up_factor_params_small"),
        "bytes_up": sum(r.bytes_up for r in report.rounds),
        "bytes_up_small": sum(d["bytes_up"] for d in report.devices if d["assignment"] == "small"),
        "params": {label: m["params"] for label, m in report.models.items()},
        "rejections": len(report.rejections), "host_s": time.monotonic() - started,
    }


def _targets(rows: dict[tuple[str, str, float], dict[str, Any]], fractions: list[float],
             patterns: list[str]) -> list[str]:
    lines = ["", "HALF vs FULL (target: small devices' factor uploads ≈ 0.5x, accuracy loss ≤ 1 point)"]
    lines.append(f"{'pattern':8} {'F':>4} {'factor up ratio':>15} {'small-dev bytes ratio':>21} "
                 f"{'Δacc small':>10} {'Δacc big':>9}  met")
    met_all = True
    for pattern in patterns:
        for f in fractions:
            if f >= 1.0:
                continue
            full, half = rows[(pattern, "full", f)], rows[(pattern, "half", f)]
            ratio = half["up_factor_params_small"] / max(full["up_factor_params_small"], 1.0)
            bytes_ratio = half["bytes_up_small"] / max(full["bytes_up_small"], 1)
            d_small = 100 * (half["acc_small"] - full["acc_small"])
            d_big = 100 * (half["acc_big"] - full["acc_big"])
            met = 0.45 <= ratio <= 0.55 and d_small >= -1.0 and d_big >= -1.0
            met_all &= met
            lines.append(f"{pattern:8} {f:4.1f} {ratio:15.3f} {bytes_ratio:21.3f} {d_small:+10.1f} {d_big:+9.1f}  "
                         f"{'yes' if met else 'NO'}")
    lines.append(f"HALF target met in every cell: {'yes' if met_all else 'NO'}")
    lines += ["", "Trade-off per big fraction (accuracy = mean of big and small, last 3 rounds; "
              "upload = parameters sent by all devices)"]
    for upload in ("half", "full"):
        wins = 0
        for f in fractions:
            if f <= 0.0 or f >= 1.0:
                continue
            scored = []
            for pattern in patterns:
                row = rows[(pattern, upload, f)]
                scored.append((pattern, (row["acc_big"] + row["acc_small"]) / 2, row["up_params"] / 1e6))
            best_acc = max(scored, key=lambda s: s[1])
            best_eff = max(scored, key=lambda s: s[1] / s[2])
            wins += best_acc[0] == "switch"
            lines.append(f"  {upload:4} F={f:.1f}: " + ", ".join(f"{p} {a:.3f} @ {u:.1f} M" for p, a, u in scored)
                         + f"  -> most accurate {best_acc[0]}, most accuracy per parameter {best_eff[0]}")
        lines.append(f"  {upload}: SWITCH most accurate in {wins} of {sum(0 < f < 1 for f in fractions)} mixed fleets")
    return lines


def seed_summary(paths: list[str], lasts: tuple[int, ...] = (3, 10)) -> list[str]:
    """HALF − FULL (small devices, points) per ``--json`` file, i.e. per seed, averaged over the last
    3 and the last 10 rounds, then their mean ± standard error over the files."""
    lines = [f"{'seed':>4} " + " ".join(f"{'HALF-FULL last ' + str(n):>17}" for n in lasts)]
    gaps: dict[int, list[float]] = {n: [] for n in lasts}
    for path in paths:
        try:
            data = json.loads(Path(path).read_text())
            curves = {(r["pattern"], r["upload"], r["fraction"]): r["curve_small"] for r in data["runs"]}
        except (OSError, ValueError, KeyError, TypeError) as exc:
            raise SystemExit(f"{path}: not a bench_fdnnc --json file ({exc.__class__.__name__}: {exc})") from None
        pairs = [(k, curves[(k[0], "half", k[2])]) for k in curves if k[1] == "full" and (k[0], "half", k[2]) in curves]
        if len(pairs) != 1:
            raise SystemExit(f"{path}: needs exactly one FULL/HALF pair (one pattern, one F), found {len(pairs)}")
        (full_key, half) = pairs[0]
        full = curves[full_key]
        for n in lasts:
            gaps[n].append(100 * (float(np.mean(half[-n:])) - float(np.mean(full[-n:]))))
        lines.append(f"{data['args']['seed']:>4} " + " ".join(f"{gaps[n][-1]:>+17.1f}" for n in lasts))
    lines.append("mean " + " ".join(f"{np.mean(g):>+11.1f} ± {np.std(g, ddof=1) / np.sqrt(len(g)) if len(g) > 1 else 0:.1f}"
                                     for g in gaps.values()) + "   (± standard error over seeds)")
    return lines


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--clients", type=int, default=10)
    parser.add_argument("--rounds", type=int, default=10)
    parser.add_argument("--epochs", type=int, default=1)
    parser.add_argument("--lr", type=float, default=1e-3)
    parser.add_argument("--optimizer", default="adam")
    parser.add_argument("--rank", type=int, default=32)
    parser.add_argument("--dataset", default="mnist-sample")
    parser.add_argument("--sim-device", default="cpu",
                        help="where the simulated devices train and the model is evaluated: cpu, cuda, cuda:N, auto")
    parser.add_argument("--partition", default="iid")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--fractions", default="0,0.2,0.5,0.7,1.0")
    parser.add_argument("--patterns", default="both,bfirst,switch")
    parser.add_argument("--freeze", default="false", choices=["true", "false"],
                        help="half upload: freeze the factor a device does not upload")
    parser.add_argument("--half-split", default="devices", choices=["devices", "rounds"],
                        help="half upload: split A/B over a round's small devices or over rounds")
    parser.add_argument("--both-weight", default="equal", choices=["equal", "samples"],
                        help="BOTH: average dense and composed weights equally (the paper) or by group samples")
    parser.add_argument("--server-opt", default="none", choices=["none", "fedavgm", "fedadam", "fedyogi"],
                        help="server optimizer on every aggregate (docs/server_optimizers.md)")
    parser.add_argument("--json", help="also write every run (with accuracy curves) to this file")
    parser.add_argument("--summary", nargs="+", metavar="JSON",
                        help="print HALF − FULL per --json file (one per seed) and over them, and exit")
    args = parser.parse_args(argv)
    if args.summary:
        print("\n".join(seed_summary(args.summary)))
        return 0
    logging.basicConfig(level=logging.ERROR)
    fractions = [float(f) for f in args.fractions.split(",")]
    patterns = args.patterns.split(",")
    print(f"FDNNC on {args.dataset} ({args.partition}), MLP 784-512-256-10, rank {args.rank}, {args.clients} devices, "
          f"{args.rounds} rounds, {args.epochs} local epoch(s), {args.optimizer} lr {args.lr}, seed {args.seed}, "
          f"freeze {args.freeze}, half split {args.half_split}; --throttle off")
    print("accuracy = mean of the last 3 rounds on the held-out test images; up = parameters uploaded in the run")
    print(f"{'pattern':8} {'upload':6} {'F':>4} {'big':>4} {'acc big':>7} {'acc small':>9} {'up params':>10} "
          f"{'small factor up':>15} {'MB up':>7} {'vs dense up':>11} {'s':>5}")
    rows: dict[tuple[str, str, float], dict[str, Any]] = {}
    done: dict[tuple[str, str, float], dict[str, Any]] = {}
    started = time.monotonic()
    with EmbeddedBroker() as broker, TemporaryDirectory() as tmp:
        baseline = None  # the all-big (dense FedAvg) job, when F = 1 is in the grid
        if 1.0 in fractions:
            baseline = done[_canonical("both", "full", 1.0)] = _run(args, broker.url, "both", "full", 1.0, tmp)
        for f in fractions:
            for pattern in patterns:
                for upload in ("full", "half"):
                    key = _canonical(pattern, upload, f)
                    same = key in done
                    if not same:
                        done[key] = _run(args, broker.url, *key, tmp)
                    row = rows[(pattern, upload, f)] = {**done[key], "pattern": pattern, "upload": upload,
                                                         "same_as": list(key) if key != (pattern, upload, f) else None}
                    print(f"{pattern:8} {upload:6} {f:4.1f} {row['n_big']:4d} {row['acc_big']:7.3f} "
                          f"{row['acc_small']:9.3f} {row['up_params'] / 1e6:9.2f}M "
                          f"{row['up_factor_params_small'] / 1e6:14.2f}M {row['bytes_up'] / 1e6:7.1f} "
                          + (f"{row['up_params'] / baseline['up_params']:11.3f}" if baseline else f"{'-':>11}")
                          + f" {row['host_s']:5.0f}"
                          + ("  (same job as " + "/".join(map(str, key)) + ")" if row["same_as"] else ""),
                          flush=True)
    print(f"model params: {next(iter(done.values()))['params']}; rejected updates in all runs: "
          f"{sum(r['rejections'] for r in done.values())}; {len(done)} jobs in {time.monotonic() - started:.0f} s")
    print("\n".join(_targets(rows, fractions, patterns)))
    if args.json:
        Path(args.json).write_text(json.dumps({"args": vars(args), "runs": [
            {**row, "fraction": f} for (p, u, f), row in rows.items()]}, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
