"""The Criteo display-advertising TSV: `label \\t I1..I13 \\t C1..C26`, one impression a line;
plain or compressed (gzip, bzip2, xz: the day files ship as `day_N.gz`).

Integers may be empty; categoricals are hex strings (8 digits) or empty. The counts are
read as they are (a blank NaN); `dense_transforms` is how every Criteo model takes them,
log(1 + max(x, 0)) with a blank 0, a transform that studies apply and exports carry, so a
served row's raw counts are read as training read them. Categorical ids by frequency with
a minimum count or hashed (see `trainers.data.encoding`); with a vocabulary, each column's
hex values are kept (`TabularData.raw_values`), so that a study fits it on the training
split and exports it, as for any file. The file is streamed in chunks of lines and
each chunk is converted with numpy; the result is cached as .npy files plus `meta.json` in
a directory keyed by the file's path, size and mtime and the preprocessing settings.
Malformed lines (wrong column count, label not 0/1, non-integer I field, C field not hex)
are skipped, counted and reported with their line numbers.
"""

from __future__ import annotations

import hashlib
import itertools
import json
import logging
import os
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any, BinaryIO

import numpy as np

from search_space.errors import RanknasError
from search_space.files import looked_for
from search_space.schema import CategoricalFeature, DatasetSchema, check_encoding
from trainers.data.compressed import damaged_as_user_error, open_data
from trainers.data.dataset import Jagged, RawColumn, TabularData
from trainers.data.encoding import frequency_ids, hashed_ids
from trainers.data.report import BadRowLimits, BadRowReport

logger = logging.getLogger(__name__)

NUM_DENSE = 13
NUM_SPARSE = 26
NUM_FIELDS = 1 + NUM_DENSE + NUM_SPARSE
CHUNK_LINES = 1 << 16
# 2: the categorical columns' raw values (vocabularies fitted on training); 3: raw counts
_CACHE_VERSION = 3
_ARRAYS = ("dense", "categorical", "labels")
_PAD = 16  # digit value of the NUL padding in a fixed-width bytes array
_HEX_DIGITS = np.full(256, 255, dtype=np.uint8)
_HEX_DIGITS[0] = _PAD
for _value, _chars in enumerate(zip("0123456789abcdef", "0123456789ABCDEF", strict=True)):
    _HEX_DIGITS[[ord(c) for c in _chars]] = _value


def criteo_schema(cardinalities: list[int]) -> DatasetSchema:
    """Dense I1..I13, categorical C1..C26 with the given cardinalities, label `label`."""
    return DatasetSchema(
        dense=tuple(f"I{i}" for i in range(1, NUM_DENSE + 1)),
        categorical=tuple(
            CategoricalFeature(f"C{i}", c) for i, c in enumerate(cardinalities, start=1)
        ),
        label="label",
        name="criteo",
    )


def dense_transforms() -> list[dict[str, Any]]:
    """The counts' transform (`search_space.preprocessing.transform_dense`): log(1 + max(x,
    0)), a blank 0, nothing standardized or clipped, as Criteo models take them."""
    return [{"column": f"I{i}", "log1p": True, "mean": 0.0, "std": 1.0, "clip": None}
            for i in range(1, NUM_DENSE + 1)]  # fmt: skip


def hex_ids(schema: DatasetSchema, vocabulary: dict[str, Any]) -> dict[str, int | None]:
    """How an export takes each categorical column's hex ids (`preprocessing.encode_hex`):
    through its vocabulary (None), or hashed by value into the column's buckets, as the
    reader hashed them (`hash_size`)."""
    return {f.name: None if f.name in vocabulary else f.cardinality for f in schema.categorical}


def default_cache_dir() -> Path:
    """`$XDG_CACHE_HOME/ranknas/criteo`, or `~/.cache/ranknas/criteo`."""
    root = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(root) / "ranknas" / "criteo"


def load_criteo(
    path: str | Path,
    *,
    min_count: int = 10,
    hash_size: int | None = None,
    max_rows: int | None = None,
    max_bad_rows: int | None = 1000,
    max_bad_fraction: float | None = 0.01,
    cache_dir: str | Path | None = None,
    use_cache: bool = True,
) -> TabularData:
    """Read a Criteo TSV (or its cache).

    min_count: values seen fewer times share the rare id (ignored with `hash_size`);
    hash_size: hash ids into this many buckets instead of mapping by frequency;
    max_rows: read only the first this many lines; max_bad_rows / max_bad_fraction: the
    load stops past either limit of malformed lines (None disables one);
    cache_dir: where caches live (default `default_cache_dir()`).
    """
    path = Path(path)
    check_encoding(min_count, hash_size, str(path))
    if max_rows is not None and (not isinstance(max_rows, int) or max_rows < 1):
        raise RanknasError(f"{path}: max_rows must be an integer >= 1 (got {max_rows!r})")
    limits = BadRowLimits(max_bad_rows, max_bad_fraction)
    settings = {"min_count": min_count, "hash_size": hash_size, "max_rows": max_rows}
    cache = _cache_path(path, settings, cache_dir) if use_cache else None
    data = _read_cache(cache) if cache is not None else None
    if data is None:
        with damaged_as_user_error(path):
            labels, dense, raw, report = _parse_file(path, max_rows, limits)  # checks the limits
        data = _encode(labels, dense, raw, min_count, hash_size, report)
        if cache is not None:
            _write_cache(cache, data, settings)
    assert data.bad_rows is not None
    limits.check(data.bad_rows, final=True)  # a cache was written under other limits
    if data.bad_rows.bad:
        logger.warning(
            "%s: skipped %d malformed lines: %s", path, data.bad_rows.bad, data.bad_rows.describe()
        )
    return data


def _file_stat(path: Path) -> os.stat_result:
    try:
        stat = path.stat()
    except OSError as exc:
        where = looked_for(path, exc)
        raise RanknasError(f"{path}: cannot read the Criteo file ({exc.strerror}){where}") from None
    if not path.is_file():
        raise RanknasError(f"{path}: not a file; give the path of a Criteo TSV file")
    return stat


def _parse_file(
    path: Path, max_rows: int | None, limits: BadRowLimits
) -> tuple[np.ndarray, np.ndarray, np.ndarray, BadRowReport]:
    """Labels [n], counts [n, 13] (NaN = missing) and raw hex values [n, 26] (-1 = missing)."""
    _file_stat(path)
    report = BadRowReport(str(path), unit="line")
    parts = []
    with open_data(path) as lines:
        for chunk in _chunks(lines, max_rows):
            parts.append(_parse_chunk(chunk, report.rows + 1, report))
            report.rows += len(chunk)
            limits.check(report, final=False)
    if not parts:
        raise RanknasError(f"{path}: the file is empty; expected Criteo TSV lines")
    limits.check(report, final=True)
    labels, dense, raw = (np.concatenate(arrays) for arrays in zip(*parts, strict=True))
    return labels, dense, raw, report


def _chunks(lines: BinaryIO, max_rows: int | None) -> Iterator[list[bytes]]:
    left = max_rows
    while left is None or left > 0:
        chunk = list(
            itertools.islice(lines, CHUNK_LINES if left is None else min(left, CHUNK_LINES))
        )
        if not chunk:
            return
        left = None if left is None else left - len(chunk)
        yield chunk


def _parse_chunk(
    lines: list[bytes], first_line: int, report: BadRowReport
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    fields = [line.rstrip(b"\r\n").split(b"\t") for line in lines]
    numbers = np.arange(first_line, first_line + len(lines))
    shaped = np.array([len(f) == NUM_FIELDS for f in fields], dtype=bool)
    table = np.array([f for f, ok in zip(fields, shaped, strict=True) if ok], dtype=bytes)
    table = table.reshape(-1, NUM_FIELDS)
    numbers_ok = numbers[shaped]
    label_ok = (table[:, 0] == b"0") | (table[:, 0] == b"1")
    dense, dense_ok = _parse_dense(table[:, 1 : 1 + NUM_DENSE])
    raw, hex_ok = _parse_hex(table[:, 1 + NUM_DENSE :])
    report.add("wrong column count", numbers[~shaped])
    report.add("label not 0/1", numbers_ok[~label_ok])
    report.add("integer field not an integer", numbers_ok[label_ok & ~dense_ok])
    report.add("categorical field not hex", numbers_ok[label_ok & dense_ok & ~hex_ok])
    good = label_ok & dense_ok & hex_ok
    report.bad += len(lines) - int(good.sum())
    return (table[good, 0] == b"1").astype(np.float32), dense[good], raw[good]


def _parse_dense(tokens: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Integer tokens as float32 (empty -> NaN), and which rows parsed."""
    blank = tokens == b""
    filled = np.where(blank, b"0", tokens)
    ok = np.ones(len(tokens), dtype=bool)
    try:
        values = filled.astype(np.int64)
    except (ValueError, OverflowError):
        ok = np.array([_all_integers(row) for row in filled], dtype=bool)
        values = np.zeros(filled.shape, dtype=np.int64)
        values[ok] = filled[ok].astype(np.int64)
    return counts_with_blanks(values, blank), ok


def counts_with_blanks(values: np.ndarray, blank: np.ndarray) -> np.ndarray:
    """Integer counts as float32 with NaN where `blank`."""
    return np.where(blank, np.nan, values).astype(np.float32)


INT64 = np.iinfo(np.int64)


def _all_integers(tokens: np.ndarray) -> bool:
    """Whether every token is an integer a count can hold (int64: 99999999999999999999 was a
    traceback, not a malformed line)."""
    try:
        return all(INT64.min <= int(token) <= INT64.max for token in tokens)
    except ValueError:
        return False


def _parse_hex(tokens: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Values of hex tokens of 1-8 digits (empty -> -1), and which rows parsed."""
    too_long = np.zeros(tokens.shape, dtype=bool)
    if tokens.dtype.itemsize > 8:
        too_long = np.char.str_len(tokens) > 8
        tokens = np.where(too_long, b"", tokens)
    digits = _HEX_DIGITS[tokens.astype("S8").view(np.uint8)].reshape(*tokens.shape, 8)
    values = np.zeros(tokens.shape, dtype=np.int64)
    for position in range(8):
        digit = digits[..., position]
        values = np.where(digit < _PAD, values * 16 + digit, values)
    ok = ~(too_long | (digits == 255).any(axis=-1)).any(axis=1)
    return np.where(digits[..., 0] == _PAD, -1, values), ok


def _encode(
    labels: np.ndarray,
    dense: np.ndarray,
    raw: np.ndarray,
    min_count: int,
    hash_size: int | None,
    report: BadRowReport,
) -> TabularData:
    ids = np.empty_like(raw)
    cardinalities = []
    for k in range(NUM_SPARSE):
        column = raw[:, k]
        if hash_size is None:
            ids[:, k], cardinality = frequency_ids(column, min_count)
        else:
            ids[:, k], cardinality = hashed_ids(column, column < 0, hash_size), hash_size
        cardinalities.append(cardinality)
    values = _raw_values(raw, min_count) if hash_size is None else {}
    return TabularData(dense, ids, labels, criteo_schema(cardinalities), bad_rows=report,
                       raw_values=values)  # fmt: skip


def _raw_values(
    codes: np.ndarray, min_count: int, uniques: list[np.ndarray] | None = None
) -> dict[str, RawColumn]:
    """Each categorical column's hex values as a `RawColumn`, so that its vocabulary is
    fitted on the training split and exported (`preprocess.fit_categorical`), as a file
    read by its schema: the ids `_encode` gives are the whole file's, validation and test
    rows included, until then. `codes`: the hex values ([n, 26], -1 missing), or with
    `uniques` (each column's distinct values) their positions in those (the cache's)."""
    rows = np.arange(len(codes) + 1, dtype=np.int64)  # one value a row: shared offsets
    columns = {}
    for k in range(NUM_SPARSE):
        if uniques is None:
            present = codes[:, k] >= 0
            distinct, inverse = np.unique(codes[present, k], return_inverse=True)
            positions = np.full(len(codes), -1, dtype=np.int32)
            positions[present] = inverse
        else:
            distinct, positions = uniques[k], codes[:, k]
        columns[f"C{k + 1}"] = RawColumn(Jagged(rows, positions),
                                         tuple(f"{v:08x}" for v in distinct.tolist()),
                                         min_count=min_count)  # fmt: skip
    return columns


def _cache_path(path: Path, settings: dict[str, Any], cache_dir: str | Path | None) -> Path:
    stat = _file_stat(path)
    key = {
        "version": _CACHE_VERSION,
        "path": str(path.resolve()),
        "size": stat.st_size,
        "mtime_ns": stat.st_mtime_ns,
        **settings,
    }
    digest = hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()[:16]
    return Path(cache_dir or default_cache_dir()) / f"{path.name}-{digest}"


def _read_cache(cache: Path) -> TabularData | None:
    """The cached data set, or None when there is no (readable) cache."""
    try:
        meta = json.loads((cache / "meta.json").read_text())
        if meta.get("version") != _CACHE_VERSION:  # an older layout: read the file again
            return None
        arrays = {name: np.load(cache / f"{name}.npy") for name in _ARRAYS}
        schema = DatasetSchema.from_dict(meta["schema"], source=str(cache))
        report = BadRowReport.from_dict(meta["bad_rows"])
        raw = {}
        if meta["settings"]["hash_size"] is None:
            with np.load(cache / "values.npz") as stored:
                uniques = [stored[f"C{k + 1}"] for k in range(NUM_SPARSE)]
            codes = np.load(cache / "codes.npy")
            raw = _raw_values(codes, meta["settings"]["min_count"], uniques)
    except (OSError, ValueError, KeyError, TypeError, RanknasError):
        return None
    return TabularData(schema=schema, bad_rows=report, raw_values=raw, **arrays)


def _write_cache(cache: Path, data: TabularData, settings: dict[str, Any]) -> None:
    """Write the cache next to its final place, then rename it there (atomic)."""
    assert data.bad_rows is not None
    staging = cache.with_name(f"{cache.name}.tmp-{os.getpid()}")
    meta = {
        "version": _CACHE_VERSION,
        "source": data.bad_rows.source,
        "settings": settings,
        "schema": data.schema.to_dict(),
        "bad_rows": data.bad_rows.to_dict(),
    }
    try:
        staging.mkdir(parents=True, exist_ok=True)
        for name in _ARRAYS:
            np.save(staging / f"{name}.npy", getattr(data, name))
        if data.raw_values:  # each column's distinct hex values, and each row's position
            columns = [data.raw_values[f"C{k + 1}"] for k in range(NUM_SPARSE)]
            np.save(staging / "codes.npy", np.stack([c.codes.values for c in columns], axis=1))
            hex_values = {f"C{k + 1}": np.array([int(v, 16) for v in c.values], dtype=np.int64)
                          for k, c in enumerate(columns)}  # fmt: skip
            np.savez(staging / "values.npz", **hex_values)
        (staging / "meta.json").write_text(json.dumps(meta, indent=2))
        staging.rename(cache)
    except OSError as exc:
        logger.warning("could not write the Criteo cache %s (%s); continuing", cache, exc)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
