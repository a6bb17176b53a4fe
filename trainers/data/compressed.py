"""Data files as logs are kept: plain, or compressed with gzip, bzip2 or xz.

A file's compression is read from its first bytes, not its name, so a Criteo day file
(`day_0.gz`) and a `logs.csv.gz` read alike; only the standard library's codecs are used.
"""

from __future__ import annotations

import bz2
import contextlib
import gzip
import lzma
import zlib
from collections.abc import Iterator
from pathlib import Path
from typing import IO, Any

from search_space.errors import RanknasError

# Magic numbers at the start of a compressed file, and the codec that reads it.
_MAGIC = {b"\x1f\x8b": "gzip", b"BZh": "bz2", b"\xfd7zXZ\x00": "xz"}
_OPENERS = {"gzip": gzip.open, "bz2": bz2.open, "xz": lzma.open}
COMPRESSED_SUFFIXES = (".gz", ".bz2", ".xz")
# What the codecs raise on a file cut short or damaged (a corrupt gzip/bzip2 header is an
# OSError, which the readers report as unreadable already).
DAMAGED = (EOFError, zlib.error, lzma.LZMAError)


@contextlib.contextmanager
def damaged_as_user_error(path: str | Path) -> Iterator[None]:
    """Turn a codec's error while reading `path` (a download cut short) into one line that
    names the file and what to do."""
    try:
        yield
    except DAMAGED as exc:
        raise RanknasError(f"{path}: the compressed file is cut short or damaged ({exc}); "
                           "copy or download it again") from None  # fmt: skip


def compression(path: str | Path) -> str | None:
    """'gzip', 'bz2' or 'xz' (pandas' names for them), or None for a plain file."""
    return next((kind for magic, kind in _MAGIC.items() if starts_with(path, magic)), None)


def starts_with(path: str | Path, magic: bytes) -> bool:
    """Whether the file's first bytes are `magic` (a format known by them, not its name)."""
    with open(path, "rb") as file:
        return file.read(len(magic)) == magic


def open_data(path: str | Path, mode: str = "rb", **kwargs: Any) -> IO[Any]:
    """`path` opened for reading ("rb" or "rt"), decompressed on the fly if it is
    compressed. `tell` and `seek` count uncompressed bytes (a seek backwards in a
    compressed file reads it again from the start)."""
    return _OPENERS.get(compression(path) or "", open)(path, mode, **kwargs)


def format_suffix(path: str | Path) -> str:
    """The suffix that names the file's format, lower case, past a compression suffix:
    `.csv` for `logs.csv.gz`."""
    suffixes = [s.lower() for s in Path(path).suffixes]
    if len(suffixes) > 1 and suffixes[-1] in COMPRESSED_SUFFIXES:
        suffixes.pop()
    return suffixes[-1] if suffixes else ""
