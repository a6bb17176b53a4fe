"""The trial record: what a trained architecture leaves behind, named in one place.

A trial (and a baseline, which is trained the same way) writes a directory
(`studies/NAME/trials/N/` or `studies/NAME/baselines/KEY/`) with the files below, sets the
`TrialAttr` user attributes on its Optuna trial, and is logged to MLflow as one nested
run built by `mlflow_record`. The study's own attributes are `StudyAttr`. Everything that
reads a study back (leaderboard, export, reevaluate, baselines) uses these names.
"""

from __future__ import annotations

import json
from enum import StrEnum
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # torch and the block library load only where a run is written or read
    import optuna
    import torch

    from search_space.architecture import Architecture

ARCHITECTURE_FILE = "architecture.json"
METRICS_FILE = "metrics.json"
WEIGHTS_FILE = "model.safetensors"
SHARDING_FILE = "sharding_plan.json"
DIAGRAM_FILE = "architecture.png"  # in MLflow runs and exports: `nas.diagram`
PREPROCESSING_FILE = "preprocessing.json"  # in an export: the dense transforms to serve with


class TrialAttr(StrEnum):
    """User attributes of a trial (a `str`, so `trial.user_attrs[TrialAttr.DIGEST]` works)."""

    DIGEST = "digest"
    MFLOPS = "mflops"
    PARAMS = "params"
    LATENCY_MS = "latency_ms"
    WORKER = "worker"
    DEVICE = "device"  # where the trial trained: cuda:N (the card) or cpu (threads)
    RECIPE = "recipe"  # the searched training hyper-parameters it trained with (nas.recipe)
    DIR = "trial_dir"
    FAILURE_REASON = "failure_reason"
    PREDICTED_STEP_MS = "predicted_embedding_step_ms"
    OVER_CONSTRAINT = "over_constraint"  # skipped untrained: not counted in the budget
    REUSED_FROM = "reused_from"  # an architecture trained before: not counted in the budget


class StudyAttr(StrEnum):
    """User attributes of a study."""

    SEARCH_SPACE = "search_space"
    OBJECTIVES = "objectives"
    SEARCHER = "searcher"
    BUDGET_TRIALS = "budget_trials"
    SCHEMA = "schema"
    BAYES_NE = "bayes_ne"
    REEVALUATION = "reevaluation"
    BASELINES = "baselines"
    PREPROCESSING = "preprocessing"
    RECIPE = "training_recipe"  # how every trial and baseline is trained
    PROTOCOL = "protocol"  # the data and recipe every run shares (`protocol.study_protocol`)
    MFLOPS_CEILING = "mflops_ceiling"  # objectives.max_mflops: best_baseline, once resolved
    AROUND_BASE = "around_base"  # search_space.base: best_baseline, once resolved


# The training metrics copied from metrics.json onto the trial, for the leaderboard (runs:
# how many seeds a confirmed trial's metrics are the mean of).
METRIC_ATTRS = ("val_ne", "val_logloss", "val_auc", "val_calibration", "test_ne", "test_logloss",
                "test_auc", "test_calibration", "throughput", "runs")  # fmt: skip
# A TrainResult's status, as the MLflow run status: a pruned trial ended as planned (its
# `status` tag says pruned); KILLED would show it as crashed.
RUN_STATUS = {"complete": "FINISHED", "pruned": "FINISHED"}


# A baseline's record is the study attribute `baselines:<key>` (`nas.baselines`).
RECORD_PREFIX = f"{StudyAttr.BASELINES}:"


def recorded(study: optuna.Study) -> dict[str, dict[str, Any]]:
    """The study's baselines by key, in the order they were listed."""
    attrs = study.user_attrs
    found = {k.removeprefix(RECORD_PREFIX): v for k, v in attrs.items()
             if k.startswith(RECORD_PREFIX)}  # fmt: skip
    return dict(sorted(found.items(), key=lambda item: item[1].get("order", 0)))


def write_architecture(directory: Path, arch: Architecture) -> None:
    directory.mkdir(parents=True, exist_ok=True)
    (directory / ARCHITECTURE_FILE).write_text(arch.to_json())


def write_weights(directory: Path, model: torch.nn.Module) -> None:
    from safetensors.torch import save_file

    weights = {k: v.detach().contiguous().cpu() for k, v in model.state_dict().items()}
    save_file(weights, str(directory / WEIGHTS_FILE))


def write_metrics(directory: Path, metrics: dict[str, Any]) -> None:
    (directory / METRICS_FILE).write_text(json.dumps(metrics, indent=2))


def read_architecture(directory: str | Path) -> Architecture:
    from search_space.architecture import Architecture

    return Architecture.load(Path(directory) / ARCHITECTURE_FILE)


def read_metrics(directory: str | Path) -> dict[str, Any]:
    return json.loads((Path(directory) / METRICS_FILE).read_text())


def summary_name(arch: Architecture, mflops: float) -> str:
    """A compact architecture summary for run names: the live blocks' ops in order."""
    from search_space.architecture import analyze

    ops = ">".join(arch.block(name).op for name in analyze(arch).order)
    return f"{ops} {mflops:.3f} MFLOPs"


def numeric(values: dict[str, Any]) -> dict[str, float]:
    """The int and float entries of `values` (MLflow metrics), booleans left out."""
    return {
        k: v for k, v in values.items() if isinstance(v, int | float) and not isinstance(v, bool)
    }


def mlflow_record(
    params: dict[str, Any],
    summary: dict[str, Any],
    curves: dict[str, list[tuple[int, float]]],
    tags: dict[str, Any],
    artifacts: dict[str, str],
    run_name: str | None = None,
    start_time: float | None = None,
) -> dict[str, Any]:
    """What `StudyLogger.log_trial` gets for one trained architecture (`start_time`: when
    its training started, epoch seconds, so that the run's duration is real)."""
    status = summary.get("status", "failed")
    reason = summary.get("failure_reason")
    return {
        "run_name": run_name,
        "start_time": start_time,
        "params": params,
        "metrics": numeric(summary),
        "curves": {f"curve_{k}": v for k, v in curves.items()},
        "tags": {**tags, "status": status, **({"failure_reason": reason} if reason else {})},
        "artifacts": artifacts,
        "status": RUN_STATUS.get(status, "FAILED"),
    }
