"""The dataset schema: what the model reads (label, dense columns, categorical features).

Every dataset in `trainers` describes itself with a `DatasetSchema`; architectures bind
their embedding configuration to it (one embedding table per categorical feature).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from search_space.errors import RanknasError
from search_space.files import read_data_file

POOLINGS = ("sum", "mean")
# how the file reader maps a column's values to ids (trainers.data.tabular); a model needs
# only the cardinality, so building one from the schema accepts and ignores them
READER_FIELDS = {"separator", "min_count", "hash_size"}


@dataclass(frozen=True)
class CategoricalFeature:
    """One categorical column: one id per row, or (`multi_valued`) a list of ids per row
    whose embeddings are pooled by `pooling` (sum or mean)."""

    name: str
    cardinality: int
    multi_valued: bool = False
    pooling: str = "sum"

    def to_dict(self) -> dict[str, Any]:
        entry: dict[str, Any] = {"name": self.name, "cardinality": self.cardinality}
        return entry | (
            {"multi_valued": True, "pooling": self.pooling} if self.multi_valued else {}
        )


@dataclass(frozen=True)
class DatasetSchema:
    """Label column, dense columns and categorical features (with their cardinalities)."""

    dense: tuple[str, ...]
    categorical: tuple[CategoricalFeature, ...]
    label: str = "label"
    name: str = "dataset"
    time: str | None = None  # the column that orders the rows in time (for splits only)

    @property
    def num_dense(self) -> int:
        return len(self.dense)

    @property
    def num_sparse(self) -> int:
        return len(self.categorical)

    @property
    def feature_names(self) -> list[str]:
        return [f.name for f in self.categorical]

    def to_dict(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "label": self.label,
            "dense": list(self.dense),
            "categorical": [f.to_dict() for f in self.categorical],
        } | ({"time": self.time} if self.time else {})

    @classmethod
    def from_dict(cls, data: Any, source: str = "schema") -> DatasetSchema:
        """Parse a schema mapping; errors name `source` and the field."""
        if not isinstance(data, dict):
            raise RanknasError(f"{source}: expected a mapping with 'label', 'dense', 'categorical'")
        unknown = set(data) - {"name", "label", "dense", "categorical", "time"}
        if unknown & {"data", "search_space", "budget", "searcher", "storage"}:
            raise RanknasError(f"{source}: a study config, not a dataset schema (its fields: "
                               "label, dense, categorical, time); give data.schema the "
                               "schema's file (`ranknas data schema FILE` writes one)")  # fmt: skip
        if unknown:
            raise RanknasError(
                f"{source}: unknown field(s) {sorted(unknown, key=str)}; "
                "allowed: name, label, dense, categorical, time"
            )
        time = data.get("time")
        if time is not None and (not isinstance(time, str) or not time):
            raise RanknasError(f"{source}: 'time' must be a column name (the event time)")
        label = data.get("label", "label")
        if not isinstance(label, str) or not label:
            raise RanknasError(f"{source}: 'label' must be a column name")
        dense = data.get("dense", [])
        if not isinstance(dense, list) or not all(isinstance(c, str) for c in dense):
            raise RanknasError(f"{source}: 'dense' must be a list of column names")
        entries = data.get("categorical") or []
        if not isinstance(entries, list):
            raise RanknasError(f"{source}: 'categorical' must be a list of {{name: COLUMN, "
                               "cardinality: N}}")  # fmt: skip
        categorical = [
            _parse_categorical(entry, f"{source}: categorical[{i}]")
            for i, entry in enumerate(entries)
        ]
        names = [label, *dense, *(f.name for f in categorical), *([time] if time else [])]
        if names.count(label) > 1:
            raise RanknasError(f"{source}: the label {label!r} is also listed as a feature (or "
                               "the time): a model would read its own answer; remove it from "
                               "dense, categorical and time")  # fmt: skip
        duplicates = sorted({n for n in names if names.count(n) > 1})
        if duplicates:
            raise RanknasError(f"{source}: column(s) {duplicates} appear more than once")
        if not dense and not categorical:
            raise RanknasError(f"{source}: needs at least one dense or categorical column")
        return cls(
            dense=tuple(dense),
            categorical=tuple(categorical),
            label=label,
            name=str(data.get("name", "dataset")),
            time=time,
        )

    @classmethod
    def from_yaml(cls, path: str | Path) -> DatasetSchema:
        return cls.from_dict(read_data_file(path, "the schema file"), source=str(path))


def _parse_categorical(entry: Any, where: str) -> CategoricalFeature:
    # `{name: c1, cardinality: 1000[, multi_valued: true, pooling: mean]}` or `{c1: 1000}`.
    if isinstance(entry, str) or (
        isinstance(entry, dict)
        and "cardinality" not in entry
        and isinstance(entry.get("name"), str)
    ):
        name = entry if isinstance(entry, str) else entry["name"]
        if isinstance(entry, dict):  # a misspelt `cardinality` is named, not "missing"
            parse_multi_valued(entry, where, {"name", "cardinality", *READER_FIELDS})
        raise RanknasError(
            f"{where}: {name!r} has no cardinality, which building a model without its data "
            f"needs: give {{name: {name}, cardinality: N}} (`ranknas data schema FILE --label "
            "COL` writes a schema with them; training on the file counts them itself)"
        )
    if isinstance(entry, dict) and {"name", "cardinality"} <= set(entry):
        name, cardinality = entry["name"], entry["cardinality"]
        fields = {"name", "cardinality", *READER_FIELDS}
        multi_valued, pooling = parse_multi_valued(entry, where, fields)
    elif isinstance(entry, dict) and len(entry) == 1:
        ((name, cardinality),) = entry.items()
        multi_valued, pooling = False, "sum"
    else:
        raise RanknasError(f"{where}: expected {{name: COLUMN, cardinality: N}}")
    if not isinstance(name, str) or not name:
        raise RanknasError(f"{where}: 'name' must be a column name")
    if isinstance(cardinality, bool) or not isinstance(cardinality, int) or cardinality < 1:
        raise RanknasError(f"{where} ({name}): 'cardinality' must be an integer >= 1")
    if isinstance(entry, dict):  # the reader's fields: unused by a model, still checked
        min_count = entry.get("min_count")
        check_encoding(1 if min_count is None else min_count, entry.get("hash_size"),
                       f"{where} ({name})")  # fmt: skip
    return CategoricalFeature(name, cardinality, multi_valued, pooling)


def check_encoding(min_count: int, hash_size: int | None, source: str) -> None:
    """Raise a `RanknasError` for a `min_count` below 1 or a `hash_size` below 2."""
    if isinstance(min_count, bool) or not isinstance(min_count, int) or min_count < 1:
        raise RanknasError(f"{source}: min_count must be an integer >= 1 (got {min_count!r})")
    if hash_size is not None and (
        isinstance(hash_size, bool) or not isinstance(hash_size, int) or hash_size < 2
    ):
        raise RanknasError(f"{source}: hash_size must be an integer >= 2 (got {hash_size!r})")


def parse_multi_valued(entry: dict[str, Any], where: str, fields: set[str]) -> tuple[bool, str]:
    """`multi_valued` and `pooling` of a categorical entry whose other keys are `fields`."""
    allowed = fields | {"multi_valued", "pooling"}
    unknown = sorted(set(entry) - allowed, key=str)  # YAML keys may be numbers
    if unknown:
        raise RanknasError(f"{where}: unknown field(s) {unknown}; allowed: {sorted(allowed)}")
    multi_valued = entry.get("multi_valued", False)
    if not isinstance(multi_valued, bool):
        raise RanknasError(f"{where}: 'multi_valued' must be true or false")
    pooling = entry.get("pooling", "sum")
    if pooling not in POOLINGS:
        raise RanknasError(f"{where}: 'pooling' must be one of {', '.join(POOLINGS)}")
    if "pooling" in entry and not multi_valued:
        raise RanknasError(
            f"{where}: 'pooling' needs 'multi_valued: true' (one id per row needs no pooling)"
        )
    return multi_valued, pooling


def synthetic_schema(num_dense: int = 8, num_sparse: int = 16, seed: int = 0) -> DatasetSchema:
    """The schema of the built-in synthetic data set: power-law table sizes, 10 to 20,000 rows."""
    import numpy as np

    rng = np.random.default_rng(seed)
    cardinalities = np.round(10 ** rng.uniform(1.0, np.log10(20_000), size=num_sparse)).astype(int)
    return DatasetSchema(
        dense=tuple(f"d{i}" for i in range(num_dense)),
        categorical=tuple(CategoricalFeature(f"c{i}", int(c)) for i, c in enumerate(cardinalities)),
        name="synthetic",
    )


def load_schema(path: str | None) -> DatasetSchema:
    """A dataset schema YAML, or the built-in synthetic schema when `path` is None."""
    return DatasetSchema.from_yaml(path) if path else synthetic_schema()
