"""What makes a job the job it is, kept in its checkpoint: a resume (or a finished job asked again)
with a config that changes any of it is refused, key by key, rather than mixing two jobs.

Keys that need a new job (a new job name or ``checkpoint_dir``): the method and its options, the
model, the task (input shape and classes) and the seed. Keys that may change between runs of a
long job: pacing (rounds, deadlines, quorum, devices per round), evaluation, publishing, limits,
the broker and Home Assistant.
"""

from __future__ import annotations

from typing import Any, Mapping, Sequence

__all__ = ["NEW_JOB_KEYS", "refuse_another_job", "job_identity"]

#: the keys whose change needs a new job
NEW_JOB_KEYS = ("method", "options", "model", "input_shape", "num_classes", "seed")


def job_identity(method: str, options: Mapping[str, str], model: str, input_shape: Sequence[int],
                 num_classes: int, seed: int) -> dict[str, Any]:
    """The job's identity as plain data (stored in the checkpoint)."""
    return {"method": method, "options": {str(k): str(v) for k, v in sorted(options.items())}, "model": model,
            "input_shape": [int(n) for n in input_shape], "num_classes": int(num_classes), "seed": int(seed)}


def refuse_another_job(stored: Mapping[str, Any], current: Mapping[str, Any], where: str) -> None:
    """A one-line ValueError naming each key that differs (a checkpoint written before identities
    were kept holds none: nothing to compare)."""
    differ = [key for key in NEW_JOB_KEYS if key in stored and stored[key] != current.get(key)]
    if differ:
        changes = "; ".join(f"{key} was {stored[key]!r}, the config says {current.get(key)!r}" for key in differ)
        raise ValueError(f"{where} holds another job ({changes}): {', '.join(differ)} need a new job — a new job "
                         f"name or checkpoint_dir (pacing, evaluation, publishing and limits may change on resume)")
