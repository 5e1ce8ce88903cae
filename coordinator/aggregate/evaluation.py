"""Federated evaluation folded: the devices' counts added up, sample-weighted, per model label."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Mapping, Sequence

from coordinator.aggregate.interval import INTERVAL_KIND, wilson_interval
from edge_sdk.protocol.messages import Evaluation

__all__ = ["FederatedEvaluation", "NOT_ENOUGH", "fold_evaluations"]

#: what a federated accuracy from too few held-out samples reads, wherever a person reads it
NOT_ENOUGH = "not enough held-out data"


@dataclass(frozen=True)
class FederatedEvaluation:
    """What the devices' held-out data said of the round's models.

    ``accuracy``: per model label, correct over samples summed over the devices served it (so a
    device weighs by its held-out samples); ``accuracy_all`` and ``loss`` over every device;
    ``by_device``: each device's own accuracy; ``per_class``: per label, per class, when the job
    asked for class counts (None for a class no device held out); ``no_evaluation``: devices that
    answered with no samples, and why; ``missing``: devices asked that did not answer in time;
    ``samples_by_label``, ``correct_by_label``, ``devices_by_label``: what each label's figure
    rests on (:meth:`figures`).
    """

    accuracy: dict[str, float] = field(default_factory=dict)
    accuracy_all: float | None = None
    loss: float | None = None
    samples: int = 0
    by_device: dict[str, float] = field(default_factory=dict)
    per_class: dict[str, list[float | None]] = field(default_factory=dict)
    no_evaluation: dict[str, str] = field(default_factory=dict)
    missing: list[str] = field(default_factory=list)
    samples_by_label: dict[str, int] = field(default_factory=dict)
    correct_by_label: dict[str, int] = field(default_factory=dict)
    devices_by_label: dict[str, int] = field(default_factory=dict)

    def figures(self, min_samples: int) -> dict[str, dict[str, Any]]:
        """Per label: the accuracy with its sample and device counts and 95 % interval, and
        ``enough`` (at least ``min_samples`` held-out samples behind it)."""
        out = {}
        for label, n in self.samples_by_label.items():
            low, high = wilson_interval(self.correct_by_label[label], n)
            out[label] = {"accuracy": self.accuracy[label], "samples": n, "devices": self.devices_by_label[label],
                          "low": round(low, 6), "high": round(high, 6), "enough": n >= min_samples}
        return out

    def summary(self, min_samples: int = 1) -> dict[str, Any]:
        """The round record's ``evaluation`` entry (plain data; no per-device figures):
        ``by_label`` holds each figure's weight (:meth:`figures`); ``enough`` is False when a
        label's figure rests on fewer than ``min_samples`` held-out samples."""
        out: dict[str, Any] = {"samples": self.samples, "devices": len(self.by_device),
                               "no_evaluation": len(self.no_evaluation), "missing": len(self.missing)}
        if self.samples_by_label:
            figures = self.figures(min_samples)
            out.update(by_label=figures, interval=INTERVAL_KIND, min_samples=min_samples,
                       enough=all(f["enough"] for f in figures.values()))
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
    devices: dict[str, int] = {}
    loss_sum, by_device, none = 0.0, {}, {}
    for device, report in reports.items():
        if report.num_samples == 0:
            none[device] = report.reason or "no reason given"
            continue
        label = report.label
        samples[label] = samples.get(label, 0) + report.num_samples
        correct[label] = correct.get(label, 0) + report.correct
        devices[label] = devices.get(label, 0) + 1
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
        no_evaluation=none, missing=list(missing), samples_by_label=dict(sorted(samples.items())),
        correct_by_label={label: correct[label] for label in sorted(samples)},
        devices_by_label={label: devices[label] for label in sorted(samples)})


def _add(into: dict[str, list[int]], label: str, values: tuple[int, ...]) -> None:
    have = into.setdefault(label, [])
    if len(have) < len(values):
        have.extend([0] * (len(values) - len(have)))
    for i, v in enumerate(values):
        have[i] += v
