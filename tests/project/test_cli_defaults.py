"""One default per setting: a command line reads its defaults from the dataclass that holds them
(``edgefl simulate``: `simulation.defaults.SIMULATION`; ``edgefl profile`` and ``predict``:
`edge_sdk.command_defaults.DEVICE_COMMANDS`), never from a literal of its own."""

from __future__ import annotations

import ast

import pytest

from edge_sdk.train_config import TrainConfig
from simulation.defaults import SIMULATION
from tests.support.paths import REPO_ROOT

ROOT = REPO_ROOT
#: the command lines checked
CLIS = ("simulation/cli.py", "coordinator/cli.py", "edge_sdk/cli.py")
#: literal defaults that hold no setting: "not given", an -v count from 0, predict's "-" (stdin)
NOT_A_SETTING = (None, False, True, 0, "-")


def literal_defaults(source: str) -> list[tuple[int, str]]:
    """(line, option) of every ``add_argument(..., default=<literal>)`` that states a value."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if not (isinstance(node, ast.Call) and getattr(node.func, "attr", "") == "add_argument"):
            continue
        for keyword in node.keywords:
            value = keyword.value
            if keyword.arg != "default":
                continue
            if isinstance(value, ast.Constant) and value.value not in NOT_A_SETTING:
                found.append((node.lineno, ast.unparse(node.args[0]) if node.args else "?"))
            elif isinstance(value, (ast.Tuple, ast.List)) and value.elts or isinstance(value, ast.Dict) and value.keys:
                found.append((node.lineno, ast.unparse(node.args[0]) if node.args else "?"))
    return found


@pytest.mark.parametrize("path", CLIS)
def test_no_command_line_default_is_a_literal(path) -> None:
    assert literal_defaults((ROOT / path).read_text()) == []


def test_a_literal_default_would_be_caught() -> None:
    source = "p.add_argument('--rounds', type=int, default=3)\np.add_argument('--x', default=None)\n"
    assert literal_defaults(source) == [(1, "'--rounds'")]


def test_simulate_without_options_is_the_simulation_defaults() -> None:
    from edge_sdk.cli import build_parser
    from edge_sdk.data.holdout import NO_HOLDOUT

    args = build_parser().parse_args(["simulate"])
    assert (args.method, args.clients, args.rounds, args.dataset, args.model, args.holdout) == (
        SIMULATION.method, SIMULATION.clients, SIMULATION.rounds, SIMULATION.dataset, SIMULATION.model,
        SIMULATION.holdout)
    from simulation.cli import train_from_args

    # a training flag left out is the simulation's default, and not the command line's choice: the model
    # family's recipe may fill it (edge_sdk/family_recipe.py)
    assert train_from_args(args) == (SIMULATION.train, set())
    train, chosen = train_from_args(build_parser().parse_args(["simulate", "--lr", str(SIMULATION.train.lr),
                                                               "--local-epochs", "4"]))
    assert (train.lr, train.epochs, chosen) == (SIMULATION.train.lr, 4, {"lr", "epochs"})
    # where a simulation differs from a real fleet, it does so on purpose and says so (defaults.py)
    assert SIMULATION.train.epochs != TrainConfig().epochs and SIMULATION.holdout == NO_HOLDOUT


def test_the_api_reads_the_same_defaults() -> None:
    from simulation.config import SimulationConfig, sim_federation

    config = SimulationConfig()
    assert (config.method, config.clients, config.dataset, config.partition, config.model, config.holdout) == (
        SIMULATION.method, SIMULATION.clients, SIMULATION.dataset, SIMULATION.partition, SIMULATION.model,
        SIMULATION.holdout)
    assert sim_federation().rounds == SIMULATION.rounds


def test_the_device_commands_and_what_they_call_read_the_same_defaults() -> None:
    import inspect

    from edge_sdk.cli import build_parser
    from edge_sdk.command_defaults import DEVICE_COMMANDS
    from edge_sdk.inference import OnnxClassifier
    from edge_sdk.profiling import measure_device

    profile = build_parser().parse_args(["profile"])
    predict = build_parser().parse_args(["predict"])
    assert (profile.name, profile.seconds) == (DEVICE_COMMANDS.profile_name, DEVICE_COMMANDS.measure_seconds)
    assert (predict.top, predict.batch_size) == (DEVICE_COMMANDS.predict_top, DEVICE_COMMANDS.predict_batch_size)
    measure = inspect.signature(measure_device).parameters
    assert (measure["name"].default, measure["seconds"].default) == (profile.name, profile.seconds)
    assert inspect.signature(OnnxClassifier.predict).parameters["batch_size"].default == predict.batch_size
