"""REFT figures: what pruning buys per level, bytes per device against FedAvg, and accuracy.

    python bench/bench_reft.py [--fedavg-rounds 15] [--json bench/results/reft.json]

1. cnn4 (MNIST 1x28x28) pruned by the coordinator to each level: backend, parameters, FLOPs
   (counted from the spec), bytes of the model as it travels in a plan, and inference latency on
   this CPU (one torch thread, the minimum over repeats, since the machine is shared) relative to
   the dense model. resnet_small at a few levels shows the dependency-aware residual case.
2. One fleet, one dataset, one harness (a real embedded broker): five devices of 10, 20, 40, 60,
   100 GFLOPS (F_lambda = 100 GFLOPS: levels 0.9, 0.8, 0.6, 0.4, 0), IID shards of the 5,000 real
   MNIST digits. FedAvg (dense) and static pruning run R rounds; REFT runs one shot (and once more
   with device_eval=true to measure every device model, and with oneshot=false for a second
   round). Bytes are MQTT payload bytes really sent.

On the full Fashion-MNIST (issue 15; ``apt-get install dataset-fashion-mnist``), with fewer
distillation epochs than the default 150 so that it fits a 2-core machine::

    python bench/bench_reft.py --dataset fashion-mnist --model flanc_cnn --fed-lr 0.02 --threads 2 \
        --fedavg-rounds 3 --static-rounds 4 --reft-epochs 2 --reft-rounds 1 --no-device-eval \
        --option distill_epochs=30 --json bench/results/fmnist/reft.json
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch

from edge_sdk.methods.settings.options import option_pairs
from coordinator.strategies.pruning import prune_spec
from simulation.simulate import SimulationConfig, run_simulation, sim_federation
from edge_sdk.models.spec import build_model, count_flops, count_params
from edge_sdk.models.zoo import cnn4, resnet_small
from edge_sdk.profiling import DeviceProfile, profile_to_toml
from edge_sdk.protocol.messages import Envelope, Plan, encode_envelope
from edge_sdk.tensors import load_numpy_state, state_to_numpy
from edge_sdk.training import TrainConfig

GFLOPS = (10, 20, 40, 60, 100)
F_LAMBDA = 100.0


def latency_ms(spec: dict, tensors: dict[str, np.ndarray], batch: int, repeats: int = 9) -> float:
    """Minimum over repeats of the mean forward time of a batch (eval mode, no grad)."""
    model = build_model(spec)
    load_numpy_state(model, tensors)
    model.eval()
    x = torch.randn(batch, *spec["input_shape"])
    iters = max(5, 400 // batch)
    best = float("inf")
    with torch.no_grad():
        for _ in range(3):
            model(x)
        for _ in range(repeats):
            start = time.perf_counter()
            for _ in range(iters):
                model(x)
            best = min(best, (time.perf_counter() - start) / iters)
    return best * 1e3


def plan_bytes(spec: dict, tensors: dict[str, np.ndarray]) -> int:
    plan = Plan(method="reft", label="x", model_spec=spec, tensors=tensors, train={})
    return len(encode_envelope(Envelope.of(plan, "coordinator")))


def level_table(name: str, spec: dict, levels: list[float], out: dict[str, Any]) -> None:
    torch.manual_seed(0)
    dense = state_to_numpy(build_model(spec), copy=True)
    p0, f0 = count_params(spec), count_flops(spec)
    base: dict[int, float] = {}
    rows = []
    print(f"\n## {name}: one-shot L1 structured pruning per level "
          f"(dense: {p0:,} params, {f0 / 1e6:.2f} MFLOPs/sample)")
    print(f"{'level':>6} {'backend':>13} {'params':>9} {'%dense':>7} {'MFLOPs':>8} {'%dense':>7} "
          f"{'plan bytes':>11} {'lat b1 ms':>10} {'speedup':>8} {'lat b64 ms':>11} {'speedup':>8} {'prune s':>8}")
    for level in levels:
        started = time.perf_counter()
        result = prune_spec(spec, dense, level)
        prune_s = time.perf_counter() - started
        lat = {b: latency_ms(result.spec, result.tensors, b) for b in (1, 64)}
        if level == 0:
            base = lat
        row = {"level": level, "backend": result.backend, "params": result.params, "flops": result.flops,
               "plan_bytes": plan_bytes(result.spec, result.tensors), "latency_b1_ms": lat[1],
               "latency_b64_ms": lat[64], "speedup_b1": base[1] / lat[1], "speedup_b64": base[64] / lat[64],
               "prune_seconds": prune_s}
        rows.append(row)
        print(f"{level:>6g} {result.backend:>13} {result.params:>9,} {100 * result.params / p0:>6.1f}% "
              f"{result.flops / 1e6:>8.3f} {100 * result.flops / f0:>6.1f}% {row['plan_bytes']:>11,} "
              f"{lat[1]:>10.3f} {row['speedup_b1']:>7.2f}x {lat[64]:>11.3f} {row['speedup_b64']:>7.2f}x "
              f"{prune_s:>8.2f}")
    out[name] = rows


def fleet_profiles(directory: Path) -> tuple[str, ...]:
    paths = []
    for g in GFLOPS:
        path = directory / f"device-{g}gflops.toml"
        path.write_text(profile_to_toml(DeviceProfile(name=f"device-{g}gflops", gflops=float(g), ram_mb=4096,
                                                      cpu_count=4, uplink_mbps=50.0, downlink_mbps=50.0)))
        paths.append(str(path))
    return tuple(paths)


#: The data and model of the runs (``--dataset``, ``--data-root``, ``--model``).
DATA: dict[str, Any] = {"dataset": "mnist-sample", "data_root": None, "model": "cnn4"}


#: Fashion-MNIST's 12,000 images per device, trained one device at a time, outlast the default 600 s
ROUND_DEADLINE_S = 7200.0


def run(tag: str, method: str, rounds: int, profiles: tuple[str, ...], out: Path, train: TrainConfig,
        options: dict[str, str] | None = None) -> dict[str, Any]:
    started = time.perf_counter()
    config = SimulationConfig(method=method, clients=len(profiles), **DATA,
                              partition="iid", out=str(out / tag), job=f"bench-{tag}",
                              profiles=profiles, throttle="off", plots=False, options=options or {},
                              federation=sim_federation(rounds=rounds, seed=0, train=train,
                                                        round_deadline_s=ROUND_DEADLINE_S))
    report = run_simulation(config).to_dict()
    report["wall_seconds"] = time.perf_counter() - started
    return report


def per_round_device_bytes(report: dict[str, Any]) -> list[float]:
    """Cumulative MQTT bytes (down + up) per participating device after each round."""
    total, out = 0.0, []
    for r in report["rounds"]:
        total += (r["bytes_down"] + r["bytes_up"]) / max(1, len(r["participants"]))
        out.append(total)
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--fedavg-rounds", type=int, default=15)
    parser.add_argument("--static-rounds", type=int, default=10)
    parser.add_argument("--fed-lr", type=float, default=0.05,
                        help="SGD lr of FedAvg's rounds (flanc_cnn, without norm layers, diverges at 0.05: use 0.02)")
    parser.add_argument("--reft-epochs", type=int, default=20, help="local epochs of the one REFT round")
    parser.add_argument("--reft-rounds", type=int, default=2,
                        help="also run REFT with oneshot=false for this many rounds (1: skip)")
    parser.add_argument("--json", default=None, help="also write every figure as JSON here")
    parser.add_argument("--dataset", default="mnist-sample",
                        help="e.g. fashion-mnist (apt-get install dataset-fashion-mnist) for the paper-scale table")
    parser.add_argument("--data-root", default=None)
    parser.add_argument("--model", default="cnn4", help="model family of the runs, e.g. flanc_cnn")
    parser.add_argument("--threads", type=int, default=1,
                        help="torch threads of the devices' training and the coordinator's distillation "
                             "(the latency tables use 1)")
    parser.add_argument("--option", action="append", default=[], metavar="KEY=VALUE",
                        help="a REFT option for the REFT runs, e.g. distill_epochs=30 (repeatable)")
    parser.add_argument("--no-device-eval", action="store_true",
                        help="skip the second one-shot REFT run (device_eval=true, whose devices also upload "
                             "weights) that measures each device's pruned model: halves REFT's time")
    args = parser.parse_args()
    try:
        reft_options = option_pairs(args.option)
    except ValueError as exc:
        parser.error(str(exc))
    DATA.update(dataset=args.dataset, data_root=args.data_root, model=args.model)
    torch.set_num_threads(1)  # a shared 2-core machine: OpenMP spin-waiting distorts everything else
    figures: dict[str, Any] = {"levels": {}}
    print(f"# REFT benchmark ({time.strftime('%Y-%m-%d %H:%M')}, torch {torch.__version__}, 1 thread)")
    level_table("cnn4", cnn4(), [i / 10 for i in range(10)], figures["levels"])
    level_table("resnet_small", resnet_small(in_channels=1, image_size=28), [0.0, 0.5, 0.9], figures["levels"])
    torch.set_num_threads(args.threads)  # the coordinator's distillation runs in this process

    with tempfile.TemporaryDirectory() as tmp:
        profiles = fleet_profiles(Path(tmp))
        fed_train = TrainConfig(epochs=2, batch_size=32, lr=args.fed_lr, threads=args.threads)
        reft_train = TrainConfig(epochs=args.reft_epochs, batch_size=32, threads=args.threads)
        opts = {"f_lambda": str(F_LAMBDA)}
        reft_opts = {**opts, **reft_options}
        runs = {
            "fedavg": run("fedavg", "fedavg", args.fedavg_rounds, profiles, Path(tmp), fed_train),
            "static-prune": run("static", "static-prune", args.static_rounds, profiles, Path(tmp), fed_train, opts),
            "reft": run("reft", "reft", 1, profiles, Path(tmp), reft_train, reft_opts),
        }
        if not args.no_device_eval:
            runs["reft-eval"] = run("reft-eval", "reft", 1, profiles, Path(tmp), reft_train,
                                    {**reft_opts, "device_eval": "true"})
        if args.reft_rounds > 1:
            runs["reft-iter"] = run("reft-iter", "reft", args.reft_rounds, profiles, Path(tmp), reft_train,
                                    {**reft_opts, "oneshot": "false"})
    summary = summarise(runs, figures["levels"]["cnn4"])
    figures["runs"] = summary
    if args.json:
        Path(args.json).write_text(json.dumps(figures, indent=2))
    return 0


def summarise(runs: dict[str, dict[str, Any]], levels: list[dict[str, Any]]) -> dict[str, Any]:
    fed = runs["fedavg"]
    fed_acc = [r["accuracy"]["global"] for r in fed["rounds"]]
    best = int(np.argmax(fed_acc))
    fed_bytes = per_round_device_bytes(fed)
    print(f"\n## FedAvg, dense {fed['config']['model']}, {len(fed_acc)} rounds x 2 local epochs (SGD lr {fed['config']['federation']['train']['lr']}), "
          "5 devices")
    print("accuracy per round: " + " ".join(f"{a:.3f}" for a in fed_acc))
    print(f"best {fed_acc[best]:.3f} at round {best} (of 0..{len(fed_acc) - 1}); "
          f"bytes per device until then {fed_bytes[best] / 1e6:.2f} MB")
    stat = runs["static-prune"]
    stat_label = next(iter(stat["models"]))
    stat_acc = [r["accuracy"][stat_label] for r in stat["rounds"]]
    stat_bytes = per_round_device_bytes(stat)
    print(f"\n## static pruning: every device at the weakest device's level ({stat_label}, "
          f"{stat['models'][stat_label]['params']:,} params), FedAvg, Adam lr 0.003")
    print("accuracy per round: " + " ".join(f"{a:.3f}" for a in stat_acc))
    print(f"best {max(stat_acc):.3f}; bytes per device over {len(stat_acc)} rounds {stat_bytes[-1] / 1e6:.2f} MB")

    reft = runs["reft"]
    reft_eval = runs.get("reft-eval")
    mc = reft["config"]["method_config"]
    global_acc = reft["final"]["accuracy"]["global"]
    print(f"\n## REFT one-shot ({reft['config']['federation']['train']['epochs']} local epochs, Adam lr "
          f"{mc['local_lr']}; distillation T={mc['temperature']}, {mc['distill_epochs']} epochs, Adam lr "
          f"{mc['distill_lr']}); pruning backend: {mc['pruning_backend']}")
    print(f"public set: {mc['public_samples']} unlabeled images held out of training (no device holds them), "
          f"{mc['public_bytes']:,} bytes as {mc['public_dtype']}, sent once per device")
    print(f"{'device':>8} {'GFLOPS':>7} {'level':>6} {'params':>8} {'down B':>9} {'up B':>7} {'total B':>9} "
          f"{'vs FedAvg':>9} {'device acc':>10}")
    eval_acc = reft_eval["final"]["accuracy"] if reft_eval else {}  # --no-device-eval: not measured
    totals = []
    for d in reft["devices"]:
        total = d["bytes_down"] + d["bytes_up"]
        totals.append(total)
        print(f"{d['id']:>8} {d['flops'] / 1e9:>7g} {d['assignment']:>6} {reft['models'][d['assignment']]['params']:>8,} "
              f"{d['bytes_down']:>9,} {d['bytes_up']:>7,} {total:>9,} {total / fed_bytes[best]:>8.3f}x "
              f"{eval_acc.get(d['assignment'], float('nan')):>10.3f}")
    mean_total = float(np.mean(totals))
    print(f"global (distilled, dense) accuracy {global_acc:.3f}  (device_eval run: "
          f"{eval_acc.get('global', float('nan')):.3f}); metrics {json.dumps({k: round(v, 4) for k, v in reft['rounds'][0]['metrics'].items()})}")

    iterative = runs.get("reft-iter")
    iter_summary: dict[str, Any] = {}
    if iterative is not None:
        it_acc = [r["accuracy"]["global"] for r in iterative["rounds"]]
        it_bytes = per_round_device_bytes(iterative)
        worst = max(d["bytes_down"] + d["bytes_up"] for d in iterative["devices"])
        print(f"\n## REFT with further rounds (oneshot=false, {len(it_acc)} rounds): the distilled model goes "
              "back pruned per device")
        print("global accuracy per round: " + " ".join(f"{a:.3f}" for a in it_acc))
        print("mean bytes per device after each round: " + " ".join(f"{b / 1e3:.0f} kB" for b in it_bytes)
              + f"; worst device {worst / 1e3:.0f} kB = 1/{fed_bytes[best] / worst:.1f} of FedAvg-to-best")
        iter_summary = {"accuracy": it_acc, "bytes_per_device": it_bytes, "worst_device_bytes": worst}

    p9 = next(r for r in levels if r["level"] == 0.9)
    p0 = next(r for r in levels if r["level"] == 0.0)
    checks = [
        ("p0.9 params <= 15 % of dense", p9["params"] / p0["params"] <= 0.15,
         f"{100 * p9['params'] / p0['params']:.1f} %"),
        ("p0.9 runs >= 1.5x faster (batch 1)", p9["speedup_b1"] >= 1.5, f"{p9['speedup_b1']:.2f}x"),
        ("p0.9 runs >= 1.5x faster (batch 64)", p9["speedup_b64"] >= 1.5, f"{p9['speedup_b64']:.2f}x"),
        ("REFT bytes per device <= 1/10 of FedAvg-to-best (mean device)", mean_total <= fed_bytes[best] / 10,
         f"{mean_total / 1e3:.0f} kB vs {fed_bytes[best] / 1e3:.0f} kB = 1/{fed_bytes[best] / mean_total:.1f}"),
        ("REFT bytes per device <= 1/10 of FedAvg-to-best (worst device)", max(totals) <= fed_bytes[best] / 10,
         f"{max(totals) / 1e3:.0f} kB = 1/{fed_bytes[best] / max(totals):.1f}"),
        ("REFT global accuracy >= FedAvg best - 3 points", global_acc >= fed_acc[best] - 0.03,
         f"{global_acc:.3f} vs {fed_acc[best]:.3f} ({100 * (global_acc - fed_acc[best]):+.1f} points)"),
    ]
    print("\n## targets")
    for what, ok, value in checks:
        print(f"{'MET    ' if ok else 'NOT MET'} {what}: {value}")
    print("\nwall seconds: " + ", ".join(f"{k} {v['wall_seconds']:.0f}" for k, v in runs.items()))
    return {"fedavg_accuracy": fed_acc, "fedavg_best_round": best, "fedavg_bytes_per_device": fed_bytes,
            "static_label": stat_label, "static_accuracy": stat_acc, "static_bytes_per_device": stat_bytes,
            "reft_global_accuracy": global_acc, "reft_device_accuracy": eval_acc,
            "reft_devices": reft["devices"], "reft_models": reft["models"], "reft_metrics": reft["rounds"][0]["metrics"],
            "reft_iterative": iter_summary,
            "checks": [{"target": w, "met": bool(ok), "value": v} for w, ok, v in checks],
            "wall_seconds": {k: v["wall_seconds"] for k, v in runs.items()}}


if __name__ == "__main__":
    sys.exit(main())
