"""`edgefl simulate` (an edgefl.commands entry point): a whole federated job on this machine."""

from __future__ import annotations

import argparse
from dataclasses import replace

from coordinator.cli import Display, at_least, lr_decay, momentum, non_negative_float, plural, positive_float
from edge_sdk.methods.settings.options import option_pairs
from coordinator.core.asynchronous import BUFFER_SIZE, MAX_STALENESS, STALENESS
from edge_sdk.cli import EXIT_INTERRUPTED, HelpFormatter, verbosity
from edge_sdk.stop_request import StopRequested
from edge_sdk.networking.link import LinkConfig
from edge_sdk.train_config import AUGMENTATIONS, LOSSES, TrainConfig, default_threads

__all__ = ["simulate_command"]


def _simulate(args: argparse.Namespace) -> int:
    if "help" in args.option:  # the method's settings, without importing torch
        from edge_sdk.methods.registry import find_method

        print(find_method(args.method).help())
        return 0

    from simulation.backends import devices_backend

    if devices_backend(args.backend, args.clients) == "process":
        from simulation.process_devices import start_fork_server

        start_fork_server()  # the devices' processes import torch while this one does
    from simulation.simulate import DEFAULT_FLEET, SimulationConfig, run_simulation, sim_federation
    from simulation.config import default_device_processes
    from coordinator.strategies import strategy_class
    from coordinator.core.federation import TrainingFailed
    from rich.markup import escape

    train, chosen_train = train_from_args(args)
    federation = sim_federation(
        rounds=args.rounds, seed=args.seed, devices_per_round=args.devices_per_round, eval_every=args.eval_every,
        eval_samples=args.eval_samples, lr_decay=args.lr_decay, publish_every=args.publish_every,
        checkpoint_dir=args.checkpoint_dir, eval_per_class=args.eval_per_class,
        train=train, asynchronous=args.asynchronous, concurrency=args.concurrency, buffer_size=args.buffer_size,
        max_staleness=args.max_staleness, staleness=args.staleness,
    )
    config = SimulationConfig(
        method=args.method, clients=args.clients, dataset=args.dataset, data_root=args.data_root,
        partition=args.partition, out=args.out, broker_url=args.broker,
        homeassistant=args.homeassistant, model=args.model,
        profiles=tuple(args.profiles.split(",")) if args.profiles else DEFAULT_FLEET,
        throttle=args.throttle, link=LinkConfig(transfer_dtype="float16" if args.fp16 else None),
        options=option_pairs(args.option), sim_device=args.sim_device,
        backend=args.backend, connections=args.connections, ray_address=args.ray_address, ray_workers=args.ray_workers,
        ray_cpus_per_worker=args.ray_cpus_per_worker, ray_actors_per_worker=args.ray_actors_per_worker,
        device_processes=args.device_processes or default_device_processes(),
        threads=args.threads or default_threads(), federation=federation, holdout=args.holdout,
        chosen=tuple(sorted({*chosen_train, *option_pairs(args.option)})),
        offline=args.offline, sim_deadline_s=args.sim_deadline,
    )
    display = Display(config.federation.rounds, strategy_class(config.method).describe_label)
    own_lr = strategy_class(config.method).own_lr(config.options)
    if own_lr is not None and args.lr is not None:
        display.console.print(f"[yellow]warning[/yellow]: --lr {args.lr:g} is not used: {config.method} trains with "
                              f"{escape(own_lr)}", soft_wrap=True)
    display.console.print(f"[bold]edgefl simulate[/bold]: {config.method}, {plural(config.clients, 'device')}, "
                          f"{plural(config.federation.rounds, 'round')}, {config.dataset} ({config.partition})"
                          + (f"; asynchronous: a round is a version of {config.federation.buffer_size} updates"
                             if config.federation.asynchronous else ""))
    try:
        with display.console.status("starting the broker and the devices...") as display.status:
            report = run_simulation(config, on_round=display.round, on_progress=display.progress,
                                    release_memory=False)  # the process ends with the job
    except KeyboardInterrupt as exc:
        rounds = config.federation.rounds
        how = "stopped (SIGTERM)" if isinstance(exc, StopRequested) else "interrupted"
        display.console.print(f"[yellow]{how}[/yellow] after {display.done} of {rounds} rounds; "
                              + (f"the report of those rounds is in {config.out}/report.json" if display.done
                                 else "no round finished, no report written")
                              + ("; run the same command again to resume" if config.federation.checkpoint_dir else ""),
                              soft_wrap=True)
        return 0 if isinstance(exc, StopRequested) else EXIT_INTERRUPTED
    except TrainingFailed as exc:
        display.console.print(f"[red]error[/red]: {escape(str(exc))}; the report of those rounds is in "
                              f"{config.out}/report.json", soft_wrap=True)
        return 2
    recipe = report.config.get("family_recipe")
    if recipe:  # settings the command line left to the model family (edge_sdk.family_recipe)
        display.console.print(f"{report.config['model']} trained with its family's settings: "
                              + ", ".join(f"{key}={value}" for key, value in recipe.items()), soft_wrap=True)
    display.final(report, config.out)
    return 0


#: ``edgefl simulate``'s local-training flags (their dest) and the `TrainConfig` field each sets
_TRAIN_FLAGS = {"local_epochs": "epochs", "batch_size": "batch_size", "lr": "lr", "momentum": "momentum",
                "weight_decay": "weight_decay", "augment": "augment", "loss": "loss"}


def train_from_args(args: argparse.Namespace) -> tuple[TrainConfig, set[str]]:
    """The devices' training of ``edgefl simulate``'s flags, and the fields the command line set: the
    others are the simulation's defaults (`SIMULATION.train`), or the model family's (`edge_sdk.family_recipe`)."""
    from simulation.defaults import SIMULATION

    chosen = {field: getattr(args, flag) for flag, field in _TRAIN_FLAGS.items() if getattr(args, flag) is not None}
    return replace(SIMULATION.train, **chosen), set(chosen)


def _recipe(key: str) -> str:
    """``; minirocket: 0.004`` where a model family's recipe sets ``key`` (`edge_sdk.family_recipe`)."""
    from edge_sdk.family_recipe import FAMILY_RECIPES

    return "".join(f"; {family}: {recipe.train[key]}" for family, recipe in FAMILY_RECIPES.items()
                   if key in recipe.train)


def _name_or_file(text: str, what: str, names: tuple[str, ...], *prefixes: str) -> str:
    """``text`` if it is one of ``names``, or one of ``prefixes`` + a file that exists; else a
    one-line argparse error naming the choices (checked before any work, before torch loads)."""
    from pathlib import Path

    for prefix in prefixes:
        if text.startswith(prefix):
            if not Path(text[len(prefix):]).expanduser().is_file():
                raise argparse.ArgumentTypeError(f"{text[len(prefix):]!r}: no such file")
            return text
    if text not in names:
        files = " or ".join(f"{prefix}FILE" for prefix in prefixes)
        raise argparse.ArgumentTypeError(f"unknown {what} {text!r}; choose from {', '.join(names)} or {files}")
    return text


def dataset_name(text: str) -> str:
    """``--dataset``: a known name, or ``npz:FILE`` / ``client:FILE`` (a client TOML's ``[data]``)
    naming a file that exists."""
    from edge_sdk.data.datasets import DATASETS

    return _name_or_file(text, "dataset", DATASETS, "npz:", "client:")


def model_family(text: str) -> str:
    """``--model``: ``auto``, a zoo family, or ``spec:FILE`` naming a file that exists."""
    from edge_sdk.model_names import AUTO, MODEL_FAMILY_NAMES

    return _name_or_file(text, "model family", (AUTO, *MODEL_FAMILY_NAMES), "spec:")


def simulate_command(sub: argparse._SubParsersAction) -> None:
    """Register `edgefl simulate`."""
    from edge_sdk.methods.registry import METHODS
    from simulation.defaults import SIMULATION
    from simulation.backends import BACKENDS, LOCAL_BACKEND_UP_TO
    from simulation.shared_connection import CONNECTIONS, OWN_CONNECTIONS_UP_TO

    p = sub.add_parser("simulate", help="run a whole federated job on this machine (embedded broker)",
                       formatter_class=HelpFormatter,
                       description="A whole federated job on this machine: a broker, a coordinator and N "
                                   "simulated devices, each with its own MQTT topics (and connection: "
                                   "--connections), device profile and private shard of a real dataset.")
    verbosity(p)
    p.add_argument("--method", default=SIMULATION.method, choices=sorted(METHODS), help="federated method")
    p.add_argument("--clients", type=at_least(1), default=SIMULATION.clients, help="number of simulated devices")
    p.add_argument("--rounds", type=at_least(1), default=SIMULATION.rounds, help="federated rounds")
    p.add_argument("--dataset", type=dataset_name, default=SIMULATION.dataset,
                   help="mnist-sample (ships offline), digits, mnist, fashion-mnist, cifar10, npz:FILE; sensor "
                        "series (the sensors extra): plaid, acsf1, basicmotions; client:FILE: the [data] of a "
                        "device's client TOML (its held-out side is the test set)")
    p.add_argument("--data-root", help="folder with MNIST/Fashion-MNIST idx files or CIFAR-10 binaries")
    p.add_argument("--partition", default=SIMULATION.partition,
                   help="how data is split over devices: iid | shards:K (K classes per device) | dirichlet:ALPHA")
    p.add_argument("--devices-per-round", type=at_least(1), metavar="K",
                   help="sample K of the devices each round, as the papers do (default: every device)")
    p.add_argument("--eval-every", type=at_least(1), default=SIMULATION.eval_every, metavar="N",
                   help="evaluate on the test set after every N rounds; the last round always")
    p.add_argument("--eval-samples", type=at_least(1), metavar="N",
                   help="interim evaluations on a fixed stratified N of the held-out samples (default: all); "
                        "the last round always evaluates on all of them")
    p.add_argument("--holdout", type=float, default=SIMULATION.holdout, metavar="F",
                   help="each device holds out F of its data (0 < F <= 0.9) and the devices evaluate every evaluated "
                        "round's model on it (federated evaluation), reported beside the test set's accuracy "
                        "(default 0: no federated evaluation)")
    p.add_argument("--eval-per-class", action="store_true",
                   help="with --holdout, devices also report their held-out counts per class")
    p.add_argument("--sim-device", default=SIMULATION.sim_device, metavar="DEVICE",
                   help="where simulated devices train and the coordinator evaluates: cpu, cuda, cuda:N or auto; "
                        "the devices' profiled speed is still what the report's seconds count")
    p.add_argument("--threads", type=at_least(1), metavar="N",
                   help=f"torch threads of the simulated devices' training (one device at a time) and of the "
                        f"evaluation (default: half of this machine's CPUs, here {default_threads()}). All the "
                        f"cores are fastest on an idle machine, but were 1.7-4x slower than half of them while "
                        f"other programs kept the cores busy; with OMP_WAIT_POLICY=PASSIVE in the environment "
                        f"all of them stayed fast (BENCHMARKS.md). A seeded job repeats itself with the same "
                        f"--threads only")
    p.add_argument("--backend", default=SIMULATION.backend, choices=list(BACKENDS),
                   help=f"local: every simulated device in this process; process: all of them in one child "
                        f"process beside the coordinator's (two cores); ray: spread over Ray actors "
                        f"(pip install 'edgefl[ray]'), each a process hosting many devices; auto: local up to "
                        f"{LOCAL_BACKEND_UP_TO:,} devices, process past that")
    p.add_argument("--connections", default=SIMULATION.connections, choices=list(CONNECTIONS),
                   help=f"own: every simulated device has an MQTT connection of its own; shared: the devices of a "
                        f"process share one (the same messages on the same topics; presence kept by the host, "
                        f"docs/simulation.md); auto: own up to {OWN_CONNECTIONS_UP_TO:,} devices, shared past that")
    p.add_argument("--device-processes", type=at_least(1), default=None, metavar="N",
                   help="with the process backend: N child processes host the devices, each training one at a "
                        "time (default: 2 on a machine with two CPUs or more, else 1; docs/simulation.md)")
    p.add_argument("--ray-address", metavar="HOST:PORT",
                   help="join this running Ray cluster (default: start one on this machine); devices on "
                        "other machines need a --broker they can reach")
    p.add_argument("--ray-workers", type=at_least(1), metavar="N",
                   help="devices training at once (default: one per CPU of the cluster, at most --clients)")
    p.add_argument("--ray-cpus-per-worker", type=positive_float, default=SIMULATION.ray_cpus_per_worker, metavar="CPUS",
                   help="CPUs (torch threads) of each training")
    p.add_argument("--ray-actors-per-worker", type=at_least(1), default=SIMULATION.ray_actors_per_worker, metavar="K",
                   help="Ray actor processes per worker, each hosting some devices; a worker trains whichever "
                        "actor's device is next, so a round is not held up by one actor's share of it")
    p.add_argument("--seed", type=int, default=SIMULATION.seed,
                   help="seed of the data split, sampling and initial model")
    p.add_argument("--out", default=SIMULATION.out, help="where report.json, metrics.csv and plots go")
    p.add_argument("--broker", help="mqtt://host:port of an existing broker (default: an embedded one)")
    p.add_argument("--homeassistant", metavar="PREFIX", nargs="?", const="homeassistant",
                   help="publish the job and its devices to Home Assistant by MQTT discovery under PREFIX "
                        "(default homeassistant) on --broker (docs/homeassistant.md); off by default")
    p.add_argument("--model", type=model_family, default=SIMULATION.model,
                   help="model family: auto (default: minirocket for sensor series with fedavg/fedprox/heterofl, else "
                        "cnn1d; cnn4 for images), cnn4, flanc_cnn (the FLANC paper's Fashion-MNIST CNN), resnet_small, "
                        "mlp, minirocket, cnn1d (sensor series); "
                        "or spec:FILE, your own network as a JSON/TOML spec (fedavg, fedprox, reft, static-prune)")
    p.add_argument("--profiles", help="comma-separated device profiles (names in profiles/ or .toml/.json "
                                      "files), taken in turn (default: a mixed home fleet)")
    p.add_argument("--throttle", default=SIMULATION.throttle, choices=["virtual", "sleep", "off"],
                   help="virtual: report the profiled devices' time; sleep: also really run that slowly; "
                        "off: report this machine's time")
    p.add_argument("--local-epochs", type=at_least(1), default=None,
                   help=f"local epochs per round (default: {SIMULATION.train.epochs})")
    p.add_argument("--batch-size", type=at_least(1), default=None,
                   help=f"local batch size (default: {SIMULATION.train.batch_size})")
    p.add_argument("--lr", type=positive_float, default=None,
                   help=f"local SGD learning rate (default: {SIMULATION.train.lr:g}{_recipe('lr')})")
    p.add_argument("--momentum", type=momentum, default=None,
                   help=f"local SGD momentum, a fresh buffer every round (default: {SIMULATION.train.momentum:g}"
                        f"{_recipe('momentum')})")
    p.add_argument("--lr-decay", type=lr_decay, default=(), metavar="ROUND:FACTOR[,...]",
                   help="step decay: after ROUND rounds the lr is multiplied by FACTOR (e.g. 100:0.1)")
    p.add_argument("--weight-decay", type=non_negative_float, default=None,
                   help=f"local SGD weight decay, L2 (default: {SIMULATION.train.weight_decay:g})")
    p.add_argument("--augment", default=None, choices=list(AUGMENTATIONS),
                   help=f"local data augmentation: hflip mirrors a random half of every batch (default: "
                        f"{SIMULATION.train.augment})")
    p.add_argument("--loss", default=None, choices=list(LOSSES),
                   help=f"the training loss: cross_entropy, or squared (a ridge classifier's, on ±1 targets: "
                        f"MiniRocket's linear head; default: {SIMULATION.train.loss}{_recipe('loss')})")
    p.add_argument("--fp16", action="store_true", help="send float tensors as float16")
    p.add_argument("--checkpoint-dir", metavar="DIR",
                   help="save the job's state there after every round; the same command again resumes after "
                        "the last finished round (it may raise --rounds)")
    p.add_argument("--publish-every", type=at_least(0), default=SIMULATION.publish_every, metavar="N",
                   help="also send every device its ONNX model after every N rounds (0: after the last only)")
    p.add_argument("--async", dest="asynchronous", action="store_true",
                   help="buffered asynchronous aggregation (FedBuff): no round barrier, the model steps every "
                        "--buffer-size updates; --rounds counts versions (docs/asynchronous.md)")
    p.add_argument("--concurrency", type=at_least(1), default=None, metavar="N",
                   help="with --async: devices training at once (default: every device)")
    p.add_argument("--buffer-size", type=at_least(1), default=BUFFER_SIZE, metavar="K",
                   help="with --async: updates a version folds")
    p.add_argument("--max-staleness", type=at_least(0), default=MAX_STALENESS, metavar="S",
                   help="with --async: refuse updates more than S versions old")
    p.add_argument("--staleness", default=STALENESS, metavar="RULE",
                   help="with --async: a stale update's weight: sqrt (1/sqrt(1+s), default), poly:A ((1+s)^-A) "
                        "or constant")
    p.add_argument("--offline", metavar="SHARE[:ONLINE[:PERIOD_S]]|profiles",
                   help="that share of the devices is online only ONLINE of every PERIOD_S simulated seconds "
                        "(default ONLINE 0.5, PERIOD_S 3600): a phone away part of the day; 'profiles': each "
                        "device as its profile's [availability] says (android-midrange: half of every day)")
    p.add_argument("--sim-deadline", type=positive_float, default=None, metavar="SECONDS",
                   help="a synchronous round's deadline in simulated seconds: later updates are dropped")
    p.add_argument("--option", action="append", default=[], metavar="KEY=VALUE",
                   help="a method-specific setting (repeatable); --option help lists the method's with their "
                        "defaults; docs/methods/METHOD.md explains them (lowrank, pfedpara: fedpara.md)")
    p.set_defaults(func=_simulate)
