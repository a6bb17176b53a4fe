"""The presets' names, and whether a name or file is one: what config validation needs,
without building a model (so without importing torch)."""

from __future__ import annotations

from pathlib import Path

from search_space.files import looked_for

PRESET_NAMES = ("logistic_regression", "dlrm", "dcnv2", "deepfm", "dhen", "wukong")
ARCHITECTURE_SUFFIXES = (".json", ".yaml", ".yml")  # an architecture file: JSON, or YAML


def checks_files(context: dict | None) -> bool:
    """Whether a config's validation checks that its files exist: commands that only read a
    study's records (`status`, `leaderboard`, `export`) parse its config without."""
    return (context or {}).get("check_files", True)


def unknown_architecture(name_or_file: str, also: tuple[str, ...] = ()) -> str | None:
    """Why `name_or_file` names no preset (nor one of the names `also` allows) and no
    existing file (None when it does one)."""
    if name_or_file in (*PRESET_NAMES, *also) or Path(name_or_file).exists():
        return None
    return (f"{name_or_file}: neither a preset ({', '.join(PRESET_NAMES)})"
            + "".join(f", {name}" for name in also)
            + f" nor an existing file{looked_for(Path(name_or_file))}")  # fmt: skip
