"""The study runner: ask -> Architecture -> cost -> train -> tell, until the budget is spent.

The Optuna study in RDB storage is the system of record. Every worker (the first `search`
and any `worker` joining it) runs this same loop; a lock around "check the budget, ask"
keeps the study to exactly `budget.trials` complete or pruned trials. A trial whose process
died is failed by the heartbeat check and retried with the same architecture.
"""

from __future__ import annotations

import functools
import json
import os
import socket
import threading
import time
import warnings
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import optuna
import torch
from optuna.storages import RDBStorage
from optuna.trial import Trial, TrialState

from nas.config import StudyConfig
from nas.oneshot.phase import run_search_phase
from nas.searchers import make_sampler
from nas.searchers.base import distributions
from nas.sharding import plan_trial_sharding
from nas.storage import open_storage, study_lock
from nas.trial_record import (
    ARCHITECTURE_FILE,
    METRIC_ATTRS,
    SHARDING_FILE,
    StudyAttr,
    TrialAttr,
    mlflow_record,
    write_architecture,
    write_metrics,
    write_weights,
)
from search_space.architecture import Architecture, analyze, digest
from search_space.builder import RankingModel, build_model
from search_space.errors import RanknasError
from search_space.spaces import SearchSpace, make_space
from trainers.data import TabularData, bayes_metrics, load_dataset
from trainers.trainer import TrainConfig, TrainResult, resolve_device, train

Progress = Callable[[str], None]
DONE = (TrialState.COMPLETE, TrialState.PRUNED)


@dataclass
class StudyData:
    train: TabularData
    valid: TabularData
    test: TabularData
    bayes_ne: float | None  # the floor no model can beat, known for synthetic data


def prepare_data(config: StudyConfig) -> StudyData:
    d = config.data
    options: dict[str, Any] = {"rows": d.rows, "seed": d.seed} if d.source == "synthetic" else {}
    data = load_dataset(d.source, d.schema_path, **options)
    train_part, valid, test = data.split(d.split, seed=d.seed)
    bayes = bayes_metrics(valid).ne if data.true_prob is not None else None
    return StudyData(train_part, valid, test, bayes)


def objective_names(config: StudyConfig) -> list[str]:
    cost = config.objectives.cost
    return [config.objectives.metric] + ([] if cost == "none" else [cost])


def open_study(config: StudyConfig, space: SearchSpace, storage: RDBStorage) -> optuna.Study:
    """Create the study, or load it to resume; a changed search space is refused."""
    o, s = config.objectives, config.searcher
    sampler = make_sampler(
        s.type,
        space,
        objective_names=objective_names(config),
        seed=config.seed,
        population=s.population,
        sample_size=s.sample_size,
        startup_trials=s.startup_trials,
        objective_thresholds={"mflops": o.max_mflops}
        if o.max_mflops and o.cost == "mflops"
        else None,
    )
    pruner = {
        "none": optuna.pruners.NopPruner(),
        "median": optuna.pruners.MedianPruner(n_startup_trials=config.pruning.startup_trials),
        "hyperband": optuna.pruners.HyperbandPruner(),
    }[config.pruning.type]
    study = optuna.create_study(
        study_name=config.name,
        storage=storage,
        sampler=sampler,
        pruner=pruner,
        directions=["minimize"] * len(objective_names(config)),
        load_if_exists=True,
    )
    recorded = study.user_attrs.get(StudyAttr.SEARCH_SPACE)
    current = config.search_space.model_dump(mode="json")
    if recorded is None:
        study.set_user_attr(StudyAttr.SEARCH_SPACE, current)
        study.set_user_attr(StudyAttr.OBJECTIVES, objective_names(config))
        study.set_user_attr(StudyAttr.SEARCHER, s.type)
        study.set_user_attr(StudyAttr.BUDGET_TRIALS, config.budget.trials)
    elif recorded != current:
        raise RanknasError(
            f"study {config.name!r} in {config.storage} was created with another search_space; "
            "give the study a new name to search a different space"
        )
    return study


@contextmanager
def _heartbeat(storage: RDBStorage, trial: Trial, seconds: int) -> Iterator[None]:
    """Record a heartbeat for `trial` every `seconds` while the block runs.
    (Optuna beats only inside `study.optimize`; this runner asks and tells itself.)"""
    stop = threading.Event()
    trial_id = trial._trial_id  # Optuna's storage key of the trial

    def beat() -> None:
        while not stop.wait(seconds):
            storage.record_heartbeat(trial_id)

    storage.record_heartbeat(trial_id)
    threading.Thread(target=beat, daemon=True).start()
    try:
        yield
    finally:
        stop.set()


@contextmanager
def _quiet_optuna() -> Iterator[None]:
    """Silence the warnings this runner's own design triggers."""
    with warnings.catch_warnings():
        # It asks and tells itself and beats the heartbeat itself (see _heartbeat).
        warnings.filterwarnings("ignore", message="Heartbeat of storage is supposed to be used")
        warnings.filterwarnings("ignore", category=optuna.exceptions.ExperimentalWarning)
        warnings.filterwarnings("ignore", category=FutureWarning, module="ax")
        yield


def _next_trial(study: optuna.Study, config: StudyConfig, space: SearchSpace) -> Trial | None:
    """Ask for a trial if the budget allows one; None when the study is done."""
    while True:
        optuna.storages.fail_stale_trials(study)
        with study_lock(config.storage, config.name):
            trials = study.get_trials(deepcopy=False)
            done = sum(t.state in DONE for t in trials)
            running = sum(t.state == TrialState.RUNNING for t in trials)
            failed = sum(t.state == TrialState.FAIL for t in trials)
            if done >= config.budget.trials:
                return None
            if failed >= (config.budget.max_failures or config.budget.trials):
                raise RanknasError(
                    f"study {config.name!r}: {failed} trials failed; see their failure_reason "
                    "with `ranknas leaderboard --all` and fix the config before resuming"
                )
            if done + running < config.budget.trials:
                return study.ask(distributions(space))
        time.sleep(min(config.heartbeat_seconds, 5))  # the rest are running elsewhere


def run_study(
    config: StudyConfig,
    progress: Progress = print,
    logger: Any = None,
    worker: str | None = None,
) -> optuna.Study:
    """Run trials until the study has `budget.trials` complete or pruned trials."""
    with _quiet_optuna():
        return _run_study(config, progress, logger, worker)


def _run_study(
    config: StudyConfig, progress: Progress, logger: Any, worker: str | None
) -> optuna.Study:
    worker = worker or f"{socket.gethostname()}:{os.getpid()}"
    torch.set_num_threads(config.training.threads)
    data = prepare_data(config)
    space = make_space(config.search_space, data.train.schema)
    with study_lock(config.storage, config.name):  # workers starting together create it once
        storage = open_storage(config.storage, config.heartbeat_seconds)
        study = open_study(config, space, storage)
    if config.objectives.latency_model:  # a bad predictor file stops the study before a trial
        _latency_predictor(config.objectives.latency_model, config.objectives.latency_batch_size)
    study.set_user_attr(StudyAttr.SCHEMA, data.train.schema.to_dict())
    if data.bayes_ne is not None:
        study.set_user_attr(StudyAttr.BAYES_NE, data.bayes_ne)
    if logger is not None:
        logger.start_study(
            config.name,
            params=config.model_dump(mode="json"),
            tags={"searcher": config.searcher.type},
        )
    run_search_phase(study, config, space, data, progress, logger)  # oneshot/dnas only
    deadline = (
        time.monotonic() + 60 * config.budget.time_limit_minutes
        if config.budget.time_limit_minutes
        else None
    )
    started = time.monotonic()
    while deadline is None or time.monotonic() < deadline:
        trial = _next_trial(study, config, space)
        if trial is None:
            break
        try:
            with _heartbeat(storage, trial, config.heartbeat_seconds):
                record = run_trial(trial, study, space, data, config, worker)
        except KeyboardInterrupt:
            _fail(study, trial, "interrupted")
            study.enqueue_trial(trial.params)  # the next run retries this architecture
            raise
        except RanknasError:
            _fail(study, trial, "invalid input")
            raise
        except Exception as exc:  # a broken trial is a recorded result, not the study's end
            record = _fail(study, trial, f"{type(exc).__name__}: {exc}", config, worker)
        if logger is not None:
            logger.log_trial(trial.number, **record)
        progress(_progress_line(study, config, record, started))
    return study


def _fail(
    study: optuna.Study,
    trial: Trial,
    reason: str,
    config: StudyConfig | None = None,
    worker: str = "",
) -> dict[str, Any]:
    trial.set_user_attr(TrialAttr.FAILURE_REASON, reason)
    study.tell(trial, state=TrialState.FAIL)
    tags = {TrialAttr.WORKER: worker} | ({"searcher": config.searcher.type} if config else {})
    summary = {"status": "failed", "failure_reason": reason}
    return mlflow_record(trial.params, summary, {}, tags, {})


@dataclass
class Costs:
    """What an architecture costs before it is trained."""

    mflops: float
    params: int
    latency_ms: float | None = None

    def summary(self) -> dict[str, float]:
        out = {"mflops": self.mflops, "params": self.params}
        return out | ({} if self.latency_ms is None else {"latency_ms": self.latency_ms})

    def objective(self, name: str) -> float | None:
        return {"mflops": self.mflops, "params": float(self.params),
                "latency_ms": self.latency_ms}.get(name)  # fmt: skip


def run_trial(
    trial: Trial,
    study: optuna.Study,
    space: SearchSpace,
    data: StudyData,
    config: StudyConfig,
    worker: str,
) -> dict[str, Any]:
    """Cost, plan, train and record one trial; returns what MLflow gets for it."""
    arch = space.decode(trial.params)
    directory = config.study_dir / "trials" / str(trial.number)
    write_architecture(directory, arch)
    costs = architecture_costs(arch, config)
    tags = {TrialAttr.DIGEST: digest(arch), TrialAttr.WORKER: worker}
    _set_attrs(trial, tags | costs.summary() | {TrialAttr.DIR: str(directory.resolve())})
    sharding = plan_sharding(arch, config, directory)
    result, model = _train_within_constraints(trial, arch, costs, data, config)
    summary = record_result(directory, costs, sharding, result, model)
    _set_attrs(trial, {k: summary.get(k) for k in (*METRIC_ATTRS, TrialAttr.FAILURE_REASON,
                                                   TrialAttr.PREDICTED_STEP_MS)})  # fmt: skip
    state, values = _outcome(result, config, costs)
    study.tell(trial, values, state=state)
    tags["searcher"] = config.searcher.type
    return mlflow_record(trial.params, summary, result.curves, tags, _artifacts(directory))


def _set_attrs(trial: Trial, attrs: dict[str, Any]) -> None:
    for key, value in attrs.items():
        if value is not None:
            trial.set_user_attr(key, value)


def architecture_costs(arch: Architecture, config: StudyConfig) -> Costs:
    analysis = analyze(arch)
    latency_ms = _latency_ms(arch, config) if config.objectives.needs_latency else None
    return Costs(analysis.flops / 1e6, analysis.dense_params, latency_ms)


def plan_sharding(arch: Architecture, config: StudyConfig, directory: Path) -> dict | None:
    """The embedding sharding plan of `sharding.devices` devices (none when not asked)."""
    shard = config.sharding
    if not shard.devices:
        return None
    batch = config.training.batch_size
    plan = plan_trial_sharding(arch, shard.devices, shard.method, shard.model_dir, batch)
    (directory / SHARDING_FILE).write_text(json.dumps(plan, indent=2))
    return plan


def record_result(
    directory: Path,
    costs: Costs,
    sharding: dict | None,
    result: TrainResult,
    model: RankingModel | None,
) -> dict[str, Any]:
    """Write the weights (of a complete run) and metrics.json; returns the metrics."""
    if model is not None and result.status == "complete":
        write_weights(directory, model)
    summary = result.summary() | costs.summary()
    if sharding and "predicted_step_ms" in sharding:
        summary[TrialAttr.PREDICTED_STEP_MS] = sharding["predicted_step_ms"]
    write_metrics(directory, summary)
    return summary


def _artifacts(directory: Path) -> dict[str, str]:
    """The trial's text files that go to its MLflow run."""
    names = (ARCHITECTURE_FILE, SHARDING_FILE)
    return {name: (directory / name).read_text() for name in names if (directory / name).exists()}


def _latency_ms(arch: Architecture, config: StudyConfig) -> float:
    """Forward latency at `objectives.latency_batch_size`: predicted by
    `objectives.latency_model` if set, else measured on the training device."""
    from cost_models.latency import measure_latency

    o, t = config.objectives, config.training
    if o.latency_model is None:
        device = resolve_device(t.device)
        return measure_latency(arch, o.latency_batch_size, device, threads=t.threads).forward_ms
    return float(_latency_predictor(o.latency_model, o.latency_batch_size).predict([arch])[0])


@functools.cache
def _latency_predictor(path: str, batch_size: int) -> Any:
    """The study's latency predictor, loaded (and refitted) once per process."""
    from cost_models.latency import LatencyPredictor

    predictor = LatencyPredictor.load(path)
    if predictor.batch_size != batch_size:
        raise RanknasError(
            f"objectives.latency_model {path} was fitted at batch size "
            f"{predictor.batch_size}, objectives.latency_batch_size is {batch_size}"
        )
    return predictor


def trial_train_config(config: StudyConfig, seed: int) -> TrainConfig:
    """How the study trains one trial stand-alone (its budget and `training` section)."""
    t = config.training
    return TrainConfig(
        batch_size=t.batch_size,
        max_examples=config.budget.examples_per_trial,
        max_seconds=config.budget.trial_seconds,
        dense_optimizer=t.dense_optimizer,
        dense_lr=t.dense_lr,
        weight_decay=t.weight_decay,
        sparse_optimizer=t.sparse_optimizer,
        sparse_lr=t.sparse_lr,
        evals=t.evals,
        seed=seed,
        device=t.device,
    )


def _train_within_constraints(
    trial: Trial, arch: Architecture, costs: Costs, data: StudyData, config: StudyConfig
) -> tuple[TrainResult, RankingModel | None]:
    o = config.objectives
    reason = None
    if o.max_mflops and costs.mflops > o.max_mflops:
        reason = f"{costs.mflops:.3f} MFLOPs exceeds objectives.max_mflops={o.max_mflops}"
    elif o.max_params and costs.params > o.max_params:
        reason = f"{costs.params} params exceeds objectives.max_params={o.max_params}"
    elif o.max_latency_ms and costs.latency_ms is not None and costs.latency_ms > o.max_latency_ms:
        reason = (f"{costs.latency_ms:.3f} ms forward latency (batch {o.latency_batch_size}) "
                  f"exceeds objectives.max_latency_ms={o.max_latency_ms}")  # fmt: skip
    if reason:
        return TrainResult(status="pruned", failure_reason=reason), None

    def report(step: int, examples: int, metrics: dict[str, float]) -> bool:
        if config.multi_objective:
            return False
        trial.report(metrics[config.objectives.metric], step)
        return trial.should_prune()

    return train_architecture(arch, data, config, config.seed + trial.number, report)


def train_architecture(
    arch: Architecture,
    data: StudyData,
    config: StudyConfig,
    seed: int,
    on_eval: Callable[[int, int, dict[str, float]], bool] | None = None,
) -> tuple[TrainResult, RankingModel]:
    """Train `arch` from scratch exactly as the study trains a trial, with `seed`."""
    model = build_model(arch, seed=seed)
    train_config = trial_train_config(config, seed)
    return train(model, data.train, data.valid, data.test, train_config, on_eval=on_eval), model


def _outcome(
    result: TrainResult, config: StudyConfig, costs: Costs
) -> tuple[TrialState, list[float] | None]:
    if result.status == "pruned":
        return TrialState.PRUNED, None
    if result.status == "failed":
        return TrialState.FAIL, None
    metric = result.validation[config.objectives.metric]
    cost = costs.objective(config.objectives.cost)
    return TrialState.COMPLETE, [metric] if cost is None else [metric, cost]


def _progress_line(study: optuna.Study, config: StudyConfig, record: dict, started: float) -> str:
    trials = study.get_trials(deepcopy=False)
    done = sum(t.state in DONE for t in trials)
    complete = [t for t in trials if t.state == TrialState.COMPLETE]
    best = min((t.values[0] for t in complete), default=float("nan"))
    metric = config.objectives.metric
    value = record["metrics"].get(f"val_{metric}")
    elapsed = time.monotonic() - started
    worker = record["tags"][TrialAttr.WORKER]
    mine = max(1, sum(t.state in DONE and t.user_attrs.get(TrialAttr.WORKER) == worker
                      for t in trials))  # fmt: skip
    left = max(0, config.budget.trials - done) * elapsed / mine
    shown = f"{value:.4f}" if value is not None else "-"
    return (
        f"[{done}/{config.budget.trials}] {record['tags']['status']:<8} {metric} {shown} "
        f"(best {best:.4f})  {record['metrics'].get('mflops', 0):.3f} MFLOPs  "
        f"elapsed {elapsed:.0f}s, ~{left:.0f}s left"
    )
