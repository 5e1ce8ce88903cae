"""A model family's own training (edge_sdk/family_recipe.py) fills only what a job left unset."""

from __future__ import annotations

from edge_sdk.family_recipe import FAMILY_RECIPES, chosen_settings, with_family_recipe
from edge_sdk.train_config import TrainConfig


def test_minirocket_takes_its_recipe_where_the_job_set_nothing() -> None:
    train, options, filled = with_family_recipe("minirocket", "fedavg", TrainConfig(epochs=5), {}, chosen=("epochs",))
    assert (train.loss, train.lr, train.momentum, train.epochs) == ("squared", 0.004, 0.9, 5)
    assert options == {"server_opt": "fedavgm", "server_lr": "1"}
    assert filled == {"loss": "squared", "lr": 0.004, "momentum": 0.9, "server_opt": "fedavgm", "server_lr": "1"}


def test_what_the_job_set_stays_even_at_the_generic_default() -> None:
    # --lr 0.05 on the command line is the generic default, and still the user's choice
    train, options, filled = with_family_recipe("minirocket", "fedprox", TrainConfig(lr=0.05), {"prox_mu": "0.01"},
                                                chosen=("lr", "prox_mu"))
    assert (train.lr, train.loss, train.momentum) == (0.05, "squared", 0.9)
    assert options == {"prox_mu": "0.01", "server_opt": "fedavgm", "server_lr": "1"} and "lr" not in filled


def test_a_job_that_names_the_server_optimizer_in_any_way_keeps_its_own() -> None:
    for chosen in ({"server_opt": "none"}, {"server_lr": "0.5"}, {"server_momentum": "0.5"}):
        _, options, filled = with_family_recipe("minirocket", "fedavg", TrainConfig(), chosen, chosen=tuple(chosen))
        assert options == chosen and "server_opt" not in filled


def test_other_families_and_methods_are_left_as_they_are() -> None:
    train, options, filled = with_family_recipe("cnn4", "fedavg", TrainConfig(), {}, chosen=())
    assert train == TrainConfig() and options == {} and filled == {}
    # the recipe's options are fedavg's, fedprox's and heterofl's: another method takes only the training
    _, options, filled = with_family_recipe("minirocket", "flanc", TrainConfig(), {}, chosen=())
    assert options == {} and set(filled) == set(FAMILY_RECIPES["minirocket"].train)


def test_fedpara_takes_the_loss_and_server_momentum_but_keeps_its_own_optimizer() -> None:
    """FedPara trains with Adam at its own lr: the recipe's SGD lr and momentum are not said to be its."""
    for method in ("fedpara", "pfedpara"):
        train, options, filled = with_family_recipe("minirocket", method, TrainConfig(), {}, chosen=())
        assert (train.loss, train.lr, train.momentum) == ("squared", TrainConfig().lr, TrainConfig().momentum)
        assert filled == {"loss": "squared", "server_opt": "fedavgm", "server_lr": "1"}
        assert options == {"server_opt": "fedavgm", "server_lr": "1"}


def test_heterofl_takes_nested_and_server_momentum_each_unless_set() -> None:
    _, options, _ = with_family_recipe("minirocket", "heterofl", TrainConfig(), {}, chosen=())
    assert options == {"server_opt": "fedavgm", "server_lr": "1", "nested": "true"}
    _, options, _ = with_family_recipe("minirocket", "heterofl", TrainConfig(), {"server_opt": "none"},
                                       chosen=("server_opt",))
    assert options == {"server_opt": "none", "nested": "true"}
    _, options, _ = with_family_recipe("minirocket", "heterofl", TrainConfig(), {"nested": "false"}, chosen=("nested",))
    assert options == {"nested": "false", "server_opt": "fedavgm", "server_lr": "1"}


def test_a_job_built_in_python_chose_what_differs_from_the_defaults() -> None:
    assert chosen_settings(TrainConfig(), {}) == frozenset()
    assert chosen_settings(TrainConfig(lr=0.01, epochs=3), {"clip": "none"}) == {"lr", "epochs", "clip"}


def test_reft_takes_the_recipes_sgd_for_its_devices_and_no_server_optimizer() -> None:
    """REFT averages no weights (a server option is refused) and trains with its own local_optimizer and
    local_lr: the recipe names those."""
    train, options, filled = with_family_recipe("minirocket", "reft", TrainConfig(), {}, chosen=())
    assert train.loss == "squared" and options == {"local_optimizer": "sgd", "local_lr": "0.004", "local_epochs": "150"}
    assert not any(key.startswith("server_") for key in filled)
    _, options, _ = with_family_recipe("minirocket", "reft", TrainConfig(), {"local_lr": "0.01"}, chosen=("local_lr",))
    assert options == {"local_lr": "0.01", "local_optimizer": "sgd", "local_epochs": "150"}
    # one-shot: its devices train once, 150 epochs, unless the job said how long (--local-epochs: the run's)
    train, options, _ = with_family_recipe("minirocket", "reft", TrainConfig(epochs=5), {}, chosen=("epochs",))
    assert train.epochs == 5 and "local_epochs" not in options
    _, options, _ = with_family_recipe("minirocket", "reft", TrainConfig(), {"oneshot": "false"}, chosen=("oneshot",))
    assert "local_epochs" not in options  # not 150 epochs in every one of its rounds
    _, options, _ = with_family_recipe("minirocket", "reft", TrainConfig(), {"local_optimizer": "adam"},
                                       chosen=("local_optimizer",))
    assert options == {"local_optimizer": "adam", "local_epochs": "150"}  # SGD's lr is not Adam's
