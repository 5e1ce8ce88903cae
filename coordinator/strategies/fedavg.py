"""FedAvg (McMahan et al. 2017): one dense model, averaged weighted by sample counts.

``--option width=P`` trains the family's width-P network (e.g. 0.25: the smallest-width
baseline of FLANC/HeteroFL); its label is then the width (``"0.25"``), else ``"global"``.
``--option norm=none|batchnorm|groupnorm`` overrides the family's norm layers.
``--option aggregate=mean|median|trimmed``, ``trim=F`` and ``clip=auto|BOUND`` turn on
robust aggregation (:mod:`coordinator.aggregate.robust`). The settings are
:class:`edge_sdk.methods.settings.fedavg.FedAvgSettings`.
"""

from __future__ import annotations

from typing import Any, Mapping

import numpy as np
import torch

from edge_sdk.methods.settings.fedavg import FedAvgSettings
from edge_sdk.methods.settings.options import as_report
from edge_sdk.models.spec import build_model, count_params
from edge_sdk.models.zoo import model_for_dataset
from edge_sdk.protocol.messages import Plan, Update
from edge_sdk.tensors import load_numpy_state, state_to_numpy

from coordinator.aggregate.averaging import mean_train_loss
from coordinator.core.device_record import DeviceRecord
from coordinator.core.received_update import ReceivedUpdate

from coordinator.core.federation import EvalData, FederationConfig

from coordinator.strategies.base import Strategy, StrategyContext, seeded_init
from coordinator.aggregate.validation import expected_from, validate_update

__all__ = ["FedAvg"]

GLOBAL = "global"


class FedAvg(Strategy):
    """Every device trains the same model; the server averages all weights."""

    name = "fedavg"
    spec_file_support = "trains the spec file's network as written (every layer type a spec may hold)"

    def __init__(self, config: FederationConfig, model_spec: dict[str, Any], label: str = GLOBAL,
                 settings: Any = None) -> None:
        super().__init__(config)
        self._label = label
        settings = FedAvgSettings() if settings is None else settings
        self.settings = settings  # FedAvgSettings, or a subclass's settings with robust and server groups
        self.robust, self.server = settings.robust, settings.server
        self.model_spec = model_spec
        with seeded_init(config.seed):
            self.model = build_model(model_spec)
        self.weights = {k: np.array(v) for k, v in state_to_numpy(self.model).items()}
        self.expected = expected_from(self.weights)

    @property
    def label(self) -> str:
        """The one label every device trains (``global``, or the width)."""
        return self._label

    @classmethod
    def create(cls, ctx: StrategyContext) -> "FedAvg":
        options = cls.parse_options(ctx.options)
        federation = cls.method_federation(ctx, options)
        kw: dict[str, Any] = {}
        if options.norm is not None:
            kw["norm"] = None if options.norm == "none" else options.norm
        if options.width is None:
            spec = model_for_dataset(ctx.model_family, ctx.input_shape, ctx.num_classes, **kw)
            return cls(federation, spec, settings=options)
        spec = model_for_dataset(ctx.model_family, ctx.input_shape, ctx.num_classes, width=options.width, **kw)
        return cls(federation, spec, label=str(options.width), settings=options)

    def assign(self, device: DeviceRecord) -> str:
        return self.label

    def configure_train(self, rnd: int, device: DeviceRecord) -> Plan:
        return Plan(method=self.device_part(), label=self.label, model_spec=self.model_spec,
                    tensors=self.weights, train=self.plan_train(rnd))

    def check_update(self, device: DeviceRecord, update: Update) -> None:
        validate_update(update, self.expected, self.label, device.num_samples)

    def aggregate(self, rnd: int, updates: list[ReceivedUpdate],
                  failures: Mapping[str, str] | None = None) -> dict[str, float]:
        counts = [u.update.num_samples for u in updates]
        self.weights, metrics = self.fold(self.label, self.weights, [u.update.tensors for u in updates], counts,
                                          self.robust, self.server)
        return {**metrics, "train_loss": mean_train_loss([u.update for u in updates])}

    def evaluate(self, rnd: int, data: EvalData) -> tuple[dict[str, float], float]:
        load_numpy_state(self.model, self.weights)
        accuracy, loss = self.evaluate_model(self.model, data)
        return {self.label: accuracy}, loss

    def inference_model(self, label: str) -> torch.nn.Module | None:
        if label != self.label:
            return None
        load_numpy_state(self.model, self.weights)
        return self.model

    def model_params(self) -> dict[str, int]:
        return {self.label: count_params(self.model_spec)}

    def state_tensors(self) -> dict[str, np.ndarray]:
        return dict(self.weights)

    def state_spec(self) -> dict[str, Any]:
        return self.model_spec

    def load_state_tensors(self, tensors: dict[str, np.ndarray]) -> None:
        if set(tensors) != set(self.weights) or any(np.shape(tensors[k]) != v.shape for k, v in self.weights.items()):
            raise ValueError("checkpoint tensors do not match this model")
        self.weights = {k: np.asarray(v, dtype=np.float32) for k, v in tensors.items()}

    def method_config(self) -> dict[str, Any]:
        return {**as_report(self.settings), "model_spec": self.model_spec}
