"""`--option` parsing of FedPara, pFedPara and the naive low-rank baseline, and the γ budget.

Keys: ``gamma`` (``auto`` — the default — or a number in [0, 1]), ``gamma_layers``
(``INDEX:GAMMA,...`` per factorised layer, walk order), ``comm_s`` (seconds a device
may spend per round moving its model down and up, for ``gamma=auto``; default 0.1),
``tanh`` (true/false), ``optimizer`` (``adam`` — the default — or ``sgd``) and ``lr``
(default 0.005 with Adam; the run's ``--lr`` with SGD) of local training, pFedPara's
``holdout`` and the width keys of
:class:`coordinator.strategies.width_options.WidthOptions` (``widths`` defaults to
``1.0``: one full-width model, label ``global``).

``gamma=auto`` (:func:`choose_gamma`): the largest ``γ`` on a 0.05 grid for which
every registered device moves its plan and update (float32 bytes of the tensors that
travel for its width) within ``comm_s`` at its *measured* down/uplink speed. When
even ``γ = 0`` does not fit, ``γ = 0`` is used and the budget is reported as missed.
Compute does not depend on ``γ`` (layers run on the composed dense weight): a device's
*width* comes from its FLOPS (:mod:`coordinator.strategies.assignment`).
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Callable, Iterable, Mapping

from edge_sdk.training import TrainConfig

from coordinator.runtime.fleet import DeviceRecord
from coordinator.options import Option, Schema, boolean, choice, number
from coordinator.strategies.width_options import WidthOptions, width_schema

__all__ = ["FedParaOptions", "fedpara_schema", "choose_gamma", "GAMMA_GRID", "DEFAULT_ADAM_LR"]

GAMMA_GRID = tuple(i / 20 for i in range(21))
#: Products of factors train poorly with plain SGD at a dense network's rate; Adam at
#: this rate trains them stably (see docs/methods/fedpara.md).
DEFAULT_ADAM_LR = 0.005


def _gamma(key: str, text: str) -> float | None:
    return None if text.lower() == "auto" else number(0.0, 1.0)(key, text)


def _layer_gammas(key: str, text: str) -> tuple[tuple[int, float], ...]:
    pairs: dict[int, float] = {}
    for item in (t.strip() for t in text.split(",") if t.strip()):
        index, sep, value = item.partition(":")
        if not sep or not index.strip().isdigit():
            raise ValueError(f"option {key}: expected INDEX:GAMMA[,...], got {item!r}")
        pairs[int(index)] = number(0.0, 1.0)(key, value.strip())
    return tuple(sorted(pairs.items()))


def fedpara_schema(*, tanh: bool = True, holdout: float | None = None) -> Schema:
    """The options of FedPara; the naive low-rank baseline has no ``tanh``, pFedPara a ``holdout``."""
    rows = [Option("gamma", _gamma, "auto", "rank budget γ in [0, 1], or auto: the largest that fits comm_s"),
            Option("gamma_layers", _layer_gammas, "", "γ per factorised layer, INDEX:GAMMA[,...] (walk order)"),
            Option("comm_s", number(1e-6, 1e6), "0.1", "gamma=auto: seconds a device may spend moving its "
                                                       "model down and up per round"),
            Option("optimizer", choice("adam", "sgd"), "adam", "local optimizer of the factorised network"),
            Option("lr", number(1e-6, 10.0), f"{DEFAULT_ADAM_LR:g}", "local learning rate (with optimizer=sgd "
                                                                     "the default is the run's --lr)")]
    if tanh:
        rows.append(Option("tanh", boolean, "false", "tanh on the factors before their Hadamard product"))
    if holdout is not None:
        rows.append(Option("holdout", number(0.0, 0.9), f"{holdout:g}", "share of each device's data held out to "
                                                                        "measure its personal accuracy"))
    return Schema(width_schema("1"), *rows)


@dataclass(frozen=True)
class FedParaOptions:
    """Settings of the FedPara family of methods (``--option key=value``)."""

    gamma: float | None = None  # None: chosen from the fleet's budget
    layer_gammas: tuple[tuple[int, float], ...] = ()
    comm_s: float = 0.1
    tanh: bool = False
    holdout: float = 0.0  # pFedPara: local data held out to measure local accuracy
    optimizer: str = "adam"  # local optimizer of the factorised network
    lr: float | None = DEFAULT_ADAM_LR  # None: the run's learning rate
    width: WidthOptions = field(default_factory=lambda: WidthOptions(widths=(1.0,)))

    @classmethod
    def from_options(cls, options: Mapping[str, str], method: str = "fedpara",
                     schema: Schema | None = None) -> "FedParaOptions":
        """Parse string options by ``schema`` (:func:`fedpara_schema`; FedPara's by default).

        Unknown keys and bad values raise ValueError naming the option.
        """
        schema = schema or fedpara_schema()
        options = dict(options)
        options.setdefault("widths", schema["widths"].default)
        width, parsed = WidthOptions.parse(method, options, schema)
        if "gamma_layers" in parsed:
            parsed["layer_gammas"] = parsed.pop("gamma_layers")
        if "holdout" in schema and "holdout" not in parsed:
            parsed["holdout"] = schema["holdout"].parse("holdout", schema["holdout"].default)
        if parsed.get("optimizer") == "sgd" and "lr" not in parsed:
            parsed["lr"] = None
        return cls(width=width, **parsed)

    def train_config(self, base: TrainConfig) -> TrainConfig:
        """The run's local-training settings with this method's optimizer and learning rate."""
        return replace(base, optimizer=self.optimizer, lr=base.lr if self.lr is None else self.lr)

    @property
    def single(self) -> bool:
        """One full-width model only (label ``global``)."""
        return self.width.widths == (1.0,)


def _transfer_s(nbytes: int, device: DeviceRecord) -> float:
    profile = device.profile
    return nbytes * 8 / (profile.downlink_mbps * 1e6) + nbytes * 8 / (profile.uplink_mbps * 1e6)


def choose_gamma(devices: Iterable[DeviceRecord], nbytes: Callable[[str, float], int],
                 comm_s: float, grid: Iterable[float] = GAMMA_GRID) -> tuple[float, dict[str, float]]:
    """The largest ``γ`` whose transfers fit ``comm_s`` on every device; and a summary.

    ``nbytes(label, γ)`` is what one plan (= one update) of that width weighs.
    The summary holds ``gamma``, ``budget_met`` (0/1) and ``worst_transfer_s``.
    """
    devices = [d for d in devices if d.label is not None]
    grid = sorted(set(grid))
    if not devices:
        raise ValueError("choose_gamma needs at least one registered device")
    best, worst = grid[0], None
    for gamma in grid:
        cost: dict[str, int] = {}
        slowest = max(_transfer_s(cost.setdefault(d.label, nbytes(d.label, gamma)), d)  # type: ignore[arg-type]
                      for d in devices)
        if gamma == grid[0]:
            worst = slowest
        if slowest <= comm_s:
            best, worst = gamma, slowest
    met = worst is not None and worst <= comm_s
    return best, {"gamma": best, "budget_met": float(met), "worst_transfer_s": float(worst or 0.0)}
