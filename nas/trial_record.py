"""The trial record: what a trained architecture leaves behind, named in one place.

A trial (and a baseline, which is trained the same way) writes a directory
(`studies/NAME/trials/N/` or `studies/NAME/baselines/KEY/`) with the files below, sets the
`TrialAttr` user attributes on its Optuna trial, and is logged to MLflow as one nested
run built by `mlflow_record`. The study's own attributes are `StudyAttr`. Everything that
reads a study back (leaderboard, export, reevaluate, baselines) uses these names.
"""

from __future__ import annotations

import json
import re
import uuid
from enum import StrEnum
from pathlib import Path
from typing import TYPE_CHECKING, Any

from search_space.errors import RanknasError

if TYPE_CHECKING:  # torch and the block library load only where a run is written or read
    import optuna
    import torch
    from optuna.trial import FrozenTrial

    from nas.config import StudyConfig
    from search_space.architecture import Architecture, BlockSpec

ARCHITECTURE_FILE = "architecture.json"
METRICS_FILE = "metrics.json"
WEIGHTS_FILE = "model.safetensors"
SHARDING_FILE = "sharding_plan.json"
TRAINED_PLAN_FILE = "trained_plan.json"  # `training.processes`: the plan it trained with
STEP_FILE = "step_time.json"  # the predicted step and its parts (`step.predict_step`)
DIAGRAM_FILE = "architecture.png"  # in MLflow runs and exports: `nas.diagram`
# a trial's failure_reason after Ctrl-C or SIGTERM: retried on resume, not counted as a
# failure; shown as its own state (`trial_state`), its MLflow run KILLED
INTERRUPTED = "interrupted"
OWNER_FILE = "study.json"  # in a study's output_dir: which study writes its trials there
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
    PROCESS = "process"  # the worker process training it (`trainers.processes.process_identity`)


class StudyAttr(StrEnum):
    """User attributes of a study."""

    SEARCH_SPACE = "search_space"
    OBJECTIVES = "objectives"
    SEARCHER = "searcher"
    BUDGET_TRIALS = "budget_trials"
    SCHEMA = "schema"
    BAYES_NE = "bayes_ne"
    REEVALUATION = "reevaluation"
    # the runs of a `reevaluate` (or best-baseline seeds) not finished: unseen by the surfaces
    REEVALUATION_PENDING = "reevaluation_pending"
    # {count, tested}: how many rounds of re-evaluation runs changed the verdict's paired
    # test, and the last one's [trial, baseline, seeds] (`reevaluate._count_look`)
    REEVALUATION_LOOKS = "reevaluation_looks"
    # `ranknas confirm`: the verdict's pair retrained on seeds that chose nothing, its
    # pending runs, its looks ({shown: the confirmed tests shown, [trial, baseline, seeds]})
    CONFIRMATION = "confirmation"
    CONFIRMATION_PENDING = "confirmation_pending"
    CONFIRMATION_LOOKS = "confirmation_looks"
    BASELINES = "baselines"
    PREPROCESSING = "preprocessing"
    RECIPE = "training_recipe"  # how every trial and baseline is trained
    PROTOCOL = "protocol"  # the data and recipe every run shares (`protocol.study_protocol`)
    MLFLOW = "mlflow"  # where its runs are logged: {tracking_uri, experiment}
    VIEW_RANKS = "mlflow_view_ranks"  # the runs' `rank` last written: {server, ranks}
    OWN_DIMS = "around_own_dims"  # an around base's own feature dims are decoded as its
    CEILINGS = "ceilings"  # objectives.max_* as configured (`runner._check_ceilings`)
    MFLOPS_CEILING = "mflops_ceiling"  # objectives.max_mflops: best_baseline, once resolved
    STEP_MS_CEILING = "step_ms_ceiling"  # objectives.max_step_ms: best_baseline | base, same
    STEP_DEVICES = "step_devices"  # sharding.devices that step_ms is predicted for
    STEP_CLUSTER = "step_cluster"  # and the rest of that cluster (`protocol_diff.step_cluster`)
    AROUND_BASE = "around_base"  # search_space.base: best_baseline, once resolved
    FEATURE_IMPORTANCE = "feature_importance"  # the around base's (`nas.feature_screen`)
    TIME_LIMITED = "time_limited"  # the last search stopped by budget.time_limit_minutes
    OUTPUT_TOKEN = "output_token"  # the token in its output_dir's OWNER_FILE: that folder is its


# The training metrics copied from metrics.json onto the trial, for the leaderboard (runs:
# how many seeds a confirmed trial's metrics are the mean of; measured_step_ms: a sharded
# trial's step, its processes' slowest, beside the study's prediction).
METRIC_ATTRS = ("val_ne", "val_logloss", "val_auc", "val_calibration", "test_ne", "test_logloss",
                "test_auc", "test_calibration", "throughput", "runs",
                "measured_step_ms")  # fmt: skip
# A TrainResult's status, as the MLflow run status: a pruned trial ended as planned (its
# `status` tag says pruned); KILLED would show it as crashed. An interrupted trial was
# stopped by its user: KILLED, MLflow's own status for that, not FAILED.
RUN_STATUS = {"complete": "FINISHED", "pruned": "FINISHED", INTERRUPTED: "KILLED"}


# The MLflow server a trial's record was queued for (a baseline's: the list of them), so
# that `nas.runner.log_unlogged` does not log it there again.
LOGGED = "mlflow_logged"

# A baseline's record is the study attribute `baselines:<key>` (`nas.baselines`); ADDED
# in it: by `ranknas baseline add`, not from the config.
RECORD_PREFIX = f"{StudyAttr.BASELINES}:"
ADDED = "added"


def recorded(study: optuna.Study) -> dict[str, dict[str, Any]]:
    """The study's baselines by key, in the order they were listed."""
    attrs = study.user_attrs
    found = {k.removeprefix(RECORD_PREFIX): v for k, v in attrs.items()
             if k.startswith(RECORD_PREFIX)}  # fmt: skip
    return dict(sorted(found.items(), key=lambda item: item[1].get("order", 0)))


def counted(trial: FrozenTrial) -> bool:
    """Done and counted in the budget: complete or pruned, not skipped over a constraint,
    not an architecture trained before."""
    attrs = trial.user_attrs
    return trial.state.name in ("COMPLETE", "PRUNED") and not (
        attrs.get(TrialAttr.OVER_CONSTRAINT) or TrialAttr.REUSED_FROM in attrs
    )


# ranknas tells every failure it records with a reason; Optuna fails a trial without one
# when its heartbeats stop: its worker died
DIED = "the worker died (missed heartbeats); retried with the same architecture"


def failure_reason(trial: FrozenTrial) -> str | None:
    """Why the trial failed or was pruned, as recorded; a dead worker's trial: `DIED`."""
    reason = trial.user_attrs.get(TrialAttr.FAILURE_REASON)
    return DIED if reason is None and trial.state.name == "FAIL" else reason


def interrupted(trial: FrozenTrial) -> bool:
    """Failed by Ctrl-C or SIGTERM: not a failure (`budget.max_failures`), retried on resume."""
    reason = trial.user_attrs.get(TrialAttr.FAILURE_REASON)
    return trial.state.name == "FAIL" and reason == INTERRUPTED


# how a search stopped by its time limit says so: each worker of a launch would, so the
# launcher says it once, for all of them (`nas.launch`)
TIME_LIMIT_SAID = "search: stopped by budget.time_limit_minutes"


def time_limit_line(limited: dict[str, Any], trials: int) -> str:
    """The line a search stopped by `budget.time_limit_minutes` ends with (`limited`: the
    study's `StudyAttr.TIME_LIMITED`; `trials`: its budget)."""
    return (
        f"{TIME_LIMIT_SAID} ({duration_text(limited['minutes'])} of searching) at "
        f"{limited['counted']} of {trials} trials; the same command searches as long again"
    )


def duration_text(minutes: float) -> str:
    """`5 min`, or in seconds below a minute (a limit of one second read "0.0166667 min")."""
    return f"{minutes:g} min" if minutes >= 1 else f"{minutes * 60:.3g} s"


REPEATS_PER_TRIAL = 3  # architectures proposed again allowed per budgeted trial


def repeats(trials: list[FrozenTrial]) -> int:
    return sum(TrialAttr.REUSED_FROM in t.user_attrs for t in trials)


def exhausted(trials: list[FrozenTrial], budget: int) -> bool:
    """The searcher may propose architectures trained before (they cost no training and
    are not counted); past `REPEATS_PER_TRIAL` per budgeted trial the space is taken as
    exhausted and the study ends."""
    return repeats(trials) >= REPEATS_PER_TRIAL * budget


SKIPS_PER_TRIAL = 10  # candidates over a ceiling allowed per budgeted trial


def skipped(trials: list[FrozenTrial]) -> int:
    """Candidates over a ceiling of `objectives`, skipped untrained."""
    return sum(bool(t.user_attrs.get(TrialAttr.OVER_CONSTRAINT)) for t in trials)


def stopped_on_ceilings(trials: list[FrozenTrial], budget: int) -> bool:
    """Whether so few candidates fit under the study's ceilings that it stopped searching."""
    return skipped(trials) >= SKIPS_PER_TRIAL * budget > 0


def counted_trials(trials: list[FrozenTrial]) -> int:
    """The trials that count in the budget."""
    return sum(counted(t) for t in trials)


def write_architecture(directory: Path, arch: Architecture) -> None:
    directory.mkdir(parents=True, exist_ok=True)
    (directory / ARCHITECTURE_FILE).write_text(arch.to_json())


def write_weights(directory: Path, model: torch.nn.Module) -> None:
    from safetensors.torch import save_file

    weights = {k: v.detach().contiguous().cpu() for k, v in model.state_dict().items()}
    save_file(weights, str(directory / WEIGHTS_FILE))


# a column's name in a module's, as written before `module_key` escaped its '/' and '%' (a
# '/' or a '%' that starts none of the escapes); its '.' was refused by torch, never written
_UNESCAPED = re.compile(
    r"^(.*embedding_bags\.t_|feature_projections\.)(.*(?:/|%(?!25|2E|2F)).*)(\.weight)$"
)


def read_weights(path: Path) -> dict[str, torch.Tensor]:
    """Weights recorded by `write_weights`, under today's module names (`module_key`): those
    recorded before it escaped a column's '/' and '%' load as well."""
    from safetensors.torch import load_file

    from search_space.names import module_key

    weights = {}
    for key, value in load_file(str(path)).items():
        old = _UNESCAPED.match(key)
        weights[f"{old[1]}{module_key(old[2])}{old[3]}" if old else key] = value
    return weights


def write_metrics(directory: Path, metrics: dict[str, Any]) -> None:
    (directory / METRICS_FILE).write_text(json.dumps(metrics, indent=2))


def read_architecture(
    directory: str | Path, recorded: str | None = None, what: str = "the run"
) -> Architecture:
    """The architecture in a run's `directory`; refused where it is not the one the study
    recorded for it (its digest `recorded`): a study of the same name elsewhere wrote over
    the folder (before output folders were claimed by token)."""
    from search_space.architecture import Architecture, digest

    arch = Architecture.load(Path(directory) / ARCHITECTURE_FILE)
    if recorded and digest(arch) != recorded:
        raise RanknasError(
            f"{what}'s folder {directory} holds another architecture (digest {digest(arch)}; "
            f"the study recorded {recorded}): another study wrote there. Retrain it under an "
            "output_dir of its own"
        )
    return arch


def read_step(directory: str | Path) -> dict[str, Any] | None:
    """The trial's predicted step on the study's cluster (`STEP_FILE`), if it has one."""
    path = Path(directory) / STEP_FILE
    return json.loads(path.read_text()) if path.exists() else None


def read_sharding(directory: str | Path) -> dict[str, Any] | None:
    """The trial's plan on the study's cluster (`SHARDING_FILE`), if it has one."""
    path = Path(directory) / SHARDING_FILE
    return json.loads(path.read_text()) if path.exists() else None


def read_metrics(directory: str | Path) -> dict[str, Any]:
    return json.loads((Path(directory) / METRICS_FILE).read_text())


def summary_name(arch: Architecture, mflops: float) -> str:
    """A compact architecture summary for run names: the live blocks' ops in order."""
    from search_space.architecture import analyze

    ops = ">".join(arch.block(name).op for name in analyze(arch).order)
    return f"{ops} {mflops_text(mflops)} MFLOPs"


def mflops_text(mflops: float | None) -> str:
    """MFLOPs in three decimals, in three significant digits below 0.1 (two small models'
    0.00568 and 0.00512 both read 0.005)."""
    if mflops is None:
        return "-"
    return f"{mflops:.3f}" if mflops >= 0.1 else f"{mflops:.3g}"


def architecture_params(arch: Architecture) -> dict[str, str]:
    """The network as flat MLflow params, read off the spec, the same for a trial, a
    repeat and a baseline: `<block>.op`, `<block>.inputs` (comma-joined), each op param
    `<block>.<param>` of the blocks the output depends on, `output`, `embedding.dim`, and
    `embedding.<feature>.dim` for a feature whose own dim differs."""
    params = {"output": arch.output_block, "embedding.dim": str(arch.embedding.dim)}
    for block in _live_blocks(arch):
        params[f"{block.name}.op"] = block.op
        params[f"{block.name}.inputs"] = ",".join(block.inputs)
        params |= {f"{block.name}.{k}": param_text(v) for k, v in block.params.items()}
    emb = arch.embedding
    dims = {f.name: emb.feature_dim(f) for f in emb.features}
    params |= {f"embedding.{name}.dim": str(dim) for name, dim in dims.items() if dim != emb.dim}
    return params


def _live_blocks(arch: Architecture) -> list[BlockSpec]:
    """The blocks the output depends on, in execution order (all of them, in list order,
    where the spec does not validate)."""
    from search_space.architecture import analyze
    from search_space.errors import SpecError

    try:
        return [arch.block(name) for name in analyze(arch).order]
    except SpecError:
        return list(arch.blocks)


def param_text(value: Any) -> str:
    """An op param as an MLflow param value: a flat list comma-joined, a nested one as JSON."""
    nested = (list, tuple, dict)
    if isinstance(value, list | tuple) and not any(isinstance(v, nested) for v in value):
        return ",".join(str(v) for v in value)
    if isinstance(value, nested):
        return json.dumps(value)
    return str(value)


def space_params(values: dict[str, Any]) -> dict[str, Any]:
    """The searcher's raw encodings of a point, under `space.` so they do not read as the
    architecture (`architecture_params` is that)."""
    return {f"space.{k}": v for k, v in values.items()}


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
    end_time: float | None = None,
) -> dict[str, Any]:
    """What `StudyLogger.log_trial` gets for one trained architecture (`start_time`: when
    its training started, epoch seconds, so that the run's duration is real; `end_time`:
    when it ended, if not when it is queued)."""
    status = summary.get("status", "failed")
    reason = summary.get("failure_reason")
    return {
        "run_name": run_name,
        "start_time": start_time,
        "end_time": end_time,
        "params": params,
        "metrics": numeric(summary),
        "curves": {f"curve_{k}": v for k, v in curves.items()},
        "tags": {**tags, "status": status, **({"failure_reason": reason} if reason else {})},
        "artifacts": artifacts,
        "status": RUN_STATUS.get(status, "FAILED"),
    }


def claim_output_dir(config: StudyConfig, recorded: dict[str, Any] | None) -> str:
    """Refuse `output_dir` where it holds another study's runs: trial numbers start at 0 in
    every study, so they would be overwritten. A study is told by its name and by a token
    it records (`StudyAttr.OUTPUT_TOKEN`, also in the folder's `OWNER_FILE`): a study of the
    same name in another storage wrote into the first one's trial folders, and `export` of
    the first wrote out the second's model. `recorded`: the study's attributes in its
    storage (None: not created yet). Returns the token the study is to record
    (`own_output_dir` records it); run under the study lock."""
    from nas.storage import other_sqlite_holding, redact

    mine = (recorded or {}).get(StudyAttr.OUTPUT_TOKEN)
    owner = _owner(config.study_dir / OWNER_FILE)
    name = config.name if owner is None else owner.get("study")
    if name != config.name:
        held = f"study {name!r}'s trials" if name else f"an unreadable {OWNER_FILE}"
        raise RanknasError(
            f"output_dir: {config.study_dir} holds {held}; study {config.name!r} would "
            "overwrite them: give it its own output_dir (or leave output_dir out: "
            f"ranknas-data/studies/{config.name})"
        )
    token, theirs, here = (owner or {}).get("token"), (owner or {}).get("storage"), redact(
        config.storage)  # fmt: skip
    # a folder without a token (written before them) is an existing study's, not a new one's
    ours = mine == token if token else recorded is not None
    written = any((config.study_dir / part).is_dir() and any((config.study_dir / part).iterdir())
                  for part in ("trials", "baselines"))  # fmt: skip
    if (
        ours
        and theirs not in (None, here)
        and other_sqlite_holding(config.storage, theirs, config.name, StudyAttr.OUTPUT_TOKEN, token)
    ):  # a copy of the storage file: each would overwrite the other's trials
        raise RanknasError(
            f"storage {here} holds a copy of study {name!r}, which {theirs} still holds and "
            f"whose trials are in {config.study_dir}: runs of both would overwrite each "
            "other's trials there. Run the study in its own storage, give the copy an "
            "output_dir of its own, or delete the original if the copy replaces it"
        )
    # not ours: refused where it holds runs, or is claimed from another storage (a study
    # there may be starting: none written yet); a start that stopped before creating its
    # study, in this storage, left it free
    if not ours and (written or theirs not in (None, here)):
        whose = (f"study {name!r} of this storage ({here}), which no longer holds it"
                 if theirs == here and recorded is None else
                 f"another study named {name!r} (storage {theirs or 'unknown: an older ranknas'}"
                 f"); this one, in {here}, would overwrite them")  # fmt: skip
        raise RanknasError(
            f"output_dir: {config.study_dir} holds the runs of {whose}: give this study an "
            "output_dir of its own, or move that folder aside if its study is gone"
        )
    return mine or (token if ours or theirs == here else None) or uuid.uuid4().hex


def trained_here(worker: str | None) -> bool:
    """Whether a run's worker (`host:pid`; None: not recorded, by an older version) was of
    this machine, where its folder was written."""
    import socket

    return worker is not None and worker.rpartition(":")[0] == socket.gethostname()


def lost_trials(study: optuna.Study) -> list[int]:
    """The complete trials this machine trained whose folders are gone (deleted or moved):
    their models can be neither exported nor re-evaluated."""
    from optuna.trial import TrialState

    lost = []
    for t in study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,)):
        folder, attrs = t.user_attrs.get(TrialAttr.DIR), t.user_attrs
        if folder and TrialAttr.REUSED_FROM not in attrs and not Path(folder).is_dir():
            lost += [t.number] if trained_here(attrs.get(TrialAttr.WORKER)) else []
    return lost


def own_output_dir(config: StudyConfig, study: optuna.Study, token: str) -> None:
    """Record `token` (`claim_output_dir`'s) in the study, then in its folder's
    `OWNER_FILE` (in that order: a folder's token no study holds is not taken for
    another's); run under the study lock."""
    from nas.storage import redact

    if study.user_attrs.get(StudyAttr.OUTPUT_TOKEN) != token:
        study.set_user_attr(StudyAttr.OUTPUT_TOKEN, token)
    owner = {"study": config.name, "token": token, "storage": redact(config.storage)}
    path = config.study_dir / OWNER_FILE
    if _owner(path) != owner:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(owner) + "\n")


def _owner(path: Path) -> dict[str, Any] | None:
    """The study.json of an output folder; None where there is none, {} unreadable."""
    try:
        owner = json.loads(path.read_text())
    except FileNotFoundError:
        return None
    except (OSError, ValueError):
        return {}
    return owner if isinstance(owner, dict) else {}
