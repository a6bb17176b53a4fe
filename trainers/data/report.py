"""Counting malformed input rows, and stopping when there are too many."""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from search_space.errors import RanknasError

MAX_EXAMPLES = 5
logger = logging.getLogger(__name__)


def warn_blank_categorical(source: str, names: Sequence[str], where: str = "row") -> None:
    """Categorical columns of `source` that hold no value in any `where` (row, training
    row): `data schema` leaves them out, but a schema may name them."""
    if names:
        logger.warning("%s: categorical column(s) %s hold no value in any %s: every row gets "
                       "the missing id, a feature that tells nothing; drop them from the "
                       "schema", source, list(names), where)  # fmt: skip


def warn_constant_categorical(source: str, names: Sequence[str]) -> None:
    """Categorical columns of `source` with one value, never blank, in every training row:
    a feature that tells nothing, whose other values later rows hold are all unseen."""
    if names:
        logger.warning("%s: categorical column(s) %s hold one value in every training row: a "
                       "feature that tells nothing (later rows' other values are all out of "
                       "vocabulary); drop them from the schema", source, list(names))  # fmt: skip


def warn_constant_dense(source: str, names: Sequence[str]) -> None:
    """Dense columns of `source` with one value (or none) in every training row: scaled
    to 0 everywhere, a feature that tells nothing; `data schema` leaves them out."""
    if names:
        logger.warning("%s: dense column(s) %s hold one value (or none) in every training "
                       "row: a feature that tells nothing; drop them from the schema", source,
                       list(names))  # fmt: skip


def warn_far_dense(source: str, far: Mapping[str, np.ndarray]) -> None:
    """Dense columns of `source` with a few values far from all others, left out of the
    column's scaling (`preprocess.scaled_without_far_values`): said with the values, which
    are often a code for "unknown" that a blank cell would say better."""
    for column, values in far.items():
        if len(values):
            distinct = np.unique(values)
            shown = ", ".join(f"{v:g}" for v in distinct[:3]) + (", ..." if len(distinct) > 3
                                                                  else "")  # fmt: skip
            logger.warning("%s: dense column %r: values far from all others (%s) left out of "
                           "its scaling, clipped in training and serving; if they stand for a "
                           "missing value, leave those cells blank", source, column,
                           shown)  # fmt: skip


@dataclass
class BadRowReport:
    """Malformed rows of one input file: how many, why, and the first few line/row numbers.

    `unit` is "line" (numbers are file lines, 1-based) or "row" (data rows, 1-based).
    """

    source: str
    unit: str = "line"
    rows: int = 0
    bad: int = 0
    reasons: dict[str, int] = field(default_factory=dict)
    examples: dict[str, list[int]] = field(default_factory=dict)
    # lines with the wrong number of fields: their values sit in the wrong columns, so no
    # other reason is theirs (a short line was also "label not 0/1" and had a blank filled)
    misshapen: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64), repr=False,
                                  compare=False)  # fmt: skip
    # the file line where each row's record starts, where one read of the file found them
    # (a quoted field may span lines: row k is then not line k + 1)
    first_lines: np.ndarray | None = field(default=None, repr=False, compare=False)

    def numbers(self, rows: int) -> np.ndarray:
        """The line (or row) number of each of `rows` rows, as the report names them."""
        if self.first_lines is not None and len(self.first_lines) == rows:
            return self.first_lines
        first = 2 if self.unit == "line" else 1  # CSV line 1 is the header
        return np.arange(first, first + rows)

    def kept(self, numbers: np.ndarray) -> np.ndarray:
        """Which of `numbers` (line/row numbers) are not `misshapen`."""
        return ~np.isin(numbers, self.misshapen)

    def add(self, reason: str, numbers: np.ndarray | list[int]) -> None:
        """Record rows (by line/row number) that are bad for `reason`; does not touch `bad`."""
        numbers = np.asarray(numbers, dtype=np.int64)
        if self.misshapen.size:
            numbers = numbers[self.kept(numbers)]
        if numbers.size == 0:
            return
        self.reasons[reason] = self.reasons.get(reason, 0) + int(numbers.size)
        kept = self.examples.setdefault(reason, [])
        kept.extend(int(n) for n in numbers[: MAX_EXAMPLES - len(kept)])

    def describe(self) -> str:
        """One line, e.g. `wrong column count: 2 (lines 4, 9); bad label: 1 (line 7)`."""
        parts = []
        for reason, count in self.reasons.items():
            shown = self.examples.get(reason, [])
            more = ", ..." if count > len(shown) else ""
            plural = "s" if len(shown) > 1 else ""
            numbers = ", ".join(str(n) for n in shown)
            parts.append(f"{reason}: {count} ({self.unit}{plural} {numbers}{more})")
        return "; ".join(parts)

    def to_dict(self) -> dict[str, Any]:
        return {
            "source": self.source,
            "unit": self.unit,
            "rows": self.rows,
            "bad": self.bad,
            "reasons": dict(self.reasons),
            "examples": {k: list(v) for k, v in self.examples.items()},
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> BadRowReport:
        return cls(**data)


@dataclass(frozen=True)
class BadRowLimits:
    """How many malformed rows a load tolerates: over either limit it stops.

    `max_bad_rows` is checked while reading (so a file of the wrong format stops early);
    `max_bad_fraction` (of all rows read) is checked at the end. None disables a limit.
    """

    max_bad_rows: int | None = 1000
    max_bad_fraction: float | None = 0.01

    def __post_init__(self) -> None:
        rows, fraction = self.max_bad_rows, self.max_bad_fraction
        if rows is not None and (isinstance(rows, bool) or not isinstance(rows, int) or rows < 0):
            raise RanknasError(f"max_bad_rows must be an integer >= 0 or None (got {rows!r})")
        if fraction is not None and not (
            isinstance(fraction, int | float)
            and not isinstance(fraction, bool)
            and 0 <= fraction <= 1
        ):
            raise RanknasError(f"max_bad_fraction must be in [0, 1] or None (got {fraction!r})")

    def tolerates(self, bad: int, rows: int, final: bool = True) -> bool:
        """Whether a load that read `rows` rows, `bad` of them malformed, goes on."""
        over_count = self.max_bad_rows is not None and bad > self.max_bad_rows
        over_fraction = (
            final and self.max_bad_fraction is not None and rows > 0
            and bad / rows > self.max_bad_fraction
        )  # fmt: skip
        return not (over_count or over_fraction)

    def check(self, report: BadRowReport, final: bool) -> None:
        """Raise a `RanknasError` naming the file, the count and example numbers if over."""
        if self.tolerates(report.bad, report.rows, final):
            return
        where = f"of {report.rows} {report.unit}s" + ("" if final else " read so far")
        if final and report.bad == report.rows:  # higher limits would leave nothing to train on
            raise RanknasError(
                f"{report.source}: all {report.rows} {report.unit}s are malformed "
                f"({report.describe()}); fix the file or the schema"
            )
        raise RanknasError(
            f"{report.source}: {report.bad} malformed {report.unit}s {where} "
            f"({report.describe()}); the load stopped. Fix the file, or raise the limits "
            f"(a study config's data.max_bad_rows, now {self.max_bad_rows}, and "
            f"data.max_bad_fraction, now {self.max_bad_fraction}; `ranknas train "
            "--max-bad-rows N --max-bad-fraction F`)."
        )
