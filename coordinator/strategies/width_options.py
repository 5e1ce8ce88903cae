"""`--option` parsing shared by the width-based methods (FLANC, HeteroFL).

Keys: ``widths`` (comma-separated, increasing, in (0, 1]), ``norm`` (none |
batchnorm | groupnorm; default: the method's, see :meth:`WidthOptions.zoo_kwargs_for`), ``export`` (a folder: after
training every width is exported there as ONNX), the assignment keys of
:class:`coordinator.strategies.assignment.AssignmentConfig` (``assign``, ``budget_s``,
``override``, ``dynamic``, ``sample``) and the robust-aggregation keys of
:class:`coordinator.aggregate.robust.RobustConfig` (``aggregate``, ``trim``, ``clip`` and the server
optimizer's ``server_opt``, ``server_lr``, ...) and ``prox_mu`` (:mod:`coordinator.strategies.proximal`).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Mapping

from edge_sdk.models.flanc_zoo import width_label

from coordinator.strategies.assignment import ASSIGNMENT_OPTIONS, AssignmentConfig
from coordinator.options import Option, Schema, choice, number
from coordinator.strategies.proximal import PROX_OPTIONS
from coordinator.aggregate.robust import ROBUST_OPTIONS, RobustConfig

__all__ = ["WidthOptions", "NORMS", "width_schema"]

NORMS = ("none", "batchnorm", "groupnorm")


def _widths(key: str, text: str) -> tuple[float, ...]:
    widths = tuple(number(1e-3, 1.0)(key, t.strip()) for t in text.split(",") if t.strip())
    if not widths or list(widths) != sorted(set(widths)) or len(widths) > 16:
        raise ValueError(f"option {key}: need 1-16 strictly increasing values, got {text!r}")
    return widths


def _folder(key: str, text: str) -> str | None:
    return text or None


def width_schema(default_widths: str = "0.25,0.5,0.75,1") -> Schema:
    """The options of every width-based method: widths, norm, export, and the assignment, aggregation
    (robust rule, server optimizer) and proximal keys."""
    return Schema(
        Option("widths", _widths, default_widths, "model widths p in (0, 1], comma-separated, increasing"),
        Option("norm", choice(*NORMS), None, "norm layers: none, batchnorm, groupnorm; default: the model "
                                             "family's (batchnorm; none for flanc_cnn and mlp)"),
        Option("export", _folder, "", "after training, export every width as ONNX into this folder"),
        ASSIGNMENT_OPTIONS, ROBUST_OPTIONS, PROX_OPTIONS)


_OWN_KEYS = frozenset(width_schema().keys)


@dataclass(frozen=True)
class WidthOptions:
    """Options every width-based method takes."""

    widths: tuple[float, ...] = (0.25, 0.5, 0.75, 1.0)
    norm: str | None = None  # None: the method's / model family's default
    export: str | None = None
    assignment: AssignmentConfig = field(default_factory=AssignmentConfig)
    robust: RobustConfig = field(default_factory=RobustConfig)

    @property
    def labels(self) -> list[str]:
        """Width labels, smallest first."""
        return [width_label(p) for p in self.widths]

    def zoo_kwargs(self) -> dict[str, Any]:
        """Keyword arguments for the zoo builders (``norm`` when it was given)."""
        if self.norm is None:
            return {}
        return {"norm": None if self.norm == "none" else self.norm}

    def zoo_kwargs_for(self, family: str, default_norm: str = "batchnorm") -> dict[str, Any]:
        """Like :meth:`zoo_kwargs`, with ``default_norm`` when none was given (mlp: no norms;
        flanc_cnn: none unless asked for, as the paper's network)."""
        if family == "flanc_cnn" and self.norm is None:
            return {}
        if family == "mlp":
            if self.norm not in (None, "none"):
                raise ValueError(f"the mlp family has no norm layers, got norm={self.norm!r}")
            return {}
        norm = self.norm or default_norm
        return {"norm": None if norm == "none" else norm}

    @classmethod
    def parse(cls, method: str, options: Mapping[str, str], schema: Schema) -> tuple["WidthOptions", dict[str, Any]]:
        """The shared options and the method's own (``schema``: :func:`width_schema` plus its rows).

        Unknown keys and bad values raise ValueError listing what is known.
        """
        parsed = schema.parse(method, options)
        text = {k: str(v).strip() for k, v in options.items()}
        widths = parsed.get("widths", cls.widths)
        labels = [width_label(p) for p in widths]
        try:
            assignment = AssignmentConfig.from_options(text, labels)
        except ValueError as exc:
            raise ValueError(f"{method}: {exc}") from None
        robust = RobustConfig.from_options(text, method)
        shared = cls(widths=widths, norm=parsed.get("norm"), export=parsed.get("export"), assignment=assignment,
                     robust=robust)
        return shared, {k: v for k, v in parsed.items() if k not in _OWN_KEYS}
