"""The study runner: ask -> Architecture -> cost -> train -> tell, until the budget is spent.

The Optuna study in RDB storage is the system of record. Every worker (the first `search`
and any `worker` joining it) runs this same loop; a lock around "check the budget, ask"
keeps the study to exactly `budget.trials` complete or pruned trials. A trial whose process
died is failed by the heartbeat check and retried with the same architecture.
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import os
import signal
import socket
import statistics
import threading
import time
import warnings
from collections.abc import Callable, Collection, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import optuna
import torch
from optuna.distributions import CategoricalDistribution
from optuna.storages import RDBStorage
from optuna.trial import FrozenTrial, Trial, TrialState

from cost_models.sharding.methods import model_to_use
from nas.baselines import (
    baseline_key,
    baseline_record,
    best_baseline,
    check_baseline_files,
    distinct_baselines,
    recorded,
    train_baselines,
    unlisted,
)
from nas.commands import start_study_run
from nas.config import StudyConfig
from nas.diagram import diagram_png
from nas.feature_screen import Screen, describe, screen, screens
from nas.leaderboard import costs_text, reeval_metrics, seed_means, study_best
from nas.oneshot.phase import PHASE_SEARCHERS, PROPOSED_BY, proposed_by, run_search_phase
from nas.protocol import (
    Costs,
    StepReference,
    StudyData,
    architecture_costs,
    check_protocol,
    dense_predictor,
    latency_predictor,
    over_constraint,
    plan_sharding,
    prepare_data,
    record_result,
    study_protocol,
    train_architecture,
)
from nas.protocol_diff import (
    CEILINGS_CHANGED,
    CONSTRAINTS,
    ceiling_changes,
    check_settings,
    configured_ceilings,
    other_settings,
    protocol_changes,
    step_cluster,
)
from nas.recipe import recipe_key, trial_recipe, with_recipe
from nas.reevaluate import best_baseline_by_seed_means
from nas.searchers import make_sampler
from nas.searchers.base import distributions
from nas.storage import (
    beating,
    check_server,
    existing_study,
    fail_stale_trials,
    first_run,
    open_storage,
    params_in_one_transaction,
    recorded_attrs,
    redact,
    retry_first,
    set_user_attrs,
    study_lock,
)
from nas.trial_record import (
    ARCHITECTURE_FILE,
    DIAGRAM_FILE,
    DIED,
    INTERRUPTED,
    LOGGED,
    METRIC_ATTRS,
    METRICS_FILE,
    RECORD_PREFIX,
    SHARDING_FILE,
    STEP_FILE,
    TRAINED_PLAN_FILE,
    StudyAttr,
    TrialAttr,
    architecture_params,
    claim_output_dir,
    counted,
    counted_trials,
    exhausted,
    failure_reason,
    lost_trials,
    mlflow_record,
    own_output_dir,
    read_architecture,
    read_metrics,
    read_step,
    repeats,
    skipped,
    space_params,
    stopped_on_ceilings,
    summary_name,
    time_limit_line,
    write_architecture,
)
from search_space.architecture import Architecture, analyze, digest
from search_space.builder import RankingModel
from search_space.errors import RanknasError, SpecError
from search_space.presets import check_before_the_data
from search_space.space_configs import BEST_BASELINE
from search_space.spaces import SearchSpace, make_space
from search_space.spaces.around import AroundSpace
from trainers import progress as bars
from trainers.processes import process_identity
from trainers.trainer import TrainResult, device_label, resolve_device

Progress = Callable[[str], None]
DONE = (TrialState.COMPLETE, TrialState.PRUNED)
DRAWING_POLL_SECONDS = 0.05  # a trial's first wait for an earlier point drawn (then doubled)
IDLE_POLL_SECONDS = 1.0  # a worker with no trial to ask, while others' trials run
CONFIRM_SEED_STRIDE = 100_000  # confirmation seeds: far from trial and re-evaluation seeds


def objective_names(config: StudyConfig) -> list[str]:
    cost = config.objectives.cost
    return [config.objectives.metric] + ([] if cost == "none" else [cost])


def open_study(
    config: StudyConfig,
    space: SearchSpace,
    storage: RDBStorage,
    worker: str = "",
    first: Screen | None = None,
) -> optuna.Study:
    """Create the study, or load it to resume; a changed search space is refused. A new
    study is given `first`'s points (its record kept as `feature_importance`), then its
    space's starting points, those within `objectives`' constraints."""
    o, s = config.objectives, config.searcher
    sampler = make_sampler(
        s.type,
        space,
        objective_names=objective_names(config),
        seed=_sampler_seed(config, storage, worker),
        population=s.population,
        sample_size=s.sample_size,
        startup_trials=s.startup_trials,
        objective_thresholds={"mflops": o.max_mflops}
        if isinstance(o.max_mflops, float) and o.cost == "mflops"
        else None,
    )
    pruner = {
        "none": optuna.pruners.NopPruner(),
        "median": optuna.pruners.MedianPruner(n_startup_trials=config.pruning.startup_trials),
        "hyperband": optuna.pruners.HyperbandPruner(),
    }[config.pruning.type]
    study = _create_study(config, storage, sampler=sampler, pruner=pruner)

    def admits(values: dict[str, Any]) -> bool:
        return over_constraint(architecture_costs(space.decode(values), config), config) is None

    new = _check_search_space(study, config)
    _check_own_dims(study, config, space, new)
    if new:
        study.set_metric_names(objective_names(config))  # how dashboards name the values
        for values in [*filter(admits, first.points if first else []),
                       *space.starting_points(s.startup_trials, config.seed, admits)]:  # fmt: skip
            study.enqueue_trial(values)
        if first is not None:
            study.set_user_attr(StudyAttr.FEATURE_IMPORTANCE, first.record)
        study.set_user_attr(StudyAttr.SEARCH_SPACE, config.search_space.model_dump(mode="json"))
        study.set_user_attr(StudyAttr.OBJECTIVES, objective_names(config))
        study.set_user_attr(StudyAttr.SEARCHER, s.type)
    # the largest a run gave it: a study resumed with `--trials 50` shows 50, also after a
    # worker joins with the config's own smaller budget
    budget = max(config.budget.trials, study.user_attrs.get(StudyAttr.BUDGET_TRIALS, 0))
    study.set_user_attr(StudyAttr.BUDGET_TRIALS, budget)
    return study


def _check_own_dims(study: optuna.Study, config: StudyConfig, space: Any, new: bool) -> None:
    """Refuses a study searched around a base of its own feature dims (or features it leaves
    out) before the around space kept them (2026-12-07): its trials' values now decode to
    other models than it trained. Marks the studies that decode so."""
    if study.user_attrs.get(StudyAttr.OWN_DIMS):
        return
    inner = getattr(space, "inner", space)  # a recipe's space wraps the architectures'
    base = inner.base if isinstance(inner, AroundSpace) and not inner.config.feature_dims else None
    if not new and base is not None and any(f.dim is not None for f in base.embedding.features):
        raise RanknasError(
            f"study {config.name!r} searched around {base.name or 'its base'} before the "
            "around space kept a base's own feature dims (2026-12-07: every point read every "
            "feature at the model's dim); its trials' values now decode to other models. "
            "Give the study a new name to search around the base as it is"
        )
    study.set_user_attr(StudyAttr.OWN_DIMS, True)


def _check_batches_fit(config: StudyConfig, rows: int) -> None:
    """Refuses a batch (`training.batch_size`, or a `training.search` choice) larger than
    the training split, before the study exists: the first trial failed on it, and the
    study it left recorded that batch, so the corrected config was refused as a change."""
    search = config.training.search
    batches = {"training.batch_size": config.training.batch_size}
    if search is not None and search.batch_size:
        batches["training.search.batch_size"] = max(search.batch_size)
    if config.searcher.finetune_batch_size is not None:  # oneshot/dnas
        batches["searcher.finetune_batch_size"] = config.searcher.finetune_batch_size
    too_large = {name: size for name, size in batches.items() if size > rows}
    if too_large:
        shown = ", ".join(f"{name} {size:,}" for name, size in too_large.items())
        raise RanknasError(f"{shown}: more than the training split's {rows:,} rows (a trial "
                           "trains whole batches): give more rows, or a smaller batch")  # fmt: skip


def _create_study(config: StudyConfig, storage: RDBStorage, **options: Any) -> optuna.Study:
    """Create or load the study (under the study lock). One that a run created and that
    stopped before searching (a config error) may have other objectives than the config,
    fixed since: it is made again with the config's, its attributes kept (Optuna cannot
    change a study's directions)."""

    def create() -> optuna.Study:
        return optuna.create_study(
            study_name=config.name,
            storage=storage,
            directions=["minimize"] * len(objective_names(config)),
            load_if_exists=True,
            **options,
        )

    study = create()
    if len(study.directions) == len(objective_names(config)) or not _never_searched(study):
        return study  # a searched study with other objectives: _check_search_space says so
    attrs = study.user_attrs
    optuna.delete_study(study_name=config.name, storage=storage)
    study = create()
    for key, value in attrs.items():
        study.set_user_attr(key, value)
    return study


def _never_searched(study: optuna.Study) -> bool:
    return StudyAttr.OBJECTIVES not in study.user_attrs and not study.get_trials(deepcopy=False)


def _check_search_space(study: optuna.Study, config: StudyConfig) -> bool:
    """True for a new study; refuses one created with another search space or other
    objectives (its trials' values would mean something else), or another searcher (its
    record, the MLflow parent run and the model card name the one it was created with)."""
    recorded = study.user_attrs.get(StudyAttr.SEARCH_SPACE)
    where = f"study {config.name!r} in {redact(config.storage)} was created with"
    now = config.search_space.model_dump(mode="json")
    if recorded is not None and recorded != now:
        changed = "; ".join(protocol_changes(recorded, now, "search_space."))
        raise RanknasError(
            f"{where} another search_space ({changed}); put it back, or give the study a new "
            "name to search a different space"
        )
    searcher = study.user_attrs.get(StudyAttr.SEARCHER)
    if searcher is not None and searcher != config.searcher.type:  # every surface names one
        raise RanknasError(
            f"{where} searcher {searcher}, not {config.searcher.type} (searcher.type); put it "
            "back, or give the study a new name to search with another"
        )
    objectives = study.user_attrs.get(StudyAttr.OBJECTIVES)
    if objectives is not None and objectives != objective_names(config):
        raise RanknasError(
            f"{where} objectives {', '.join(objectives)}, not {', '.join(objective_names(config))}"
            " (objectives.metric and cost); put them back, or give the study a new name"
        )
    return recorded is None


def _check_ceilings(study: optuna.Study, config: StudyConfig) -> None:
    """`protocol_diff.ceiling_changes` under the study lock (a worker may have created the
    study since `check_settings`); records the ceilings where none are (a new study, or one
    from before they were)."""
    if changes := ceiling_changes(study.user_attrs, config):
        raise other_settings(config, changes, CEILINGS_CHANGED)
    if study.user_attrs.get(StudyAttr.CEILINGS) != (now := configured_ceilings(config)):
        study.set_user_attr(StudyAttr.CEILINGS, now)


def _sampler_seed(config: StudyConfig, storage: RDBStorage, worker: str) -> int:
    """`seed` for the process that sets the study up (a run is reproducible); for one that
    joins or resumes it, a seed of its own, so that workers do not replay one sequence."""
    try:
        study_id = storage.get_study_id_from_name(config.name)
    except KeyError:
        return config.seed
    if StudyAttr.SEARCH_SPACE not in storage.get_study_user_attrs(study_id):
        return config.seed  # created to train the baselines, not yet searched
    trials = len(storage.get_all_trials(study_id))
    key = f"{config.seed}:{worker}:{trials}".encode()
    return int.from_bytes(hashlib.sha256(key).digest()[:4], "big")


def _heartbeat(storage: RDBStorage, trial: Trial, seconds: int) -> Iterator[None]:
    """Record a heartbeat for `trial` every `seconds` while the block runs.
    (Optuna beats only inside `study.optimize`; this runner asks and tells itself.)"""
    trial_id = trial._trial_id  # Optuna's storage key of the trial
    storage.record_heartbeat(trial_id)
    return beating(seconds, lambda: storage.record_heartbeat(trial_id))


@contextmanager
def _quiet_optuna() -> Iterator[None]:
    """Silence the warnings this runner's own design triggers."""
    with warnings.catch_warnings():
        # It asks and tells itself and beats the heartbeat itself (see _heartbeat).
        warnings.filterwarnings("ignore", message="Heartbeat of storage is supposed to be used")
        warnings.filterwarnings("ignore", category=optuna.exceptions.ExperimentalWarning)
        warnings.filterwarnings("ignore", category=FutureWarning, module="ax")
        yield


def _is_error(trial: FrozenTrial) -> bool:
    """A failure that counts toward `max_failures`: not an interrupt, not a dead worker, not
    a repeat of a diverged architecture."""
    attrs = trial.user_attrs
    reason = attrs.get(TrialAttr.FAILURE_REASON)
    failed = trial.state == TrialState.FAIL and reason is not None and reason != INTERRUPTED
    return failed and TrialAttr.REUSED_FROM not in attrs  # a repeat failed once, as its original


def _last_failure(trials: list[FrozenTrial]) -> str:
    """The latest counted failure's reason, in one line (out of memory, a full disk...)."""
    reason = next(t.user_attrs[TrialAttr.FAILURE_REASON] for t in reversed(trials) if _is_error(t))
    line = " ".join(reason.split())
    return line if len(line) <= 200 else line[:197] + "..."


def _next_trial(
    study: optuna.Study, storage: RDBStorage, config: StudyConfig, space: SearchSpace
) -> Trial | None:
    """Ask for a trial if the budget allows one; None when the study is done. Only the
    trial's creation (its place in the budget) holds the study lock; its point is drawn
    after, so that workers do not queue behind each other's sampling (`_same_trained`
    waits on points still being drawn)."""
    while True:
        fail_stale_trials(study, storage)
        trial = None
        try:
            # A Ctrl-C or kill before the trial is claimed would leave it RUNNING (failed
            # as "died" once its heartbeat lapses): it is held until then.
            with _interrupts_held():
                with study_lock(config.storage, config.name):
                    trials = study.get_trials(deepcopy=False)
                    left = _trials_left(trials, config)
                    if not left:
                        return None
                    if sum(t.state == TrialState.RUNNING for t in trials) < left:
                        trial = study.ask()
                        storage.record_heartbeat(trial._trial_id)  # a dead worker's is failed
                if trial is not None:  # beating: a slow sampler's trial is not deemed dead
                    with _heartbeat(storage, trial, config.heartbeat_seconds):
                        return _claimed(_drawn(trial, space), space)
        except KeyboardInterrupt:
            if trial is not None:  # asked, not yet the caller's: set aside as the loop does
                trial.set_user_attr(TrialAttr.FAILURE_REASON, INTERRUPTED)
                study.tell(trial, state=TrialState.FAIL)
                if trial.params:
                    with study_lock(config.storage, config.name):
                        retry_first(study, trial)  # retried on resume
            raise
        # the rest are running elsewhere: a worker whose last trial ends, or fails and
        # wants a retry, is seen within a second (the launcher waits for every worker)
        time.sleep(min(config.heartbeat_seconds, IDLE_POLL_SECONDS))


def _trials_left(trials: list[FrozenTrial], config: StudyConfig) -> int:
    """How many trials may run now: what the budget still wants (0: the study is done), and no
    more than the failures it still allows, so that workers running side by side cannot
    together fail past `budget.max_failures`; refused when too many failed or were skipped."""
    done = counted_trials(trials)
    if done >= config.budget.trials or exhausted(trials, config.budget.trials):
        return 0
    if stopped_on_ceilings(trials, config.budget.trials):
        raise RanknasError(
            f"study {config.name!r}: {skipped(trials)} sampled architectures exceeded the "
            f"objectives' constraints and only {done} met them; in a new study (`name:`: "
            "this one keeps its ceilings), loosen objectives.max_mflops / max_params / "
            "max_latency_ms / max_step_ms, or search a space of smaller architectures"
        )
    failed = sum(_is_error(t) for t in trials)
    limit = config.budget.max_failures or config.budget.trials
    if failed >= limit:
        raise RanknasError(
            f"study {config.name!r}: {failed} trial{'s' * (failed != 1)} failed "
            f"(budget.max_failures is "
            f"{limit}), last: {_last_failure(trials)}; see all with `ranknas "
            f"leaderboard {config.name} --storage {redact(config.storage)} --all`, then fix "
            "the config, or raise budget.max_failures to go on"
        )
    return min(config.budget.trials - done, limit - failed)


def _drawn(trial: Trial, space: SearchSpace) -> Trial:
    """`trial` with a point of `space` drawn by the study's sampler (or the queued point it
    was given), as `study.ask(distributions(space))` would."""
    with params_in_one_transaction(trial):
        for name, distribution in distributions(space).items():
            if isinstance(distribution, CategoricalDistribution):
                trial.suggest_categorical(name, distribution.choices)
            else:
                trial.suggest_int(name, distribution.low, distribution.high)
    return trial


def trial_seed(trial: Trial, config: StudyConfig) -> int:
    """The training seed of `trial`: the study's seed plus the number of the trial whose
    run it is, its own or, for a retry of an interrupted or dead worker's trial, the first
    one's, so that the retry trains the model the interrupted run would have."""
    system_attrs = trial.study._storage.get_trial_system_attrs(trial._trial_id)
    return config.seed + first_run(trial.number, system_attrs)


@contextmanager
def _interrupts_held() -> Iterator[None]:
    """SIGINT and SIGTERM received inside the block are raised again, to their own
    handlers, when it ends. Only the main thread handles signals."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    held: list[int] = []
    handlers = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM)}
    for number in handlers:
        signal.signal(number, lambda signum, _frame: held.append(signum))
    try:
        yield
    finally:
        for number, handler in handlers.items():
            signal.signal(number, signal.SIG_DFL if handler is None else handler)
        if held:
            signal.raise_signal(held[0])


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
    check_server(config.storage)
    check_baseline_files(config.baselines)  # before the data, which can take minutes
    if (base := getattr(config.search_space, "base", None)) not in (None, BEST_BASELINE):
        try:  # (it was told after the data, which left an empty study folder)
            check_before_the_data(base)
        except RanknasError as exc:
            raise RanknasError(f"search_space.base: {exc}") from None
    if (recorded := existing_study(config.name, config.storage)) is not None:
        check_settings(recorded.user_attrs, config)  # the same
    try:  # and a device this machine lacks (it came after the data and an empty study)
        resolve_device(config.training.device)
    except RanknasError as exc:
        raise RanknasError(f"training.device: {exc}; set it to auto or cpu") from None
    try:  # every trial writes here: a wrong place must stop the study, not fail each trial
        made = [d for d in (config.study_dir, *config.study_dir.parents) if not d.exists()]
        config.study_dir.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise RanknasError(f"output_dir: cannot create {config.study_dir} ({exc.strerror}); "
                           "choose a writable directory") from None  # fmt: skip
    try:
        data = prepare_data(config)
    except RanknasError:  # refused for its data: the start leaves no empty directory behind
        for directory in made:  # deepest first; one that holds anything stays
            with contextlib.suppress(OSError):
                directory.rmdir()
        raise
    progress(f"data: {len(data.train):,} training, {len(data.valid):,} validation, "
             f"{len(data.test):,} test rows, split {data.split}")  # fmt: skip
    _check_batches_fit(config, len(data.train))
    # built before any training, so that a wrong space stops the study at once; a space
    # around the best baseline waits for the baselines
    space = None if _around_best_baseline(config) else make_space(config.search_space,
                                                                  data.train.schema)  # fmt: skip
    space = space and with_recipe(space, config.training)
    if config.objectives.latency_model:  # a bad predictor file stops it before the study exists
        latency_predictor(config.objectives.latency_model, config.objectives.latency_batch_size)
    if config.sharding.dense_model:  # validated: only with a step objective
        dense_predictor(config.sharding.dense_model, config.training.batch_size)
    if config.sharding.links:  # and a links file no measurement wrote
        _check_links(config.sharding.links, config.sharding.runtime_ms, progress)
    if config.sharding.devices:  # README: the shipped model is used, and said so
        _, shipped = model_to_use(config.sharding.model_dir, "sharding.model_dir")
        if shipped:
            progress(f"sharding: {shipped}")
    with study_lock(config.storage, config.name):  # workers starting together create it once
        storage = open_storage(config.storage, config.heartbeat_seconds)
        token = claim_output_dir(config, recorded_attrs(storage, config.name))
        study = _create_study(config, storage)
        own_output_dir(config, study, token)
        if lost := lost_trials(study):
            shown = ", ".join(map(str, lost[:10])) + (", ..." if len(lost) > 10 else "")
            progress(f"warning: the folders of {len(lost)} trial{'s' * (len(lost) != 1)} "
                     f"({shown}) under {config.study_dir / 'trials'} are gone (deleted or "
                     "moved?): their models can be neither exported nor re-evaluated; put "
                     "them back, or search on without them")  # fmt: skip
        _check_search_space(study, config)
        _check_ceilings(study, config)
        check_protocol(study, config, data)
        if config.objectives.needs_step_time:  # checked and recorded under one lock
            study.set_user_attr(StudyAttr.STEP_DEVICES, config.sharding.devices)
            study.set_user_attr(StudyAttr.STEP_CLUSTER, step_cluster(config))
    study.set_user_attr(StudyAttr.SCHEMA, data.train.schema.to_dict())
    study.set_user_attr(StudyAttr.PREPROCESSING, data.preprocessing)
    study.set_user_attr(StudyAttr.RECIPE, study_protocol(config, data)["training"])
    if data.bayes_ne is not None:
        study.set_user_attr(StudyAttr.BAYES_NE, data.bayes_ne)
    baselines = distinct_baselines(study, config.baselines, data.train.schema)  # run untouched
    if notice := unlisted(study, baselines):
        progress(notice)
    viewed_means = StudyAttr.REEVALUATION in study.user_attrs  # the view shows seed means
    if logger is not None:
        start_study_run(logger, config, study)
    if config.baselines:
        needed = (  # the study waits for these baselines (the screen: for the base's weights)
            _around_best_baseline(config)
            or BEST_BASELINE in config.objectives.ceilings().values()
            or screens(config.search_space)
        )
        train_baselines(study, config, baselines, data, logger, progress, worker, needed)
    best = _best_baseline(study, config, data, progress)
    if logger is not None and not viewed_means and StudyAttr.REEVALUATION in study.user_attrs:
        start_study_run(logger, config, study)  # the baselines' seed means: their columns
    if space is None:
        space = make_space(_with_around_base(study, config, best, progress), data.train.schema)
        space = with_recipe(space, config.training)
    config = _with_ceilings(study, config, space, best, data, progress)  # before the startup
    first = None if StudyAttr.SEARCH_SPACE in study.user_attrs else screen(
        study, space, data, config.seed, progress)  # fmt: skip
    with study_lock(config.storage, config.name):
        study = open_study(config, space, storage, worker, first)
    screened = study.user_attrs.get(StudyAttr.FEATURE_IMPORTANCE)
    if first is not None and screened is not None:  # this worker's or the one that created it
        progress(f"features: {describe(screened)}")
    run_search_phase(study, config, space, data, progress, logger)  # oneshot/dnas only
    if logger is not None:
        log_unlogged(study, config, logger, progress)
        _log_dead_trials(study, logger, space)
    deadline = (  # the searching's: after the baselines, a one-shot phase, MLflow's catch-up
        time.monotonic() + 60 * config.budget.time_limit_minutes
        if config.budget.time_limit_minutes
        else None
    )
    said = _Collapsed(progress)
    with _trials_bar(study, config) as bar, contextlib.closing(said):
        started = time.monotonic()
        while deadline is None or time.monotonic() < deadline:
            trial = _next_trial(study, storage, config, space)
            if trial is None:
                break
            try:
                with _heartbeat(storage, trial, config.heartbeat_seconds):
                    outcome = _reused(study, storage, trial, space, config, worker) or run_trial(
                        trial, space, data, config, worker
                    )
            except KeyboardInterrupt:
                # a second signal (a launch's workers get the terminal's and the launcher's)
                # would leave the trial RUNNING, failed later as "died": held until recorded
                with _interrupts_held():
                    stopped = _failed(trial, INTERRUPTED, config, worker, space)
                    _finish(study, trial, stopped, logger)
                    with study_lock(config.storage, config.name):  # no worker pops the queue
                        retry_first(study, trial)  # the next run retries this architecture
                raise
            except RanknasError:
                invalid = _failed(trial, "invalid input", config, worker, space)
                _finish(study, trial, invalid, logger)
                raise
            except Exception as exc:  # a broken trial is a recorded result, not the study's end
                outcome = _failed(trial, f"{type(exc).__name__}: {exc}", config, worker, space)
            # trained: a Ctrl-C now (drawing the diagram, queueing and delivering the MLflow
            # run) waits until the result is told, then stops the study; it never leaves
            # the trial RUNNING, to be failed on resume as "the worker died"
            with _interrupts_held():
                _finish(study, trial, outcome, logger)
            line, done, best = _progress_line(study, config, outcome.record, started, deadline)
            said(line)
            bar.show(f"best {config.objectives.metric}", best)
            bar.update(done - bar.n)
    if logger is not None:  # trials whose worker died while this one ran
        _log_dead_trials(study, logger, space)
    _say_if_timed_out(study, config, deadline, progress)
    _say_if_exhausted(study, config, progress)
    return study


class _Collapsed:
    """Progress that prints a line equal to the one before only as a count (a space of one
    architecture had its repeats said 60 times, line after line)."""

    def __init__(self, progress: Progress) -> None:
        self.progress, self.last, self.again = progress, None, 0

    def __call__(self, line: str) -> None:
        if line == self.last:
            self.again += 1
            return
        self.close()
        self.progress(line)
        self.last = line

    def close(self) -> None:  # the count said (also where the loop ends on an error)
        if self.again:
            self.progress(f"(the line above {self.again} more time{'s' * (self.again != 1)})")
            self.again = 0


def _say_if_timed_out(
    study: optuna.Study, config: StudyConfig, deadline: float | None, progress: Progress
) -> None:
    """Say, and keep in the study for `status`, that `budget.time_limit_minutes` ended this
    run's search before its budget of trials (each `search` gets the limit anew)."""
    done = counted_trials(study.get_trials(deepcopy=False))
    if deadline is None or time.monotonic() < deadline or done >= config.budget.trials:
        if study.user_attrs.get(StudyAttr.TIME_LIMITED):  # an earlier run's, gone on since
            study.set_user_attr(StudyAttr.TIME_LIMITED, None)
        return
    limited = {"minutes": config.budget.time_limit_minutes, "counted": done}
    study.set_user_attr(StudyAttr.TIME_LIMITED, limited)
    progress(time_limit_line(limited, config.budget.trials))


def _say_if_exhausted(study: optuna.Study, config: StudyConfig, progress: Progress) -> None:
    trials = study.get_trials(deepcopy=False)
    done = counted_trials(trials)
    if done > config.budget.trials:  # a budget lowered under what a run before counted
        progress(f"study {config.name!r} already holds {done} counted trials, more than its "
                 f"budget of {config.budget.trials}: none trained; raise budget.trials (or "
                 "--trials) above it to search further")  # fmt: skip
    if done < config.budget.trials and exhausted(trials, config.budget.trials):
        why = "the space holds few new ones; widen search_space or lower budget.trials"
        if over := skipped(trials):  # the ceilings, not the space, may leave nothing new
            o = config.objectives
            ceilings = ", ".join(f"objectives.{name}={value:.4g}" for name in CONSTRAINTS
                                 if isinstance(value := getattr(o, name), int | float))  # fmt: skip
            why = (f"few new ones fit under {ceilings} ({over} proposals were over it, "
                   "skipped untrained); raise that ceiling or widen search_space in a new "
                   "study (`name:`), or lower budget.trials")  # fmt: skip
        progress(
            f"study {config.name!r} ended at {done} of {config.budget.trials} trials: the "
            f"searcher proposed {repeats(trials)} architectures it had proposed before, so " + why
        )


def _around_best_baseline(config: StudyConfig) -> bool:
    return getattr(config.search_space, "base", None) == BEST_BASELINE


def _best_baseline(
    study: optuna.Study, config: StudyConfig, data: StudyData, progress: Progress
) -> tuple[str, dict[str, Any]] | None:
    """The study's best baseline (key, record) while a `best_baseline` of the config is still
    to be resolved, else None: by seed means (`config.best_baseline`), or by the single runs
    where those are off. One worker retrains while the others wait for its runs."""
    unresolved = (_around_best_baseline(config)
                  and StudyAttr.AROUND_BASE not in study.user_attrs) or any(
        value == BEST_BASELINE and CEILINGS[cost] not in study.user_attrs
        for cost, value in config.objectives.ceilings().items())  # fmt: skip
    if not unresolved:
        return None
    with study_lock(config.storage, config.name):
        key = best_baseline_by_seed_means(study, config, data, progress)
    best = (key, recorded(study)[key]) if key else best_baseline(study, config.objectives.metric)
    if best is None:  # a diverged base's variants would burn the budget diverging too
        raise RanknasError(f"study {config.name!r}: best_baseline is asked for but no baseline "
                           "trained to completion (each failed or diverged); see `ranknas "
                           "status`, then fix the training recipe or budget and run it as a "
                           "new study (`name:`): a study keeps the settings of its first "
                           "run")  # fmt: skip
    others = {k: r for k, r in recorded(study).items() if k != "logistic_regression"}
    failed = [k for k, r in others.items() if r.get("status") != "complete"]
    if best[0] == "logistic_regression" and others and len(failed) == len(others):
        # around, or held to, a linear model
        raise RanknasError(f"study {config.name!r}: best_baseline is asked for, and every "
                           f"baseline but logistic_regression failed ({', '.join(failed)}): "
                           "the search would run around a linear model, or under its FLOPs; "
                           "see why in `ranknas status`, then fix the training recipe or "
                           "budget and run it as a new study (`name:`)")  # fmt: skip
    return best


def _with_around_base(
    study: optuna.Study, config: StudyConfig, best: tuple[str, dict] | None, progress: Progress
) -> Any:
    """The search space config, with `base: best_baseline` made the best baseline
    (`_best_baseline`); kept in the study so that resumed and joining workers search around
    the same model."""
    if not _around_best_baseline(config):
        return config.search_space
    base = study.user_attrs.get(StudyAttr.AROUND_BASE)
    if base is None:
        assert best is not None  # unresolved, so _best_baseline chose one
        base = next((n for n in config.baselines if baseline_key(n) == best[0]),
                    str(Path(best[1]["dir"]) / ARCHITECTURE_FILE))  # fmt: skip
        study.set_user_attr(StudyAttr.AROUND_BASE, base)
    progress(f"search: around the best baseline, {baseline_key(base)}")
    return config.search_space.model_copy(update={"base": base})


CEILINGS = {"mflops": StudyAttr.MFLOPS_CEILING, "step_ms": StudyAttr.STEP_MS_CEILING}


def _with_ceilings(
    study: optuna.Study,
    config: StudyConfig,
    space: SearchSpace,
    best: tuple[str, dict] | None,
    data: StudyData,
    progress: Progress,
) -> StudyConfig:
    """`objectives.max_mflops` / `max_step_ms: best_baseline | base` made numbers: that cost
    of the best baseline when the search starts, or of the around space's base; kept in the
    study so that resumed and joining workers share them (a baseline added later does not
    move them)."""
    o, update = config.objectives, {}
    for cost, value in o.ceilings().items():
        if not isinstance(value, str):
            continue
        ceiling = study.user_attrs.get(CEILINGS[cost])
        if ceiling is None:  # one worker times it, the others wait and read it (workers
            with study_lock(config.storage, config.name):  # started together timed theirs)
                ceiling = study.user_attrs.get(CEILINGS[cost])
                if ceiling is None:
                    ceiling = _resolve_ceiling(study, cost, value, config, space, best, data)
                    study.set_user_attr(CEILINGS[cost], ceiling)
        limit = (f"{ceiling[cost]:.3f} MFLOPs" if cost == "mflops" else
                 f"{ceiling[cost]:.3f} ms a step on {config.sharding.devices} devices")  # fmt: skip
        progress(f"search: architectures above {limit} ({ceiling['of']}'s) are skipped untrained")
        update[f"max_{cost}"] = float(ceiling[cost])
    if not update:
        return config
    config = config.model_copy(update={"objectives": o.model_copy(update=update)})
    return config.with_step_reference(_step_reference(study, config))


def _step_reference(study: optuna.Study, config: StudyConfig) -> StepReference | None:
    """The model of a step ceiling made from one, with its dense part's time; None for a
    ceiling from before they were kept, or a predicted dense part (nothing to time)."""
    ceiling = study.user_attrs.get(StudyAttr.STEP_MS_CEILING) or {}
    if "architecture" not in ceiling or config.sharding.dense_model:
        return None
    arch = Architecture.from_dict(ceiling["architecture"], source=f"{ceiling['of']}'s record")
    return StepReference(ceiling["of"], arch, ceiling["dense_ms"])


def _resolve_ceiling(
    study: optuna.Study,
    cost: str,
    value: str,
    config: StudyConfig,
    space: SearchSpace,
    best: tuple[str, dict] | None,
    data: StudyData,
) -> dict:
    of = "baseline"
    if value == "base":  # an around space (validated)
        # the base as a baseline recorded it: priced again, its step (its dense part timed
        # anew) differed from the figure the verdict divides by
        best = next(((key, r) for key, r in recorded(study).items()
                     if r.get("digest") == digest(space.base) and r.get(cost) is not None),
                    None)  # fmt: skip
        if best is None:
            costs = architecture_costs(space.base, config, data.pooling_factors)
            ceiling = {cost: costs.objective(cost), "of": f"base {baseline_key(space.config.base)}"}
            return ceiling | (_dense_part(space.base, costs.step) if cost == "step_ms" else {})
        of = "base"
    assert best is not None  # unresolved, so _best_baseline chose one
    if best[1].get(cost) is None:
        raise RanknasError(f"study {config.name!r}: baseline {best[0]} was recorded without "
                           f"its {cost}; retrain it (`ranknas baseline add`)")  # fmt: skip
    ceiling = {cost: best[1][cost], "of": f"{of} {best[0]}"}
    if cost != "step_ms":
        return ceiling
    return ceiling | _dense_part(read_architecture(best[1]["dir"]), read_step(best[1]["dir"]))


def _dense_part(arch: Architecture, step: dict | None) -> dict:
    """What a step ceiling keeps of its model: the architecture and its dense part's time
    alone (a candidate's, scaled from it, is then slowed by the links file's dense_factor
    once, as the ceiling's own was)."""
    if step is None:
        return {}
    return {
        "architecture": arch.to_dict(),
        "dense_ms": step.get("dense_alone_ms", step["dense_ms"]),
    }


def _trials_bar(study: optuna.Study, config: StudyConfig) -> bars.Bar:
    """The study's bar over its trial budget; silent off a terminal, where each trial's
    line is the periodic line."""
    done = counted_trials(study.get_trials(deepcopy=False))
    label = f"study {config.name}"
    return bars.bar(config.budget.trials, label, "trials", lines=False, initial=done)


@dataclass
class Outcome:
    """A trained (or failed) trial, before it is told: Optuna's state and values, and what
    MLflow gets for it."""

    state: TrialState
    values: list[float] | None
    record: dict[str, Any]


def _finish(study: optuna.Study, trial: Trial, outcome: Outcome, logger: Any) -> None:
    """Queue the MLflow record in the durable outbox, then tell Optuna: a kill in between
    leaves a trial that its missed heartbeats fail and retry, never a finished trial that
    MLflow never hears of."""
    if logger is not None and not trial.user_attrs.get(TrialAttr.OVER_CONSTRAINT):
        directory = trial.user_attrs.get(TrialAttr.DIR)
        if directory and (Path(directory) / ARCHITECTURE_FILE).exists():
            diagram = diagram_png(read_architecture(directory), f"trial {trial.number}")
            outcome.record["artifacts"] = outcome.record["artifacts"] | {DIAGRAM_FILE: diagram}
        logger.log_trial(trial.number, **outcome.record)
        _set_attrs(trial, {LOGGED: logger.server})  # `log_unlogged` passes it over
    study.tell(trial, outcome.values, state=outcome.state)


def _failed(
    trial: Trial, reason: str, config: StudyConfig, worker: str, space: SearchSpace
) -> Outcome:
    trial.set_user_attr(TrialAttr.FAILURE_REASON, reason)
    tags = {TrialAttr.WORKER: worker, "searcher": config.searcher.type}
    status = INTERRUPTED if reason == INTERRUPTED else "failed"  # its MLflow run: KILLED
    summary = {"status": status, "failure_reason": reason}
    name = _untrained_run_name(trial, space)
    started = trial.datetime_start.timestamp() if trial.datetime_start else None
    # from the trial's start: a run made when it was queued started after it ended
    record = mlflow_record(space_params(trial.params), summary, {}, tags, {}, name, started)
    return Outcome(TrialState.FAIL, None, record)


def _untrained_run_name(trial: Trial | FrozenTrial, space: SearchSpace) -> str | None:
    """The MLflow run name of a trial that recorded no result (interrupted, failed, its
    worker dead): by its architecture, as a trained trial's run is; None if it does not
    decode (the default `trial-N` then)."""
    try:
        arch = space.decode(trial.params)
        mflops = analyze(arch).flops / 1e6
    except SpecError:
        return None
    return f"trial-{trial.number} {summary_name(arch, mflops)}"


def _claimed(trial: Trial, space: SearchSpace) -> Trial:
    """`trial` with its candidate's identity recorded: a worker that draws the same
    candidate later sees it and waits (`_same_trained`). The digest and the recipe are
    written in one transaction: a trial with a digest has its whole identity on record."""
    with contextlib.suppress(SpecError):  # run_trial records why a point does not decode
        key = digest(space.decode(trial.params))
        _set_attrs(trial, {TrialAttr.RECIPE: trial_recipe(space, trial.params),
                           TrialAttr.DIGEST: key})  # fmt: skip
    return trial


def _identity(attrs: dict[str, Any]) -> str:
    """What makes two trials the same candidate: the architecture, and the searched recipe."""
    return f"{attrs.get(TrialAttr.DIGEST)}:{recipe_key(attrs.get(TrialAttr.RECIPE))}"


def _reused(
    study: optuna.Study,
    storage: RDBStorage,
    trial: Trial,
    space: SearchSpace,
    config: StudyConfig,
    worker: str,
) -> Outcome | None:
    """The outcome of an earlier trial of the same architecture, if there is one: an
    architecture is trained once per study (a sampler may propose it again, a worker may
    replay it, two workers may draw it together), and the repeat is not counted, so the
    budget goes to new architectures."""
    started = time.time()
    arch = space.decode(trial.params)
    key = digest(arch)
    recipe = trial_recipe(space, trial.params)
    identity = _identity({TrialAttr.DIGEST: key, TrialAttr.RECIPE: recipe})
    earlier = _same_trained(study, storage, trial, identity, config)
    if earlier is None:
        return None
    copied = {k: v for k, v in earlier.user_attrs.items() if k != LOGGED}  # its own: `_finish`
    _set_attrs(trial, copied | {TrialAttr.REUSED_FROM: earlier.number, TrialAttr.WORKER: worker})
    tags = {TrialAttr.DIGEST: key, TrialAttr.WORKER: worker, "searcher": config.searcher.type,
            TrialAttr.REUSED_FROM: earlier.number}  # fmt: skip
    if earlier.user_attrs.get(TrialAttr.OVER_CONSTRAINT):  # shown as skipped, as it was
        tags[TrialAttr.OVER_CONSTRAINT] = True
    trained = _trained_architecture(earlier, arch)
    described = summary_name(trained, float(earlier.user_attrs.get(TrialAttr.MFLOPS) or 0.0))
    params = _run_params(trained, described, space, trial.params)
    name = f"trial-{trial.number} {described} (= trial {earlier.number})"
    record = mlflow_record(params, _repeat_summary(earlier), {}, tags, {}, name, started)
    return Outcome(earlier.state, _repeated_values(trial, earlier), record)


def _repeat_summary(earlier: FrozenTrial) -> dict[str, Any]:
    """What a repeat's MLflow run records: `earlier`'s results."""
    kept = (*METRIC_ATTRS, TrialAttr.MFLOPS, TrialAttr.PARAMS, TrialAttr.LATENCY_MS)
    summary = {k: v for k, v in earlier.user_attrs.items() if k in kept}
    summary["status"] = {TrialState.COMPLETE: "complete", TrialState.PRUNED: "pruned"}.get(
        earlier.state, "failed"
    )
    summary["failure_reason"] = earlier.user_attrs.get(TrialAttr.FAILURE_REASON)
    return summary


def _trained_architecture(earlier: FrozenTrial, decoded: Architecture) -> Architecture:
    """The architecture `earlier` trained, as its file says (a repeat's own point may name
    the same network's blocks otherwise); `decoded` where the file is gone."""
    directory = earlier.user_attrs.get(TrialAttr.DIR)
    if directory and (Path(directory) / ARCHITECTURE_FILE).exists():
        return read_architecture(directory)
    return decoded


def _run_params(
    arch: Architecture, described: str, space: SearchSpace, values: dict[str, Any]
) -> dict[str, Any]:
    """A trial's MLflow params: the network (`architecture_params`), its one-line summary,
    the searcher's encodings under `space.`, and the searched recipe under `recipe.`."""
    encodings = space_params({k: values[k] for k in space.active(values)})
    recipe = {f"recipe.{k}": v for k, v in (trial_recipe(space, values) or {}).items()}
    return architecture_params(arch) | {"architecture": described} | encodings | recipe


def _repeated_values(trial: Trial, earlier: FrozenTrial) -> list[float] | None:
    """The values a repeat of `earlier` is told with: Optuna takes values only with
    COMPLETE, and gives a pruned trial the value of its last report, so a repeat of a pruned
    trial reports that one (a failed one has none)."""
    if earlier.state == TrialState.COMPLETE:
        return earlier.values
    if earlier.state == TrialState.PRUNED and earlier.last_step is not None:
        trial.report(earlier.intermediate_values[earlier.last_step], earlier.last_step)
    return None


def _same_trained(
    study: optuna.Study, storage: RDBStorage, trial: Trial, key: str, config: StudyConfig
) -> FrozenTrial | None:
    """The trial that trained candidate `key` (`_identity`), or None. One asked before
    `trial` that is still running (on another worker) is waited for; if it ends untrained
    (its worker died), `trial` trains. Waiting only on earlier trials means two workers
    never wait on each other. An earlier trial whose point is still being drawn (no digest
    yet, `_next_trial`) is waited for too, briefly: it may be the same candidate."""
    poll = DRAWING_POLL_SECONDS
    while True:
        trials = study.get_trials(deepcopy=False)
        same = [t for t in trials if t.number != trial.number and _identity(t.user_attrs) == key]
        trained = [t for t in same if _trained(t) and TrialAttr.REUSED_FROM not in t.user_attrs]
        if trained:
            return trained[0]
        earlier = [t for t in trials if t.state == TrialState.RUNNING and t.number < trial.number]
        drawing = any(TrialAttr.DIGEST not in t.user_attrs for t in earlier)
        if not drawing and not any(_identity(t.user_attrs) == key for t in earlier):
            return None
        time.sleep(poll if drawing else min(config.heartbeat_seconds, 5))
        poll = min(2 * poll, 1.0)  # a slow sampler is not read 20 times a second
        fail_stale_trials(study, storage)  # a dead worker's trial is failed, not waited on


def _trained(trial: FrozenTrial) -> bool:
    """Complete, pruned, or diverged: a result of the protocol, not of an accident."""
    reason = trial.user_attrs.get(TrialAttr.FAILURE_REASON) or ""
    return trial.state in DONE or (trial.state == TrialState.FAIL and reason.startswith("diverged"))


def log_unlogged(
    study: optuna.Study,
    config: StudyConfig,
    logger: Any,
    progress: Progress = print,
    reevaluated: Collection[str] = (),
) -> None:
    """The finished trials and recorded baselines that were never logged to the logger's
    MLflow server (the study ran without it until now, or with another server) get their
    runs: parameters, metrics and files; their learning curves were not kept. A trial's
    worker marks it with the server its record was queued for (`_finish`; a baseline's
    record keeps the list), and the outbox knows what it logged to which server, so
    nothing is logged there twice; a trial whose files are on another machine is left to
    that machine's worker. Dead trials: `_log_dead_trials`. Seed means go on their runs as
    well: those of `reevaluated` (keys of the record: this run's), and any not logged
    with these values."""
    from mlflow_server.outbox import same_server

    server, again = logger.server, logger.lost_runs()
    if again:  # the marks below say logged: the server's database is not the one they mean
        progress(f"MLflow: {redact(server)} holds none of the runs this study logged to it (its "
                 "database deleted or replaced?): logging them again")  # fmt: skip
        logger.forget_delivered()
        study.set_user_attr(StudyAttr.VIEW_RANKS, None)  # the runs' ranks, written again
    logged = logger.logged()
    if logged is None:  # an outbox from before it kept what it logged: MLflow was on
        return
    baselines = {key: attrs for key, attrs in recorded(study).items()
                 if (again or not any(same_server(s, server) for s in _servers(attrs)))
                 and f"baseline:{key}" not in logged
                 and (Path(attrs.get("dir") or "-") / METRICS_FILE).exists()}  # fmt: skip
    for key, attrs in baselines.items():
        directory = Path(attrs["dir"])
        arch, summary = read_architecture(directory), read_metrics(directory)
        record = baseline_record(key, arch, summary, {}, attrs.get("recipe"), "", None)
        # when it trained: its spec was written first, its metrics last
        record["start_time"] = (directory / ARCHITECTURE_FILE).stat().st_mtime
        record["end_time"] = (directory / METRICS_FILE).stat().st_mtime
        logger.log_baseline(key, **record)
        study.set_user_attr(RECORD_PREFIX + key, attrs | {LOGGED: [*_servers(attrs), server]})
    trials = study.get_trials(deepcopy=False)
    unlogged = [t for t in trials if t.state.is_finished() and t.params
                and (again or not same_server(t.user_attrs.get(LOGGED), server))
                and f"trial:{t.number}" not in logged
                and not t.user_attrs.get(TrialAttr.OVER_CONSTRAINT)
                and failure_reason(t) != DIED]  # fmt: skip
    records = {t.number: _finished_record(t, trials, config) for t in unlogged}
    records = {number: record for number, record in records.items() if record is not None}
    for number, record in records.items():
        logger.log_trial(number, **record)
    for key, mean in seed_means(study).items():  # status None: metrics added to the run
        name, metrics = key.removeprefix("baseline:"), reeval_metrics(mean)
        run = f"baseline:{name}" if name != key else f"trial:{key}"
        if key in reevaluated or logger.update_subject(run, metrics) not in logged:
            log = logger.log_baseline if name != key else logger.log_trial
            log(name if name != key else int(key), metrics=metrics, status=None)
    if (baselines or records) and not again:
        progress(f"MLflow: logging {len(records)} trials and {len(baselines)} baselines that "
                 "ran without it (their learning curves were not kept)")  # fmt: skip
    elif baselines or records:
        progress(f"MLflow: logged {len(records)} trials and {len(baselines)} baselines again "
                 "(their learning curves were not kept)")  # fmt: skip


def _servers(attrs: dict[str, Any]) -> list[str]:
    """The MLflow servers a baseline's record was logged to."""
    logged = attrs.get(LOGGED)
    return logged if isinstance(logged, list) else []


def _finished_record(
    trial: FrozenTrial, trials: list[FrozenTrial], config: StudyConfig
) -> dict[str, Any] | None:
    """The MLflow record a finished trial's worker would have queued, from what the study
    and the trial's files recorded; None where its files are not on this machine."""
    attrs = trial.user_attrs
    tags = {TrialAttr.WORKER: attrs.get(TrialAttr.WORKER, ""), "searcher": config.searcher.type}
    when = [t.timestamp() if t else None for t in (trial.datetime_start, trial.datetime_complete)]
    earlier = trials[attrs[TrialAttr.REUSED_FROM]] if TrialAttr.REUSED_FROM in attrs else trial
    reason = failure_reason(trial)
    status = INTERRUPTED if reason == INTERRUPTED else "failed"
    failed = {"status": status, "failure_reason": reason}
    if TrialAttr.DIR not in earlier.user_attrs:  # failed before it was costed: no files
        return mlflow_record(space_params(trial.params), failed, {}, tags, {}, None, *when)
    directory = Path(earlier.user_attrs[TrialAttr.DIR])
    if not (directory / ARCHITECTURE_FILE).exists():
        return None
    arch = read_architecture(directory)
    described = summary_name(arch, analyze(arch).flops / 1e6)
    diagram = {DIAGRAM_FILE: diagram_png(arch, f"trial {trial.number}")}
    name = f"trial-{trial.number} {described}"
    if earlier is trial and not (directory / METRICS_FILE).exists():  # stopped training
        return mlflow_record(space_params(trial.params), failed, {}, tags, diagram, name, *when)
    recipe = {f"recipe.{k}": v for k, v in (attrs.get(TrialAttr.RECIPE) or {}).items()}
    params = (architecture_params(arch) | {"architecture": described}
              | space_params(trial.params) | recipe)  # fmt: skip
    if TrialAttr.DIGEST in attrs:
        tags[TrialAttr.DIGEST] = attrs[TrialAttr.DIGEST]
    if earlier is not trial:  # as `_reused` records it, `_finish` adding the diagram
        tags[TrialAttr.REUSED_FROM] = earlier.number
        name = f"{name} (= trial {earlier.number})"
        return mlflow_record(params, _repeat_summary(earlier), {}, tags, diagram, name, *when)
    if TrialAttr.DEVICE in attrs:
        tags[TrialAttr.DEVICE] = attrs[TrialAttr.DEVICE]
    artifacts = _artifacts(directory) | diagram
    return mlflow_record(params, read_metrics(directory), {}, tags, artifacts, name, *when)


def _log_dead_trials(study: optuna.Study, logger: Any, space: SearchSpace) -> None:
    """Trials failed by missed heartbeats (their process died) get their MLflow run too."""
    for trial in study.get_trials(deepcopy=False, states=(TrialState.FAIL,)):
        if failure_reason(trial) == DIED:
            summary = {"status": "failed", "failure_reason": DIED}
            name = _untrained_run_name(trial, space)
            record = mlflow_record(space_params(trial.params), summary, {}, {}, {}, name)
            logger.log_trial(trial.number, **record)


def run_trial(
    trial: Trial,
    space: SearchSpace,
    data: StudyData,
    config: StudyConfig,
    worker: str,
) -> Outcome:
    """Cost, plan, train and record one trial (its files and attributes); the caller tells
    Optuna the outcome."""
    started = time.time()
    arch = space.decode(trial.params)
    directory = config.study_dir / "trials" / str(trial.number)
    write_architecture(directory, arch)
    costs = architecture_costs(arch, config, data.pooling_factors)
    device = device_label(config.training.device, config.training.processes)
    tags = {TrialAttr.DIGEST: digest(arch), TrialAttr.WORKER: worker, TrialAttr.DEVICE: device}
    if config.searcher.type in PHASE_SEARCHERS:  # a candidate, or the budget past them
        tags[PROPOSED_BY] = proposed_by(trial.study, config.searcher.type, tags[TrialAttr.DIGEST])
    reason = over_constraint(costs, config)
    over = {TrialAttr.OVER_CONSTRAINT: True} if reason else {}
    # which process trains it: a resumed study fails it at once once that process is gone
    process = {TrialAttr.PROCESS: identity} if (identity := process_identity()) else {}
    _set_attrs(trial, tags | costs.summary() | {TrialAttr.DIR: str(directory.resolve())} | over
               | process)  # fmt: skip
    if reason:
        result, model, sharding = TrainResult(status="pruned", failure_reason=reason), None, None
        runs: dict[str, Any] = {}
    else:
        sharding = plan_sharding(arch, config, directory, data, costs)
        recipe = trial_recipe(space, trial.params)
        result, model = _train(trial, arch, data, config, recipe)
        result, model, runs = _confirmed(trial, arch, data, config, costs, result, model, recipe)
    summary = record_result(directory, costs, sharding, result, model, runs)
    _set_attrs(trial, {k: summary.get(k) for k in (*METRIC_ATTRS, TrialAttr.FAILURE_REASON,
                                                   TrialAttr.PREDICTED_STEP_MS)})  # fmt: skip
    state, values = _outcome(result, config, costs)
    tags["searcher"] = config.searcher.type
    if reason:
        tags[TrialAttr.OVER_CONSTRAINT] = True
    described = summary_name(arch, costs.mflops)
    params = _run_params(arch, described, space, trial.params)
    record = mlflow_record(params, summary, result.curves, tags, _artifacts(directory),
                           f"trial-{trial.number} {described}", started)  # fmt: skip
    return Outcome(state, values, record)


def _set_attrs(trial: Trial, attrs: dict[str, Any]) -> None:
    set_user_attrs(trial, {key: value for key, value in attrs.items() if value is not None})


def _artifacts(directory: Path) -> dict[str, str]:
    """The trial's text files that go to its MLflow run."""
    names = (ARCHITECTURE_FILE, SHARDING_FILE, STEP_FILE, TRAINED_PLAN_FILE)
    return {name: (directory / name).read_text() for name in names if (directory / name).exists()}


def _train(
    trial: Trial,
    arch: Architecture,
    data: StudyData,
    config: StudyConfig,
    recipe: dict[str, Any] | None = None,
) -> tuple[TrainResult, RankingModel | None]:
    def report(step: int, examples: int, metrics: dict[str, float]) -> bool:
        if config.multi_objective:
            return False
        trial.report(metrics[config.objectives.metric], step)
        return trial.should_prune()

    seed = trial_seed(trial, config)
    return train_architecture(arch, data, config, seed, report, f"trial {trial.number}", recipe)


def _confirmed(
    trial: Trial,
    arch: Architecture,
    data: StudyData,
    config: StudyConfig,
    costs: Costs,
    result: TrainResult,
    model: RankingModel | None,
    recipe: dict[str, Any] | None = None,
) -> tuple[TrainResult, RankingModel | None, dict[str, Any]]:
    """With `budget.confirm_seeds`, a first run that would become the study's best is
    trained again with that many other seeds, and the trial's metrics are the mean of its
    runs (the weights: the run of best validation metric): one run's NE moves with its
    seed by about as much as architectures differ, so without it the study's best is the
    luckiest draw. Returns the result, its model and the per-seed figures (empty when one
    run decides). A seed that diverges or fails fails the trial."""
    values = _outcome(result, config, costs)[1]
    if not config.budget.confirm_seeds or values is None or not _joins_best(trial, values):
        return result, model, {}
    seed = trial_seed(trial, config)
    runs = [(seed, result, model)]
    for k in range(1, config.budget.confirm_seeds + 1):
        other = seed + CONFIRM_SEED_STRIDE * k
        label = f"trial {trial.number} seed {other}"
        again, again_model = train_architecture(arch, data, config, other, label=label,
                                                recipe=recipe)  # fmt: skip
        if again.status != "complete":
            reason = f"{again.failure_reason} (seed {other}: a confirmation run)"
            return dataclasses.replace(again, failure_reason=reason), again_model, {}
        runs.append((other, again, again_model))
    metric = config.objectives.metric
    kept_seed, kept, kept_model = min(runs, key=lambda run: run[1].validation[metric])
    results = [r for _, r, _ in runs]
    figures = {"runs": len(runs), "seeds": [s for s, _, _ in runs], "weights_seed": kept_seed,
               f"val_{metric}_runs": [r.validation[metric] for r in results],
               f"test_{metric}_runs": [r.test.get(metric) for r in results]}  # fmt: skip
    return _seed_mean(kept, results), kept_model, figures


def _joins_best(trial: Trial, values: list[float]) -> bool:
    """Whether `values` would be the study's best (on its Pareto front, with a cost): no
    other complete trial is at least as good on every objective."""
    done = trial.study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,))
    return not any(all(a <= b for a, b in zip(t.values, values, strict=True))
                   for t in done if t.number != trial.number)  # fmt: skip


def _seed_mean(kept: TrainResult, results: list[TrainResult]) -> TrainResult:
    """`kept` with every validation and test metric the mean over `results`, and the
    examples and seconds of them all."""

    def mean(split: str) -> dict[str, float]:  # every complete run has the same metrics
        return {k: statistics.fmean(getattr(r, split)[k] for r in results)
                for k in getattr(kept, split)}  # fmt: skip

    return dataclasses.replace(
        kept,
        validation=mean("validation"),
        test=mean("test"),
        examples=sum(r.examples for r in results),
        train_seconds=sum(r.train_seconds for r in results),
    )


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


def _check_links(path: str, runtime_ms: float | None, progress: Callable[[str], None]) -> None:
    """A links file no measurement wrote stops the study; one measured before the runtime's
    own cost was (an older `ranknas shard links`) is used as it is, and told."""
    from cost_models.sharding.links import read_links, unmeasured_fields

    read_links(path)
    missing = unmeasured_fields(path)
    if runtime_ms is not None:
        missing = [f for f in missing if f != "runtime_ms"]
    if missing:
        progress(f"warning: sharding.links {path} has no {', '.join(missing)} (measured by an "
                 "older `ranknas shard links`): predicted steps leave that out and come out "
                 "low; measure again with `ranknas shard links --out FILE`")  # fmt: skip


def _best_so_far(
    study: optuna.Study, config: StudyConfig, trials: list[FrozenTrial]
) -> tuple[float, str]:
    """The best value so far and its words: by NE, the trial every surface names as the
    study's best (`study_best`: seed means once re-evaluated), else the lowest run."""
    if config.objectives.metric == "ne":
        best = study_best(study)
        if best is None:
            return float("nan"), "best -"
        basis = "" if best["basis"] == "recorded runs" else f", {best['basis']}"
        return best["val_ne"], f"best: trial {best['trial']} {best['val_ne']:.4f}{basis}"
    complete = [t for t in trials if t.state == TrialState.COMPLETE]
    if not complete:
        return float("nan"), "best -"
    top = min(complete, key=lambda t: t.values[0])
    return top.values[0], f"best: trial {top.number} {top.values[0]:.4f}"


def _progress_line(
    study: optuna.Study, config: StudyConfig, record: dict, started: float,
    deadline: float | None = None,
) -> tuple[str, int, float]:  # fmt: skip
    """The line printed after a trial, with the study's done trials and best value, and the
    time left (to the budget of trials, or to `deadline` where that comes first)."""
    trials = study.get_trials(deepcopy=False)
    done = counted_trials(trials)
    best, best_words = _best_so_far(study, config, trials)
    metric = config.objectives.metric
    value = record["metrics"].get(f"val_{metric}")
    elapsed = time.monotonic() - started
    worker = record["tags"][TrialAttr.WORKER]
    mine = max(1, sum(counted(t) and t.user_attrs.get(TrialAttr.WORKER) == worker
                      for t in trials))  # fmt: skip
    left = max(0, config.budget.trials - done) * elapsed / mine
    if deadline is not None:
        left = min(left, max(0.0, deadline - time.monotonic()))
    shown = f"{value:.4f}" if value is not None else "-"
    if record["metrics"].get("runs", 1) > 1:
        shown += f" (mean of {record['metrics']['runs']} seeds)"
    if TrialAttr.OVER_CONSTRAINT in record["tags"]:
        return (
            f"[{done}/{config.budget.trials}] skipped: {record['tags']['failure_reason']}",
            done,
            best,
        )
    if TrialAttr.REUSED_FROM in record["tags"]:
        earlier = record["tags"][TrialAttr.REUSED_FROM]
        return (
            f"[{done}/{config.budget.trials}] repeat of trial {earlier} ({metric} {shown}): "
            "not trained again, not counted",
            done,
            best,
        )
    status = record["tags"]["status"]
    status += " (not counted)" if status == "failed" else ""  # `[1/5] failed` after `[1/5]`
    if status == "pruned" and value is not None:  # its last evaluation's, not a finished NE
        examples = record["metrics"].get("examples")
        shown += f" after {examples:,.0f} examples" if examples else " when pruned"
    line = (
        f"[{done}/{config.budget.trials}] {status:<8} {metric} {shown} "
        f"({best_words})  "
        f"{costs_text({'mflops': 0} | record['metrics'])}  "
        f"elapsed {elapsed:.0f}s, ~{left:.0f}s left"
    )
    return line, done, best
