"""bench/source_reread.py keeps working (a few hundred rows here; BENCHMARKS.md has the 100,000-row figure)."""

from __future__ import annotations

import re
import sys

from tests.support.paths import REPO_ROOT
sys.path.insert(0, str(REPO_ROOT / "bench"))
import source_reread  # noqa: E402


def test_the_bench_reads_both_sources_and_prints_the_medians(capsys):
    assert source_reread.main(["--rows", "300", "--features", "4", "--repeats", "2"]) == 0
    out = capsys.readouterr().out
    assert re.search(r"^sqlite re-read of 300 rows x 4 features: median \d+\.\d{3} s", out, re.M), out
    assert re.search(r"^csv full parse of the same rows: median \d+\.\d{3} s", out, re.M), out
