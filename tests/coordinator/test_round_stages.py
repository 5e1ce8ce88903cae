"""A round made of sequential stages is reported as one record."""

from __future__ import annotations

from coordinator.runtime.report import RoundRecord, merge_stages


def _stage(participants, down, up, seconds, acc, metrics):
    return RoundRecord(round=4, accuracy={"big": acc}, loss=1.0, bytes_down=down, bytes_up=up, seconds=seconds,
                       host_seconds=seconds / 10, participants=participants, aggregated=bool(participants),
                       metrics=metrics)


def test_stages_add_up_bytes_time_and_uploads_and_keep_the_last_evaluation():
    big = _stage(["b1"], 100, 40, 3.0, 0.5, {"up_params": 10.0, "train_loss": 2.0})
    small = _stage(["s1", "s2"], 50, 20, 2.0, 0.7, {"up_params": 4.0, "train_loss": 1.5})
    merged = merge_stages([big, small])
    assert (merged.bytes_down, merged.bytes_up, merged.seconds) == (150, 60, 5.0)
    assert merged.participants == ["b1", "s1", "s2"] and merged.aggregated
    assert merged.metrics == {"up_params": 14.0, "train_loss": 1.5}
    assert merged.accuracy == {"big": 0.7} and merged.round == 4
    assert merge_stages([big]) is big
