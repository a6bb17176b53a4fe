"""The presets' names, and whether a name or file is one: what config validation needs,
without building a model (so without importing torch)."""

from __future__ import annotations

from pathlib import Path

PRESET_NAMES = ("logistic_regression", "dlrm", "dcnv2", "deepfm", "dhen", "wukong")


def unknown_architecture(name_or_file: str) -> str | None:
    """Why `name_or_file` names no preset and no existing file (None when it does one)."""
    if name_or_file in PRESET_NAMES or Path(name_or_file).exists():
        return None
    return f"{name_or_file}: neither a preset ({', '.join(PRESET_NAMES)}) nor an existing file"
