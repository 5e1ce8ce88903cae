"""A job's settings with its model family's training (`edge_sdk.family_recipe`) in each setting the
job left unset: the one place `edgefl simulate` (`SimulationConfig`) and `edgefl coordinator`
(`CoordinatorConfig`) take it from."""

from __future__ import annotations

from dataclasses import replace
from typing import Any, TypeVar

from edge_sdk.family_recipe import with_family_recipe

__all__ = ["with_family_training"]

#: a job's settings: a dataclass with ``model``, ``method``, ``options``, ``chosen`` and ``federation.train``
Job = TypeVar("Job")


def with_family_training(job: Job) -> tuple[Job, dict[str, Any]]:
    """``job`` (its family already resolved from ``auto``) with the family's training in the
    `TrainConfig` fields and options it did not set, and those settings (for the report)."""
    settings: Any = job
    train, options, filled = with_family_recipe(settings.model, settings.method, settings.federation.train,
                                                settings.options, settings.chosen)
    return replace(settings, options=options, federation=replace(settings.federation, train=train)), filled
