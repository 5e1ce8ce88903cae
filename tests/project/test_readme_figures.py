"""The README's accuracy figures come from bench/readme_figures.py, which runs the README's own
commands: the two must not drift apart (issue 36)."""

from __future__ import annotations

import importlib.util
from tests.support.paths import REPO_ROOT

ROOT = REPO_ROOT


def _bench():
    spec = importlib.util.spec_from_file_location("readme_figures", ROOT / "bench" / "readme_figures.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_bench_runs_the_readme_commands():
    bench, readme = _bench(), (ROOT / "README.md").read_text()
    for command in (bench.QUICK_START, bench.NON_IID):
        assert f"\n{command}\n" in readme, f"README.md no longer runs `{command}`: update bench/readme_figures.py"


def test_the_bench_parses_its_commands_like_edgefl():
    from edge_sdk.cli import build_parser

    bench = _bench()
    for command in (bench.QUICK_START, bench.NON_IID):
        args = build_parser().parse_args(command.split()[1:] + ["--threads", "1", "--seed", "2"])
        assert (args.command, args.threads, args.seed) == ("simulate", 1, 2)
