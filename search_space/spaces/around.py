"""The variations of an engineer's architecture: search around the model you have.

`search_space: {type: around, base: dlrm}` (a preset name or an architecture file) makes a
space whose every point is the base with some of these changes (Rankitect's "start from
the production model"):
- `<block>.op`: the block's op swapped for another of its kind (same input and output kind:
  mlp <-> cross; dot <-> fm; attention <-> wukong <-> dhen <-> efc);
- `<block>.width`: a width multiplier of its size knob (MLP widths, cross rank, ...), and
  `<block>.depth`: the first k layers of a multi-layer MLP;
- `<block>.in.<source>`: each input (dense, sparse, an earlier block) kept or dropped, added
  or not; a block left with no input keeps its base inputs, and connections that would cut
  the dense or the sparse features off the output (which the base reads) are the base's:
  a model blind to one kind of feature is no variation of a ranking model (on a Criteo-like
  file, such points scored NE 0.98 against the base's 0.88 and took two of six startup
  trials);
- `insert.<block>`: an interaction block (`insert_ops`) inserted before `<block>`, reading the
  block's inputs and feeding it (at `insert_at`, by default the output block);
- `embedding_dim` (default: half, the same, and twice the base's) and, with `feature_dims`,
  one dim per feature; a 0 among them leaves the feature out of the model (no table, no
  lookup, no traffic: a feature that carries nothing costs a step all the same), unless
  every feature would be left out.
The values that leave everything as it is decode to the base (`base_values`; where
`embedding_dims` or `feature_dims` leaves out the base's dim, the nearest listed one,
nonzero). Every point is valid by construction; FLOPs are exact because
`analyze` computes them from the spec.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from typing import Any

from search_space.architecture import MAX_DIM, Architecture, BlockSpec, digest
from search_space.blocks import OPS
from search_space.errors import SpecError
from search_space.schema import DatasetSchema
from search_space.space_configs import BEST_BASELINE, AroundConfig
from search_space.spaces.base import (
    Categorical,
    Integer,
    Parameter,
    SearchSpace,
    interaction_op,
    nearest,
    raw_inputs_reaching,
)
from search_space.spaces.dag import _output_count

KEEP = "none"
# Ops a block may be swapped for, by (input kind, output kind); each has params derivable
# from a width multiplier and the number of embeddings it reads (`_op_params`).
SWAPS = {
    ("dense", "dense"): ("mlp", "cross"),
    ("sparse", "dense"): ("dot", "fm"),
    ("sparse", "sparse"): ("attention", "wukong", "dhen", "efc"),
}


class AroundSpace(SearchSpace):
    type_name = "around"
    config: AroundConfig

    def __init__(self, schema: DatasetSchema, config: AroundConfig) -> None:
        from search_space.presets import load_architecture

        if config.base == BEST_BASELINE:
            raise SpecError(
                "search_space.base: best_baseline is resolved by a study once its baselines "
                "have trained; name a preset or an architecture file here"
            )
        try:
            self.base = load_architecture(config.base, schema)
        except SpecError as exc:
            raise SpecError(f"search_space.base: {exc}") from None
        if config.embedding_dims is None:
            dim = self.base.embedding.dim
            dims = sorted({max(1, dim // 2), dim, dim * 2})
            config = config.model_copy(update={"embedding_dims": dims})
        names = [b.name for b in self.base.blocks]
        unknown = [n for n in config.insert_at or () if n not in names]
        if unknown:
            raise SpecError(f"search_space.insert_at: {unknown} not blocks of the base {names}")
        self._base_reach = raw_inputs_reaching(self.base.blocks, self.base.output_block)
        self._base_dims = {f.name: f.dim for f in self.base.embedding.features}
        super().__init__(schema, config)

    # ------------------------------------------------------------------- parameters

    def _build_parameters(self) -> dict[str, Parameter]:
        c, params = self.config, {}
        sources = self._raw_sources()
        for block in self.base.blocks:
            kinds = (OPS[block.op].input_kind, OPS[block.op].output_kind)
            if c.swap_ops and block.op in SWAPS.get(kinds, ()):
                params[f"{block.name}.op"] = Categorical(SWAPS[kinds])
            if _has_width(block.op):
                params[f"{block.name}.width"] = Categorical(tuple(c.width_multipliers))
            if block.op == "mlp" and len(block.params["widths"]) > 1:
                params[f"{block.name}.depth"] = Integer(1, len(block.params["widths"]))
            if c.connections:
                for source in sources:
                    params[f"{block.name}.in.{source}"] = Categorical((True, False))
            sources = (*sources, block.name)
        for name in self._insert_points():
            params[f"insert.{name}"] = Categorical((KEEP, *c.insert_ops))
        return params

    def _raw_sources(self) -> tuple[str, ...]:
        return tuple(s for s, n in (("dense", self.schema.num_dense),
                                    ("sparse", self.schema.num_sparse)) if n)  # fmt: skip

    def _insert_points(self) -> list[str]:
        return list(self.config.insert_at or [self.base.output_block])

    def base_values(self) -> dict[str, Any]:
        """The values that decode to the base architecture itself (where `embedding_dims`
        or `feature_dims` leaves out the base's dim: the nearest listed, nonzero)."""
        values: dict[str, Any] = {
            "embedding_dim": nearest(self.config.embedding_dims, self.base.embedding.dim)
        }
        if self.config.feature_dims:
            dims = self.config.feature_dims
            kept = [d for d in dims if d] or dims
            for f in self.base.embedding.features:
                own = self.base.embedding.feature_dim(f)  # 0: the base leaves it out
                values[f"dim.{f.name}"] = 0 if own == 0 and 0 in dims else nearest(kept, own)
        blocks = {b.name: b for b in self.base.blocks}
        for name, p in self._parameters.items():
            block, _, knob = name.partition(".")
            if knob == "op":
                values[name] = blocks[block].op
            elif knob == "width":
                values[name] = min(p.choices, key=lambda m: abs(m - 1.0))
            elif knob == "depth":
                values[name] = len(blocks[block].params["widths"])
            elif knob.startswith("in."):
                values[name] = knob.removeprefix("in.") in blocks[block].inputs
            elif block == "insert":
                values[name] = KEEP
        return values

    def starting_points(
        self, count: int, seed: int, admits: Callable[[dict[str, Any]], bool] = lambda v: True
    ) -> list[dict[str, Any]]:
        """`count` distinct variants of the base, one or two changes away, that `admits`: a
        study around a model starts near it (the base itself is trained as a baseline), and
        within its constraints (a variant over the FLOPs ceiling would be skipped untrained:
        around DHEN at 1M rows, 5 of 6 were, and the searcher started from one point)."""
        rng, base = random.Random(seed), self.base_values()
        seen, points = {digest(self.decode(base))}, []
        for _ in range(20 * count):
            values = self.mutate_values(base, rng)
            if rng.random() < 0.5:
                values = self.mutate_values(values, rng)
            key = digest(self.decode(values))
            if key not in seen:
                seen.add(key)
                if admits(values):
                    points.append(values)
            if len(points) == count:
                break
        return points

    def active(self, values: dict[str, Any]) -> list[str]:
        active = []
        for name in self._parameters:
            block, _, knob = name.partition(".")
            op = values.get(f"{block}.op", self._base_op(block))
            if knob == "width" and not _has_width(op):
                continue
            if knob == "depth" and op != "mlp":
                continue
            active.append(name)
        return active

    def _base_op(self, name: str) -> str | None:
        return next((b.op for b in self.base.blocks if b.name == name), None)

    # ------------------------------------------------------------------- decoding

    def _decode_blocks(self, values: dict[str, Any], dim: int) -> tuple[tuple[BlockSpec, ...], str]:
        output = self.base.output_block
        blocks = self._decode_with(values, connections=self.config.connections)
        if self.config.connections and raw_inputs_reaching(blocks, output) != self._base_reach:
            blocks = self._decode_with(values, connections=False)
        return blocks, output

    def _decode_with(self, values: dict[str, Any], connections: bool) -> tuple[BlockSpec, ...]:
        """The blocks of `values`; with `connections` False, every block has its base inputs."""
        counts = {"dense": 0, "sparse": self._kept_features(values)}  # 0: a dense output
        inserts = set(self._insert_points())
        blocks: list[BlockSpec] = []
        for base in self.base.blocks:
            inputs = self._inputs(values, base) if connections else base.inputs
            if base.name in inserts and values[f"insert.{base.name}"] != KEEP:
                op = values[f"insert.{base.name}"]
                extra = self._block(f"{base.name}_{op}", op, inputs, None, 1.0, counts)
                blocks.append(extra)
                counts[extra.name] = _output_count(extra.op, extra.params, _count(inputs, counts))
                inputs = (*inputs, extra.name)
            op = values.get(f"{base.name}.op", base.op)
            block = self._block(base.name, op, inputs, base, values, counts)
            blocks.append(block)
            counts[block.name] = _output_count(block.op, block.params, _count(inputs, counts))
        return tuple(blocks)

    def _kept_features(self, values: dict[str, Any]) -> int:
        """The categorical features `values` keep (a dim 0 leaves one out; all left out keeps
        them all, as `decode` does)."""
        dims = [self._feature_dim(values, f.name) for f in self.schema.categorical]
        return sum(d != 0 for d in dims) or self.schema.num_sparse

    def _feature_dim(self, values: dict[str, Any], name: str) -> int | None:
        """With `feature_dims`, the one searched; else the base's own: a feature it leaves
        out stays out, and one it gives a dim of its own keeps it, scaled as the model's dim
        is (a hand-built model's layout was dropped: every point read every feature at one
        dim, and none was the base)."""
        if self.config.feature_dims:
            return super()._feature_dim(values, name)
        own = self._base_dims.get(name)
        if not own:  # the model's dim (None), or left out (0)
            return own
        dim = values["embedding_dim"]
        scaled = min(MAX_DIM, max(1, round(own * dim / self.base.embedding.dim)))
        return None if scaled == dim else scaled

    def _inputs(self, values: dict[str, Any], base: BlockSpec) -> tuple[str, ...]:
        chosen = [k.split(".in.", 1)[1] for k in self._parameters
                  if k.startswith(f"{base.name}.in.") and values[k]]  # fmt: skip
        ordered = [s for s in base.inputs if s in chosen] + [s for s in chosen
                                                             if s not in base.inputs]  # fmt: skip
        return tuple(ordered) or base.inputs

    def _block(
        self,
        name: str,
        op: str,
        inputs: tuple[str, ...],
        base: BlockSpec | None,
        values: dict[str, Any] | float,
        counts: dict[str, int],
    ) -> BlockSpec:
        if isinstance(values, dict):
            multiplier = values.get(f"{name}.width", 1.0)
            depth = values.get(f"{name}.depth")
        else:
            multiplier, depth = values, None
        op = interaction_op(op, _count(inputs, counts))
        same = base is not None and base.op == op
        params = _op_params(op, dict(base.params) if same else None, multiplier, depth,
                            _count(inputs, counts))  # fmt: skip
        return BlockSpec(name, op, inputs, params)

    def _encode_blocks(self, arch: Architecture) -> dict[str, Any]:
        if digest(arch) != digest(self.base):
            raise SpecError(
                "the around space encodes only its base architecture; work with parameter "
                "values (`decode`, `mutate_values`) for the others"
            )
        return {k: v for k, v in self.base_values().items()
                if k != "embedding_dim" and not k.startswith("dim.")}  # fmt: skip


def _count(inputs: tuple[str, ...], counts: dict[str, int]) -> int:
    """Embeddings a sparse op reads from `inputs` (a dense input becomes one)."""
    return sum(counts[s] or 1 for s in inputs)


def _has_width(op: str) -> bool:
    return op in ("mlp", "cross", "sum", "efc", "wukong", "dhen")


def _scaled(value: int, multiplier: float) -> int:
    return max(1, round(value * multiplier))


def _op_params(
    op: str, base: dict[str, Any] | None, multiplier: float, depth: int | None, in_count: int
) -> dict[str, Any]:
    """Params of `op`: the base block's own (scaled) when it keeps its op, else defaults
    sized like the presets."""
    if op == "mlp":
        widths = list(base["widths"]) if base else [64]
        return {"widths": [_scaled(w, multiplier) for w in widths[: depth or len(widths)]]}
    if op == "cross":
        params = dict(base) if base else {"num_layers": 2, "low_rank": 32}
        if params.get("low_rank"):
            params["low_rank"] = _scaled(params["low_rank"], multiplier)
        return params
    if op == "sum":
        params = dict(base or {})
        if params.get("width"):
            params["width"] = _scaled(params["width"], multiplier)
        return params
    if op == "efc":
        return {"num_out": _scaled(base["num_out"] if base else in_count, multiplier)}
    if op == "wukong":
        params = dict(base) if base else {"num_fm": 8, "num_lc": 8, "rank": 24, "fmb_widths": [128]}
        return params | {"fmb_widths": [_scaled(w, multiplier) for w in params["fmb_widths"]]}
    if op == "dhen":
        params = dict(base) if base else {"modules": ["dot", "attention"], "hidden": 64}
        if in_count < 2:  # a dot module needs two embeddings
            params["modules"] = [m for m in params["modules"] if m != "dot"] or ["linear"]
        return params | {"hidden": _scaled(params.get("hidden", 64), multiplier)}
    if op == "dot":
        return (base or {}) | ({"self_interaction": True} if in_count < 2 else {})
    if base is not None:
        return base
    if op == "attention":
        return {"num_heads": 2}
    return {}
