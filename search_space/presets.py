"""Engineer presets: the hand-built baselines that a search has to beat, in the same spec.

Each preset is a function of the dataset schema's sizes only through `bind`: the specs
below leave `num_dense` and the features to the schema.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

from search_space.architecture import (
    Architecture,
    BlockSpec,
    EmbeddingConfig,
    analyze,
    unbound_problems,
)
from search_space.errors import SpecError
from search_space.preset_names import PRESET_NAMES, unknown_architecture
from search_space.schema import DatasetSchema


def _arch(
    name: str, dim: int, blocks: list[tuple[str, str, list[str], dict[str, Any]]]
) -> Architecture:
    return Architecture(
        blocks=tuple(BlockSpec(n, op, tuple(inputs), params) for n, op, inputs, params in blocks),
        embedding=EmbeddingConfig(dim),
        name=name,
    )


def logistic_regression() -> Architecture:
    """y = w·[dense, e_1..e_F] + b with 1-dim embeddings: first-order terms only."""
    return _arch("logistic_regression", 1, [("features", "concat", ["dense", "sparse"], {})])


def dlrm() -> Architecture:
    """DLRM: bottom MLP to the embedding dim, pairwise dot products, top MLP."""
    return _arch(
        "dlrm",
        16,
        [
            ("bottom", "mlp", ["dense"], {"widths": [64, 16]}),
            ("interaction", "dot", ["sparse", "bottom"], {}),
            ("top", "mlp", ["bottom", "interaction"], {"widths": [128, 64]}),
        ],
    )


def dcnv2() -> Architecture:
    """DCNv2 (stacked): a low-rank cross network over dense + embeddings, then an MLP."""
    return _arch(
        "dcnv2",
        16,
        [
            ("cross", "cross", ["dense", "sparse"], {"num_layers": 3, "low_rank": 64}),
            ("deep", "mlp", ["cross"], {"widths": [128, 64]}),
        ],
    )


def deepfm() -> Architecture:
    """DeepFM: FM second-order term + deep MLP + linear terms, summed by the head."""
    return _arch(
        "deepfm",
        16,
        [
            ("fm", "fm", ["sparse"], {}),
            ("deep", "mlp", ["dense", "sparse"], {"widths": [128, 64]}),
            ("combine", "concat", ["fm", "deep", "dense"], {}),
        ],
    )


def dhen() -> Architecture:
    """A two-layer DHEN stack (dot + attention modules) over the embeddings."""
    layer = {"modules": ["dot", "attention"], "aggregation": "weighted_sum", "hidden": 64}
    return _arch(
        "dhen",
        16,
        [
            ("bottom", "mlp", ["dense"], {"widths": [64, 16]}),
            ("dhen1", "dhen", ["sparse", "bottom"], layer),
            ("dhen2", "dhen", ["dhen1"], layer),
            ("top", "mlp", ["dhen2"], {"widths": [64]}),
        ],
    )


def wukong() -> Architecture:
    """A two-layer Wukong stack (n_F = n_L = 8, k = 24, as in the paper's Criteo grid)."""
    layer = {"num_fm": 8, "num_lc": 8, "rank": 24, "fmb_widths": [128]}
    return _arch(
        "wukong",
        16,
        [
            ("bottom", "mlp", ["dense"], {"widths": [64, 16]}),
            ("wukong1", "wukong", ["sparse", "bottom"], layer),
            ("wukong2", "wukong", ["wukong1"], layer),
            ("top", "mlp", ["wukong2"], {"widths": [64]}),
        ],
    )


PRESETS: dict[str, Callable[[], Architecture]] = {
    "logistic_regression": logistic_regression,
    "dlrm": dlrm,
    "dcnv2": dcnv2,
    "deepfm": deepfm,
    "dhen": dhen,
    "wukong": wukong,
}
if tuple(PRESETS) != PRESET_NAMES:  # the names validation reads without building a model
    raise RuntimeError(f"preset_names.PRESET_NAMES {PRESET_NAMES} differs from {tuple(PRESETS)}")


def preset(name: str, schema: DatasetSchema | None = None) -> Architecture:
    """A preset by name, bound to `schema` when one is given: on data without dense columns
    (a log of ids only) or without categorical ones, the preset without the blocks that
    would read them, as an engineer would build it there (DLRM's dot over the embeddings
    alone, no bottom MLP)."""
    if name not in PRESETS:
        raise SpecError(f"unknown preset {name!r}; presets: {', '.join(PRESETS)}")
    arch = PRESETS[name]()
    if schema is None:
        return arch
    missing = [s for s, n in (("dense", schema.num_dense), ("sparse", schema.num_sparse)) if not n]
    if not missing:
        return arch.bind(schema)
    for source in missing:
        arch = _without_input(arch, source)
    try:
        arch = arch.bind(schema)
        analyze(arch)  # here, so that the error names the preset and what the data lacks
    except SpecError as exc:
        kinds = " and ".join({"sparse": "categorical"}.get(s, s) for s in missing)
        raise SpecError(f"preset {name} on data with no {kinds} column: {exc}") from None
    return arch


def _without_input(arch: Architecture, source: str) -> Architecture:
    """`arch` with raw input `source` gone: from every block's inputs, and the blocks that
    read nothing else gone with it (and so on downstream)."""
    gone, blocks = {source}, []
    for block in arch.blocks:
        inputs = tuple(i for i in block.inputs if i not in gone)
        if inputs:
            blocks.append(BlockSpec(block.name, block.op, inputs, block.params))
        else:
            gone.add(block.name)
    return replace(arch, blocks=tuple(blocks))


def load_architecture(name_or_file: str, schema: DatasetSchema) -> Architecture:
    """A preset name or an architecture JSON file, bound to the schema."""
    if name_or_file in PRESETS:
        return preset(name_or_file, schema)
    problem = unknown_architecture(name_or_file)
    if problem:
        raise SpecError(problem)
    arch = Architecture.load(Path(name_or_file))
    try:  # here, so that the error names the file
        problems = unbound_problems(arch)
        if problems:
            raise SpecError("\n".join(problems))
        arch = arch.bind(schema)
        analyze(arch)
    except SpecError as exc:
        raise SpecError(f"{name_or_file}: {exc}") from None
    return arch


def check_before_the_data(name_or_file: str) -> None:
    """An architecture file checked as far as it can be without the data's schema (ops,
    inputs, output, cycles, params: `unbound_problems`), so that a mistake is told before
    the data loads, which can take minutes; a preset or a missing file passes (told later)."""
    if name_or_file in PRESETS or unknown_architecture(name_or_file):
        return
    problems = unbound_problems(Architecture.load(Path(name_or_file)))
    if problems:
        raise SpecError(f"{name_or_file}: " + "\n".join(problems))
