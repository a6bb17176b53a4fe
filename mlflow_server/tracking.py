"""Log a study to MLflow: one parent run per study, one nested run per trial.

Nothing is sent directly. Each `start_study` / `log_trial` / `log_study_summary` call appends
one self-contained record to a durable outbox (SQLite, `<outbox_dir>/outbox.db`) and returns;
a background thread (the courier) then delivers every pending record, oldest first, so a
trial never waits on the server. A connection failure (or a timeout, a 5xx or 401/403 answer)
stops delivery and keeps the record and everything after it; the courier retries every
`retry_interval_s` (at least 1 s) while records are pending (after a 401/403, only when a new
record comes), and `flush(timeout_s)` delivers in the caller's thread, retrying until the
outbox is empty or time is up. A record the server refuses as invalid (HTTP 400) would fail
forever, so it is marked failed with the server's message (see `failures()`) and delivery
goes on. Delivered records are marked done and their content dropped.

Delivery is idempotent: runs are found again by tags before one is created (the parent by
`ranknas.study=<name>` + `ranknas.kind=study`, a trial by `ranknas.study` + `ranknas.trial=<n>`
+ `ranknas.kind=trial`), params are re-logged with the same values, metrics carry the
timestamp of the record (MLflow drops an exact duplicate), artifacts are overwritten. If
several workers create the same parent run at the same moment, the oldest one is kept and the
others are deleted at the next look-up. Several processes may share one outbox directory: a
file lock lets one of them deliver at a time.

MLflow's HTTP client reads its retry policy and timeout only from environment variables. A
logger sets them for its process where the user has not: `MLFLOW_HTTP_REQUEST_MAX_RETRIES=0`
and `MLFLOW_HTTP_REQUEST_TIMEOUT=<request_timeout_s>` (default 5 s; MLflow's own defaults are
7 retries with backoff and 120 s, minutes per call against a dead server), and
`MLFLOW_SUPPRESS_PRINTING_URL_TO_STDOUT`. They stay set: the courier delivers beside the
trial, whose threads may copy os.environ (to spawn torchrun), and a key removed during a
copy fails it. Credentials given to the logger are the exception: set around each delivery
(one at a time in a process, under a lock) and restored after it, so they are visible to the
whole process meanwhile; without them MLflow reads `MLFLOW_TRACKING_USERNAME` / `_PASSWORD`
as the user set them.
"""

from __future__ import annotations

import atexit
import base64
import contextlib
import fcntl
import hashlib
import json
import logging
import os
import posixpath
import re
import tempfile
import threading
import time
import urllib.parse
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

from mlflow import MlflowClient
from mlflow.entities import Metric, Param, RunTag, ViewType
from mlflow.exceptions import MlflowException

from mlflow_server.outbox import Outbox, server_key
from search_space.errors import RanknasError

EXPERIMENT_KIND, MODEL_TRAINING = "mlflow.experimentKind", "custom_model_development"

_log = logging.getLogger(__name__)

STUDY_TAG = "ranknas.study"
TRIAL_TAG = "ranknas.trial"
KIND_TAG = "ranknas.kind"
BASELINE_TAG = "ranknas.baseline"
# a trial whose architecture an earlier trial trained (its run, of kind "repeat", repeats
# that one's figures): `nas.trial_record.TrialAttr.REUSED_FROM`
REPEAT_TAG = "reused_from"

# A study's view of its experiment's runs table, stored where the UI's "share view" keeps
# one (an experiment tag of this prefix, the URL naming its key): the study's runs only,
# every row sorted by the one metric every trial and baseline logs (`VIEW_ORDER`, best
# first), once re-evaluated by `VIEW_RANK`: the leaderboard's order of trials and baselines
# together, by seed means where they have them, the study's best first of the trials,
# written on each run by the study's summary (`nas.leaderboard.view_ranks`; runs logged
# since come after, until the next summary); with the columns a comparison needs (the UI
# shows none of the metrics until a person picks them): those every trained run logs, and
# the rank and seed means.
SHARED_VIEW_PREFIX = "mlflow.sharedViewState."
VIEW_ORDER = "val_ne"
VIEW_RANK = "rank"
VIEW_COLUMNS = (
    *(f"metrics.`{m}`" for m in (VIEW_ORDER, "test_ne", "val_auc", "mflops", "params")),
    f"tags.`{KIND_TAG}`", "tags.`status`", "attributes.`Duration`",
)  # fmt: skip
REEVAL_COLUMNS = (f"metrics.`{VIEW_RANK}`", *(f"metrics.`reeval_{m}`"
                  for m in ("mean_val_ne", "mean_test_ne", "seeds", "diverged")))  # fmt: skip
NAME_COLUMN = "attributes.`Run Name`"
RUN_STATUSES = ("RUNNING", "FINISHED", "FAILED", "KILLED")

# MLflow 3.17 limits (mlflow.utils.validation)
_MAX_KEY = 250
_MAX_PARAM_VALUE = 6000
_MAX_TAG_VALUE = 8000
_BAD_KEY_CHARS = re.compile(r"[^\w./\- :]")

_PATCHING_ENV = threading.Lock()  # held by the delivery that has patched os.environ

Artifacts = Mapping[str, bytes | str]
Curves = Mapping[str, list[tuple[int, float]]]


class StudyLogger:
    """Logs one study and its trials to an MLflow tracking server through a durable outbox."""

    def __init__(
        self,
        tracking_uri: str,
        outbox_dir: str | Path,
        *,
        request_timeout_s: int = 5,
        retry_interval_s: float = 15.0,
        username: str | None = None,
        password: str | None = None,
    ) -> None:
        self._outbox = Outbox(Path(outbox_dir))
        self._client = MlflowClient(tracking_uri=tracking_uri)
        self._writer = _Writer(self._client)
        self._tracking_uri = tracking_uri
        _set_client_defaults(request_timeout_s)  # here, before any thread of ours runs
        self._env = _credentials_env(username, password)
        self._retry_interval_s = retry_interval_s
        self._next_attempt = 0.0
        self._study: dict[str, str] | None = None
        self._wake = threading.Event()  # a record was queued, or a retry is due
        self._closed = threading.Event()
        self._courier: threading.Thread | None = None
        self.last_error: str | None = None  # why the last delivery stopped; None after success
        self.credentials_refused = False  # the last delivery was answered 401/403

    def start_study(
        self,
        study_name: str,
        params: Mapping[str, Any] | None = None,
        tags: Mapping[str, Any] | None = None,
        experiment_name: str | None = None,
        reevaluated: bool = False,
    ) -> None:
        """Find or create the study's parent run (experiment: `experiment_name` or the study
        name) and store the study's view (`study_view`; with `reevaluated`, its seed-mean
        columns too); nested params are flattened into dotted keys."""
        self._set_study(study_name, experiment_name)
        record = {"params": _params(params), "tags": _tags(tags), "reevaluated": reevaluated}
        self._enqueue("study", record)

    def end_study(
        self,
        study_name: str,
        status: str,
        experiment_name: str | None = None,
        metrics: Mapping[str, float] | None = None,
        tags: Mapping[str, Any] | None = None,
    ) -> None:
        """End the study's parent run with `status` (KILLED after a Ctrl-C, FAILED after an
        error), logging `metrics` and `tags` (the best so far) first, where the run exists
        and is still RUNNING, so that the UI does not show a stopped study running; creates
        nothing. Resuming the study sets it RUNNING again."""
        if self._study is None:
            self._set_study(study_name, experiment_name)
        record = {"status": _status(status), "metrics": _metrics(metrics), "tags": _tags(tags)}
        self._enqueue("end", record)

    def _set_study(self, study_name: str, experiment_name: str | None) -> None:
        _check_quotable(study_name)
        self._study = {"study": study_name, "experiment": experiment_name or study_name}

    def log_trial(self, trial_number: int, **run: Any) -> None:
        """Log a trial as a nested run (found again by its number, so it can be logged again).

        Keywords (all optional): `params`, `metrics` (logged at step 0), `curves` (metric
        histories of (step, value); use keys distinct from `metrics`), `tags`, `artifacts`
        (relative file name -> content), `status` (RUNNING, FINISHED, FAILED, KILLED;
        default FINISHED; None updates a run and leaves its state and end time), `run_name`
        (of a run this call creates; default `trial-N`),
        `start_time` (epoch seconds the trial started, so that the run's duration and the
        curves' timestamps are real) and `end_time` (default: when this call queued it).
        """
        payload = {"trial": int(trial_number), **_run_payload(**run)}
        self._enqueue("trial", payload, _subject(f"trial:{int(trial_number)}", payload))

    def log_baseline(self, name: str, **run: Any) -> None:
        """Log a baseline (an engineer's model trained like a trial) as a nested run,
        found again by its name (default run name `baseline-<name>`); the keyword arguments
        are `log_trial`'s."""
        _check_quotable(name)
        payload = {"baseline": name, **_run_payload(**run)}
        self._enqueue("trial", payload, _subject(f"baseline:{name}", payload))

    def log_baseline_tuning(self, name: str, number: int, **run: Any) -> None:
        """Log recipe trial `number` of baseline `name`'s tuning as a run nested under the
        baseline's run (default run name `baseline-<name> recipe-<number>`); the keyword
        arguments are `log_trial`'s."""
        _check_quotable(name)
        payload = {"baseline": name, "tuning": int(number), **_run_payload(**run)}
        self._enqueue("trial", payload, f"baseline:{name}:recipe-{int(number)}")

    def log_study_summary(
        self,
        metrics: Mapping[str, float] | None = None,
        artifacts: Artifacts | None = None,
        tags: Mapping[str, Any] | None = None,
        status: str | None = "FINISHED",
    ) -> None:
        """Log study-level results on the parent run and end it with `status`
        (None: an interim summary that leaves the run open)."""
        payload = {
            "metrics": _metrics(metrics),
            "artifacts": _artifacts(artifacts),
            "tags": _tags(tags),
            "status": None if status is None else _status(status),
        }
        self._enqueue("summary", payload)

    def flush(self, timeout_s: float = 30.0) -> int:
        """Deliver pending records, retrying until none is left or `timeout_s` has passed
        (at once where the server refused the credentials: retrying cannot change that);
        returns how many are still pending."""
        deadline = time.monotonic() + timeout_s
        while True:
            self._deliver(lock_wait_s=max(0.0, deadline - time.monotonic()))
            left = self.pending()
            remaining = deadline - time.monotonic()
            if left == 0 or remaining <= 0 or self.credentials_refused:
                return left
            time.sleep(min(1.0, remaining))

    def close(self, timeout_s: float = 5.0) -> None:
        """Stop the courier after one last delivery attempt (none if another process is
        delivering the outbox), waiting for it up to `timeout_s`; what is still pending
        stays in the outbox for the next run (`flush` first to wait for it). Called at
        exit, so a Ctrl-C's last record is usually delivered."""
        self._closed.set()
        self._wake.set()
        atexit.unregister(self.close)
        if self._courier is not None:
            self._courier.join(timeout_s)

    def view_url(self) -> str | None:
        """Where the MLflow UI shows this study's runs to compare (`study_view`); None
        until the study's first record has reached the server."""
        study = self._study or {}
        experiment_id = self._writer.known_experiment(study.get("experiment", ""))
        if experiment_id is None:
            return None
        return study_view_url(self._tracking_uri, experiment_id, study["study"])

    @property
    def tracking_uri(self) -> str:
        """The server this logger delivers to."""
        return self._tracking_uri

    @property
    def server(self) -> str:
        """`tracking_uri` without credentials or a trailing '/': what is marked logged."""
        return server_key(self._tracking_uri)

    @property
    def started(self) -> bool:
        """Whether `start_study` was called."""
        return self._study is not None

    def pending(self) -> int:
        """Records not yet delivered (for progress display)."""
        return self._outbox.count("pending")

    def failures(self) -> list[str]:
        """Records the server refused as invalid, with its message; they are not retried."""
        return self._outbox.failures()

    def logged(self) -> set[str] | None:
        """What this study's outbox has logged, delivered or still pending: `trial:N` and
        `baseline:NAME` (`baseline:NAME:recipe-N` for a tuning run, `update_subject` for metrics
        added to a run); None where its records were written before it kept that (a study
        logged to MLflow by an earlier version). Another server's runs are not this one's:
        a study moved to a new server logs its runs there."""
        return self._outbox.subjects(self.server)

    def lost_runs(self) -> bool:
        """Whether the server holds none of this study's runs although the outbox delivered
        some to it (its database deleted or replaced since): they are to be logged again
        (`forget_delivered`). False where the server does not answer now."""
        if self._study is None or not self._outbox.delivered(self.server):
            return False
        try:
            with _PATCHING_ENV, _patched_env(self._env):
                experiment = self._client.get_experiment_by_name(self._study["experiment"])
                if experiment is None:
                    return True
                # not the parent run, which this run's own start may have made anew
                where = (f"tags.`{STUDY_TAG}` = {_quote(self._study['study'])} and "
                         f"tags.`{KIND_TAG}` != 'study'")  # fmt: skip
                runs = self._client.search_runs([experiment.experiment_id], where, max_results=1)
                return not runs
        except Exception:  # not answering: nothing known
            return False

    def forget_delivered(self) -> None:
        """Forget what the outbox delivered to this server (`lost_runs`): `logged()` no
        longer names it, so that it is logged again."""
        self._outbox.forget(self.server)

    @staticmethod
    def update_subject(subject: str, metrics: Mapping[str, float]) -> str:
        """What `logged()` names an update of run `subject` adding `metrics` by."""
        return update_subject(subject, metrics)

    def _enqueue(self, kind: str, payload: dict[str, Any], subject: str | None = None) -> None:
        if self._study is None:
            raise RuntimeError("call start_study() before logging trials or a summary")
        record = {**self._study, **payload, "ts": int(time.time() * 1000)}
        self._outbox.append(kind, record, subject, self.server)
        dead = self._courier is None or not self._courier.is_alive()
        if dead and not self._closed.is_set():
            self._courier = threading.Thread(target=self._carry, name="mlflow-courier", daemon=True)
            self._courier.start()
            atexit.register(self.close)
        self._wake.set()

    def _carry(self) -> None:
        """The courier: deliver when woken; while records are left pending (the server
        failed, or another process holds the outbox), wake again after a pause."""
        while True:
            self._wake.wait()
            self._wake.clear()
            closing = self._closed.wait(max(0.0, self._next_attempt - time.monotonic()))
            try:
                if not self._deliver(lock_wait_s=0.0):  # another deliverer has the lock
                    self._next_attempt = max(self._next_attempt, time.monotonic() + 1.0)
                if closing:
                    return
                if self.pending() and not self.credentials_refused:
                    self._next_attempt = max(self._next_attempt, time.monotonic() + 1.0)
                    self._wake.set()
            except Exception as exc:  # the outbox itself failed (a full disk): `flush` raises it
                _log.warning("MLflow delivery stopped: %s", exc)
                self.last_error = str(exc)
                self._next_attempt = time.monotonic() + max(self._retry_interval_s, 1.0)
                if closing:
                    return
                self._wake.set()

    def _deliver(self, lock_wait_s: float) -> bool:
        """Deliver what is pending; False where another thread or process was delivering."""
        with _file_lock(self._outbox.lock_path, lock_wait_s) as locked:
            if not locked:
                return False
            with _PATCHING_ENV, _patched_env(self._env):
                self._deliver_pending()
            return True

    def _deliver_pending(self) -> None:
        while (record := self._outbox.next_pending()) is not None:
            record_id, kind, payload = record
            try:
                self._writer.deliver(kind, payload)
            except (MlflowException, OSError) as exc:
                if not _is_invalid_request(exc):
                    self.last_error = str(exc)
                    self.credentials_refused = _http_status(exc) in (401, 403)
                    self._next_attempt = time.monotonic() + self._retry_interval_s
                    return
                _log.warning("MLflow refused outbox record %d (%s): %s", record_id, kind, exc)
                self._outbox.mark_failed(record_id, str(exc))
                continue
            self._outbox.mark_done(record_id)
        self.last_error = None
        self.credentials_refused = False
        self._next_attempt = 0.0


# --- delivery -----------------------------------------------------------------------------


class _Writer:
    """Turns outbox records into MLflow calls; each call is safe to repeat."""

    def __init__(self, client: MlflowClient) -> None:
        self._client = client
        self._experiments: dict[str, str] = {}

    def deliver(self, kind: str, record: dict[str, Any]) -> None:
        handlers = {"study": self._study, "trial": self._trial, "summary": self._summary,
                    "end": self._end}  # fmt: skip
        handlers[kind](record)

    def _study(self, record: dict[str, Any]) -> None:
        run_id = self._parent_run(record)
        # a worker that joins from another directory names the data by another path: the
        # first worker's params stand (MLflow refuses to change a param's value)
        logged = self._client.get_run(run_id).data.params
        fresh = {k: v for k, v in record["params"].items() if k not in logged}
        self._log_batch(run_id, record | {"params": fresh})
        self._client.update_run(run_id, status="RUNNING")
        view = study_view(record["study"], record.get("reevaluated", False))
        self._client.set_experiment_tag(self._experiment_id(record["experiment"]),
                                        SHARED_VIEW_PREFIX + view_key(record["study"]),
                                        json.dumps(view))  # fmt: skip

    def _trial(self, record: dict[str, Any]) -> None:
        experiment_id = self._experiment_id(record["experiment"])
        parent_id = self._parent_run(record)
        if "tuning" in record:  # under its baseline's run, made here if not logged yet
            name, number = record["baseline"], str(record["tuning"])
            baseline = {STUDY_TAG: record["study"], KIND_TAG: "baseline", BASELINE_TAG: name}
            parent_id = self._find_or_create(experiment_id, baseline, f"baseline-{name}",
                                             {"mlflow.parentRunId": parent_id})  # fmt: skip
            match = baseline | {KIND_TAG: "tuning", TRIAL_TAG: number}
            run_name = record.get("run_name") or f"baseline-{name} recipe-{number}"
        elif "baseline" in record:
            name = record["baseline"]
            match = {STUDY_TAG: record["study"], KIND_TAG: "baseline", BASELINE_TAG: name}
            run_name = record.get("run_name") or f"baseline-{name}"
        else:
            number = str(record["trial"])
            kind = "repeat" if REPEAT_TAG in record["tags"] else "trial"
            match = {STUDY_TAG: record["study"], KIND_TAG: kind, TRIAL_TAG: number}
            run_name = record.get("run_name") or f"trial-{number}"
            self._rekind(experiment_id, match)
        extra = {"mlflow.parentRunId": parent_id}
        if record["status"] is None:  # an update: of a run this server lacks, no run at all
            found = self._search(experiment_id, match)
            if not found:
                return
            run_id = found[0]
        else:
            run_id = self._find_or_create(experiment_id, match, run_name, extra,
                                          record.get("start_ms"))  # fmt: skip
        if "baseline" in record and "tuning" not in record and record.get("run_name"):
            self._client.update_run(run_id, name=run_name)  # its recipe runs made it, unnamed
        self._log_batch(run_id, record)
        self._upload(run_id, record["artifacts"])
        if record["status"] is not None:  # None: an update that leaves the run's end as it was
            self._set_status(run_id, record["status"], record.get("end_ms") or record["ts"])

    def _summary(self, record: dict[str, Any]) -> None:
        run_id = self._parent_run(record)
        self._log_batch(run_id, record)
        self._upload(run_id, record["artifacts"])
        if record["status"] is not None:
            self._set_status(run_id, record["status"], record["ts"])

    def _end(self, record: dict[str, Any]) -> None:
        experiment = self._client.get_experiment_by_name(record["experiment"])
        if experiment is None:
            return
        runs = self._search(experiment.experiment_id, {STUDY_TAG: record["study"],
                                                       KIND_TAG: "study"})  # fmt: skip
        if runs and self._client.get_run(runs[0]).info.status == "RUNNING":
            self._log_batch(runs[0], record)
            self._set_status(runs[0], record["status"], record["ts"])

    def known_experiment(self, name: str) -> str | None:
        """The id of experiment `name` if a delivery has found or made it."""
        return self._experiments.get(name)

    def _parent_run(self, record: dict[str, Any]) -> str:
        experiment_id = self._experiment_id(record["experiment"])
        match = {STUDY_TAG: record["study"], KIND_TAG: "study"}
        # it starts when the study did (its first record, the oldest delivered), not when a
        # server that was down at the start took it
        return self._find_or_create(experiment_id, match, record["study"], {}, record.get("ts"))

    def _experiment_id(self, name: str) -> str:
        if name not in self._experiments:
            self._experiments[name] = self._get_or_create_experiment(name)
        return self._experiments[name]

    def _get_or_create_experiment(self, name: str) -> str:
        experiment = self._client.get_experiment_by_name(name)
        if experiment is not None:
            return experiment.experiment_id
        try:  # the kind tag makes MLflow's UI open on the runs table, not the GenAI view
            return self._client.create_experiment(name, tags={EXPERIMENT_KIND: MODEL_TRAINING})
        except MlflowException as exc:
            if exc.error_code != "RESOURCE_ALREADY_EXISTS":
                raise
        return self._client.get_experiment_by_name(name).experiment_id  # made by another worker

    def _rekind(self, experiment_id: str, match: dict[str, str]) -> None:
        """A trial's run is one run whatever its kind: a repeat whose worker died mid-tell is
        logged again as a failed trial (a second run, once kinds told them apart)."""
        other = "trial" if match[KIND_TAG] == "repeat" else "repeat"
        for run_id in self._search(experiment_id, match | {KIND_TAG: other}):
            self._client.set_tag(run_id, KIND_TAG, match[KIND_TAG])

    def _find_or_create(
        self,
        experiment_id: str,
        match: dict[str, str],
        run_name: str,
        extra: dict[str, str],
        start_ms: int | None = None,
    ) -> str:
        """The run with the `match` tags; created if missing. Of several (a race between
        workers), the oldest is kept and the others are deleted."""
        runs = self._search(experiment_id, match)
        if not runs:
            self._client.create_run(experiment_id, tags={**extra, **match}, run_name=run_name,
                                    start_time=start_ms)  # fmt: skip
            runs = self._search(experiment_id, match)
        for duplicate in runs[1:]:
            self._client.delete_run(duplicate)
        return runs[0]

    def _search(self, experiment_id: str, match: dict[str, str]) -> list[str]:
        clauses = [f"tags.`{key}` = {_quote(value)}" for key, value in match.items()]
        runs = self._client.search_runs(
            [experiment_id],
            filter_string=" and ".join(clauses),
            run_view_type=ViewType.ACTIVE_ONLY,
            max_results=100,
        )
        runs.sort(key=lambda run: (run.info.start_time, run.info.run_id))
        return [run.info.run_id for run in runs]

    def _log_batch(self, run_id: str, record: dict[str, Any]) -> None:
        ts = record["ts"]
        metrics = [Metric(key, value, ts, 0) for key, value in record.get("metrics", {}).items()]
        for key, points in record.get("curves", {}).items():
            metrics += [Metric(key, value, _step_time(record, step, points), step)
                        for step, value in points]  # fmt: skip
        params = [Param(key, value) for key, value in record.get("params", {}).items()]
        tags = [RunTag(key, value) for key, value in record["tags"].items()]
        self._client.log_batch(run_id, metrics=metrics, params=params, tags=tags)

    def _upload(self, run_id: str, artifacts: dict[str, str]) -> None:
        if not artifacts:
            return
        with tempfile.TemporaryDirectory(prefix="ranknas-artifacts-") as tmp:
            for name, encoded in artifacts.items():
                path = Path(tmp, name)
                path.parent.mkdir(parents=True, exist_ok=True)
                path.write_bytes(base64.b64decode(encoded))
            self._client.log_artifacts(run_id, tmp)

    def _set_status(self, run_id: str, status: str, ts: int) -> None:
        if status == "RUNNING":
            self._client.update_run(run_id, status=status)
        else:
            self._client.set_terminated(run_id, status=status, end_time=ts)


def view_key(study: str) -> str:
    """The key of the study's view among the experiment's shared views."""
    return "ranknas-" + re.sub(r"[^\w.\-]", "_", study)


def study_view(study: str, reevaluated: bool = False) -> dict[str, Any]:
    """The runs table's state for comparing a study's trials and baselines: its runs but
    the study's own, the tuned baselines' recipe trials and the repeats (kind "repeat": a
    sampler that proposed one architecture 69 times filled the view with its copies),
    all sorted by `VIEW_ORDER`
    (`VIEW_RANK` once `reevaluated`: MLflow lists the runs without it last), lowest
    first (a flat list: a sort by a metric lists nested runs by value), with
    `view_columns`."""
    columns = view_columns(reevaluated)
    kinds = " AND ".join(f"tags.`{KIND_TAG}` != '{kind}'" for kind in ("study", "tuning", "repeat"))
    return {
        "searchFilter": f"tags.`{STUDY_TAG}` = {_quote(study)} AND {kinds}",
        "orderByKey": f"metrics.`{VIEW_RANK if reevaluated else VIEW_ORDER}`",
        "orderByAsc": True,
        "selectedColumns": columns,
        "columnOrder": [NAME_COLUMN, *columns],
        "columnWidths": {NAME_COLUMN: 320},  # the name says the architecture
    }


def view_columns(reevaluated: bool = False) -> list[str]:
    """The view's columns: `VIEW_COLUMNS`; once a study has seed means (`reevaluate`, or
    baselines chosen by `best_baseline.seeds`; before, no run logs them) its rank first
    and the seed means beside validation NE."""
    if not reevaluated:
        return list(VIEW_COLUMNS)
    rank, *means = REEVAL_COLUMNS
    return [rank, VIEW_COLUMNS[0], *means, *VIEW_COLUMNS[1:]]


def study_view_url(tracking_uri: str, experiment_id: str, study: str) -> str:
    """The MLflow UI address that opens the experiment's runs table in the study's view; a
    database given as the tracking URI (sqlite:///...) has no address: the UI a local
    `mlflow ui` serves on it, and the command."""
    path = (f"/#/experiments/{experiment_id}/runs"
            f"?viewStateShareKey={urllib.parse.quote(view_key(study))}")  # fmt: skip
    if not tracking_uri.startswith(("sqlite:", "postgresql", "mysql", "mssql")):  # a server
        return tracking_uri.rstrip("/") + path
    return f"http://127.0.0.1:5000{path} (once `mlflow ui --backend-store-uri {tracking_uri}` runs)"


def _step_time(record: dict[str, Any], step: int, points: list[tuple[int, float]]) -> int:
    """When a curve point was measured, spread between the run's start and its record's
    time in proportion to its step (the record is written when the trial ends)."""
    start, end = record.get("start_ms"), record["ts"]
    if start is None or not points:
        return end
    return int(start + (end - start) * step / max(s for s, _ in points))


def _run_payload(
    params: Mapping[str, Any] | None = None,
    metrics: Mapping[str, float] | None = None,
    curves: Curves | None = None,
    tags: Mapping[str, Any] | None = None,
    artifacts: Artifacts | None = None,
    status: str | None = "FINISHED",
    run_name: str | None = None,
    start_time: float | None = None,
    end_time: float | None = None,
) -> dict[str, Any]:
    return {
        "params": _params(params),
        "metrics": _metrics(metrics),
        "curves": _curves(curves),
        "tags": _tags(tags),
        "artifacts": _artifacts(artifacts),
        "status": _status(status),
        "run_name": run_name,
        "start_ms": None if start_time is None else int(start_time * 1000),
        "end_ms": None if end_time is None else int(end_time * 1000),
    }


def _subject(subject: str, payload: dict[str, Any]) -> str:
    """What a run record logs: an update (status None: metrics added to a run) is no run;
    it is known by the values it adds (`update_subject`)."""
    return subject if payload["status"] is not None else update_subject(subject, payload["metrics"])


def update_subject(subject: str, metrics: Mapping[str, float]) -> str:
    """The subject of an update of run `subject` that adds `metrics`: new values, a new
    subject."""
    text = json.dumps({k: float(metrics[k]) for k in sorted(metrics)})  # as `_metrics` keeps
    return f"{subject}:update:{hashlib.sha1(text.encode()).hexdigest()[:12]}"


def _is_invalid_request(exc: Exception) -> bool:
    """Whether the server (or client-side validation) refused the request as invalid."""
    return _http_status(exc) == 400


def _http_status(exc: Exception) -> int | None:
    return exc.get_http_status_code() if isinstance(exc, MlflowException) else None


@contextlib.contextmanager
def _file_lock(path: Path, wait_s: float) -> Iterator[bool]:
    """Hold an exclusive lock on `path`, waiting up to `wait_s`; yields whether it got it."""
    with path.open("a") as f:
        deadline = time.monotonic() + wait_s
        while True:
            try:
                fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() >= deadline:
                    yield False
                    return
                time.sleep(0.05)
        try:
            yield True
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


# --- client environment -----------------------------------------------------------------------


def _set_client_defaults(timeout_s: int) -> None:
    """MLflow's client settings for the process, where the user set none: they are set once
    and never removed, so that a thread copying os.environ (a trial spawning torchrun)
    never sees a key vanish under it."""
    defaults = {
        "MLFLOW_HTTP_REQUEST_MAX_RETRIES": "0",
        "MLFLOW_HTTP_REQUEST_TIMEOUT": str(int(timeout_s)),
        "MLFLOW_SUPPRESS_PRINTING_URL_TO_STDOUT": "true",
    }
    for key, value in defaults.items():
        os.environ.setdefault(key, value)


def _credentials_env(username: str | None, password: str | None) -> dict[str, str]:
    if username is None or password is None:
        return {}  # MLflow reads MLFLOW_TRACKING_USERNAME / _PASSWORD as the user set them
    return {"MLFLOW_TRACKING_USERNAME": username, "MLFLOW_TRACKING_PASSWORD": password}


@contextlib.contextmanager
def _patched_env(values: dict[str, str]) -> Iterator[None]:
    saved = {key: os.environ.get(key) for key in values}
    os.environ.update(values)
    try:
        yield
    finally:
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value


# --- record contents ------------------------------------------------------------------------


def _key(key: Any) -> str:
    return _BAD_KEY_CHARS.sub("_", str(key))[:_MAX_KEY]


def _flatten(values: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    flat: dict[str, Any] = {}
    for key, value in values.items():
        name = f"{prefix}{key}"
        if isinstance(value, Mapping):
            flat |= _flatten(value, f"{name}.")
        else:
            flat[name] = value
    return flat


def _text(value: Any) -> str:
    if isinstance(value, str):
        return value
    if isinstance(value, list | tuple):
        return json.dumps(value)
    return str(value)


def _params(params: Mapping[str, Any] | None) -> dict[str, str]:
    flat = _flatten(params or {})
    return {_key(k): _text(v)[:_MAX_PARAM_VALUE] for k, v in flat.items()}


def _tags(tags: Mapping[str, Any] | None) -> dict[str, str]:
    return {_key(k): _text(v)[:_MAX_TAG_VALUE] for k, v in (tags or {}).items()}


def _metrics(metrics: Mapping[str, float] | None) -> dict[str, float]:
    return {_key(k): float(v) for k, v in (metrics or {}).items()}


def _curves(curves: Curves | None) -> dict[str, list[tuple[int, float]]]:
    return {
        _key(k): [(int(s), float(v)) for s, v in points] for k, points in (curves or {}).items()
    }


def _artifacts(artifacts: Artifacts | None) -> dict[str, str]:
    encoded = {}
    for name, content in (artifacts or {}).items():
        normalized = posixpath.normpath(name)
        if name.startswith("/") or normalized.startswith("..") or normalized == ".":
            raise ValueError(f"artifact name must be a relative path inside the run: {name!r}")
        data = content.encode() if isinstance(content, str) else bytes(content)
        encoded[normalized] = base64.b64encode(data).decode("ascii")
    return encoded


def _status(status: str | None) -> str | None:
    if status is not None and status not in RUN_STATUSES:
        raise ValueError(f"status must be one of {RUN_STATUSES}, got {status!r}")
    return status


def _quote(value: str) -> str:
    return f'"{value}"' if "'" in value else f"'{value}'"


def _check_quotable(name: str) -> None:
    if "'" in name and '"' in name:
        raise RanknasError(
            f"Study name {name!r} holds both kinds of quote (' and \"), which MLflow's run "
            "search cannot express: rename the study."
        )
