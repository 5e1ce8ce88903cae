"""What every method with one network per width label shares (FLANC, HeteroFL, FedPara).

Such a method holds a spec per label (``self.specs``, smallest width first) and can
load any label's network with the current global tensors (:meth:`loaded_model`).
This base evaluates every label on the held-out data, pre-composes each label to
plain dense layers (:meth:`dense_model`) for publishing and ONNX export, and has the round loop
export every label after the run when ``--option export=DIR`` asks for it (:meth:`onnx_export`).
"""

from __future__ import annotations

from abc import abstractmethod
from typing import Any, Iterator

import numpy as np
import torch

from edge_sdk.models.spec import count_params
from edge_sdk.protocol.messages import Plan, Update

from coordinator.strategies.assignment import LevelAssigner
from coordinator.core.federation import EvalData
from coordinator.core.device_record import DeviceRecord
from coordinator.core.received_update import ReceivedUpdate
from coordinator.core.spooled_tensors import pick
from coordinator.strategies.base import OnnxExport, OnnxNetwork, Strategy
from coordinator.aggregate.validation import UpdateRejected, validate_update

__all__ = ["WidthStrategy"]


class WidthStrategy(Strategy):
    """A method with a network per width label; subclasses provide specs and tensors."""

    specs: dict[str, dict]  # label -> the spec a device of that width trains
    labels: list[str]  # width labels, smallest first
    export_dir: str | None = None  # where the round loop exports every width after the run (`onnx_export`)
    assigner: LevelAssigner | None = None  # who trains which width (None: one width for all)
    expected: dict[str, dict]  # label -> what an update of that width must hold (validation.TensorSpec)
    _planned: dict[str, str]  # device -> the label of the last plan sent to it (set in __init__)

    @abstractmethod
    def tensors(self, label: str) -> dict[str, np.ndarray]:
        """What a device of width ``label`` downloads."""

    def assign(self, device: DeviceRecord) -> str:
        """A device's width from its measured capacity (:class:`LevelAssigner`)."""
        assert self.assigner is not None, "a method with one width overrides assign"
        return self.assigner.observe(device)

    def reassign(self, device: DeviceRecord) -> str:
        """A device's width after a new measurement (:meth:`LevelAssigner.reassess`)."""
        return self.assign(device) if self.assigner is None else self.assigner.reassess(device)

    def relabelled(self) -> dict[str, str]:
        """The other devices' widths that the last (re)assignment changed (:class:`LevelAssigner`)."""
        return {} if self.assigner is None else self.assigner.take_relabelled()

    def plan_label(self, rnd: int, device: DeviceRecord) -> str:
        """The width ``device`` trains in round ``rnd``, recorded: its update must be of that width."""
        assert self.assigner is not None, "a method with one width overrides plan_label"
        self.assigner.freeze()
        label = self.assigner.round_level(device, rnd, self.config.seed)
        self._planned[device.device_id] = label
        return label

    def train_settings(self, label: str, rnd: int) -> dict[str, Any]:
        """``plan.train`` of a width-``label`` plan in round ``rnd`` (default: :meth:`plan_train`'s)."""
        return self.plan_train(rnd)

    def configure_train(self, rnd: int, device: DeviceRecord) -> Plan:
        label = self.plan_label(rnd, device)
        return Plan(method=self.device_part(), label=label, model_spec=self.specs[label],
                    tensors=self.tensors(label), train=self.train_settings(label, rnd))

    def configure_evaluate(self, rnd: int, device: DeviceRecord) -> Plan | None:
        """The model of the width ``device`` is served (its label), recording nothing."""
        label = device.label
        if label not in self.specs:
            return None
        return Plan(method=self.device_part(), label=label, model_spec=self.specs[label],
                    tensors=self.tensors(label), train=self.train_settings(label, rnd))

    def check_update(self, device: DeviceRecord, update: Update) -> None:
        """An update must be exactly what the device's last plan asked of its width."""
        label = self._planned.get(device.device_id)
        if label is None:
            raise UpdateRejected("not_planned", "no plan was sent to this device")
        validate_update(update, self.expected[label], label, device.num_samples)

    def fold_held_weights(self, updates: list[ReceivedUpdate]) -> dict[str, float]:
        """Fold ``self.weights`` (group ``weights``) from the updates' tensors of the same names —
        each a leading block of the global tensor, averaged element-wise over the devices that hold
        it, sample-weighted, under the method's robust rule and server optimizer; the rule's metrics."""
        sets = [pick(u.update.tensors, self.weights) for u in updates]
        self.weights, metrics = self.fold("weights", self.weights, sets, [u.update.num_samples for u in updates],
                                          self.settings.robust, self.settings.server)
        return metrics

    @classmethod
    def describe_label(cls, label: str) -> str:
        return label if label == "global" else f"width {label}"

    @abstractmethod
    def loaded_model(self, label: str) -> torch.nn.Module:
        """The width-``label`` network holding the current global tensors."""

    def dense_model(self, label: str) -> torch.nn.Module:
        """The width-``label`` network as plain dense layers (default: it already is)."""
        return self.loaded_model(label)

    def inference_model(self, label: str) -> torch.nn.Module | None:
        return self.dense_model(label).eval() if label in self.labels else None

    def begin_round_plans(self, rnd: int, participants: list[str]) -> None:
        if self.assigner is not None:
            self.assigner.draw_round(participants, rnd, self.config.seed)

    def evaluate(self, rnd: int, data: EvalData) -> tuple[dict[str, float], float]:
        accuracy, losses = {}, []
        for label in self.labels:
            accuracy[label], loss = self.evaluate_model(self.loaded_model(label), data)
            losses.append(loss)
        return accuracy, float(np.mean(losses))

    def onnx_export(self) -> OnnxExport | None:
        """With ``export_dir``: every width's dense network, as ``<method>-w<label>.onnx`` there; the
        round loop writes them and ``export.json`` (`coordinator.runtime.export.export_networks`)."""
        return OnnxExport(self.export_dir, self._onnx_networks()) if self.export_dir else None

    def _onnx_networks(self) -> Iterator[OnnxNetwork]:
        """Every width's dense and trained network, built as the export asks for the next."""
        for label in self.labels:
            dense = self.dense_model(label).eval()
            yield OnnxNetwork(label, f"{self.name}-w{label}.onnx", dense, self.loaded_model(label).eval())

    def model_params(self) -> dict[str, int]:
        return {label: count_params(spec) for label, spec in self.specs.items()}
