"""Typed operator parameters and their validation.

Each block class declares `PARAMS: dict[str, Param]`; `Param.check` turns a raw JSON value
into a validated one or returns what was wrong, in words a person can act on.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

ParamKind = Literal["int", "int_list", "bool", "choice", "choice_list"]
_REQUIRED = object()


@dataclass(frozen=True)
class Param:
    """One operator parameter: its kind, default and allowed values.

    `default=None` with `optional=True` means "derived from the input shape" (for example an
    attention head size that defaults to the embedding dim).
    """

    kind: ParamKind
    default: Any = _REQUIRED
    low: int | None = None
    high: int | None = None
    choices: tuple[str, ...] = ()
    optional: bool = False
    doc: str = ""

    @property
    def required(self) -> bool:
        return self.default is _REQUIRED

    def describe(self) -> str:
        """The allowed values, as shown in error messages."""
        if self.kind in ("choice", "choice_list"):
            allowed = " | ".join(self.choices)
            return f"one of {allowed}" if self.kind == "choice" else f"a list of {allowed}"
        if self.kind == "bool":
            return "true or false"
        bounds = _bounds(self.low, self.high)
        return f"an integer {bounds}" if self.kind == "int" else f"a list of integers {bounds}"

    def check(self, value: Any) -> tuple[Any, str | None]:
        """Return (normalized value, None) or (None, problem)."""
        if value is None and self.optional:
            return None, None
        if self.kind == "bool":
            return (value, None) if isinstance(value, bool) else (None, "must be true or false")
        if self.kind == "int":
            return self.check_int(value)
        if self.kind == "choice":
            ok = isinstance(value, str) and value in self.choices
            return (value, None) if ok else (None, f"{value!r} is not {self.describe()}")
        if not isinstance(value, list | tuple) or not value:
            return None, f"must be a non-empty list ({self.describe()})"
        if self.kind == "int_list":
            for i, item in enumerate(value):
                _, problem = self.check_int(item)
                if problem:
                    return None, f"item {i}: {problem}"
            return tuple(value), None
        bad = [v for v in value if v not in self.choices]
        if bad:
            return None, f"{bad[0]!r} is not one of {' | '.join(self.choices)}"
        if len(set(value)) != len(value):
            return None, "lists an entry twice"
        return tuple(value), None

    def check_int(self, value: Any) -> tuple[Any, str | None]:
        if isinstance(value, bool) or not isinstance(value, int):
            return None, f"must be an integer, got {value!r}"
        if (self.low is not None and value < self.low) or (
            self.high is not None and value > self.high
        ):
            return None, f"{value} is out of range: must be {_bounds(self.low, self.high)}"
        return value, None


def _bounds(low: int | None, high: int | None) -> str:
    if low is not None and high is not None:
        return f"in [{low}, {high}]"
    if low is not None:
        return f">= {low}"
    return f"<= {high}" if high is not None else ""


def validate_params(
    declared: dict[str, Param], given: dict[str, Any], where: str
) -> tuple[dict[str, Any], list[str]]:
    """Check `given` against `declared`; fill defaults. Returns (params, problems)."""
    problems = [
        f"{where}: unknown parameter params.{name}; allowed: {', '.join(declared) or 'none'}"
        for name in given
        if name not in declared
    ]
    params: dict[str, Any] = {}
    for name, spec in declared.items():
        if name not in given:
            if spec.required:
                problems.append(f"{where}: params.{name} is required ({spec.describe()})")
            else:
                params[name] = spec.default
            continue
        value, problem = spec.check(given[name])
        if problem:
            problems.append(f"{where}: params.{name} {problem}")
        else:
            params[name] = value
    return params, problems
