"""A Wukong-stack space (arXiv 2403.02545): bottom MLP, identical Wukong layers, top MLP.

Layer parameters: `num_fm` (n_F), `num_lc` (n_L), `rank` (k), `fmb_depth` and `fmb_width`
(the FMB MLP). The paper's Criteo grid is l in 1..4, n_F = n_L in {8, 16}, k = 24.
"""

from __future__ import annotations

from typing import Any

from search_space.space_configs import WukongConfig
from search_space.spaces.base import Categorical, Integer, Parameter
from search_space.spaces.stack import StackSpace


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
