"""Progress of long runs: a tqdm bar on a terminal, periodic plain lines elsewhere.

Every long-running place (a training run, a study's trials, the one-shot/DNAS phases,
`reevaluate`) opens a `bar`; the display is off until `configure` turns it on (the CLI
does), so library callers, tests and benchmarks see nothing. On a terminal the bar is
redrawn at most `TERMINAL_SECONDS` apart; elsewhere (CI, a log file, a pipe) a bar prints a
plain line at most every `line_seconds`, with no carriage return or escape code, and a bar
opened with `lines=False` (its caller prints its own periodic lines) prints nothing.
`write` prints a line on stdout above any bar on the screen.

Here rather than in `nas` because the training loop, below `nas`, uses it.
"""

from __future__ import annotations

import math
import os
import sys
import time
from dataclasses import dataclass
from typing import IO, Any, TextIO

from search_space.errors import RanknasError

TERMINAL_SECONDS = 0.25  # between redraws of a bar on a terminal
LINE_SECONDS = 10.0  # between plain lines elsewhere, unless RANKNAS_PROGRESS_SECONDS says


@dataclass
class _Settings:
    enabled: bool = False
    stream: IO[str] | None = None  # None: sys.stderr when a bar opens
    terminal: bool | None = None  # None: whether the stream is a terminal
    line_seconds: float = LINE_SECONDS


_settings = _Settings()
_open_bars: list[_TerminalBar] = []  # on the screen: `write` goes around them


def configure(
    enabled: bool = True,
    stream: IO[str] | None = None,
    terminal: bool | None = None,
    line_seconds: float | None = None,
) -> None:
    """Turn the display on (or off) for the bars opened from now on. `stream` defaults to
    stderr; `terminal` to whether that stream is one; `line_seconds` to the environment's
    RANKNAS_PROGRESS_SECONDS, else `LINE_SECONDS`."""
    global _settings
    if line_seconds is None:
        line_seconds = _seconds_from_env() if enabled else LINE_SECONDS
    _settings = _Settings(enabled, stream, terminal, line_seconds)


def _seconds_from_env() -> float:
    text = os.environ.get("RANKNAS_PROGRESS_SECONDS", str(LINE_SECONDS))
    try:
        seconds = float(text)
    except ValueError:
        seconds = -1.0
    if not seconds >= 0:
        raise RanknasError(
            f"RANKNAS_PROGRESS_SECONDS={text!r}: give the seconds between progress lines, "
            "a number >= 0"
        )
    return seconds


def bar(
    total: int | None, label: str, unit: str = "it", lines: bool = True, initial: int = 0
) -> Bar:
    """A bar over `total` units (None: unknown) of which `initial` are done already, to use
    as a context manager."""
    if not _settings.enabled:
        return Bar(initial)
    stream = _settings.stream or sys.stderr
    terminal = _settings.terminal
    if terminal is None:
        terminal = bool(getattr(stream, "isatty", lambda: False)())
    if terminal:
        return _TerminalBar(total, label, unit, initial, stream)
    if lines:
        return _LineBar(total, label, unit, initial, stream, _settings.line_seconds)
    return Bar(initial)


def write(line: str, file: TextIO | None = None) -> None:
    """Print `line` on `file` (default stdout), above the bars if any are on the screen."""
    file = file or sys.stdout
    if _open_bars:
        from tqdm import tqdm

        for shown in _open_bars:  # tqdm redraws them after the line: with what they know now
            shown.sync()
        tqdm.write(line, file=file)
        file.flush()
    else:
        print(line, file=file, flush=True)


class Bar:
    """What every bar offers; this one shows nothing (the display is off, or off a
    terminal its caller prints its own lines)."""

    def __init__(self, initial: int = 0) -> None:
        self.n = self.initial = initial
        self.fields: dict[str, Any] = {}

    def update(self, n: int = 1) -> None:
        """`n` more units done; cheap enough to call every training step."""
        self.n += n

    def show(self, name: str, value: float | str) -> None:
        """Show `name value` beside the count from the next redraw on."""
        self.fields[name] = value

    def close(self) -> None:
        pass

    def __enter__(self) -> Bar:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _fields_text(self) -> str:
        return ", ".join(
            f"{k} {v:.4f}" if isinstance(v, float) else f"{k} {v}" for k, v in self.fields.items()
        )


class _TerminalBar(Bar):
    """tqdm, redrawn by this class at most every `TERMINAL_SECONDS` (tqdm's own throttling
    off), and cleared when it closes."""

    def __init__(
        self, total: int | None, label: str, unit: str, initial: int, stream: IO[str]
    ) -> None:
        super().__init__(initial)
        from tqdm import tqdm

        self._tqdm = tqdm(total=total, desc=label, unit=f" {unit}", unit_scale=_large(total),
                          bar_format=_bar_format(total, unit), leave=False, initial=initial,
                          file=stream, mininterval=0, miniters=1, dynamic_ncols=True)  # fmt: skip
        _open_bars.append(self)
        self._drawn_at = time.monotonic()

    def update(self, n: int = 1) -> None:
        self.n += n
        now = time.monotonic()
        if now - self._drawn_at >= TERMINAL_SECONDS:
            self._drawn_at = now
            self._draw()

    def sync(self) -> None:
        """Give tqdm the count and fields without drawing."""
        self._tqdm.set_postfix_str(self._fields_text(), refresh=False)
        self._tqdm.n = self.n

    def _draw(self) -> None:
        self.sync()
        self._tqdm.refresh()

    def close(self) -> None:
        if self in _open_bars:
            _open_bars.remove(self)
            self._tqdm.close()


def _large(total: int | None) -> bool:
    """Counted in thousands (1.2M examples), not one by one (3/20 trials)."""
    return total is None or total >= 10_000


def _bar_format(total: int | None, unit: str) -> str | None:
    """`label:  40%|████      | 3/20 trials [00:05<00:08, best ne 0.8622]`: the unit after
    the count, and a rate only where one by one would read `2.41s/ trials`. None (tqdm's
    own) for an unknown total."""
    if total is None:
        return None
    rate = ", {rate_fmt}" if _large(total) else ""
    return (
        "{l_bar}{bar}| {n_fmt}/{total_fmt} "
        + unit
        + " [{elapsed}<{remaining}"
        + rate
        + "{postfix}]"
    )


class _LineBar(Bar):
    """A plain line at most every `seconds`: `label: 40% (80,000/200,000 examples), loss
    0.4521, 12s elapsed, ~18s left`."""

    def __init__(
        self,
        total: int | None,
        label: str,
        unit: str,
        initial: int,
        stream: IO[str],
        seconds: float,
    ) -> None:
        super().__init__(initial)
        self.total, self.label, self.unit, self.stream = total, label, unit, stream
        self.seconds = seconds
        self._started = self._printed_at = time.monotonic()

    def update(self, n: int = 1) -> None:
        self.n += n
        now = time.monotonic()
        if now - self._printed_at >= self.seconds:
            self._printed_at = now
            print(self._line(now - self._started), file=self.stream, flush=True)

    def _line(self, elapsed: float) -> str:
        if self.total:
            done = min(self.n / self.total, 1.0)
            count = f"{math.floor(done * 100)}% ({self.n:,}/{self.total:,} {self.unit})"
        else:
            count = f"{self.n:,} {self.unit}"
        parts = [count, self._fields_text(), f"{elapsed:.0f}s elapsed"]
        if self.total and self.initial < self.n < self.total and elapsed > 0:
            rate = (self.n - self.initial) / elapsed
            parts.append(f"~{(self.total - self.n) / rate:.0f}s left")
        return f"{self.label}: " + ", ".join(p for p in parts if p)
