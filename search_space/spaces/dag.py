"""A NASRec / Rankitect-style DAG space: a fixed number of blocks, each choosing its operator,
its size and which earlier blocks (or raw inputs) it reads.

Per block `b{i}`:
- `b{i}.op`: one of the configured ops;
- `b{i}.width`: the block's size knob: MLP width, sum width, or cross rank;
- `b{i}.count`: embeddings out of an `efc` block;
- `b{i}.in1` (always used) and `b{i}.in2`..`b{i}.in{max_inputs}` (may be `none`): its inputs,
  among `dense`, `sparse` and the earlier blocks ("any connection").
The last block feeds the head. It also reads the raw inputs (dense, sparse) that its chosen
inputs do not reach, so every point sees both kinds of feature the data has.
"""

from __future__ import annotations

from typing import Any

from search_space.architecture import Architecture, BlockSpec
from search_space.blocks import OPS
from search_space.errors import SpecError
from search_space.params import validate_params
from search_space.shapes import Sparse
from search_space.space_configs import DagConfig
from search_space.spaces.base import (
    Categorical,
    Parameter,
    SearchSpace,
    interaction_op,
    raw_inputs_reaching,
)

NONE = "none"


def block_name(i: int) -> str:
    """The name of the space's i-th block."""
    return f"b{i}"


def param_name(i: int, knob: str) -> str:
    """The parameter `knob` (op, width or count) of the i-th block."""
    return f"{block_name(i)}.{knob}"


def input_param(i: int, k: int) -> str:
    """The parameter of the i-th block's k-th input (from 1)."""
    return param_name(i, f"in{k}")


class DagSpace(SearchSpace):
    type_name = "dag"
    config: DagConfig

    def _build_parameters(self) -> dict[str, Parameter]:
        c = self.config
        params: dict[str, Parameter] = {}
        for i in range(c.num_blocks):
            sources = ("dense", "sparse", *(block_name(j) for j in range(i)))
            if not self.schema.num_dense:
                sources = tuple(s for s in sources if s != "dense")
            if not self.schema.num_sparse:
                sources = tuple(s for s in sources if s != "sparse")
            params[param_name(i, "op")] = Categorical(tuple(c.ops))
            params[param_name(i, "width")] = Categorical(tuple(c.widths))
            params[param_name(i, "count")] = Categorical(tuple(c.counts))
            params[input_param(i, 1)] = Categorical(sources)
            for k in range(2, c.max_inputs + 1):
                params[input_param(i, k)] = Categorical((NONE, *sources))
        return params

    def active(self, values: dict[str, Any]) -> list[str]:
        names = [n for n in self._parameters if not n.startswith("b")]
        for i in range(self.config.num_blocks):
            op = values[param_name(i, "op")]
            names += [
                param_name(i, "op"),
                *(input_param(i, k) for k in range(1, self.config.max_inputs + 1)),
            ]
            if op in ("mlp", "sum", "cross"):
                names.append(param_name(i, "width"))
            if op == "efc":
                names.append(param_name(i, "count"))
        return names

    def _decode_blocks(self, values: dict[str, Any], dim: int) -> tuple[tuple[BlockSpec, ...], str]:
        counts = {"dense": 0, "sparse": self.schema.num_sparse}  # 0 marks a dense output
        blocks: list[BlockSpec] = []
        for i in range(self.config.num_blocks):
            inputs = self._inputs(values, i)
            if i == self.config.num_blocks - 1:
                inputs = (*inputs, *self.unreached(blocks, inputs))
            count = sum(counts[s] or 1 for s in inputs)  # embeddings a sparse op would see
            op = interaction_op(values[param_name(i, "op")], count)
            params = self._params(
                op, values[param_name(i, "width")], values[param_name(i, "count")], count
            )
            blocks.append(BlockSpec(block_name(i), op, inputs, params))
            counts[block_name(i)] = _output_count(op, params, count)
        return tuple(blocks), blocks[-1].name

    def unreached(self, blocks: list[BlockSpec], inputs: tuple[str, ...]) -> tuple[str, ...]:
        """The kinds of raw input (dense, sparse) the data has and `inputs` do not reach: the
        output block reads them too. A model blind to all dense or all categorical features
        is no ranking model; without this, 39% of the default space's points were."""
        reached = raw_inputs_reaching((*blocks, BlockSpec("output", "mlp", inputs, {})), "output")
        kinds = {"dense": self.schema.num_dense, "sparse": self.schema.num_sparse}
        return tuple(kind for kind, n in kinds.items() if n and kind not in reached)

    def _inputs(self, values: dict[str, Any], i: int) -> tuple[str, ...]:
        chosen = [values[input_param(i, k)] for k in range(1, self.config.max_inputs + 1)]
        return tuple(dict.fromkeys(s for s in chosen if s != NONE))

    @staticmethod
    def _params(op: str, width: int, count: int, in_count: int) -> dict[str, Any]:
        if op == "mlp":
            return {"widths": [width]}
        if op == "sum":
            return {"width": width}
        if op == "cross":
            return {"num_layers": 1, "low_rank": width}
        if op == "efc":
            return {"num_out": count}
        if op == "fm":
            return {"reduce": False}
        if op == "dot":
            return {"self_interaction": in_count < 2}
        if op == "dhen":
            return {"modules": ["attention", "linear"] if in_count < 2 else ["dot", "attention"]}
        if op == "attention":
            return {"num_heads": 2}
        return {}

    def _encode_blocks(self, arch: Architecture) -> dict[str, Any]:
        n = self.config.num_blocks
        names = [b.name for b in arch.blocks]
        if names != [block_name(i) for i in range(n)] or arch.output_block != block_name(n - 1):
            raise SpecError(
                f"architecture {arch.name!r} is not in this DAG space: expected blocks "
                f"b0..b{n - 1} with b{n - 1} as the output"
            )
        values: dict[str, Any] = {}
        as_fm = False
        for i, block in enumerate(arch.blocks):
            p = block.params
            # a dot over one embedding is also what an fm there decodes to (checked below)
            fm = block.op == "dot" and "dot" not in self.config.ops and "fm" in self.config.ops
            as_fm |= fm
            values[param_name(i, "op")] = "fm" if fm else block.op
            values[param_name(i, "width")] = (
                p["widths"][0]
                if block.op == "mlp"
                else p["width"]
                if block.op == "sum"
                else p["low_rank"]
                if block.op == "cross"
                else self.config.widths[0]
            )
            values[param_name(i, "count")] = (
                p["num_out"] if block.op == "efc" else self.config.counts[0]
            )
            slots = [*block.inputs, *[NONE] * self.config.max_inputs][: self.config.max_inputs]
            for k, source in enumerate(slots, start=1):
                values[input_param(i, k)] = source
        if as_fm:
            blocks, _ = self._decode_blocks(values, arch.embedding.dim)
            if blocks != arch.blocks:
                raise SpecError(f"architecture {arch.name!r} is not in this DAG space: a dot "
                                "over several embeddings; dot is not among its ops")  # fmt: skip
        return values


def _output_count(op: str, params: dict[str, Any], in_count: int) -> int:
    """Embeddings a block outputs (0 for a dense output)."""
    block = OPS[op]
    if block.output_kind == "dense":
        return 0
    full_params, _ = validate_params(block.PARAMS, params, op)
    return block.output_shape(Sparse(in_count, 1), full_params).count
