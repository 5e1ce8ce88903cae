"""`edgefl simulate` and `edgefl coordinator` (registered as edgefl.commands entry points)."""

from __future__ import annotations

import argparse
from typing import Any

from edge_sdk.link import LinkConfig
from edge_sdk.training import TrainConfig

__all__ = ["simulate_command", "coordinator_command"]


def _round_printer(console: Any) -> Any:
    def show(record: Any) -> None:
        acc = " ".join(f"{k}={v:.3f}" for k, v in sorted(record.accuracy.items()))
        console.print(f"round {record.round}: acc {acc}  loss {record.loss:.3f}  "
                      f"down {record.bytes_down / 1e6:.2f} MB  up {record.bytes_up / 1e6:.2f} MB  "
                      f"{len(record.participants)} devices  {record.seconds:.1f} s simulated "
                      f"({record.host_seconds:.1f} s here)", soft_wrap=True)
    return show


def _options(pairs: list[str]) -> dict[str, str]:
    options = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key:
            raise ValueError(f"--option takes KEY=VALUE, got {pair!r}")
        options[key.strip()] = value.strip()
    return options


def _flag_options(args: argparse.Namespace) -> dict[str, str]:
    """`--option` pairs plus the dedicated method flags (fdnnc: --pattern, --upload, --big-fraction)."""
    options = _options(args.option)
    for key, value in (("pattern", args.pattern), ("upload", args.upload), ("big_fraction", args.big_fraction)):
        if value is None:
            continue
        if key in options and options[key] != str(value):
            raise ValueError(f"--{key.replace('_', '-')} {value} contradicts --option {key}={options[key]}")
        options[key] = str(value)
    return options


def _simulate(args: argparse.Namespace) -> int:
    from rich.console import Console

    from coordinator.simulate import DEFAULT_FLEET, SimulationConfig, run_simulation

    console = Console()
    config = SimulationConfig(
        method=args.method, clients=args.clients, rounds=args.rounds, dataset=args.dataset,
        data_root=args.data_root, partition=args.partition, seed=args.seed, out=args.out,
        broker_url=args.broker, model=args.model,
        profiles=tuple(args.profiles.split(",")) if args.profiles else DEFAULT_FLEET,
        throttle=args.throttle,
        train=TrainConfig(epochs=args.local_epochs, batch_size=args.batch_size, lr=args.lr),
        link=LinkConfig(transfer_dtype="float16" if args.fp16 else None),
        options=_flag_options(args), publish_every=args.publish_every,
    )
    console.print(f"[bold]edgefl simulate[/bold]: {config.method}, {config.clients} devices, "
                  f"{config.rounds} rounds, {config.dataset} ({config.partition})")
    with console.status("running federated rounds..."):
        report = run_simulation(config, on_round=_round_printer(console))
    final = report.to_dict()["final"]
    console.print(f"[green]done[/green]: final accuracy {final['accuracy']}, "
                  f"{final['bytes_down_total'] / 1e6:.1f} MB down, {final['bytes_up_total'] / 1e6:.1f} MB up; "
                  f"report in {config.out}/report.json")
    return 0


def simulate_command(sub: argparse._SubParsersAction) -> None:
    """Register `edgefl simulate`."""
    from coordinator.strategies import STRATEGIES

    p = sub.add_parser("simulate", help="run a whole federated job on this machine (embedded broker)")
    p.add_argument("--method", default="fedavg", choices=sorted(STRATEGIES))
    p.add_argument("--clients", type=int, default=4, help="number of simulated devices")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--dataset", default="mnist-sample",
                   help="mnist-sample (ships offline), digits, mnist, fashion-mnist, cifar10, npz:FILE")
    p.add_argument("--data-root", help="folder with MNIST idx files or CIFAR-10 binaries")
    p.add_argument("--partition", default="iid", help="iid | shards:K | dirichlet:ALPHA")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", default="runs/latest", help="where report.json, metrics.csv and plots go")
    p.add_argument("--broker", help="mqtt://host:port of an existing broker (default: embedded)")
    p.add_argument("--model", default="cnn4", help="model family: cnn4, resnet_small, mlp")
    p.add_argument("--profiles", help="comma-separated device profiles, taken in turn (default: a mixed fleet)")
    p.add_argument("--throttle", default="virtual", choices=["virtual", "sleep", "off"],
                   help="virtual: account profiled time; sleep: really slow devices down")
    p.add_argument("--local-epochs", type=int, default=2)
    p.add_argument("--batch-size", type=int, default=32)
    p.add_argument("--lr", type=float, default=0.05)
    p.add_argument("--fp16", action="store_true", help="send float tensors as float16")
    p.add_argument("--publish-every", type=int, default=0, metavar="N",
                   help="also send every device its ONNX model after every N rounds (default: after the last)")
    p.add_argument("--option", action="append", default=[], metavar="KEY=VALUE",
                   help="a method-specific setting (repeatable); see docs/methods.md")
    p.add_argument("--pattern", choices=["both", "bfirst", "switch"], help="fdnnc: training pattern")
    p.add_argument("--upload", choices=["full", "half"], help="fdnnc: small devices upload both factors or half")
    p.add_argument("--big-fraction", type=float, metavar="F",
                   help="fdnnc: the most capable round(F*N) devices are big (else FLOPS/RAM thresholds)")
    p.set_defaults(func=_simulate)


def _coordinator(args: argparse.Namespace) -> int:
    from rich.console import Console

    from coordinator.server import coordinator_config_from_toml, run_coordinator

    console = Console()
    config = coordinator_config_from_toml(args.config)
    console.print(f"coordinator for job {config.job!r} ({config.method}) on {config.transport.url}")
    run_coordinator(config, on_round=_round_printer(console))
    return 0


def coordinator_command(sub: argparse._SubParsersAction) -> None:
    """Register `edgefl coordinator`."""
    p = sub.add_parser("coordinator", help="serve a real fleet on an external broker (TOML config)")
    p.add_argument("--config", required=True, help="coordinator TOML file (see deploy/coordinator.toml)")
    p.set_defaults(func=_coordinator)
