"""Your own logs: a CSV or Parquet file plus a YAML schema.

The schema file names the columns:

    label: clicked
    dense: [price, age]
    categorical: [country, ad_id]            # ids computed by frequency (or hashing)
    # or, for columns that already hold ids in [0, N):  - {name: slot, cardinality: N}

Categorical columns given by name are mapped to ids like the Criteo reader does (see
`trainers.data.encoding`); the resulting `DatasetSchema` carries the cardinalities.
Dense values are taken as they are (empty -> 0). Rows with a label that is not 0/1, a
dense value that is not a finite number, or an id column value outside [0, N) are
skipped, counted and reported (CSV: file line numbers; Parquet: 1-based row numbers).
pandas reads CSV; pyarrow reads and writes Parquet; both are imported only when needed.
"""

from __future__ import annotations

import importlib
import logging
from dataclasses import dataclass, replace
from pathlib import Path
from types import ModuleType
from typing import Any

import numpy as np
import yaml

from search_space.errors import RanknasError
from search_space.files import read_data_file
from search_space.schema import CategoricalFeature, DatasetSchema
from trainers.data.dataset import TabularData
from trainers.data.encoding import check_encoding, frequency_ids, hashed_ids
from trainers.data.report import BadRowLimits, BadRowReport

logger = logging.getLogger(__name__)

CSV_SUFFIXES = (".csv",)
PARQUET_SUFFIXES = (".parquet", ".pq")
TABULAR_SUFFIXES = CSV_SUFFIXES + PARQUET_SUFFIXES


@dataclass(frozen=True)
class TabularSchema:
    """A user's schema file: categorical cardinality None = compute ids from the values."""

    label: str
    dense: tuple[str, ...]
    categorical: tuple[tuple[str, int | None], ...]
    name: str = "dataset"
    source: str = "schema"
    time: str | None = None

    @property
    def columns(self) -> list[str]:
        names = [self.label, *self.dense, *(name for name, _ in self.categorical)]
        return names + ([self.time] if self.time and self.time not in names else [])


def read_tabular_schema(path: str | Path) -> TabularSchema:
    """Parse a schema YAML; categorical entries are names or `{name: .., cardinality: ..}`."""
    path = Path(path)
    data = read_data_file(path, "the schema file")
    if not isinstance(data, dict):
        raise RanknasError(f"{path}: expected a mapping with 'label', 'dense', 'categorical'")
    entries = data.get("categorical") or []
    if not isinstance(entries, list):
        raise RanknasError(f"{path}: 'categorical' must be a list of column names")
    categorical = [
        _categorical_entry(e, f"{path}: categorical[{i}]") for i, e in enumerate(entries)
    ]
    # DatasetSchema checks the other fields, unknown fields and duplicate columns.
    placeholders = [{"name": name, "cardinality": card or 1} for name, card in categorical]
    checked = DatasetSchema.from_dict({**data, "categorical": placeholders}, source=str(path))
    return TabularSchema(
        label=checked.label,
        dense=checked.dense,
        categorical=tuple(categorical),
        name=checked.name,
        source=str(path),
        time=checked.time,
    )


def _categorical_entry(entry: Any, where: str) -> tuple[str, int | None]:
    if isinstance(entry, str) and entry:
        return entry, None
    if isinstance(entry, dict) and set(entry) in ({"name"}, {"name", "cardinality"}):
        name, cardinality = entry["name"], entry.get("cardinality")
    elif isinstance(entry, dict) and len(entry) == 1:
        ((name, cardinality),) = entry.items()
    else:
        raise RanknasError(f"{where}: expected a column name or {{name: COLUMN, cardinality: N}}")
    if not isinstance(name, str) or not name:
        raise RanknasError(f"{where}: 'name' must be a column name")
    if cardinality is not None and (
        isinstance(cardinality, bool) or not isinstance(cardinality, int) or cardinality < 1
    ):
        raise RanknasError(f"{where} ({name}): 'cardinality' must be an integer >= 1")
    return name, cardinality


def load_tabular(
    path: str | Path,
    schema_path: str | Path,
    *,
    min_count: int = 1,
    hash_size: int | None = None,
    max_bad_rows: int | None = 1000,
    max_bad_fraction: float | None = 0.01,
    time_column: str | None = None,
) -> TabularData:
    """Read a CSV/Parquet file described by a schema YAML into a `TabularData`.

    min_count / hash_size: how categorical columns given by name become ids;
    max_bad_rows / max_bad_fraction: the load stops past either limit of malformed rows;
    time_column: the column of event times (numbers or dates) that orders the rows for a
    time split (default: the schema's `time`).
    """
    path = Path(path)
    spec = read_tabular_schema(schema_path)
    if time_column:
        spec = replace(spec, time=time_column)
    check_encoding(min_count, hash_size, str(path))
    limits = BadRowLimits(max_bad_rows, max_bad_fraction)
    frame, report = _read_frame(path, spec)
    labels, dense, id_columns, bad = _convert(frame, spec, report)
    times = _times(frame, spec, report, bad) if spec.time else None
    report.bad = int(bad.sum())
    limits.check(report, final=True)
    if report.bad:
        logger.warning("skipped %d malformed %ss: %s", report.bad, report.unit, report.describe())
    good = ~bad
    ids, features, raw = [], [], {}
    for (name, cardinality), column in zip(spec.categorical, id_columns, strict=True):
        if cardinality is None:
            column, cardinality = _encode(frame[name][good], min_count, hash_size)
            if hash_size is None:  # a vocabulary: refitted on the training split
                raw[name] = _raw_values(frame[name][good])
        else:
            column = column[good]
        ids.append(column)
        features.append(CategoricalFeature(name, cardinality))
    kept = labels[good]
    if kept.size and (kept.min() == kept.max()):
        raise RanknasError(
            f"{path}: every row's label ({spec.label}) is {int(kept[0])}: a ranking model "
            "needs both clicks (1) and non-clicks (0)"
        )
    schema = DatasetSchema(spec.dense, tuple(features), spec.label, spec.name, spec.time)
    categorical = np.stack(ids, axis=1) if ids else np.zeros((int(good.sum()), 0), np.int64)
    return TabularData(dense[good], categorical, labels[good], schema, bad_rows=report,
                       time=None if times is None else times[good], raw_values=raw)  # fmt: skip


def _raw_values(series: Any) -> tuple[np.ndarray, tuple[str, ...]]:
    """Each row's value as a code into the column's distinct values (-1: missing or blank)."""
    pd = _import("pandas", "reading tabular data")
    codes, uniques = pd.factorize(series.astype(str).str.strip(), use_na_sentinel=True)
    values = tuple(str(u) for u in uniques)
    blank = np.asarray([v == "" for v in values], dtype=bool)
    codes = np.asarray(codes, dtype=np.int64)
    return np.where((codes >= 0) & blank[np.maximum(codes, 0)], -1, codes), values


def _times(frame: Any, spec: TabularSchema, report: BadRowReport, bad: np.ndarray) -> np.ndarray:
    """The time column as numbers (dates as nanoseconds); marks rows without a time bad."""
    pd = _import("pandas", "reading tabular data")
    column = frame[spec.time]
    values, missing = _numeric(column)
    if np.isnan(values[~missing]).any():  # not numbers: dates
        dates = pd.to_datetime(column, errors="coerce", utc=True)
        values = np.where(dates.isna(), np.nan, dates.astype("int64").to_numpy(np.float64))
    wrong = np.isnan(values)
    first = 2 if report.unit == "line" else 1
    report.add(f"time not a number or a date ({spec.time})", np.flatnonzero(wrong) + first)
    bad |= wrong
    return values


FLOAT32_MAX = float(np.finfo(np.float32).max)


def _import(module: str, purpose: str) -> ModuleType:
    try:
        return importlib.import_module(module)
    except ImportError:
        package = module.split(".")[0]
        raise RanknasError(
            f"{purpose} needs the '{package}' package; install it (pip install {package})"
        ) from None


def _read_frame(
    path: Path, spec: TabularSchema, columns: list[str] | None = ()
) -> tuple[Any, BadRowReport]:
    """The schema's columns (`columns=None`: all of them) as a pandas DataFrame (CSV: all as
    strings), and an empty report."""
    suffix = path.suffix.lower()
    if suffix not in TABULAR_SUFFIXES:
        raise RanknasError(f"{path}: unknown file type; use one of {', '.join(TABULAR_SUFFIXES)}")
    if not path.is_file():
        raise RanknasError(f"{path}: no such file")
    try:
        if suffix in CSV_SUFFIXES:
            pd = _import("pandas", f"reading {path}")
            if columns is not None:
                _check_columns(spec, path, list(pd.read_csv(path, nrows=0).columns))
            usecols = spec.columns if columns is not None else None
            frame = pd.read_csv(path, usecols=usecols, dtype=str, keep_default_na=False)
            return frame, BadRowReport(str(path), unit="line")
        pq = _import("pyarrow.parquet", f"reading {path}")
        if columns is not None:
            _check_columns(spec, path, list(pq.read_schema(path).names))
        frame = pq.read_table(path, columns=spec.columns if columns is not None else None)
        frame = frame.to_pandas()
        return frame, BadRowReport(str(path), unit="row")
    except (ValueError, OSError) as exc:  # pandas' and pyarrow's parse errors derive from these
        raise RanknasError(f"{path}: cannot read the file ({exc})") from None


def _check_columns(spec: TabularSchema, path: Path, available: list[str]) -> None:
    missing = [c for c in spec.columns if c not in available]
    if missing:
        raise RanknasError(
            f"{spec.source}: column(s) {missing} not in {path}; the file has {available}. "
            "Fix the names in the schema file."
        )


def _convert(
    frame: Any, spec: TabularSchema, report: BadRowReport
) -> tuple[np.ndarray, np.ndarray, list[np.ndarray | None], np.ndarray]:
    """Labels, dense values, given-id columns (None where ids are computed), bad-row mask."""
    report.rows = len(frame)
    first = 2 if report.unit == "line" else 1  # CSV line 1 is the header
    numbers = np.arange(first, first + len(frame))
    label, missing = _numeric(frame[spec.label])
    bad = missing | ~np.isin(label, (0.0, 1.0))
    report.add(f"label not 0/1 ({spec.label})", numbers[bad])
    dense = np.zeros((len(frame), len(spec.dense)), dtype=np.float32)
    for k, name in enumerate(spec.dense):
        values, missing = _numeric(frame[name])
        wrong = ~missing & ~np.isfinite(values)
        report.add(f"dense value not a number ({name})", numbers[wrong])
        with np.errstate(invalid="ignore"):
            huge = ~missing & ~wrong & (np.abs(values) > FLOAT32_MAX)
        report.add(f"dense value beyond float32 ({name})", numbers[huge])
        if missing.any():
            logger.warning("%s: %d blank value(s) in dense column %r (first at %s %d): filled "
                           "with the training mean", report.source, int(missing.sum()), name,
                           report.unit, int(numbers[missing][0]))  # fmt: skip
        # Blanks stay NaN until the preprocessing fitted on the training split fills them.
        dense[:, k] = np.where(missing, np.nan, np.where(wrong | huge, 0.0, values))
        bad |= wrong | huge
    id_columns: list[np.ndarray | None] = []
    for name, cardinality in spec.categorical:
        if cardinality is None:
            id_columns.append(None)
            continue
        values, missing = _numeric(frame[name])
        with np.errstate(invalid="ignore"):
            wrong = missing | ~(
                (values >= 0) & (values < cardinality) & (values == np.floor(values))
            )
        report.add(f"id not an integer in [0, {cardinality}) ({name})", numbers[wrong])
        id_columns.append(np.where(wrong, 0, values).astype(np.int64))
        bad |= wrong
    return label.astype(np.float32), dense, id_columns, bad


def _numeric(series: Any) -> tuple[np.ndarray, np.ndarray]:
    """Values as float64 (NaN where not a number) and which entries are missing (null/blank)."""
    pd = _import("pandas", "reading tabular data")
    missing = series.isna().to_numpy(dtype=bool, copy=True)
    if not pd.api.types.is_numeric_dtype(series):
        missing |= series.astype(str).str.strip().eq("").to_numpy(dtype=bool)
    values = pd.to_numeric(series, errors="coerce").to_numpy(dtype=np.float64, na_value=np.nan)
    return values, missing


def _encode(series: Any, min_count: int, hash_size: int | None) -> tuple[np.ndarray, int]:
    """Ids (0 = missing) and cardinality of a categorical column, by frequency or hashing."""
    pd = _import("pandas", "reading tabular data")
    codes, uniques = pd.factorize(series, use_na_sentinel=True)
    codes = np.asarray(codes, dtype=np.int64)
    blank = np.asarray([str(u).strip() == "" for u in uniques], dtype=bool)
    codes = np.where((codes >= 0) & blank[np.maximum(codes, 0)], -1, codes)
    if hash_size is None:
        return frequency_ids(codes, min_count)
    hashes = pd.util.hash_array(np.asarray([str(u) for u in uniques], dtype=object))
    row_hashes = hashes[np.maximum(codes, 0)] if len(uniques) else np.zeros(len(codes), np.uint64)
    return hashed_ids(row_hashes, codes < 0, hash_size), hash_size


def write_tabular(data: TabularData, path: str | Path) -> Path:
    """Write the schema's columns (label as 0/1 integers) and `true_prob` if known.

    The format follows the suffix: .csv (pandas) or .parquet/.pq (pyarrow).
    """
    path = Path(path)
    schema = data.schema
    columns: dict[str, np.ndarray] = {schema.label: data.labels.astype(np.int8)}
    columns |= {name: data.dense[:, k] for k, name in enumerate(schema.dense)}
    columns |= {name: data.categorical[:, k] for k, name in enumerate(schema.feature_names)}
    if data.true_prob is not None:
        columns["true_prob"] = data.true_prob
    suffix = path.suffix.lower()
    if suffix in CSV_SUFFIXES:
        pd = _import("pandas", f"writing {path}")
        pd.DataFrame(columns).to_csv(path, index=False)
    elif suffix in PARQUET_SUFFIXES:
        pa = _import("pyarrow", f"writing {path}")
        pq = _import("pyarrow.parquet", f"writing {path}")
        pq.write_table(pa.table(columns), path)
    else:
        raise RanknasError(f"{path}: unknown file type; use one of {', '.join(TABULAR_SUFFIXES)}")
    return path


def write_schema(schema: DatasetSchema, path: str | Path) -> Path:
    """Write a schema YAML that `read_tabular_schema` reads back (ids taken as they are)."""
    path = Path(path)
    path.write_text(yaml.safe_dump(schema.to_dict(), sort_keys=False))
    return path


DENSE_MIN_DISTINCT = 50  # a numeric column with fewer distinct whole values is categorical


def infer_schema(path: str | Path, label: str, time: str | None = None) -> dict[str, Any]:
    """A schema for a CSV/Parquet file, to edit: numeric columns with many values (or any
    fraction) are dense, the others categorical with their cardinality (distinct values + 2:
    missing and out of vocabulary)."""
    path = Path(path)
    spec = TabularSchema(label=label, dense=(), categorical=(), source=str(path))
    frame, _ = _read_frame(path, replace(spec, dense=(), categorical=()), columns=None)
    missing = [c for c in (label, time) if c and c not in frame.columns]
    if missing:
        raise RanknasError(f"{path}: no column(s) {missing}; the file has {list(frame.columns)}")
    dense, categorical = [], []
    for column in frame.columns:
        if column in (label, time):
            continue
        values, blank = _numeric(frame[column])
        numeric = not np.isnan(values[~blank]).any()
        distinct = frame[column][~blank].nunique()
        whole = numeric and bool(np.all(values[~blank] == np.floor(values[~blank])))
        if numeric and (distinct >= DENSE_MIN_DISTINCT or not whole):
            dense.append(str(column))
        else:
            categorical.append({"name": str(column), "cardinality": int(distinct) + 2})
    schema: dict[str, Any] = {"name": path.stem, "label": label}
    if time:
        schema["time"] = time
    return schema | {"dense": dense, "categorical": categorical}
