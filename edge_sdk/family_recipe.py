"""How a model family trains unless told otherwise (torch-free): a family whose best training differs
from `TrainConfig`'s defaults (tuned for the image CNNs) names its own here, and a job of that family
takes each setting its user left unset.

``minirocket`` (the default for series, `edge_sdk.model_names.default_family`) is a linear head on
fixed features: a ridge classifier's squared loss at lr 0.004 with momentum 0.9 on the devices and
server momentum (FedAvgM, η = 1) on the coordinator — PLAID 0.924 federated IID over 3 seeds, where
`TrainConfig`'s cross-entropy at lr 0.05 with plain FedAvg scored 0.772–0.860; with HeteroFL, each
device also trains the classifiers of the smaller widths (``nested``), which lifted the smallest
width from 0.704 to 0.864 on a mixed 21-device fleet (BENCHMARKS.md "Series model family"). FedPara and
pFedPara keep their own optimizer (Adam, lr 0.005: not the recipe's lr) and take the server momentum
too (PLAID: 0.901 against 0.868 without it, seed 0). REFT, one-shot, trains its devices' kernel subsets once with
the recipe's SGD for 150 epochs unless the job set its epochs (PLAID 0.564, one epoch 0.149, seed 0).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field, fields, replace
from types import MappingProxyType
from typing import Any, Collection, Mapping

from edge_sdk.train_config import TrainConfig

log = logging.getLogger(__name__)

__all__ = ["FAMILY_RECIPES", "FamilyRecipe", "FILLED_UNLESS_CHOSEN", "OPTIMIZER_SETTINGS", "chosen_settings",
           "with_family_recipe"]


@dataclass(frozen=True)
class FamilyRecipe:
    """A family's training: `TrainConfig` fields, and each method's options (as their TOML/``--option``
    text; a method not named takes only ``train``)."""

    train: Mapping[str, Any] = field(default_factory=dict)
    options: Mapping[str, Mapping[str, str]] = field(default_factory=dict)
    #: methods that train with an optimizer of their own (FedPara's Adam at its own lr): the recipe's
    #: optimizer settings (`OPTIMIZER_SETTINGS`) are not theirs and are not filled in
    own_optimizer: tuple[str, ...] = ()


#: the `TrainConfig` fields a method with its own optimizer does not take from a family's recipe
OPTIMIZER_SETTINGS = ("lr", "momentum")

#: a recipe's option left unfilled where the job chose any of these settings itself: REFT's ``local_epochs``
#: stands for the run's epochs (``--local-epochs 5`` stays 5) and the recipe's 150 are for one shot (not for
#: ``oneshot=false``'s every round); its ``local_lr`` is the recipe's SGD's (not another ``local_optimizer``'s)
FILLED_UNLESS_CHOSEN = MappingProxyType({"local_epochs": ("epochs", "oneshot"), "local_lr": ("local_optimizer",)})


_SERVER_MOMENTUM = {"server_opt": "fedavgm", "server_lr": "1"}

FAMILY_RECIPES: Mapping[str, FamilyRecipe] = MappingProxyType({
    "minirocket": FamilyRecipe(train={"loss": "squared", "lr": 0.004, "momentum": 0.9},
                               options={"fedavg": _SERVER_MOMENTUM, "fedprox": _SERVER_MOMENTUM,
                                        "heterofl": {**_SERVER_MOMENTUM, "nested": "true"},
                                        "fedpara": _SERVER_MOMENTUM, "pfedpara": _SERVER_MOMENTUM,
                                        "fdnnc": _SERVER_MOMENTUM,
                                        # REFT averages no weights (no server momentum); its devices train
                                        # their kernel subsets once, with the recipe's SGD, not REFT's own Adam,
                                        # for as long as a 30-round job's devices do (one epoch: PLAID 0.149)
                                        "reft": {"local_optimizer": "sgd", "local_lr": "0.004",
                                                 "local_epochs": "150"}},
                               own_optimizer=("fedpara", "pfedpara")),
})


def chosen_settings(train: TrainConfig, options: Mapping[str, str]) -> frozenset[str]:
    """The settings a job built in Python chose: the `TrainConfig` fields that differ from their
    default, and every option given (a command line or a TOML file knows exactly which it set)."""
    default = TrainConfig()
    return frozenset({f.name for f in fields(TrainConfig) if getattr(train, f.name) != getattr(default, f.name)}
                     | set(options))


def with_family_recipe(family: str, method: str, train: TrainConfig, options: Mapping[str, str],
                       chosen: Collection[str] | None) -> tuple[TrainConfig, dict[str, str], dict[str, Any]]:
    """``train`` and ``options`` with ``family``'s recipe filling every setting not in ``chosen``
    (the names of the `TrainConfig` fields and options the job set itself; None: `chosen_settings`),
    and what was filled (logged).

    A ``server_*`` option the job set (``server_lr`` without ``server_opt``) keeps the recipe's
    optimizer off: a job that names the server's optimizer in any way chose it."""
    recipe = FAMILY_RECIPES.get(family)
    if recipe is None:
        return train, dict(options), {}
    if chosen is None:
        chosen = chosen_settings(train, options)
    own = OPTIMIZER_SETTINGS if method in recipe.own_optimizer else ()
    filled_train = {key: value for key, value in recipe.train.items() if key not in chosen and key not in own}
    server_chosen = any(key.startswith("server_") for key in chosen)
    filled_options = {key: value for key, value in recipe.options.get(method, {}).items()
                      if key not in chosen and not (server_chosen and key.startswith("server_"))
                      and not set(FILLED_UNLESS_CHOSEN.get(key, ())) & set(chosen)}
    filled = {**filled_train, **filled_options}
    if filled:
        log.info("%s trains with its family's settings: %s (docs/sensor-data.md)", family,
                 ", ".join(f"{key}={value}" for key, value in filled.items()))
    return replace(train, **filled_train), {**options, **filled_options}, filled
