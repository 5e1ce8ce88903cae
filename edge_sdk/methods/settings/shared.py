"""The settings groups several methods compose: the robust rule, the server optimizer, ``prox_mu``,
the widths and how devices are assigned to them.

Each is its own frozen dataclass, parsed once with the method's settings (its keys sit in the
method's flat ``--option`` namespace) and handed whole to the code that uses it:
:class:`RobustConfig` to :func:`coordinator.aggregate.robust.robust_aggregate`,
:class:`ServerOptConfig` to :class:`coordinator.aggregate.server_opt.ServerOptimizer`,
:class:`AssignmentConfig` to :class:`coordinator.strategies.assignment.LevelAssigner`,
:class:`ProxSettings` to the run's training settings (``TrainConfig.prox_mu``).
"""

from __future__ import annotations

import logging
import math
import re
from dataclasses import dataclass, replace
from typing import Any, Sequence

from edge_sdk.methods.settings.options import boolean, choice, group, number, option, text
from edge_sdk.model_names import width_label

__all__ = ["robust_group", "server_group", "prox_group", "RULES", "DEFAULT_CLIP", "RobustConfig", "clip_option",
           "clip_factor", "OPTIMIZERS", "DEFAULT_LR", "ServerOptConfig", "ProxSettings", "MODES", "SAMPLING",
           "AssignmentConfig", "positive_number", "NORMS", "WidthSettings"]

log = logging.getLogger("coordinator.aggregate.server_opt")

# ----------------------------------------------------------------- the robust rule
RULES = ("mean", "median", "trimmed")
#: The default norm screen: updates longer than 3x the reference norm are scaled back to it.
DEFAULT_CLIP = "3x"
_FACTOR = re.compile(r"(\d+(?:\.\d*)?|\.\d+)x")


def clip_factor(clip: float | str | None) -> float | None:
    """K of a relative clip (``auto``: 1), None for none or an absolute bound."""
    if clip == "auto":
        return 1.0
    if isinstance(clip, str) and (m := _FACTOR.fullmatch(clip)):
        return float(m.group(1))
    return None


def _valid_clip(clip: object) -> bool:
    if clip is None or clip == "auto":
        return True
    if isinstance(clip, str):
        factor = clip_factor(clip)
        return factor is not None and 1.0 <= factor < 1e6
    return isinstance(clip, (int, float)) and not isinstance(clip, bool) and math.isfinite(clip) and clip > 0


def clip_option(key: str, value: str) -> float | str | None:
    """``none``/``off``, ``auto``, a multiple ``Kx`` (1 <= K < 1e6) or a bound > 0."""
    if value in ("none", "off"):
        return None
    if value == "auto" or _FACTOR.fullmatch(value):
        if not _valid_clip(value):
            raise ValueError(f"option {key}: a multiple Kx needs 1 <= K < 1e6, got {value!r}")
        return value
    try:
        return number(1e-12, 1e300)(key, value)
    except ValueError:
        raise ValueError(f"option {key}: expected none, auto, a multiple such as 3x, or a number > 0, "
                         f"got {value!r}") from None


@dataclass(frozen=True)
class RobustConfig:
    """How updates are combined (``--option aggregate=... trim=... clip=... max_share=...``);
    :mod:`coordinator.aggregate.robust` applies it."""

    rule: str = option("mean", choice(*RULES), "how updates are combined: mean (sample-weighted), median, trimmed",
                       key="aggregate")
    #: per side, for ``trimmed``
    trim: float = option(0.1, number(0.0, 0.5, open_hi=True), "trimmed: fraction dropped at each end, in [0, 0.5) "
                                                              "(at least one from 3 holders)")
    #: None, a bound > 0, ``auto`` (the reference norm) or ``Kx`` (K times it)
    clip: float | str | None = option(DEFAULT_CLIP, clip_option, "scale back updates longer than Kx the round's "
                                      "median norm (auto: 1x), or than a number; none: off", none="none")
    #: of the round's weight, per device, once 3 or more report
    max_share: float = option(0.5, number(0.0, 1.0), "most of a round's weight one device keeps once 3+ report "
                                                     "(1: no cap)")

    def __post_init__(self) -> None:
        if self.rule not in RULES:
            raise ValueError(f"option aggregate: must be one of {'|'.join(RULES)}, got {self.rule!r}")
        if isinstance(self.trim, bool) or not (isinstance(self.trim, (int, float)) and 0.0 <= self.trim < 0.5):
            raise ValueError(f"option trim: must be in [0, 0.5), got {self.trim!r}")
        if not _valid_clip(self.clip):
            raise ValueError(f"option clip: must be none, auto, Kx (1 <= K) or a number > 0, got {self.clip!r}")
        if isinstance(self.max_share, bool) or not (isinstance(self.max_share, (int, float))
                                                    and 0.0 < self.max_share <= 1.0):
            raise ValueError(f"option max_share: must be in (0, 1], got {self.max_share!r}")

    @property
    def plain(self) -> bool:
        """True when this is plain sample-weighted averaging (no clipping, no share cap)."""
        return self.rule == "mean" and self.clip is None and self.max_share >= 1.0

    @property
    def clip_factor(self) -> float | None:
        """K of a relative bound (``auto``: 1), None otherwise."""
        return clip_factor(self.clip)


# ----------------------------------------------------------------- the server optimizer
OPTIMIZERS = ("none", "fedavgm", "fedadam", "fedyogi")
#: η when ``server_lr`` is not given, for the adaptive ones: they move each weight by about η per
#: round, so η is a step size (the paper's grid: 10^-3…1). FedAvgM's default is 1 − β (see
#: :attr:`ServerOptConfig.step_size`).
DEFAULT_LR = {"fedadam": 0.01, "fedyogi": 0.01}
_USES = {"none": set(), "fedavgm": {"server_lr", "server_momentum"},
         "fedadam": {"server_lr", "beta1", "beta2", "tau"}, "fedyogi": {"server_lr", "beta1", "beta2", "tau"}}


@dataclass(frozen=True)
class ServerOptConfig:
    """Which server optimizer steps the robust rule's result, and its hyper-parameters
    (:mod:`coordinator.aggregate.server_opt`, docs/server_optimizers.md)."""

    name: str = option("none", choice(*OPTIMIZERS), "server optimizer on the aggregate: none, fedavgm, fedadam, "
                       "fedyogi (docs/server_optimizers.md)", key="server_opt")
    #: None: the default of `step_size`
    lr: float | None = option(None, number(1e-9, 1e3), "server learning rate η; default: 1 − server_momentum for "
                              "fedavgm, 0.01 for fedadam and fedyogi", key="server_lr",
                              doc_default="1 − β or 0.01")
    momentum: float = option(0.9, number(0.0, 0.999), "fedavgm: momentum β", key="server_momentum")
    beta1: float = option(0.9, number(0.0, 0.999), "fedadam, fedyogi: β₁ of the first moment")
    beta2: float = option(0.99, number(0.0, 0.9999), "fedadam, fedyogi: β₂ of the second moment")
    tau: float = option(1e-3, number(1e-12, 1.0), "fedadam, fedyogi: τ, the adaptivity floor")

    @property
    def active(self) -> bool:
        """False for ``none`` (the aggregate is the new model)."""
        return self.name != "none"

    @property
    def step_size(self) -> float:
        """η: ``server_lr``, else FedAvgM's 1 − β — the step of plain FedAvg once the momentum has
        built up (the paper's η = 1 steps 1/(1 − β) = 10× as far, and diverged on Fashion-MNIST and
        FLANC here, BENCHMARKS.md) — or the adaptive optimizers' :data:`DEFAULT_LR`."""
        if self.lr is not None:
            return self.lr
        return 1.0 - self.momentum if self.name == "fedavgm" else DEFAULT_LR.get(self.name, 1.0)

    def given(self, method: str, keys: set[str]) -> None:
        """Parsing: a hyper-parameter that the chosen optimizer does not use is logged as a warning."""
        idle = sorted(keys - {"server_opt"} - _USES[self.name])
        if idle:
            log.warning("%s: option(s) %s do nothing with server_opt=%s", method, idle, self.name)


# ----------------------------------------------------------------- the proximal term
@dataclass(frozen=True)
class ProxSettings:
    """FedProx's proximal term μ/2·‖w − w_global‖² in every device's local loss, for any method:
    the value becomes the run's ``TrainConfig.prox_mu``, which every plan carries."""

    #: None: the run's training settings' (``[train] prox_mu``, 0 unless set)
    prox_mu: float | None = option(None, number(0.0, 1e4), "FedProx's μ: μ/2·‖w − w_global‖² in every device's "
                                   "local loss (0: none); default: the run's [train] prox_mu, 0", literal=False,
                                   doc="FedProx's proximal term μ/2·‖w − w_global‖² in every device's local loss, "
                                       "on the parameters it trains", doc_default="0")


# ----------------------------------------------------------------- widths and their assignment
MODES = ("cluster", "quantile", "budget")
SAMPLING = ("fixed", "random", "any", "every")
NORMS = ("none", "batchnorm", "groupnorm")


def positive_number(name: str, value: object) -> float:
    """``value`` as a float; ValueError naming ``name`` unless it is a finite number > 0."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) \
            or value <= 0:
        raise ValueError(f"{name} must be a finite number > 0, got {value!r}")
    return float(value)


def _override(key: str, value: str) -> tuple[tuple[str, str], ...]:
    pairs = []
    for item in (t.strip() for t in value.split(",") if t.strip()):
        device, sep, level = item.partition(":")
        if not sep or not device.strip() or not level.strip():
            raise ValueError(f"option {key}: expected DEVICE:LEVEL[,...], got {item!r}")
        pairs.append((device.strip(), level.strip()))
    return tuple(pairs)


def _match_level(value: str, levels: Sequence[str]) -> str | None:
    if value in levels:
        return value
    try:
        number_ = float(value)
    except ValueError:
        return None
    for level in levels:
        try:
            if float(level) == number_:
                return level
        except ValueError:
            continue
    return None


@dataclass(frozen=True)
class AssignmentConfig:
    """How devices are grouped into levels (``--option assign=... budget_s=... override=... dynamic=...
    sample=...``); :class:`coordinator.strategies.assignment.LevelAssigner` applies it."""

    #: None: ``budget`` when ``budget_s`` is given, else ``cluster``
    mode: str | None = option(None, choice(*MODES), "how devices get a level: cluster (by FLOPS), quantile, budget; "
                              "default: budget with budget_s, else cluster", key="assign", literal=False,
                              doc_default="`cluster` (`budget` with `budget_s`)")
    budget_s: float | None = option(None, number(1e-9, 1e12), "assign=budget: seconds of local training a round "
                                    "may take")
    override: tuple[tuple[str, str], ...] = option((), _override, "fixed levels, DEVICE:LEVEL[,...]")
    dynamic: bool = option(False, boolean, "re-assign levels every round from the devices' latest reports")
    #: random: up to the capacity; any: any level; every: any, all levels in each round
    sample: str = option("fixed", choice(*SAMPLING), "per-round levels: fixed, random (up to capacity), any, "
                         "every (any, all levels in each round)")

    def __post_init__(self) -> None:
        if self.mode is None:
            object.__setattr__(self, "mode", "budget" if self.budget_s is not None else "cluster")
        if self.mode not in MODES:
            raise ValueError(f"option assign: must be one of {'|'.join(MODES)}, got {self.mode!r}")
        if self.sample not in SAMPLING:
            raise ValueError(f"option sample: must be one of {'|'.join(SAMPLING)}, got {self.sample!r}")
        if self.budget_s is not None:
            positive_number("option budget_s", self.budget_s)
        if self.mode == "budget" and self.budget_s is None:
            raise ValueError("option assign=budget needs budget_s=SECONDS")

    def for_levels(self, levels: Sequence[str]) -> "AssignmentConfig":
        """This config with every ``override`` level spelled as one of ``levels`` (``1`` -> ``1.0``);
        ValueError when one is none of them."""
        pairs = []
        for device, value in self.override:
            level = _match_level(value, levels)
            if level is None:
                raise ValueError(f"option override: expected DEVICE:LEVEL[,...] with LEVEL in "
                                 f"{list(levels)}, got {device + ':' + value!r}")
            pairs.append((device, level))
        return self if tuple(pairs) == self.override else replace(self, override=tuple(pairs))


def _widths(key: str, value: str) -> tuple[float, ...]:
    widths = tuple(number(1e-3, 1.0)(key, t.strip()) for t in value.split(",") if t.strip())
    if not widths or list(widths) != sorted(set(widths)) or len(widths) > 16:
        raise ValueError(f"option {key}: need 1-16 strictly increasing values, got {value!r}")
    return widths


@dataclass(frozen=True)
class WidthSettings:
    """What every method with a network per width takes (FLANC, HeteroFL, the FedPara family):
    the widths, their norm layers, where to export them, and who trains which."""

    widths: tuple[float, ...] = option((0.25, 0.5, 0.75, 1.0), _widths, "model widths p in (0, 1], "
                                       "comma-separated, increasing", doc="the widths, increasing, in (0, 1]")
    #: None: the method's / model family's default (:meth:`zoo_kwargs_for`)
    norm: str | None = option(None, choice(*NORMS), "norm layers: none, batchnorm, groupnorm; default: the model "
                              "family's (batchnorm; none for flanc_cnn and mlp)", doc_default="the family's",
                              doc="`none`, `batchnorm`, `groupnorm` (`mlp`, `flanc_cnn`: none unless asked for)")
    export: str | None = option(None, text, "after training, export every width as ONNX into this folder",
                                doc="folder for the ONNX files (`<method>-w<p>.onnx`) after training")
    assignment: AssignmentConfig = group(AssignmentConfig, row=(
        "width assignment: `cluster` by measured FLOPS, `quantile`, or `budget` (seconds of training a round may "
        "take); `override` pins devices (`DEVICE:WIDTH,...`); `dynamic` re-assigns every round; `sample` draws a "
        "width per round (`random`: up to the capacity, `any`, `every`)"))

    def __post_init__(self) -> None:
        object.__setattr__(self, "assignment", self.assignment.for_levels(self.labels))

    @property
    def labels(self) -> list[str]:
        """Width labels, smallest first."""
        return [width_label(p) for p in self.widths]

    def zoo_kwargs(self) -> dict[str, Any]:
        """Keyword arguments for the zoo builders (``norm`` when it was given)."""
        if self.norm is None:
            return {}
        return {"norm": None if self.norm == "none" else self.norm}

    def zoo_kwargs_for(self, family: str, default_norm: str = "batchnorm") -> dict[str, Any]:
        """Like :meth:`zoo_kwargs`, with ``default_norm`` when none was given (mlp: no norms;
        flanc_cnn and minirocket: none unless asked for)."""
        if family in ("flanc_cnn", "minirocket") and self.norm is None:
            return {}  # the paper's network; MiniRocket's features reach the head as they are
        if family == "mlp":
            if self.norm not in (None, "none"):
                raise ValueError(f"the mlp family has no norm layers, got norm={self.norm!r}")
            return {}
        norm = self.norm or default_norm
        return {"norm": None if norm == "none" else norm}


# ----------------------------------------------------------------- composing the groups
def robust_group() -> Any:
    """The robust rule as a group of a method's settings (``aggregate``, ``trim``, ``clip``, ``max_share``)."""
    return group(RobustConfig, row="robust aggregation and norm screening "
                                   "([robust_aggregation.md](../robust_aggregation.md))")


def server_group() -> Any:
    """The server optimizer as a group of a method's settings (``server_opt``, ``server_lr``, ...)."""
    return group(ServerOptConfig, row="server optimizer (FedAvgM, FedAdam, FedYogi) applied to the rule's result "
                                      "([server_optimizers.md](../server_optimizers.md))")


def prox_group() -> Any:
    """``prox_mu`` as a group of a method's settings."""
    return group(ProxSettings)
