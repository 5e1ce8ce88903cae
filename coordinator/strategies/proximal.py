"""``--option prox_mu=…`` on every method: FedProx's proximal term in every device's local loss.

The term μ/2·‖w − w_global‖² (Li et al., MLSys 2020) keeps a device's model near the round's
global one when its data is unlike the others'. Any method takes the option: the value goes into
the run's training settings (``TrainConfig.prox_mu``), which every plan carries, and
:func:`edge_sdk.training.train_local` adds the term over the parameters the device trains (for
factorised models: the factors).
"""

from __future__ import annotations

from dataclasses import replace
from typing import Mapping

from coordinator.options import Option, Schema, number
from coordinator.strategies.base import StrategyContext

__all__ = ["PROX_OPTIONS", "PROX_KEYS", "with_prox_mu", "without_prox"]

PROX_OPTIONS = Schema(
    Option("prox_mu", number(0.0, 1e4), "0", "FedProx's μ: μ/2·‖w − w_global‖² in every device's local loss "
                                             "(0: none)"),
)
PROX_KEYS = PROX_OPTIONS.keys


def with_prox_mu(ctx: StrategyContext, method: str) -> StrategyContext:
    """``ctx`` with ``prox_mu`` (when given) moved into the federation's training settings."""
    mu = PROX_OPTIONS.parse(method, ctx.options, subset=True).get("prox_mu")
    if mu is None:
        return ctx
    federation = replace(ctx.federation, train=replace(ctx.federation.train, prox_mu=mu))
    return replace(ctx, federation=federation)


def without_prox(options: Mapping[str, object]) -> dict[str, object]:
    """``options`` without the proximal keys (a method's own parser never sees them)."""
    return {k: v for k, v in options.items() if k not in PROX_KEYS}
