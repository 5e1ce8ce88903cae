"""One federated method per module; `STRATEGIES` maps CLI names to them (the class is the descriptor)."""

from __future__ import annotations

from edge_sdk.models.spec_file import is_spec_file

from coordinator.strategies.base import Strategy, StrategyContext
from coordinator.strategies.fdnnc import Fdnnc
from coordinator.strategies.fedavg import FedAvg
from coordinator.strategies.fedprox import FedProx
from coordinator.strategies.flanc import Flanc
from coordinator.strategies.heterofl import HeteroFL
from coordinator.strategies.fedpara import FedPara
from coordinator.strategies.lowrank import LowRank
from coordinator.strategies.pfedpara import PFedPara
from coordinator.strategies.reft import Reft
from coordinator.strategies.static_prune import StaticPrune

__all__ = ["FedAvg", "STRATEGIES", "create_strategy", "strategy_class"]

#: Every method, registered once: its class is its descriptor (name, device part, settings); the
#: torch-free registry of the same names and their settings is :data:`edge_sdk.methods.settings.METHODS`.
STRATEGIES: dict[str, type[Strategy]] = {cls.name: cls for cls in (
    FedAvg, FedProx, Flanc, HeteroFL, Fdnnc, FedPara, PFedPara, LowRank, Reft, StaticPrune)}


def strategy_class(name: str) -> type[Strategy]:
    """The strategy registered as `name`; ValueError lists the known ones."""
    try:
        return STRATEGIES[name]
    except KeyError:
        raise ValueError(f"unknown method {name!r}; known: {sorted(STRATEGIES)}") from None


def create_strategy(name: str, ctx: StrategyContext) -> Strategy:
    """Build the strategy `name` from `ctx`; a model spec file (``spec:FILE``) only for the methods
    that can take one (ValueError, one line, naming those that can)."""
    cls = strategy_class(name)
    if is_spec_file(ctx.model_family) and not cls.spec_file_support:
        takers = sorted(n for n, c in STRATEGIES.items() if c.spec_file_support)
        raise ValueError(f"{name} composes its networks from a model family (cnn4, flanc_cnn, mlp, resnet_small) "
                         f"and cannot compress the layers of {ctx.model_family}; with a spec file use "
                         f"{', '.join(takers)}")
    return cls.create(ctx)
