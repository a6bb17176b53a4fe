"""Reading a user's YAML or JSON file, with errors that name the file and say what is wrong."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import yaml

from search_space.errors import RanknasError


def looked_for(path: Path, exc: OSError | None = None) -> str:
    """Where a missing file was looked for, when its path is relative: paths in a config are
    read from the current directory, not the config's. `exc`: the error of reading it, which
    says so only when the file is not there."""
    if path.is_absolute() or not (exc is None or isinstance(exc, FileNotFoundError)):
        return ""
    return f"; looked for at {Path.cwd() / path} (relative paths are from the current directory)"


def read_data_file(
    path: str | Path,
    what: str,
    error: type[RanknasError] = RanknasError,
    as_json: bool | None = None,
) -> Any:
    """The parsed content of `path`: JSON when its name ends in .json (or `as_json` says so),
    else YAML; a key given twice in one mapping is refused in either.

    `what` names the file's role in the "cannot read" message ("the study config")."""
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise error(f"{path}: cannot read {what} ({exc.strerror}){looked_for(path, exc)}") from None
    except UnicodeDecodeError as exc:
        raise error(f"{path}: not a text file (byte {exc.start} is not UTF-8); give {what} as a "
                    "YAML or JSON file") from None  # fmt: skip
    if path.suffix == ".json" if as_json is None else as_json:
        try:
            return json.loads(text, object_pairs_hook=_unique_keys)
        except json.JSONDecodeError as exc:
            raise error(f"{path}: not valid JSON ({exc})") from None
        except _DuplicateKey as exc:
            raise error(f"{path}: not valid JSON ({exc}): give each key once") from None
    try:
        return yaml.load(text, Loader=_UniqueKeyLoader)  # a SafeLoader
    except yaml.YAMLError as exc:
        raise error(f"{path}: not valid YAML ({_yaml_problem(exc)})") from None


class _DuplicateKey(ValueError):
    pass


def _unique_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    """A JSON object, refusing a key given twice (`json` keeps the last one silently)."""
    seen: dict[str, Any] = {}
    for key, value in pairs:
        if key in seen:
            raise _DuplicateKey(f"{key!r} given twice in one object")
        seen[key] = value
    return seen


class _UniqueKeyLoader(yaml.SafeLoader):
    """YAML's safe loader, refusing a key given twice in one mapping (plain YAML keeps the
    last one silently, and a setting written above it is lost)."""

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict[Any, Any]:
        lines: dict[Any, int] = {}
        for key_node, _ in node.value:
            key = self.construct_object(key_node, deep=deep)
            if isinstance(key, str | int | float | bool) and key in lines:
                raise yaml.constructor.ConstructorError(
                    None, None, f"{key!r} given twice (first on line {lines[key]})",
                    key_node.start_mark,
                )  # fmt: skip
            lines[key] = key_node.start_mark.line + 1
        return super().construct_mapping(node, deep)


def _yaml_problem(exc: yaml.YAMLError) -> str:
    """What is wrong and where, in one line (PyYAML's own message spans several)."""
    if not isinstance(exc, yaml.MarkedYAMLError) or exc.problem_mark is None:
        return str(exc)
    mark = exc.problem_mark
    tab = "; indent with spaces, not tabs" if "'\\t'" in str(exc.problem) else ""
    return f"{exc.problem} at line {mark.line + 1}, column {mark.column + 1}{tab}"
