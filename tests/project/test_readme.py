"""README.md is the front door: its set-up commands are the ones CI runs."""

from __future__ import annotations

import re
from tests.support.paths import REPO_ROOT

ROOT = REPO_ROOT


def _quick_start_commands() -> list[str]:
    text = (ROOT / "README.md").read_text()
    section = text.split("## Quick start", 1)[1]
    first_block = re.search(r"```bash\n(.*?)```", section, re.S).group(1)
    return [line.strip() for line in first_block.splitlines() if line.strip()]


def test_readme_has_exactly_two_setup_commands_and_ci_runs_them():
    commands = _quick_start_commands()
    assert len(commands) == 2, commands
    install, test = commands
    ci = (ROOT / ".ci" / "run").read_text()
    ci_lines = [line.strip() for line in ci.splitlines()]
    # CI may spell pip as `python -m pip`, nothing else differs
    assert install.replace("pip install", "python -m pip install", 1) in ci_lines
    assert test in ci_lines
    # ...inside the fresh virtual environment the README asks for, made before them
    venv = re.search(r"fresh virtual\s+environment \(`([^`]+)`\)", (ROOT / "README.md").read_text()).group(1)
    assert venv in ci_lines
    assert ci_lines.index(venv) < ci_lines.index(test)


def test_readme_simulate_example_uses_real_options():
    from edge_sdk.cli import build_parser

    text = (ROOT / "README.md").read_text()
    example = re.search(r"^edgefl simulate .*$", text, re.M).group(0)
    args = build_parser().parse_args(example.split()[1:])
    assert args.command == "simulate" and args.method == "fedavg"
