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
    if stray := next((f for f in files for folder in f.relative_to(path).parts[:-1]
                      if "=" not in folder), None):  # fmt: skip
        raise RanknasError(f"{path}: {stray.relative_to(path).parent}/ holds Parquet files but "
                           "is no partition folder (name=value): move it out of the data set, "
                           "or give the directory of one data set")  # fmt: skip
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


def _schema(file: Path) -> Any:
    """One Parquet file's Arrow schema."""
    import pyarrow.parquet as pq

    try:
        return pq.read_schema(file)
    except (OSError, ValueError) as exc:  # pyarrow.ArrowInvalid derives from ValueError
        raise RanknasError(f"{file}: cannot read the Parquet file ({exc})") from None


def header(path: Path) -> list[str]:
    """The data set's columns (`columns`)."""
    return columns(parquet_parts(path))


def columns(parts: list[tuple[Path, dict[str, str]]]) -> list[str]:
    """The columns of the files `parts`, the first file's first, then the partition
    columns: a column only some files lack is theirs to lack (`check_files`), not a
    schema's misspelling."""
    check_files(parts[:1], [])  # a column both in it and in its folder names: said as such
    names = {name: None for file, _ in parts for name in _schema(file).names}
    return [*names, *parts[0][1]]


def check_files(parts: list[tuple[Path, dict[str, str]]], columns: list[str]) -> None:
    """Every file has `columns` (those its folders do not give), with the first file's
    types, and no column that its folder names give too."""
    first = None
    for file, values in parts:
        schema = _schema(file)
        if clash := [key for key in values if key in schema.names]:
            raise RanknasError(f"{file}: column(s) {clash} both in the file and in its "
                               "directory names (partitions); rename one of them")  # fmt: skip
        stored = [c for c in columns if c not in values]
        if missing := [c for c in stored if c not in schema.names]:
            raise RanknasError(f"{file}: no column(s) {missing}; the files of one data set "
                               "need the same columns")  # fmt: skip
        first = first or (file, schema)
        for column in stored:
            if (kind := schema.field(column).type) != (was := first[1].field(column).type):
                raise RanknasError(f"{file}: column {column!r} is {kind} here but {was} in "
                                   f"{first[0]}; the files of one data set need the same "
                                   "schema")  # fmt: skip


def read_frame(path: Path, columns: list[str] | None) -> Any:
    """The data set's `columns` (None: all of them) as one pandas DataFrame, the files'
    rows in path order, each partition column as text."""
    import pandas as pd
    import pyarrow.parquet as pq

    parts = parquet_parts(path)
    wanted = columns if columns is not None else header(path)
    check_files(parts, wanted)
    frames = []
    for file, values in parts:
        try:
            frame = pq.read_table(file, columns=[c for c in wanted if c not in values]).to_pandas()
        except (OSError, ValueError) as exc:
            raise RanknasError(f"{file}: cannot read the Parquet file ({exc})") from None
        for key, value in values.items():
            frame[key] = pd.Series(value, index=frame.index, dtype=object)
        frames.append(frame[wanted])
    return pd.concat(frames, ignore_index=True)
