"""Encoded rows of a streamed data set, cached on disk so that later passes and later runs
read arrays instead of parsing text.

A cache is a directory of three flat binary files, the rows of every split one after the
other in file order (training, validation, test): `dense.f32` (float32 [n, D], transformed),
`ids.bin` (int32 [n, S] when every cardinality fits, else int64; the ids after the
vocabulary or hashing) and `labels.f32` (float32 [n]), with `meta.json` (the schema, what
was fitted on the training rows, each split's row count). Its name holds a digest of what
decides the content: the files read (path, size, mtime), the schema file, the split
fractions and the encoding settings; a changed file gets another name, so a stale cache is
never found. It is written under a temporary name and renamed when complete, so a cache
cut off mid-write is never found either. Rows are read back with explicit reads into new
arrays (no memory map: touched pages of a map would count in the process's memory).
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import shutil
from collections.abc import Iterator
from itertools import pairwise
from pathlib import Path
from typing import Any, BinaryIO

import numpy as np

from search_space.errors import RanknasError
from search_space.schema import DatasetSchema
from trainers.data.dataset import TabularData

logger = logging.getLogger(__name__)

# 2: a Criteo file's dense transforms are its counts' (were none); hashed columns' whole_numbers
CACHE_VERSION = 2
CACHE_DIR_NAME = ".ranknas-cache"
_FILES = {"dense": "dense.f32", "ids": "ids.bin", "labels": "labels.f32"}


def default_cache_dir(data_path: str | Path) -> Path:
    """`.ranknas-cache/` beside the data file or directory."""
    return Path(data_path).resolve().parent / CACHE_DIR_NAME


def cache_path(files: list[Path], settings: dict[str, Any], cache_dir: Path, name: str) -> Path:
    """Where the rows of `files` encoded with `settings` are cached: `cache_dir/name-DIGEST`."""
    key = {"version": CACHE_VERSION, "files": [_file_key(f) for f in files], **settings}
    digest = hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()[:16]
    return cache_dir / f"{name}-{digest}"


def _file_key(file: Path) -> tuple[str, int, int]:
    """What tells a file's content apart without reading it: path, size, mtime."""
    stat = file.stat()
    return str(file.resolve()), stat.st_size, stat.st_mtime_ns


def _id_dtype(schema: DatasetSchema) -> np.dtype:
    largest = max((f.cardinality for f in schema.categorical), default=0)
    return np.dtype(np.int32 if largest <= np.iinfo(np.int32).max else np.int64)


class RowCache:
    """A complete cache: rows [lo, hi) read back as a `TabularData`."""

    def __init__(self, path: Path, meta: dict[str, Any]) -> None:
        self.path, self.meta = path, meta
        self.schema = DatasetSchema.from_dict(meta["schema"], source=str(path / "meta.json"))
        self.rows = int(sum(meta["split_rows"]))
        self._widths = {"dense": self.schema.num_dense, "ids": self.schema.num_sparse,
                        "labels": 0}  # fmt: skip
        self._dtypes = {"dense": np.dtype(np.float32), "ids": np.dtype(meta["id_dtype"]),
                        "labels": np.dtype(np.float32)}  # fmt: skip

    @property
    def split_ranges(self) -> list[tuple[int, int]]:
        """Rows [lo, hi) of training, validation and test."""
        ends = np.cumsum([0, *self.meta["split_rows"]]).tolist()
        return list(pairwise(ends))

    @property
    def nbytes(self) -> int:
        return sum((self.path / f).stat().st_size for f in _FILES.values())

    def complete(self) -> bool:
        """Whether every file holds exactly the rows the metadata counts."""
        return all(
            (self.path / file).stat().st_size == self.rows * self._row_bytes(name)
            for name, file in _FILES.items()
        )

    def read(self, lo: int, hi: int) -> TabularData:
        dense, ids, labels = (self._read(name, lo, hi) for name in _FILES)
        return TabularData(dense, ids, labels, self.schema)

    def windows(self, lo: int, hi: int, size: int) -> Iterator[TabularData]:
        """Rows [lo, hi) in pieces of `size` rows (the last: what is left)."""
        for start in range(lo, hi, size):
            yield self.read(start, min(start + size, hi))

    def _row_bytes(self, name: str) -> int:
        return max(self._widths[name], 1) * self._dtypes[name].itemsize

    def _read(self, name: str, lo: int, hi: int) -> np.ndarray:
        width = self._widths[name]
        array = np.empty((hi - lo, width) if width else hi - lo, dtype=self._dtypes[name])
        with (self.path / _FILES[name]).open("rb") as file:
            file.seek(lo * self._row_bytes(name))
            if file.readinto(memoryview(array).cast("B")) != array.nbytes:
                raise RanknasError(f"{self.path}: the row cache is truncated; delete it")
        return array


def open_row_cache(path: Path) -> RowCache | None:
    """The complete cache at `path`, or None (none there, another version, or damaged)."""
    try:
        meta = json.loads((path / "meta.json").read_text())
        if meta.get("version") != CACHE_VERSION:
            return None
        cache = RowCache(path, meta)
        return cache if cache.complete() else None
    except (OSError, ValueError, KeyError, TypeError, RanknasError):
        return None


class RowCacheWriter:
    """Appends encoded rows under a temporary name; `finish` renames the cache into place."""

    def __init__(self, path: Path, schema: DatasetSchema) -> None:
        self.path, self.schema = path, schema
        self.staging = path.with_name(f"{path.name}.tmp-{os.getpid()}")
        self.id_dtype = _id_dtype(schema)
        self.rows = 0
        _remove_abandoned(path)
        self.staging.mkdir(parents=True, exist_ok=True)
        self._files: dict[str, BinaryIO] = {
            name: (self.staging / file).open("wb") for name, file in _FILES.items()
        }

    def append(self, data: TabularData) -> None:
        self._files["dense"].write(data.dense.tobytes())
        self._files["ids"].write(data.categorical.astype(self.id_dtype).tobytes())
        self._files["labels"].write(data.labels.tobytes())
        self.rows += len(data)

    def finish(self, meta: dict[str, Any]) -> RowCache | None:
        """The cache, in place; None when another process put one there first."""
        self._close()
        meta = {"version": CACHE_VERSION, "schema": self.schema.to_dict(),
                "id_dtype": self.id_dtype.name, **meta}  # fmt: skip
        (self.staging / "meta.json").write_text(json.dumps(meta))
        try:
            self.staging.rename(self.path)
        except OSError:  # the same cache, written by a process beside this one
            return open_row_cache(self.path)
        return RowCache(self.path, meta)

    def discard(self) -> None:
        """Remove what is left under the temporary name (nothing after `finish`)."""
        self._close()
        shutil.rmtree(self.staging, ignore_errors=True)

    def _close(self) -> None:
        for file in self._files.values():
            file.close()


def _remove_abandoned(path: Path) -> None:
    """What a killed writer left (its temporary directory) and a cache damaged since it was
    written: neither is ever read, and both take room."""
    if path.exists() and open_row_cache(path) is None:
        shutil.rmtree(path, ignore_errors=True)
    for staging in path.parent.glob(f"{path.name}.tmp-*"):
        pid = staging.name.rsplit("-", 1)[-1]
        if pid.isdigit() and not _running(int(pid)):
            shutil.rmtree(staging, ignore_errors=True)


def _running(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's process
        return True
    return True
