"""`export_model` and `load_exported`: the export as a whole (see the package doc)."""

from __future__ import annotations

import hashlib
import importlib.metadata
import importlib.util
import json
import sys
from collections.abc import Iterable, Mapping
from dataclasses import replace
from pathlib import Path
from types import ModuleType
from typing import Any

import torch
from safetensors.torch import load_file, save_file
from torch import nn

from nas.diagram import diagram_png
from nas.export.codegen import _standalone_module
from nas.export.layout import (
    ARCHITECTURE_FILE,
    CARD_FILE,
    EXPORT_FILES,
    MODULE_FILE,
    SUMS_FILE,
    WEIGHTS_FILE,
    ExportResult,
    _Columns,
)
from nas.export.model_card import _model_card
from nas.export.registry import _register
from nas.trial_record import DIAGRAM_FILE, METRICS_FILE, PREPROCESSING_FILE, SHARDING_FILE
from search_space.architecture import Analysis, Architecture, analyze, digest
from search_space.builder import RankingModel
from search_space.errors import RanknasError
from search_space.schema import DatasetSchema


def export_model(
    arch: Architecture,
    state_dict: Mapping[str, torch.Tensor],
    metrics: Mapping[str, Any],
    out_dir: str | Path,
    *,
    schema: DatasetSchema | None = None,
    register: str | None = None,
    tracking_uri: str | None = None,
    alias: str | None = "champion",
    preprocessing: Mapping[str, Any] | None = None,
    provenance: Mapping[str, Any] | None = None,
    source_run_id: str | None = None,
    step: Mapping[str, Any] | None = None,
    title: str | None = None,
    plan: Mapping[str, Any] | None = None,
) -> ExportResult:
    """Write the export directory (see the module docstring); register it if `register`.

    `step`: the trial's predicted training step on the study's cluster, with its plan
    (`cost_models.sharding.step.predict_step`); the export then holds that plan as a torchrec
    `ShardingPlan` (`sharding_plan.json`) and the card says the prediction and its source.
    `plan`: the trial's plan where it has no predicted step (a study on a cluster whose cost
    is not step time), exported the same way.

    `preprocessing`: what the training split fitted (`trainers.data.preprocess`: the dense
    transforms, the categorical vocabularies and hashing, the multi-valued columns); written
    to `preprocessing.json`, from which the exported module (`prepare_dense`, `encode_ids`)
    and the registered model turn raw rows into the model's inputs. `provenance` goes into
    the model card; `source_run_id` is the MLflow run the registered version comes from
    (the trial's), else a new run.

    `title`: the diagram's (default: the architecture's name, a searched one's its space's).

    `schema` names the dense columns and checks that `arch` fits the data (without it the
    dense columns are called dense_0, dense_1, ...). `metrics` is a flat mapping (name ->
    number or text) shown in the model card and logged with the registered model.
    `tracking_uri` defaults to $MLFLOW_TRACKING_URI.
    """
    if schema is not None:
        arch = arch.bind(schema)
    analysis = analyze(arch)
    columns = _Columns.of(arch, schema)
    tensors = _checked_weights(analysis, state_dict)
    out = Path(out_dir)
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise RanknasError(f"cannot create the export directory {out} ({exc.strerror})") from None
    arch_digest = digest(arch)
    (out / SUMS_FILE).unlink(missing_ok=True)  # stale while the files below are rewritten
    result = ExportResult(
        out_dir=out,
        architecture=out / ARCHITECTURE_FILE,
        weights=out / WEIGHTS_FILE,
        module=out / MODULE_FILE,
        model_card=out / CARD_FILE,
        digest=arch_digest,
    )
    result.architecture.write_text(arch.to_json() + "\n")
    fitted = {"dense": [], "vocabulary": {}} | dict(preprocessing or {})
    raw = frozenset(fitted["vocabulary"]) | frozenset(fitted.get("hashing", {}))
    lists = frozenset(fitted.get("multi_valued", {}))
    columns = replace(columns, raw_features=raw, list_features=lists)
    if len(fitted["dense"]) not in (0, arch.num_dense or 0):
        raise RanknasError(f"{len(fitted['dense'])} dense transforms, {arch.num_dense} columns")
    (out / PREPROCESSING_FILE).write_text(json.dumps(fitted, indent=2))
    save_file(tensors, str(result.weights), metadata={"ranknas_digest": arch_digest})
    # safetensors writes 0600: as readable as the files beside it (a server's user reads it)
    result.weights.chmod((out / PREPROCESSING_FILE).stat().st_mode & 0o777)
    result.module.write_text(_standalone_module(analysis, columns, arch_digest))
    (out / DIAGRAM_FILE).write_bytes(diagram_png(arch, title))
    plan = step["plan"] if step is not None else plan
    if plan is not None:
        predicted = {k: v for k, v in step.items() if k != "plan"} if step else None
        export = sharding_export(arch, plan, predicted)
        (out / SHARDING_FILE).write_text(json.dumps(export, indent=2))
    card = _model_card(
        analysis,
        metrics,
        columns,
        arch_digest,
        register,
        alias,
        provenance,
        step,
        criteo="hex_ids" in fitted,
        plan=plan,
    )
    result.model_card.write_text(card)
    written = [ARCHITECTURE_FILE, PREPROCESSING_FILE, WEIGHTS_FILE, MODULE_FILE, DIAGRAM_FILE,
               *([SHARDING_FILE] if plan is not None else []), CARD_FILE]  # fmt: skip
    (out / SUMS_FILE).write_text("".join(f"{_sha256(out / n)}  {n}\n" for n in written))
    for stale in (SHARDING_FILE,) if plan is None else ():  # another model's (--force)
        (out / stale).unlink(missing_ok=True)
    if register is None:
        return result
    return _register(result, analysis, metrics, columns, register, tracking_uri, alias,
                     source_run_id)  # fmt: skip


def sharding_export(
    arch: Architecture, plan: Mapping[str, Any], predicted: Mapping[str, Any] | None = None
) -> dict[str, Any]:
    """The plan of the study's cluster for the exported model: ranknas's `Plan` and the
    torchrec `ShardingPlan` it makes for the model's `embedding_bags` (each table's sharding
    type, fbgemm's fused kernel as training runs it, ranks and shards, placed on CUDA
    devices), with the predicted step where the study predicted one."""
    from cost_models.sharding.plan import Plan
    from cost_models.sharding.torchrec_adapter import to_sharding_plan
    from search_space.builder import build_model

    tables = build_model(arch, seed=0, device="meta").embedding_bags
    torchrec_plan = to_sharding_plan(Plan.from_dict(plan), tables, "embedding_bags",
                                     device_type="cuda", compute_kernel="fused")  # fmt: skip
    module_plans = {
        path: {table: {"sharding_type": p.sharding_type, "compute_kernel": p.compute_kernel,
                       "ranks": p.ranks,
                       "shards": [{"offsets": s.shard_offsets, "sizes": s.shard_sizes,
                                   "placement": str(s.placement)}
                                  for s in p.sharding_spec.shards]}
               for table, p in module_plan.items()}
        for path, module_plan in torchrec_plan.plan.items()
    }  # fmt: skip
    return {
        "predicted_step": predicted,
        "plan": dict(plan),
        "torchrec_sharding_plan": module_plans,
    }


def check_out_dir(
    out: Path, records: Iterable[Path], force: bool, weights: Mapping[str, torch.Tensor]
) -> None:
    """Refuse to export into `out` where that would overwrite files that are not an earlier
    export of these `weights` as it wrote them (another model's export, a person's own files
    or edits to the export's: unless `force`), or a study's records (a directory in
    `records`, or one that holds a trial's metrics: even with `force`)."""
    inside = next((r for r in records if _within(out, r)), None)
    if inside is not None or (out / METRICS_FILE).exists():
        where = f"inside the study's directory {inside}" if inside else "a trial's record"
        raise RanknasError(f"--out {out} is {where}: the export would overwrite the study's "
                           "records; choose a directory outside it")  # fmt: skip
    if force or not out.is_dir():
        return
    names = sorted(p.name for p in out.iterdir())
    others = [n for n in names if n not in EXPORT_FILES]
    if others or (names and not {MODULE_FILE, WEIGHTS_FILE} <= set(names)):  # every export
        # writes both: a module alone is a person's own (it was written over)
        shown = ", ".join((others or names)[:3]) + (", ..." if len(others or names) > 3 else "")
        raise RanknasError(f"--out {out} holds files that are not an earlier export ({shown}); "
                           "choose a new or empty directory, or pass --force to write over "
                           "them")  # fmt: skip
    if (out / WEIGHTS_FILE).exists() and not _same_weights(out / WEIGHTS_FILE, weights):
        raise RanknasError(f"--out {out} holds the export of another model (see its "
                           f"{CARD_FILE}); choose a new directory, or pass --force to replace "
                           "it")  # fmt: skip
    edited = _edited(out)
    if edited:
        raise RanknasError(f"--out {out} holds an earlier export of this model whose "
                           f"{', '.join(edited)} changed since it was written ({SUMS_FILE}); "
                           "the export would write over that: copy what you changed elsewhere, "
                           "choose a new directory, or pass --force")  # fmt: skip


def _edited(out: Path) -> list[str]:
    """The files of the export in `out` that differ from what it wrote (its `SHA256SUMS`;
    an export written before those were kept: none)."""
    sums = out / SUMS_FILE
    if not sums.is_file():
        return []
    edited = []
    for line in sums.read_text().splitlines():
        recorded, _, name = line.partition("  ")
        path = out / name
        if name and path.is_file() and _sha256(path) != recorded:
            edited.append(name)
    return edited


def _sha256(path: Path) -> str:
    with path.open("rb") as file:
        return hashlib.file_digest(file, "sha256").hexdigest()


def _same_weights(path: Path, weights: Mapping[str, torch.Tensor]) -> bool:
    try:
        there = load_file(str(path))
    except Exception:  # not readable as safetensors: not this export's
        return False
    mine = _storable(weights)
    return there.keys() == mine.keys() and all(torch.equal(there[k], mine[k]) for k in mine)


def _within(path: Path, directory: Path) -> bool:
    path, directory = path.resolve(), directory.resolve()
    return path == directory or directory in path.parents


def load_exported(out_dir: str | Path, device: str = "cpu") -> nn.Module:
    """The model of an export directory, rebuilt by its own `ranknas_model.py`, in eval mode."""
    directory = Path(out_dir)
    return _import_file(directory / MODULE_FILE).load(directory, device)


def _import_file(path: Path) -> ModuleType:
    name = f"ranknas_model_{abs(hash(str(path.resolve())))}"
    spec = importlib.util.spec_from_file_location(name, path)
    if spec is None or spec.loader is None:
        raise RanknasError(f"{path}: not a Python module")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # dataclasses look their module up while it executes
    spec.loader.exec_module(module)
    return module


# ---------------------------------------------------------------------- weights


def _checked_weights(
    analysis: Analysis, state_dict: Mapping[str, torch.Tensor]
) -> dict[str, torch.Tensor]:
    """The weights as safetensors stores them, once checked against the architecture."""
    expected = RankingModel(analysis, device="meta").state_dict()
    missing = sorted(expected.keys() - state_dict.keys())
    unexpected = sorted(state_dict.keys() - expected.keys())
    reshaped = sorted(
        f"{key} {list(state_dict[key].shape)} (expected {list(expected[key].shape)})"
        for key in expected.keys() & state_dict.keys()
        if state_dict[key].shape != expected[key].shape
    )
    problems = [
        f"{what}: {', '.join(keys[:5])}{' ...' if len(keys) > 5 else ''}"
        for what, keys in (("missing", missing), ("unexpected", unexpected), ("shape", reshaped))
        if keys
    ]
    if problems:
        raise RanknasError(
            f"the weights do not fit {analysis.arch.name or digest(analysis.arch)!r}"
            f" ({'; '.join(problems)}): export the state dict of the model built from it"
        )
    return _storable(state_dict)


def _storable(state_dict: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Detached CPU tensors, each contiguous and with memory of its own: safetensors refuses
    non-contiguous tensors and tensors that share storage."""
    seen: set[int] = set()
    tensors = {}
    for key, value in state_dict.items():
        tensor = value.detach().cpu()
        storage = tensor.untyped_storage().data_ptr()
        if not tensor.is_contiguous() or storage in seen:
            tensor = tensor.clone(memory_format=torch.contiguous_format)
        else:
            seen.add(storage)
        tensors[key] = tensor
    return tensors
