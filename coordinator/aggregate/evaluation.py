"""Federated evaluation folded: the devices' counts added up, sample-weighted, per model label."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Mapping, Sequence

from edge_sdk.protocol.messages import Evaluation

__all__ = ["FederatedEvaluation", "fold_evaluations"]


@dataclass(frozen=True)
class FederatedEvaluation:
    """What the devices' held-out data said of the round's models.

    ``accuracy``: per model label, correct over samples summed over the devices served it (so a
    device weighs by its held-out samples); ``accuracy_all`` and ``loss`` over every device;
    ``by_device``: each device's own accuracy; ``per_class``: per label, per class, when the job
    asked for class counts (None for a class no device held out); ``no_evaluation``: devices that
    answered with no samples, and why; ``missing``: devices asked that did not answer in time.
    """

    accuracy: dict[str, float] = field(default_factory=dict)
    accuracy_all: float | None = None
    loss: float | None = None
    samples: int = 0
    by_device: dict[str, float] = field(default_factory=dict)
    per_class: dict[str, list[float | None]] = field(default_factory=dict)
    no_evaluation: dict[str, str] = field(default_factory=dict)
    missing: list[str] = field(default_factory=list)

    def summary(self) -> dict[str, Any]:
        """The round record's ``evaluation`` entry (plain data; no per-device figures)."""
        out: dict[str, Any] = {"samples": self.samples, "devices": len(self.by_device),
                               "no_evaluation": len(self.no_evaluation), "missing": len(self.missing)}
        if self.accuracy_all is not None:
            out["accuracy_all"] = self.accuracy_all
        if self.per_class:
            out["per_class"] = self.per_class
        if self.no_evaluation:
            out["no_evaluation_reasons"] = sorted(set(self.no_evaluation.values()))[:10]
        return out


def fold_evaluations(reports: Mapping[str, Evaluation], missing: Sequence[str] = ()) -> FederatedEvaluation:
    """Sum the devices' counts per label (reports in a fixed order: the sums are reproducible)."""
    samples: dict[str, int] = {}
    correct: dict[str, int] = {}
    counts: dict[str, list[int]] = {}
    right: dict[str, list[int]] = {}
    loss_sum, by_device, none = 0.0, {}, {}
    for device, report in reports.items():
        if report.num_samples == 0:
            none[device] = report.reason or "no reason given"
            continue
        label = report.label
        samples[label] = samples.get(label, 0) + report.num_samples
        correct[label] = correct.get(label, 0) + report.correct
        loss_sum += report.loss_sum
        by_device[device] = report.correct / report.num_samples
        if report.class_counts:
            _add(counts, label, report.class_counts)
            _add(right, label, report.class_correct)
    total = sum(samples.values())
    per_class = {label: [r / c if c else None for r, c in zip(right[label], counts[label], strict=True)]
                 for label in counts}
    return FederatedEvaluation(
        accuracy={label: correct[label] / n for label, n in sorted(samples.items())},
        accuracy_all=sum(correct.values()) / total if total else None,
        loss=loss_sum / total if total else None, samples=total, by_device=by_device, per_class=per_class,
        no_evaluation=none, missing=list(missing))


def _add(into: dict[str, list[int]], label: str, values: tuple[int, ...]) -> None:
    have = into.setdefault(label, [])
    if len(have) < len(values):
        have.extend([0] * (len(values) - len(have)))
    for i, v in enumerate(values):
        have[i] += v
