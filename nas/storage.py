"""Optuna storage: the system of record of every study, and the lock that keeps several
workers to exactly the asked number of trials."""

from __future__ import annotations

import contextlib
import difflib
import fcntl
import functools
import hashlib
import importlib.util
import json
import logging
import os
import re
import sqlite3
import threading
from collections.abc import Callable, Iterator
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

import optuna
from optuna.distributions import distribution_to_json
from optuna.exceptions import StorageInternalError, UpdateFinishedTrialError
from optuna.storages import RDBStorage
from optuna.trial import Trial, TrialState
from sqlalchemy import (
    Connection,
    DateTime,
    Engine,
    bindparam,
    create_engine,
    event,
    inspect,
    text,
)
from sqlalchemy.exc import SQLAlchemyError

from nas.trial_record import DIED, TrialAttr
from search_space.errors import RanknasError
from search_space.files import looked_for
from trainers.processes import gone_from_here

_log = logging.getLogger(__name__)


def redact(url: str) -> str:
    """`url` with its password, if any, replaced by `***`: for output, errors and logs."""
    return re.sub(r"(://[^:/@\s]+:)\S*@", r"\1***@", url)  # to the last @: p@ss/w0rd too


def standard_url(url: str) -> str:
    """A storage URL as given, with libpq's and Heroku's `postgres://` spelled as SQLAlchemy
    reads it (`postgresql://`), so that one study has one URL whichever was typed."""
    if url.startswith("postgres://"):
        return "postgresql://" + url.removeprefix("postgres://")
    return url


def normalize_url(url: str) -> str:
    """SQLAlchemy 2.1 reads `postgresql://` as psycopg 3; use psycopg2 where only it exists."""
    if url.startswith("postgresql://") and importlib.util.find_spec("psycopg") is None:
        return "postgresql+psycopg2://" + url.removeprefix("postgresql://")
    return url


def _sqlite_path(url: str) -> Path | None:
    """The file of a SQLite URL (None for another database); an URL naming no file is
    refused."""
    if not url.startswith("sqlite:///"):
        return None
    path = url.removeprefix("sqlite:///")
    if not path.strip() or path.endswith("/"):
        raise RanknasError(f"storage {url!r} names no file: give sqlite:///PATH/studies.db "
                           "(a relative PATH) or sqlite:////ABSOLUTE/PATH/studies.db")  # fmt: skip
    return Path(path)


def _make_directory(url: str, path: Path) -> None:
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise RanknasError(
            f"storage {redact(url)!r}: cannot create the directory {path.parent} ({exc.strerror}); "
            "choose a writable path"
        ) from None


def open_storage(url: str, heartbeat_seconds: int | None = None) -> RDBStorage:
    """An RDB storage; with `heartbeat_seconds`, trials whose process died are failed after
    two missed heartbeats and retried with the same parameters."""
    path = _sqlite_path(url)
    if path is not None:
        _make_directory(url, path)
    heartbeat = {}
    if heartbeat_seconds:
        heartbeat = {
            "heartbeat_interval": heartbeat_seconds,
            "grace_period": 3 * heartbeat_seconds,
            "heartbeat_stale_trial_callback": _SaidAndRetried(url, max_retry=3),
        }
    with _unreachable_as_user_error(url), _engine(url).connect() as connection:
        tables = inspect(connection).get_table_names()
    if tables and "studies" not in tables:  # Optuna would add its own beside them
        raise RanknasError(f"storage {redact(url)!r}: holds another program's tables "
                           f"({', '.join(sorted(tables)[:4])}, ...: MLflow's?), not Optuna's; "
                           "give the study storage a database of its own")  # fmt: skip
    with _unreachable_as_user_error(url):
        try:
            storage = RDBStorage(normalize_url(url), **heartbeat)
        except RuntimeError as exc:  # Optuna's schema check meets another program's tables
            raise RanknasError(f"storage {redact(url)!r}: holds tables Optuna cannot use "
                               f"({' '.join(str(exc).split())[:120]}): MLflow's database, or "
                               "another program's? Give the study storage a database of its "
                               "own") from None  # fmt: skip
    if path is not None:
        _write_ahead_log(storage.engine)
    return storage


def check_server(url: str) -> None:
    """A database server's storage answers: a wrong URL is said before the data loads
    (minutes on a large log). A SQLite file is made where the study starts."""
    if (path := _sqlite_path(url)) is not None:
        if (unwritable := _unwritable(path)) is not None:
            raise RanknasError(f"storage {redact(url)!r}: cannot write in {unwritable}: give a "
                               "storage in a writable directory")  # fmt: skip
        return
    with _unreachable_as_user_error(url), _engine(url).connect():
        pass


def _unwritable(path: Path) -> str | None:
    """Why a SQLite file at `path` could not be written (SQLite writes its lock and
    write-ahead files beside it, even to read), or None: its directory, or the nearest one
    that exists where it is still to be made, read-only or not ours."""
    directory = next(d for d in (path.parent, *path.parent.parents) if d.exists() or d == d.parent)
    if not os.access(directory, os.W_OK):
        return f"{directory} (a read-only file system, or not writable by this user)"
    if path.exists() and not os.access(path, os.W_OK):
        return f"{path} (not writable by this user)"
    return None


class _SaidAndRetried:
    """A dead worker's trial, said by the worker that failed it (a resumed study showed
    nothing of it before its summary) and retried first (`retry_first`: Optuna's own retry
    queued it behind the starting points still waiting, where a budget they filled left it
    waiting forever), up to `max_retry` deaths on one architecture."""

    def __init__(self, url: str, max_retry: int) -> None:
        self.url, self.max_retry = url, max_retry

    def __call__(self, study: optuna.Study, trial: optuna.trial.FrozenTrial) -> None:
        deaths = trial.system_attrs.get(DEATHS, len(trial.system_attrs.get("retry_history", [])))
        deaths += 1
        if deaths > self.max_retry:
            _log.warning("trial %d: the worker died (missed heartbeats), %d times on this "
                         "architecture; not retried again", trial.number, deaths)  # fmt: skip
            return
        _log.warning("trial %d: %s", trial.number, DIED)
        with study_lock(self.url, study.study_name):
            retry_first(study, trial, deaths)


# a queued retry's first run: its seed is that trial's (`runner.trial_seed`); and how many
# times a worker died training its architecture
SEED_OF, DEATHS = "ranknas:seed_of", "ranknas:deaths"


def retry_first(study: optuna.Study, trial: Any, deaths: int | None = None) -> None:
    """Queue a trial's point that did not finish (interrupted: the deaths it carried, as an
    interruption is none; or its worker died: `deaths`)
    ahead of the starting points still waiting (Optuna pops the oldest waiting trial first;
    a small budget could end before reaching a retry queued last): it takes the oldest
    waiting trial, whose own point is queued again at the end. The retry trains with the
    first run's seed (`runner.trial_seed`). Call it holding the study lock, so no worker
    pops that trial between the read and the write. A waiting trial that holds params (a
    retry Optuna queued in a study from before) is passed over: Optuna uses those instead of
    any queued ones."""
    storage = study._storage
    system = storage.get_trial_system_attrs(trial._trial_id)
    seed_of = first_run(trial.number, system)
    marks = {SEED_OF: seed_of, DEATHS: system.get(DEATHS, 0) if deaths is None else deaths}
    waiting = study.get_trials(deepcopy=False, states=(TrialState.WAITING,))
    waiting = [t for t in waiting if not t.params]
    if not waiting or not trial.params:  # died before its point was drawn: a fresh draw
        _enqueue(study, trial.params, marks)
        return
    first = waiting[0]
    moved = first.system_attrs.get("fixed_params", first.params)
    carried = {k: v for k, v in first.system_attrs.items() if k in (SEED_OF, DEATHS)}
    storage.set_trial_system_attr(first._trial_id, "fixed_params", trial.params)
    for key, value in marks.items():  # the retry's, replacing what the moved point had
        storage.set_trial_system_attr(first._trial_id, key, value)
    _enqueue(study, moved, carried)  # with its own seed and deaths


def _enqueue(study: optuna.Study, params: dict[str, Any], marks: dict[str, Any]) -> None:
    """`study.enqueue_trial(params)` with `marks` among the queued trial's system attributes,
    in one write (another worker may queue a trial in between two)."""
    marked = {"fixed_params": params} | marks
    study.add_trial(optuna.trial.create_trial(state=TrialState.WAITING, system_attrs=marked))


def first_run(number: int, system_attrs: dict[str, Any]) -> int:
    """Of the trials one run passed through (interrupted, or its worker died, and retried),
    the first one's number: ranknas's mark, else Optuna's heartbeat retry's (a study from
    before)."""
    return system_attrs.get(SEED_OF, system_attrs.get("failed_trial", number))


@contextlib.contextmanager
def _unreachable_as_user_error(url: str) -> Iterator[None]:
    """A database that cannot be reached or opened: one error naming it (password hidden)."""
    try:
        yield
    except (SQLAlchemyError, ImportError, ValueError) as exc:
        reason = _driver_message(exc).replace(url, redact(url))
        hint = (f"; a SQLite file is given as sqlite:///{url}" if "://" not in url
                else "; check the URL, and that the database is up and is Optuna's")  # fmt: skip
        if isinstance(exc, ImportError):  # a driver the URL names, not installed here
            driver = f"the driver {exc.name}" if exc.name else "the URL's database driver"
            hint = f"; install {driver} in this environment"
            if url.startswith("postgresql"):
                hint += " (postgresql://... uses psycopg, which ranknas installs)"
        if url.partition("://")[2].count("@") > 1:  # the password's own @ split the URL
            hint += " (in a password, write @ as %40 and / as %2F)"
        raise RanknasError(f"storage {redact(url)!r}: cannot open it ({redact(reason)}){hint}"
                           ) from None  # fmt: skip


def _driver_message(exc: Exception) -> str:
    """The database's own words, without SQLAlchemy's SQL text and web link."""
    orig = getattr(exc, "orig", None)  # a DBAPIError's driver exception
    text = str(orig) if orig is not None else str(exc)
    text = text.split("\n(Background on this error")[0].split("\n[SQL:")[0]
    return f"{type(orig or exc).__name__}: {' '.join(text.split())}"


def _write_ahead_log(engine: Engine) -> None:
    """SQLite in WAL mode with synchronous=NORMAL: readers no longer block the writer, and a
    commit appends to the log without an fsync, where the default journal fsyncs each of a
    trial's ~34 transactions (most of a trial's platform overhead; see BENCHMARKS.md). A
    crashed process loses nothing; a power cut can lose the last commits, not the file."""

    def on_connect(connection, _record) -> None:
        cursor = connection.cursor()
        cursor.execute("PRAGMA journal_mode=WAL")
        cursor.execute("PRAGMA synchronous=NORMAL")
        cursor.close()

    event.listen(engine, "connect", on_connect)
    engine.dispose()  # connections pooled while the schema was created lack the pragmas


def fail_stale_trials(study: optuna.Study, storage: RDBStorage) -> None:
    """Fail and retry the trials whose process died, as Optuna does, and also those that died
    before their first heartbeat: Optuna never deems a trial stale without one, so a kill
    between asking for a trial and its first beat would keep it running forever, and a
    resumed study would wait on it. A trial whose worker was a process of this machine
    that is gone is stale at once: waiting out its heartbeat, a resumed study filled its
    budget with new trials first, and the retry, queued after, was never run."""
    grace = storage.grace_period or 2 * (storage.heartbeat_interval or 0)
    started_before = datetime.now() - timedelta(seconds=grace)
    running = study.get_trials(deepcopy=False, states=(TrialState.RUNNING,))
    old = [t._trial_id for t in running if t.datetime_start and t.datetime_start < started_before]
    gone = [t._trial_id for t in running if gone_from_here(t.user_attrs.get(TrialAttr.PROCESS))]
    if old or gone:
        with storage.engine.connect() as connection:  # Optuna's schema: one row per beating trial
            rows = connection.execute(
                text("SELECT trial_id FROM trial_heartbeats WHERE trial_id IN :ids").bindparams(
                    bindparam("ids", expanding=True)
                ),
                {"ids": old + gone},
            )
            beaten = {row[0] for row in rows}
        for trial_id in set(old + gone) - beaten:  # beat once for it: stale one grace later
            storage.record_heartbeat(trial_id)
    if gone:  # its last beat long ago: stale now
        with _transaction(storage) as connection:
            connection.execute(
                text("UPDATE trial_heartbeats SET heartbeat = :then WHERE trial_id IN :ids")
                .bindparams(bindparam("ids", expanding=True), bindparam("then", type_=DateTime)),
                {"then": datetime(2000, 1, 1), "ids": gone},
            )  # fmt: skip
    optuna.storages.fail_stale_trials(study)


_UPSERT_USER_ATTR = text(
    'INSERT INTO trial_user_attributes (trial_id, "key", value_json) '
    "VALUES (:trial_id, :key, :value_json) "
    'ON CONFLICT (trial_id, "key") DO UPDATE SET value_json = excluded.value_json'
)


def _batching_backend(trial: Trial) -> RDBStorage | None:
    """The RDB storage under Optuna's cache, where ranknas writes a trial's rows in one
    transaction: SQLite (3.24 or later: upserts) and PostgreSQL; None elsewhere."""
    storage = getattr(trial.storage, "_backend", trial.storage)
    if not isinstance(storage, RDBStorage):
        return None
    if storage.engine.name == "sqlite" and sqlite3.sqlite_version_info >= (3, 24, 0):
        return storage
    return storage if storage.engine.name == "postgresql" else None


@contextlib.contextmanager
def _transaction(storage: RDBStorage) -> Iterator[Connection]:
    """One transaction; a database error as Optuna reports its own (`StorageInternalError`,
    which the CLI tells as one line)."""
    try:
        with storage.engine.begin() as connection:
            yield connection
    except SQLAlchemyError as exc:
        raise StorageInternalError(f"a write to the study's storage failed: {exc}") from exc


def set_user_attrs(trial: Trial, attrs: dict[str, Any]) -> None:
    """`trial.set_user_attr(key, value)` for each of `attrs`, in one transaction: Optuna
    commits each one on its own, and a trial records ~20 (on PostgreSQL ~4.5 ms each, a
    commit and its round trips; BENCHMARKS.md). Upserts into Optuna's own table; where
    `_batching_backend` is None, one at a time."""
    storage = _batching_backend(trial)
    if storage is None or not attrs:
        for key, value in attrs.items():
            trial.set_user_attr(key, value)
        return
    rows = [{"trial_id": trial._trial_id, "key": key, "value_json": json.dumps(value)}
            for key, value in attrs.items()]  # fmt: skip
    with _transaction(storage) as connection:
        state = connection.execute(text("SELECT state FROM trials WHERE trial_id = :id"),
                                   {"id": trial._trial_id}).scalar()  # fmt: skip
        if state is None:
            raise KeyError(f"no trial with id {trial._trial_id}")
        if TrialState[state].is_finished():  # as Optuna refuses it
            raise UpdateFinishedTrialError(f"trial {trial.number} is {state}: it cannot be updated")
        connection.execute(_UPSERT_USER_ATTR, rows)
    trial._cached_frozen_trial.user_attrs.update(attrs)  # what trial.set_user_attr keeps too


_INSERT_PARAM = text(
    "INSERT INTO trial_params (trial_id, param_name, param_value, distribution_json) "
    "VALUES (:trial_id, :name, :value, :distribution)"
)


class _DeferredParams:
    """A trial's storage that keeps `set_trial_param` calls for one transaction later and
    passes everything else through."""

    def __init__(self, storage: Any) -> None:
        self.storage, self.pending = storage, []

    def __getattr__(self, name: str) -> Any:
        return getattr(self.storage, name)

    def set_trial_param(self, trial_id: int, name: str, value: float, distribution) -> None:
        self.pending.append({"trial_id": trial_id, "name": name, "value": value,
                             "distribution": distribution_to_json(distribution)})  # fmt: skip


@contextlib.contextmanager
def params_in_one_transaction(trial: Trial) -> Iterator[None]:
    """The trial's `suggest_*` calls inside the block, recorded in one transaction as it
    ends: Optuna commits each parameter on its own, 18 a trial around DLRM (BENCHMARKS.md,
    "A trial's storage writes"). Optuna's check that a name keeps its distribution across
    trials is left to the study's own check of its search space
    (`runner._check_search_space`). Where `_batching_backend` is None, one at a time."""
    storage = _batching_backend(trial)
    if storage is None:
        yield
        return
    deferred = _DeferredParams(trial.storage)
    trial.storage = deferred
    try:
        yield
    finally:
        trial.storage = deferred.storage
        if deferred.pending:  # what was drawn before an error too, as one at a time would
            with _transaction(storage) as connection:
                connection.execute(_INSERT_PARAM, deferred.pending)


def check_exists(url: str, what: str = "no studies") -> None:
    """Refuse a SQLite storage whose file is missing, or a database without Optuna's tables,
    for a command that only reads (opening it would create an empty one, or write Optuna's
    tables into another program's database, and a mistyped path would look like studies
    lost)."""
    path = _sqlite_path(url)
    if path is not None and not path.exists():
        elsewhere = (
            "run this from the directory the study ran in, " if not path.is_absolute() else ""
        )  # a search here would start anew
        raise StudyNotFound(f"{what}: the storage {path} does not exist{looked_for(path)}; "
                           f"{elsewhere}run `ranknas search CONFIG` first, or give its "
                           "--storage")  # fmt: skip
    if path is not None and (unwritable := _unwritable(path)) is not None:
        raise RanknasError(f"{what}: cannot read the storage {path}: SQLite writes beside its "
                           f"file even to read it, and cannot in {unwritable}; copy the file to "
                           "a writable directory and give that --storage")  # fmt: skip
    with _unreachable_as_user_error(url), _engine(url).connect() as connection:
        optuna_tables = inspect(connection).has_table("studies")
    if not optuna_tables:  # opening it would write Optuna's tables there (MLflow's database)
        raise StudyNotFound(f"{what}: the database {redact(url)} holds no Optuna studies; give "
                           "the storage `ranknas search` used (a database of its own)")  # fmt: skip


def other_sqlite_holding(url: str, other: str, name: str, key: str, value: Any) -> bool:
    """Whether `other`, a SQLite storage of another file than `url`'s, exists and holds
    study `name` with user attribute `key` at `value` (read-only: nothing is created)."""
    here, there = _sqlite_path(url), _sqlite_path(other)
    if here is None or there is None or not there.is_file():
        return False
    if here.exists() and here.samefile(there):
        return False
    query = ("SELECT a.value_json FROM study_user_attributes a JOIN studies s "
             "ON a.study_id = s.study_id WHERE s.study_name = ? AND a.key = ?")  # fmt: skip
    try:
        with contextlib.closing(
            sqlite3.connect(f"{there.resolve().as_uri()}?mode=ro", uri=True)
        ) as db:
            rows = db.execute(query, (name, key)).fetchall()
    except sqlite3.Error:  # not Optuna's, or unreadable: no study there to protect
        return False
    return any(json.loads(row[0]) == value for row in rows)


def recorded_attrs(storage: RDBStorage, name: str) -> dict[str, Any] | None:
    """The user attributes of study `name` in `storage`; None where it does not exist."""
    try:
        return storage.get_study_user_attrs(storage.get_study_id_from_name(name))
    except KeyError:
        return None


class StudyNotFound(RanknasError):
    """The storage answers, and holds no such study (yet: a `worker --wait` waits for it)."""


def existing_study(name: str, url: str) -> optuna.Study | None:
    """The study `name`, or None where it does not exist yet (a first worker creating it)."""
    try:
        return load_study(name, url)
    except RanknasError:
        return None


def load_study(name: str, url: str) -> optuna.Study:
    """The study `name`, which must exist (a missing SQLite file is not created)."""
    check_exists(url, f"no study {name!r}")
    with study_lock(url, name):  # not while a study starting there creates Optuna's tables
        storage = open_storage(url)
    try:
        return optuna.load_study(study_name=name, storage=storage)
    except KeyError:
        every = [s.study_name for s in optuna.get_all_study_summaries(storage)]
        # not a baseline's recipe trials (`baselines.tuning_study_name`): part of their study
        names = [n for n in every if not any(n.startswith(f"{o}.tune.") for o in every)]
        raise StudyNotFound(f"no study {name!r} in {redact(url)}; {_listed(name, names)}") from None


def _listed(name: str, names: list[str], most: int = 10) -> str:
    """The studies a storage holds, those named like `name` first, at most `most` (a shared
    database listed every user's)."""
    close = difflib.get_close_matches(name, names, n=most, cutoff=0.5)
    shown = [*close, *(n for n in names if n not in close)][:most]
    more = f" and {len(names) - most} more" if len(names) > most else ""
    if close:
        return f"did you mean {close[0]!r}? Studies there: {', '.join(shown)}{more}"
    return f"studies there: {', '.join(shown) or 'none'}{more}"


@functools.cache
def _engine(url: str) -> Engine:
    return create_engine(normalize_url(url))


@contextlib.contextmanager
def study_lock(url: str, study_name: str) -> Iterator[None]:
    """Serialize "check the budget, then ask for a trial" across every worker of a study:
    a file lock beside a SQLite database, an advisory lock on PostgreSQL."""
    path = _sqlite_path(url)
    if path is not None:
        _make_directory(url, path)
        lock = path.with_suffix(path.suffix + ".lock")
        try:
            handle = open(lock, "w")  # noqa: SIM115 (closed below; the error is said apart)
        except OSError as exc:
            raise RanknasError(f"storage {redact(url)!r}: cannot write its lock file {lock} "
                               f"({exc.strerror}): give a storage in a writable "
                               "directory") from None  # fmt: skip
        with handle:
            fcntl.flock(handle, fcntl.LOCK_EX)
            yield
        return
    if url.startswith("postgresql"):
        key = int.from_bytes(hashlib.sha256(study_name.encode()).digest()[:8], "big", signed=True)
        with _unreachable_as_user_error(url):
            connection = _engine(url).connect()
        with connection:
            connection.execute(text("SELECT pg_advisory_lock(:key)"), {"key": key})
            try:
                yield
            finally:
                connection.execute(text("SELECT pg_advisory_unlock(:key)"), {"key": key})
        return
    yield  # other databases: best effort


@contextlib.contextmanager
def beating(seconds: float, beat: Callable[[], None]) -> Iterator[None]:
    """Call `beat` every `seconds` in a daemon thread while the block runs (heartbeats of
    trials and of baseline claims)."""
    stop = threading.Event()

    def loop() -> None:
        while not stop.wait(seconds):
            beat()

    thread = threading.Thread(target=loop, daemon=True)
    thread.start()
    try:
        yield
    finally:
        stop.set()
        thread.join(seconds)  # a beat under way lands before what the caller does next
