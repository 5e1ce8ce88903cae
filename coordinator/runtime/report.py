"""What a federated run produced: report.json, metrics.csv and plots."""

from __future__ import annotations

import json
import logging
import threading
import time
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable

from coordinator.runtime.safe_files import write_atomically
from coordinator.runtime.metrics_file import MetricsFile

if TYPE_CHECKING:
    from coordinator.runtime.fleet import Fleet

__all__ = ["KEEP_ROUNDS", "RoundRecord", "RunReport", "merge_stages", "keep_previous_report"]

#: the rounds a report keeps in memory, in report.json and in the checkpoint: the latest (every
#: round goes to metrics.csv and history.jsonl, appended)
KEEP_ROUNDS = 1000

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class RoundRecord:
    """One round's outcome. `seconds` is simulated wall-clock on the profiled devices;
    `accuracy` is empty and `loss` None in a round that was not evaluated (`eval_every`).
    ``round`` is the 0-based index the protocol uses; what a person reads (the console, logs,
    report.json's and metrics.csv's ``round``, plots) counts from 1, and the files name the index
    ``round_index``."""

    round: int
    accuracy: dict[str, float]
    loss: float | None
    bytes_down: int
    bytes_up: int
    seconds: float
    host_seconds: float
    participants: list[str]
    aggregated: bool
    metrics: dict[str, float] = field(default_factory=dict)
    #: federated evaluation (`FederationConfig.federated_eval`): per model label, the devices'
    #: held-out accuracy summed sample-weighted; empty when no device evaluated
    federated_accuracy: dict[str, float] = field(default_factory=dict)
    federated_loss: float | None = None
    #: its details: samples, devices, asked, no_evaluation, missing, accuracy_all, host_seconds, per_class
    evaluation: dict[str, Any] = field(default_factory=dict)
    #: the model version after this round: how many rounds aggregated so far (docs/continuous.md)
    version: int = 0
    #: the version devices serve after this round (0: none published yet; a fixed-rounds job
    #: publishes after its last round)
    published_version: int = 0


def _weight(evaluation: dict[str, Any]) -> dict[str, Any]:
    """What report.json's ``final`` says a federated figure rests on."""
    keys = ("by_label", "samples", "devices", "interval", "min_samples", "enough")
    return {k: evaluation[k] for k in keys if k in evaluation}


def _enough(record: RoundRecord, label: str) -> bool:
    """Whether ``record``'s federated figure of ``label`` rests on enough held-out samples to show."""
    figure = (record.evaluation.get("by_label") or {}).get(label)
    return figure is None or bool(figure["enough"])


def merge_stages(records: list[RoundRecord]) -> RoundRecord:
    """One round's record from its sequential stages: bytes, seconds and participants add
    up, metrics named ``up_*`` or ``n_*`` are summed, the rest (accuracy too) is the last stage's."""
    if len(records) == 1:
        return records[0]
    metrics: dict[str, float] = {}
    for record in records:
        for key, value in record.metrics.items():
            additive = key.startswith(("up_", "n_"))
            metrics[key] = metrics.get(key, 0.0) + value if additive else value
    last = records[-1]
    return replace(last, bytes_down=sum(r.bytes_down for r in records), bytes_up=sum(r.bytes_up for r in records),
                   seconds=sum(r.seconds for r in records), host_seconds=sum(r.host_seconds for r in records),
                   participants=sorted({p for r in records for p in r.participants}),
                   aggregated=any(r.aggregated for r in records), metrics=metrics)


@dataclass
class RunReport:
    """The report of one job; `to_dict` is the schema of report.json."""

    method: str
    config: dict[str, Any]
    rounds: list[RoundRecord] = field(default_factory=list)
    devices: list[dict[str, Any]] = field(default_factory=list)
    models: dict[str, dict[str, int]] = field(default_factory=dict)
    rejections: list[dict[str, str]] = field(default_factory=list)  # the latest 10,000
    rejection_count: int = 0
    #: "finished", "interrupted" (Ctrl-C, SIGTERM or an error: `rounds` holds the rounds finished
    #: before), or "running" in the report.json a coordinator writes after every round
    status: str = "finished"
    #: whether the coordinator can write what it keeps (`coordinator.core.health`); None: not watched
    health: dict[str, Any] | None = None
    #: the model version devices serve at the end (a fixed-rounds job: its last; 0: none published)
    published_version: int = 0
    #: rounds in all (``rounds`` keeps the latest `KEEP_ROUNDS`; history.jsonl has every one)
    rounds_total: int = 0
    #: bytes and seconds over every round, ``rounds`` trimmed or not
    totals: dict[str, float] = field(default_factory=lambda: {"bytes_down": 0, "bytes_up": 0, "seconds": 0.0})
    #: each recent round's plain dict, made once (`rounds_as_dicts`)
    _dicts: dict[int, tuple[RoundRecord, dict[str, Any]]] = field(default_factory=dict, repr=False, compare=False)
    #: restored from a checkpoint (`restore_rounds`): metrics.csv is continued, not started afresh
    _resumed: bool = field(default=False, repr=False, compare=False)
    #: metrics.csv as it is appended (`write`)
    _metrics: MetricsFile | None = field(default=None, repr=False, compare=False)
    #: the plots' imports, on a thread while the job winds down (`prepare_plots`)
    _plots_import: threading.Thread | None = field(default=None, repr=False, compare=False)

    def prepare_plots(self) -> None:
        """Import what the plots need (matplotlib: 0.5 to 1 s) on a thread while the job winds down
        (its devices stop); `write_outcome` waits for it."""
        if self._plots_import is None:
            self._plots_import = threading.Thread(target=_warm_import_pyplot, name="edgefl-plots-import", daemon=True)
            self._plots_import.start()

    def add_round(self, record: RoundRecord) -> None:
        """One more round: counted in the totals; only the latest `KEEP_ROUNDS` stay in memory."""
        self.rounds.append(record)
        self.rounds_total += 1
        for key in ("bytes_down", "bytes_up", "seconds"):
            self.totals[key] += getattr(record, key)
        if len(self.rounds) > KEEP_ROUNDS + KEEP_ROUNDS // 10:  # trimmed in batches: amortised O(1) a round
            del self.rounds[:len(self.rounds) - KEEP_ROUNDS]

    def recent(self) -> list[RoundRecord]:
        """The latest `KEEP_ROUNDS` rounds (report.json's and the checkpoint's)."""
        return self.rounds[-KEEP_ROUNDS:]

    def rounds_as_dicts(self) -> list[dict[str, Any]]:
        """`recent` as plain data; a round's dict is made once (records are frozen)."""
        cache = self._dicts
        out = []
        for record in self.recent():
            made = cache.get(id(record))
            if made is None or made[0] is not record:
                made = cache[id(record)] = (record, asdict(record))
            out.append(made[1])
        if len(cache) > 2 * KEEP_ROUNDS:
            keep = {id(r) for r in self.recent()}
            self._dicts = {k: v for k, v in cache.items() if k in keep}
        return out

    def restore_rounds(self, rounds: list[dict[str, Any]], total: int | None = None,
                       totals: dict[str, float] | None = None) -> None:
        """The rounds a checkpoint kept, and the count and totals of all (None: those rounds' own)."""
        self.rounds = [RoundRecord(**r) for r in rounds]
        self._resumed = True  # its metrics.csv goes on after the rows already there
        self.rounds_total = total if total is not None else len(self.rounds)
        self.totals = dict(totals) if totals else {k: sum(getattr(r, k) for r in self.rounds)
                                                   for k in ("bytes_down", "bytes_up", "seconds")}

    def finish(self, fleet: "Fleet", params: dict[str, int], payload_bytes: dict[str, int]) -> None:
        """Fill devices, models and rejections from the fleet at the end of a run."""
        self.devices = [
            {"id": d.device_id, "profile": d.profile.name, "flops": d.profile.gflops * 1e9,
             "measured": d.profile.measured, "assignment": d.label, "trained_samples": d.num_samples,
             "bytes_down": d.bytes_down,
             "bytes_up": d.bytes_up, **(_last_evaluation(d.last_evaluation) if d.last_evaluation else {})}
            for d in sorted(fleet.devices.values(), key=lambda d: d.device_id)
        ]
        self.models = {label: {"params": int(params[label]), "payload_bytes": int(payload_bytes.get(label, 0))}
                       for label in params}
        self.rejections = [{"device": d, "code": c, "message": m} for d, c, m in fleet.rejections]
        self.rejection_count = fleet.rejection_count

    def last_evaluated(self) -> RoundRecord | None:
        """The latest round that was evaluated (the last one, unless the job was interrupted)."""
        return next((r for r in reversed(self.rounds) if r.accuracy or r.federated_accuracy), None)

    def set_health(self, health: dict[str, Any]) -> None:
        """What `coordinator.core.health.Health` says (report.json's ``health``)."""
        self.health = dict(health)

    def to_dict(self) -> dict[str, Any]:
        last = self.last_evaluated()
        return {
            "method": self.method,
            "status": self.status,
            **({"health": self.health} if self.health is not None else {}),
            "config": self.config,
            "devices": self.devices,
            "rounds_total": self.rounds_total,
            "rounds": [{"round": r["round"] + 1, "round_index": r["round"],
                        **{k: v for k, v in r.items() if k != "round"}} for r in self.rounds_as_dicts()],
            "models": self.models,
            "rejections": self.rejections,
            "rejection_count": self.rejection_count,
            "final": {
                "accuracy": dict(last.accuracy) if last else {},
                "federated_accuracy": dict(last.federated_accuracy) if last else {},
                "federated_evaluation": _weight(last.evaluation) if last else {},
                "evaluated_round": last.round + 1 if last else None,
                "version": self.rounds[-1].version if self.rounds else 0,
                "published_version": max(self.published_version,
                                         self.rounds[-1].published_version if self.rounds else 0),
                "bytes_down_total": self.totals["bytes_down"],
                "bytes_up_total": self.totals["bytes_up"],
                "seconds_total": self.totals["seconds"],
            },
        }

    def write_outcome(self, out: Path, finished: bool, plots: bool = True,
                      describe: Callable[[str], str] = str) -> None:
        """At the end of a run, however it ended: write the report when the job finished or
        finished at least one round (marked "interrupted" if it did not finish); else nothing."""
        self.status = "finished" if finished else "interrupted"
        try:
            if finished or self.rounds:
                self.write(out, plots=plots, describe=describe)
        finally:  # never exit halfway through an import
            if self._plots_import is not None:
                self._plots_import.join()

    def write(self, out: Path, plots: bool = True, describe: Callable[[str], str] = str) -> None:
        """Write report.json, metrics.csv and (optionally) PNG plots into `out`; ``describe``
        names a model label in the plots' legends (e.g. ``0.25`` -> ``width 0.25``)."""
        out.mkdir(parents=True, exist_ok=True)
        write_atomically(out / "report.json", report_json(self.to_dict()))
        self.append_metrics(out)
        labels = sorted({k for r in self.rounds for k in r.accuracy})
        federated = sorted({k for r in self.rounds for k in r.federated_accuracy})
        if plots and self.rounds:
            self._plot(out, labels, federated, describe)

    def append_metrics(self, out: Path) -> None:
        """Append the rounds not yet in ``out``/metrics.csv (a first call in ``out`` starts it afresh)."""
        if self._metrics is None or self._metrics.path != out / "metrics.csv":
            self._metrics = MetricsFile(out / "metrics.csv", continue_existing=self._resumed)
        self._metrics.append(self.rounds, complete=len(self.rounds) == self.rounds_total)

    def _plot(self, out: Path, labels: list[str], federated: list[str], describe: Callable[[str], str]) -> None:
        if self._plots_import is not None:
            self._plots_import.join()
        plt = _import_pyplot()
        from matplotlib.ticker import MaxNLocator

        rounds = [r.round + 1 for r in self.rounds]  # counted from 1, as the console prints them
        fig, ax = plt.subplots(figsize=(6, 4))
        # central accuracy solid; federated (the devices' held-out data) dashed in the same colour
        colours: dict[str, Any] = {}
        for kind, names in (("accuracy", labels), ("federated_accuracy", federated)):
            for label in names:
                federated_kind = kind == "federated_accuracy"
                points = [(r.round + 1, getattr(r, kind)[label]) for r in self.rounds
                          if label in getattr(r, kind) and (not federated_kind or _enough(r, label))]
                if not points:
                    continue
                name = describe(label) + (" (federated)" if federated_kind and labels else "")
                # markers on short runs, so that even one round shows as a visible point per label
                line, = ax.plot([x for x, _ in points], [y for _, y in points],
                                marker="o" if len(points) <= 30 else None, markersize=7 if len(points) == 1 else 4,
                                linestyle="--" if kind == "federated_accuracy" and labels else "-",
                                color=colours.get(label), label=name)
                colours.setdefault(label, line.get_color())
                band = [(r.round + 1, f) for r in self.rounds if federated_kind and label in r.federated_accuracy
                        and (f := (r.evaluation.get("by_label") or {}).get(label)) and f["enough"]]
                if band:  # the 95 % interval each federated point rests on
                    ax.fill_between([x for x, _ in band], [f["low"] for _, f in band], [f["high"] for _, f in band],
                                    color=line.get_color(), alpha=0.15, linewidth=0)
        if federated and not any(_enough(r, k) for r in self.rounds for k in r.federated_accuracy):
            from coordinator.aggregate.evaluation import NOT_ENOUGH

            ax.text(0.5, 0.5, f"federated accuracy: {NOT_ENOUGH}", transform=ax.transAxes, ha="center")
        ylabel = "test accuracy" if labels else "federated accuracy (devices' held-out data)"
        ax.set(xlabel="round", ylabel=ylabel, title=f"{self.method}: accuracy per round")
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
        if len(rounds) == 1:
            ax.set_xlim(rounds[0] - 1, rounds[0] + 1)
        ax.grid(alpha=0.3)
        if ax.get_legend_handles_labels()[0]:
            ax.legend(loc="best")
        fig.tight_layout()
        fig.savefig(out / "accuracy.png", dpi=100)
        plt.close(fig)
        fig, ax = plt.subplots(figsize=(6, 4))
        ax.bar([x - 0.2 for x in rounds], [r.bytes_down / 1e6 for r in self.rounds], width=0.4, label="down")
        ax.bar([x + 0.2 for x in rounds], [r.bytes_up / 1e6 for r in self.rounds], width=0.4, label="up")
        ax.set(xlabel="round", ylabel="MQTT payload MB", title=f"{self.method}: bytes per round")
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
        ax.set_ylim(0, 1.2 * max(max(r.bytes_down, r.bytes_up) for r in self.rounds) / 1e6 or 1.0)
        ax.legend(loc="upper center", ncol=2, frameon=False)  # in the headroom above the bars
        fig.tight_layout()
        fig.savefig(out / "bytes.png", dpi=100)
        plt.close(fig)


def _import_pyplot() -> Any:
    """matplotlib's pyplot, drawing to files (Agg)."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    return plt


def _warm_import_pyplot() -> None:
    """`_import_pyplot` ahead of time; a failure is the plots' own to report when they are drawn."""
    try:
        _import_pyplot()
    except Exception:  # noqa: BLE001 (ImportError or a broken backend: `_plot` raises it again)
        log.debug("matplotlib could not be imported ahead of the plots", exc_info=True)


def report_json(report: dict[str, Any]) -> str:
    """``report`` as indented JSON with its rounds and devices last, one line each: json's indented
    encoder is pure Python, its compact one C (100,000 devices: 0.64 s all indented, 0.43 s so)."""
    head = json.dumps({k: v for k, v in report.items() if k not in ("rounds", "devices")}, indent=2)
    for key in ("rounds", "devices"):  # rounds too: 1,000 of them indented took 50 ms, a line each 5
        if key not in report:
            continue
        entries = report[key] or []
        if not entries:
            head = head[:-2] + f',\n  "{key}": []\n}}'
            continue
        lines = ",\n    ".join(map(json.dumps, entries))  # a device's text may hold "}, {": one dumps each
        head = head[:-2] + f',\n  "{key}": [\n    ' + lines + "\n  ]\n}"
    return head


def _last_evaluation(last: tuple[int, int, int, str] | None) -> dict[str, Any]:
    """A device's latest federated evaluation, for its entry in the report (nothing if none)."""
    if last is None:
        return {}
    rnd, samples, correct, label = last
    return {"evaluation": {"round": rnd + 1, "label": label, "samples": samples, "accuracy": correct / samples}}


def keep_previous_report(out: Path) -> Path | None:
    """A new job does not overwrite an earlier job's files in ``out``: its report.json,
    metrics.csv and devices.csv are renamed after their time (``report-<date>.json``,
    ``metrics-<date>.csv``, ``devices-<date>.csv``, said in a warning); returns the kept report's path."""
    previous = out / "report.json"
    if not previous.exists():
        return None
    stamp = time.strftime("%Y%m%d-%H%M%S", time.localtime(previous.stat().st_mtime))
    kept = out / f"report-{stamp}.json"
    previous.rename(kept)
    for name in ("metrics", "devices"):
        if (out / f"{name}.csv").exists():
            (out / f"{name}.csv").rename(out / f"{name}-{stamp}.csv")
    log.warning("%s held an earlier job's report: kept as %s (and metrics-%s.csv, devices-%s.csv); its plots are "
                "replaced", out, kept.name, stamp, stamp)
    return kept
