"""The export's layout: its file names and the input columns the model reads."""

from __future__ import annotations

import importlib.metadata
from dataclasses import dataclass
from pathlib import Path

from nas.trial_record import ARCHITECTURE_FILE as ARCHITECTURE_FILE  # a trial's own files
from nas.trial_record import DIAGRAM_FILE, PREPROCESSING_FILE, SHARDING_FILE
from nas.trial_record import WEIGHTS_FILE as WEIGHTS_FILE
from search_space.architecture import Architecture
from search_space.errors import RanknasError
from search_space.schema import DatasetSchema

MODULE_FILE = "ranknas_model.py"
CARD_FILE = "model_card.md"
SUMS_FILE = "SHA256SUMS"  # what the export wrote, as `sha256sum -c` reads it: edits show
# What an export directory holds (__pycache__: from loading its module)
EXPORT_FILES = frozenset({ARCHITECTURE_FILE, WEIGHTS_FILE, MODULE_FILE, CARD_FILE,
                          PREPROCESSING_FILE, DIAGRAM_FILE, SHARDING_FILE, SUMS_FILE,
                          "__pycache__"})  # fmt: skip
EXPERIMENT = "ranknas-export"  # the MLflow experiment of the runs that log exported models


@dataclass(frozen=True)
class ExportResult:
    """What `export_model` wrote, and where the model was registered (if it was)."""

    out_dir: Path
    architecture: Path
    weights: Path
    module: Path
    model_card: Path
    digest: str
    model_name: str | None = None
    model_version: str | None = None
    alias: str | None = None
    model_uri: str | None = None  # models:/NAME@alias
    reused_version: bool = False  # the same model was registered before: no new version


@dataclass(frozen=True)
class _Columns:
    """The input columns, in the order the model reads them."""

    dense: tuple[str, ...]
    features: tuple[str, ...]
    dataset: str | None = None  # the schema's name, when one was given
    raw_features: frozenset[str] = frozenset()  # served as raw values (vocabulary, hashing)
    list_features: frozenset[str] = frozenset()  # served as lists of values (multi-valued)

    @classmethod
    def of(cls, arch: Architecture, schema: DatasetSchema | None) -> _Columns:
        dense = schema.dense if schema else tuple(f"dense_{i}" for i in range(arch.num_dense or 0))
        features = tuple(f.name for f in arch.embedding.used)  # what `ids` holds
        columns = cls(tuple(dense), features, schema.name if schema else None)
        if len(set(columns.dense + columns.features)) != len(columns.dense + columns.features):
            raise RanknasError(
                "a categorical feature is named like a dense column (dense_0, ...): pass the "
                "dataset schema so that the dense columns get their own names"
            )
        return columns


def requirements() -> list[str]:
    """Pinned versions of what the served model and the module need (numpy: without it
    torch warns on import), as installed here, as the package index
    knows them: a local build tag (`2.13.0+cpu`) is not on PyPI, so it is dropped."""
    wanted = ("torch", "safetensors", "numpy", "pandas")  # the served module needs no torchrec
    pins = []
    for package in wanted:
        try:
            version = importlib.metadata.version(package).split("+")[0]
        except importlib.metadata.PackageNotFoundError:
            continue
        pins.append(f"{package}=={version}")
    return pins
