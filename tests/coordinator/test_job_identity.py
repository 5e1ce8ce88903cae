"""A checkpoint knows its job: a resume with another method, model, task or seed is refused key by
key; pacing, evaluation and publishing may change."""

from __future__ import annotations

import numpy as np
import pytest

from coordinator.runtime.job_identity import refuse_another_job, job_identity
from coordinator.runtime.state import load_checkpoint, save_checkpoint


def _job(**changes):
    base = dict(method="flanc", options={"widths": "0.5,1"}, model="cnn4", input_shape=(1, 28, 28),
                num_classes=10, seed=0)
    return job_identity(**{**base, **changes})


def test_the_identity_travels_in_the_checkpoint(tmp_path) -> None:
    save_checkpoint(tmp_path, "flanc", 3, [], {"w": np.zeros(2, np.float32)}, _job())
    loaded = load_checkpoint(tmp_path)
    assert loaded is not None and loaded.job == _job()
    refuse_another_job(loaded.job, _job(), "here")  # the same job: nothing said


@pytest.mark.parametrize("change, words", [
    ({"model": "mlp"}, "model was 'cnn4', the config says 'mlp'"),
    ({"seed": 1}, "seed was 0, the config says 1"),
    ({"num_classes": 5}, "num_classes was 10, the config says 5"),
    ({"input_shape": (1, 24)}, "input_shape was [1, 28, 28], the config says [1, 24]"),
    ({"options": {"widths": "1"}}, "options was {'widths': '0.5,1'}, the config says {'widths': '1'}"),
])
def test_another_job_is_refused_naming_the_key(change, words) -> None:
    with pytest.raises(ValueError, match="need a new job") as caught:
        refuse_another_job(_job(), _job(**change), "the checkpoint in ck")
    assert words in str(caught.value) and str(caught.value).startswith("the checkpoint in ck holds another job")


def test_an_older_checkpoint_without_an_identity_resumes(tmp_path) -> None:
    save_checkpoint(tmp_path, "flanc", 0, [], {})
    loaded = load_checkpoint(tmp_path)
    assert loaded is not None and loaded.job == {}
    refuse_another_job(loaded.job, _job(model="mlp"), "here")
