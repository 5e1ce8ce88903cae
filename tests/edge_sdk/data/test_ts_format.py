"""The .ts parser reads the archive's classification files (variable length where the header
says so) and refuses a malformed one with a one-line error naming its line; the sensor datasets
come from the .ts files sktime ships, at one length, with the archive's own split."""
from __future__ import annotations

import importlib.util

import numpy as np
import pytest

from edge_sdk.data.datasets import load_dataset
from edge_sdk.data.sensor_datasets import PLAID_LENGTH, resample
from edge_sdk.data.ts_format import TsFormatError, parse_ts, read_ts

HEADER = """# a comment
@problemName Toy
@timeStamps false
@missing false
@univariate false
@dimensions 2
@equalLength {equal}
@classLabel true walk run
@data
"""


def toy(cases: str, equal: str = "true") -> str:
    return HEADER.format(equal=equal) + cases


def test_a_multichannel_file_is_read_in_the_header_order_of_its_labels() -> None:
    data = parse_ts(toy("1,2,3:4,5,6:run\n0.5,-1e-3,7:8,9,10:walk\n"))
    assert data.name == "Toy" and data.classes == ("walk", "run") and data.channels == 2
    np.testing.assert_array_equal(data.labels, [1, 0])
    np.testing.assert_array_equal(data.series[1], np.array([[0.5, -1e-3, 7], [8, 9, 10]], np.float32))
    assert data.series[0].dtype == np.float32


def test_variable_length_is_legal_where_the_header_says_so() -> None:
    data = parse_ts(toy("1,2,3:4,5,6:run\n1,2:3,4:walk\n", equal="false"))
    assert data.lengths().tolist() == [3, 2] and not data.equal_length


@pytest.mark.parametrize(("text", "match"), [
    (HEADER.format(equal="true").replace("@data\n", "") + "1,2:3,4:run\n", r"line 9: expected an @key line"),
    (HEADER.format(equal="true").replace("@data\n", ""), "no @data line"),
    (toy("1,2,3:4,5,6:run\n1,2,3:walk\n"), "line 11: 1 channels, the cases before have 2"),
    (toy("1,2,3:4,5,6:run\n1,2:3,4:walk\n"), "@equalLength true, but case 2 has 2 values"),
    (toy("1,2,x:4,5,6:run\n"), "line 10: channel 1 value 3 is not a number: 'x'"),
    (toy("1,2,?:4,5,6:run\n"), "line 10: a missing value"),
    (toy("1,2,3:4,5,6:jump\n"), "line 10: class label 'jump' is not one the header declares"),
    (toy("1,2,3:4,5:run\n", equal="false"), "line 10: its channels differ in length"),
    (toy("1,2,inf:4,5,6:run\n"), "not finite"),
    (toy(""), "no cases after @data"),
    (HEADER.format(equal="true").replace("@classLabel true walk run", "@classLabel false"), "line 8"),
    (HEADER.format(equal="true").replace("@timeStamps false", "@timeStamps true"), "line 3: @timeStamps true"),
    (HEADER.format(equal="true").replace("@missing false", "@colour red"), "line 4: unknown header @colour"),
])
def test_a_malformed_file_is_refused_naming_its_line(text: str, match: str) -> None:
    with pytest.raises(TsFormatError, match=match) as info:
        parse_ts(text, "toy.ts")
    assert "\n" not in str(info.value) and str(info.value).startswith("toy.ts")


def test_missing_values_are_nan_where_the_header_allows_them(tmp_path) -> None:
    path = tmp_path / "m.ts"
    path.write_text(toy("1,?,3:4,5,6:run\n").replace("@missing false", "@missing true"))
    assert np.isnan(read_ts(path).series[0][0, 1])
    with pytest.raises(FileNotFoundError, match="no such .ts file"):
        read_ts(tmp_path / "absent.ts")


def test_resampling_keeps_the_span_and_interpolates_linearly() -> None:
    series = np.array([[0.0, 10.0, 20.0], [1.0, 1.0, 1.0]], np.float32)
    out = resample(series, 5)
    np.testing.assert_allclose(out, [[0, 5, 10, 15, 20], [1, 1, 1, 1, 1]])
    assert resample(series, 3) is not None and resample(series, 3).shape == (2, 3)


needs_sktime = pytest.mark.skipif(importlib.util.find_spec("sktime") is None,
                                  reason="the sensors extra (sktime) is not installed")


@needs_sktime
@pytest.mark.parametrize(("name", "shape", "train", "classes"), [
    ("plaid", (1, PLAID_LENGTH), 537, 11), ("acsf1", (1, 1460), 100, 10), ("basicmotions", (6, 100), 40, 4)])
def test_the_sensor_datasets_load_at_one_length_with_the_archive_split(name, shape, train, classes) -> None:
    data = load_dataset(name)
    assert data.input_shape == shape and len(data.x_train) == train and data.num_classes == classes
    assert len(data.classes) == classes and np.isfinite(data.x_train).all()
    np.testing.assert_allclose(data.x_train.mean(axis=(0, 2)), 0, atol=1e-4)  # normalised per channel
    assert data.preprocessing.input_shape == shape
    assert data.preprocessing.repeat == (name == "plaid")  # its series vary: the published model repeats/cuts
    assert not data.preprocessing.resample
