"""A DHEN-stack space (arXiv 2203.11014): bottom MLP, identical DHEN layers, top MLP.

Layer parameters: `modules` (a set of interaction modules, written `dot+attention`),
`aggregation`, and `hidden` (the dot module's MLP width).
"""

from __future__ import annotations

from itertools import combinations
from typing import Any

from search_space.space_configs import DhenConfig
from search_space.spaces.base import Categorical, Parameter
from search_space.spaces.stack import StackSpace


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
