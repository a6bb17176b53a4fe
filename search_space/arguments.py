"""argparse types shared by the CLI's parsers: a bad value is refused by argparse, which
names the option and exits 2, before any work starts."""

from __future__ import annotations

import argparse
import math
import os
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

SEED_MAX = 2**32 - 1  # numpy's generators take seeds in [0, 2**32)
DEVICE_PATTERN = r"auto|cpu|(cuda|xpu)(:\d+)?|mps"


def number(
    kind: type,
    minimum: float | None = None,
    maximum: float | None = None,
    above: float | None = None,
) -> Callable[[str], Any]:
    """A finite number of `kind` in [`minimum`, `maximum`] (or above `above`)."""

    def parse(text: str) -> Any:
        try:
            value = kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected a number, got {text!r}") from None
        if not math.isfinite(value):
            raise argparse.ArgumentTypeError(f"expected a finite number, got {text}")
        if above is not None and not value > above:
            raise argparse.ArgumentTypeError(f"must be above {above}, got {text}")
        if minimum is not None and value < minimum:
            raise argparse.ArgumentTypeError(f"must be at least {minimum}, got {text}")
        if maximum is not None and value > maximum:
            raise argparse.ArgumentTypeError(f"must be at most {maximum}, got {text}")
        return value

    parse.__name__ = kind.__name__  # argparse's message names the type
    return parse


def positive(kind: type) -> Callable[[str], Any]:
    """A finite number of `kind` above 0."""
    return number(kind, above=0)


seed = number(int, minimum=0, maximum=SEED_MAX)
port = number(int, minimum=1, maximum=65535)


def device(text: str) -> str:
    """A torch device name, or auto (a GPU where there is one)."""
    if not re.fullmatch(DEVICE_PATTERN, text):
        raise argparse.ArgumentTypeError(f"{text!r}: use auto, cpu, cuda or cuda:N")
    return text


def output_file(text: str) -> str:
    """A file the command may write (tried now, so that a long run does not end in an
    error): not a directory, its directory created if missing."""
    path = Path(text)
    if path.is_dir():
        raise argparse.ArgumentTypeError(f"{text} is a directory: give a file name in it")
    existed = path.exists()
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        with path.open("a"):
            pass
    except OSError as exc:
        raise argparse.ArgumentTypeError(f"cannot write {text} ({exc.strerror})") from None
    if not existed:
        path.unlink()
    return text


def output_dir(text: str) -> str:
    """A directory the command may create or write into (not created here)."""
    path = Path(text)
    existing = next(p for p in (path, *path.parents) if p.exists())
    if not existing.is_dir():
        raise argparse.ArgumentTypeError(f"{existing} is a file, not a directory")
    if not os.access(existing, os.W_OK | os.X_OK):
        raise argparse.ArgumentTypeError(f"cannot write in {existing} (permission denied)")
    return text


def said(text: str) -> dict[str, str]:
    """A command's one line, for `add_parser`: in its parent's list and atop its --help."""
    return {"help": text, "description": text}
