"""Your own logs: a CSV or Parquet file plus a YAML schema.

The schema file names the columns:

    label: clicked
    dense: [price, age]
    categorical:
      - country                              # ids from a vocabulary of the values
      - {name: ad_id, min_count: 5}          # values seen fewer times: out of vocabulary
      - {name: query, hash_size: 100000}     # hashed into 100,000 buckets, no vocabulary
      - {name: genres, multi_valued: true, pooling: mean, separator: "|"}  # lists
      - {name: slot, cardinality: N}         # a column that already holds ids in [0, N)

Categorical columns given by name (and every multi-valued column, whose `cardinality`, if
given, serves only to build models without the data) are kept as raw values
(`RawColumn`) and mapped to ids by `trainers.data.preprocess` (id 0 missing, 1 out of
vocabulary); the resulting `DatasetSchema` carries the cardinalities. A multi-valued cell
is a list (Parquet) or a text whose items are split at `separator` (default "|"); an
empty cell is missing, an empty item ("a||b") makes the row malformed, a list's null
element is dropped.
Dense values are taken as they are (empty -> NaN until preprocessed). Rows with a label
that is not 0/1 (or true/false, yes/no, in any case), a dense value that is not a finite
number, an id column value outside [0, N) or a malformed list cell are skipped, counted and
reported (CSV: file line numbers; Parquet: 1-based row numbers).
pandas reads CSV; pyarrow reads and writes Parquet; both are imported only when needed.
"""

from __future__ import annotations

import codecs
import csv
import importlib
import json
import logging
import re
import warnings
from dataclasses import dataclass, replace
from pathlib import Path
from types import ModuleType
from typing import Any, NamedTuple

import numpy as np
import yaml

from search_space.errors import RanknasError
from search_space.files import looked_for, read_data_file
from search_space.preprocessing import FIRST_ID, MISSING_NUMBERS, split_cell
from search_space.schema import (
    READER_FIELDS,
    CategoricalFeature,
    DatasetSchema,
    check_encoding,
    parse_multi_valued,
)
from trainers.data import parquet_parts
from trainers.data.compressed import (
    compression,
    damaged_as_user_error,
    format_suffix,
    open_data,
    starts_with,
)
from trainers.data.dataset import Jagged, RawColumn, TabularData
from trainers.data.parquet_parts import PARQUET_SUFFIXES
from trainers.data.preprocess import column_ids, column_vocabulary
from trainers.data.report import BadRowLimits, BadRowReport, warn_blank_categorical

logger = logging.getLogger(__name__)

CSV_SUFFIXES = (".csv", ".tsv")  # plain or compressed (logs.csv.gz, .bz2, .xz)
TABULAR_SUFFIXES = CSV_SUFFIXES + PARQUET_SUFFIXES
FILE_TYPES = ".csv, .tsv (either also as .gz, .bz2 or .xz), .parquet, .pq"


DEFAULT_SEPARATOR = "|"
# The synthetic data's true click probability, written beside its rows: the answer a model
# is asked for, so never a feature (left out by `infer_schema`, refused in a schema).
TRUE_PROB_COLUMN = "true_prob"
MANGLED = re.compile(r".+\.\d+")  # how pandas renames a column name's second use: x.1


@dataclass(frozen=True)
class CategoricalColumn:
    """A categorical entry of a schema file. Ids come from the values (a vocabulary or
    hashing) unless only a `cardinality` is given: then the column holds ids as given."""

    name: str
    cardinality: int | None = None
    multi_valued: bool = False
    pooling: str = "sum"
    separator: str = DEFAULT_SEPARATOR
    min_count: int | None = None  # None: load_tabular's min_count
    hash_size: int | None = None  # None: load_tabular's hash_size

    @property
    def from_values(self) -> bool:
        """Whether ids are mapped from raw values (else the column holds ids as given)."""
        return (
            self.cardinality is None
            or self.multi_valued
            or self.min_count is not None
            or self.hash_size is not None
        )


@dataclass(frozen=True)
class TabularSchema:
    """A user's schema file."""

    label: str
    dense: tuple[str, ...]
    categorical: tuple[CategoricalColumn, ...]
    name: str = "dataset"
    source: str = "schema"
    time: str | None = None

    @property
    def columns(self) -> list[str]:
        names = [self.label, *self.dense, *(c.name for c in self.categorical)]
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
    placeholders = [
        {"name": c.name, "cardinality": c.cardinality or 1}
        | ({"multi_valued": True, "pooling": c.pooling} if c.multi_valued else {})
        for c in categorical
    ]
    checked = DatasetSchema.from_dict({**data, "categorical": placeholders}, source=str(path))
    if TRUE_PROB_COLUMN in [*checked.dense, *(c.name for c in categorical)]:
        raise RanknasError(f"{path}: {TRUE_PROB_COLUMN} is the synthetic data's true click "
                           "probability, the answer itself: a model that reads it learns "
                           "nothing; remove it from the features")  # fmt: skip
    return TabularSchema(
        label=checked.label,
        dense=checked.dense,
        categorical=tuple(categorical),
        name=checked.name,
        source=str(path),
        time=checked.time,
    )


_COLUMN_FIELDS = {"name", "cardinality", *READER_FIELDS}


def _categorical_entry(entry: Any, where: str) -> CategoricalColumn:
    if isinstance(entry, str) and entry:
        return CategoricalColumn(entry)
    if isinstance(entry, dict) and "name" in entry:
        name, cardinality = entry["name"], entry.get("cardinality")
        multi_valued, pooling = parse_multi_valued(entry, where, _COLUMN_FIELDS)
    elif isinstance(entry, dict) and len(entry) == 1:
        ((name, cardinality),) = entry.items()
        multi_valued, pooling = False, "sum"
    else:
        raise RanknasError(f"{where}: expected a column name or {{name: COLUMN, cardinality: N}}")
    if not isinstance(name, str) or not name:
        raise RanknasError(f"{where}: 'name' must be a column name")
    where = f"{where} ({name})"
    if cardinality is not None and (
        isinstance(cardinality, bool) or not isinstance(cardinality, int) or cardinality < 1
    ):
        raise RanknasError(f"{where}: 'cardinality' must be an integer >= 1")
    column = CategoricalColumn(name, cardinality, multi_valued, pooling)
    return _encoding_settings(column, entry if isinstance(entry, dict) else {}, where)


def _encoding_settings(column: CategoricalColumn, entry: dict, where: str) -> CategoricalColumn:
    """`separator`, `min_count` and `hash_size` of a categorical entry, checked."""
    separator = entry.get("separator", DEFAULT_SEPARATOR)
    if "separator" in entry and not column.multi_valued:
        raise RanknasError(f"{where}: 'separator' needs 'multi_valued: true'")
    if not isinstance(separator, str) or not separator:
        raise RanknasError(f"{where}: 'separator' must be a non-empty text, such as \"|\"")
    min_count, hash_size = entry.get("min_count"), entry.get("hash_size")
    if hash_size is not None and column.cardinality not in (None, hash_size):
        raise RanknasError(
            f"{where}: a hashed column's cardinality is its hash_size ({hash_size}): "
            "drop 'cardinality' or make them equal"
        )
    if min_count is not None and hash_size is not None:
        raise RanknasError(
            f"{where}: give min_count (a vocabulary) or hash_size (hashing), not both"
        )
    check_encoding(1 if min_count is None else min_count, hash_size, where)
    return replace(column, separator=separator, min_count=min_count, hash_size=hash_size)


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
        _check_time_column(time_column, path)
    check_encoding(min_count, hash_size, str(path))
    limits = BadRowLimits(max_bad_rows, max_bad_fraction)
    frame, report = _read_frame(path, spec)
    misshapen = _wrong_field_count(path, report, len(frame)) if report.unit == "line" else None
    labels, dense, id_columns, bad = _convert(frame, spec, report)
    if misshapen is not None:
        bad |= misshapen
    raw_columns = [
        _raw_column(frame[c.name], c, report, bad) if c.from_values else None
        for c in spec.categorical
    ]
    times = _times(frame, spec, report, bad) if spec.time else None
    report.bad = int(bad.sum())
    limits.check(report, final=True)
    if report.bad:
        logger.warning("%s: skipped %d malformed %ss: %s", path, report.bad, report.unit,
                       report.describe())  # fmt: skip
    good = ~bad
    encoded = [
        _encoded(c, given, read, good, min_count, hash_size)
        for c, given, read in zip(spec.categorical, id_columns, raw_columns, strict=True)
    ]
    features = tuple(e.feature for e in encoded)
    raw = {e.feature.name: e.raw for e in encoded if e.raw is not None}
    if good.any():
        warn_blank_categorical(
            str(path),
            [name for name, column in raw.items() if not (column.codes.values >= 0).any()],
        )
    multi_hot = {e.feature.name: e.lists for e in encoded if e.lists is not None}
    kept = labels[good]
    if not kept.size:
        why = "every row is malformed" if len(frame) else _no_rows(path)
        raise RanknasError(f"{path}: nothing to train on: {why}")
    if kept.min() == kept.max():
        raise RanknasError(
            f"{path}: every row's label ({spec.label}) is {int(kept[0])}: a ranking model "
            "needs both clicks (1) and non-clicks (0)"
        )
    schema = DatasetSchema(spec.dense, features, spec.label, spec.name, spec.time)
    ids = [e.ids for e in encoded]
    categorical = np.stack(ids, axis=1) if ids else np.zeros((int(good.sum()), 0), np.int64)
    return TabularData(
        dense[good],
        categorical,
        labels[good],
        schema,
        bad_rows=report,
        time=None if times is None else times[good],
        raw_values=raw,
        multi_hot=multi_hot,
    )


class _Encoded(NamedTuple):
    ids: np.ndarray  # one id per kept row (-1 for a multi-valued column)
    feature: CategoricalFeature
    raw: RawColumn | None = None  # the kept rows' raw values, for the training vocabulary
    lists: Jagged | None = None  # a multi-valued column's ids


def _encoded(
    column: CategoricalColumn,
    given: np.ndarray | None,
    raw: RawColumn | None,
    good: np.ndarray,
    min_count: int,
    hash_size: int | None,
) -> _Encoded:
    """A categorical column's ids on the kept rows: as given, or from its values through a
    vocabulary of all of them (refitted on the training split later) or hashing."""
    if raw is None:
        return _Encoded(given[good], CategoricalFeature(column.name, column.cardinality))
    if column.min_count is not None or column.hash_size is not None:
        min_count, hash_size = column.min_count or 1, column.hash_size
    raw = replace(
        raw, codes=raw.codes.take(np.flatnonzero(good)), min_count=min_count, hash_size=hash_size
    )
    known = column_vocabulary(raw) if hash_size is None else []
    ids = column_ids(raw, known, hash_size)
    feature = CategoricalFeature(
        column.name, hash_size or len(known) + FIRST_ID, column.multi_valued, column.pooling
    )
    if not column.multi_valued:
        return _Encoded(ids, feature, raw)
    lists = Jagged(raw.codes.offsets, ids)
    return _Encoded(np.full(len(lists.offsets) - 1, -1, dtype=np.int64), feature, raw, lists)


def _list_column(series: Any) -> dict[str, Any] | None:
    """The schema entry (without name) of a column of lists, or None if it holds values."""
    cells = [c for c in series.tolist() if not _blank_cell(c)]
    if not cells:
        return None
    if any(isinstance(c, list | tuple) or hasattr(c, "tolist") for c in cells):
        separator = None
    else:
        separator, share = _likeliest_separator(cells)
        if share < LIST_SHARE:
            return None
    items = set()
    for cell in cells:
        try:
            items.update(split_cell(cell, separator))
        except ValueError:
            continue  # a malformed cell: the load reports it
    entry = {"cardinality": len(items) + 2, "multi_valued": True, "pooling": "mean"}
    return entry | ({"separator": separator} if separator else {})


def _blank_cell(cell: Any) -> bool:
    return (
        cell is None
        or (isinstance(cell, float) and cell != cell)
        or (isinstance(cell, str) and not cell.strip())
    )


def _raw_column(
    series: Any, column: CategoricalColumn, report: BadRowReport, bad: np.ndarray
) -> RawColumn:
    """A column's raw values (items, for a multi-valued one); marks malformed cells bad."""
    if not column.multi_valued:
        codes, values = _factorized(series)
        return RawColumn(Jagged(np.arange(len(codes) + 1, dtype=np.int64), codes), values)
    lengths = np.ones(len(series), dtype=np.int64)
    items: list[Any] = []
    problems: dict[str, list[int]] = {}
    for i, cell in enumerate(series.tolist()):
        try:
            texts = split_cell(cell, column.separator)
        except ValueError as exc:
            problems.setdefault(str(exc), []).append(i)
            texts = []
        items.extend(texts or [None])  # an empty cell: one missing item
        lengths[i] = max(len(texts), 1)
    for problem, rows in problems.items():
        report.add(f"bad list cell ({column.name}): {problem}", report.numbers(len(series))[rows])
        bad[rows] = True
    if lengths.max(initial=0) <= 1:
        _warn_other_separator(series, column, report.source)
    pd = _import("pandas", "reading tabular data")
    codes, values = _factorized(pd.Series(items, dtype=object))
    offsets = np.zeros(len(series) + 1, dtype=np.int64)
    np.cumsum(lengths, out=offsets[1:])
    return RawColumn(Jagged(offsets, codes), values, separator=column.separator, multi_valued=True)


def _warn_other_separator(series: Any, column: CategoricalColumn, source: str) -> None:
    """Say so where a multi-valued column's separator splits no cell while another one is in
    many: every cell would be read as one item (a schema that names `;` for a `|` file)."""
    cells = [c for c in series.tolist() if not _blank_cell(c)]
    other, share = _likeliest_separator(cells) if cells else (None, 0.0)
    if other != column.separator and share >= LIST_SHARE:
        logger.warning("%s: no cell of the multi-valued column %r holds its separator %r, and "
                       "%.0f%% hold %r: each cell is read as one item; set `separator: %r` in "
                       "the schema if that one separates its items", source, column.name,
                       column.separator, 100 * share, other, other)  # fmt: skip


def _likeliest_separator(cells: list[Any]) -> tuple[str, float]:
    """Of `LIST_SEPARATORS`, the one most of the (non-blank) `cells` hold, and their share."""
    texts = [c for c in cells if isinstance(c, str)]
    shares = {s: sum(s in t for t in texts) / len(cells) for s in LIST_SEPARATORS}
    separator = max(shares, key=shares.__getitem__)
    return separator, shares[separator]


def _factorized(series: Any) -> tuple[np.ndarray, tuple[str, ...]]:
    """Each entry's code into the distinct stripped texts (-1: missing or blank), and those."""
    pd = _import("pandas", "reading tabular data")
    missing = series.isna().to_numpy(dtype=bool, copy=True)
    texts = series.astype(str).str.strip()
    missing |= texts.eq("").to_numpy(dtype=bool)
    codes, uniques = pd.factorize(texts.where(~missing), use_na_sentinel=True)
    return np.asarray(codes, dtype=np.int64), tuple(str(u) for u in uniques)


def _looks_like_dates(series: Any, sample: int = 1000) -> bool:
    """A column of dates (a date type, or texts that all parse as dates), not numbers."""
    pd = _import("pandas", "reading tabular data")
    if pd.api.types.is_datetime64_any_dtype(series):
        return True
    if pd.api.types.is_numeric_dtype(series):
        return False
    texts = series.dropna().astype(str).str.strip()
    texts = _spread_sample(texts[texts.ne("")], sample)
    if texts.empty or not pd.to_numeric(texts, errors="coerce").isna().all():
        return False
    if _with_decimal_commas(texts):  # "1,5" parses as a date: a number, written otherwise
        return False
    # "jan": no date; a stray cell (`0000-00-00`) is its line's fault, skipped when loading
    stray = ~texts.str.contains(r"\d") | _dates(texts).isna()
    return bool(stray.mean() <= STRAY_WORDS_SHARE)


def _is_number(text: str) -> bool:
    try:
        float(text)
    except ValueError:
        return False
    return True


def _counts_the_rows(values: np.ndarray, name: str) -> bool:
    """Whether a column of whole numbers numbers the rows: one more on each row than the
    one before, or with a header pandas makes up for an empty one (`Unnamed: 0`: the index
    `DataFrame.to_csv` writes by default) and a different value on every row."""
    if len(values) < 2:
        return False
    steps = np.diff(values)
    return bool(np.all(steps == 1)) or (
        UNNAMED.fullmatch(name) is not None and len(np.unique(values)) == len(values)
    )


def _spread_sample(texts: Any, size: int) -> Any:
    """At most `size` of `texts`: the first half from the top, the rest evenly spaced to the
    end (read from the top alone, dates written another way from row 15,000 on made a
    time column that every later row failed to load in)."""
    if len(texts) <= size:
        return texts
    rest = np.linspace(size // 2, len(texts) - 1, size - size // 2).astype(int)
    return texts.iloc[np.concatenate([np.arange(size // 2), rest])]


def _dates_in_several_formats(series: Any, sample: int = 200) -> list[str]:
    """A text column's dates, one per way of writing them, where it holds them written more
    than one way (`2024-01-01`, `01/01/2024`): each reads as a date on its own, the column as
    a whole does not (`_looks_like_dates`). Empty for any other column."""
    pd = _import("pandas", "reading tabular data")
    if pd.api.types.is_numeric_dtype(series) or pd.api.types.is_datetime64_any_dtype(series):
        return []
    texts = series.dropna().astype(str).str.strip()
    texts = _spread_sample(texts[texts.ne("")].drop_duplicates(), sample)
    if _with_decimal_commas(texts):  # numbers ("21,37"), which pandas reads as dates
        return []
    with warnings.catch_warnings():  # pandas warns when it guesses the format per value
        warnings.simplefilter("ignore")
        parsed = pd.to_datetime(texts, format="mixed", errors="coerce", utc=True)
    parsed = parsed.where(texts.str.contains(r"\d"))  # as `_looks_like_dates`
    if len(texts) < 2 or parsed.notna().mean() < 0.9:
        return []
    by_shape: dict[str, str] = {}  # the first date of each shape (digits as 9)
    for text in texts[parsed.notna()]:
        by_shape.setdefault(re.sub(r"\d", "9", text), text)
    return list(by_shape.values())[:3] if len(by_shape) > 1 else []


def _say_dates_in_several_formats(path: Path, frame: Any, label: str) -> None:
    """Name each column of dates written more than one way: no time column is inferred from
    it, and the rows split in file order."""
    for column in frame.columns:
        if column != label and (shown := _dates_in_several_formats(frame[column])):
            logger.warning("%s: %s holds dates written in more than one way (%s): not taken as "
                           "the time column, so the rows split in file order; write them one "
                           "way (such as 2024-01-31) and pass --time %s to split in time "
                           "order", path, column, ", ".join(shown), column)  # fmt: skip


def _dates(texts: Any) -> Any:
    """Texts as dates (UTC), NaT where one is none. pandas reads `01/11/2023` month first,
    and then refuses `13/11/2023`: where reading day first reads more of them, the column
    is day first throughout (read month first, the rows it kept were out of time order)."""
    pd = _import("pandas", "reading tabular data")
    with warnings.catch_warnings():  # pandas warns when it guesses the format per value
        warnings.simplefilter("ignore")
        dates = pd.to_datetime(texts, errors="coerce", utc=True)
        if dates.isna().any():
            day_first = pd.to_datetime(texts, errors="coerce", utc=True, dayfirst=True)
            if day_first.isna().sum() < dates.isna().sum():
                return day_first
    return dates


def _time_values(column: Any) -> np.ndarray:
    """A time column as numbers (dates as nanoseconds), NaN where a cell holds neither."""
    values, missing = _numeric(column)
    if np.isnan(values[~missing]).any():  # not all numbers: dates, if most of them are
        dates = _dates(column)
        as_dates = np.where(dates.isna(), np.nan, dates.astype("int64").to_numpy(np.float64))
        if np.isnan(as_dates).sum() < np.isnan(values).sum():  # one odd cell: that line only
            values = as_dates
    return values


def _times(frame: Any, spec: TabularSchema, report: BadRowReport, bad: np.ndarray) -> np.ndarray:
    """The time column as numbers (dates as nanoseconds); marks rows without a time bad."""
    values = _time_values(frame[spec.time])
    wrong = np.isnan(values)
    report.add(f"time not a number or a date ({spec.time})", report.numbers(len(wrong))[wrong])
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
    header = _header(path)
    if columns is not None:
        _check_columns(spec, path, header)
    if path.is_dir():
        frame = parquet_parts.read_frame(path, spec.columns if columns is not None else None)
        return frame, BadRowReport(str(path), unit="row")
    try:
        if format_suffix(path) in CSV_SUFFIXES:
            pd = _import("pandas", f"reading {path}")
            # usecols: pandas then keeps a line of too many fields as a row (and one of too
            # few with blanks) instead of stopping; _wrong_field_count reports both
            usecols = spec.columns if columns is not None else header
            options = {"sep": _separator(path), "compression": compression(path)}
            with damaged_as_user_error(path):
                frame = pd.read_csv(path, usecols=usecols, dtype=str, keep_default_na=False,
                                    **options)  # fmt: skip
            return frame, BadRowReport(str(path), unit="line")
        pq = _import("pyarrow.parquet", f"reading {path}")
        frame = pq.read_table(path, columns=spec.columns if columns is not None else None)
        frame = frame.to_pandas()
        return frame, BadRowReport(str(path), unit="row")
    except (ValueError, OSError) as exc:  # pandas' and pyarrow's parse errors derive from these
        raise _unreadable(path, exc) from None


def _header(path: Path) -> list[str]:
    """The column names of a CSV/Parquet file."""
    suffix = format_suffix(path)
    if path.is_dir():
        return _check_unique(path, parquet_parts.header(path))
    if suffix not in TABULAR_SUFFIXES:
        raise RanknasError(f"{path}: unknown file type; use one of {FILE_TYPES}, or a directory "
                           "of Parquet files")  # fmt: skip
    if not path.is_file():
        raise RanknasError(f"{path}: no such file{looked_for(path)}")
    try:
        if suffix in CSV_SUFFIXES:
            pd = _import("pandas", f"reading {path}")
            with damaged_as_user_error(path):
                header = pd.read_csv(path, sep=_separator(path), nrows=0,
                                     compression=compression(path))  # fmt: skip
            return _check_unique(path, _check_separator(path, [str(c) for c in header.columns]))
        if compression(path):
            raise RanknasError(f"{path}: a compressed Parquet file, which pyarrow cannot read; "
                               "decompress it (Parquet compresses its own columns)")  # fmt: skip
        pq = _import("pyarrow.parquet", f"reading {path}")
        return _check_unique(path, list(pq.read_schema(path).names))
    except (ValueError, OSError) as exc:  # pandas' and pyarrow's parse errors derive from these
        raise _unreadable(path, exc) from None


def _check_unique(path: Path, header: list[str]) -> list[str]:
    """Refuse a column name given twice (pandas renames the second `x.1` silently)."""
    if format_suffix(path) in CSV_SUFFIXES and any(MANGLED.fullmatch(name) for name in header):
        with open_data(path, "rt", encoding="utf-8-sig", newline="") as file:
            header = next(_records(file, path), header)
    twice = sorted({name for name in header if header.count(name) > 1})
    criteo = len(header) == 40 and header[0] in ("0", "1")  # a label, 13 counts, 26 hex ids
    if twice and (criteo or sum(map(_is_number, header)) >= len(header) / 2):  # data, no names
        _refuse_a_row_of_data(path, [n for n in header if _is_number(n)], len(header))
    if twice:
        raise RanknasError(f"{path}: the header names {', '.join(map(repr, twice))} more than "
                           "once; give every column its own name")  # fmt: skip
    return header


def _check_header_names(path: Path, names: list[str]) -> None:
    """Refuse a text file's first line where names belong that is none: a row of numbers (a
    file without a header: its first row was read as the names; the schema's were then "not
    in" it), or a JSON object (JSON lines: "no column 'y'")."""
    if names and names[0].lstrip().startswith(("{", "[")) and _json_first_line(path):
        raise RanknasError(f"{path}: its first line is JSON ({names[0][:30]}...), not a header "
                           "of column names: ranknas reads CSV, TSV and Parquet; convert it "
                           "(pandas: pd.read_json(path, lines=True).to_parquet(...))")  # fmt: skip
    numbers = [name for name in names if _is_number(name)]
    numbered = numbers == [str(i) for i in range(len(numbers))]  # pandas' names: 0, 1, 2, ...
    if len(numbers) >= len(names) / 2 and not numbered and format_suffix(path) in CSV_SUFFIXES:
        _refuse_a_row_of_data(path, numbers, len(names))


def _json_first_line(path: Path) -> bool:
    """Whether a text file's first line is a JSON object or array (a header such as
    `[click],price` is none)."""
    if format_suffix(path) not in CSV_SUFFIXES:
        return False
    with open_data(path, "rt", encoding="utf-8-sig", errors="replace") as file:
        line = file.readline(1 << 20)
    try:
        return isinstance(json.loads(line), dict | list)
    except ValueError:
        return False


def _refuse_a_row_of_data(path: Path, numbers: list[str], fields: int) -> None:
    """A first line of numbers where names belong: a file without a header."""
    criteo = " (a Criteo file? give it as criteo:PATH)" if fields == 40 else ""
    raise RanknasError(f"{path}: its first line holds numbers where names belong "
                       f"({', '.join(numbers[:4])}, ...): it reads as a row of data, not a "
                       "header; add a first line that names the columns (the label and the "
                       f"features){criteo}")  # fmt: skip


def _no_rows(path: Path) -> str:
    return "it holds no rows" + ("" if path.suffix in PARQUET_SUFFIXES else " below its header")


def _unreadable(path: Path, exc: Exception) -> RanknasError:
    if isinstance(exc, UnicodeDecodeError) and starts_with(path, b"PAR1"):
        return RanknasError(f"{path}: a Parquet file under a text file's name; rename it to "
                            f"{path.with_suffix('.parquet').name}")  # fmt: skip
    magic = isinstance(exc, ValueError) and "magic bytes" in str(exc)  # pyarrow's ArrowInvalid
    if magic and not starts_with(path, b"PAR"):  # PAR1, or PARE: an encrypted one
        return RanknasError(f"{path}: not a Parquet file (it does not start as one); a CSV or "
                            "TSV under a Parquet name? give it its own suffix "
                            "(.csv, .tsv)")  # fmt: skip
    if isinstance(exc, UnicodeDecodeError):  # a spreadsheet's Latin-1 or UTF-16 export
        fix = "pd.read_csv(path, encoding=...).to_csv(path, index=False)"
        where = _first_non_utf8(path)
        return RanknasError(f"{path}: not UTF-8 text{where}; save it as UTF-8 (pandas: {fix})")
    if path.is_file() and path.stat().st_size == 0:
        wanted = ("a Parquet file of named columns" if path.suffix in PARQUET_SUFFIXES else
                  "a file with a header line of column names and rows below it")  # fmt: skip
        return RanknasError(f"{path}: the file is empty; give {wanted}")
    unclosed = re.search(r"EOF inside string starting at row (\d+)", str(exc))
    if unclosed:
        line = _record_line(path, int(unclosed.group(1)))
        return RanknasError(f"{path}: line {line}: a quoted field opens there and is never "
                            "closed (the rest of the file would be its text); close or remove "
                            "that quote")  # fmt: skip
    return RanknasError(f"{path}: cannot read the file ({exc})")


def _first_non_utf8(path: Path) -> str:
    """Where the file's first byte that is not UTF-8 is (`: line 51, byte 1077 (0xff)`,
    counted from 1 and 0 as an editor does), or "" where the whole file decodes (the
    error's own position is within a reader's buffer: "position 0" of a byte deep in it)."""
    decoder, offset, line = codecs.getincrementaldecoder("utf-8")(), 0, 1
    of = " of its decompressed text" if compression(path) else ""
    with open_data(path) as stream:
        while chunk := stream.read(1 << 20):
            pending = len(decoder.getstate()[0])  # a character's first bytes, held over
            try:
                decoder.decode(chunk)
            except UnicodeDecodeError as exc:  # in the held-over bytes and the chunk
                data, at = exc.object, exc.start
                line += data[:at].count(b"\n")
                byte = f"byte {offset - pending + at}{of}"
                return f": line {line}, {byte} (0x{data[at]:02x})"
            line += chunk.count(b"\n")
            offset += len(chunk)
    pending = len(decoder.getstate()[0])
    if pending:  # a character's first bytes, and nothing after them
        return f": line {line}, its last {pending} byte(s){of} begin a character it never ends"
    return ""


def _record_line(path: Path, record: int) -> int:
    """The line where CSV record `record` (pandas' count from 0, the header included)
    starts: a quoted field may span lines before it."""
    line = 1
    try:
        with open_data(path, "rt", encoding="utf-8-sig", newline="") as file:
            reader = _records(file, path)
            for index, _ in enumerate(reader):
                if index == record:
                    break
                line = reader.line_num + 1
    except (csv.Error, OSError, ValueError):  # the record that does not end: where it began
        pass
    return line


def _separator(path: Path) -> str:
    return "\t" if format_suffix(path) == ".tsv" else ","


def _check_separator(path: Path, header: list[str]) -> list[str]:
    """Refuse a header that is one name holding another separator (a spreadsheet's
    semicolons): every line would be one malformed field."""
    if len(header) != 1:
        return header
    other = next((sep for sep in (";", "\t", ",", "|") if sep in header[0]), None)
    if other is not None and other != _separator(path):
        shown = {"\t": "tabs"}.get(other, repr(other))
        fix = {"\t": "name it .tsv", ",": "name it .csv"}.get(other) or (
            "write it with commas (pandas: df.to_csv(path, index=False)), numbers with a "
            "decimal point"
        )
        raise RanknasError(
            f"{path}: its header {header[0]!r} is one column holding {shown}: "
            f"the file is separated by {shown}, not {_separator(path)!r}; {fix}"
        )
    return header


LONGEST_FIELD = 1 << 30  # characters: a cell as long as pandas reads (csv's default: 131,072)


def _records(file: Any, path: Path) -> Any:
    """The records of an open CSV `file` as Python's csv module splits them, cells of any
    length that pandas reads (a 200,000-character cell was a `_csv.Error` traceback)."""
    csv.field_size_limit(max(csv.field_size_limit(), LONGEST_FIELD))
    return csv.reader(file, delimiter=_separator(path))


def _wrong_field_count(path: Path, report: BadRowReport, rows: int) -> np.ndarray:
    """Which of the `rows` records of a CSV file (one per row that pandas read) have more or
    fewer fields than the header: their values would land in the wrong columns. Reported by
    line."""
    with open_data(path, "rt", newline="", encoding="utf-8", errors="replace") as file:
        records = _records(file, path)
        expected = len(next(records, []))
        counts, starts, before = [], [], records.line_num
        for record in records:
            if record:  # pandas skips blank lines
                counts.append(len(record))
                starts.append(before + 1)
            before = records.line_num
    wrong = np.asarray(counts, dtype=np.int64) != expected
    if len(wrong) != rows:  # records pandas reads otherwise: no line to blame reliably
        return np.zeros(rows, dtype=bool)
    report.first_lines = np.asarray(starts, dtype=np.int64)
    report.add(f"wrong number of fields (the header has {expected})", report.first_lines[wrong])
    report.misshapen = report.first_lines[wrong]
    return wrong


def _check_time_column(column: str, path: Path) -> None:
    """A time column given for the split (not by the schema) must be one of the file's."""
    available = _header(path)
    if column not in available:
        raise RanknasError(
            f"time column {column!r} (given for the split: a study's data.split.column, "
            f"`ranknas train --split time:COLUMN`) not in {path}; the file has {available}"
        )


def _check_columns(spec: TabularSchema, path: Path, available: list[str]) -> None:
    missing = [c for c in spec.columns if c not in available]
    if missing:
        _check_header_names(path, available)
        raise RanknasError(
            f"{spec.source}: column(s) {missing} not in {path}; the file has {available}. "
            "Fix the names in the schema file."
        )


def _convert(
    frame: Any, spec: TabularSchema, report: BadRowReport, warn_blanks: bool = True
) -> tuple[np.ndarray, np.ndarray, list[np.ndarray | None], np.ndarray]:
    """Labels, dense values, given-id columns (None where ids are computed), bad-row mask."""
    report.rows = len(frame)
    numbers = report.numbers(len(frame))
    label, missing = _label(frame[spec.label])
    bad = missing | ~np.isin(label, (0.0, 1.0))
    report.add(f"label not 0/1, true/false or yes/no ({spec.label})", numbers[bad])
    dense = np.zeros((len(frame), len(spec.dense)), dtype=np.float32)
    for k, name in enumerate(spec.dense):
        values, missing = _numeric(frame[name])
        wrong = ~missing & ~np.isfinite(values)
        if warn_blanks and wrong.all() and len(frame):  # text: a column of the other kind
            raise RanknasError(f"{report.source}: dense column {name!r} holds no number in any "
                               f"row ({frame[name].iloc[0]!r} in the first): list it under "
                               "categorical (with min_count: 1), or drop it")  # fmt: skip
        report.add(f"dense value not a finite number ({name})", numbers[wrong])
        with np.errstate(invalid="ignore"):
            huge = ~missing & ~wrong & (np.abs(values) > FLOAT32_MAX)
        report.add(f"dense value beyond float32 ({name})", numbers[huge])
        if warn_blanks and missing.all() and len(frame):  # a whole file (a chunk: the fit)
            raise RanknasError(f"{report.source}: dense column {name!r} is blank in every row: "
                               "there is no value to learn from or to fill it with; drop it "
                               "from the schema's dense columns")  # fmt: skip
        blanks = missing & report.kept(numbers)
        if warn_blanks and blanks.any():
            logger.warning("%s: %d blank value(s) in dense column %r (first at %s %d): filled "
                           "with the training mean", report.source, int(blanks.sum()), name,
                           report.unit, int(numbers[blanks][0]))  # fmt: skip
        # Blanks stay NaN until the preprocessing fitted on the training split fills them.
        dense[:, k] = np.where(missing, np.nan, np.where(wrong | huge, 0.0, values))
        bad |= wrong | huge
    id_columns: list[np.ndarray | None] = []
    for column in spec.categorical:
        name, cardinality = column.name, column.cardinality
        if column.from_values:
            id_columns.append(None)
            continue
        values, missing = _numeric(frame[name])
        with np.errstate(invalid="ignore"):
            wrong = missing | ~(
                (values >= 0) & (values < cardinality) & (values == np.floor(values))
            )
        if warn_blanks and wrong.all() and not missing.all() and len(frame):
            raise RanknasError(
                f"{report.source}: categorical column {name!r} holds no id in [0, {cardinality})"
                f" in any row ({frame[name].iloc[0]!r} in the first): give it min_count: 1 to "
                "read its values through a vocabulary (as `ranknas data schema` writes), or "
                "hash_size"
            )
        report.add(f"id not an integer in [0, {cardinality}) ({name}: a larger cardinality, or "
                   "min_count: 1 to read its values through a vocabulary, reads them)",
                   numbers[wrong])  # fmt: skip
        id_columns.append(np.where(wrong, 0, values).astype(np.int64))
        bad |= wrong
    return label.astype(np.float32), dense, id_columns, bad


def _numeric(series: Any) -> tuple[np.ndarray, np.ndarray]:
    """Values as float64 (NaN where not a number) and which entries are missing (null,
    blank, or a `MISSING_NUMBERS` word)."""
    pd = _import("pandas", "reading tabular data")
    missing = series.isna().to_numpy(dtype=bool, copy=True)
    if not pd.api.types.is_numeric_dtype(series):
        texts = series.astype(str).str.strip().str.lower()
        missing |= texts.isin(MISSING_NUMBERS).to_numpy(dtype=bool)
    values = pd.to_numeric(series, errors="coerce").to_numpy(dtype=np.float64, na_value=np.nan)
    return values, missing


BOOLEAN_LABELS = {"true": 1.0, "yes": 1.0, "false": 0.0, "no": 0.0}


def _label(series: Any) -> tuple[np.ndarray, np.ndarray]:
    """A label column as `_numeric` gives it, with the words true/yes and false/no (any case)
    read as 1 and 0."""
    values, missing = _numeric(series)
    if not _import("pandas", "reading tabular data").api.types.is_numeric_dtype(series):
        words = series.astype(str).str.strip().str.lower().map(BOOLEAN_LABELS)
        values = np.where(words.notna(), words.to_numpy(dtype=np.float64, na_value=np.nan), values)
    return values, missing


def write_tabular(data: TabularData, path: str | Path) -> Path:
    """Write the schema's columns (label as 0/1 integers, a multi-valued column's ids as
    lists) and `true_prob` if known.

    The format follows the suffix: .csv/.tsv (pandas; .csv.gz and the like compressed) or
    .parquet/.pq (pyarrow).
    """
    path = Path(path)
    schema = data.schema
    columns: dict[str, np.ndarray] = {schema.label: data.labels.astype(np.int8)}
    columns |= {name: data.dense[:, k] for k, name in enumerate(schema.dense)}
    columns |= {name: data.categorical[:, k] for k, name in enumerate(schema.feature_names)}
    if data.true_prob is not None:
        columns[TRUE_PROB_COLUMN] = data.true_prob
    suffix = format_suffix(path)
    for name, lists in data.multi_hot.items():  # ids as lists, or as texts "3|7" in CSV
        cells = np.split(lists.values, lists.offsets[1:-1])
        columns[name] = (  # type: ignore[assignment]
            [DEFAULT_SEPARATOR.join(map(str, c)) for c in cells]
            if suffix in CSV_SUFFIXES
            else [c.tolist() for c in cells]
        )
    if suffix in CSV_SUFFIXES:
        pd = _import("pandas", f"writing {path}")
        pd.DataFrame(columns).to_csv(path, sep=_separator(path), index=False)
    elif suffix in PARQUET_SUFFIXES:
        pa = _import("pyarrow", f"writing {path}")
        pq = _import("pyarrow.parquet", f"writing {path}")
        pq.write_table(pa.table(columns), path)
    else:
        raise RanknasError(f"{path}: unknown file type; use one of {FILE_TYPES}")
    return path


def write_schema(schema: DatasetSchema, path: str | Path) -> Path:
    """Write a schema YAML that `read_tabular_schema` reads back (ids taken as they are)."""
    path = Path(path)
    path.write_text(yaml.safe_dump(schema.to_dict(), sort_keys=False, allow_unicode=True),
                    encoding="utf-8")  # fmt: skip
    return path


DENSE_MIN_DISTINCT = 50  # a numeric column with fewer distinct whole values is categorical
# a column of numbers but for this share of its values (or fewer) is dense with bad cells,
# not a column of words
STRAY_WORDS_SHARE = 0.01
# A column named as ids ("id", "city_id", "user-id", "userId", "item_ids") or as the thing
# that ranking logs key by ("user", "item", "ad", ...: Taobao's logs name them so): whole
# numbers in it are ids, however many, not a quantity.
ID_NAME = re.compile(
    r"(?:^|[_\-\s.])(?:id|ID|Id)s?$|[a-z0-9](?:Id|ID)s?$|^(?i:user|item|ad|product|sku|video|"
    r"movie|song|shop|store|seller|campaign|creative|advertiser|publisher|brand|cate|category|"
    r"app|site|device|city)s?$"
)
ROW_KEY_SHARE = 0.95  # of the rows with a distinct id: the column names rows, not features
UNNAMED = re.compile(r"Unnamed: \d+")  # pandas' header for a column whose header cell is empty
# A column named as a time ("ts", "timestamp", "event_time", "clickTime", "date", with a unit:
# "ts_ms", "timestamp_ms", "time_sec", or as a moment: "created_at", "clickedAt"): epoch
# numbers in it are when the row happened, not a feature (a time split orders by them).
TIME_NAME = re.compile(
    r"(?:^|[_\-\s.])(?i:(?:ts|time|timestamp|date|datetime|epoch)"
    r"(?:[_\-\s.](?:ms|s|secs?|seconds|millis|msec|utc))?|at)$"
    r"|[a-z0-9](?:Time|Timestamp|Date|Ts)(?:Ms|Secs?|Seconds|Millis|Utc)?$|[a-z0-9]At$"
)
EPOCH_SECONDS = (946_684_800, 4_102_444_800)  # 2000-01-01 and 2100-01-01, UTC
# A column named as a day or an hour ("hour", "day", "ds", "dt", or as a time): dates written
# as digits in it (Avazu's `hour`, 14102100; a partition's 20241005) order the rows in time.
DAY_NAME = re.compile(r"(?:^|[_\-\s.])(?i:hour|day|ds|dt)$")
DIGIT_DATES = (
    ("YYYYMMDDHH", "%Y%m%d%H", 10),
    ("YYYYMMDD", "%Y%m%d", 8),
    ("YYMMDDHH", "%y%m%d%H", 8),
)
# "1,234.56" is no number to pandas, so none to training either (and "1,234" may mean 1.234
# elsewhere): such a column is left out, and said, rather than read with its commas dropped.
THOUSANDS = re.compile(r"[+-]?\d{1,3}(?:,\d{3})+(?:\.\d*)?")


LIST_SEPARATORS = ("|", ";")  # a CSV text column holding lists separates items by one
LIST_SHARE = 0.05  # of a column's non-blank cells that hold a separator, for it to be lists


def _check_label(path: Path, column: Any) -> None:
    """Refuse a label column with more values that are not 0/1 (ratings, classes 0/1/2)
    than a training load tolerates as malformed rows: say it now, with the values found."""
    values, blank = _label(column)
    wrong = ~blank & ~np.isin(values, (0.0, 1.0))
    shown = [repr(v) for v in column[wrong].astype(str).str.strip().unique()[:5]]
    found = ", ".join(shown + ["missing values (blank or NaN)"] * bool(blank.any()))
    bad, limits = int((wrong | blank).sum()), BadRowLimits()
    if bad and limits.tolerates(bad, len(column)):
        logger.warning("%s: the label column %r holds %s, not 0/1, in %d of %d rows: "
                       "training skips those as malformed", path, column.name, found, bad,
                       len(column))  # fmt: skip
    elif bad and BadRowLimits(max_bad_rows=None).tolerates(bad, len(column)):  # a large file
        logger.warning("%s: the label column %r holds %s, not 0/1, in %d of %d rows: a "
                       "study skips those as malformed with data.max_bad_rows above %d (it "
                       "stops at %d)", path, column.name, found, bad, len(column), bad,
                       limits.max_bad_rows)  # fmt: skip
    elif bad:
        raise RanknasError(
            f"{path}: the label column {column.name!r} holds {found}, not 0/1 (or true/false, "
            f"yes/no), in {bad:,} of {len(column):,} rows; write it as 1 (clicked, converted) "
            "and 0 (not) in every row, then infer the schema again"
        )
    labels = set(values[~wrong & ~blank].tolist())
    if len(labels) == 1:  # said here, before a schema is written for it: training refuses it
        logger.warning("%s: the label column %r is %d in every row: a model needs clicks and "
                       "non-clicks to learn from (is this the right file, or a filtered "
                       "export?)", path, column.name, int(labels.pop()))  # fmt: skip


def _check_time_values(path: Path, column: Any) -> None:
    """Refuse a time column (given by --time) that holds no value, or whose cells are not
    numbers or dates in more rows than a training load tolerates as malformed."""
    blank = _numeric(column)[1]
    if blank.all():
        raise RanknasError(f"{path}: the time column {column.name!r} is blank in every row; "
                           "pass another --time, or none")  # fmt: skip
    if column[~blank].astype(str).str.strip().nunique() == 1:
        raise RanknasError(f"{path}: the time column {column.name!r} holds one value on every "
                           f"row ({str(column[~blank].iloc[0]).strip()!r}): no order to split "
                           "the rows by; pass another --time, or none")  # fmt: skip
    if not _looks_like_dates(column) and (shown := _dates_in_several_formats(column)):
        raise RanknasError(f"{path}: the time column {column.name!r} holds dates written in "
                           f"more than one way ({', '.join(shown)}): rows would be read in the "
                           "wrong order or not at all; write them one way (such as "
                           "2024-01-31)")  # fmt: skip
    wrong = ~blank & np.isnan(_time_values(column))
    if not BadRowLimits(max_bad_rows=None).tolerates(int(wrong.sum()), int((~blank).sum())):
        found = ", ".join(repr(v) for v in column[wrong].astype(str).str.strip().unique()[:3])
        raise RanknasError(
            f"{path}: the time column {column.name!r} holds {found}, not numbers or dates, in "
            f"{int(wrong.sum()):,} of {int((~blank).sum()):,} rows: a time column holds numbers "
            "(epoch seconds) or dates (2026-03-01 10:00); pass another --time, or none"
        )


def _epoch_times(values: np.ndarray) -> str | None:
    """How numbers that are all epoch times from 2000 to 2100 read ("epoch seconds,
    2026-03-01 to 2026-03-31"), in seconds or milliseconds; None where they are not."""
    start, end = EPOCH_SECONDS
    for unit, scale in (("seconds", 1), ("milliseconds", 1000)):
        if values.size and np.all((values >= start * scale) & (values < end * scale)):
            span = (np.array([values.min(), values.max()]) // scale).astype(np.int64)
            first, last = span.astype("datetime64[s]").astype("datetime64[D]")
            return f"epoch {unit}, {first} to {last}"
    return None


def _digit_dates(values: np.ndarray) -> str | None:
    """How whole numbers that are all dates written as digits (`DIGIT_DATES`) from 2000 to
    2099 read ("YYMMDDHH, 2014-10-21 to 2014-10-30"); None where they are not. Their order
    as numbers is their order in time, so a time split takes them as they are."""
    pd = _import("pandas", "reading tabular data")
    if not values.size or not np.all(values == np.floor(values)) or values.min() < 0:
        return None
    texts = pd.Series(np.unique(values).astype(np.int64).astype(str))
    for name, layout, digits in DIGIT_DATES:
        if (texts.str.len() == digits).all():
            dates = pd.to_datetime(texts, format=layout, errors="coerce")
            if dates.notna().all() and dates.min().year >= 2000 and dates.max().year < 2100:
                return f"{name}, {dates.min().date()} to {dates.max().date()}"
    return None


def _warn_infinite(path: Path, column: Any, infinite: np.ndarray) -> None:
    """Warn of a dense column's values that are no finite number (inf, 1e400)."""
    if infinite.any():
        logger.warning("%s: %s holds %d values that are no finite number (e.g. %r): training "
                       "skips their rows as malformed, under the bad-row limits", path,
                       column.name, int(infinite.sum()), column[infinite].iloc[0])  # fmt: skip


def _with_decimal_commas(texts: Any) -> bool:
    """Whether every text is a number written with a decimal comma ("22,09", "-0,5")."""
    return bool(len(texts)) and bool(texts.astype(str).str.strip().str.fullmatch(
        r"-?\d+,\d+").all())  # fmt: skip


def _with_thousands_separators(texts: Any) -> bool:
    """Whether every text is a number written with thousands separators ("1,234.56")."""
    return bool(len(texts)) and bool(texts.astype(str).str.strip().str.fullmatch(THOUSANDS).all())


def infer_schema(path: str | Path, label: str, time: str | None = None) -> dict[str, Any]:
    """A schema for a CSV/Parquet file, to edit: numeric columns with many values (or any
    fraction) are dense unless named as ids (`ID_NAME`), the others categorical with ids
    from a vocabulary (`min_count: 1`) and their cardinality (distinct values + 2: missing
    and out of vocabulary; training counts the training split's own); a column of lists
    (Parquet), or of texts of which at least `LIST_SHARE` hold a separator of
    `LIST_SEPARATORS` (CSV), is multi-valued. Without `time`, the first column of dates
    becomes the time column, and a column named as a time (`TIME_NAME`) that holds epoch
    seconds or milliseconds is left out with a warning that suggests it as `--time` (with
    `time` given, such another column is left out too: a time, not a feature); a given
    `time` that holds no numbers or dates is refused. A column of ids (text, or whole numbers
    named as ids) with a different value on nearly every row (a request or impression id) is
    left out, with a warning, as is a column with one value (or none) in every row: it tells
    no row from another, a column of numbers written with thousands separators (`THOUSANDS`),
    and the synthetic data's `TRUE_PROB_COLUMN`."""
    path = Path(path)
    spec = TabularSchema(label=label, dense=(), categorical=(), source=str(path))
    frame, report = _read_frame(path, replace(spec, dense=(), categorical=()), columns=None)
    if report.unit == "line":  # lines of the wrong shape would mix the columns' values
        wrong = _wrong_field_count(path, report, len(frame))
        frame = frame[~wrong]
        if wrong.any():
            logger.warning("%s: inferred without %d malformed lines: %s", path, int(wrong.sum()),
                           report.describe())  # fmt: skip
        # the header again (files joined with `cat`): its names were counted as the columns'
        # values, and a constant column became a categorical one of two
        again = (frame.astype(str) == [str(c) for c in frame.columns]).all(axis=1)
        frame = frame[~again]
        if again.any():
            logger.warning("%s: inferred without %d repeats of the header line (files joined "
                           "with their headers?); training skips them as malformed rows", path,
                           int(again.sum()))  # fmt: skip
    if report.unit == "line":
        _check_header_names(path, [str(c) for c in frame.columns])
    missing = [c for c in (label, time) if c and c not in frame.columns]
    if missing:
        raise RanknasError(f"{path}: no column(s) {missing}; the file has {list(frame.columns)}")
    if not len(frame):
        why = "every line is malformed" if report.unit == "line" and wrong.any() else (
            _no_rows(path))  # fmt: skip
        raise RanknasError(f"{path}: no schema to infer: {why}")
    _check_label(path, frame[label])
    if time is None:
        time = next((str(c) for c in frame.columns if c != label and _looks_like_dates(frame[c])),
                    None)  # fmt: skip
    else:
        _check_time_values(path, frame[time])
    if time is None:
        _say_dates_in_several_formats(path, frame, label)
    dense, categorical, row_keys, constant, counts, row_numbers, many = [], [], [], [], [], [], []
    for column in frame.columns:
        if column in (label, time):
            continue
        if column == TRUE_PROB_COLUMN:
            logger.warning("%s: left out %s: the synthetic data's true click probability is "
                           "the answer, not a feature", path, column)  # fmt: skip
            continue
        if frame[column].astype(str).str.strip().nunique(dropna=False) <= 1:  # as training reads
            constant.append(str(column))
            continue
        if _looks_like_dates(frame[column]):  # a second date column beside the time
            logger.warning("%s: left out %s: it holds dates (e.g. %r), not a feature new rows "
                           "share; the split's time is %s (derive a feature from it, such as "
                           "days since, to use it)", path, column,
                           str(frame[column].dropna().iloc[0]), time)  # fmt: skip
            continue
        lists = _list_column(frame[column])
        if lists is not None:
            categorical.append(lists | {"name": str(column)})
            continue
        values, blank = _numeric(frame[column])
        words = np.isnan(values[~blank])
        distinct = frame[column][~blank].astype(str).str.strip().nunique()
        named_ids = ID_NAME.search(str(column)) is not None
        named_time = TIME_NAME.search(str(column)) is not None
        named_day = named_time or DAY_NAME.search(str(column)) is not None
        if not words.any() and (epochs := (named_time and _epoch_times(values[~blank]))
                                or (named_day and _digit_dates(values[~blank]))):  # fmt: skip
            then = (f"pass --time {column} to split in time order" if time is None else
                    f"the split's time is {time}")  # fmt: skip
            logger.warning("%s: left out %s: it looks like a time column (%s); %s", path,
                           column, epochs, then)  # fmt: skip
            continue
        texts = frame[column][~blank][words]
        # more than a few such cells (a few: stray rows of a dense column, below)
        if not named_ids and words.mean() > STRAY_WORDS_SHARE and _with_thousands_separators(texts):
            logger.warning("%s: left out %s: it holds numbers written with thousands separators "
                           "(%r); write them without the separators to use it as a dense "
                           "feature", path, column, texts.iloc[0])  # fmt: skip
            continue
        if not named_ids and words.mean() > STRAY_WORDS_SHARE and _with_decimal_commas(texts):
            logger.warning("%s: left out %s: it holds numbers written with a decimal comma "
                           "(%r); write them with a decimal point to use it as a dense "
                           "feature", path, column, texts.iloc[0])  # fmt: skip
            continue
        infinite = np.isinf(values) & ~blank  # a dense column's rows training skips
        if (words.any() and words.mean() <= STRAY_WORDS_SHARE and not named_ids
                and distinct >= DENSE_MIN_DISTINCT):  # fmt: skip
            logger.warning("%s: %s taken as dense: %d of %d values are not numbers (e.g. %r); "
                           "training skips their rows under the bad-row limits", path, column,
                           len(texts), int((~blank).sum()), texts.iloc[0])  # fmt: skip
            dense.append(str(column))
            _warn_infinite(path, frame[column], infinite)
            continue
        numeric = not words.any()
        finite = values[~blank & ~infinite]  # inf is no whole number
        whole = numeric and bool(np.all(finite == np.floor(finite)))
        if whole and not blank.any() and _counts_the_rows(values, str(column)):
            row_numbers.append(str(column))
            continue
        ids = not numeric or (whole and named_ids)
        if ids and distinct >= ROW_KEY_SHARE * (~blank).sum() > DENSE_MIN_DISTINCT:
            row_keys.append(str(column))
        elif not ids and (distinct >= DENSE_MIN_DISTINCT or not whole):  # numbers, not ids
            dense.append(str(column))
            _warn_infinite(path, frame[column], infinite)
            if whole:
                many.append(f"{column} ({distinct:,} values)")
        else:
            categorical.append(  # ids from a training-split vocabulary, whatever the values
                {"name": str(column), "cardinality": int(distinct) + 2, "min_count": 1}
            )
            if numeric and not ids:
                counts.append(f"{column} ({distinct} values)")
    if row_keys:
        logger.warning("%s: left out %s: a different value on (nearly) every row names the row, "
                       "not a feature that new rows share; add it under categorical if it "
                       "does repeat", path, ", ".join(row_keys))  # fmt: skip
    if row_numbers:
        logger.warning("%s: left out %s: it numbers the rows (0, 1, 2, ...: an index a data frame "
                       "wrote with them), which tells the model the row's place in the file, "
                       "not a feature; add it under dense if it is one", path,
                       ", ".join(row_numbers))  # fmt: skip
    if constant:
        logger.warning("%s: left out %s: the same value on every row tells no row from another",
                       path, ", ".join(constant))  # fmt: skip
    if counts:
        logger.warning("%s: taken as categorical, whole numbers with few values: %s; move a "
                       "count or a measure under dense", path, ", ".join(counts))  # fmt: skip
    if many:
        logger.warning("%s: taken as dense, whole numbers with many values: %s; move ids (of a "
                       "merchant, a page: numbers whose order means nothing) under "
                       "categorical", path, ", ".join(many))  # fmt: skip
    if not dense and not categorical:  # it wrote `dense: []`, `categorical: []`: train refused
        raise RanknasError(f"{path}: no feature column besides the label{' and time' * bool(time)}"
                           ": a model needs at least one dense or categorical column (a column "
                           "left out is named in a warning, with why)")  # fmt: skip
    schema: dict[str, Any] = {"name": path.stem, "label": label}
    if time:
        schema["time"] = time
    return schema | {"dense": dense, "categorical": categorical}
