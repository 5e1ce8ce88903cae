"""The settings of FedPara, pFedPara and the naive low-rank baseline (:mod:`coordinator.strategies.fedpara`;
docs/methods/fedpara.md). pFedPara's ``holdout`` travels in every plan."""

from __future__ import annotations

from dataclasses import dataclass

from edge_sdk.methods.settings.options import boolean, choice, group, number, option
from edge_sdk.methods.settings.shared import (ProxSettings, RobustConfig, ServerOptConfig, WidthSettings, prox_group,
                                              robust_group, server_group)

__all__ = ["LowRankSettings", "FedParaSettings", "PFedParaSettings", "DEFAULT_ADAM_LR"]

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


@dataclass(frozen=True)
class LowRankSettings:
    """The naive low-rank baseline's settings, which FedPara and pFedPara extend (``--option key=value``)."""

    #: None: chosen from the fleet's links (``comm_s``)
    gamma: float | None = option(None, _gamma, "rank budget γ in [0, 1], or auto: the largest that fits comm_s",
                                 none="auto", doc="a number in [0, 1], or `auto` (from `comm_s`)")
    layer_gammas: tuple[tuple[int, float], ...] = option((), _layer_gammas, "γ per factorised layer, "
                                                         "INDEX:GAMMA[,...] (walk order)", key="gamma_layers",
                                                         doc="`INDEX:GAMMA,...` per factorised layer (walk order; "
                                                             "`method_config.ranks` lists them)")
    comm_s: float = option(0.1, number(1e-6, 1e6), "gamma=auto: seconds a device may spend moving its model down "
                           "and up per round", doc="seconds per round a device may spend on its plan + update "
                                                   "(for `auto`)")
    #: local optimizer of the factorised network
    optimizer: str = option("adam", choice("adam", "sgd"), "local optimizer of the factorised network")
    #: None: the run's learning rate (with ``optimizer=sgd``); with Adam it defaults to DEFAULT_ADAM_LR
    lr: float | None = option(None, number(1e-6, 10.0), "local learning rate (with optimizer=sgd the default is "
                              "the run's --lr)", doc="local learning rate (`optimizer=sgd`: the run's `--lr` "
                                                     "unless given)")
    width: WidthSettings = group(WidthSettings, widths=(1.0,), row="as for FLANC/HeteroFL (one full-width model, "
                                                                   "label `global`, unless `widths` lists more)")
    robust: RobustConfig = robust_group()
    server: ServerOptConfig = server_group()
    prox: ProxSettings = prox_group()

    def __post_init__(self) -> None:
        if self.lr is None and self.optimizer == "adam":
            object.__setattr__(self, "lr", DEFAULT_ADAM_LR)

    def own_lr(self) -> str | None:
        """The learning rate devices train with instead of the run's, said to the user (None: the run's)."""
        if self.lr is None:
            return None
        return (f"its own lr={self.lr:g} with {self.optimizer} (--option lr=..., or --option optimizer=sgd "
                "to train with --lr)")

    @property
    def single(self) -> bool:
        """One full-width model only (label ``global``)."""
        return self.width.widths == (1.0,)


@dataclass(frozen=True)
class FedParaSettings(LowRankSettings):
    """FedPara (``--option key=value``)."""

    tanh: bool = option(False, boolean, "tanh on the factors before their Hadamard product",
                        doc="`tanh` inside each factor (not for `lowrank`)")
    #: what the server optimizer steps (`coordinator.aggregate.composed_server`)
    server_space: str = option("auto", choice("auto", "factors", "composed"),
                               "what server_opt steps: the factors (the paper's), the weight they compose (the "
                               "factors refitted to it), or auto: composed on a MiniRocket head, factors elsewhere",
                               doc="`factors` (the paper's), `composed` (a linear layer's product, its factors "
                                   "refitted; not pFedPara) or `auto`: composed on a head folded by kernel")


@dataclass(frozen=True)
class PFedParaSettings(FedParaSettings):
    """pFedPara: FedPara's settings and the held-out share of each device's data."""

    #: local data held out to measure local accuracy
    holdout: float = option(0.2, number(0.0, 0.9), "share of each device's data held out to measure its personal "
                            "accuracy", device=True,
                            doc="pFedPara only: share of each device's training samples held out, by key as "
                                "`[data] holdout` and independently of it, for `local` accuracy")
