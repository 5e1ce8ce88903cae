"""FLANC (Mei et al., NeurIPS 2022): one shared neural basis, width-specific coefficients.

Every width ``p`` of the model family is a network whose hidden layers are composed
from a basis ``V`` (shared by all widths) and coefficients ``U_p`` (see
:mod:`edge_sdk.models.flanc`). A device is given the width its *measured* FLOPS
affords (:mod:`coordinator.strategies.assignment`), downloads ``V`` and the tensors of its width
only (``U_p``, stem, norms, classifier) and uploads the same. Aggregation is the
paper's Eq. 4: each basis is averaged over every participant, weighted by sample
counts; every width-specific tensor over the participants of that width only (a
width nobody trained this round keeps its tensors). Each width is evaluated on the
held-out data and, after training, can be pre-composed into a plain dense network
and exported to ONNX by the round loop with ``--option export=DIR`` (:meth:`Flanc.onnx_export`).
"""

from __future__ import annotations

from typing import Any, Mapping

import numpy as np
import torch

from edge_sdk.methods.batchnorm import STAT_SUFFIXES
from edge_sdk.methods.settings.flanc import FlancSettings
from edge_sdk.methods.settings.options import as_report
from edge_sdk.models.flanc import basis_names, init_coefficients, to_dense
from edge_sdk.models.flanc_zoo import FlancConfig, flanc_specs
from edge_sdk.models.spec import build_model, count_flops
from edge_sdk.tensors import load_numpy_state, state_to_numpy

from coordinator.strategies.assignment import LevelAssigner
from coordinator.aggregate.averaging import mean_train_loss
from coordinator.core.tensor_groups import flat_groups, restore_groups
from coordinator.core.received_update import ReceivedUpdate
from coordinator.core.spooled_tensors import pick
from coordinator.aggregate.width_slicing import pool_bn_stats
from coordinator.strategies.width_base import WidthStrategy
from coordinator.core.federation import FederationConfig
from coordinator.strategies.base import StrategyContext, seeded_init
from coordinator.aggregate.validation import expected_from

__all__ = ["Flanc", "BASIS", "flanc_config"]

BASIS = "basis"  # the checkpoint group of the shared bases (the widths' groups are their labels)


def flanc_config(settings: FlancSettings) -> FlancConfig:
    """The model-family settings that FLANC's settings describe."""
    return FlancConfig(settings.width.widths, settings.basis_fraction, settings.basis_count, settings.precompose)


class Flanc(WidthStrategy):
    """All-in-one neural composition: a width per capacity group, one shared basis."""

    name = "flanc"

    def __init__(self, config: FederationConfig, options: FlancSettings, specs: dict[str, dict]) -> None:
        super().__init__(config)
        self.settings = options
        self.specs = specs
        self.labels = list(specs)
        self.export_dir = options.width.export
        with seeded_init(config.seed):
            self.models = {label: build_model(spec) for label, spec in specs.items()}
            if options.coeff_init != "he":  # `build_model` drew He coefficients
                for model in self.models.values():
                    init_coefficients(model, options.coeff_init)
        top = self.models[self.labels[-1]]
        self.basis_keys = basis_names(top)
        top_state = state_to_numpy(top, copy=True)
        self.basis = {k: top_state[k] for k in self.basis_keys}
        self.private: dict[str, dict[str, np.ndarray]] = {}
        for label, model in self.models.items():
            state = state_to_numpy(model, copy=True)
            if basis_names(model) != self.basis_keys or any(
                    state[k].shape != self.basis[k].shape for k in self.basis_keys):
                raise ValueError(f"width {label}: its bases do not match the other widths'")
            self.private[label] = {k: v for k, v in state.items() if k not in self.basis}
        self.expected = {label: expected_from(self.tensors(label)) for label in self.labels}
        costs = {label: 3 * count_flops(spec) / 1e9 for label, spec in specs.items()}  # GFLOP per sample
        self.assigner = LevelAssigner(options.width.assignment, self.labels, costs, config.train.epochs)
        self._planned: dict[str, str] = {}  # device -> the label of its last plan

    @classmethod
    def create(cls, ctx: StrategyContext) -> "Flanc":
        options = cls.parse_options(ctx.options)
        try:
            specs = flanc_specs(ctx.model_family, tuple(ctx.input_shape), ctx.num_classes,
                                flanc_config(options), **options.width.zoo_kwargs_for(ctx.model_family))
        except TypeError as exc:
            raise ValueError(f"flanc: model family {ctx.model_family!r} does not take these options: {exc}") from None
        return cls(cls.method_federation(ctx, options), options, specs)

    # -- tensors ------------------------------------------------------------
    def tensors(self, label: str) -> dict[str, np.ndarray]:
        """What a device of width ``label`` downloads (and uploads): the bases and its width's tensors."""
        return {**self.basis, **self.private[label]}

    # -- aggregation (Eq. 4) --------------------------------------------------
    def aggregate(self, rnd: int, updates: list[ReceivedUpdate],
                  failures: Mapping[str, str] | None = None) -> dict[str, float]:
        weights = [u.update.num_samples for u in updates]
        robust, server = self.settings.robust, self.settings.server
        self.basis, metrics = self.fold(
            BASIS, self.basis, [pick(u.update.tensors, self.basis_keys) for u in updates], weights, robust,
            server)
        for label in self.labels:
            mine = [u for u in updates if u.update.label == label]
            metrics[f"devices_{label}"] = float(len(mine))
            if mine:
                keys = list(self.private[label])
                sets = [pick(u.update.tensors, keys) for u in mine]
                counts = [u.update.num_samples for u in mine]
                self.private[label], screened = self.fold(label, self.private[label], sets, counts, robust, server)
                if "clipped" in screened:  # every group's screen counts, not the basis's alone
                    metrics["clipped"] = metrics.get("clipped", 0.0) + screened["clipped"]
                stats = [k for k in keys if k.endswith(STAT_SUFFIXES)]
                if stats and self.settings.static_bn:  # exact statistics: pool them as a mixture
                    self.private[label].update(pool_bn_stats(list(zip(sets, counts, strict=True)), stats))
        metrics["train_loss"] = mean_train_loss([u.update for u in updates])
        return metrics

    # -- evaluation and export ----------------------------------------------
    def loaded_model(self, label: str) -> torch.nn.Module:
        """The width-``label`` network with the current global tensors."""
        model = self.models[label]
        load_numpy_state(model, self.tensors(label))
        return model

    def dense_model(self, label: str) -> torch.nn.Module:
        """The width-``label`` network pre-composed: every composed layer one dense kernel."""
        return to_dense(self.loaded_model(label))

    # -- bookkeeping --------------------------------------------------------
    def state_tensors(self) -> dict[str, np.ndarray]:
        return flat_groups({BASIS: self.basis, **self.private})

    def load_state_tensors(self, tensors: dict[str, np.ndarray]) -> None:
        groups = restore_groups(tensors, {BASIS: self.basis, **self.private}, "FLANC model")
        self.basis = groups.pop(BASIS)
        self.private = groups

    def method_config(self) -> dict[str, Any]:
        return {**as_report(self.settings), "basis_tensors": {k: list(v.shape) for k, v in self.basis.items()},
                "model_specs": self.specs}
