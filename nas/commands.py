"""Handlers of the study, training, data and MLflow commands (the parser is in `nas.cli`)."""

from __future__ import annotations

import argparse
import json
import math
import os
import re
import sys
import time
from collections.abc import Callable
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass
from pathlib import Path
from shlex import quote
from typing import Any

from search_space.errors import RanknasError
from trainers import progress as bars

# ---------------------------------------------------------------------------- studies


def _logger(config):
    if not config.mlflow.tracking_uri:
        return None
    from mlflow_server.tracking import StudyLogger

    return StudyLogger(config.mlflow.tracking_uri, outbox_dir(config), request_timeout_s=5)


def start_study_run(logger, config, study) -> None:
    """Find or make the study's MLflow parent run, with the study's params and view (its
    seed-mean columns once it is re-evaluated: a later `search` dropped them)."""
    from nas.storage import redact
    from nas.trial_record import StudyAttr

    logger.start_study(config.name, params=config.mlflow_params(),
                       tags={"searcher": config.searcher.type},
                       experiment_name=config.mlflow_experiment,
                       reevaluated=StudyAttr.REEVALUATION in study.user_attrs)  # fmt: skip
    # `status NAME` then points to the study's view without its config
    if (uri := config.mlflow.tracking_uri) is None:
        return
    where = {"tracking_uri": redact(uri), "experiment": config.mlflow_experiment}
    if study.user_attrs.get(StudyAttr.MLFLOW) != where:
        study.set_user_attr(StudyAttr.MLFLOW, where)


def cmd_search(args: argparse.Namespace, summarize: bool = True) -> int:
    from nas.config import load_config

    config = load_config(args.config)
    if args.trials is not None:
        config.budget.trials = args.trials
    if args.no_mlflow:
        config.mlflow.tracking_uri = None
    if args.threads is not None:
        config.training.threads = args.threads
    launched = not args.one_worker and _launches_workers(config, args.workers)
    logger = _logger(config)
    ending = (nullcontext() if args.one_worker  # a launch's worker leaves it to its launcher
              else parent_run_ended_on_error(logger, config, launched))  # fmt: skip
    try:
        with ending:
            return _run_search(args, config, logger, launched, summarize)
    finally:
        if logger is not None:  # its last delivery (a forked worker runs no atexit handlers)
            logger.close()


@contextmanager
def parent_run_ended_on_error(logger, config, launched: bool = False):
    """A study's parent run in MLflow ends KILLED when the command is interrupted and
    FAILED when it stops on an error, with the best trial so far, instead of showing
    RUNNING for good. Only once this process (or, `launched`, its workers) started it: a
    mistake found first leaves a finished study's run as it was; and not while another
    worker (a `ranknas worker`, another machine) still trains one of its trials."""
    try:
        yield
    except (KeyboardInterrupt, Exception) as exc:
        if logger is not None and (logger.started or launched):
            # a storage that failed is not waited on again: the run ends without the best
            ending = ({}, {}) if storage_failure(exc) else _ending(config)
            if ending is not None:
                status = "KILLED" if isinstance(exc, KeyboardInterrupt) else "FAILED"
                logger.end_study(config.name, status, config.mlflow_experiment, *ending)
        raise


def storage_failure(exc: BaseException) -> bool:
    """Whether the study's database refused a write mid-run (Optuna's StorageInternalError;
    looked up only if optuna was imported, which it was if it raised)."""
    errors = sys.modules.get("optuna.exceptions")
    return errors is not None and isinstance(exc, errors.StorageInternalError)


def _ending(config) -> tuple[dict, dict] | None:
    """The best so far as the parent run's metrics and tags, or None while the study has a
    trial running (this process's own trials are told before it stops)."""
    from optuna.trial import TrialState

    from nas.storage import load_study

    try:
        study = load_study(config.name, config.storage)
        if study.get_trials(deepcopy=False, states=(TrialState.RUNNING,)):
            return None
        return best_fields(study)
    except Exception:  # the storage failed (the error being handled): the run just ends
        return {}, {}


def _run_search(args: argparse.Namespace, config, logger, launched: bool, summarize: bool) -> int:
    from nas import leaderboard
    from nas.storage import redact

    print(f"study {config.name!r}: {config.searcher.type} over the {config.search_space.type} "
          f"space, {config.budget.trials} trial{'s' * (config.budget.trials != 1)}, storage "
          f"{redact(config.storage)}")  # fmt: skip
    if logger is not None:
        print(f"MLflow: {redact(config.mlflow.tracking_uri)} "
              f"(experiment {config.mlflow_experiment})")  # fmt: skip
    if launched:
        study = _run_workers(args, config, logger)
    else:  # the launcher above never imports the trainer: its workers do
        from nas.runner import run_study

        study = run_study(config, logger=logger, progress=bars.write)
    if args.one_worker:  # one of a launch's workers: the launcher sums up
        if logger is not None:  # the launcher reports what waits in the shared outbox
            logger.flush(timeout_s=1)
        return 0
    table = leaderboard.rows(study)
    print()
    print(leaderboard.format_table(table[:10]))
    if leaderboard.traded_cost(study):  # a second objective: the front is the answer
        print_front(study, leaderboard.pareto_front(study))
    print_comparison(study)
    # a worker sums up too where it ends last (no trial of the study running): a study a
    # worker finished, or joined once it was done, left its parent run RUNNING, unsummed
    if table and (summarize or _ending(config) is not None):
        summarize_study(logger, study, table, config.study_dir)
    if logger is not None:
        flush(logger, config)
    if leaderboard.study_best(study) is None:  # the command would be refused
        print(f"nothing to export: {leaderboard.no_best_reason(study)}")
        return 0
    print(f"export the best: ranknas export {quote(config.name)} --storage "
          f"{quote(redact(config.storage))} --out winner/")  # fmt: skip
    return 0


def _launches_workers(config, requested: int | None) -> bool:
    """Whether this search starts worker processes (`--workers` or `workers:` above one)."""
    return (requested or config.workers.count or 0) > 1 or bool(config.workers.per_device)


def _run_workers(args: argparse.Namespace, config, logger):
    """The study run by worker processes (`nas.launch`); KeyboardInterrupt where one was
    interrupted before the budget was done."""
    from nas import launch
    from nas.cli import INTERRUPTED_EXITS, Terminated
    from nas.protocol_diff import check_settings
    from nas.storage import check_server, existing_study, load_study
    from nas.trial_record import claim_output_dir

    gpus = launch.visible_gpus() if config.training.device != "cpu" else []
    count = launch.worker_count(config, args.workers, len(gpus))
    extra = (["--trials", str(config.budget.trials)] if args.trials else []) + (
        ["--no-mlflow"] if args.no_mlflow else []
    )
    # what every worker would refuse, said once before any starts (or writes its log in
    # another study's folder): an unreachable storage, another study's output_dir, a
    # changed recipe (each worker would load the data first)
    check_server(config.storage)
    study = existing_study(config.name, config.storage)
    recorded = study.user_attrs if study is not None else None
    claim_output_dir(config, recorded)
    check_settings(recorded, config)
    codes = launch.launch(args.config, config, count, gpus, extra)
    failed = [c for c in codes if c != 0]
    interrupted = [c for c in failed if c in INTERRUPTED_EXITS]
    # a worker stopped on its own (`kill PID` of one worker: 143; killed: below 0) leaves
    # its trial to the others (retried first, or failed by its missed heartbeats)
    stopped = failed and all(c < 0 or c in interrupted for c in failed) and len(failed) < len(codes)
    if stopped and _budget_reached(config):
        print("the other workers finished the study's budget", file=sys.stderr)
    elif interrupted:  # as the workers were: a scheduler that stopped them reads 143
        raise Terminated if 143 in interrupted else KeyboardInterrupt
    elif failed:
        what = (f"was killed (signal {-failed[0]}) before the budget was done: run the same "
                "command" if stopped else "failed (above); fix what it says, then run the "
                "command")  # fmt: skip
        raise RanknasError(f"study {config.name!r}: a worker {what} again to resume")
    study = load_study(config.name, config.storage)
    if logger is not None:  # the workers made the parent run: this finds it
        start_study_run(logger, config, study)
    return study


def _budget_reached(config) -> bool:
    from nas.storage import load_study
    from nas.trial_record import counted_trials

    trials = load_study(config.name, config.storage).get_trials(deepcopy=False)
    return counted_trials(trials) >= config.budget.trials


def print_comparison(study) -> None:
    """The baselines, the verdict and the Bayes floor, as far as the study has them."""
    from nas import leaderboard

    state = leaderboard.status(study)
    if state["baselines"]:
        print("\nBaselines (trained like every trial, outside the budget):")
        print(leaderboard.format_baselines(state["baselines"]))
    if state["verdict"]:
        print(leaderboard.format_verdict(state["verdict"]))
    elif state["baselines"]:  # it printed nothing where every baseline failed
        print(leaderboard.why_no_verdict(study))
    if state["bayes_ne"]:
        print(f"Bayes-optimal validation NE of this data: {state['bayes_ne']:.4f}")


def flush(logger, config) -> None:
    """Deliver what the logger holds; say where the study's runs are compared in MLflow,
    or where what could not be delivered waits."""
    from mlflow_server.server import check_reachable, start_hint
    from nas.storage import redact

    uri = logger.tracking_uri
    pending = logger.flush(timeout_s=1)
    down = False
    try:  # a server that answers may be slow to take many records: give it time
        if pending and not logger.credentials_refused:
            check_reachable(uri, timeout_s=2)
            pending = logger.flush(timeout_s=30)
    except RanknasError:  # nobody answers: no use waiting
        down = True
    if not pending and (url := logger.view_url()):
        print(f"compare them in MLflow: {url}")
    if pending:
        outbox = outbox_dir(config)
        why = ("MLflow refused the credentials (HTTP 401/403): set MLFLOW_TRACKING_USERNAME "
               "and MLFLOW_TRACKING_PASSWORD" if logger.credentials_refused
               else f"no MLflow server answers at {redact(uri)}" if down
               else "MLflow unreachable")  # fmt: skip
        start = (f"; {start_hint(uri)} or point mlflow.tracking_uri at yours, and"
                 if down else ";")  # fmt: skip
        print(f"{why}: {pending} records kept in {outbox}{start} they are delivered by the "
              "next run of this study", file=sys.stderr)  # fmt: skip


def summarize_study(logger, study, table, folder: Path | None = None) -> None:
    """The study's summary where its users look: the note atop its optuna-dashboard page
    (the leaderboard, the best trial and the verdict; the dashboard's own "Best Trial" panel
    knows only the single runs' values), the Pareto plot in `folder` (the study's output
    directory: without MLflow it held no picture) and, with MLflow, the parent run
    (`log_summary`)."""
    from optuna_dashboard import save_note

    from nas import leaderboard

    save_note(study, leaderboard.markdown(study, table))
    plot = leaderboard.pareto_png(study)
    if folder is not None and folder.is_dir():  # not where the study's files are elsewhere
        (folder / PARETO_PLOT).write_bytes(plot)
    if logger is not None:
        log_summary(logger, study, table, plot)


PARETO_PLOT = "pareto_front.png"


def log_summary(logger, study, table, plot: bytes | None = None) -> None:
    """Leaderboard, Pareto front (CSV + PNG: `plot`, drawn here if not given), the best
    trial (`leaderboard.study_best`) and the verdict on the study's parent run (after a
    search, `reevaluate` and `baseline add`)."""
    from nas import leaderboard

    metrics, tags = best_fields(study)
    metrics["complete_trials"] = len(table)
    tags["mlflow.note.content"] = leaderboard.markdown(study, table)
    verdict = leaderboard.verdict(study)
    if verdict:
        metrics["verdict_delta_val_ne"] = verdict["delta_val_ne"]
        paired = verdict["paired"] or {}
        # the verdict's p (`leaderboard.corrected`), its single test's and the factor between;
        # NaN where this verdict has none (an earlier verdict's p stayed beside "no_win")
        for metric, key in (("verdict_p_value", "p_value"), ("verdict_p_single", "p_single"),
                            ("verdict_p_comparisons", "comparisons")):  # fmt: skip
            value = paired.get(key)
            metrics[metric] = value if value is not None else float("nan")
        tags["verdict"] = leaderboard.verdict_line(verdict)
        tags["verdict_outcome"] = verdict["outcome"]  # one word, for a script's gate
    logger.log_study_summary(
        metrics=metrics,
        artifacts={
            "leaderboard.csv": leaderboard.to_csv(
                leaderboard.with_baselines(table, leaderboard.baseline_rows(study))
            ),
            "pareto_front.csv": leaderboard.to_csv(leaderboard.pareto_front(study)),
            PARETO_PLOT: plot or leaderboard.pareto_png(study),
        }
        | _importance_artifact(study),
        tags=tags,
    )
    if leaderboard.seed_means(study):
        _log_view_ranks(logger, study)


def _log_view_ranks(logger, study) -> None:
    """Each trial's and baseline's `rank` (`leaderboard.view_ranks`) on its run, which the
    re-evaluated study's MLflow view sorts by; only the ranks that changed are written."""
    from mlflow_server.outbox import same_server
    from mlflow_server.tracking import VIEW_RANK
    from nas import leaderboard
    from nas.trial_record import StudyAttr

    # the ranks last written to this server: a rank that came back to a value it once had
    # was skipped as logged (the outbox knows values, not their order), and two runs shared it
    written = study.user_attrs.get(StudyAttr.VIEW_RANKS) or {}
    last = written.get("ranks", {}) if same_server(written.get("server"), logger.server) else {}
    ranks = leaderboard.view_ranks(study)
    for subject, rank in ranks.items():
        if last.get(subject) == rank:
            continue
        kind, _, name = subject.partition(":")
        if kind == "trial":
            logger.log_trial(int(name), metrics={VIEW_RANK: rank}, status=None)
        else:
            logger.log_baseline(name, metrics={VIEW_RANK: rank}, status=None)
    study.set_user_attr(StudyAttr.VIEW_RANKS, {"server": logger.server, "ranks": ranks})


def best_fields(study) -> tuple[dict[str, float], dict[str, str]]:
    """The study's best (`leaderboard.study_best`) as the parent run's metrics and tags;
    empty while no trial is complete; NaN and "none" where its complete trials name none
    (every finalist diverged), over an earlier best the run would show on."""
    from nas import leaderboard

    best = leaderboard.study_best(study)
    if best is None and leaderboard.no_best_reason(study) == leaderboard.EVERY_FINALIST_DIVERGED:
        nan = float("nan")
        return {"best_val_ne": nan, "best_test_ne": nan, "best_mflops": nan}, {
            "best_trial": "none", "best_digest": "none", "best_basis": "none",
            "best": f"none: {leaderboard.EVERY_FINALIST_DIVERGED}"}  # fmt: skip
    if best is None:
        return {}, {}
    metrics = {
        "best_val_ne": best["val_ne"],
        "best_test_ne": best["test_ne"] if best["test_ne"] is not None else float("nan"),
        "best_mflops": best["mflops"],
    }
    if best.get("step_ms") is not None:  # a study that predicts the step on its cluster
        metrics["best_step_ms"] = best["step_ms"]
    tags = {"best_trial": str(best["trial"]), "best_digest": best["digest"],
            "best_basis": best["basis"], "best": leaderboard.describe_best(best)}  # fmt: skip
    return metrics, tags


def _importance_artifact(study) -> dict[str, str]:
    """The around base's feature importance (`nas.feature_screen`), where it was measured."""
    from nas.trial_record import StudyAttr

    found = study.user_attrs.get(StudyAttr.FEATURE_IMPORTANCE)
    return {"feature_importance.json": json.dumps(found, indent=2)} if found else {}


def cmd_worker(args: argparse.Namespace) -> int:
    """`search` for a study that a `search` started: a worker never creates one (a typo in
    the name would start a separate study), and sums the study up only where it ends last."""
    from nas.config import load_config
    from nas.storage import StudyNotFound, load_study

    config = load_config(args.config)
    deadline = time.monotonic() + args.wait
    said = False
    while True:
        try:
            load_study(config.name, config.storage)
            break
        except StudyNotFound as exc:  # not yet; a storage that does not answer is said now
            if time.monotonic() >= deadline:
                then = "" if args.wait else " (--wait SECONDS waits for it)"
                raise RanknasError(f"{args.config}: a worker joins a started study{then}: "
                                   f"{exc}") from None  # fmt: skip
        if not said:
            print(f"waiting up to {args.wait:g} s for `ranknas search` to create study "
                  f"{config.name!r}")  # fmt: skip
            said = True
        time.sleep(min(5.0, max(0.0, deadline - time.monotonic())))
    return cmd_search(args, summarize=False)


def _study_config(args: argparse.Namespace):
    """The study YAML `args.study` names, parsed (its model files need not be found from
    here: only the study's records are read); None when it names a study."""
    if not args.study.endswith((".yaml", ".yml")):
        return None
    from nas.config import load_config

    return load_config(args.study, check_files=False)


def _study(args: argparse.Namespace, config=None):
    """The study named by `args.study`: a study name (in `--storage`), or a study YAML
    (`config`, if already parsed), whose name and storage (unless `--storage` is given)
    are then used."""
    from nas.defaults import DEFAULT_STORAGE
    from nas.storage import load_study

    config = config or _study_config(args)
    if config is not None:
        return load_study(config.name, args.storage or config.storage)
    return load_study(args.study, args.storage or DEFAULT_STORAGE)


def cmd_status(args: argparse.Namespace) -> int:
    from nas import leaderboard
    from nas.config import baseline_key
    from nas.trial_record import duration_text, mflops_text

    config = _study_config(args)
    state = leaderboard.status(_study(args, config))
    state["mlflow_records_waiting"] = _records_waiting(config)
    if args.json:
        print(strict_json(state))
        return 0
    # WAITING: starting points queued when the study began and not run (yet, or at all:
    # the budget was reached first)
    budget = state["budget_trials"]
    spent = bool(budget) and state["counted"] >= budget
    words = {"waiting": "queued point{s} left untrained (the budget was reached first)" if spent
             else "queued trial{s} not run yet"}  # fmt: skip
    counts = ", ".join(f"{n} {words.get(k, k).format(s='s' * (n != 1))}"
                       for k, n in state["trials"].items() if n)  # fmt: skip
    said = f"budget {budget}" if budget else "its search has not started: run `ranknas search`"
    print(f"study {state['study']}: {counts or 'no trials'} ({said})")
    if budget and config is not None and config.budget.trials != budget:  # the YAML edited
        print(f"the config's budget.trials is {config.budget.trials}: " + (
            "`ranknas search` runs up to it" if config.budget.trials > budget else
            f"`ranknas search` with it stops once {config.budget.trials} are counted (the "
            "budget above is the largest a search gave the study)"))  # fmt: skip
    if state["time_limited"]:
        limited = state["time_limited"]
        print(f"its last search stopped at budget.time_limit_minutes "
              f"({duration_text(limited['minutes'])}) with {limited['counted']} trials counted: "
              "`ranknas search` goes on")  # fmt: skip
    if state["exhausted"]:  # said by the search that ended; `status` is asked days later
        print(f"its last search ended before the budget: the searcher proposed "
              f"{state['repeats']} architectures it had proposed before (the space, or what "
              "fits under the study's ceilings, holds few new ones; `ranknas search` says "
              "which)")  # fmt: skip
    numbers = {k: v for k, v in (state["ceilings"] or {}).items()
               if isinstance(v, int | float) and not isinstance(v, bool)}  # fmt: skip
    if numbers:  # a named one (best_baseline, base) has its own line below
        print("ceilings: " + ", ".join(f"objectives.{k} {v:g}" for k, v in numbers.items())
              + "; skipped trials were above them and not trained")  # fmt: skip
    if state["stopped_on_ceilings"]:
        print(f"its last search stopped: {state['skipped']} sampled architectures were above "
              "its ceilings and too few fitted; loosen them in a new study (`name:`), or "
              "search a space of smaller architectures")  # fmt: skip
    bases = state["baselines"]
    done = any(b["state"] == "complete" for b in bases)
    if done and not counts:  # stopped while training them (or still): the search comes after
        print("baselines: " + ", ".join(f"{b['baseline']} {b['state']}" for b in bases))
    if bases and not done:  # what stopped the search
        from nas.storage import redact

        storage = f" --storage {quote(redact(args.storage))}" if args.storage else ""
        print(f"baselines: {len(bases)} recorded, none complete ("
              f"{', '.join(b['baseline'] for b in bases)}; `ranknas leaderboard {quote(args.study)}"
              f"{storage}` says why)")  # fmt: skip
    if state["around_base"]:  # by its key, as every other line (the study keeps its file)
        print(f"searched around the best baseline: {baseline_key(state['around_base'])}")
    if state["feature_importance"]:
        from nas.feature_screen import describe

        print(f"features: {describe(state['feature_importance'])}")
    if state["mflops_ceiling"]:
        c = state["mflops_ceiling"]
        print(f"MFLOPs ceiling: {mflops_text(c['mflops'])} ({c['of']}'s); skipped "
              "trials were above it and not trained")  # fmt: skip
    if state["step_ms_ceiling"]:
        c = state["step_ms_ceiling"]
        print(f"step time ceiling: {c['step_ms']:.3f} ms predicted ({c['of']}'s); skipped "
              "trials were above it and not trained")  # fmt: skip
    if state["devices"]:
        print("trained on: " + ", ".join(f"{d}: {n} trial{'s' if n != 1 else ''}"
                                         for d, n in state["devices"].items()))  # fmt: skip
    if state["running"]:
        gone = (" (its worker, a process of this machine, is gone: the next `ranknas search` "
                "fails it and retries it)")  # fmt: skip
        print("running: " + ", ".join(f"trial {r['trial']} on {r['device'] or '?'}"
                                      f"{gone if r['worker_gone'] else ''}"
                                      for r in state["running"]))  # fmt: skip
    if state["best"] is not None:
        print(f"best so far: {leaderboard.describe_best(state['best'])}")
    elif state["trials"]["complete"]:
        print(f"best: none: {leaderboard.EVERY_FINALIST_DIVERGED}")  # `no_best_reason`'s
    if pending := state["confirmation_pending"]:
        print(f"not counted yet: {pending} run{'s' * (pending != 1)} of a confirmation that has "
              "not finished (`ranknas confirm`): running now, or interrupted; then run it again "
              "to finish it (it reuses them)")  # fmt: skip
    if pending := state["reevaluation_pending"]:
        print(f"not counted yet: {pending} run{'s' * (pending != 1)} of a re-evaluation "
              "that has not finished (`ranknas reevaluate`, or a search's best-baseline seeds): "
              "running now, or interrupted; then run that command again to finish it (it "
              "reuses them)")  # fmt: skip
    if state["verdict"]:
        print(leaderboard.format_verdict(state["verdict"]))
    view = _view_url(config, state)
    if view:
        print(f"compare them in MLflow: {view}")
    if waiting := state.get("mlflow_records_waiting"):
        print(f"MLflow: {waiting} record{'s' * (waiting != 1)} of this study wait in "
              f"{outbox_dir(config)} for a server; a running command of the study delivers "
              f"them once it answers, else its next run (`ranknas search {quote(args.study)}` "
              "trains nothing where the budget is met)")  # fmt: skip
    return 0


def outbox_dir(config) -> Path:
    """Where the MLflow records of `config`'s study wait until a server takes them."""
    return config.study_dir / "mlflow-outbox"


def _records_waiting(config) -> int | None:
    """The study's MLflow records not delivered yet (None without its config, which says
    where its outbox is)."""
    from mlflow_server.outbox import waiting_records

    return None if config is None else waiting_records(outbox_dir(config))


def _view_url(config, state: dict[str, Any]) -> str | None:
    """The study's view in the MLflow UI when its server (the config's, or the one its
    search logged to) answers and holds the experiment; None otherwise (status works
    without MLflow)."""
    logged = state.get("mlflow") or {}
    uri = config.mlflow.tracking_uri if config is not None else logged.get("tracking_uri")
    experiment_name = config.mlflow_experiment if config is not None else logged.get("experiment")
    if not uri or not experiment_name:
        return None
    from mlflow_server.server import check_reachable

    try:
        check_reachable(uri, timeout_s=2)  # before MLflow's client, whose import takes seconds
    except Exception:  # down, or no URI at all: status says what it knows
        return None
    from mlflow import MlflowClient

    from mlflow_server.tracking import study_view_url

    try:
        experiment = MlflowClient(uri).get_experiment_by_name(experiment_name)
    except Exception:  # down, refused, or another server: status says what it knows
        return None
    return study_view_url(uri, experiment.experiment_id, state["study"]) if experiment else None


def strict_json(value: Any) -> str:
    """JSON that every parser reads: a nan or inf (a seed mean whose run went nan/inf) is
    written null, not as Python's `Infinity`, which jq and JSON.parse refuse."""

    def plain(item: Any) -> Any:
        if isinstance(item, float) and not math.isfinite(item):
            return None
        if isinstance(item, dict):
            return {key: plain(v) for key, v in item.items()}
        if isinstance(item, list | tuple):
            return [plain(v) for v in item]
        return item

    return json.dumps(plain(value), indent=2, allow_nan=False)


def cmd_leaderboard(args: argparse.Namespace) -> int:
    from nas import leaderboard

    study = _study(args)
    table = leaderboard.rows(study, include_all=args.all)[: args.top]
    front = leaderboard.pareto_front(study)
    bases = leaderboard.baseline_rows(study)
    if args.json:
        # `best` as `status --json` has it: a script reads the same field from both
        print(strict_json({"leaderboard": table, "best": leaderboard.study_best(study),
                           "pareto_front": front, "baselines": bases,
                           "verdict": leaderboard.verdict(study)}))  # fmt: skip
    elif args.csv:
        print(leaderboard.to_csv(leaderboard.with_baselines(table, bases)), end="")
    else:
        print(leaderboard.format_table(table))
        print_front(study, front)
        print_comparison(study)
    return 0


def print_front(study, front: list[dict]) -> None:
    """The Pareto front of validation NE against the study's cost (else MFLOPs)."""
    from nas import leaderboard

    cost = leaderboard.COST_UNITS[leaderboard.cost_key(study)]
    meaned = any(r["mean_val_ne"] is not None for r in front)
    ne = "validation NE, seed means where re-evaluated," if meaned else "validation NE"
    print(f"\nPareto front ({ne} vs {cost}):")
    print(leaderboard.format_table(front))


def cmd_dashboard(args: argparse.Namespace) -> int:
    """Serve optuna-dashboard on a study storage until interrupted (loopback by default)."""
    from optuna_dashboard import run_server

    from mlflow_server.server import check_port_free
    from nas.defaults import DEFAULT_STORAGE
    from nas.storage import check_exists, open_storage, redact

    storage = args.config or DEFAULT_STORAGE
    if args.config and args.config.endswith((".yaml", ".yml")):
        from nas.config import load_config

        storage = load_config(args.config, check_files=False).storage
    check_exists(storage)
    check_port_free(args.host, args.port, zero_picks=False)
    print(f"optuna-dashboard for {redact(storage)} at http://{args.host}:{args.port} "
          "(Ctrl-C stops it)", flush=True)  # fmt: skip
    run_server(open_storage(storage), host=args.host, port=args.port)
    return 0


def _not_held(found: dict[str, Any], baselines: dict[str, Any]) -> dict[str, Any]:
    """`baselines` less those whose architecture the study's baselines `found` hold under
    another name (trained again, it would be compared with itself), saying so; one it holds
    under its own name is said, and its record kept."""
    from search_space.architecture import digest

    held = {record.get("digest"): key for key, record in found.items()
            if record.get("status") == "complete"}  # fmt: skip
    kept = {}
    for key, arch in baselines.items():
        other = held.setdefault(digest(arch), key)  # one name an architecture, this run's too
        if other == key and key in found:
            print(f"baseline {key}: recorded already, not trained again")
        elif other != key:
            print(f"baseline {key}: the architecture of baseline {other} (digest "
                  f"{digest(arch)}), not added: the study compares it as {other}")  # fmt: skip
            continue
        kept[key] = arch
    return kept


def cmd_baseline_add(args: argparse.Namespace) -> int:
    import torch

    from nas.baselines import distinct_baselines, recorded, train_baselines
    from nas.config import load_config
    from nas.protocol import check_protocol, prepare_data
    from nas.protocol_diff import check_settings
    from nas.storage import load_study, study_lock
    from nas.trial_record import claim_output_dir, own_output_dir
    from search_space.preset_names import unknown_architecture
    from search_space.presets import check_before_the_data

    config = load_config(args.config)
    if args.no_mlflow:
        config.mlflow.tracking_uri = None
    problems = [p for p in map(unknown_architecture, args.baselines) if p]
    if problems:  # said before the data loads (minutes on a large log)
        raise RanknasError("baselines: " + "; ".join(problems))
    for name in args.baselines:  # a file's spec too (its fit to the data is checked after)
        check_before_the_data(name)
    study = load_study(config.name, config.storage)
    check_settings(study.user_attrs, config)  # before the data, which can take minutes
    torch.set_num_threads(config.training.threads)
    data = prepare_data(config)
    check_protocol(study, config, data)
    # a wrong name or file, or another model under a recorded name, stops it before the
    # study's MLflow run is touched
    found = recorded(study)
    baselines = _not_held(found, distinct_baselines(study, args.baselines, data.train.schema))
    with study_lock(config.storage, config.name):
        own_output_dir(config, study, claim_output_dir(config, study.user_attrs))
    logger = _logger(config)
    if logger is not None:
        start_study_run(logger, config, study)
    new = [key for key in baselines if key not in found]
    if new:
        print(f"study {config.name!r}: training {', '.join(new)} as the study trains a trial")
    with parent_run_ended_on_error(logger, config):
        train_baselines(study, config, baselines, data, logger, bars.write, added=True)
    if logger is not None:
        from nas.runner import log_unlogged

        log_unlogged(study, config, logger, bars.write)
    print_comparison(study)
    from nas import leaderboard

    table = leaderboard.rows(study)
    if table:
        summarize_study(logger, study, table, config.study_dir)
    if logger is not None:
        flush(logger, config)
    return 0


def log_reevaluation(logger, study, table: list[dict], config) -> None:
    """Each retrained trial's mean and spread on its nested run, with the runs of trials
    and baselines that ran without MLflow and seed means never logged (`log_unlogged`),
    and the table on the study's parent run (whose summary, `summarize_study`, then moves
    to the seed means)."""
    from nas import leaderboard
    from nas.runner import log_unlogged

    start_study_run(logger, config, study)  # re-evaluated: the seed means' columns
    log_unlogged(study, config, logger, bars.write, {str(row["trial"]) for row in table})
    logger.log_study_summary(artifacts={"reevaluation.csv": leaderboard.to_csv(table)})


def cmd_reevaluate(args: argparse.Namespace) -> int:
    from nas import leaderboard
    from nas.config import load_config
    from nas.reevaluate import reevaluate_study
    from nas.storage import redact

    config = load_config(args.config)
    if args.no_mlflow:
        config.mlflow.tracking_uri = None
    which = "every baseline" if args.baselines is None else f"the top {args.baselines} baselines"
    front = ", the Pareto front's trials cheaper than the best baseline" if args.front else ""
    trials = f"the top {args.top} trial{'s' * (args.top != 1)}"
    print(f"study {config.name!r}: re-evaluating {trials}{front} and {which} "
          f"with {args.seeds} fresh seed{'s' if args.seeds != 1 else ''} each")  # fmt: skip
    table = reevaluate_study(config, args.top, args.seeds, bars.write, args.baselines,
                             args.front)  # fmt: skip
    study = _report_round(config, table, lambda logger, study: log_reevaluation(
        logger, study, table, config))  # fmt: skip
    best = leaderboard.study_best(study)
    reason = None if best else leaderboard.no_best_reason(study)
    print(f"best: {leaderboard.describe_best(best) if best else f'none: {reason}'}")
    if hint := export_hint(study, redact(config.storage)):
        print(hint)
    return 0


def cmd_confirm(args: argparse.Namespace) -> int:
    from nas import leaderboard
    from nas.config import load_config
    from nas.reevaluate import confirm_study

    config = load_config(args.config)
    if args.no_mlflow:
        config.mlflow.tracking_uri = None
    print(f"study {config.name!r}: confirming the verdict's pair on {args.seeds} seeds each "
          "(those recorded reused)")  # fmt: skip
    table = confirm_study(config, args.seeds, bars.write)

    def log(logger, study) -> None:
        start_study_run(logger, config, study)
        logger.log_study_summary(artifacts={"confirmation.csv": leaderboard.to_csv(table)})

    _report_round(config, table, log)
    return 0


def _report_round(config, table: list[dict], log: Callable[[Any, Any], None]):
    """After a round of retrains (`reevaluate`, `confirm`): its table, its MLflow record
    (`log(logger, study)`, with MLflow on), the study's summary and comparison; the study."""
    from nas import leaderboard
    from nas.storage import load_study

    print()
    print(leaderboard.format_reevaluation(table))
    study = load_study(config.name, config.storage)
    logger = _logger(config)
    if logger is not None:
        log(logger, study)
    summarize_study(logger, study, leaderboard.rows(study), config.study_dir)
    if logger is not None:
        flush(logger, config)
    print_comparison(study)
    return study


def export_hint(study, storage: str) -> str:
    """The `export` command for the study's best trial, and for the baseline where the
    verdict says it wins (the model to ship then). Not into `winner/`: the search's own
    line had the first best exported there (refused again)."""
    from nas import leaderboard

    best = leaderboard.study_best(study)
    command = f"ranknas export {quote(study.study_name)} --storage {quote(storage)}"
    lines = []  # none where every finalist diverged: no trial to ship
    if best is not None:
        trial = best["trial"]
        lines.append(f"export it: {command} --trial {trial} --out winner-trial-{trial}/")
    v = leaderboard.verdict(study)
    if v and v.get("outcome") == "baseline_wins":
        key = v["best_baseline"]["baseline"]
        out = quote(f"winner-baseline-{key}/")
        lines.append(f"the verdict: baseline {key} wins; to ship it: {command} --trial "
                     f"{quote(BASELINE_PREFIX + key)} --out {out}")  # fmt: skip
    return "\n".join(lines)


def cmd_export(args: argparse.Namespace) -> int:
    from nas import leaderboard
    from nas.trial_record import (
        WEIGHTS_FILE,
        StudyAttr,
        read_architecture,
        read_metrics,
        read_sharding,
        read_step,
    )

    config = _study_config(args)
    study = _study(args, config)
    source = _export_source(study, args.trial, args.force)
    if not (source.directory / WEIGHTS_FILE).exists():  # said before torch is loaded
        raise RanknasError(_weights_elsewhere(source, source.directory / WEIGHTS_FILE))
    from nas.export import EXPERIMENT, check_out_dir, export_model  # torch from here on
    from nas.storage import redact
    from search_space.schema import DatasetSchema
    from trainers.data.criteo import dense_transforms

    weights = _trial_weights(source.label, source.directory)
    check_out_dir(Path(args.out), _study_dirs(study, config), args.force, weights)
    registered = None if args.register else _registered_in_card(Path(args.out))
    tracking_uri = _export_tracking_uri(args.tracking_uri, config) if args.register else None
    best = leaderboard.study_best(study)
    is_best = best is not None and source.trial is not None and best["trial"] == source.trial
    alias = args.alias or ("champion" if is_best else None)
    arch = read_architecture(source.directory, source.digest, source.label)
    metrics = read_metrics(source.directory)
    schema = study.user_attrs.get(StudyAttr.SCHEMA)
    preprocessing = study.user_attrs.get(StudyAttr.PREPROCESSING) or {}
    if schema and schema.get("name") == "criteo":  # one recorded before 2026-12-07 lacks
        known = preprocessing.get("vocabulary") or {}  # these: the reader's own, as here
        preprocessing = preprocessing | {"dense": preprocessing.get("dense") or dense_transforms()}
        if "hex_ids" not in preprocessing and known:  # every column through its vocabulary
            preprocessing["hex_ids"] = dict.fromkeys(known)
        if "hex_ids" not in preprocessing:  # hashed, or the whole file's ids: unknown here
            print(f"warning: {source.label}'s exported (and registered) model takes the "
                  "Criteo reader's ids, not the file's hex values: run the study's `search` "
                  "again (it records how), then export", file=sys.stderr)  # fmt: skip
    source_run = _source_run(tracking_uri, study.study_name, source.run_tags,
                             config.mlflow_experiment if config else None)  # fmt: skip
    result = export_model(
        arch,
        weights,
        metrics,
        Path(args.out),
        schema=DatasetSchema.from_dict(schema) if schema else None,
        preprocessing=preprocessing,
        register=args.register,
        tracking_uri=tracking_uri,
        alias=alias,
        provenance=_provenance(study, source, metrics),
        source_run_id=source_run,
        step=read_step(source.directory),
        title=f"{study.study_name} {source.label}",
        plan=read_sharding(source.directory),
    )
    print(f"exported {source.label} (digest {result.digest}) to {args.out}")
    if args.register and source_run is None:
        print(f"{source.label} has no run on {redact(tracking_uri)} (the study did not "
              f"log there): the model was logged in a run of the experiment {EXPERIMENT!r}; "
              "`ranknas search` or `reevaluate` with MLflow on logs the study's runs")  # fmt: skip
    if result.reused_version:
        points = f"@{result.alias} points at it" if result.alias else "no alias moved"
        print(f"{result.model_name} version {result.model_version} holds this model already: "
              f"no new version; {points}")  # fmt: skip
    elif args.register and result.alias:
        print(f"registered {result.model_name} version {result.model_version} as @{result.alias}")
    elif args.register:
        print(f"registered {result.model_name} version {result.model_version}, no alias: "
              f"{source.label} is not the study's best (--alias NAME sets one); load it as "
              f"{result.model_uri}")  # fmt: skip
    if registered:
        print(f"the model card no longer says the model is registered as {registered!r} "
              f"(the card it replaced did): add --register {registered} to say it again (no "
              "new version if it is the same model)", file=sys.stderr)  # fmt: skip
    return 0


@dataclass(frozen=True)
class _Exported:
    """What `export` writes out: a trial or a baseline, as the study recorded it."""

    label: str  # "trial 15", "baseline dcnv2": how messages and the card name it
    directory: Path
    digest: str | None
    recipe: dict[str, Any]  # its own recipe, where it differs from the study's
    mean_key: str  # its key in `leaderboard.seed_means`
    run_tags: tuple[dict[str, str], ...]  # its MLflow run's tags, the likeliest first
    trial: int | None = None  # a trial's number
    worker: str | None = None  # host:pid of the worker that trained it, where recorded

    @classmethod
    def of_trial(cls, trial) -> _Exported:
        from nas.trial_record import TrialAttr

        number, attrs = trial.number, trial.user_attrs
        tags = tuple(
            {"ranknas.kind": kind, "ranknas.trial": str(number)} for kind in ("trial", "repeat")
        )  # not a baseline's recipe runs: tuning
        return cls(f"trial {number}", Path(attrs.get(TrialAttr.DIR, "")),
                   attrs.get(TrialAttr.DIGEST), attrs.get("recipe", {}), str(number), tags,
                   number, attrs.get(TrialAttr.WORKER))  # fmt: skip


BASELINE_PREFIX = "baseline:"  # `export --trial baseline:KEY`


def _export_source(study, which: str, force: bool) -> _Exported:
    """`--trial`'s model: a trial (`leaderboard.best_trial`) or `baseline:KEY`, a baseline
    at its recorded run (its tuned recipe, the study's seed)."""
    from nas import leaderboard
    from nas.trial_record import recorded

    if not which.startswith(BASELINE_PREFIX):
        return _Exported.of_trial(leaderboard.best_trial(study, which, force=force))
    key, found = which.removeprefix(BASELINE_PREFIX), recorded(study)
    if key not in found:
        known = ", ".join(BASELINE_PREFIX + k for k in found) or "none recorded"
        raise RanknasError(f"--trial {which}: the study has no baseline {key!r} ({known}; "
                           "`ranknas status` lists them)")  # fmt: skip
    attrs = found[key]
    leaderboard.check_exportable(f"baseline {key}", attrs.get("status"),
                                 attrs.get("failure_reason") or "", force)  # fmt: skip
    tags = ({"ranknas.kind": "baseline", "ranknas.baseline": key},)
    return _Exported(f"baseline {key}", Path(attrs.get("dir", "")), attrs.get("digest"),
                     attrs.get("recipe") or {}, BASELINE_PREFIX + key, tags,
                     worker=attrs.get("worker") or None)  # fmt: skip


def _registered_in_card(out: Path) -> str | None:
    """The registered model the card in `out` names, if any: an export without
    `--register` writes a card without it."""
    from nas.export.layout import CARD_FILE
    from nas.export.model_card import REGISTERED_AS

    try:
        card = (out / CARD_FILE).read_text()
    except (OSError, UnicodeDecodeError):
        return None
    found = re.search(rf"{REGISTERED_AS} (?:a version of )?`([^`]+)`", card)
    return found.group(1) if found else None


def _weights_elsewhere(source: _Exported, path: Path) -> str:
    """A model's weights stay where its worker wrote them: say where, and what to do."""
    from nas.trial_record import trained_here

    if trained_here(source.worker) and not source.directory.is_dir():
        return (f"{source.label}: its folder {source.directory} is gone (deleted or moved?): "
                "put it back to export it, or export another model")  # fmt: skip
    by = f" by worker {source.worker}" if source.worker else ""
    return (f"{source.label}: weights not found at {path} (trained{by}); export on "
            "the machine that trained it, or give every worker an output_dir on a shared "
            "file system")  # fmt: skip


def _study_dirs(study, config) -> set[Path]:
    """Where the study keeps its records: its output directory, as its config names it and
    as its trials recorded it (`output_dir/NAME/trials/N`)."""
    from nas.trial_record import TrialAttr

    recorded = (t.user_attrs.get(TrialAttr.DIR) for t in study.get_trials(deepcopy=False))
    dirs = {Path(d).parent.parent for d in recorded if d}
    return dirs | ({config.study_dir} if config is not None else set())


def _trial_weights(label: str, trial_dir: Path) -> dict:
    """The recorded weights of `label` ("trial 3"); a missing or damaged file is a user
    error."""
    from safetensors import SafetensorError

    from nas.trial_record import WEIGHTS_FILE, read_weights

    weights = trial_dir / WEIGHTS_FILE
    if not weights.exists():
        raise RanknasError(f"{label}: weights not found at {weights}")
    try:
        return read_weights(weights)
    except (SafetensorError, OSError) as exc:
        raise RanknasError(f"{label}: cannot read the weights {weights} ({exc}): the "
                           "file is damaged; export another trial, or train this "
                           "architecture again") from None  # fmt: skip


def _provenance(study, source: _Exported, metrics: dict) -> dict:
    """Where the model comes from, for its card: study, trial (or baseline), date, recipe,
    floor, baselines."""
    from datetime import UTC, datetime

    from nas import leaderboard

    kind, name = source.label.split(" ", 1)
    out = {"study": study.study_name, kind: source.trial if source.trial is not None else name,
           "exported": datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC")}  # fmt: skip
    out |= {k: metrics[k] for k in ("examples", "steps", "restored_step") if metrics.get(k)}
    recipe = (study.user_attrs.get("training_recipe") or {}) | source.recipe
    recipe.pop("search", None)  # the space the recipe was drawn from, not the recipe
    if recipe:
        out["training recipe"] = ", ".join(f"{k} {v}" for k, v in recipe.items() if v is not None)
    bayes = study.user_attrs.get("bayes_ne")
    if bayes:
        out["Bayes-optimal validation NE"] = bayes
    best = leaderboard.study_best(study)  # None when no trial is complete (a forced export)
    if best is not None:  # a card read alone says whether this model is the study's best
        shown = leaderboard.describe_best(best)
        out["the study's best"] = shown if best["trial"] == source.trial else (
            f"not this trial: {shown}")  # fmt: skip
    means = leaderboard.seed_means(study)
    own = means.get(source.mean_key)
    if own:  # beside its recorded run, as the baselines' below
        test = f" / {own['test_ne']:.4f}" if own["test_ne"] is not None else ""
        out["this trial's val / test NE, mean over its seeds"] = (
            f"{own['val_ne']:.4f}{test} ({leaderboard.seeds_said(own)})")  # fmt: skip
    verdict = leaderboard.verdict(study)
    if verdict:
        # every line `status` prints: who wins, the baselines' recipes, the seeds' test
        out["verdict"] = leaderboard.verdict_line(verdict)
    for base in leaderboard.baseline_rows(study):
        if base["val_ne"] is not None:
            value = f"{base['val_ne']:.4f} / {base['test_ne']:.4f} (its recorded run)"
            mean = means.get(f"baseline:{base['baseline']}")
            if mean and mean["test_ne"] is not None:
                value += (f"; mean over {leaderboard.seeds_said(mean)} {mean['val_ne']:.4f} "
                          f"/ {mean['test_ne']:.4f}")  # fmt: skip
            out[f"baseline {base['baseline']} val / test NE"] = value
    return out


def _export_tracking_uri(given: str | None, config) -> str:
    """Where `export --register` registers: --tracking-uri, else the study config's
    mlflow.tracking_uri, else $MLFLOW_TRACKING_URI, else the default server; checked to
    answer before anything is written."""
    from mlflow_server.server import check_reachable
    from nas.defaults import DEFAULT_TRACKING_URI

    if given is None and config is not None:
        given = config.mlflow.tracking_uri
    uri = given or os.environ.get("MLFLOW_TRACKING_URI") or DEFAULT_TRACKING_URI
    check_reachable(uri)
    return uri


def _source_run(
    tracking_uri: str | None,
    study: str,
    run_tags: tuple[dict[str, str], ...],
    experiment_name: str | None,
) -> str | None:
    """The exported model's own MLflow run (`_Exported.run_tags`), if the server has it (the
    registered version's source); without the study's config (`experiment_name` None) it is
    looked for in every experiment, since the config may name one."""
    if not tracking_uri:
        return None
    try:
        from mlflow import MlflowClient

        client = MlflowClient(tracking_uri)
        if experiment_name is None:
            ids = [e.experiment_id for e in client.search_experiments()]
        else:
            experiment = client.get_experiment_by_name(experiment_name)
            ids = [experiment.experiment_id] if experiment is not None else []
        if not ids:
            return None
        filters = [" and ".join(f"tags.`{k}` = '{v}'" for k, v in ({"ranknas.study": study}
                                                                  | tags).items())
                   for tags in run_tags]  # fmt: skip
        runs = [run for where in filters for run in client.search_runs(ids, where)]
    except Exception:  # unreachable or refused: register from a new run instead
        return None
    return runs[0].info.run_id if runs else None


# ---------------------------------------------------------------------------- MLflow


def _server_config(args: argparse.Namespace):
    from mlflow_server.server import ServerConfig

    # status and down without --port: the data dir's server on whatever port it runs
    # (`_check_port` skips a port of 0; it refused one started with --port 5077)
    port = args.port if args.port is not None else 0 if args.action != "up" else 5000
    return ServerConfig(
        data_dir=Path(args.data_dir), host=args.host, port=port,
        backend_store_uri=args.backend_store_uri, auth=args.auth, insecure=args.insecure,
    )  # fmt: skip


def cmd_mlflow(args: argparse.Namespace) -> int:
    import dataclasses

    from mlflow_server import server

    config = _server_config(args)
    probe = config if config.port else dataclasses.replace(config, port=5000)  # `_elsewhere`
    if args.action == "up":
        info = server.up(config)
        print(f"MLflow server at {info.uri} (pid {info.pid}; log {config.log_path})")
    elif args.action == "status":
        info = server.status(config)
        print(f"MLflow server at {info.uri} (pid {info.pid})" if info
              else f"MLflow server: not running{_elsewhere(server, probe)}")  # fmt: skip
        return 0 if info else 1
    elif server.down(config):
        print("MLflow server stopped")
    else:
        elsewhere = _elsewhere(server, probe)
        print(f"MLflow server was not running{elsewhere}")
        return 1 if elsewhere else 0  # a server answers on: not stopped
    return 0


def _elsewhere(server, config) -> str:
    """What to say when `config.data_dir` runs no server but its port answers."""
    found = server.answering_elsewhere(config)
    if found is None:
        return ""
    uri, data_dir = found
    which = f"--data-dir {data_dir}" if data_dir else "the --data-dir it was started with"
    return (f" from {config.data_dir}; the server answering at {uri} was started with "
            f"another data dir: pass {which}")  # fmt: skip


# ---------------------------------------------------------------------------- train, data


def cmd_train(args: argparse.Namespace) -> int:
    import torch

    from nas.protocol import describe_split, fit_on_training, split_method
    from search_space.builder import build_model
    from search_space.presets import check_before_the_data, load_architecture, unknown_architecture
    from trainers.data import bayes_metrics, load_dataset
    from trainers.data.dataset import warn_if_too_few_to_rank
    from trainers.data.preprocess import apply_preprocessing, describe
    from trainers.trainer import train

    problem = unknown_architecture(args.arch)
    if problem:  # before the data is read
        raise RanknasError(f"--arch {problem}")
    check_before_the_data(args.arch)
    torch.set_num_threads(args.threads)
    if args.stream:
        return _train_streamed(args)
    stream_only = [f"--{name.replace('_', '-')}" for name in ("min_count", "hash_size", "cache_dir")
                   if getattr(args, name) not in (None, 1)]  # fmt: skip
    if stream_only:
        raise RanknasError(f"{', '.join(stream_only)}: for streamed data only; add --stream, or "
                           "set min_count or hash_size per column in the --schema")  # fmt: skip
    method, _, column = args.split.partition(":")
    options: dict[str, Any] = (
        {"rows": args.rows, "seed": args.data_seed} if args.data == "synthetic" else {}
    )
    if column:
        options["time_column"] = column
    if args.data != "synthetic":
        options |= {"max_bad_rows": args.max_bad_rows, "max_bad_fraction": args.max_bad_fraction}
    data = load_dataset(args.data, args.schema, **options)
    method = split_method(method, data, args.data)
    parts = data.split(seed=args.data_seed, method=method,
                       source=None if args.data == "synthetic" else args.data)  # fmt: skip
    fitted = fit_on_training(parts[0], args.preprocessing, args.data)
    train_part, valid, test = (apply_preprocessing(p, fitted) for p in parts)
    split = describe_split(method, data, args.data_seed)
    print(f"split {split}: {len(train_part):,} training, "
          f"{len(valid):,} validation, {len(test):,} test rows", file=sys.stderr)  # fmt: skip
    if described := describe(fitted):
        print(described, file=sys.stderr)
    warn_if_too_few_to_rank(valid)
    arch = load_architecture(args.arch, train_part.schema)
    model = build_model(arch, seed=args.seed)
    result = train(model, train_part, valid, test, _train_config(args), label=f"train {args.arch}")
    summary = result.summary() | {"split": split}
    if data.true_prob is not None:
        summary["bayes_val_ne"] = bayes_metrics(valid).ne
        summary["bayes_test_ne"] = bayes_metrics(test).ne
    return _print_run(args, summary, result)


def _train_config(args: argparse.Namespace) -> Any:
    """The run's config: the flags given; without a budget (and not streamed), epochs until
    early stopping ends them (`UNTIL_STOPPED`), else the trainer's defaults."""
    from trainers.config import UNTIL_STOPPED
    from trainers.trainer import TrainConfig

    budget = {"max_examples": args.examples, "max_epochs": args.epochs,
              "max_seconds": args.seconds}  # fmt: skip
    given = {"lr_schedule": args.lr_schedule, "evals": args.evals,
             "early_stopping_patience": args.patience}  # fmt: skip
    default = {} if any(budget.values()) or args.stream else UNTIL_STOPPED
    chosen = default | {k: v for k, v in (budget | given).items() if v is not None}
    return TrainConfig(batch_size=args.batch_size, dense_lr=args.dense_lr,
                       sparse_lr=args.sparse_lr, seed=args.seed, device=args.device,
                       **chosen)  # fmt: skip


def _train_streamed(args: argparse.Namespace) -> int:
    """`ranknas train --stream`: the data read in chunks, split in file order."""
    from nas.protocol import wants_preprocessing
    from search_space.builder import build_model
    from search_space.presets import load_architecture
    from trainers.data.preprocess import describe
    from trainers.data.stream import StreamOptions, open_stream
    from trainers.trainer import train

    if args.split not in ("auto", "ordered"):
        raise RanknasError(f"--split {args.split}: --stream splits in file order (auto or ordered)")
    options = StreamOptions(min_count=args.min_count, hash_size=args.hash_size,
                            cache=not args.no_cache, cache_dir=args.cache_dir,
                            max_bad_rows=args.max_bad_rows,
                            max_bad_fraction=args.max_bad_fraction)  # fmt: skip
    dense = wants_preprocessing(args.preprocessing, args.data)
    anyway = "--split ordered" if args.split == "auto" else None  # auto: checked, as a study's
    data = open_stream(args.data, args.schema, options=options, dense_preprocessing=dense,
                       time_order=anyway)  # fmt: skip
    print(f"split {data.description}", file=sys.stderr)
    if data.cache_note:
        print(data.cache_note, file=sys.stderr)
    if described := describe(data.fitted):
        print(described, file=sys.stderr)
    arch = load_architecture(args.arch, data.train.schema)
    model = build_model(arch, seed=args.seed)
    result = train(model, data.train, data.valid, data.test, _train_config(args),
                   label=f"train {args.arch}")  # fmt: skip
    return _print_run(args, result.summary() | {"split": data.description}, result)


def _shown(key: str, value: Any) -> str:
    if not isinstance(value, float):
        return str(value)
    return f"{value:.0f}" if key.endswith("examples") and value.is_integer() else f"{value:.4f}"


def _print_run(args: argparse.Namespace, summary: dict[str, Any], result: Any) -> int:
    if args.json:
        print(json.dumps(summary))
    else:
        for key, value in summary.items():
            if value is not None:
                print(f"{key:>18}: {_shown(key, value)}")
    if result.status != "complete":
        print(f"error: the run {result.status}: {result.failure_reason}", file=sys.stderr)
    return 0 if result.status == "complete" else 1


def cmd_data_schema(args: argparse.Namespace) -> int:
    from trainers.data.tabular import infer_schema

    if Path(args.file).suffix.lower() in (".yaml", ".yml"):
        if args.label or args.time:
            raise RanknasError(f"{args.file}: a study's schema comes from its data: section; "
                               "--label and --time are for data files")  # fmt: skip
        return _study_schema(args.file)
    if args.file.startswith("criteo:"):
        return _criteo_schema(args)
    if args.label is None:
        raise RanknasError(f"{args.file}: give --label COLUMN, the label column of a data file")
    schema = infer_schema(args.file, args.label, args.time)
    if args.time is None and "time" in schema:
        print(f"# time: {schema['time']} holds dates: rows will be split in time order (drop "
              "the line to split in file order)")  # fmt: skip
    print(f"# schema of {args.file}, inferred: check dense vs categorical, then save it and pass "
          "it with --schema / data.schema")  # fmt: skip
    print(_yaml_text(schema), end="")
    return 0


def _criteo_schema(args: argparse.Namespace) -> int:
    """A Criteo file's schema as its reader makes it (fixed columns; cardinalities of the
    whole file's vocabularies): `--schema` for `ranknas arch show` and `latency`."""
    from trainers.data import load_dataset

    if args.label or args.time:
        raise RanknasError(f"{args.file}: a Criteo file's columns are fixed (label, I1-I13, "
                           "C1-C26); drop --label and --time")  # fmt: skip
    schema = load_dataset(args.file).schema
    print(f"# schema of {args.file} as its reader reads it (ids by frequency over the whole "
          "file, min count 10; a study fits them on its training split): save it and pass "
          "it with --schema to `ranknas arch show` or `ranknas latency`")  # fmt: skip
    print(_yaml_text(schema.to_dict()), end="")
    return 0


def _yaml_text(value: Any) -> str:
    """`value` as YAML for the terminal: column names in their own letters where it takes
    UTF-8 (escaped, "cat\\xE9gorie", they were hard to edit), escaped where it does not."""
    import yaml

    utf8 = (sys.stdout.encoding or "").lower().replace("-", "") == "utf8"
    return yaml.safe_dump(value, sort_keys=False, allow_unicode=utf8)


def _study_schema(path: str) -> int:
    """The schema of a study's training data as its trials see it (a synthetic set with
    `cardinalities` has no file): `--schema` for `ranknas latency` and `arch`."""
    from nas.config import load_config
    from nas.protocol import prepare_data

    schema = prepare_data(load_config(path)).train.schema
    print(f"# schema of the training data of the study in {path}, after its preprocessing "
          "(the model's inputs: ids already encoded): save it and pass it with --schema to "
          "`ranknas latency` or `ranknas arch`; it does not read the raw file (for that: "
          "`ranknas data schema FILE --label COLUMN`)")  # fmt: skip
    print(_yaml_text(schema.to_dict()), end="")
    return 0


def cmd_data_synth(args: argparse.Namespace) -> int:
    from trainers.data import SyntheticConfig, write_synthetic

    if args.format == "criteo":
        from trainers.data.synthetic import write_synthetic_criteo

        out = write_synthetic_criteo(Path(args.out) / "data.tsv", args.rows, args.seed)
        print(f"wrote {args.rows} rows in Criteo's format to {out}; train on it with "
              f"--data criteo:{out}")  # fmt: skip
        return 0
    out = write_synthetic(Path(args.out), SyntheticConfig(rows=args.rows, seed=args.seed),
                          file_format=args.format)  # fmt: skip
    stats = json.loads((Path(args.out) / "stats.json").read_text())
    print(f"wrote {args.rows} rows to {out} with schema.yaml and stats.json")
    print(json.dumps(stats.get("bayes", stats), indent=2)[:2000])
    one_label = [name for name, split in stats["bayes"].items() if split["ne"] is None]
    if one_label:  # training on the file refuses such a split: said now, not then
        print(f"WARNING: the {', '.join(one_label)} split(s) hold one label only (NE null): "
              "training on this file refuses them; write more rows", file=sys.stderr)  # fmt: skip
    return 0
