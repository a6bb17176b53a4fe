"""Reading a user's YAML or JSON file, with errors that name the file and say what is wrong."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import yaml

from search_space.errors import RanknasError


def read_data_file(path: str | Path, what: str, error: type[RanknasError] = RanknasError) -> Any:
    """The parsed content of `path`: JSON when its name ends in .json, else YAML.

    `what` names the file's role in the "cannot read" message ("the study config")."""
    path = Path(path)
    try:
        text = path.read_text()
    except OSError as exc:
        raise error(f"{path}: cannot read {what} ({exc.strerror})") from None
    if path.suffix == ".json":
        try:
            return json.loads(text)
        except json.JSONDecodeError as exc:
            raise error(f"{path}: not valid JSON ({exc})") from None
    try:
        return yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise error(f"{path}: not valid YAML ({exc})") from None
