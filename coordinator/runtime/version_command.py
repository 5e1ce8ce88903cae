"""``edgefl coordinator --versions`` and ``--rollback VERSION``: a job's kept model versions
(`coordinator.runtime.kept_versions`), listed, and one asked to be served again."""

from __future__ import annotations

import time
from pathlib import Path

from rich.console import Console
from rich.table import Table

from coordinator.runtime.coordinator_command import CoordinatorConfig
from coordinator.runtime.kept_versions import kept_versions, request_rollback
from coordinator.runtime.state import load_checkpoint

__all__ = ["show_versions", "rollback"]


def _checkpoint_dir(config: CoordinatorConfig) -> Path:
    if config.federation.checkpoint_dir is None:
        raise ValueError("no [federation] checkpoint_dir in the config: versions are kept beside the checkpoint")
    return Path(config.federation.checkpoint_dir)


def _figures(figures: dict[str, float]) -> str:
    return ", ".join(f"{label} {value:.3f}" for label, value in sorted(figures.items())) or "not evaluated"


def show_versions(config: CoordinatorConfig, console: Console | None = None) -> int:
    """Print the kept versions of the config's job; returns the exit status (0)."""
    console = console or Console()
    directory = _checkpoint_dir(config)
    kept = kept_versions(directory)
    if not kept:
        console.print(f"no kept versions in {directory} ([federation] keep_versions = "
                      f"{config.federation.keep_versions}; a version is kept when it is published)", soft_wrap=True)
        return 0
    table = Table(title=f"job {config.job!r}: kept versions in {directory}")
    for column in ("version", "round", "published", "accuracy", "models"):
        table.add_column(column)
    for v in kept:
        table.add_row(str(v.version), str(v.round), time.strftime("%Y-%m-%d %H:%M", time.localtime(v.published_at)),
                      _figures(v.figures), ", ".join(v.labels) or "none")
    console.print(table)
    return 0


def rollback(config: CoordinatorConfig, version: int, console: Console | None = None) -> int:
    """Ask for ``version`` to be served again (ValueError, one line, when it cannot be)."""
    console = console or Console()
    directory = _checkpoint_dir(config)
    checkpoint = load_checkpoint(directory)
    if checkpoint is not None and checkpoint.round + 1 >= config.federation.rounds:
        raise ValueError(f"job {config.job!r} finished its {config.federation.rounds} rounds: no coordinator will "
                         f"publish a rollback (the kept ONNX models are in {directory / 'versions'})")
    kept = request_rollback(directory, version)
    console.print(f"asked for version {kept.version} (round {kept.round}, {_figures(kept.figures)}): the running "
                  f"coordinator publishes it before its next round, or at its next start", soft_wrap=True)
    return 0
