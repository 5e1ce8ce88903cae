"""What a federated job is, for every method: its round-loop settings, its held-out data, and the
error that stops it when no device can train."""

from __future__ import annotations

from dataclasses import dataclass, field, fields
from typing import Any

import numpy as np

from edge_sdk.accelerator import check_device_name
from edge_sdk.config import section, setting
from edge_sdk.training import TrainConfig

from coordinator.core.asynchronous import BUFFER_SIZE, MAX_STALENESS, STALENESS, check_staleness
from coordinator.core.lr_schedule import LrDecay, check_lr_decay, lr_factor, parse_lr_decay

__all__ = ["FederationConfig", "EvalData", "NO_ROUND_CAP", "TrainingFailed", "check_windows", "federation_from_toml"]

#: ``rounds`` of a job paced by new data whose TOML sets none: no cap that a home would reach
NO_ROUND_CAP = 1 << 31


@dataclass(frozen=True)
class FederationConfig:
    """Round-loop settings shared by every method."""

    rounds: int = 5
    min_devices: int = 2
    devices_per_round: int | None = None  # None: every online device
    quorum: float = 0.5  # fraction of participants needed to aggregate
    round_deadline_s: float = 600.0
    register_timeout_s: float = 120.0
    seed: int = 0
    train: TrainConfig = field(default_factory=TrainConfig)
    checkpoint_dir: str | None = None
    publish: bool = True  # after the last round, send every device the ONNX model of its label
    #: ...as a retained message, so a device that is offline then installs it when it reconnects
    retain_models: bool = True
    #: also publish after every this many rounds (0: only after the last), for long jobs
    publish_every: int = 0
    #: publish to at most this many devices, the latest round's participants first (None: every
    #: device; a simulation: 100, so that a large simulated fleet's publish stays flat)
    publish_devices: int | None = None
    #: published versions kept beside the checkpoint (state + ONNX) for ``edgefl coordinator
    #: --rollback`` (0: none; needs ``checkpoint_dir``)
    keep_versions: int = 5
    #: evaluate on the held-out data after every this many rounds; the last round always does
    eval_every: int = 1
    #: ((round, factor), ...): after `round` rounds every plan's lr is multiplied by `factor`
    lr_decay: LrDecay = ()
    #: interim evaluations use a fixed stratified subset of this many held-out samples (None:
    #: all of them); the last round always evaluates on the whole held-out set
    eval_samples: int | None = None
    #: where the coordinator evaluates: cpu, cuda, cuda:N or auto (a GPU when torch sees one)
    eval_device: str = "cpu"
    #: stop the job (`TrainingFailed`) when every device asked reports a failed local training
    #: this many rounds in a row (0: never; a simulation uses 3: its devices fail alike every round)
    stop_after_failed_rounds: int = 0
    #: a participant that sent nothing (no update, no decline) in this many of the last 4 rounds it
    #: was asked is a straggler: once a round has its quorum and only stragglers are missing, it
    #: waits for them as long again as the others took, not until `round_deadline_s`; it is waited
    #: for in full again once its misses age out, and the latest round's update sent late takes
    #: that miss back (0: always wait until the deadline)
    straggler_after: int = 2
    #: federated evaluation: in every evaluated round, the devices evaluate the model they would be
    #: served on their own held-out data (`[data] holdout` on the device) and report counts
    federated_eval: bool = True
    #: devices asked to evaluate per evaluated round, sampled (None: every online device)
    eval_devices: int | None = None
    #: how long an evaluation waits for the devices' reports (None: `round_deadline_s`)
    eval_deadline_s: float | None = None
    #: devices also report counts per class (they reveal a device's label mix: off by default)
    eval_per_class: bool = False
    #: pacing by new data (docs/continuous.md): 0, a fixed number of rounds, one after another; > 0,
    #: a job that keeps serving: a round starts when the online devices hold at least this many
    #: training samples they have not trained on (their `data_count`s), ``rounds`` caps the job
    #: (absent from the TOML: no cap) and every round's model is published when it is not worse
    min_new_samples: int = 0
    #: one device counts for at most this share of ``min_new_samples`` (one busy sensor alone does
    #: not start rounds)
    new_samples_share: float = 0.5
    #: and a round starts no sooner than this many seconds after the last one ended
    min_interval_s: float = 0.0
    #: and only inside these local-time windows ("22:00-06:00", the `[schedule] windows` format;
    #: empty: any time)
    windows: tuple[str, ...] = ()
    #: a new version replaces the published one when no label's accuracy is more than this below
    #: the published version's (absolute; on the coordinator's test set, else the devices' held-out data)
    publish_tolerance: float = 0.01
    #: a federated accuracy from fewer held-out samples than this reads "not enough held-out data"
    #: wherever a person reads it (the figure and its counts stay in report.json and metrics.csv)
    min_eval_samples: int = 20
    #: buffered asynchronous aggregation (FedBuff; docs/asynchronous.md): no round barrier, the model
    #: steps every `buffer_size` updates, each weighted by its staleness; ``rounds`` counts versions
    asynchronous: bool = False
    #: devices kept training at once (None: every online device)
    concurrency: int | None = None
    #: updates folded into each version (FedBuff's K)
    buffer_size: int = BUFFER_SIZE
    #: an update trained on a version more than this many versions old is refused, counted
    max_staleness: int = MAX_STALENESS
    #: how a stale update is weighted: sqrt (1/sqrt(1+s)), poly:A ((1+s)^-A) or constant
    staleness: str = STALENESS

    def __post_init__(self) -> None:
        decay = self.lr_decay
        object.__setattr__(self, "lr_decay", parse_lr_decay(decay) if isinstance(decay, str) else check_lr_decay(decay))
        for at, _ in self.lr_decay:  # every plan's lr stays a lr a device takes (TrainConfig: at most 10)
            factor = lr_factor(self.lr_decay, at)
            if self.train.lr * factor > 10:
                raise ValueError(f"lr_decay: from round {at + 1} the lr would be {self.train.lr * factor:g} "
                                 f"(lr {self.train.lr:g} times {factor:g}); a device takes at most 10")
        for name, low in (("rounds", 1), ("min_devices", 1), ("publish_every", 0), ("eval_every", 1),
                          ("stop_after_failed_rounds", 0), ("straggler_after", 0),
                          ("min_eval_samples", 1), ("min_new_samples", 0), ("keep_versions", 0),
                          ("buffer_size", 1), ("max_staleness", 0)):
            value = getattr(self, name)
            if type(value) is not int or value < low:
                raise ValueError(f"{name} must be an integer >= {low}, got {value!r}")
        check_device_name(self.eval_device)  # syntax only: the round loop checks the GPU is there
        if self.eval_samples is not None and (type(self.eval_samples) is not int or self.eval_samples < 1):
            raise ValueError(f"eval_samples must be an integer >= 1 (or absent: all), got {self.eval_samples!r}")
        for name in ("devices_per_round", "eval_devices", "publish_devices", "concurrency"):
            k = getattr(self, name)
            if k is not None and (type(k) is not int or k < 1):
                raise ValueError(f"{name} must be an integer >= 1 (or absent: every device), got {k!r}")
        object.__setattr__(self, "staleness", check_staleness(self.staleness))
        for name in ("federated_eval", "eval_per_class", "asynchronous"):
            if type(getattr(self, name)) is not bool:
                raise ValueError(f"{name} must be true or false, got {getattr(self, name)!r}")
        for name, low, high in (("new_samples_share", 0.0, 1.0), ("publish_tolerance", 0.0, 1.0)):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not low < value <= high:
                raise ValueError(f"{name} must be a number in ({low:g}, {high:g}], got {value!r}")
        if isinstance(self.min_interval_s, bool) or not isinstance(self.min_interval_s, (int, float)) \
                or not 0 <= self.min_interval_s < float("inf"):
            raise ValueError(f"min_interval_s must be a number of seconds >= 0, got {self.min_interval_s!r}")
        object.__setattr__(self, "windows", check_windows(self.windows))
        if not (isinstance(self.quorum, (int, float)) and 0 < self.quorum <= 1):
            raise ValueError(f"quorum must be a fraction in (0, 1], got {self.quorum!r}")
        for name in ("round_deadline_s", "register_timeout_s", "eval_deadline_s"):
            value = getattr(self, name)
            if value is None and name == "eval_deadline_s":
                continue
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 < value < float("inf"):
                raise ValueError(f"{name} must be a number of seconds > 0, got {value!r}")
        if type(self.seed) is not int:
            raise ValueError(f"seed must be an integer, got {self.seed!r}")


def federation_from_toml(config: dict[str, Any]) -> FederationConfig:
    """The ``[federation]`` and ``[train]`` tables of a TOML file (every `FederationConfig` field
    but ``train``, every `TrainConfig` field); an unknown key or a bad value is a one-line
    ValueError naming the table and the key."""
    keys = {f.name for f in fields(FederationConfig)} - {"train"}
    table = dict(section(config, "federation", keys))
    try:
        train = TrainConfig.from_dict(section(config, "train", {f.name for f in fields(TrainConfig)}))
    except ValueError as exc:
        raise ValueError(f"[train] {str(exc).removeprefix('TrainConfig.')}") from None
    if "checkpoint_dir" in table:
        setting(table, "checkpoint_dir", str, None, "[federation]")
    if table.get("min_new_samples") and "rounds" not in table:  # a job that keeps serving: no cap
        table["rounds"] = NO_ROUND_CAP
    try:
        return FederationConfig(train=train, **table)
    except (ValueError, TypeError) as exc:
        raise ValueError(f"[federation] {exc}") from None


def check_windows(windows: object) -> tuple[str, ...]:
    """``windows`` as a tuple of "HH:MM-HH:MM" strings (`edge_sdk.schedule.TimeWindow`), else a
    one-line ValueError."""
    from edge_sdk.schedule import TimeWindow

    if isinstance(windows, str) or not isinstance(windows, (list, tuple)):
        raise ValueError(f"windows must be a list such as [\"22:00-06:00\"], got {windows!r}")
    try:
        return tuple(str(TimeWindow.parse(w)) for w in windows)
    except (ValueError, TypeError) as exc:
        raise ValueError(f"windows: {exc}") from None


class TrainingFailed(RuntimeError):
    """Every device asked failed its local training in `FederationConfig.stop_after_failed_rounds`
    rounds in a row (e.g. a model that cannot train where the devices train): the job stops."""


@dataclass(frozen=True)
class EvalData:
    """Held-out real data the coordinator evaluates on."""

    x: np.ndarray
    y: np.ndarray

    def __len__(self) -> int:
        return len(self.y)

    def stratified(self, n: int, seed: int) -> "EvalData":
        """``n`` samples, each class in proportion (seeded, in their original order)."""
        rng = np.random.default_rng([seed, 0xE5A1])
        order = rng.permutation(len(self.y))
        key = np.empty(len(order))
        for c in np.unique(self.y):  # a sample's rank within its class, as a fraction
            members = order[self.y[order] == c]
            key[members] = (np.arange(len(members)) + 0.5) / len(members)
        pick = np.sort(order[np.argsort(key[order], kind="stable")[:n]])
        return EvalData(self.x[pick], self.y[pick])
