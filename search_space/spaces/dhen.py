"""A DHEN-stack space (arXiv 2203.11014): bottom MLP, identical DHEN layers, top MLP.

Layer parameters: `modules` (a set of interaction modules, written `dot+attention`),
`aggregation`, and `hidden` (the dot module's MLP width).
"""

from __future__ import annotations

from itertools import combinations
from typing import Any, Literal

from pydantic import Field, field_validator

from search_space.blocks import DHEN_MODULES, OPS
from search_space.spaces.base import Categorical, Parameter, within
from search_space.spaces.stack import StackConfig, StackSpace

AGGREGATIONS = ("sum", "weighted_sum", "concat")


class DhenConfig(StackConfig):
    type: Literal["dhen"] = "dhen"
    modules: list[str] = Field(default=list(DHEN_MODULES), min_length=1)
    max_modules: int = Field(default=3, ge=1, le=len(DHEN_MODULES))
    aggregations: list[str] = Field(default=list(AGGREGATIONS), min_length=1)
    hidden: list[int] = Field(default=[32, 64], min_length=1)

    @field_validator("modules")
    @classmethod
    def _known_modules(cls, modules: list[str]) -> list[str]:
        unknown = [m for m in modules if m not in DHEN_MODULES]
        if unknown:
            raise ValueError(f"unknown module(s) {unknown}; DHEN offers {list(DHEN_MODULES)}")
        return modules

    @field_validator("hidden")
    @classmethod
    def _hidden(cls, hidden: list[int]) -> list[int]:
        return within(hidden, {"dhen hidden": OPS["dhen"].PARAMS["hidden"]})

    @field_validator("aggregations")
    @classmethod
    def _known_aggregations(cls, aggregations: list[str]) -> list[str]:
        unknown = [a for a in aggregations if a not in AGGREGATIONS]
        if unknown:
            raise ValueError(f"unknown aggregation(s) {unknown}; allowed {list(AGGREGATIONS)}")
        return aggregations


class DhenSpace(StackSpace):
    type_name = "dhen"
    layer_op = "dhen"
    config: DhenConfig

    def _layer_parameters(self) -> dict[str, Parameter]:
        c = self.config
        module_sets = [
            "+".join(subset)
            for size in range(1, min(c.max_modules, len(c.modules)) + 1)
            for subset in combinations(c.modules, size)
        ]
        return {
            "modules": Categorical(tuple(module_sets)),
            "aggregation": Categorical(tuple(c.aggregations)),
            "hidden": Categorical(tuple(c.hidden)),
        }

    def _layer_params(self, values: dict[str, Any]) -> dict[str, Any]:
        return {
            "modules": values["modules"].split("+"),
            "aggregation": values["aggregation"],
            "hidden": values["hidden"],
        }

    def _layer_values(self, params: dict[str, Any]) -> dict[str, Any]:
        return {
            "modules": "+".join(params["modules"]),
            "aggregation": params["aggregation"],
            "hidden": params["hidden"],
        }
