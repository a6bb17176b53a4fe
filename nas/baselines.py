"""Baselines: the engineers' own models, trained inside a study exactly as its trials are.

A baseline is a preset name (`dlrm`) or an architecture file (`my_model.json`), listed under
`baselines:` in the study config or added later with `ranknas baseline add`. It is trained
with the trial protocol (data, split, budget, optimizers, seed `config.seed`) and recorded
as a study user attribute `baseline:<key>`, never as an Optuna trial: samplers do not see
it and it does not count toward the budget. Its files go to `studies/NAME/baselines/<key>/`
(the trial record's layout) and its MLflow run is nested under the study, tagged baseline.

Several workers share the work: each baseline is claimed (`baseline-claim:<key>`, beaten
like a trial's heartbeat) before it is trained, so it is trained once; a claim whose worker
died goes stale and is taken over.
"""

from __future__ import annotations

import itertools
import math
import time
from collections.abc import Callable
from typing import Any

import optuna
from optuna.distributions import CategoricalDistribution
from optuna.trial import FrozenTrial, TrialState

from nas.config import StudyConfig, baseline_key
from nas.diagram import diagram_png
from nas.leaderboard import costs_text
from nas.protocol import (
    StudyData,
    architecture_costs,
    plan_sharding,
    record_result,
    train_architecture,
)
from nas.recipe import PREFIX, base_recipe, nearest_values, recipe_of, recipe_parameters
from nas.storage import beating, open_storage, study_lock
from nas.trial_record import (
    ADDED,
    DIAGRAM_FILE,
    INTERRUPTED,
    LOGGED,
    METRIC_ATTRS,
    RECORD_PREFIX,
    architecture_params,
    mlflow_record,
    recorded,
    summary_name,
    write_architecture,
)
from search_space.architecture import Architecture, digest
from search_space.errors import RanknasError
from search_space.preset_names import PRESET_NAMES
from search_space.presets import check_before_the_data, load_architecture, preset
from search_space.schema import DatasetSchema

CLAIM_PREFIX = "baseline-claim:"


def load_baseline(name_or_file: str, schema: DatasetSchema) -> Architecture:
    try:
        return load_architecture(name_or_file, schema)
    except RanknasError as exc:
        raise RanknasError(f"baselines: {exc}") from None


def check_baseline_files(names: list[str]) -> None:
    """The baselines given as architecture files, checked as far as they can be without the
    data's schema (`unbound_problems`), before the data loads."""
    for name in names:
        try:
            check_before_the_data(name)
        except RanknasError as exc:
            raise RanknasError(f"baselines: {exc}") from None


def best_baseline(study: optuna.Study, metric: str = "ne") -> tuple[str, dict[str, Any]] | None:
    """The complete baseline of the lowest validation `metric`, with its key (one that
    failed or diverged is no base to search around, as it is not compared in the verdict)."""
    done = [(k, a) for k, a in recorded(study).items()
            if a.get(f"val_{metric}") is not None and a.get("status") == "complete"]  # fmt: skip
    return min(done, key=lambda item: item[1][f"val_{metric}"], default=None)


def train_baselines(
    study: optuna.Study,
    config: StudyConfig,
    archs: dict[str, Architecture],
    data: StudyData,
    logger: Any = None,
    progress: Callable[[str], None] = print,
    worker: str = "",
    wait: bool = False,
    added: bool = False,
) -> dict[str, dict[str, Any]]:
    """Train every baseline of `archs` (`distinct_baselines`: by key) that the study has not
    recorded (nor another worker is training); with `wait`, until all of them are recorded
    (those that other workers train included: a claim whose worker died is taken over).
    `added`: by `baseline add`, not the config (recorded: `unlisted` leaves them out).
    Returns the study's baselines."""
    before = [r.get("order", 0) for k, r in recorded(study).items() if k not in archs]
    first = max(before, default=-1) + 1  # `baseline add`: after those the study holds
    while True:
        for order, (key, arch) in enumerate(archs.items(), start=first):
            if not _claim(study, config, key):
                continue
            try:
                with beating(config.heartbeat_seconds, lambda k=key: _stamp(study, k, worker)):
                    record = _train_one(study, config, key, arch, data, order, worker,
                                        logger, progress)  # fmt: skip
            except BaseException as exc:  # a Ctrl-C or an error: the rerun trains it
                _release(study, key)
                if logger is not None and isinstance(exc, KeyboardInterrupt):
                    _log_interrupted(logger, key, worker)
                raise
            if logger is not None:
                logger.log_baseline(key, **record["mlflow"])
                record["attrs"][LOGGED] = [logger.server]
            if added:
                record["attrs"][ADDED] = True
            study.set_user_attr(RECORD_PREFIX + key, record["attrs"])
            progress(_line(key, record["attrs"]))
        found = recorded(study)
        if not wait or all(key in found for key in archs):
            return found
        time.sleep(min(config.heartbeat_seconds, 5))  # the rest are training elsewhere


def unlisted(study: optuna.Study, listed: dict[str, Architecture]) -> str | None:
    """A line naming the baselines the study trained from its config that the config no
    longer lists (`baseline add`'s are not in the config): they stay in every table and
    verdict, which a person removing one from the YAML would not expect."""
    keys = [k for k, r in recorded(study).items() if k not in listed and not r.get(ADDED)]
    if not keys:
        return None
    return (f"baselines {', '.join(keys)}: in the study (trained earlier) but not in the "
            "config's `baselines`; the study keeps them in its tables and verdicts (a study "
            "without them needs a new name)")  # fmt: skip


def _log_interrupted(logger: Any, key: str, worker: str) -> None:
    """Baseline `key`'s MLflow run (its recipe runs' parent, where it was tuned) ends KILLED,
    as an interrupted trial's does, rather than RUNNING until a rerun trains it."""
    tags = {"baseline": key, "worker": worker}
    logger.log_baseline(key, **mlflow_record({}, {"status": INTERRUPTED}, {}, tags, {}))


def distinct_baselines(
    study: optuna.Study, names: list[str], schema: DatasetSchema
) -> dict[str, Architecture]:
    """The baselines of `names` by key; refuses two architectures under one key (files of
    one stem, or a file named as a preset) in `names` or in the study's record."""
    archs: dict[str, Architecture] = {}
    sources: dict[str, str] = {}
    found = recorded(study)
    for name in names:
        key, arch = baseline_key(name), load_baseline(name, schema)
        ours, recorded_digest = digest(arch), found.get(key, {}).get("digest")
        shown_as_preset = key != name and key in PRESET_NAMES and recorded_digest != ours
        if shown_as_preset and ours != digest(preset(key, schema)):
            raise RanknasError(f"baselines: {name} would be shown as the preset {key!r} but "
                               "holds another architecture; rename the file")  # fmt: skip
        if key in archs and digest(archs[key]) != ours:
            raise RanknasError(f"baselines: {sources[key]} and {name} are both named {key!r} "
                               "but hold different architectures; rename one file")  # fmt: skip
        if recorded_digest not in (None, ours):
            raise RanknasError(
                f"baselines: the study holds baseline {key!r} with another architecture "
                f"(digest {recorded_digest}, not {ours}); rename {name}"
            )
        archs[key], sources[key] = arch, name
    return archs


def _train_one(
    study: optuna.Study,
    config: StudyConfig,
    key: str,
    arch: Architecture,
    data: StudyData,
    order: int,
    worker: str,
    logger: Any = None,
    progress: Callable[[str], None] = print,
) -> dict[str, Any]:
    started = time.time()
    directory = config.study_dir / "baselines" / key
    write_architecture(directory, arch)
    costs = architecture_costs(arch, config, data.pooling_factors)
    sharding = plan_sharding(arch, config, directory, data, costs)
    recipe, trained, tried = _tuned_recipe(config, key, arch, data, logger, progress)
    result, model = trained or train_architecture(
        arch, data, config, config.seed, label=f"baseline {key}", recipe=recipe
    )
    summary = record_result(directory, costs, sharding, result, model)
    attrs = {"name": arch.name or key, "order": order, "digest": digest(arch),
             "status": result.status, "dir": str(directory.resolve()), "seed": config.seed,
             "worker": worker,
             **costs.summary()}  # fmt: skip
    if recipe is not None:
        attrs |= {"recipe": recipe, "tuned": tried}
    attrs |= {k: summary[k] for k in METRIC_ATTRS if summary.get(k) is not None}
    if result.failure_reason:
        attrs["failure_reason"] = result.failure_reason
    record = baseline_record(key, arch, summary, result.curves, recipe, worker, started)
    return {"attrs": attrs, "mlflow": record}


def baseline_record(
    key: str,
    arch: Architecture,
    summary: dict[str, Any],
    curves: dict[str, list[tuple[int, float]]],
    recipe: dict[str, Any] | None,
    worker: str,
    started: float | None,
) -> dict[str, Any]:
    """What `StudyLogger.log_baseline` gets for baseline `key`."""
    tags = {"baseline": key, "digest": digest(arch), "worker": worker}
    artifacts = {"architecture.json": arch.to_json(),
                 DIAGRAM_FILE: diagram_png(arch, f"baseline {key}")}  # fmt: skip
    described = summary_name(arch, summary["mflops"])
    params = architecture_params(arch) | {"architecture": described}
    params |= {f"recipe.{k}": v for k, v in (recipe or {}).items()}
    return mlflow_record(params, summary, curves, tags, artifacts,
                         f"baseline-{key} {described}", started)  # fmt: skip


def tuning_study_name(study_name: str, key: str) -> str:
    """The Optuna study of baseline `key`'s recipe trials."""
    return f"{study_name}.tune.{key}"


def _tuned_recipe(
    config: StudyConfig,
    key: str,
    arch: Architecture,
    data: StudyData,
    logger: Any,
    progress: Callable[[str], None],
) -> tuple[dict[str, Any] | None, tuple[Any, Any] | None, int]:
    """With `best_baseline.tune: K`, the recipe of `key`'s best of K recipe trials (TPE over
    `training.search`, the study's own recipe first; by validation NE, seed `config.seed`),
    in an Optuna study of its own (`tuning_study_name`): resumed where it stopped, unseen
    by the architecture searcher, outside the budget; and that trial's (result, model) when
    this process trained it (the baseline's run: the same recipe and seed), else None; and
    how many recipes it tried (K, or the whole grid where it holds fewer: a recipe TPE
    draws again is replaced by one not tried yet). (None, None, 0) without tuning."""
    count = config.best_baseline.tune
    if not count:
        return None, None, 0
    searched = recipe_parameters(config.training.search)
    base = base_recipe(config.training)
    sampler = optuna.samplers.TPESampler(seed=config.seed, multivariate=True,
                                         n_startup_trials=min(count, 5))  # fmt: skip
    storage = open_storage(config.storage)
    tuning = optuna.create_study(
        study_name=tuning_study_name(config.name, key), direction="minimize", sampler=sampler,
        storage=storage, load_if_exists=True,
    )  # fmt: skip
    for stale in tuning.get_trials(deepcopy=False, states=(TrialState.RUNNING,)):
        # its process died (this baseline's claim is ours now): failed, not counted
        storage.set_trial_user_attr(stale._trial_id, "interrupted", True)
        tuning.tell(stale.number, state=TrialState.FAIL)
    if not tuning.trials:
        first = nearest_values(searched, base)
        tuning.enqueue_trial(first)
        if moved := [f"{name} {base[name]:g} as {first[PREFIX + name]:g}" for name in base
                     if PREFIX + name in first and first[PREFIX + name] != base[name]]:  # fmt: skip
            grid = f"the nearest points of training.search's grid ({', '.join(moved)})"
            progress(
                f"tuning baseline {key}: its first recipe, the study's own, is taken at {grid}"
            )
    spaces = {name: CategoricalDistribution(p.choices) for name, p in searched.items()}
    kept: dict[int, tuple[Any, Any]] = {}
    done_before = tuning.get_trials(deepcopy=False, states=(TrialState.COMPLETE,))
    best_ne = min((t.value for t in done_before), default=math.inf)  # earlier processes'
    grid = [dict(zip(searched, point, strict=True))
            for point in itertools.product(*(p.choices for p in searched.values()))]  # fmt: skip
    while len(tried := [t.params for t in _counted(tuning)]) < min(count, len(grid)):
        trial = tuning.ask(spaces)
        if trial.params in tried:  # TPE drew a recipe again: the first untried one instead
            trial.set_user_attr("repeat", True)
            tuning.tell(trial, state=TrialState.FAIL)
            tuning.enqueue_trial(next(p for p in grid if p not in tried))
            continue
        recipe = recipe_of(base, trial.params)
        trial.set_user_attr("recipe", recipe)
        started = time.time()
        position = len(tried) + 1  # counted from 1, as the log
        label = f"baseline {key} recipe {position}"
        result, model = train_architecture(arch, data, config, config.seed, recipe=recipe,
                                           label=label)  # fmt: skip
        ne = result.validation.get("ne") if result.status == "complete" else None
        if ne is not None and ne < best_ne:  # the best so far: the baseline's own run
            best_ne, kept = ne, {trial.number: (result, model)}
        tuning.tell(trial, ne, state=TrialState.COMPLETE if ne is not None else TrialState.FAIL)
        if logger is not None:
            params = {f"recipe.{k}": v for k, v in recipe.items()}
            summary = result.summary()
            logger.log_baseline_tuning(key, trial.number, **mlflow_record(
                params, summary, result.curves, {"baseline": key}, {},
                f"baseline-{key} recipe-{position}", started))  # fmt: skip
        shown = f"validation NE {ne:.4f}" if ne is not None else result.failure_reason
        progress(f"baseline {key} recipe {position}/{min(count, len(grid))}: {shown} "
                 f"({', '.join(f'{k} {v}' for k, v in recipe.items())})")  # fmt: skip
    done = [t for t in tuning.trials if t.state == TrialState.COMPLETE]
    if not done:
        return base, None, len(tried)
    best = min(done, key=lambda t: t.value)
    if logger is not None:  # which recipe run is the baseline's (a resumed tuning may move it)
        for t in done:
            logger.log_baseline_tuning(key, t.number, tags={"chosen_recipe": t is best},
                                       status=None)  # fmt: skip
    return best.user_attrs["recipe"], kept.get(best.number), len(tried)


def _counted(study: optuna.Study) -> list[FrozenTrial]:
    """A tuning study's recipe trials that count: finished, neither interrupted nor a
    recipe drawn again."""
    finished = study.get_trials(deepcopy=False, states=(TrialState.COMPLETE, TrialState.FAIL))
    return [t for t in finished if not t.user_attrs.get("interrupted")
            and not t.user_attrs.get("repeat")]  # fmt: skip


def _claim(study: optuna.Study, config: StudyConfig, key: str) -> bool:
    """Claim `key` for this process unless it is recorded or claimed by a live worker."""
    with study_lock(config.storage, config.name):
        attrs = study.user_attrs  # read from the storage: other workers' claims included
        if RECORD_PREFIX + key in attrs:
            return False
        stamp = attrs.get(CLAIM_PREFIX + key)
        if stamp and time.time() - stamp["time"] < 3 * config.heartbeat_seconds + 10:
            return False
        _stamp(study, key, "")
        return True


def _stamp(study: optuna.Study, key: str, worker: str) -> None:
    study.set_user_attr(CLAIM_PREFIX + key, {"time": time.time(), "worker": worker})


def _release(study: optuna.Study, key: str) -> None:
    """Give `key` up: a claim as old as time, which any worker takes (a live one's claim
    held it for 3 heartbeats: a rerun right after a Ctrl-C went on without the baseline)."""
    study.set_user_attr(CLAIM_PREFIX + key, {"time": 0.0, "worker": ""})


def _line(key: str, attrs: dict[str, Any]) -> str:
    ne = attrs.get("val_ne")
    shown = f"validation NE {ne:.4f}" if ne is not None else attrs.get("failure_reason", "")
    line = f"baseline {key}: {attrs['status']}, {shown}, {costs_text(attrs)}"
    if attrs.get("recipe"):  # tuned: the recipe it is compared at
        recipe = ", ".join(f"{k} {v}" for k, v in attrs["recipe"].items())
        line += f", at its best of {attrs['tuned']} recipes ({recipe})"
    return line
