"""The `Architecture` spec: a block DAG over two raw inputs, as plain versioned JSON.

    {
      "schema_version": 1,
      "name": "dlrm",                        # a label; not part of the digest
      "num_dense": 8,                        # width of the raw dense input
      "embedding": {"dim": 16, "features": [{"name": "c0", "num_embeddings": 1000}, ...]},
      "blocks": [
        {"name": "bottom", "op": "mlp", "inputs": ["dense"], "params": {"widths": [64, 16]}},
        {"name": "inter", "op": "dot", "inputs": ["sparse", "bottom"]},
        {"name": "top", "op": "mlp", "inputs": ["bottom", "inter"], "params": {"widths": [64]}}
      ],
      "output": "top"                        # the block that feeds the head; default: the last
    }

Raw inputs are `dense` (`[B, num_dense]`) and `sparse` (`[B, F, dim]`, one embedding per
categorical feature from a torchrec EmbeddingBagCollection; a feature whose own `dim`
differs is projected to `dim`). A block merges its inputs by its input kind: a dense block
concatenates dense inputs and flattened sparse ones; a sparse block concatenates sparse
inputs along the embedding axis, and a dense input becomes one more embedding (reshaped if
its width equals `dim`, else through a linear projection). The head is a linear layer from
the output block (flattened if sparse) to one logit.

`num_dense` and `embedding.features` may be left out of a hand-written spec: `bind` fills
them from a dataset schema. Blocks that the output does not depend on are dead: they are
dropped from the canonical form and never built.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from search_space.blocks import OPS
from search_space.errors import SpecError
from search_space.files import read_data_file
from search_space.params import validate_params
from search_space.preset_names import ARCHITECTURE_SUFFIXES
from search_space.schema import POOLINGS, DatasetSchema
from search_space.shapes import Dense, Shape, Sparse

SCHEMA_VERSION = 1
RAW_INPUTS = ("dense", "sparse")
MAX_DIM = 4096  # the largest embedding dim a spec takes
_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


@dataclass(frozen=True)
class Feature:
    """One categorical feature's embedding table."""

    name: str
    num_embeddings: int
    dim: int | None = None  # None: the shared embedding dim; 0: the model does not use it
    pooling: str = "sum"  # of a multi-valued feature's ids: sum or mean


@dataclass(frozen=True)
class EmbeddingConfig:
    dim: int
    features: tuple[Feature, ...] = ()
    # a hand-written spec's own dims by feature name, its features left to the schema: `bind`
    # makes them the features' (0: left out)
    dims: tuple[tuple[str, int], ...] = ()

    def feature_dim(self, feature: Feature) -> int:
        return self.dim if feature.dim is None else feature.dim

    @property
    def used(self) -> tuple[Feature, ...]:
        """The features the model looks up: all but those of dim 0 (left out, e.g. by an
        `around` search that found them of no use: no table, no lookup, no traffic)."""
        return tuple(f for f in self.features if f.dim != 0)


@dataclass(frozen=True)
class BlockSpec:
    name: str
    op: str
    inputs: tuple[str, ...]
    params: Mapping[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class Architecture:
    blocks: tuple[BlockSpec, ...]
    embedding: EmbeddingConfig
    num_dense: int | None = None
    output: str | None = None
    name: str = ""

    # ------------------------------------------------------------------ JSON

    def to_dict(self) -> dict[str, Any]:
        features = [
            {"name": f.name, "num_embeddings": f.num_embeddings}
            | ({"dim": f.dim} if f.dim is not None else {})
            | ({"pooling": f.pooling} if f.pooling != "sum" else {})
            for f in self.embedding.features
        ]
        data: dict[str, Any] = {"schema_version": SCHEMA_VERSION}
        if self.name:
            data["name"] = self.name
        if self.num_dense is not None:
            data["num_dense"] = self.num_dense
        data["embedding"] = {"dim": self.embedding.dim, "features": features}
        if self.embedding.dims:  # not bound yet
            data["embedding"]["dims"] = dict(self.embedding.dims)
        data["blocks"] = [
            {"name": b.name, "op": b.op, "inputs": list(b.inputs), "params": _jsonable(b.params)}
            for b in self.blocks
        ]
        data["output"] = self.output_block
        return data

    def to_json(self, indent: int | None = 2) -> str:
        return json.dumps(self.to_dict(), indent=indent)

    @classmethod
    def from_dict(cls, data: Any, source: str = "architecture") -> Architecture:
        return _parse(data, source)

    @classmethod
    def from_json(cls, text: str, source: str = "architecture") -> Architecture:
        try:
            data = json.loads(text)
        except json.JSONDecodeError as exc:
            raise SpecError(f"{source}: not valid JSON ({exc})") from None  # as read_data_file
        return _parse(data, source)

    @classmethod
    def load(cls, path: str | Path) -> Architecture:
        """An architecture file: JSON, or YAML where its name ends in .yaml or .yml."""
        path = Path(path)
        as_yaml = path.suffix.lower() in ARCHITECTURE_SUFFIXES[1:]
        return _parse(read_data_file(path, "the architecture", SpecError, as_json=not as_yaml),
                      str(path))  # fmt: skip

    # ------------------------------------------------------------------ structure

    @property
    def output_block(self) -> str:
        return self.output or (self.blocks[-1].name if self.blocks else "")

    def block(self, name: str) -> BlockSpec:
        return next(b for b in self.blocks if b.name == name)

    def bind(self, schema: DatasetSchema) -> Architecture:
        """Fill `num_dense` and the features from a dataset schema, or check they agree."""
        if self.num_dense is not None and self.num_dense != schema.num_dense:
            raise SpecError(
                f"architecture {self.name or ''!r}: num_dense is {self.num_dense} but the "
                f"dataset {schema.name!r} has {schema.num_dense} dense columns; {SCHEMA_HINT}"
            )
        if not self.embedding.features:
            dims = dict(self.embedding.dims)
            if unknown := sorted(dims.keys() - {f.name for f in schema.categorical}):
                raise SpecError(
                    f"embedding.dims: {unknown} not categorical columns of dataset "
                    f"{schema.name!r} ({', '.join(f.name for f in schema.categorical)})"
                )
            features = tuple(
                Feature(f.name, f.cardinality, dims.get(f.name), f.pooling)
                for f in schema.categorical
            )
            embedding = replace(self.embedding, features=features, dims=())
            return replace(self, num_dense=schema.num_dense, embedding=embedding)
        _check_features_match(self, schema)
        return replace(self, num_dense=schema.num_dense)

    @property
    def is_bound(self) -> bool:
        return self.num_dense is not None


def _jsonable(params: Mapping[str, Any]) -> dict[str, Any]:
    return {k: list(v) if isinstance(v, tuple) else v for k, v in params.items()}


# a study's models are sized by the cardinalities its training counted, which a schema
# inferred from the file (`data schema FILE`) does not hold
SCHEMA_HINT = ("give the schema of the data it was built for (for a study's model: `ranknas "
               "data schema STUDY.yaml`)")  # fmt: skip


def _check_features_match(arch: Architecture, schema: DatasetSchema) -> None:
    ours = {f.name: f.num_embeddings for f in arch.embedding.features}
    theirs = {f.name: f.cardinality for f in schema.categorical}
    if ours.keys() != theirs.keys():
        missing, extra = sorted(theirs.keys() - ours), sorted(ours.keys() - theirs)
        raise SpecError(
            f"embedding.features do not match dataset {schema.name!r}: "
            f"missing {missing}, not in the dataset {extra}; {SCHEMA_HINT}"
        )
    poolings = {f.name: f.pooling for f in schema.categorical}
    for f in arch.embedding.features:
        if f.pooling != poolings[f.name]:
            raise SpecError(
                f"embedding.features {f.name!r}: pooling {f.pooling} but the dataset "
                f"{schema.name!r} pools it by {poolings[f.name]}"
            )
    for name, rows in ours.items():
        if rows < theirs[name]:
            raise SpecError(
                f"embedding.features {name!r}: num_embeddings {rows} is below the dataset's "
                f"cardinality {theirs[name]}; ids would fall outside the table; {SCHEMA_HINT}"
            )


# ---------------------------------------------------------------------- parsing


def _parse(data: Any, source: str) -> Architecture:
    if not isinstance(data, dict):
        raise SpecError(f"{source}: expected an object (a mapping) with 'blocks' and 'embedding'")
    version = data.get("schema_version", SCHEMA_VERSION)
    if version != SCHEMA_VERSION:
        raise SpecError(
            f"{source}: schema_version {version!r} is not supported "
            f"(this ranknas reads version {SCHEMA_VERSION})"
        )
    allowed = {"schema_version", "name", "num_dense", "embedding", "blocks", "output"}
    unknown = sorted(set(data) - allowed)
    if unknown:
        wrapped = ""
        if isinstance(data.get("architecture"), dict):
            wrapped = " (`arch show --json` puts the spec under 'architecture': save it alone)"
        raise SpecError(
            f"{source}: unknown field(s) {unknown}; allowed: {sorted(allowed)}{wrapped}"
        )
    num_dense = data.get("num_dense")
    if num_dense is not None and (not _is_int(num_dense) or num_dense < 0):
        raise SpecError(f"{source}: num_dense must be an integer >= 0, got {num_dense!r}")
    blocks = data.get("blocks")
    if not isinstance(blocks, list) or not blocks:
        raise SpecError(f"{source}: 'blocks' must be a non-empty list of blocks")
    output = data.get("output")
    if output is not None and not isinstance(output, str):
        raise SpecError(f"{source}: 'output' must be a block name")
    return Architecture(
        blocks=tuple(_parse_block(b, f"{source}: blocks[{i}]") for i, b in enumerate(blocks)),
        embedding=_parse_embedding(data.get("embedding"), f"{source}: embedding"),
        num_dense=num_dense,
        output=output,
        name=str(data.get("name", "")),
    )


FEATURE_FIELDS = {"name", "num_embeddings", "dim", "pooling"}


def _parse_embedding(data: Any, where: str) -> EmbeddingConfig:
    if not isinstance(data, dict) or "dim" not in data:
        raise SpecError(f"{where}: expected an object with 'dim' (and optionally 'features')")
    dim = data["dim"]
    if not _is_int(dim) or not 1 <= dim <= MAX_DIM:
        raise SpecError(
            f"{where}.dim: {dim!r} is out of range: must be an integer in [1, {MAX_DIM}]"
        )
    dims = _parse_dims(data.get("dims", {}), where)
    if dims and data.get("features"):
        raise SpecError(f"{where}: give each feature's own dim in 'dims' (features from "
                        "the schema) or in 'features' (each with its num_embeddings), not "
                        "both")  # fmt: skip
    unknown = sorted(set(data) - {"dim", "features", "dims"}, key=str)
    if unknown:
        raise SpecError(f"{where}: unknown field(s) {unknown}; allowed: dim, dims, features")
    features = []
    for i, entry in enumerate(data.get("features", [])):
        at = f"{where}.features[{i}]"
        if not isinstance(entry, dict) or not isinstance(entry.get("name"), str):
            raise SpecError(f"{at}: expected {{name, num_embeddings[, dim][, pooling]}}")
        unknown = sorted(set(entry) - FEATURE_FIELDS, key=str)
        if unknown:  # a schema's `cardinality` here was "num_embeddings must be an integer"
            raise SpecError(f"{at} ({entry['name']}): unknown field(s) {unknown}; allowed: "
                            f"{', '.join(sorted(FEATURE_FIELDS))}")  # fmt: skip
        rows, fdim = entry.get("num_embeddings"), entry.get("dim")
        pooling = entry.get("pooling", "sum")
        if pooling not in POOLINGS:
            raise SpecError(f"{at} ({entry['name']}): pooling must be one of {POOLINGS}")
        if not _is_int(rows) or rows < 1:
            raise SpecError(f"{at} ({entry['name']}): num_embeddings must be an integer >= 1 "
                            "(its table's rows: the schema's cardinality); or leave "
                            "'features' out to take every feature from the data's schema at "
                            "embedding.dim, with own dims in embedding.dims: "
                            "{NAME: DIM}")  # fmt: skip
        if fdim is not None and (not _is_int(fdim) or not 0 <= fdim <= MAX_DIM):
            raise SpecError(f"{at} ({entry['name']}): dim must be an integer in [0, {MAX_DIM}] (0: "
                            "the model does not use the feature)")  # fmt: skip
        features.append(Feature(entry["name"], rows, fdim, pooling))
    names = [f.name for f in features]
    if len(set(names)) != len(names):
        raise SpecError(f"{where}.features: a feature name appears twice")
    return EmbeddingConfig(dim, tuple(features), dims)


def _parse_dims(data: Any, where: str) -> tuple[tuple[str, int], ...]:
    """`embedding.dims`: {feature name: its own dim (0: left out)}."""
    if not isinstance(data, dict):
        raise SpecError(f"{where}.dims: expected a mapping of feature names to dims ({{c9: 16}})")
    for name, dim in data.items():
        if not isinstance(name, str):  # YAML reads an unquoted 1 as a number
            raise SpecError(f"{where}.dims: {name!r} is no feature name; quote it ('{name}')")
        if not _is_int(dim) or not 0 <= dim <= MAX_DIM:
            raise SpecError(f"{where}.dims.{name}: {dim!r} must be an integer in [0, "
                            f"{MAX_DIM}] (0: the model does not use the feature)")  # fmt: skip
    return tuple(sorted(data.items()))


def _parse_block(data: Any, where: str) -> BlockSpec:
    if not isinstance(data, dict):
        raise SpecError(f"{where}: expected an object with name, op, inputs, params")
    unknown = sorted(set(data) - {"name", "op", "inputs", "params"})
    if unknown:
        raise SpecError(f"{where}: unknown field(s) {unknown}; allowed: name, op, inputs, params")
    name, op, inputs = data.get("name"), data.get("op"), data.get("inputs")
    if name is None:
        raise SpecError(f"{where}: missing 'name' (each block is named, and read by that name "
                        "in later blocks' inputs)")  # fmt: skip
    if not isinstance(name, str) or not _NAME.match(name) or name in RAW_INPUTS:
        raise SpecError(
            f"{where}: name {name!r} must be an identifier (letters, digits, _) other than "
            "'dense' and 'sparse'"
        )
    if not isinstance(op, str):
        raise SpecError(f"{where} {name!r}: 'op' must be one of {', '.join(OPS)}")
    if not isinstance(inputs, list) or not inputs:
        raise SpecError(f"{where} {name!r}: 'inputs' must be a non-empty list of names")
    for k, source in enumerate(inputs):
        if not isinstance(source, str):
            raise SpecError(f"{where} {name!r}: inputs[{k}]: {source!r} is not a name (give "
                            "an earlier block's name, 'dense' or 'sparse')")  # fmt: skip
    params = data.get("params", {})
    if not isinstance(params, dict):
        raise SpecError(f"{where} {name!r}: 'params' must be an object")
    return BlockSpec(name, op, tuple(inputs), params)


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


# ---------------------------------------------------------------------- analysis


@dataclass(frozen=True)
class MergeProjection:
    """A dense input of a sparse block whose width differs from the embedding dim."""

    block: str
    source: str
    width: int


@dataclass(frozen=True)
class Analysis:
    """What validation learns about a bound architecture: the live blocks in execution
    order, their normalized params, input and output shapes, and exact costs."""

    arch: Architecture
    order: tuple[str, ...]
    params: dict[str, dict[str, Any]]
    input_shapes: dict[str, Any]
    shapes: dict[str, Shape]
    projections: tuple[MergeProjection, ...]
    block_flops: dict[str, int]
    block_params: dict[str, int]
    flops: int
    dense_params: int
    embedding_params: int

    @property
    def params_total(self) -> int:
        return self.dense_params + self.embedding_params


def analyze(arch: Architecture) -> Analysis:
    """Validate a bound architecture and compute its shapes and exact per-example costs.

    Raises `SpecError` listing every problem found, each naming the block and field.
    """
    if not arch.is_bound:
        raise SpecError("the architecture has no num_dense/features yet: bind it to a schema")
    blocks = {b.name: b for b in arch.blocks}
    problems = _structural_problems(arch, blocks)
    if problems:  # with every known op's params: all the problems at once
        raise SpecError("\n".join(problems + _param_problems(arch.blocks)))
    order = _live_order(arch, blocks)
    emb = arch.embedding
    shapes: dict[str, Shape] = {
        "dense": Dense(arch.num_dense or 0),
        "sparse": Sparse(len(emb.used), emb.dim),
    }
    normalized, input_shapes, flops, nparams = {}, {}, {}, {}
    projections: list[MergeProjection] = []
    for name in order:
        block = blocks[name]
        where = f"block {name!r} (op {block.op})"
        cls = OPS[block.op]
        if any(source not in shapes for source in block.inputs):
            continue  # an input is already reported as wrong: its shape is unknown
        params, param_problems = validate_params(cls.PARAMS, dict(block.params), where)
        if param_problems:
            problems += param_problems
            continue
        merged = _merge_shape(cls, block, shapes, emb.dim, projections)
        problem = cls.check(merged, params)
        if problem:
            problems.append(f"{where}: {problem}")
            continue
        normalized[name], input_shapes[name] = params, merged
        shapes[name] = cls.output_shape(merged, params)
        flops[name], nparams[name] = cls.flops(merged, params), cls.num_params(merged, params)
    problems += _dead_block_problems(blocks, order) + _table_size_problems(emb)
    if problems:
        raise SpecError("\n".join(problems))
    head_in = shapes[arch.output_block].numel
    extra_flops = 2 * head_in + sum(2 * p.width * emb.dim for p in projections)
    extra_params = head_in + 1 + sum(p.width * emb.dim + emb.dim for p in projections)
    for feature in emb.used:
        if emb.feature_dim(feature) != emb.dim:
            extra_flops += 2 * emb.feature_dim(feature) * emb.dim
            extra_params += emb.feature_dim(feature) * emb.dim
    return Analysis(
        arch=arch,
        order=order,
        params=normalized,
        input_shapes=input_shapes,
        shapes=shapes,
        projections=tuple(projections),
        block_flops=flops,
        block_params=nparams,
        flops=sum(flops.values()) + extra_flops,
        dense_params=sum(nparams.values()) + extra_params,
        embedding_params=sum(f.num_embeddings * emb.feature_dim(f) for f in emb.features),
    )


def _dead_block_problems(blocks: dict[str, BlockSpec], live: Sequence[str]) -> list[str]:
    """The params of the blocks that do not feed the output: never built, but a value out of
    range in a file is a mistake all the same (it was accepted without a word)."""
    problems = []
    for name, block in blocks.items():
        if name not in live:
            where = f"block {name!r} (op {block.op})"
            problems += validate_params(OPS[block.op].PARAMS, dict(block.params), where)[1]
    return problems


MAX_TABLE_BYTES = 1 << 40  # 1 TiB of float32 rows: beyond any one machine this trains on


def _table_size_problems(emb: EmbeddingConfig) -> list[str]:
    problems = []
    for f in emb.features:
        size = f.num_embeddings * emb.feature_dim(f) * 4
        if size > MAX_TABLE_BYTES:
            problems.append(
                f"feature {f.name!r}: cardinality {f.num_embeddings:,} x dim "
                f"{emb.feature_dim(f)} needs {size / 2**40:,.1f} TiB of float32; hash the ids "
                "into fewer buckets or fix the cardinality in the schema"
            )
    return problems


def validate(arch: Architecture) -> Analysis:
    """Alias of `analyze`, for call sites that only want the check."""
    return analyze(arch)


def _structural_problems(
    arch: Architecture, blocks: dict[str, BlockSpec], bound: bool = True
) -> list[str]:
    problems = []
    seen: set[str] = set()
    for block in arch.blocks:
        where = f"block {block.name!r}"
        if block.name in seen:
            problems.append(f"{where}: the name is used by another block; names must be unique")
        seen.add(block.name)
        if block.op not in OPS:
            problems.append(f"{where}: unknown op {block.op!r}; known ops: {', '.join(OPS)}")
        for source in block.inputs:
            if source not in blocks and source not in RAW_INPUTS:
                problems.append(
                    f"{where}: inputs names {source!r}, which is neither a block nor a raw input "
                    "(dense, sparse)"
                )
            # before `bind` (`bound=False`) a spec's features may be left to the schema,
            # even where it names num_dense: 13, Criteo's right count, they said "has none"
            if source == "sparse" and bound and arch.is_bound and not arch.embedding.used:
                none = "uses none (every dim 0)" if arch.embedding.features else "has none"
                problems.append(f"{where}: reads 'sparse' but the model {none} of the "
                                "categorical features")  # fmt: skip
            if source == "dense" and arch.num_dense == 0:
                problems.append(f"{where}: reads 'dense' but the data has no dense column")
        if len(set(block.inputs)) != len(block.inputs):
            problems.append(f"{where}: inputs lists the same source twice")
    if arch.output_block not in blocks:
        problems.append(f"output names {arch.output_block!r}, which is not a block")
    if not problems:
        cycle = _find_cycle(blocks)
        if cycle:
            problems.append(f"blocks form a cycle: {' -> '.join(cycle)}; inputs must not loop")
    return problems


def unbound_problems(arch: Architecture) -> list[str]:
    """What is wrong with `arch` before a schema binds it: ops, inputs, output, cycles and
    params (a study says so before it loads the data, which can take minutes)."""
    blocks = {b.name: b for b in arch.blocks}
    problems = _structural_problems(arch, blocks, bound=False) + _param_problems(arch.blocks)
    return problems or _unfed_blocks(arch, blocks)


def _unfed_blocks(arch: Architecture, blocks: dict[str, BlockSpec]) -> list[str]:
    """A spec that names no `output` has its last block's; blocks that do not feed that one
    would be dropped without a word: in a file, most likely not the model its author meant
    (the files ranknas writes name their output, and may hold unused blocks)."""
    if arch.output is not None:
        return []
    live = set(_live_order(arch, blocks))
    dead = [b.name for b in arch.blocks if b.name not in live]
    if not dead:
        return []
    return [f"blocks {dead} do not feed the last block {arch.output_block!r}, the output as "
            'the spec names no "output": name the block that feeds the head in "output", or '
            "remove them"]  # fmt: skip


def _param_problems(blocks: tuple[BlockSpec, ...]) -> list[str]:
    """The params of each block whose op is known, checked without shapes."""
    problems = []
    for b in (b for b in blocks if b.op in OPS):
        problems += validate_params(
            OPS[b.op].PARAMS, dict(b.params), f"block {b.name!r} (op {b.op})"
        )[1]
    return problems


def _find_cycle(blocks: dict[str, BlockSpec]) -> list[str] | None:
    state: dict[str, int] = {}  # 1 = on the current path, 2 = done

    def visit(name: str, path: list[str]) -> list[str] | None:
        state[name] = 1
        for source in blocks[name].inputs:
            if source in RAW_INPUTS:
                continue
            if state.get(source) == 1:
                return [*path[path.index(source) :], source] if source in path else [source]
            if source not in state:
                found = visit(source, [*path, source])
                if found:
                    return found
        state[name] = 2
        return None

    for name in blocks:
        if name not in state:
            found = visit(name, [name])
            if found:
                return found
    return None


def _live_order(arch: Architecture, blocks: dict[str, BlockSpec]) -> tuple[str, ...]:
    """Blocks the output depends on, each after its inputs (list order breaks ties)."""
    live: set[str] = set()
    stack = [arch.output_block]
    while stack:
        name = stack.pop()
        if name in live or name in RAW_INPUTS:
            continue
        live.add(name)
        stack.extend(blocks[name].inputs)
    order: list[str] = []
    done: set[str] = set(RAW_INPUTS)
    pending = [b.name for b in arch.blocks if b.name in live]
    while pending:
        ready = [n for n in pending if all(s in done for s in blocks[n].inputs)]
        order += ready
        done.update(ready)
        pending = [n for n in pending if n not in done]
    return tuple(order)


def _merge_shape(
    cls: Any,
    block: BlockSpec,
    shapes: dict[str, Shape],
    dim: int,
    projections: list[MergeProjection],
) -> Any:
    """The input shape a block sees after merging; records dense->sparse projections."""
    sources = [shapes[s] for s in block.inputs]
    if cls.input_kind == "dense":
        widths = tuple(Dense(s.numel) for s in sources)
        return widths if cls.takes_list else Dense(sum(w.width for w in widths))
    count = 0
    for source, shape in zip(block.inputs, sources, strict=True):
        if isinstance(shape, Sparse):
            count += shape.count
            continue
        count += 1
        if shape.width != dim:
            projections.append(MergeProjection(block.name, source, shape.width))
    return Sparse(count, dim)


# ---------------------------------------------------------------------- canonical form


def canonical(arch: Architecture) -> Architecture:
    """The canonical form: dead blocks dropped, defaults filled, blocks renamed b0, b1, ...
    in a structural order, inputs sorted where their order does not matter. Two specs of
    the same network have the same canonical form (the `name` label is dropped)."""
    analysis = analyze(arch)
    blocks = {b.name: b for b in arch.blocks}
    keys: dict[str, str] = {"dense": "dense", "sparse": "sparse"}
    for name in analysis.order:
        block = blocks[name]
        sources = [keys[s] for s in block.inputs]
        if not _order_matters(block.op):
            sources.sort()
        params = json.dumps(_jsonable(analysis.params[name]), sort_keys=True)
        keys[name] = hashlib.sha256(f"{block.op}|{params}|{sources}".encode()).hexdigest()
    # Sort by (depth, structural key) so that the order is a valid topological order.
    depth: dict[str, int] = {"dense": 0, "sparse": 0}
    for name in analysis.order:
        depth[name] = 1 + max(depth[s] for s in blocks[name].inputs)
    ordered = sorted(analysis.order, key=lambda n: (depth[n], keys[n]))
    rename = {"dense": "dense", "sparse": "sparse"} | {n: f"b{i}" for i, n in enumerate(ordered)}
    new_blocks = []
    for name in ordered:
        block = blocks[name]
        sources = block.inputs if _order_matters(block.op) else sorted(block.inputs, key=keys.get)
        inputs = [rename[s] for s in sources]
        params = {k: v for k, v in analysis.params[name].items() if v is not None}
        new_blocks.append(BlockSpec(rename[name], block.op, tuple(inputs), params))
    return replace(arch, blocks=tuple(new_blocks), output=rename[arch.output_block], name="")


def _order_matters(op: str) -> bool:
    # Concatenation order only permutes weights; gating treats its first input specially.
    return op == "gating"


def digest(arch: Architecture) -> str:
    """A stable hash of the canonical form: same network, same digest."""
    text = json.dumps(canonical(arch).to_dict(), sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(text.encode()).hexdigest()[:16]
