"""A Wukong-stack space (arXiv 2403.02545): bottom MLP, identical Wukong layers, top MLP.

Layer parameters: `num_fm` (n_F), `num_lc` (n_L), `rank` (k), `fmb_depth` and `fmb_width`
(the FMB MLP). The paper's Criteo grid is l in 1..4, n_F = n_L in {8, 16}, k = 24.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field, ValidationInfo, field_validator

from search_space.blocks import OPS
from search_space.spaces.base import Categorical, Integer, Parameter, within
from search_space.spaces.stack import StackConfig, StackSpace


class WukongConfig(StackConfig):
    type: Literal["wukong"] = "wukong"
    max_layers: int = Field(default=4, ge=1, le=16)
    num_fm: list[int] = Field(default=[4, 8, 16], min_length=1)
    num_lc: list[int] = Field(default=[4, 8, 16], min_length=1)
    rank: list[int] = Field(default=[8, 16, 24], min_length=1)
    max_fmb_depth: int = Field(default=2, ge=1, le=8)
    fmb_width: list[int] = Field(default=[32, 64, 128], min_length=1)

    @field_validator("num_fm", "num_lc", "rank", "fmb_width")
    @classmethod
    def _sizes(cls, sizes: list[int], info: ValidationInfo) -> list[int]:
        name = "fmb_widths" if info.field_name == "fmb_width" else info.field_name
        return within(sizes, {f"wukong {name}": OPS["wukong"].PARAMS[name]})


class WukongSpace(StackSpace):
    type_name = "wukong"
    layer_op = "wukong"
    config: WukongConfig

    def _layer_parameters(self) -> dict[str, Parameter]:
        c = self.config
        return {
            "num_fm": Categorical(tuple(c.num_fm)),
            "num_lc": Categorical(tuple(c.num_lc)),
            "rank": Categorical(tuple(c.rank)),
            "fmb_depth": Integer(1, c.max_fmb_depth),
            "fmb_width": Categorical(tuple(c.fmb_width)),
        }

    def _layer_params(self, values: dict[str, Any]) -> dict[str, Any]:
        return {
            "num_fm": values["num_fm"],
            "num_lc": values["num_lc"],
            "rank": values["rank"],
            "fmb_widths": [values["fmb_width"]] * values["fmb_depth"],
        }

    def _layer_values(self, params: dict[str, Any]) -> dict[str, Any]:
        return {
            "num_fm": params["num_fm"],
            "num_lc": params["num_lc"],
            "rank": params["rank"],
            "fmb_depth": len(params["fmb_widths"]),
            "fmb_width": params["fmb_widths"][0],
        }
