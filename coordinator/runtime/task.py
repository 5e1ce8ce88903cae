"""What a job learns, as the coordinator knows it without any data: one input's shape and the number
of classes — the TOML's ``[task]``, or the held-out dataset's when the coordinator has one. It is
the authority: a device whose data is of another task is refused at registration (``task_mismatch``),
whatever it says, and the job goes on with the others."""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["Task"]


@dataclass(frozen=True)
class Task:
    """One input's shape (no batch axis) and the number of classes."""

    input_shape: tuple[int, ...]
    num_classes: int

    def __post_init__(self) -> None:
        shape = self.input_shape
        if not isinstance(shape, tuple) or not 1 <= len(shape) <= 8 \
                or not all(type(n) is int and n >= 1 for n in shape):
            raise ValueError(f"input_shape must be 1 to 8 positive integers, got {shape!r}")
        if type(self.num_classes) is not int or self.num_classes < 2:
            raise ValueError(f"num_classes must be an integer >= 2, got {self.num_classes!r}")

    def refuses(self, input_shape: tuple[int, ...], num_classes: int) -> str | None:
        """Why a device whose data is ``input_shape`` and ``num_classes`` cannot join (None: it can).
        A device that says nothing (an SDK before 0.3: ``()`` and 0) is taken at its word later,
        when its update is checked; one whose data has fewer classes is fine (not every home sees
        every class)."""
        said_shape = tuple(input_shape)
        if said_shape and said_shape != self.input_shape:
            return (f"this job's task takes inputs of shape {self.input_shape}; this device's data has "
                    f"{said_shape} (check its [data] source)")
        if num_classes > self.num_classes:
            return (f"this job's task has {self.num_classes} classes; this device's data has {num_classes} "
                    f"(check its [data] source and labels)")
        return None
