"""`edgefl coordinator` (an edgefl.commands entry point), and what the command-line jobs share: argument
types, the live display."""

from __future__ import annotations

import argparse
import time
from typing import Any, Callable

from edge_sdk.cli import EXIT_INTERRUPTED, HelpFormatter, verbosity
from edge_sdk.stop_request import StopRequested

__all__ = ["coordinator_command", "Display", "plural", "size", "at_least", "positive_float",
           "non_negative_float", "momentum", "lr_decay"]


def at_least(low: int) -> Callable[[str], int]:
    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected an integer, got {text!r}") from None
        if value < low:
            raise argparse.ArgumentTypeError(f"must be >= {low}, got {value}")
        return value
    parse.__name__ = f"integer >= {low}"
    return parse


def _finite_float(zero_ok: bool) -> Callable[[str], float]:
    """An argparse type: a finite number > 0 (``>= 0`` with ``zero_ok``)."""
    def parse(text: str) -> float:
        try:
            value = float(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected a number, got {text!r}") from None
        if not (value >= 0 if zero_ok else value > 0) or not value < float("inf"):
            raise argparse.ArgumentTypeError(f"must be a finite number {'>=' if zero_ok else '>'} 0, got {text}")
        return value
    return parse


positive_float = _finite_float(zero_ok=False)
non_negative_float = _finite_float(zero_ok=True)


def momentum(text: str) -> float:
    value = non_negative_float(text)
    if value > 0.999:
        raise argparse.ArgumentTypeError(f"must be in [0, 0.999], got {text}")
    return value


def lr_decay(text: str) -> tuple[tuple[int, float], ...]:
    from coordinator.core.lr_schedule import parse_lr_decay

    try:
        return parse_lr_decay(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc).removeprefix("lr_decay: ")) from None


def size(nbytes: float) -> str:
    """``1.2 MB``, ``340 kB``, ``512 B``."""
    for unit, scale in (("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if nbytes >= scale:
            return f"{nbytes / scale:.{1 if nbytes < 10 * scale else 0}f} {unit}"
    return f"{int(nbytes)} B"


def _accuracies(accuracy: dict[str, float], describe: Callable[[str], str]) -> str:
    return ", ".join(f"{describe(k)} {v:.3f}" for k, v in sorted(accuracy.items()))


def federated_figures(accuracy: dict[str, float], evaluation: dict[str, Any], describe: Callable[[str], str]) -> str:
    """Each label's federated accuracy with its 95 % interval, or "not enough held-out data"
    (fewer than ``min_eval_samples``), then the samples and devices they rest on."""
    from coordinator.aggregate.evaluation import NOT_ENOUGH

    figures = evaluation.get("by_label") or {}
    parts = []
    for label, value in sorted(accuracy.items()):
        figure = figures.get(label)
        if figure is None:
            parts.append(f"{describe(label)} {value:.3f}")
        elif not figure["enough"]:
            parts.append(f"{describe(label)}: {NOT_ENOUGH} ({plural(figure['samples'], 'sample')}, at least "
                         f"{evaluation.get('min_samples')})")
        else:
            parts.append(f"{describe(label)} {value:.3f} [{figure['low']:.3f}, {figure['high']:.3f}]")
    samples, devices = evaluation.get("samples", 0), evaluation.get("devices", 0)
    return (f"{', '.join(parts)} ({plural(samples, 'held-out sample')} on {plural(devices, 'device')}"
            f"{'; 95% intervals over the pooled samples' if any(f['enough'] for f in figures.values()) else ''})")


class Display:
    """What a person sees of a job: one line per round and a live status line while it runs."""

    def __init__(self, rounds: int, describe: Callable[[str], str]) -> None:
        from rich.console import Console

        self.console = Console()
        self.rounds = rounds
        self.describe = describe
        self.done = 0  # rounds finished in this run
        self.status: Any = None  # rich Status while the job runs
        self._round_started = time.monotonic()

    def round(self, record: Any) -> None:
        self.done += 1
        self._round_started = time.monotonic()
        parts = []
        if record.accuracy:
            parts.append(f"accuracy {_accuracies(record.accuracy, self.describe)}  loss {record.loss:.3f}")
        if record.federated_accuracy:
            parts.append(f"federated {federated_figures(record.federated_accuracy, record.evaluation, self.describe)}")
        elif record.evaluation.get("asked"):
            parts.append(f"no federated evaluation ({record.evaluation.get('no_evaluation', 0)} devices had no "
                         f"held-out data, {record.evaluation.get('missing', 0)} did not answer)")
        evaluated = "  ".join(parts) or "not evaluated"
        self.console.print(
            f"round {self._of(record.round + 1)}: {evaluated}"
            f"  {len(record.participants)} devices  down {size(record.bytes_down)}"
            f"  up {size(record.bytes_up)}  {record.seconds:.1f} s on the devices ({record.host_seconds:.1f} s here)",
            soft_wrap=True)

    def _of(self, rnd: int) -> str:
        """``3/10``; ``3`` in a job that keeps serving without a cap."""
        from coordinator.core.federation import NO_ROUND_CAP

        return str(rnd) if self.rounds >= NO_ROUND_CAP else f"{rnd}/{self.rounds}"

    def progress(self, p: Any) -> None:
        if self.status is None:
            return
        if p.round < 0:
            text = f"waiting for devices: {p.done}/{p.total} registered ({p.elapsed_s:.0f} s)"
        else:
            doing = "evaluating: " if getattr(p, "collecting", "update") == "evaluation" else ""
            text = (f"round {self._of(p.round + 1)}: {doing}{p.done}/{p.total} devices reported, "
                    f"{size(p.bytes_up)} received, {p.elapsed_s:.0f} s")
        self.status.update(text)

    def final(self, report: Any, out: str) -> None:
        data = report.to_dict()
        final = data["final"]
        accuracy = []
        if final["accuracy"]:
            accuracy.append(f"accuracy {_accuracies(final['accuracy'], self.describe)}")
        if final["federated_accuracy"]:
            figures = federated_figures(final["federated_accuracy"], final["federated_evaluation"], self.describe)
            accuracy.append(f"federated accuracy {figures}")
        self.console.print(
            f"[green]done[/green] after {plural(len(report.rounds), 'round')}: "
            f"{', '.join(accuracy) or 'not evaluated'}; {size(final['bytes_down_total'])} down, "
            f"{size(final['bytes_up_total'])} up, {final['seconds_total']:.0f} s on the devices; "
            f"report in {out}/report.json", soft_wrap=True)


def plural(count: int, noun: str) -> str:
    """``1 round``, ``3 rounds``."""
    return f"{count} {noun}{'' if count == 1 else 's'}"


def _coordinator(args: argparse.Namespace) -> int:
    from coordinator.runtime.coordinator_command import coordinator_config_from_toml, run_coordinator
    from coordinator.strategies import strategy_class

    config = coordinator_config_from_toml(args.config)
    if args.versions or args.rollback is not None:
        from coordinator.runtime.version_command import rollback, show_versions

        return show_versions(config) if args.versions else rollback(config, args.rollback)
    display = Display(config.federation.rounds, strategy_class(config.method).describe_label)
    rounds = (f"a round per {config.federation.min_new_samples} new samples" if config.federation.min_new_samples
              else plural(config.federation.rounds, "round"))
    display.console.print(f"coordinator for job {config.job!r} ({config.method}, {rounds}) on {config.transport.url}",
                          soft_wrap=True)
    try:
        with display.console.status("connecting to the broker...") as display.status:
            report = run_coordinator(config, on_round=display.round, on_progress=display.progress)
    except KeyboardInterrupt as exc:
        resume = ("run the same command again to resume from the checkpoint" if config.federation.checkpoint_dir
                  else "set [federation] checkpoint_dir to be able to resume a job")
        how = "stopped (SIGTERM)" if isinstance(exc, StopRequested) else "interrupted"
        display.console.print(f"[yellow]{how}[/yellow] after {plural(display.done, 'round')} in this run; "
                              + (f"report in {config.out}/report.json; " if display.done else "") + resume,
                              soft_wrap=True)
        return 0 if isinstance(exc, StopRequested) else EXIT_INTERRUPTED
    if report is None:
        display.console.print(f"job {config.job!r} already finished its {plural(config.federation.rounds, 'round')} "
                              f"(checkpoint in {config.federation.checkpoint_dir}); its report is in "
                              f"{config.out}/report.json. Use a new job name or checkpoint_dir for a new job.",
                              soft_wrap=True)
        return 0
    display.final(report, config.out)
    return 0


def coordinator_command(sub: argparse._SubParsersAction) -> None:
    """Register `edgefl coordinator`."""
    p = sub.add_parser("coordinator", help="serve a real fleet on an external broker (TOML config)",
                       formatter_class=HelpFormatter)
    verbosity(p)
    p.add_argument("--config", required=True, help="coordinator TOML file (see deploy/coordinator.toml)")
    kept = p.add_mutually_exclusive_group()
    kept.add_argument("--versions", action="store_true",
                      help="list the job's kept model versions ([federation] keep_versions) and exit")
    kept.add_argument("--rollback", type=at_least(1), metavar="VERSION",
                      help="serve this kept version again: the running (or next) coordinator publishes it "
                           "and trains on from it")
    p.set_defaults(func=_coordinator)
