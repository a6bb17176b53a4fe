"""A directory of Parquet files as one data set, Hive partitions included.

Logs written by Spark, Hive or `DataFrame.to_parquet(partition_cols=...)` come as a tree:
`events/ds=2026-12-01/part-0.parquet`, where the partition's column (`ds`) is in the path,
not in the files. `parquet_parts` lists the files in path order, each with its partition
values as text (as a CSV cell is read: the schema decides what a column is), and
`read_frame` joins them into one DataFrame, those columns added. Files and directories whose
names start with `.` or `_` (`_SUCCESS`, `.part-0.crc`, `_temporary/`) are not data.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any
from urllib.parse import unquote

from search_space.errors import RanknasError

PARQUET_SUFFIXES = (".parquet", ".pq")
HIVE_NULL = "__HIVE_DEFAULT_PARTITION__"  # a partition of rows whose value was missing


def parquet_parts(path: Path) -> list[tuple[Path, dict[str, str]]]:
    """The Parquet files under directory `path` in path order, each with its partition
    columns' values (`{"ds": "2026-12-01"}`; empty for a flat directory)."""
    files = sorted(
        p
        for p in path.rglob("*")
        if p.suffix.lower() in PARQUET_SUFFIXES
        and p.is_file()
        and not any(part.startswith((".", "_")) for part in p.relative_to(path).parts)
    )
    if not files:
        raise RanknasError(f"{path}: no .parquet files in this directory (or its subdirectories)")
    parts = [(file, _partition_values(file.relative_to(path))) for file in files]
    keys = {tuple(values) for _, values in parts}
    if len(keys) > 1:
        (a, first) = parts[0]
        b, other = next(p for p in parts if tuple(p[1]) != tuple(first))
        raise RanknasError(f"{path}: its files lie under different partition columns "
                           f"({list(first) or 'none'} for {a.relative_to(path)}, "
                           f"{list(other) or 'none'} for {b.relative_to(path)}); give the "
                           "directory of one data set")  # fmt: skip
    return parts


def _partition_values(relative: Path) -> dict[str, str]:
    """`ds=2026-12-01/hour=13/part-0.parquet`: {"ds": "2026-12-01", "hour": "13"} (Hive's
    escapes undone, its null partition blank)."""
    values = {}
    for folder in relative.parts[:-1]:
        key, equals, value = folder.partition("=")
        if equals:
            value = unquote(value)
            values[unquote(key)] = "" if value == HIVE_NULL else value
    return values


def file_columns(file: Path) -> list[str]:
    """The column names stored in one Parquet file."""
    import pyarrow.parquet as pq

    try:
        return list(pq.read_schema(file).names)
    except (OSError, ValueError) as exc:  # pyarrow.ArrowInvalid derives from ValueError
        raise RanknasError(f"{file}: cannot read the Parquet file ({exc})") from None


def header(path: Path) -> list[str]:
    """The data set's columns: its first file's, then the partition columns."""
    (first, values), *_ = parquet_parts(path)
    stored = file_columns(first)
    if clash := [key for key in values if key in stored]:
        raise RanknasError(f"{first}: column(s) {clash} both in the file and in its directory "
                           "names (partitions); rename one of them")  # fmt: skip
    return [*stored, *values]


def read_frame(path: Path, columns: list[str] | None) -> Any:
    """The data set's `columns` (None: all of them) as one pandas DataFrame, the files'
    rows in path order, each partition column as text."""
    import pandas as pd
    import pyarrow.parquet as pq

    parts = parquet_parts(path)
    wanted = columns if columns is not None else header(path)
    frames = []
    for file, values in parts:
        stored = [c for c in wanted if c not in values]
        if missing := [c for c in stored if c not in file_columns(file)]:
            first = parts[0][0].relative_to(path)
            raise RanknasError(f"{file}: no column(s) {missing}; the files of one data set "
                               f"need the same columns (the first, {first}, has them)")  # fmt: skip
        try:
            frame = pq.read_table(file, columns=stored).to_pandas()
        except (OSError, ValueError) as exc:
            raise RanknasError(f"{file}: cannot read the Parquet file ({exc})") from None
        for key, value in values.items():
            frame[key] = pd.Series(value, index=frame.index, dtype=object)
        frames.append(frame[wanted])
    return pd.concat(frames, ignore_index=True)
