"""HeteroFL (Diao et al., ICLR 2021): width-p sub-networks sliced out of one global network.

The global network is the family's full-width network (:func:`heterofl_spec`); a
device of width ``p`` (from its measured FLOPS, :mod:`coordinator.strategies.assignment`) gets
the prefix slice of every tensor: the first ``ceil(p·c)`` channels of every hidden
layer, every input channel of the stem and every class of the classifier. The server
averages each element of the global tensors over the devices whose sub-network holds
it, weighted by sample counts; elements nobody held keep their value. Scalers divide
activations by ``p`` while training. BatchNorm statistics are kept per width (a
channel's input differs between sub-networks): with static BatchNorm every device
measures them on its data for its own width and every smaller one (prefix slices of
its trained network) and the server pools them per width as a mixture (mean of the
means; mean of ``var + mean²`` minus the squared pooled mean).
"""

from __future__ import annotations

from typing import Any, Mapping

import numpy as np
import torch

from edge_sdk.methods.batchnorm import BN_PREFIX, STAT_SUFFIXES
from edge_sdk.methods.settings.heterofl import HeteroFLRound, HeteroFLSettings
from edge_sdk.methods.settings.options import as_report
from edge_sdk.models.heterofl import heterofl_spec
from edge_sdk.models.spec import build_model, count_flops
from edge_sdk.tensors import load_numpy_state, state_to_numpy

from coordinator.strategies.assignment import LevelAssigner
from coordinator.aggregate.averaging import mean_train_loss
from coordinator.core.received_update import ReceivedUpdate
from coordinator.core.spooled_tensors import pick
from coordinator.aggregate.width_slicing import leading_block, pool_bn_stats
from coordinator.strategies.width_base import WidthStrategy
from coordinator.core.federation import FederationConfig
from coordinator.strategies.base import StrategyContext, seeded_init
from coordinator.aggregate.validation import expected_from

__all__ = ["HeteroFL"]


def _he_init(model: torch.nn.Module) -> None:
    for module in model.modules():
        if isinstance(module, (torch.nn.Conv2d, torch.nn.Linear)):
            torch.nn.init.kaiming_normal_(module.weight, nonlinearity="relu")
            if module.bias is not None:
                torch.nn.init.zeros_(module.bias)


class HeteroFL(WidthStrategy):
    """One global network; each capacity group trains a prefix-sliced sub-network."""

    name = "heterofl"

    def __init__(self, config: FederationConfig, options: HeteroFLSettings, global_spec: dict,
                 specs: dict[str, dict]) -> None:
        super().__init__(config)
        self.settings = options
        self.global_spec = global_spec
        self.specs = specs
        self.labels = list(specs)
        self.export_dir = options.width.export
        with seeded_init(config.seed):
            global_model = build_model(global_spec)
            if options.init == "he":
                _he_init(global_model)
            full = state_to_numpy(global_model, copy=True)
            self.weights = {k: v for k, v in full.items() if not k.endswith(STAT_SUFFIXES)}
            self.models = {label: build_model(spec) for label, spec in specs.items()}
        self.stats: dict[str, dict[str, np.ndarray]] = {}
        self.shapes: dict[str, dict[str, tuple[int, ...]]] = {}
        for label, model in self.models.items():
            state = state_to_numpy(model, copy=True)
            if set(state) != set(full) or any(
                    v.ndim != full[k].ndim or any(a > b for a, b in zip(v.shape, full[k].shape, strict=True))
                    for k, v in state.items()):
                raise ValueError(f"width {label} is not a prefix slice of the global network")
            self.shapes[label] = {k: v.shape for k, v in state.items() if k in self.weights}
            self.stats[label] = {k: v for k, v in state.items() if k.endswith(STAT_SUFFIXES)}
        self.expected = {label: expected_from(self._upload(label)) for label in self.labels}
        costs = {label: 3 * count_flops(spec) / 1e9 for label, spec in specs.items()}
        self.assigner = LevelAssigner(options.width.assignment, self.labels, costs, config.train.epochs)
        self._planned: dict[str, str] = {}

    @classmethod
    def create(cls, ctx: StrategyContext) -> "HeteroFL":
        options = cls.parse_options(ctx.options)
        if options.nested and ctx.model_family != "minirocket":
            raise ValueError(f"heterofl: nested trains minirocket's classifier for every smaller width; the model "
                             f"is {ctx.model_family}")
        kw = options.width.zoo_kwargs_for(ctx.model_family)
        shape = tuple(ctx.input_shape)
        try:
            global_spec = heterofl_spec(ctx.model_family, shape, ctx.num_classes, 1.0, options.scaler, **kw)
            specs = {label: heterofl_spec(ctx.model_family, shape, ctx.num_classes, p, options.scaler, **kw)
                     for label, p in zip(options.width.labels, options.width.widths, strict=True)}
        except TypeError as exc:
            raise ValueError(f"heterofl: model family {ctx.model_family!r} does not take these options: "
                             f"{exc}") from None
        return cls(cls.method_federation(ctx, options), options, global_spec, specs)

    def tensors(self, label: str) -> dict[str, np.ndarray]:
        """The width-``label`` sub-network: prefix slices of the global tensors, its BN statistics."""
        sliced = {k: np.ascontiguousarray(self.weights[k][leading_block(s)])
                  for k, s in self.shapes[label].items()}
        return {**sliced, **self.stats[label]}

    def _smaller(self, label: str) -> list[str]:
        if not self.settings.static_bn or not any(self.stats.values()):
            return []
        return self.labels[:self.labels.index(label)]

    def _upload(self, label: str) -> dict[str, np.ndarray]:
        """Reference tensors of what a width-``label`` device uploads."""
        extra = {f"{BN_PREFIX}{q}/{k}": v for q in self._smaller(label) for k, v in self.stats[q].items()}
        return {**self.tensors(label), **extra}

    # -- who trains what ----------------------------------------------------
    def train_settings(self, label: str, rnd: int) -> dict[str, Any]:
        """With the BatchNorm specs of the smaller widths, whose statistics the device measures too,
        and (``nested``) the kernels of the smaller widths whose classifier it trains too."""
        nested = None
        if self.settings.nested:
            nested = tuple(self.specs[q]["layers"][0]["kernels"] for q in self.labels[:self.labels.index(label)])
        return self.plan_train(rnd, HeteroFLRound(bn_specs={q: self.specs[q] for q in self._smaller(label)},
                                                  nested_kernels=nested or None))

    # -- aggregation: element-wise over the holders --------------------------
    def aggregate(self, rnd: int, updates: list[ReceivedUpdate],
                  failures: Mapping[str, str] | None = None) -> dict[str, float]:
        metrics = self.fold_held_weights(updates)
        for q in self.labels:
            self._pool_stats(q, updates)
        metrics.update({f"devices_{label}": float(sum(u.update.label == label for u in updates))
                        for label in self.labels})
        metrics["train_loss"] = mean_train_loss([u.update for u in updates])
        return metrics

    def _pool_stats(self, q: str, updates: list[ReceivedUpdate]) -> None:
        """Width ``q``'s BN statistics: a sample-weighted mixture over the devices that measured them."""
        found = []
        for u in updates:
            prefix = "" if u.update.label == q else f"{BN_PREFIX}{q}/"
            if all(prefix + k in u.update.tensors for k in self.stats[q]):
                found.append((pick(u.update.tensors, self.stats[q], prefix), u.update.num_samples))
        if found:
            self.stats[q].update(pool_bn_stats(found, list(self.stats[q])))

    # -- evaluation and export ----------------------------------------------
    def loaded_model(self, label: str) -> torch.nn.Module:
        """The width-``label`` sub-network with the current global tensors."""
        model = self.models[label]
        load_numpy_state(model, self.tensors(label))
        return model

    # -- bookkeeping --------------------------------------------------------
    def state_tensors(self) -> dict[str, np.ndarray]:
        stats = {f"{BN_PREFIX}{q}/{k}": v for q, ts in self.stats.items() for k, v in ts.items()}
        return {**self.weights, **stats}

    def state_spec(self) -> dict[str, Any]:
        """The global network: every width's tensors are prefix slices of its."""
        return self.global_spec

    def load_state_tensors(self, tensors: dict[str, np.ndarray]) -> None:
        current = self.state_tensors()
        if set(tensors) != set(current) or any(tuple(tensors[k].shape) != v.shape for k, v in current.items()):
            raise ValueError("checkpoint tensors do not match this HeteroFL model")
        self.weights = {k: np.asarray(tensors[k], dtype=np.float32) for k in self.weights}
        self.stats = {q: {k: np.asarray(tensors[f"{BN_PREFIX}{q}/{k}"], dtype=np.float32) for k in ts}
                      for q, ts in self.stats.items()}

    def method_config(self) -> dict[str, Any]:
        return {**as_report(self.settings), "global_spec": self.global_spec}
