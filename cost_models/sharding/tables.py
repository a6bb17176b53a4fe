"""Embedding-table workloads: what a sharder places and what a cost model reads.

A `TableSpec` is one table and how it is read: rows, dim, pooling factor (ids per example),
weight dtype, and how skewed its ids are (a Zipf exponent, or a measured 17-bin reuse
histogram). Tables come from a YAML/JSON file (`tables: [...]`), an `Architecture`, a
`DatasetSchema`, or `generate_tables` (realistic power-law pools for training and a
disjoint held-out pool for evaluation).

`table_features` gives AutoShard's 21 features per table: dim, rows, pooling factor, size
(log-scaled), and the 17-bin index-reuse histogram.
"""

from __future__ import annotations

import functools
import json
import math
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np
import yaml

from search_space.architecture import Architecture
from search_space.errors import RanknasError
from search_space.files import read_data_file
from search_space.names import table_name
from search_space.schema import DatasetSchema

DTYPE_BYTES = {"fp32": 4, "fp16": 2}
HISTOGRAM_BINS = 17
NUM_FEATURES = 4 + HISTOGRAM_BINS
DEFAULT_ZIPF = 1.05
# Lookups sampled to estimate a table's reuse histogram (bin k: ids read 2^k..2^(k+1)-1 times).
REUSE_SAMPLES = 1 << 15
_FIELDS = (
    "name",
    "num_embeddings",
    "embedding_dim",
    "pooling_factor",
    "dtype",
    "zipf_alpha",
    "reuse_histogram",
)


@dataclass(frozen=True)
class TableSpec:
    """One embedding table and its read pattern.

    `zipf_alpha` shapes the id distribution (p(id k) ~ (k+1)^-alpha) that measurements draw
    from; `reuse_histogram` overrides the histogram computed from it (e.g. one measured on
    real traffic).
    """

    name: str
    num_embeddings: int
    embedding_dim: int
    pooling_factor: float = 1.0
    dtype: str = "fp32"
    reuse_histogram: tuple[float, ...] | None = None
    zipf_alpha: float = DEFAULT_ZIPF

    @property
    def size_bytes(self) -> int:
        return self.num_embeddings * self.embedding_dim * DTYPE_BYTES[self.dtype]

    @property
    def signature(self) -> tuple:
        """What the cost depends on (everything but the name)."""
        return (
            self.num_embeddings,
            self.embedding_dim,
            round(self.pooling_factor, 4),
            self.dtype,
            round(self.zipf_alpha, 4),
        )

    def histogram(self) -> np.ndarray:
        if self.reuse_histogram is not None:
            return np.asarray(self.reuse_histogram, dtype=np.float64)
        return reuse_histogram(self.num_embeddings, self.zipf_alpha)

    def to_dict(self) -> dict[str, Any]:
        data = asdict(self)
        if self.reuse_histogram is None:
            del data["reuse_histogram"]
        else:
            data["reuse_histogram"] = list(self.reuse_histogram)
        return data


# ---------------------------------------------------------------------- column shards

# torchrec cuts column-wise shards in blocks of 4 columns.
MIN_SHARD_DIM = 4


def shard_name(table: str, index: int) -> str:
    return f"{table}/cw{index}"


def column_split_options(table: TableSpec, max_parts: int) -> list[int]:
    """Shard counts (powers of two up to `max_parts`) that cut `table` into equal shards of a
    whole number of 4-column blocks."""
    options, parts = [], 2
    while parts <= max_parts and table.embedding_dim % (parts * MIN_SHARD_DIM) == 0:
        options.append(parts)
        parts *= 2
    return options


def column_shards(table: TableSpec, parts: int) -> list[TableSpec]:
    """`table` cut by columns into `parts` equal shards: each reads the same ids (same
    pooling and id distribution) into `embedding_dim / parts` columns."""
    if table.embedding_dim % parts:
        raise RanknasError(
            f"table {table.name}: {table.embedding_dim} columns do not split into {parts} shards"
        )
    width = table.embedding_dim // parts
    return [
        replace(table, name=shard_name(table.name, j), embedding_dim=width) for j in range(parts)
    ]


def row_shard_name(table: str, index: int) -> str:
    return f"{table}/rw{index}"


def fills_row_shards(table: TableSpec, parts: int) -> bool:
    """Whether torchrec's blocks of ceil(rows / parts) rows leave none of `parts` empty."""
    return -(-table.num_embeddings // parts) * (parts - 1) < table.num_embeddings


def row_shards(table: TableSpec, parts: int) -> list[TableSpec]:
    """`table` cut by rows into `parts` blocks as torchrec cuts them (ceil(rows / parts) each,
    the last takes the rest). Ids are taken as hashed, so each block gets an equal share of
    the lookups: pooling / parts per example, the same id skew. Every block still returns
    full-width partial sums, so its communication is that of the whole table."""
    if not fills_row_shards(table, parts):
        raise RanknasError(f"table {table.name}: {table.num_embeddings} rows do not fill "
                           f"{parts} row shards")  # fmt: skip
    block = -(-table.num_embeddings // parts)
    sizes = [min(block, table.num_embeddings - j * block) for j in range(parts)]
    return [
        replace(
            table,
            name=row_shard_name(table.name, j),
            num_embeddings=rows,
            pooling_factor=table.pooling_factor / parts,
        )
        for j, rows in enumerate(sizes)
    ]


def placement_units(
    tables: Sequence[TableSpec],
    splits: Mapping[str, int],
    row_wise: Mapping[str, Sequence[int]] | None = None,
) -> list[TableSpec]:
    """`tables` in order, each table named in `splits` replaced by its column shards and each
    named in `row_wise` by its row shards (one per rank listed)."""
    units: list[TableSpec] = []
    row_wise = row_wise or {}
    for t in tables:
        parts = splits.get(t.name, 1)
        if t.name in row_wise:
            units += row_shards(t, len(row_wise[t.name]))
        else:
            units += column_shards(t, parts) if parts > 1 else [t]
    return units


# ---------------------------------------------------------------------- index distributions


def zipf_indices(rows: int, alpha: float, count: int, rng: np.random.Generator) -> np.ndarray:
    """`count` ids in [0, rows) with p(k) ~ (k+1)^-alpha (inverse-CDF of the continuous law)."""
    u = rng.random(count)
    if abs(alpha - 1.0) < 1e-6:
        x = (rows + 1.0) ** u
    else:
        e = 1.0 - alpha
        x = (1.0 + u * ((rows + 1.0) ** e - 1.0)) ** (1.0 / e)
    return np.clip(np.floor(x).astype(np.int64) - 1, 0, rows - 1)


@functools.lru_cache(maxsize=1 << 16)
def reuse_histogram(rows: int, alpha: float) -> np.ndarray:
    """Share of lookups that hit an id read 2^k..2^(k+1)-1 times in `REUSE_SAMPLES` lookups.

    Cached: the result is shared, so treat it as read-only."""
    rng = np.random.default_rng([rows, round(alpha * 1e4)])
    counts = id_counts(zipf_indices(rows, alpha, REUSE_SAMPLES, rng), rows)
    bins = np.minimum(np.log2(counts).astype(int), HISTOGRAM_BINS - 1)
    return np.bincount(bins, weights=counts, minlength=HISTOGRAM_BINS) / REUSE_SAMPLES


def id_counts(ids: np.ndarray, rows: int) -> np.ndarray:
    """How often each id in `ids` (all in [0, rows)) occurs, in id order: what
    `np.unique(ids, return_counts=True)[1]` gives, several times faster (a table's count for
    a small table, a 32-bit sort for a large one; planning 800 tables computes 800)."""
    if rows <= 8 * len(ids):
        counts = np.bincount(ids, minlength=rows)
        return counts[counts > 0]
    ordered = np.sort(ids.astype(np.int32 if rows < 2**31 else np.int64))
    starts = np.flatnonzero(np.diff(ordered, prepend=-1))
    return np.diff(np.append(starts, len(ordered)))


def table_features(tables: Sequence[TableSpec]) -> np.ndarray:
    """AutoShard's 21 features per table, `[len(tables), 21]`: log2 dim, log10 rows,
    log2 pooling factor, log10 bytes, then the 17-bin reuse histogram."""
    out = np.zeros((len(tables), NUM_FEATURES), dtype=np.float32)
    if not tables:
        return out
    shape = np.array([(t.embedding_dim, t.num_embeddings, t.pooling_factor, t.size_bytes)
                      for t in tables], dtype=np.float64)  # fmt: skip
    out[:, 0] = np.log2(shape[:, 0])
    out[:, 1] = np.log10(shape[:, 1])
    out[:, 2] = np.log2(np.maximum(shape[:, 2], 1e-3))
    out[:, 3] = np.log10(shape[:, 3])
    out[:, 4:] = [t.histogram() for t in tables]
    return out


# ---------------------------------------------------------------------- files


def load_tables(path: str | Path) -> list[TableSpec]:
    """Read `tables: [...]` from a YAML or JSON file; errors name the entry and the field."""
    data = read_data_file(path, "the table file")
    return parse_tables(data, str(path))


def parse_tables(data: Any, source: str = "tables") -> list[TableSpec]:
    if not isinstance(data, dict) or not isinstance(data.get("tables"), list):
        found = f"; found {sorted(data, key=str)}" if isinstance(data, dict) and data else ""
        raise RanknasError(f"{source}: expected a mapping with a list 'tables: [...]'{found}")
    unknown = sorted(set(data) - {"tables"}, key=str)
    if unknown:  # `devices: 8` planned on --devices' count without a word
        raise RanknasError(f"{source}: unknown key(s) {unknown}; a table file holds 'tables' "
                           "only (devices and their memory are --devices and "
                           "--memory-gb)")  # fmt: skip
    tables = [
        _parse_table(entry, f"{source}: tables[{i}]") for i, entry in enumerate(data["tables"])
    ]
    if not tables:
        raise RanknasError(f"{source}: 'tables' is empty; list at least one table")
    names = [t.name for t in tables]
    duplicates = sorted({n for n in names if names.count(n) > 1})
    if duplicates:
        raise RanknasError(f"{source}: table name(s) {duplicates} appear more than once")
    return tables


def save_tables(tables: Sequence[TableSpec], path: str | Path) -> None:
    data = {"tables": [t.to_dict() for t in tables]}
    path = Path(path)
    path.write_text(json.dumps(data, indent=1) if path.suffix == ".json" else yaml.safe_dump(data))


def _parse_table(entry: Any, where: str) -> TableSpec:
    if not isinstance(entry, dict):
        raise RanknasError(f"{where}: expected a mapping with name, num_embeddings, embedding_dim")
    name = entry.get("name")
    if not isinstance(name, str) or not name:
        raise RanknasError(f"{where}: 'name' must be a non-empty string")
    where = f"{where} ({name})"
    if "/" in name:  # "a/cw0" was both a table and a shard of table a: one left the plan
        raise RanknasError(f"{where}: name {name!r} holds '/', which names a table's shards "
                           "(<table>/cw<j>, <table>/rw<j>); give a name without it")  # fmt: skip
    unknown = sorted(set(entry) - set(_FIELDS), key=str)  # YAML keys may be numbers
    if unknown:
        raise RanknasError(f"{where}: unknown field(s) {unknown}; allowed: {', '.join(_FIELDS)}")
    spec = TableSpec(
        name=name,
        num_embeddings=_int(entry, "num_embeddings", where),
        embedding_dim=_dim(entry, where),
        pooling_factor=_positive(entry, "pooling_factor", where, 1.0),
        zipf_alpha=_positive(entry, "zipf_alpha", where, DEFAULT_ZIPF),
    )
    dtype = entry.get("dtype", "fp32")
    if not isinstance(dtype, str) or dtype not in DTYPE_BYTES:
        raise RanknasError(f"{where}: 'dtype' is {dtype!r}; use one of {', '.join(DTYPE_BYTES)}")
    histogram = entry.get("reuse_histogram")
    if histogram is not None:
        histogram = _histogram(histogram, where)
    return replace(spec, dtype=dtype, reuse_histogram=histogram)


def _int(entry: Mapping[str, Any], key: str, where: str) -> int:
    if key not in entry:
        raise RanknasError(f"{where}: '{key}' is missing; give an integer >= 1")
    value = entry[key]
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise RanknasError(f"{where}: '{key}' must be an integer >= 1, got {value!r}"
                           f"{_as_text(value)}")  # fmt: skip
    return value


def _as_text(value: Any) -> str:
    """Why a number in a YAML file came as a text: YAML 1.1 reads 1e6 and 1.5e6 (no dot
    before the e, or no sign after it) as texts."""
    if not isinstance(value, str) or "e" not in value.lower():
        return ""
    try:
        number = float(value)
    except ValueError:
        return ""
    if not math.isfinite(number):
        return ""
    plain = f"{number:.0f}" if number.is_integer() and abs(number) < 1e18 else f"{number:.6e}"
    return f" (a text to YAML, which reads 1e6 so: write {plain})"


def _dim(entry: Mapping[str, Any], where: str) -> int:
    """An embedding dim fbgemm's kernels take (they assert a multiple of 4, deep in
    `shard compare` and `shard plan --measure`)."""
    dim = _int(entry, "embedding_dim", where)
    if dim % 4:
        raise RanknasError(f"{where}: 'embedding_dim' is {dim}; fbgemm's embedding kernels need "
                           f"a multiple of 4: use {dim + 4 - dim % 4}")  # fmt: skip
    return dim


def _positive(entry: Mapping[str, Any], key: str, where: str, default: float) -> float:
    value = entry.get(key, default)
    if isinstance(value, bool) or not isinstance(value, int | float) or not 0 < value < math.inf:
        raise RanknasError(f"{where}: '{key}' must be a finite number > 0, got {value!r}"
                           f"{_as_text(value)}")  # fmt: skip
    return float(value)


def _histogram(value: Any, where: str) -> tuple[float, ...]:
    ok = isinstance(value, list) and len(value) == HISTOGRAM_BINS
    if not ok or not all(isinstance(v, int | float) and v >= 0 for v in value) or sum(value) <= 0:
        raise RanknasError(
            f"{where}: 'reuse_histogram' must be {HISTOGRAM_BINS} numbers >= 0 with a positive sum"
        )
    total = float(sum(value))
    return tuple(float(v) / total for v in value)


# ---------------------------------------------------------------------- other sources


def tables_from_architecture(
    arch: Architecture, pooling_factors: Mapping[str, float] | None = None
) -> list[TableSpec]:
    """One table per feature, named `t_<feature>` as in the built model's collection."""
    pooling_factors = pooling_factors or {}
    return [
        TableSpec(
            name=table_name(f.name),
            num_embeddings=f.num_embeddings,
            embedding_dim=arch.embedding.feature_dim(f),
            pooling_factor=float(pooling_factors.get(f.name, 1.0)),
        )
        for f in arch.embedding.used
    ]


def tables_from_schema(
    schema: DatasetSchema,
    embedding_dim: int,
    pooling_factors: Mapping[str, float] | None = None,
) -> list[TableSpec]:
    """One table per categorical feature, `embedding_dim` wide, named by `table_name`."""
    pooling_factors = pooling_factors or {}
    return [
        TableSpec(
            name=table_name(f.name),
            num_embeddings=f.cardinality,
            embedding_dim=embedding_dim,
            pooling_factor=float(pooling_factors.get(f.name, 1.0)),
        )
        for f in schema.categorical
    ]


# ---------------------------------------------------------------------- generated pools


@dataclass(frozen=True)
class PoolConfig:
    """Distributions of generated tables, scaled so that a 2-core CPU can time them.

    Rows follow a power law: log10(rows / min_rows) ~ Exponential(rows_decade_scale),
    capped at max_rows. Pooling is 1 for one-hot tables, else 1 + pooling_scale * Lomax
    (a Pareto tail), capped at max_pooling. Zipf exponents are uniform in zipf_range.
    """

    min_rows: int = 100
    max_rows: int = 500_000
    rows_decade_scale: float = 1.0
    dims: tuple[int, ...] = (8, 16, 32, 64, 128)
    dim_weights: tuple[float, ...] = (0.15, 0.3, 0.25, 0.2, 0.1)
    one_hot_share: float = 0.4
    pooling_scale: float = 4.0
    pooling_tail: float = 1.2
    max_pooling: float = 100.0
    zipf_range: tuple[float, float] = (0.3, 1.3)


def generate_tables(count: int, seed: int = 0, config: PoolConfig | None = None) -> list[TableSpec]:
    """`count` tables named t0, t1, ... drawn from `config`'s distributions."""
    config = config or PoolConfig()
    rng = np.random.default_rng(seed)
    decades = rng.exponential(config.rows_decade_scale, count)
    rows = np.minimum(np.round(config.min_rows * 10**decades), config.max_rows).astype(int)
    weights = np.asarray(config.dim_weights) / sum(config.dim_weights)
    dims = rng.choice(config.dims, size=count, p=weights)
    multi_hot = 1.0 + config.pooling_scale * rng.pareto(config.pooling_tail, count)
    pooling = np.where(rng.random(count) < config.one_hot_share, 1.0, multi_hot)
    pooling = np.round(np.minimum(pooling, config.max_pooling), 1)
    alphas = np.round(rng.uniform(*config.zipf_range, count), 3)
    return [
        TableSpec(
            f"t{i}", int(rows[i]), int(dims[i]), float(pooling[i]), zipf_alpha=float(alphas[i])
        )
        for i in range(count)
    ]


POOL_FAMILIES = ("no_dominant", "one_dominant", "many_heavy", "mixed")


def pool_family(family: str, count: int, seed: int) -> list[TableSpec]:
    """`count` tables of one kind of pool, for benchmarks with fresh seeds.

    - no_dominant: power-law rows (1k to 100k), dims 16-128, log-normal pooling (median
      2.7, capped at 30); no table stands out.
    - one_dominant: the same, with t0 a 500k x 128 table read 60 times per example.
    - many_heavy: the same, with 15% of the tables heavy (200k-500k rows, dim 32-64,
      pooling 20-60).
    - mixed: `generate_tables`' defaults (dims 8-128, 40% one-hot, Pareto pooling).
    """
    if family not in POOL_FAMILIES:
        raise RanknasError(f"pool family {family!r}: use one of {', '.join(POOL_FAMILIES)}")
    if family == "mixed":
        return generate_tables(count, seed)
    rng = np.random.default_rng([seed, POOL_FAMILIES.index(family), count])
    rows = np.minimum(np.round(1000 * 10 ** rng.exponential(0.8, count)), 100_000).astype(int)
    dims = rng.choice([16, 32, 64, 128], count)
    pooling = np.clip(np.round(rng.lognormal(1.0, 0.8, count), 1), 1.0, 30.0)
    if family == "many_heavy":
        heavy = rng.random(count) < 0.15
        rows[heavy] = rng.integers(200_000, 500_001, int(heavy.sum()))
        dims[heavy] = rng.choice([32, 64], int(heavy.sum()))
        pooling[heavy] = np.round(rng.uniform(20, 60, int(heavy.sum())), 1)
    if family == "one_dominant":
        rows[0], dims[0], pooling[0] = 500_000, 128, 60.0
    alphas = np.round(rng.uniform(0.3, 1.3, count), 3)
    return [
        TableSpec(
            f"t{i}", int(rows[i]), int(dims[i]), float(pooling[i]), zipf_alpha=float(alphas[i])
        )
        for i in range(count)
    ]


def train_eval_pools(
    train_size: int, eval_size: int, seed: int = 0, config: PoolConfig | None = None
) -> tuple[list[TableSpec], list[TableSpec]]:
    """A training pool and a disjoint held-out pool: one generated pool, split at random."""
    pool = generate_tables(train_size + eval_size, seed, config)
    order = np.random.default_rng(seed + 1).permutation(len(pool))
    return [pool[i] for i in order[:train_size]], [pool[i] for i in order[train_size:]]
