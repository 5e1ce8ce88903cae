"""Static pruning baseline: every device trains the model pruned to the weakest device's level.

The level is REFT's (``P = max(0, 1 - F/F_lambda)`` rounded up to a level) of the least capable
device registered when the first round starts (or fixed with ``--option ratio=R``); the initial
global model is L1-pruned once to it and trained with FedAvg (robust aggregation options
``aggregate``, ``trim``, ``clip`` as FedAvg's). Devices run the FedAvg device part.
"""

from __future__ import annotations

import logging
from dataclasses import replace
from typing import Any, Mapping, Sequence

import numpy as np
import torch

from edge_sdk.methods.settings.options import as_report
from edge_sdk.methods.settings.static_prune import StaticPruneSettings
from edge_sdk.models.spec import build_model
from edge_sdk.models.zoo import model_for_dataset
from edge_sdk.protocol.messages import Plan
from edge_sdk.tensors import load_numpy_state
from edge_sdk.training import TrainConfig

from coordinator.core.tensor_groups import flat_groups, restore_groups
from coordinator.core.device_record import DeviceRecord
from coordinator.strategies.pruning import (PruneResult, capacity_level, describe_level, level_label, prune_spec,
                                           resolve_backend, round_to_level)
from coordinator.strategies.fedavg import FedAvg
from coordinator.core.federation import FederationConfig
from coordinator.strategies.base import StrategyContext, seeded_init
from coordinator.aggregate.validation import expected_from

__all__ = ["StaticPrune"]

log = logging.getLogger(__name__)


class StaticPrune(FedAvg):
    """FedAvg on one model pruned to what the weakest device affords (FedAvg's aggregation,
    evaluation and update checks, on the pruned model)."""

    name = "static-prune"
    spec_file_support = ("prunes the spec file's conv2d and linear layers once, for the weakest device; the "
                         "other layers follow their shapes")

    @classmethod
    def describe_label(cls, label: str) -> str:
        return describe_level(label)

    def __init__(self, config: FederationConfig, options: StaticPruneSettings, spec: dict) -> None:
        super().__init__(config, spec, settings=options)  # the dense model, seeded
        self.settings = options
        self.dense_spec = spec
        self.backend = resolve_backend(options.backend)
        self.initial = dict(self.weights)
        self.level: float | None = None
        self.pruned: PruneResult | None = None
        self.weights = {}
        if options.ratio is not None:
            self.fix_level(round_to_level(options.ratio, options.levels))

    @classmethod
    def create(cls, ctx: StrategyContext) -> "StaticPrune":
        options = cls.parse_options(ctx.options)
        return cls(cls.method_federation(ctx, options), options,
                   model_for_dataset(ctx.model_family, ctx.input_shape, ctx.num_classes))

    # -- the level ----------------------------------------------------------
    def device_level(self, device: DeviceRecord) -> float:
        return capacity_level(device.profile.gflops, self.settings.f_lambda, self.settings.levels)

    def fix_level(self, level: float) -> None:
        """Prune the initial model to ``level``; from now on every device trains it."""
        self.level = level
        self.pruned = prune_spec(self.dense_spec, self.initial, level, self.backend)
        self.model_spec = self.pruned.spec
        self.weights = dict(self.pruned.tensors)
        with seeded_init(self.config.seed):  # its weights are loaded before use; the draw stays here
            self.model = build_model(self.pruned.spec)
        self.expected = expected_from(self.weights)
        log.info("static-prune: every device at %s (%d params, %s)", self.label, self.pruned.params,
                 self.pruned.backend)

    @property
    def label(self) -> str:
        if self.level is None:
            raise RuntimeError("static-prune: the level is fixed when the first round starts")
        return level_label(self.level)

    def assign(self, device: DeviceRecord) -> str:
        return self.label if self.level is not None else level_label(self.device_level(device))

    def setup(self, devices: Mapping[str, DeviceRecord], online: Sequence[str]) -> dict[str, str]:
        """Before the first round: prune for the weakest device present; every device trains that
        (its label, for every registered device; devices registering later are assigned it)."""
        if self.level is None:
            self.fix_level(max(self.device_level(devices[d]) for d in online))
        return {device_id: self.label for device_id in devices}

    # -- round hooks --------------------------------------------------------
    def own_train(self, train: TrainConfig) -> TrainConfig:
        """The job's training with the pruned model's own optimizer and lr."""
        return replace(train, optimizer=self.settings.local_optimizer, lr=self.settings.local_lr)

    def configure_train(self, rnd: int, device: DeviceRecord) -> Plan:
        assert self.pruned is not None
        return Plan(method=self.device_part(), label=self.label, model_spec=self.pruned.spec, tensors=self.weights,
                    train=self.plan_train(rnd))

    def inference_model(self, label: str) -> torch.nn.Module | None:
        if self.level is None or label != self.label:
            return None
        load_numpy_state(self.model, self.weights)
        return self.model

    def model_params(self) -> dict[str, int]:
        if self.pruned is None:
            return {}
        return {self.label: self.pruned.params}

    def state_tensors(self) -> dict[str, np.ndarray]:
        if self.level is None:
            return {}
        return flat_groups({"model": self.weights, "static": {"level": np.array([self.level], dtype=np.float64)}})

    def load_state_tensors(self, tensors: dict[str, np.ndarray]) -> None:
        if "static/level" not in tensors:
            raise ValueError("checkpoint holds no static-prune level")
        self.fix_level(float(tensors["static/level"][0]))  # the pruned model's shapes
        self.weights = restore_groups(tensors, {"model": self.weights, "static": {"level": np.zeros(1)}},
                                      "static-prune model")["model"]

    def method_config(self) -> dict[str, Any]:
        return {**as_report(self.settings), "pruning_backend": self.backend, "dense_spec": self.dense_spec}
