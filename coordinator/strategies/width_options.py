"""`--option` parsing shared by the width-based methods (FLANC, HeteroFL).

Keys: ``widths`` (comma-separated, increasing, in (0, 1]), ``norm`` (none |
batchnorm | groupnorm; default: the method's, see :meth:`WidthOptions.zoo_kwargs_for`), ``export`` (a folder: after
training every width is exported there as ONNX), the assignment keys of
:class:`coordinator.assignment.AssignmentConfig` (``assign``, ``budget_s``,
``override``, ``dynamic``, ``sample``) and the robust-aggregation keys of
:class:`coordinator.robust.RobustConfig` (``aggregate``, ``trim``, ``clip``).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Mapping

from edge_sdk.models.flanc_zoo import width_label

from coordinator.assignment import ASSIGNMENT_KEYS, AssignmentConfig
from coordinator.options import Parser, choice, number, parse_keys, unknown_keys
from coordinator.robust import ROBUST_KEYS, RobustConfig

__all__ = ["WidthOptions", "NORMS"]

NORMS = ("none", "batchnorm", "groupnorm")
_KEYS = ("widths", "norm", "export", *ASSIGNMENT_KEYS, *ROBUST_KEYS)


def _widths(method: str, text: str) -> tuple[float, ...]:
    items = [t.strip() for t in text.split(",") if t.strip()]
    try:
        widths = tuple(number(1e-3, 1.0)("widths", t) for t in items)
    except ValueError as exc:
        raise ValueError(f"{method}: {exc}") from None
    if not widths or list(widths) != sorted(set(widths)) or len(widths) > 16:
        raise ValueError(f"{method} option widths: need 1-16 strictly increasing values, got {text!r}")
    return widths


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
    def parse(cls, method: str, options: Mapping[str, str],
              own: Mapping[str, Parser]) -> tuple["WidthOptions", dict[str, Any]]:
        """The shared options and the method's ``own`` ones (key -> :mod:`coordinator.options` parser).

        Unknown keys and bad values raise ValueError listing what is known.
        """
        unknown_keys(method, options, set(_KEYS) | set(own))
        text = {k: str(v).strip() for k, v in options.items()}
        widths = _widths(method, text["widths"]) if "widths" in text else cls.widths
        norm = text.get("norm")
        if norm is not None:
            norm = parse_keys(method, {"norm": norm}, {"norm": choice(*NORMS)})["norm"]
        labels = [width_label(p) for p in widths]
        try:
            assignment = AssignmentConfig.from_options({k: text[k] for k in ASSIGNMENT_KEYS if k in text}, labels)
        except ValueError as exc:
            raise ValueError(f"{method}: {exc}") from None
        robust = RobustConfig.from_options({k: text[k] for k in ROBUST_KEYS if k in text}, method)
        parsed = cls(widths=widths, norm=norm, export=text.get("export") or None, assignment=assignment,
                     robust=robust)
        return parsed, parse_keys(method, {k: text[k] for k in own if k in text}, own)
