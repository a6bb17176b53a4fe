"""The `SearchSpace` interface: typed parameters <-> architectures.

A space declares flat, typed parameters (`Categorical` or `Integer`); `decode` turns a
complete assignment into a bound, valid `Architecture` and `encode` turns one back. Flat
parameters suit every searcher (Optuna's samplers, Ax, evolution): a parameter that a
decoded architecture does not use is simply ignored by `decode`.
"""

from __future__ import annotations

import math
import random
from abc import ABC, abstractmethod
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from search_space.architecture import (
    Architecture,
    BlockSpec,
    EmbeddingConfig,
    Feature,
    analyze,
    digest,
)
from search_space.errors import SpecError
from search_space.schema import DatasetSchema
from search_space.space_configs import SpaceConfig

Value = str | int | bool


@dataclass(frozen=True)
class Categorical:
    choices: tuple[Value, ...]

    def describe(self) -> str:
        return "one of " + ", ".join(map(str, self.choices))


@dataclass(frozen=True)
class Integer:
    low: int
    high: int

    @property
    def choices(self) -> tuple[int, ...]:
        return tuple(range(self.low, self.high + 1))

    def describe(self) -> str:
        return f"an integer in [{self.low}, {self.high}]"


Parameter = Categorical | Integer


class SearchSpace(ABC):
    """Typed parameters, sampling, decoding/encoding and mutation of architectures."""

    type_name: str = ""

    def __init__(self, schema: DatasetSchema, config: SpaceConfig) -> None:
        self.schema = schema
        self.config = config
        self._parameters = self._embedding_parameters() | self._build_parameters()

    # ---------------------------------------------------------------- subclass hooks

    @abstractmethod
    def _build_parameters(self) -> dict[str, Parameter]:
        """The space's own parameters (embedding parameters are added by the base)."""

    @abstractmethod
    def _decode_blocks(self, values: dict[str, Any], dim: int) -> tuple[tuple[BlockSpec, ...], str]:
        """Blocks and the output block's name for a complete, checked assignment."""

    @abstractmethod
    def _encode_blocks(self, arch: Architecture) -> dict[str, Any]:
        """The space's own parameter values of an architecture of this space."""

    def active(self, values: dict[str, Any]) -> list[str]:
        """Parameters that `decode(values)` reads; mutation changes only these."""
        return list(self._parameters)

    # ---------------------------------------------------------------- public API

    def parameters(self) -> dict[str, Parameter]:
        return dict(self._parameters)

    def decode(self, values: dict[str, Any]) -> Architecture:
        self.check_values(values)
        blocks, output = self._decode_blocks(values, values["embedding_dim"])
        dims = [self._feature_dim(values, f.name) for f in self.schema.categorical]
        if dims and all(d == 0 for d in dims):  # a model left with no feature keeps them all
            dims = [None] * len(dims)
        features = tuple(
            Feature(f.name, f.cardinality, dim, f.pooling)
            for f, dim in zip(self.schema.categorical, dims, strict=True)
        )
        embedding = EmbeddingConfig(values["embedding_dim"], features)
        return Architecture(
            blocks=blocks,
            embedding=embedding,
            num_dense=self.schema.num_dense,
            output=output,
            name=f"{self.type_name}-space",
        )

    def encode(self, arch: Architecture) -> dict[str, Any]:
        values: dict[str, Any] = {"embedding_dim": arch.embedding.dim}
        if self.config.feature_dims:
            for f in arch.embedding.features:
                values[f"dim.{f.name}"] = arch.embedding.feature_dim(f)
        values |= self._encode_blocks(arch)
        self.check_values(values)
        return values

    def identity(self, values: dict[str, Any]) -> str:
        """What makes two assignments the same candidate: here, their architecture's digest."""
        return digest(self.decode(values))

    def sample_values(self, rng: random.Random) -> dict[str, Any]:
        return {name: rng.choice(p.choices) for name, p in self._parameters.items()}

    def sample(self, seed: int | random.Random) -> Architecture:
        rng = seed if isinstance(seed, random.Random) else random.Random(seed)
        return self.decode(self.sample_values(rng))

    def mutate(self, arch: Architecture, rng: random.Random, tries: int = 20) -> Architecture:
        """A different architecture that changes one active parameter of `arch`."""
        return self.decode(self.mutate_values(self.encode(arch), rng, tries))

    def mutate_values(
        self, values: dict[str, Any], rng: random.Random, tries: int = 20
    ) -> dict[str, Any]:
        """Values that change one active parameter and decode to a different architecture."""
        original = digest(self.decode(values))
        names = [n for n in self.active(values) if len(self._parameters[n].choices) > 1]
        child = values
        for _ in range(tries):
            name = rng.choice(names)
            new = rng.choice([c for c in self._parameters[name].choices if c != values[name]])
            child = values | {name: new}
            if digest(self.decode(child)) != original:
                return child
        return child

    def starting_points(
        self, count: int, seed: int, admits: Callable[[dict[str, Any]], bool] = lambda v: True
    ) -> list[dict[str, Any]]:
        """Values a study tries first (enqueued before its searcher samples), each one that
        `admits` (the study's constraints); none here."""
        return []

    def check_values(self, values: dict[str, Any]) -> None:
        """Raise `SpecError` naming each missing, unknown or out-of-range parameter."""
        problems = [
            f"{name}: missing ({p.describe()})"
            for name, p in self._parameters.items()
            if name not in values
        ]
        problems += [
            f"{name}: not a parameter of the {self.type_name} space"
            for name in values
            if name not in self._parameters
        ]
        problems += [
            f"{name}: {values[name]!r} is not {p.describe()}"
            for name, p in self._parameters.items()
            if name in values and values[name] not in p.choices
        ]
        if problems:
            raise SpecError(f"{self.type_name} space parameters: " + "; ".join(problems))

    def validate(self, arch: Architecture) -> None:
        analyze(arch)

    # ---------------------------------------------------------------- embedding

    def _embedding_parameters(self) -> dict[str, Parameter]:
        params: dict[str, Parameter] = {
            "embedding_dim": Categorical(tuple(self.config.embedding_dims))
        }
        if self.config.feature_dims:
            for f in self.schema.categorical:
                params[f"dim.{f.name}"] = Categorical(tuple(self.config.feature_dims))
        return params

    def _feature_dim(self, values: dict[str, Any], name: str) -> int | None:
        if not self.config.feature_dims:
            return None
        dim = values[f"dim.{name}"]
        return None if dim == values["embedding_dim"] else dim


def nearest(choices: tuple | list, value: float) -> Any:
    """The choice nearest to `value`: by ratio where all are positive, else by difference."""
    positive = value > 0 and all(c > 0 for c in choices)
    distance = (lambda c: abs(math.log(c / value))) if positive else (lambda c: abs(c - value))
    return min(choices, key=distance)


def raw_inputs_reaching(blocks: tuple[BlockSpec, ...], output: str) -> set[str]:
    """The raw inputs (`dense`, `sparse`) that reach block `output` through `blocks`."""
    by_name = {b.name: b for b in blocks}
    seen, stack = set(), [output]
    while stack:
        name = stack.pop()
        if name not in seen:
            seen.add(name)
            stack += by_name[name].inputs if name in by_name else []
    return seen - set(by_name)


def interaction_op(op: str, in_count: int) -> str:
    """The op a space builds for `op` over `in_count` embeddings: an FM over one embedding
    has no pair (its output is 0 whatever the input), so it becomes the one second-order
    term there is, the embedding's dot with itself (`dot`, self-interaction). A spec may
    still name such an FM (a preset on data with one categorical column, trials recorded
    before): it is valid, only useless."""
    return "dot" if op == "fm" and in_count < 2 else op
