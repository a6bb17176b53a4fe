"""Training hyper-parameters searched with the architecture (`training.search`).

A `RecipeSpace` is the study's architecture space with flat parameters `train.<name>`
beside the architecture's, so that every sampling searcher (random, evolution, TPE,
NSGA-II, Ax) draws a recipe with each architecture: a learning rate is a categorical of
values on a log grid over its range (`grid` points), weight decay and batch size are the
listed choices. `decode` gives the architecture, `recipe` the hyper-parameters that train
it. The searched learning rates are the rates at `training.batch_size`: a trial with
another batch size trains at lr x sqrt(batch_size / training.batch_size), for Adam and
Adagrad alike (their updates' noise scales with the square root of the batch), so a
searched rate means the same at every batch size.
"""

from __future__ import annotations

import json
import math
import random
from collections.abc import Callable
from typing import Any

from search_space.architecture import Architecture, digest
from search_space.spaces.base import Categorical, Parameter, SearchSpace, nearest

PREFIX = "train."
LOG_SEARCHED = ("dense_lr", "sparse_lr")
LISTED = ("weight_decay", "batch_size")


def log_grid(low: float, high: float, points: int) -> tuple[float, ...]:
    """`points` values from `low` to `high`, evenly spaced in log, two significant digits."""
    if points == 1 or low == high:
        return (float(f"{low:.2g}"),)
    ratio = math.log(high / low) / (points - 1)
    return tuple(dict.fromkeys(float(f"{low * math.exp(ratio * i):.2g}") for i in range(points)))


def recipe_parameters(search: Any) -> dict[str, Parameter]:
    """The `train.*` parameters of a `training.search` section (nas.config)."""
    params: dict[str, Parameter] = {}
    for name in LOG_SEARCHED:
        span = getattr(search, name)
        if span is not None:
            params[PREFIX + name] = Categorical(log_grid(span.low, span.high, search.grid))
    for name in LISTED:
        choices = getattr(search, name)
        if choices:
            params[PREFIX + name] = Categorical(tuple(choices))
    return params


class RecipeSpace(SearchSpace):
    """`space`'s parameters and the recipe's (`recipe_parameters`); `base` holds the study's
    own training values (dense_lr, sparse_lr, weight_decay, batch_size): a recipe leaves
    unsearched ones as they are, and starting points and encoded architectures start at
    the grid points nearest to them."""

    def __init__(
        self, space: SearchSpace, searched: dict[str, Parameter], base: dict[str, Any]
    ) -> None:
        self.inner, self.searched, self.base = space, searched, base
        self.type_name = space.type_name
        self.schema, self.config = space.schema, space.config
        self._parameters = space.parameters() | searched

    def __getattr__(self, name: str) -> Any:  # the inner space's own (an around space's base)
        if name == "inner":
            raise AttributeError(name)
        return getattr(self.inner, name)

    def _build_parameters(self) -> dict[str, Parameter]:
        return self._parameters

    def _decode_blocks(self, values, dim):
        return self.inner._decode_blocks(values, dim)

    def _encode_blocks(self, arch: Architecture) -> dict[str, Any]:
        return self.inner._encode_blocks(arch)

    def _architecture_values(self, values: dict[str, Any]) -> dict[str, Any]:
        return {k: v for k, v in values.items() if not k.startswith(PREFIX)}

    def decode(self, values: dict[str, Any]) -> Architecture:
        self.check_values(values)
        return self.inner.decode(self._architecture_values(values))

    def encode(self, arch: Architecture) -> dict[str, Any]:
        return self.inner.encode(arch) | self.base_values()

    def active(self, values: dict[str, Any]) -> list[str]:
        return self.inner.active(self._architecture_values(values)) + list(self.searched)

    def identity(self, values: dict[str, Any]) -> str:
        return f"{digest(self.decode(values))}:{recipe_key(self.recipe(values))}"

    def starting_points(
        self, count: int, seed: int, admits: Callable[[dict[str, Any]], bool] = lambda v: True
    ) -> list[dict[str, Any]]:
        start = self.base_values()
        points = self.inner.starting_points(count, seed, lambda v: admits(v | start))
        return [p | start for p in points]

    def mutate_values(
        self, values: dict[str, Any], rng: random.Random, tries: int = 20
    ) -> dict[str, Any]:
        """One active parameter changed: the architecture's (as its space mutates) or the
        recipe's, chosen in proportion to how many each has."""
        names = [n for n in self.active(values) if len(self._parameters[n].choices) > 1]
        name = rng.choice(names)
        if name in self.searched:
            choices = [c for c in self._parameters[name].choices if c != values[name]]
            return values | {name: rng.choice(choices)}
        inner = self.inner.mutate_values(self._architecture_values(values), rng, tries)
        return inner | {k: v for k, v in values.items() if k.startswith(PREFIX)}

    def base_values(self) -> dict[str, Any]:
        """The grid points nearest to the study's own training values."""
        return nearest_values(self.searched, self.base)

    def recipe(self, values: dict[str, Any]) -> dict[str, Any]:
        """The hyper-parameters a trial of `values` trains with (`recipe_of`)."""
        return recipe_of(self.base, {n: values[n] for n in self.searched})


def recipe_of(base: dict[str, Any], values: dict[str, Any]) -> dict[str, Any]:
    """The hyper-parameters that `values` (`train.*` parameters) train with: the searched
    ones, the learning rates scaled to the batch size, the rest `base`'s."""
    chosen = base | {n[len(PREFIX) :]: v for n, v in values.items() if n.startswith(PREFIX)}
    scale = math.sqrt(chosen["batch_size"] / base["batch_size"])
    for name in LOG_SEARCHED:
        chosen[name] = float(f"{chosen[name] * scale:.4g}")
    return chosen


def base_recipe(training: Any) -> dict[str, Any]:
    """A `training` section's own hyper-parameters, the ones a recipe may search."""
    return {name: getattr(training, name) for name in (*LOG_SEARCHED, *LISTED)}


def nearest_values(searched: dict[str, Parameter], base: dict[str, Any]) -> dict[str, Any]:
    """The grid points of `searched` nearest to `base`'s values."""
    return {n: nearest(p.choices, base[n[len(PREFIX) :]]) for n, p in searched.items()}


def recipe_key(recipe: dict[str, Any] | None) -> str:
    """A stable text of a recipe, for telling trials of one architecture apart."""
    return "" if not recipe else json.dumps(recipe, sort_keys=True)


def with_recipe(space: SearchSpace, training: Any) -> SearchSpace:
    """`space`, with `training.search`'s hyper-parameters beside it when there are any."""
    if training.search is None:
        return space
    return RecipeSpace(space, recipe_parameters(training.search), base_recipe(training))


def trial_recipe(space: SearchSpace, values: dict[str, Any]) -> dict[str, Any] | None:
    """The recipe a trial of `values` trains with; None: the study's own."""
    return space.recipe(values) if isinstance(space, RecipeSpace) else None
