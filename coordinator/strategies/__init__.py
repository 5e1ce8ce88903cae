"""The coordinator halves of the federated methods, one per module, found from the registry.

:data:`STRATEGIES` maps every method of :data:`edge_sdk.methods.registry.METHODS` to its strategy
class, imported when it is first looked up (importing this package imports none of them).
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping

from edge_sdk.methods.registry import METHODS, load_entry
from edge_sdk.model_names import MINIROCKET_METHODS
from edge_sdk.models.spec_file import is_spec_file

from coordinator.strategies.base import Strategy, StrategyContext

__all__ = ["STRATEGIES", "create_strategy", "strategy_class"]


class _Strategies(Mapping[str, type[Strategy]]):
    """Method name -> its strategy class, imported from the registry's entry when looked up."""

    def __init__(self) -> None:
        self._loaded: dict[str, type[Strategy]] = {}

    def __getitem__(self, name: str) -> type[Strategy]:
        if name not in self._loaded:
            cls = load_entry(METHODS[name].strategy)
            if not (isinstance(cls, type) and issubclass(cls, Strategy) and cls.name == name):
                raise TypeError(f"the registry's strategy of {name!r}, {METHODS[name].strategy}, is not a "
                                f"Strategy named {name!r}")
            self._loaded[name] = cls
        return self._loaded[name]

    def __iter__(self) -> Iterator[str]:
        return iter(METHODS)

    def __len__(self) -> int:
        return len(METHODS)


#: Every method of the registry, by name: its strategy class.
STRATEGIES: Mapping[str, type[Strategy]] = _Strategies()


def strategy_class(name: str) -> type[Strategy]:
    """The strategy registered as `name`; ValueError lists the known ones."""
    try:
        return STRATEGIES[name]
    except KeyError:
        raise ValueError(f"unknown method {name!r}; known: {sorted(STRATEGIES)}") from None


def create_strategy(name: str, ctx: StrategyContext) -> Strategy:
    """Build the strategy `name` from `ctx`; a model spec file (``spec:FILE``) only for the methods
    that can take one (ValueError, one line, naming those that can)."""
    cls = strategy_class(name)
    if is_spec_file(ctx.model_family) and not cls.spec_file_support:
        takers = sorted(n for n, c in STRATEGIES.items() if c.spec_file_support)
        raise ValueError(f"{name} composes its networks from a model family (cnn4, flanc_cnn, mlp, resnet_small) "
                         f"and cannot compress the layers of {ctx.model_family}; with a spec file use "
                         f"{', '.join(takers)}")
    if ctx.model_family == "minirocket" and name not in MINIROCKET_METHODS:
        raise ValueError(f"{name} cannot train minirocket (its head, the only part that trains, is one linear layer of "
                         f"about 10,000 inputs and one output per class: no layer to compose, prune or factorise "
                         f"usefully); use {', '.join(MINIROCKET_METHODS)}, or --model cnn1d")
    if ctx.model_family == "minirocket" and cls.state_spec is Strategy.state_spec:
        # the round loop finds the layer whose biases it fits through state_spec: without one they stay zero
        raise ValueError(f"{name} cannot train minirocket: it names no network for the round loop to fit the "
                         "transform's biases in (Strategy.state_spec)")
    return cls.create(ctx)
