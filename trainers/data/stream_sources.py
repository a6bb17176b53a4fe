"""Reading data bigger than memory piece by piece: a directory of Parquet files (or one
file) with a schema YAML, or a Criteo TSV.

A source knows how many rows its files hold (Parquet: from the footers; Criteo: one pass
counting lines, which also notes where the split boundaries start in bytes) and yields the
rows of a range [start, stop) of positions, in file order, as `RawChunk`s of at most
`chunk_rows` rows: Parquet is read one row group at a time, the TSV one block of lines at a
time. Malformed rows are skipped, counted and reported with their file and line/row number,
with the same checks and limits as the in-memory readers (whose parsers this reuses).
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np

from search_space.errors import RanknasError
from search_space.files import looked_for
from search_space.preprocessing import encode_value
from search_space.schema import DatasetSchema
from trainers.data import criteo, tabular
from trainers.data.compressed import damaged_as_user_error, open_data
from trainers.data.encoding import hashed_ids
from trainers.data.parquet_parts import check_files, columns, parquet_parts
from trainers.data.report import MAX_EXAMPLES, BadRowLimits, BadRowReport
from trainers.data.tabular import (
    PARQUET_SUFFIXES,
    CategoricalColumn,
    TabularSchema,
    read_tabular_schema,
)

CHUNK_ROWS = 1 << 16
_BLOCK = 1 << 24  # bytes read at a time when counting lines


@dataclass
class RawChunk:
    """Rows as read, before anything fitted is applied.

    dense: float32 [n, D], NaN where blank (Criteo too: its counts as read);
    ids: int64 [n, S], the given ids (0 in the columns whose ids are fitted);
    raw: per column whose ids are fitted, each row's code into the chunk's distinct values
    (-1: missing) and those values (str for Parquet, int for Criteo's hex).
    """

    labels: np.ndarray
    dense: np.ndarray
    ids: np.ndarray
    raw: dict[str, tuple[np.ndarray, np.ndarray]] = field(default_factory=dict)

    def __len__(self) -> int:
        return len(self.labels)


class Source:
    """What every source has: its columns, its row count and its chunks."""

    name: str
    spec: TabularSchema  # label, dense and categorical columns (cardinality None: fitted)
    rows: int  # positions in the files, malformed rows included
    # the export hashes raw texts as `bucket_ids` does here (not Criteo's: its ids are hashed
    # from the hex value, as `load_criteo`'s, and served as given)
    hashes_like_export: bool = True

    def __init__(self, limits: BadRowLimits, chunk_rows: int) -> None:
        self.limits = limits
        self.chunk_rows = chunk_rows
        self._warned: set[tuple[int, int]] = set()

    def fixed_dense(self) -> list[dict[str, Any]] | None:
        """The dense transform every model of this source takes (Criteo's counts'), not one
        fitted on its rows; None: fitted."""
        return None

    def exported_ids(
        self, schema: DatasetSchema, vocabularies: dict[str, Any]
    ) -> dict[str, int | None] | None:
        """How an export takes the categorical values as this source holds them, where it
        has its own way (Criteo's hex ids: `criteo.hex_ids`); None: the fitted encoding's."""
        return None

    def chunks(self, start: int, stop: int) -> Iterator[RawChunk]:
        raise NotImplementedError

    def times(self, start: int, stop: int) -> Iterator[np.ndarray]:
        """The time column of rows [start, stop) as numbers (dates as nanoseconds, NaN where
        a cell holds neither), piece by piece; nothing for a source without one."""
        return iter(())

    def bucket_ids(self, values: np.ndarray, buckets: int) -> np.ndarray:
        """The hashed id of each raw value: the exported model's function of its text."""
        return np.fromiter((encode_value(v, None, buckets) for v in values.tolist()),
                           np.int64, len(values))  # fmt: skip

    def value_text(self, value: Any) -> str:
        """A raw value as the vocabulary records it."""
        return str(value)

    def _finish(self, report: BadRowReport, start: int, stop: int) -> None:
        self.limits.check(report, final=True)
        if report.bad and (start, stop) not in self._warned:
            self._warned.add((start, stop))
            logging.getLogger(__name__).warning(
                "%s: skipped %d malformed %ss: %s",
                self.name,
                report.bad,
                report.unit,
                report.describe(),
            )


def open_source(
    path: str | Path,
    schema_path: str | Path | None,
    *,
    chunk_rows: int = CHUNK_ROWS,
    limits: BadRowLimits | None = None,
    time_column: str | None = None,
) -> Source:
    """A Criteo TSV (`criteo:PATH`), or Parquet files (a directory of them, or one) described
    by the schema YAML at `schema_path` (`time_column`: in place of the schema's time)."""
    limits = limits or BadRowLimits()
    text = str(path)
    if text.startswith("criteo:"):
        return CriteoSource(Path(text.removeprefix("criteo:")), limits, chunk_rows)
    if schema_path is None:
        raise RanknasError(
            f"{path}: streamed Parquet data needs a schema file (label, dense, categorical "
            "columns); give data.schema / --schema"
        )
    spec = read_tabular_schema(schema_path)
    if time_column:
        spec = replace(spec, time=time_column)
    if lists := [c.name for c in spec.categorical if c.multi_valued]:
        raise RanknasError(
            f"{schema_path}: multi-valued column(s) {lists} are not streamed yet: train in "
            "memory (without data.stream / --stream) or drop them from the schema"
        )
    return ParquetSource(Path(path), spec, limits, chunk_rows)


def data_files(path: str | Path) -> list[Path]:
    """The files a source reads: the Criteo TSV of `criteo:PATH`, or the Parquet files."""
    text = str(path)
    if text.startswith("criteo:"):
        file = Path(text.removeprefix("criteo:"))
        criteo._file_stat(file)
        return [file]
    return _parquet_files(Path(path))


class ParquetSource(Source):
    """The Parquet files of a directory in name order (or one file), read by row group."""

    def __init__(
        self, path: Path, spec: TabularSchema, limits: BadRowLimits, chunk_rows: int
    ) -> None:
        super().__init__(limits, chunk_rows)
        self.name, self.spec = str(path), spec
        parts = _parquet_parts(path)
        _check_schemas(path, parts, spec)
        self.files = [file for file, _ in parts]
        self.partition_of = dict(parts)
        self.readers = [_open_parquet(f) for f in self.files]
        self.sizes = [r.metadata.num_rows for r in self.readers]
        self.rows = sum(self.sizes)

    def chunks(self, start: int, stop: int) -> Iterator[RawChunk]:
        for file, reader, lo, hi in self._files_of(start, stop):
            report = BadRowReport(str(file), unit="row")
            for batch, first_row in self._batches(file, reader, lo, hi, self.spec.columns):
                yield self._convert(batch, first_row, report)
            self._finish(report, lo, hi)

    def times(self, start: int, stop: int) -> Iterator[np.ndarray]:
        if not self.spec.time:
            return
        for file, reader, lo, hi in self._files_of(start, stop):
            for batch, _ in self._batches(file, reader, lo, hi, [self.spec.time]):
                yield tabular._time_values(batch.column(0).to_pandas())

    def _files_of(self, start: int, stop: int) -> Iterator[tuple[Path, Any, int, int]]:
        """Each file holding positions [start, stop), with the rows [lo, hi) of it they are."""
        offset = 0
        for file, reader, size in zip(self.files, self.readers, self.sizes, strict=True):
            lo, hi = max(start - offset, 0), min(stop - offset, size)
            if lo < hi:
                yield file, reader, lo, hi
            offset += size

    def _batches(
        self, file: Path, reader: Any, lo: int, hi: int, columns: list[str]
    ) -> Iterator[tuple[Any, int]]:
        """Rows [lo, hi) of one file's `columns` with the file row each batch starts at,
        reading one row group at a time (asked for several, pyarrow reads all their bytes
        ahead); a partition column is its directory's value on every row."""
        import pyarrow as pa

        values = self.partition_of[file]
        stored = [c for c in columns if c not in values]
        try:
            for group, position in _row_groups(reader, lo, hi):
                batches = reader.iter_batches(
                    batch_size=self.chunk_rows, row_groups=[group], columns=stored
                )
                for batch in batches:
                    begin, end = max(lo - position, 0), min(hi - position, batch.num_rows)
                    if begin < end:
                        part = batch.slice(begin, end - begin)
                        if values:  # in the schema's order, as the stored ones come
                            part = pa.RecordBatch.from_pydict(
                                {c: part.column(c) if c not in values else
                                 pa.array([values[c]] * part.num_rows, pa.string())
                                 for c in columns})  # fmt: skip
                        yield part, position + begin
                    position += batch.num_rows
        except OSError as exc:  # pyarrow's IO and decoding errors
            raise RanknasError(f"{file}: cannot read the Parquet file ({exc})") from None

    def _convert(self, batch: Any, first_row: int, report: BadRowReport) -> RawChunk:
        frame = batch.to_pandas()
        chunk_report = BadRowReport(report.source, unit="row")
        # blanks are reported once, by the dense fit
        labels, dense, id_columns, bad = tabular._convert(
            frame, self.spec, chunk_report, warn_blanks=False
        )
        _merge_report(report, chunk_report, first_row)
        report.bad += int(bad.sum())
        self.limits.check(report, final=False)
        good = ~bad
        ids = np.zeros((int(good.sum()), len(self.spec.categorical)), dtype=np.int64)
        raw = {}
        columns = zip(self.spec.categorical, id_columns, strict=True)
        for k, (entry, column) in enumerate(columns):
            if column is None:
                codes, values = tabular._factorized(frame[entry.name][good])
                raw[entry.name] = (codes, np.asarray(values, dtype=object))
            else:
                ids[:, k] = column[good]
        return RawChunk(labels[good], dense[good], ids, raw)


def _parquet_files(path: Path) -> list[Path]:
    return [file for file, _ in _parquet_parts(path)]


def _parquet_parts(path: Path) -> list[tuple[Path, dict[str, str]]]:
    """The files (each with its Hive partitions' values) of a directory, or the one file."""
    if path.is_dir():
        return parquet_parts(path)
    if not path.exists():
        raise RanknasError(f"{path}: no such file or directory{looked_for(path)}")
    if path.suffix.lower() not in PARQUET_SUFFIXES:
        raise RanknasError(
            f"{path}: streaming reads Parquet files (a directory of them, or one) or a "
            "Criteo TSV (criteo:PATH); convert a CSV to Parquet first"
        )
    return [(path, {})]


def _open_parquet(file: Path) -> Any:
    import pyarrow.parquet as pq

    try:
        return pq.ParquetFile(file)
    except (OSError, ValueError) as exc:  # pyarrow.ArrowInvalid derives from ValueError
        raise RanknasError(f"{file}: cannot read the Parquet file ({exc})") from None


def _check_schemas(
    path: Path, parts: list[tuple[Path, dict[str, str]]], spec: TabularSchema
) -> None:
    """The schema's columns are the data set's (`path`: a file, or its directory); every
    file has them, with the first file's types (`parquet_parts.check_files`)."""
    tabular._check_columns(spec, path, columns(parts))
    check_files(parts, spec.columns)


def _row_groups(reader: Any, lo: int, hi: int) -> Iterator[tuple[int, int]]:
    """The row groups holding rows [lo, hi) of a file, each with the file row it starts at."""
    offset = 0
    for group in range(reader.metadata.num_row_groups):
        size = reader.metadata.row_group(group).num_rows
        if offset < hi and offset + size > lo:
            yield group, offset
        offset += size


def _merge_report(report: BadRowReport, chunk: BadRowReport, first_row: int) -> None:
    """Add a chunk's bad rows (numbered from 1 in the chunk) to its file's report."""
    for reason, count in chunk.reasons.items():
        report.reasons[reason] = report.reasons.get(reason, 0) + count
        kept = report.examples.setdefault(reason, [])
        shifted = [n + first_row for n in chunk.examples.get(reason, [])]
        kept.extend(shifted[: MAX_EXAMPLES - len(kept)])
    report.rows += chunk.rows


class CriteoSource(Source):
    """A Criteo TSV read block of lines by block of lines (`trainers.data.criteo`'s parser)."""

    hashes_like_export = False

    def fixed_dense(self) -> list[dict[str, Any]]:
        return criteo.dense_transforms()

    def exported_ids(
        self, schema: DatasetSchema, vocabularies: dict[str, Any]
    ) -> dict[str, int | None]:
        return criteo.hex_ids(schema, vocabularies)

    def __init__(self, path: Path, limits: BadRowLimits, chunk_rows: int) -> None:
        super().__init__(limits, chunk_rows)
        criteo._file_stat(path)
        self.name, self.path = str(path), path
        names = [f"C{i}" for i in range(1, criteo.NUM_SPARSE + 1)]
        dense = tuple(f"I{i}" for i in range(1, criteo.NUM_DENSE + 1))
        columns = tuple(CategoricalColumn(n) for n in names)
        self.spec = TabularSchema("label", dense, columns, "criteo")
        with damaged_as_user_error(path):
            self.rows = _count_lines(path)
        self._offsets = {0: 0}  # line -> byte offset where it starts, noted while reading
        if self.rows == 0:
            raise RanknasError(f"{path}: the file is empty; expected Criteo TSV lines")

    def chunks(self, start: int, stop: int) -> Iterator[RawChunk]:
        report = BadRowReport(self.name, unit="line")
        begin = max(line for line in self._offsets if line <= start)
        with open_data(self.path) as lines:
            lines.seek(self._offsets[begin])
            for _ in range(start - begin):
                lines.readline()
            for block in criteo._chunks(lines, stop - start):
                parsed = _parse_block(block)
                if parsed is None:  # a malformed line: the slow parser finds and reports it
                    parsed = criteo._parse_chunk(block, start + report.rows + 1, report)
                labels, dense, raw = parsed
                report.rows += len(block)
                self.limits.check(report, final=False)
                yield _criteo_chunk(labels, dense, raw)
            self._offsets[start + report.rows] = lines.tell()  # the next range starts here
        self._finish(report, start, stop)

    def bucket_ids(self, values: np.ndarray, buckets: int) -> np.ndarray:
        # as `load_criteo` hashes: the hex value itself
        return hashed_ids(values.astype(np.uint64), np.zeros(len(values), bool), buckets)

    def value_text(self, value: Any) -> str:
        return format(int(value), "08x")


def _parse_block(lines: list[bytes]) -> tuple[np.ndarray, np.ndarray, np.ndarray] | None:
    """`criteo._parse_chunk`'s labels, dense and raw hex values, parsed by pyarrow's CSV reader
    (C++) and numpy; None when any line is malformed."""
    import pyarrow as pa
    import pyarrow.csv as pa_csv

    names = ["label", *(f"I{i}" for i in range(1, 14)), *(f"C{i}" for i in range(1, 27))]
    types = {"label": pa.int8()} | {n: pa.int64() for n in names[1:14]}
    types |= {n: pa.binary() for n in names[14:]}
    try:
        table = pa_csv.read_csv(
            pa.py_buffer(b"".join(lines)),
            read_options=pa_csv.ReadOptions(column_names=names),
            parse_options=pa_csv.ParseOptions(delimiter="\t", quote_char=False),
            convert_options=pa_csv.ConvertOptions(column_types=types, strings_can_be_null=False),
        )
    except (pa.ArrowInvalid, OSError):
        return None
    labels = table.column("label")
    if table.num_rows != len(lines) or labels.null_count:
        return None
    labels = labels.to_numpy()
    counts = [table.column(n) for n in names[1:14]]
    dense = criteo.counts_with_blanks(
        np.stack([c.fill_null(0).to_numpy() for c in counts], axis=1),
        np.stack([c.is_null().to_numpy() for c in counts], axis=1),
    )
    raw = [_hex_values(table.column(n).combine_chunks()) for n in names[14:]]
    if ((labels != 0) & (labels != 1)).any() or any(values is None for values in raw):
        return None
    return labels.astype(np.float32), dense, np.stack(raw, axis=1)


def _hex_values(column: Any) -> np.ndarray | None:
    """Values of a binary column of 0-8 hex digits (empty: -1); None if one is not hex."""
    n = len(column)
    offsets = np.frombuffer(column.buffers()[1], np.int32, n + 1, column.offset * 4)
    data = np.frombuffer(column.buffers()[2] or b"\0", np.uint8)
    lengths = np.diff(offsets)
    if n and lengths.max() > 8:
        return None
    position = np.arange(8)
    present = position >= (8 - lengths)[:, None]  # right-aligned in the value's last 8 bytes
    ends = np.maximum(offsets[1:, None] - 8 + position, 0)
    digits = criteo._HEX_DIGITS[data[np.minimum(ends, len(data) - 1)]]
    digits = np.where(present, digits, 0)
    if (digits == 255).any():
        return None
    values = (digits.astype(np.int64) << (4 * (7 - position))).sum(axis=1)
    return np.where(lengths == 0, -1, values)


def _criteo_chunk(labels: np.ndarray, dense: np.ndarray, raw: np.ndarray) -> RawChunk:
    import pandas as pd

    columns = {}
    for k in range(raw.shape[1]):
        codes, values = pd.factorize(raw[:, k])  # hashing: faster than sorting
        codes = np.where(raw[:, k] < 0, -1, codes).astype(np.int64)  # -1 (missing) unused
        columns[f"C{k + 1}"] = (codes, values)
    ids = np.zeros(raw.shape, dtype=np.int64)
    return RawChunk(labels, dense, ids, columns)


def _count_lines(path: Path) -> int:
    """The file's line count; a last line without a newline counts."""
    lines, last = 0, b"\n"
    with open_data(path) as file:
        while block := file.read(_BLOCK):
            lines, last = lines + block.count(b"\n"), block[-1:]
    return lines + (last != b"\n")
