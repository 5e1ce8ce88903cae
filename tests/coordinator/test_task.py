"""The job's task is the coordinator's to say: a device's data of another task is refused."""

from __future__ import annotations

import pytest

from coordinator.runtime.task import Task


def test_a_device_of_the_task_joins_and_one_of_another_is_told_why() -> None:
    task = Task((1, 28, 28), 10)
    assert task.refuses((1, 28, 28), 10) is None
    assert task.refuses((1, 28, 28), 3) is None  # a home that sees only 3 of the 10 classes
    assert task.refuses((), 0) is None  # an SDK before 0.3 says nothing: its updates are still checked
    assert "takes inputs of shape (1, 28, 28); this device's data has (3, 32, 32)" in task.refuses((3, 32, 32), 10)
    assert "has 10 classes; this device's data has 11" in task.refuses((1, 28, 28), 11)


@pytest.mark.parametrize("shape, classes, words", [
    ((), 10, "input_shape"), ((1, 0), 10, "input_shape"), ([1, 28], 10, "input_shape"), ((1,) * 9, 10, "input_shape"),
    ((1, 28, 28), 1, "num_classes"), ((1, 28, 28), 2.0, "num_classes"),
])
def test_an_impossible_task_is_refused(shape, classes, words) -> None:
    with pytest.raises(ValueError, match=words):
        Task(shape, classes)
