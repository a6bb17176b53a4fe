"""Stacks of one layer type: bottom MLP, `layers` identical layers, a top MLP.

The Wukong and DHEN spaces are stacks; they differ only in the layer's parameters.
"""

from __future__ import annotations

from typing import Any

from search_space.architecture import Architecture, BlockSpec
from search_space.errors import SpecError
from search_space.space_configs import StackConfig
from search_space.spaces.base import (
    Categorical,
    Integer,
    Parameter,
    SearchSpace,
)


class StackSpace(SearchSpace):
    """Subclasses name `layer_op` and map parameter values to and from layer params."""

    layer_op: str = ""
    config: StackConfig

    def _layer_parameters(self) -> dict[str, Parameter]:
        raise NotImplementedError

    def _layer_params(self, values: dict[str, Any]) -> dict[str, Any]:
        raise NotImplementedError

    def _layer_values(self, params: dict[str, Any]) -> dict[str, Any]:
        raise NotImplementedError

    def _build_parameters(self) -> dict[str, Parameter]:
        return {
            "layers": Integer(1, self.config.max_layers),
            **self._layer_parameters(),
            "top_width": Categorical(tuple(self.config.top_width)),
        }

    def _decode_blocks(self, values: dict[str, Any], dim: int) -> tuple[tuple[BlockSpec, ...], str]:
        layer = self._layer_params(values)
        previous: tuple[str, ...] = ("sparse",)
        blocks = []
        if self.schema.num_dense:
            bottom = [*self.config.bottom_widths, dim]
            blocks.append(BlockSpec("bottom", "mlp", ("dense",), {"widths": bottom}))
            previous = ("sparse", "bottom")
        for i in range(values["layers"]):
            name = f"{self.layer_op}{i}"
            blocks.append(BlockSpec(name, self.layer_op, previous, dict(layer)))
            previous = (name,)
        blocks.append(BlockSpec("top", "mlp", previous, {"widths": [values["top_width"]]}))
        return tuple(blocks), "top"

    def _encode_blocks(self, arch: Architecture) -> dict[str, Any]:
        layers = [b for b in arch.blocks if b.op == self.layer_op]
        top = [b for b in arch.blocks if b.name == "top"]
        if not layers or not top:
            raise SpecError(
                f"architecture {arch.name!r} is not in the {self.type_name} space: it needs "
                f"{self.layer_op} layers and a 'top' block"
            )
        return {
            "layers": len(layers),
            **self._layer_values(dict(layers[0].params)),
            "top_width": top[0].params["widths"][0],
        }
