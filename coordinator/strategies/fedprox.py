"""FedProx (Li et al., "Federated Optimization in Heterogeneous Networks", MLSys 2020).

FedAvg whose devices add the proximal term μ/2·‖w − w_global‖² to their local loss, which keeps
a device's model near the global one when its data is unlike the others' (non-IID). The server
side is FedAvg's with one more option, ``mu``, sent with every plan; the device side is
:mod:`edge_sdk.methods.fedprox`. It is the smallest method here: docs/methods/adding-a-method.md
walks through both files.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any, cast

from edge_sdk.protocol.messages import Plan
from edge_sdk.training import TrainConfig

from coordinator.runtime.fleet import DeviceRecord
from coordinator.options import Option, Schema, number
from coordinator.strategies.fedavg import FEDAVG_OPTIONS, FedAvg, FedAvgOptions
from coordinator.strategies.base import StrategyContext

__all__ = ["FedProx", "FedProxOptions", "FEDPROX_OPTIONS"]

FEDPROX_OPTIONS = Schema(
    Option("mu", number(0.0, 1e4), "0.01", "weight μ of the proximal term μ/2·‖w − w_global‖² (0: FedAvg)"),
    FEDAVG_OPTIONS,
)


@dataclass(frozen=True)
class FedProxOptions(FedAvgOptions):
    """FedAvg's settings and the proximal weight."""

    mu: float = 0.01


class FedProx(FedAvg):
    """FedAvg with a proximal term in every device's local loss."""

    name = "fedprox"
    option_schema = FEDPROX_OPTIONS
    options_type = FedProxOptions
    mu: float = FedProxOptions.mu

    @classmethod
    def create(cls, ctx: StrategyContext) -> "FedProx":
        strategy = cast(FedProx, super().create(ctx))  # FedAvg's model, label and aggregation rule
        strategy.mu = cls.parse_options(ctx.options).mu
        return strategy

    def method_config(self) -> dict[str, Any]:
        return {**super().method_config(), "mu": self.mu}

    def configure_train(self, rnd: int, device: DeviceRecord, train: TrainConfig | None = None) -> Plan:
        plan = super().configure_train(rnd, device, train)
        return replace(plan, train={**plan.train, "mu": self.mu})
