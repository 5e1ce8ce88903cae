"""Federated evaluation on the device: the model it would be served, on its held-out data.

The coordinator's `Evaluate` carries that model as a plan would (the global model, or the
device's width / rank / level's); pFedPara's adds the device's own personal half. The answer, an
`Evaluation`, holds counts and a summed loss — never a sample — so the coordinator can add them up
over devices, weighted by their samples.
"""

from __future__ import annotations

import logging
import time
from dataclasses import replace
from typing import Callable

import torch

from edge_sdk.methods.base import DeviceContext, LocalData, planned_model
from edge_sdk.methods.registry import METHODS, load_entry
from edge_sdk.protocol.messages import Evaluate, Evaluation, Plan
from edge_sdk.training import EVAL_BATCH, evaluate_counts

__all__ = ["evaluate_holdout", "served_model"]

log = logging.getLogger(__name__)

#: device part -> ``"module:function"`` building the model a device of that part is served from a
#: plan and its context, where that is not just the plan's model (:func:`planned_model`): the registry's
_SERVED: dict[str, str] = {m.device_part: m.served for m in METHODS.values() if m.served is not None}


def served_model(plan: Plan, ctx: DeviceContext) -> torch.nn.Module:
    """The model a device of ``plan.method`` is served, built from ``plan``."""
    entry = _SERVED.get(plan.method)
    if entry is None:
        return planned_model(plan)
    build: Callable[[Plan, DeviceContext], torch.nn.Module] = load_entry(entry)
    return build(plan, ctx)


def evaluate_holdout(request: Evaluate, holdout: LocalData | None, ctx: DeviceContext,
                     why_none: str = "") -> Evaluation:
    """``request``'s model evaluated on ``holdout`` (already in the job's normalisation); with no
    held-out data an evaluation of no samples that says why (``why_none``)."""
    if holdout is None or len(holdout) == 0:
        return Evaluation(request.label, 0, 0, 0.0, reason=(why_none or "no held-out data")[:300])
    start = time.perf_counter()
    plan = request.as_plan()
    model = served_model(plan, ctx)
    counts = evaluate_counts(model, holdout.x, holdout.y, EVAL_BATCH, ctx.device, per_class=request.per_class)
    baseline_correct = -1
    if request.baseline is not None:  # the version served now, on the very same samples
        try:
            baseline = served_model(replace(plan, tensors=request.baseline), ctx)
            baseline_correct = evaluate_counts(baseline, holdout.x, holdout.y, EVAL_BATCH, ctx.device).correct
        except (KeyError, ValueError, RuntimeError) as exc:  # counted as not compared, the evaluation stands
            log.warning("the baseline of the %s evaluation could not be evaluated: %s", request.label, exc)
    return Evaluation(request.label, counts.samples, counts.correct, max(0.0, counts.loss_sum),
                      counts.class_counts, counts.class_correct, seconds=time.perf_counter() - start,
                      baseline_correct=baseline_correct)
