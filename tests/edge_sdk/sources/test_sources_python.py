"""The user's own loader (issue 38, part 3): python = "module:function" returning (x, y) or
(x, y, keys); one that does not import or returns the wrong types is one line naming the key."""

from __future__ import annotations

import itertools
import logging
import textwrap

import numpy as np
import pytest

from edge_sdk.sources import NoData, PythonSource, ReadOptions
from edge_sdk.sources.keys import hash_samples

_names = itertools.count()


def _loader(tmp_path, body):
    """A module in tmp_path/loaders with a unique name; returns its "module:load" spec and folder."""
    folder = tmp_path / "loaders"
    folder.mkdir(exist_ok=True)
    name = f"edgefl_test_loader_{next(_names)}"
    (folder / f"{name}.py").write_text("import numpy as np\n" + textwrap.dedent(body))
    return f"{name}:load", folder


def test_x_y_get_hash_keys_and_the_last_sample_is_newest(tmp_path):
    spec, folder = _loader(tmp_path, """
        def load():
            return np.arange(12, dtype=np.float64).reshape(4, 3), [0, 1, 1, 0]
    """)
    read = PythonSource(spec, folder).read()
    x = np.arange(12, dtype=np.float32).reshape(4, 3)
    assert read.data.x.tolist() == x[::-1].tolist() and read.data.y.tolist() == [0, 1, 1, 0]
    assert read.data.keys.tolist() == hash_samples(x[::-1]).tolist()
    assert read.data.num_classes == 2 and read.data.preprocessing.mean == (0.0,) * 3


def test_keys_returned_by_the_loader_are_kept_and_stable_as_its_data_grows(tmp_path):
    rows = tmp_path / "rows.txt"
    rows.write_text("3\n")
    spec, folder = _loader(tmp_path, f"""
        def load():
            n = int(open({str(rows)!r}).read())
            return np.ones((n, 2)) * np.arange(n)[:, None], ["on", "off"] * (n // 2) + ["on"] * (n % 2), 100 + np.arange(n)
    """)
    source = PythonSource(spec, folder, ReadOptions(classes=("off", "on")))
    assert source.read().data.keys.tolist() == [102, 101, 100]
    rows.write_text("6\n")
    grown = source.read().data
    assert grown.keys.tolist() == [105, 104, 103, 102, 101, 100]
    assert grown.x[3:, 0].tolist() == [2.0, 1.0, 0.0]  # the old samples under the old keys
    assert PythonSource(spec, folder, ReadOptions(classes=("off", "on"), max_samples=2)).read().data.keys.tolist() \
        == [105, 104]


def test_input_shape_and_bad_samples(tmp_path, caplog):
    spec, folder = _loader(tmp_path, """
        def load():
            x = np.ones((4, 8))
            x[1, 3] = np.nan
            return x, np.array([0, 1, 9, 1])
    """)
    with caplog.at_level(logging.WARNING, logger="edge_sdk.sources"):
        read = PythonSource(spec, folder, ReadOptions(input_shape=(2, 4), num_classes=2)).read()
    assert read.data.x.shape == (2, 2, 4) and read.skipped == {"NaN": 1, "label not a class": 1}
    assert [r.getMessage() for r in caplog.records if r.name == "edge_sdk.sources"] == [
        f"skipped 2 rows of [data] python {spec}: 1 NaN, 1 label not a class"]


@pytest.mark.parametrize("body, words", [
    ("import no_such_module_anywhere\ndef load(): pass\n", "cannot import"),
    ("def load(:\n", "cannot import"),
    ("def other(): pass\n", "has no function load"),
    ("def load(): return 'x', 'y'\n", "returned x of dtype <U1"),
    ("def load(): return np.zeros((3, 2))\n", "returned ndarray; expected a tuple (x, y) or (x, y, keys)"),
    ("def load(): return np.zeros((3, 2)), np.zeros(2, int)\n", "returned y of dtype int64 and shape (2,)"),
    ("def load(): return np.zeros((3, 2)), np.zeros(3, int), np.zeros(3)\n", "returned keys of dtype float64"),
    ("def load(): return [[1, 2], [3]], [0, 1]\n", "not arrays"),
    ("def load(): raise RuntimeError('sensor offline')\n", "raised RuntimeError: sensor offline"),
])
def test_a_broken_loader_is_one_line_naming_the_key(tmp_path, body, words):
    spec, folder = _loader(tmp_path, body)
    with pytest.raises(ValueError) as info:
        PythonSource(spec, folder).read()
    assert str(info.value).startswith(f"[data] python {spec}") and words in str(info.value)
    assert "\n" not in str(info.value)


def test_no_samples_or_a_missing_file_is_no_data(tmp_path):
    spec, folder = _loader(tmp_path, "def load(): return np.zeros((0, 3)), np.zeros(0, int)\n")
    with pytest.raises(NoData, match="returned no samples"):
        PythonSource(spec, folder).read()
    spec, folder = _loader(tmp_path, "def load(): return np.load('/nonexistent/data.npy'), [0]\n")
    with pytest.raises(NoData, match="FileNotFoundError"):
        PythonSource(spec, folder).read()


def test_python_path_is_only_on_sys_path_for_the_import(tmp_path):
    import sys

    spec, folder = _loader(tmp_path, "def load(): return np.ones((1, 1)), [0]\n")
    PythonSource(spec, folder).read()
    assert str(folder) not in sys.path


@pytest.mark.parametrize("spec", ["module", "module:", ":load", "a b:load", "mod:load()", "../x:load"])
def test_a_spec_that_is_not_module_colon_function_is_refused(spec):
    with pytest.raises(ValueError, match=r'\[data\] python must be "module:function"'):
        PythonSource(spec)
