"""``--option prox_mu=…`` on every method: FedProx's proximal term in every device's local loss.

The term μ/2·‖w − w_global‖² (Li et al., MLSys 2020) keeps a device's model near the round's
global one when its data is unlike the others'. Any method takes the option (the settings group
:class:`edge_sdk.methods.settings.shared.ProxSettings`): the value goes into the run's training
settings (``TrainConfig.prox_mu``), which every plan carries, and
:func:`edge_sdk.training.train_local` adds the term over the parameters the device trains (for
factorised models: the factors). That is the one road to the term: FedProx's ``mu`` takes it too
(:meth:`coordinator.strategies.fedprox.FedProx.method_federation`).
"""

from __future__ import annotations

from dataclasses import replace

from edge_sdk.methods.settings.shared import ProxSettings

from coordinator.core.federation import FederationConfig

__all__ = ["with_prox_mu"]


def with_prox_mu(federation: FederationConfig, prox: ProxSettings, at_least: float = 0.0) -> FederationConfig:
    """``federation`` with ``prox.prox_mu`` (when given; else the run's own) in its training
    settings, raised to ``at_least``."""
    mu = federation.train.prox_mu if prox.prox_mu is None else prox.prox_mu
    mu = max(mu, at_least)
    if mu == federation.train.prox_mu:
        return federation
    return replace(federation, train=replace(federation.train, prox_mu=mu))
