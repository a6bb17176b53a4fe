"""Training on data bigger than memory: splits read piece by piece, preprocessing fitted in
one pass, batches made in a background thread.

- The split is by position in the files (training rows first, then validation, then
  test): the file-order split of the in-memory path, which is the time order when the
  files are written in time order (`check_time_order` checks it against a time column).
  Malformed rows are dropped where they are, so a split holds its range's good rows.
- One pass over the training rows fits what the in-memory path fits on the training
  split (`trainers.data.preprocess`'s formats, so the export and serving read it the same):
  each dense column's transform (running mean and variance of x and of log1p(x), min, max,
  and a uniform sample of `DENSE_SAMPLE` values for the median that decides `log1p`: exact
  up to that many rows) and each categorical column's vocabulary (a count per distinct
  value: memory grows with the vocabulary, not with the rows; values seen fewer than
  `min_count` times share the out-of-vocabulary id). For vocabularies of hundreds of
  millions of values, `hash_size` is the right choice: no counting pass state at all.
- The row cache (`trainers.data.stream_cache`, on unless `cache` is off): after the fit,
  one more pass writes every split's encoded rows to binary files, and every later pass,
  and every later run with the same files and settings (which then fits nothing), reads
  those arrays instead of parsing the files.
- Training batches: the rows of a split are cut into windows of `shuffle_rows` rows (a
  multiple of the batch size), each window's batches gathered in a permutation of the
  window (window 0's is the in-memory loader's, so a split that fits one window trains
  exactly as in memory) by `BatchLoader`; one thread reads the next window while another
  makes batches ahead of the training step into a queue of `prefetch_batches`. What is
  held: at most three windows (the one batched, the next and the one being read), one
  chunk (one Parquet row group or block of TSV lines) and the queue.
- Validation and test are held in memory when they have at most `memory_rows` rows, and
  streamed at each evaluation otherwise.
"""

from __future__ import annotations

import logging
import math
import threading
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, replace
from functools import partial
from itertools import pairwise
from pathlib import Path
from queue import Empty, Full, Queue
from typing import Any

import numpy as np

from search_space.errors import RanknasError
from search_space.preprocessing import number_form, number_forms
from search_space.schema import CategoricalFeature, DatasetSchema, check_encoding
from trainers.data.dataset import (
    Batch,
    BatchLoader,
    TabularData,
    batch_count,
    check_batch_size,
    split_bounds,
)
from trainers.data.preprocess import (
    FIRST_ID,
    apply_dense,
    dense_transform,
    is_heavy_tailed,
    item_ids,
    scaled_without_far_values,
    vocabulary_ids,
    vocabulary_positions,
)
from trainers.data.report import (
    BadRowLimits,
    warn_blank_categorical,
    warn_constant_categorical,
    warn_constant_dense,
    warn_far_dense,
)
from trainers.data.stream_cache import (
    RowCache,
    RowCacheWriter,
    cache_path,
    default_cache_dir,
    open_row_cache,
)
from trainers.data.stream_sources import (
    CHUNK_ROWS,
    RawChunk,
    Source,
    data_files,
    open_source,
)

logger = logging.getLogger(__name__)

DENSE_SAMPLE = 1 << 16  # values per dense column kept for the median

# a split's rows in pieces, given the piece size wanted (a source's chunks have their own)
ReadRows = Callable[[int], Iterator[TabularData]]


@dataclass(frozen=True)
class StreamOptions:
    """How a data set is streamed; see the module's docstring."""

    min_count: int = 1
    hash_size: int | None = None
    chunk_rows: int = CHUNK_ROWS
    shuffle_rows: int = 1 << 18
    prefetch_batches: int = 8
    memory_rows: int = 500_000
    max_bad_rows: int | None = 1000
    max_bad_fraction: float | None = 0.01
    cache: bool = True  # encode the rows once into a row cache (`stream_cache`)
    cache_dir: str | None = None  # None: `.ranknas-cache/` beside the data

    def __post_init__(self) -> None:
        for name in ("chunk_rows", "shuffle_rows", "prefetch_batches"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise RanknasError(f"stream option {name} must be an integer >= 1 (got {value!r})")


@dataclass
class StreamedData:
    """Train, validation and test of a streamed data set, and what was fitted on training."""

    train: StreamSplit
    valid: Rows
    test: Rows
    fitted: dict[str, Any]
    description: str
    cache_note: str = ""  # one line: the row cache written or read, if any


def open_stream(
    spec: str,
    schema_path: str | None = None,
    *,
    fractions: Sequence[float] = (0.8, 0.1, 0.1),
    options: StreamOptions | None = None,
    dense_preprocessing: bool = True,
    time_order: str | None = None,
    time_column: str | None = None,
) -> StreamedData:
    """Open `criteo:PATH` or Parquet files (a directory or one file, with the schema YAML at
    `schema_path`), split them in file order, and fit the preprocessing in one pass over the
    training rows (dense transforms only with `dense_preprocessing`). With `options.cache`,
    the encoded rows are written to a row cache after the fit and every pass reads them; a
    later run with the same files and settings reads the cache and fits nothing.

    `time_order`: check that file order is the order of the time column (`time_column`, or
    the schema's), `check_time_order`; its text says how to split in file order anyway."""
    options = options or StreamOptions()
    check_encoding(options.min_count, options.hash_size, spec)
    if spec == "synthetic":
        raise RanknasError(
            "streaming reads files: give data.source (a Parquet directory or file, or "
            "criteo:PATH); the built-in synthetic data is generated in memory"
        )
    criteo_file = spec.startswith("criteo:")  # no time column; counting its lines is a pass
    if time_column and criteo_file:
        raise RanknasError(f"{spec}: a Criteo file has no time column ({time_column!r} given "
                           "for the split); its lines are in time order: drop it")  # fmt: skip
    where = _cache_path(spec, schema_path, fractions, options, dense_preprocessing)
    cache = open_row_cache(where) if where is not None else None
    order, source = "", None
    if cache is None or (time_order and not criteo_file):
        limits = BadRowLimits(options.max_bad_rows, options.max_bad_fraction)
        source = open_source(spec, schema_path, chunk_rows=options.chunk_rows, limits=limits,
                             time_column=time_column)  # fmt: skip
        if time_order:
            order = check_time_order(source, _bounds(source.rows, fractions), time_order)
    if cache is not None:
        return _from_cache(cache, options, f"read the encoded rows cached in {where}", order)
    assert source is not None
    bounds = _bounds(source.rows, fractions)
    encoder, train_rows, clicks = fit_encoder(source, bounds[1], options, dense_preprocessing)
    if where is not None:
        meta = {"source": source.name, "source_rows": source.rows,
                "label_mean": clicks / train_rows, "fitted": encoder.fitted}  # fmt: skip
        if (cache := _write_row_cache(where, source, bounds, encoder, meta)) is not None:
            note = f"wrote the encoded rows to {where} ({cache.nbytes / 2**30:.2f} GiB)"
            return _from_cache(cache, options, note + ": later runs read them", order)
    read_train = _encoded(source, *bounds[:2], encoder)
    train = StreamSplit(read_train, encoder.schema, train_rows, options,
                        label_mean=clicks / train_rows, positives=round(clicks))  # fmt: skip
    valid, test = (
        _eval_split(source, lo, hi, encoder, options) for lo, hi in (bounds[1:3], bounds[2:])
    )
    description = _describe(source.name, source.rows, (train, valid, test), order=order)
    return StreamedData(train, valid, test, encoder.fitted, description)


def _bounds(rows: int, fractions: Sequence[float]) -> list[int]:
    """0, the end of training, the end of validation, `rows` (as `split_indices` cuts)."""
    return [0, *(int(b) for b in split_bounds(rows, fractions)), rows]


def _describe(
    name: str, rows: int, splits: Sequence[Rows], cached: bool = False, order: str = ""
) -> str:
    train, valid, test = splits
    read = "from the row cache" if cached else "in chunks"
    return (
        f"in file order{order}, streamed from {name} ({rows:,} rows in the files, "
        f"{len(train):,} training rows read {read}; "
        f"{_eval_where(valid)} validation, {_eval_where(test)} test)"
    )


TIME_ORDER_TOLERANCE = 0.01  # rows out of place at a split's edge, told but not refused
_SPLITS = ("training", "validation", "test")


def check_time_order(source: Source, bounds: list[int], anyway: str) -> str:
    """Refuse a split in file order that is not in the order of the source's time column:
    more than `TIME_ORDER_TOLERANCE` of a later split's rows earlier than the latest row of
    the split before (or of the earlier split's rows later than the later one's earliest,
    whichever is fewer: one row of a wrong date does not refuse a log). Fewer are told in a
    warning; `anyway` says how to split in file order regardless. Two passes over the time
    column at most; what is said of the order (", the order of 'hour'"), or ""."""
    time = source.spec.time
    if not time:
        return ""
    ranges = list(pairwise(bounds))
    spans = [_time_span(source.times(lo, hi)) for lo, hi in ranges]
    if any(low > high for low, high in spans):  # a split of no time at all: nothing to say
        return ""
    claim = f", the order of {time!r}"
    for k in range(len(ranges) - 1):
        (_, latest), (earliest, _) = spans[k], spans[k + 1]
        if latest <= earliest:
            continue
        later = sum(int(np.count_nonzero(t > earliest)) for t in source.times(*ranges[k]))
        earlier = sum(int(np.count_nonzero(t < latest)) for t in source.times(*ranges[k + 1]))
        sizes = [hi - lo for lo, hi in ranges[k : k + 2]]
        share = min(later / sizes[0], earlier / sizes[1])
        said = (f"{earlier:,} of the {sizes[1]:,} {_SPLITS[k + 1]} rows are earlier than the "
                f"latest {_SPLITS[k]} row and {later:,} of the {sizes[0]:,} {_SPLITS[k]} rows "
                f"later than the earliest {_SPLITS[k + 1]} row, by the time column "
                f"{time!r}")  # fmt: skip
        if share > TIME_ORDER_TOLERANCE:
            raise RanknasError(
                f"{source.name}: the rows are not in time order: {said}; split in file order, "
                "the model would be validated and tested on rows older than ones it trained "
                f"on. Write the files sorted by {time!r} (a directory's files in name order), "
                f"or split in file order anyway: {anyway}"
            )
        logger.warning("%s: %s: at most %.0f%% out of place, split in file order", source.name,
                       said, 100 * TIME_ORDER_TOLERANCE)  # fmt: skip
        claim = f", the order of {time!r} but for a few rows"
    return claim


def _time_span(pieces: Iterator[np.ndarray]) -> tuple[float, float]:
    """The earliest and latest time of a split (NaN, a cell of no time, left out)."""
    low, high = math.inf, -math.inf
    for times in pieces:
        if (times := times[~np.isnan(times)]).size:
            low, high = min(low, float(times.min())), max(high, float(times.max()))
    return low, high


def _eval_split(source: Source, lo: int, hi: int, encoder: Encoder, options: StreamOptions) -> Rows:
    """Held in memory up to `memory_rows` rows; else streamed (one pass counts its rows and
    positive labels)."""
    if hi - lo <= options.memory_rows:
        return concat([encoder.apply(chunk) for chunk in source.chunks(lo, hi)], encoder.schema)
    rows, positives = 0, 0
    for chunk in source.chunks(lo, hi):
        rows, positives = rows + len(chunk), positives + int(np.count_nonzero(chunk.labels))
    return StreamSplit(_encoded(source, lo, hi, encoder), encoder.schema, rows, options,
                       positives=positives)  # fmt: skip


def _encoded(source: Source, start: int, stop: int, encoder: Encoder) -> ReadRows:
    """Rows [start, stop) of a source, encoded chunk by chunk as they are read."""

    def read(_: int) -> Iterator[TabularData]:
        for chunk in source.chunks(start, stop):
            yield encoder.apply(chunk)

    return read


def _cache_path(
    spec: str,
    schema_path: str | None,
    fractions: Sequence[float],
    options: StreamOptions,
    dense_preprocessing: bool,
) -> Path | None:
    """Where the row cache of these files and settings lives; None without a cache (or
    without the schema Parquet needs: `open_source` says so)."""
    if not options.cache or (schema_path is None and not spec.startswith("criteo:")):
        return None
    files = data_files(spec)
    data_path = spec.removeprefix("criteo:")
    settings = {
        "schema": Path(schema_path).read_text() if schema_path else None,
        "fractions": [float(f) for f in fractions],
        "dense_preprocessing": dense_preprocessing,
        "min_count": options.min_count,
        "hash_size": options.hash_size,
        "max_bad_rows": options.max_bad_rows,
        "max_bad_fraction": options.max_bad_fraction,
    }
    cache_dir = Path(options.cache_dir) if options.cache_dir else default_cache_dir(data_path)
    return cache_path(files, settings, cache_dir, Path(data_path).name)


def _write_row_cache(
    where: Path, source: Source, bounds: list[int], encoder: Encoder, meta: dict[str, Any]
) -> RowCache | None:
    """Encode every row of the source into a row cache at `where` (one more pass over the
    files); None, with a warning, when it cannot be written."""
    writer = None
    try:
        writer = RowCacheWriter(where, encoder.schema)
        split_rows, split_positives = [], []
        for lo, hi in pairwise(bounds):
            before, positives = writer.rows, 0
            for chunk in source.chunks(lo, hi):
                encoded = encoder.apply(chunk)
                writer.append(encoded)
                positives += int(np.count_nonzero(encoded.labels))
            split_rows.append(writer.rows - before)
            split_positives.append(positives)
        return writer.finish(meta | {"split_rows": split_rows, "split_positives": split_positives})
    except OSError as exc:
        logger.warning("cannot write the row cache %s (%s): reading the files", where, exc)
        return None
    finally:
        if writer is not None:
            writer.discard()


def _from_cache(
    cache: RowCache, options: StreamOptions, note: str, order: str = ""
) -> StreamedData:
    """Training streamed from the cache; validation and test too, or in memory when small."""
    meta = cache.meta
    positives = meta.get("split_positives", [None] * 3)  # a cache written before they were
    splits: list[Rows] = []
    for k, (lo, hi) in enumerate(cache.split_ranges):
        if k and hi - lo <= options.memory_rows:
            splits.append(cache.read(lo, hi))
        else:
            read = partial(cache.windows, lo, hi)
            label_mean = meta["label_mean"] if k == 0 else None
            splits.append(StreamSplit(read, cache.schema, hi - lo, options, label_mean,
                                      positives[k]))  # fmt: skip
    train, valid, test = splits
    description = _describe(meta["source"], meta["source_rows"], splits, cached=True, order=order)
    return StreamedData(train, valid, test, meta["fitted"], description, note)


def _eval_where(split: Rows) -> str:
    return f"{len(split):,} {'streamed' if isinstance(split, StreamSplit) else 'in-memory'}"


class DenseStats:
    """One dense column's statistics over a stream of values (blanks are NaN)."""

    def __init__(self, column: str, seed: int) -> None:
        self.column = column
        self.rng = np.random.default_rng([seed, 7])
        self.count, self.blanks = 0, 0
        self.moments = {"x": (0.0, 0.0), "log": (0.0, 0.0)}  # (mean, sum of squared deviations)
        self.low, self.high = math.inf, -math.inf
        self.sample = np.zeros(0)
        self.priority = np.zeros(0)
        self.far = np.zeros(0)  # values of the sample left out of the scaling: `transform`

    def update(self, values: np.ndarray) -> None:
        x = values.astype(np.float64)
        present = ~np.isnan(x)
        self.blanks += int((~present).sum())
        x = x[present]
        if not len(x):
            return
        for key, y in (("x", x), ("log", np.log1p(np.maximum(x, 0)))):
            self.moments[key] = _merge_moments(self.moments[key], self.count, y)
        self.count += len(x)
        self.low, self.high = min(self.low, float(x.min())), max(self.high, float(x.max()))
        self._keep_sample(x)

    def _keep_sample(self, x: np.ndarray) -> None:
        """A uniform sample: the values with the `DENSE_SAMPLE` smallest random priorities."""
        values = np.concatenate([self.sample, x])
        priority = np.concatenate([self.priority, self.rng.random(len(x))])
        if len(values) > DENSE_SAMPLE:
            kept = np.argpartition(priority, DENSE_SAMPLE)[:DENSE_SAMPLE]
            values, priority = values[kept], priority[kept]
        self.sample, self.priority = values, priority

    def transform(self) -> dict[str, Any]:
        """`fit_dense`'s transform of the column, from the statistics."""
        if not self.count:
            return dense_transform(self.column, False, 0.0, 1.0)
        log1p = is_heavy_tailed(self.low, self.high, float(np.median(self.sample)))
        mean, squares = self.moments["log" if log1p else "x"]
        sample = np.log1p(np.maximum(self.sample, 0)) if log1p else self.sample
        mean, std, self.far = scaled_without_far_values(
            sample, mean, math.sqrt(squares / self.count)
        )
        return dense_transform(self.column, log1p, mean, std)


def _merge_moments(moments: tuple[float, float], count: int, y: np.ndarray) -> tuple[float, float]:
    """Mean and sum of squared deviations of the values so far (`count` of them) and `y`
    (Chan et al.'s parallel update)."""
    mean_a, squares_a = moments
    mean_b, squares_b = float(y.mean()), float(((y - y.mean()) ** 2).sum())
    total = count + len(y)
    delta = mean_b - mean_a
    mean = mean_a + delta * len(y) / total
    return mean, squares_a + squares_b + delta * delta * count * len(y) / total


class ValueCounts:
    """How often each raw value of a categorical column occurs (first seen first)."""

    def __init__(self) -> None:
        self.counts: dict[Any, int] = {}

    def update(self, codes: np.ndarray, values: np.ndarray) -> None:
        per_value = np.bincount(codes[codes >= 0], minlength=len(values))
        counts = self.counts
        for value, count in zip(values.tolist(), per_value.tolist(), strict=True):
            if count:
                counts[value] = counts.get(value, 0) + count

    def vocabulary(self, min_count: int) -> list[Any]:
        """Values seen at least `min_count` times, most frequent first (ties: first seen)."""
        kept = [(v, c) for v, c in self.counts.items() if c >= min_count]
        return [v for v, _ in sorted(kept, key=lambda item: -item[1])]


class Encoder:
    """What was fitted on the training rows, applied to a chunk: ids and dense transforms."""

    def __init__(
        self,
        source: Source,
        transforms: list[dict[str, Any]],
        vocabularies: dict[str, list[Any]],
        hashing: dict[str, int],
        whole_numbers: dict[str, str | None] | None = None,
    ) -> None:
        self.source, self.transforms, self.hashing = source, transforms, hashing
        self.index = {name: vocabulary_positions(vs) for name, vs in vocabularies.items()}
        spec = source.spec
        features = []
        for column in spec.categorical:
            cardinality = column.cardinality
            if column.from_values:
                cardinality = hashing.get(column.name) or len(vocabularies[column.name]) + FIRST_ID
            features.append(CategoricalFeature(column.name, cardinality))
        self.schema = DatasetSchema(spec.dense, tuple(features), spec.label, spec.name)
        text = {n: [source.value_text(v) for v in vs] for n, vs in vocabularies.items()}
        # the format of `preprocess.fit_preprocessing`: the export applies it to raw rows
        exported = hashing if source.hashes_like_export else {}
        written = {n: form for n, form in (whole_numbers or {}).items() if form}  # exported's
        self.fitted: dict[str, Any] = {"dense": transforms, "vocabulary": text,
                                       "hashing": exported, "whole_numbers": written}  # fmt: skip
        if (ids := source.exported_ids(self.schema, text)) is not None:
            self.fitted["hex_ids"] = ids

    def apply(self, chunk: RawChunk) -> TabularData:
        ids = chunk.ids
        for k, column in enumerate(self.source.spec.categorical):
            if column.from_values:
                ids[:, k] = self._ids(column.name, *chunk.raw[column.name])
        data = TabularData(chunk.dense, ids, chunk.labels, self.schema)
        return apply_dense(data, self.transforms)

    def _ids(self, name: str, codes: np.ndarray, values: np.ndarray) -> np.ndarray:
        if name in self.hashing:
            lookup = self.source.bucket_ids(values, self.hashing[name])
        else:
            lookup = vocabulary_ids(self.index[name], values)
        return item_ids(lookup, codes)


def fit_encoder(
    source: Source, stop: int, options: StreamOptions, dense_preprocessing: bool = True
) -> tuple[Encoder, int, float]:
    """One pass over rows [0, stop): the dense transforms and vocabularies, the number of
    good training rows and their positive labels."""
    spec = source.spec
    fixed = source.fixed_dense()
    fit_dense = dense_preprocessing and fixed is None
    dense = [DenseStats(column, seed=k) for k, column in enumerate(spec.dense)] if fit_dense else []
    fitted = [c for c in spec.categorical if c.from_values]
    hashing = {c.name: c.hash_size or options.hash_size for c in fitted
               if c.hash_size or options.hash_size}  # fmt: skip
    min_count = {c.name: c.min_count or options.min_count for c in fitted if c.name not in hashing}
    counts = {name: ValueCounts() for name in min_count}
    rows, clicks = 0, 0.0
    blank = [c.name for c in fitted]  # until a value shows, vocabulary or hashed
    gaps: set[str] = set()  # columns with a blank in some training row
    exported = hashing if source.hashes_like_export else {}  # Criteo's ids: served as hashed
    forms: dict[str, set[str]] = {name: set() for name in exported}  # how whole numbers read
    for chunk in source.chunks(0, stop):
        rows += len(chunk)
        clicks += float(chunk.labels.sum())
        blank = [name for name in blank if not (chunk.raw[name][0] >= 0).any()]
        gaps |= {name for name in counts if (chunk.raw[name][0] < 0).any()}
        for name, seen in forms.items():
            seen |= number_forms(str(v).strip() for v in chunk.raw[name][1].tolist())
        for k, stats in enumerate(dense):
            stats.update(chunk.dense[:, k])
        for name, values in counts.items():
            values.update(*chunk.raw[name])
    if rows == 0:
        raise RanknasError(f"{source.name}: no training rows (the training split is empty)")
    for stats in dense:
        if not stats.count:
            raise RanknasError(f"{source.name}: dense column {stats.column!r} is blank in every "
                               "training row: there is no value to learn from or to fill it "
                               "with; drop it from the schema's dense columns")  # fmt: skip
        if stats.blanks:
            logger.warning("%s: %d blank value(s) in dense column %r of the training rows: "
                           "filled with the training mean", source.name, stats.blanks,
                           stats.column)  # fmt: skip
    warn_blank_categorical(source.name, blank, "training row")
    one = [name for name, c in counts.items() if len(c.counts) == 1 and name not in gaps]
    warn_constant_categorical(source.name, one)
    warn_constant_dense(source.name, [s.column for s in dense if s.low == s.high])
    vocabularies = {name: c.vocabulary(min_count[name]) for name, c in counts.items()}
    transforms = fixed if fixed is not None else [stats.transform() for stats in dense]
    warn_far_dense(source.name, {s.column: s.far for s in dense})
    whole_numbers = {name: number_form(seen) for name, seen in forms.items()}
    encoder = Encoder(source, transforms, vocabularies, hashing, whole_numbers)
    return encoder, rows, clicks


class StreamSplit:
    """Rows of a split, `rows` of them, read piece by piece by `read` (from the source's
    files, encoded as they are read, or from the row cache).

    Looks like a `TabularData` to the trainer: `len`, `schema`, `loader(...)` and `head`.
    """

    def __init__(
        self,
        read: ReadRows,
        schema: DatasetSchema,
        rows: int,
        options: StreamOptions,
        label_mean: float | None = None,
        positives: int | None = None,
    ) -> None:
        self.read, self.schema, self.rows, self.options = read, schema, rows, options
        self.label_mean = label_mean  # counted by the fitting pass (the training split's)
        self.positives = positives  # positive labels, where a pass over the rows counted them
        self._head: TabularData | None = None

    def __len__(self) -> int:
        return self.rows

    def windows(self, size: int) -> Iterator[TabularData]:
        """The rows in windows of exactly `size` rows (the last one: what is left)."""
        parts: list[TabularData] = []
        held = 0
        for chunk in self.read(size):
            parts.append(chunk)
            held += len(chunk)
            if held >= size:
                window = concat(parts, self.schema)
                for lo in range(0, held - size + 1, size):
                    yield _rows(window, lo, lo + size)
                rest = _rows(window, held - held % size, held)
                parts, held = [rest.take(np.arange(len(rest)))], held % size  # a copy: frees it
        if held:
            yield concat(parts, self.schema)

    def head(self, rows: int) -> TabularData:
        """The first `rows` rows, in memory (kept for the next call)."""
        if self._head is None or len(self._head) < min(rows, self.rows):
            parts, held = [], 0
            for chunk in self.read(rows):
                parts.append(chunk)
                held += len(chunk)
                if held >= rows:
                    break
            self._head = concat(parts, self.schema)
        return _rows(self._head, 0, rows)

    def loader(
        self,
        batch_size: int,
        *,
        shuffle: bool = False,
        seed: int = 0,
        drop_last: bool = False,
        pin_memory: bool | None = None,
    ) -> StreamLoader:
        return StreamLoader(self, batch_size, shuffle=shuffle, seed=seed, drop_last=drop_last,
                            pin_memory=pin_memory)  # fmt: skip


# Rows to train or evaluate on: in memory, or a split streamed from files (both have
# `len`, `schema`, `loader(...)` and `head(rows)`).
Rows = TabularData | StreamSplit


class StreamLoader:
    """`BatchLoader`'s batches for a `StreamSplit`: each iteration is one epoch, shuffled
    window by window, made ahead by a thread."""

    def __init__(
        self,
        split: StreamSplit,
        batch_size: int,
        *,
        shuffle: bool = False,
        seed: int = 0,
        drop_last: bool = False,
        pin_memory: bool | None = None,
    ) -> None:
        check_batch_size(batch_size)
        self.split, self.batch_size, self.shuffle, self.seed = split, batch_size, shuffle, seed
        self.drop_last, self.pin_memory = drop_last, pin_memory
        self.window_rows = max(batch_size, split.options.shuffle_rows // batch_size * batch_size)
        self.epoch = 0

    def __len__(self) -> int:
        return batch_count(len(self.split), self.batch_size, self.drop_last)

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch

    def __iter__(self) -> Iterator[Batch]:
        epoch, self.epoch = self.epoch, self.epoch + 1
        return prefetch(self._batches(epoch), self.split.options.prefetch_batches)

    def _batches(self, epoch: int) -> Iterator[Batch]:
        # windows are read by a thread of their own, one ahead: the step does not wait for a
        # whole window each time one is used up; a shuffled window's batches are gathered
        # from it in the window's permutation (no shuffled copy of the window)
        for w, window in enumerate(prefetch(self.split.windows(self.window_rows), depth=1)):
            order = self._permutation(epoch, w, len(window)) if self.shuffle else None
            yield from BatchLoader(window, self.batch_size, drop_last=self.drop_last,
                                   pin_memory=self.pin_memory, order=order)  # fmt: skip

    def _permutation(self, epoch: int, window: int, rows: int) -> np.ndarray:
        key = [self.seed, epoch] + ([window] if window else [])  # window 0: BatchLoader's
        return np.random.default_rng(key).permutation(rows)


_END = object()


class _Failed:
    def __init__(self, error: BaseException) -> None:
        self.error = error


def prefetch(items: Iterator[Any], depth: int) -> Iterator[Any]:
    """`items`, made by a background thread at most `depth` ahead of the consumer; an error
    in the thread is raised here. Stopping early (closing the generator) stops the thread."""
    queue: Queue = Queue(maxsize=depth)
    stop = threading.Event()

    def put(item: Any) -> bool:
        while not stop.is_set():
            try:
                queue.put(item, timeout=0.1)
                return True
            except Full:
                continue
        return False

    def fill() -> None:
        try:
            for item in items:
                if not put(item):
                    return
            put(_END)
        except BaseException as exc:  # handed to the consumer, raised there
            put(_Failed(exc))

    thread = threading.Thread(target=fill, name="ranknas-stream", daemon=True)
    thread.start()
    try:
        while True:
            item = queue.get()
            if item is _END:
                return
            if isinstance(item, _Failed):
                raise item.error
            yield item
    finally:
        stop.set()
        _drain(queue)


def _drain(queue: Queue) -> None:
    while True:
        try:
            queue.get_nowait()
        except Empty:
            return


def concat(parts: list[TabularData], schema: DatasetSchema) -> TabularData:
    """Rows of several parts, one after the other (no rows: an empty set)."""
    if not parts:
        return TabularData(np.zeros((0, schema.num_dense)), np.zeros((0, schema.num_sparse)),
                           np.zeros(0), schema)  # fmt: skip
    if len(parts) == 1:
        return parts[0]
    return TabularData(
        np.concatenate([p.dense for p in parts]),
        np.concatenate([p.categorical for p in parts]),
        np.concatenate([p.labels for p in parts]),
        schema,
    )


def _rows(data: TabularData, lo: int, hi: int) -> TabularData:
    """Rows [lo, hi) as views (no copy)."""
    return replace(data, dense=data.dense[lo:hi], categorical=data.categorical[lo:hi],
                   labels=data.labels[lo:hi])  # fmt: skip
