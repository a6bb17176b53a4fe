"""StudyLogger against a real `mlflow server` on 127.0.0.1, including an outage."""

import shutil
import socket
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import pytest
from mlflow import MlflowClient
from mlflow.entities import Run

from mlflow_server import ServerConfig, ServerInfo, StudyLogger, down, up
from search_space.errors import RanknasError

PNG = b"\x89PNG\r\n\x1a\n" + bytes(range(256))


@pytest.fixture
def client(server: ServerInfo) -> MlflowClient:
    return MlflowClient(tracking_uri=server.uri)


def _runs(client: MlflowClient, experiment: str) -> list[Run]:
    experiment_id = client.get_experiment_by_name(experiment).experiment_id
    return client.search_runs([experiment_id], max_results=1000)


def _trial_runs(client: MlflowClient, experiment: str) -> dict[int, Run]:
    trials = [r for r in _runs(client, experiment) if r.data.tags["ranknas.kind"] == "trial"]
    numbers = [int(r.data.tags["ranknas.trial"]) for r in trials]
    assert len(numbers) == len(set(numbers)), f"duplicate trial runs: {sorted(numbers)}"
    return dict(zip(numbers, trials, strict=True))


def _parent_run(client: MlflowClient, experiment: str) -> Run:
    parents = [r for r in _runs(client, experiment) if r.data.tags["ranknas.kind"] == "study"]
    assert len(parents) == 1
    return parents[0]


def _log_trial(logger: StudyLogger, number: int) -> None:
    logger.log_trial(
        number,
        params={"arch": {"blocks": 2 + number, "op": "mlp"}, "lr": 0.01},
        metrics={"ne": 0.9 - number / 100},
        curves={"train_loss": [(step, 1.0 / (step + 1)) for step in range(3)]},
        tags={"searcher": "random"},
        artifacts={"architecture.json": f'{{"trial": {number}}}'},
    )


def test_study_with_two_nested_trials(
    client: MlflowClient, server: ServerInfo, tmp_path: Path
) -> None:
    logger = StudyLogger(server.uri, tmp_path / "outbox")
    logger.start_study(
        "study-a", params={"space": {"name": "nasrec", "depth": 3}}, tags={"owner": "me"}
    )
    logger.log_trial(
        0,
        params={"arch": {"blocks": 3, "widths": [64, 32]}, "lr": 0.01, "note": "x" * 7000},
        metrics={"ne": 0.81, "mflops": 12.5},
        curves={"train_loss": [(0, 0.7), (10, 0.6), (20, 0.55)]},
        tags={"searcher": "random"},
        artifacts={"architecture.json": '{"blocks": 3}', "plots/curve.png": PNG},
    )
    _log_trial(logger, 1)
    logger.log_study_summary(metrics={"best_ne": 0.81}, artifacts={"pareto.png": PNG})
    assert logger.flush(timeout_s=30) == 0
    assert logger.failures() == [] and logger.last_error is None

    parent = _parent_run(client, "study-a")
    assert parent.info.run_name == "study-a" and parent.info.status == "FINISHED"
    assert parent.data.params == {"space.name": "nasrec", "space.depth": "3"}
    assert parent.data.tags["owner"] == "me" and parent.data.tags["ranknas.study"] == "study-a"
    assert parent.data.metrics == {"best_ne": 0.81}

    trials = _trial_runs(client, "study-a")
    assert sorted(trials) == [0, 1]
    trial = trials[0]
    assert trial.info.run_name == "trial-0" and trial.info.status == "FINISHED"
    assert all(t.data.tags["mlflow.parentRunId"] == parent.info.run_id for t in trials.values())
    params = trial.data.params
    assert params["arch.blocks"] == "3" and params["arch.widths"] == "[64, 32]"
    assert params["lr"] == "0.01" and len(params["note"]) == 6000  # truncated to MLflow's limit
    assert trial.data.metrics["ne"] == 0.81 and trial.data.metrics["mflops"] == 12.5
    assert trial.data.tags["searcher"] == "random"
    history = client.get_metric_history(trial.info.run_id, "train_loss")
    assert sorted((m.step, m.value) for m in history) == [(0, 0.7), (10, 0.6), (20, 0.55)]

    files = Path(client.download_artifacts(trial.info.run_id, "", str(tmp_path / "dl")))
    assert (files / "architecture.json").read_text() == '{"blocks": 3}'
    assert (files / "plots" / "curve.png").read_bytes() == PNG
    pareto = client.download_artifacts(parent.info.run_id, "pareto.png", str(tmp_path / "p"))
    assert Path(pareto).read_bytes() == PNG


def test_relogging_a_trial_and_resuming_a_study_do_not_duplicate_runs(
    client: MlflowClient, server: ServerInfo, tmp_path: Path
) -> None:
    first = StudyLogger(server.uri, tmp_path / "outbox-1")
    first.start_study("study-b", params={"budget": 10})
    _log_trial(first, 0)
    _log_trial(first, 0)
    assert first.flush(timeout_s=30) == 0
    resumed = StudyLogger(server.uri, tmp_path / "outbox-2")  # a new process, same study
    resumed.start_study("study-b", params={"budget": 10})
    _log_trial(resumed, 1)
    assert resumed.flush(timeout_s=30) == 0
    _parent_run(client, "study-b")
    trials = _trial_runs(client, "study-b")
    assert sorted(trials) == [0, 1]
    # Two log_trial calls are two logs (two timestamps) into the same run.
    history = client.get_metric_history(trials[0].info.run_id, "train_loss")
    assert sorted(m.step for m in history) == [0, 0, 1, 1, 2, 2]
    # a repeat (kind repeat) whose worker died mid-tell, logged again as a failed trial:
    # one run, of the last record's kind
    resumed.log_trial(2, metrics={"val_ne": 0.9}, tags={"reused_from": 1})
    resumed.log_trial(2, status="FAILED", tags={"status": "failed"})
    assert resumed.flush(timeout_s=30) == 0
    runs = [r for r in _runs(client, "study-b") if r.data.tags.get("ranknas.trial") == "2"]
    assert [r.data.tags["ranknas.kind"] for r in runs] == ["trial"]


def test_outage_keeps_records_and_delivers_them_once_in_order(
    client: MlflowClient, server_config: ServerConfig, server: ServerInfo, tmp_path: Path
) -> None:
    outbox = tmp_path / "outbox"
    logger = StudyLogger(server.uri, outbox, retry_interval_s=0)
    logger.start_study("study-c", params={"budget": 8})
    _log_trial(logger, 0)
    assert logger.flush(timeout_s=30) == 0

    down(server_config)
    for number in range(1, 5):
        started = time.monotonic()
        _log_trial(logger, number)
        assert time.monotonic() - started < 2, "an unreachable server must cost little time"
    logger.log_study_summary(metrics={"best_ne": 0.86})
    assert logger.flush(timeout_s=0.5) == 5 and logger.last_error is not None
    backup = tmp_path / "outbox-before-delivery.db"
    shutil.copy(outbox / "outbox.db", backup)

    up(server_config)  # no new record, no flush: the courier retries on its own
    deadline = time.monotonic() + 30
    while (logger.pending() or logger.last_error) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert logger.pending() == 0 and logger.last_error is None
    # A crash after sending but before marking: every record is delivered a second time.
    logger.close()
    shutil.copy(backup, outbox / "outbox.db")
    assert logger.pending() == 5
    assert logger.flush(timeout_s=30) == 0

    trials = _trial_runs(client, "study-c")
    assert sorted(trials) == [0, 1, 2, 3, 4]
    starts = [trials[n].info.start_time for n in range(5)]
    assert starts == sorted(starts), "trials must be delivered in the order they were logged"
    for run in trials.values():
        assert len(client.get_metric_history(run.info.run_id, "train_loss")) == 3
    parent = _parent_run(client, "study-c")
    assert parent.data.metrics["best_ne"] == 0.86 and parent.info.status == "FINISHED"
    with sqlite3.connect(outbox / "outbox.db") as conn:
        states = conn.execute("SELECT state, COUNT(*) FROM records GROUP BY state").fetchall()
    assert states == [("done", 7)]


def test_a_study_started_while_the_server_is_down_starts_when_it_did(
    client: MlflowClient, server_config: ServerConfig, server: ServerInfo, tmp_path: Path
) -> None:
    """The parent run started when its record was delivered, after its own trials."""
    down(server_config)
    try:
        logger = StudyLogger(server.uri, tmp_path / "outbox", retry_interval_s=0)
        started_ms = int(time.time() * 1000)
        logger.start_study("study-late")
        time.sleep(1.5)
        _log_trial(logger, 0)
        assert logger.flush(timeout_s=0.5) == 2
    finally:
        up(server_config)
    assert logger.flush(timeout_s=30) == 0
    logger.close()
    parent = _parent_run(client, "study-late")
    assert started_ms <= parent.info.start_time < started_ms + 1000


def test_unreachable_server_costs_little_and_flush_gives_up_in_time(tmp_path: Path) -> None:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]  # nothing listens here once the socket is closed
    logger = StudyLogger(f"http://127.0.0.1:{port}", tmp_path / "outbox")
    started = time.monotonic()
    logger.start_study("study-d")
    _log_trial(logger, 0)
    _log_trial(logger, 1)
    assert logger.pending() == 3
    assert logger.flush(timeout_s=1.0) == 3
    assert time.monotonic() - started < 5
    assert "Connection refused" in logger.last_error or "connect" in logger.last_error.lower()


def test_logging_does_not_wait_for_a_server_that_does_not_answer(tmp_path: Path) -> None:
    with socket.socket() as silent:  # accepts connections (the kernel does) and never answers
        silent.bind(("127.0.0.1", 0))
        silent.listen(8)
        logger = StudyLogger(f"http://127.0.0.1:{silent.getsockname()[1]}", tmp_path / "outbox",
                             request_timeout_s=5)  # fmt: skip
        started = time.monotonic()
        logger.start_study("study-silent")
        for number in range(3):
            _log_trial(logger, number)
        assert time.monotonic() - started < 2.5, "a trial must not wait on MLflow's answer"
        assert logger.flush(timeout_s=0.5) == 4  # no answer comes, to the courier or to flush
        logger.close(timeout_s=0)


def test_a_process_that_exits_without_flush_delivers_what_it_queued(
    client: MlflowClient, server: ServerInfo, tmp_path: Path
) -> None:
    """As after a Ctrl-C: the record queued last (the interrupted trial's) is not left for
    the next run when the server answers."""
    script = (
        "import sys\n"
        "from mlflow_server import StudyLogger\n"
        "logger = StudyLogger(sys.argv[1], sys.argv[2])\n"
        "logger.start_study('study-exit')\n"
        "logger.log_trial(0, metrics={'ne': 0.9}, status='KILLED')\n"
    )
    outbox = tmp_path / "outbox"
    run = subprocess.run([sys.executable, "-c", script, server.uri, str(outbox)],
                         capture_output=True, text=True, timeout=120)  # fmt: skip
    assert run.returncode == 0, run.stderr
    assert StudyLogger(server.uri, outbox).pending() == 0
    assert _trial_runs(client, "study-exit")[0].info.status == "KILLED"


def test_the_courier_outlives_an_unexpected_failure(
    client: MlflowClient, server: ServerInfo, tmp_path: Path, caplog
) -> None:
    """An error that is not the server's (the outbox's disk, say) stops one delivery, not
    the courier: it retries by itself."""
    logger = StudyLogger(server.uri, tmp_path / "outbox", retry_interval_s=1)
    deliver, failures = logger._writer.deliver, []

    def fails_once(kind, record):
        if not failures:
            failures.append(kind)
            raise sqlite3.OperationalError("disk I/O error")
        deliver(kind, record)

    logger._writer.deliver = fails_once
    logger.start_study("study-courier")
    _log_trial(logger, 0)
    deadline = time.monotonic() + 30
    while logger.pending() and time.monotonic() < deadline:  # no flush: the courier alone
        time.sleep(0.2)
    assert failures and logger.pending() == 0 and "disk I/O error" in caplog.text
    assert sorted(_trial_runs(client, "study-courier")) == [0]


def test_a_refused_record_is_set_aside_and_the_rest_delivered(
    client: MlflowClient, server: ServerInfo, tmp_path: Path
) -> None:
    logger = StudyLogger(server.uri, tmp_path / "outbox")
    logger.start_study("study-e")
    logger.log_trial(0, params={"lr": 0.1})
    logger.log_trial(0, params={"lr": 0.2})  # MLflow refuses to change a logged param
    logger.log_trial(1, params={"lr": 0.3})
    assert logger.flush(timeout_s=30) == 0
    failures = logger.failures()
    assert len(failures) == 1 and "(trial)" in failures[0]
    assert sorted(_trial_runs(client, "study-e")) == [0, 1]


def test_logging_before_start_study_and_bad_names_are_refused(tmp_path: Path) -> None:
    logger = StudyLogger("http://127.0.0.1:1", tmp_path / "outbox")
    with pytest.raises(RuntimeError, match="start_study"):
        logger.log_trial(0)
    with pytest.raises(RanknasError, match="quote"):
        logger.start_study("""it's "quoted\"""")
    logger.start_study("ok")
    with pytest.raises(ValueError, match="relative path"):
        logger.log_trial(0, artifacts={"../escape.txt": "x"})
    with pytest.raises(ValueError, match="status"):
        logger.log_trial(0, status="DONE")


def test_the_study_view_lists_its_runs_by_validation_ne_with_the_comparison_columns(
    client: MlflowClient, server: ServerInfo, tmp_path: Path
) -> None:
    """The experiment holds the study's view where the UI keeps shared views; its filter and
    order, run on the server, give this study's runs best first (not another study's in the
    same experiment), and `view_url` opens it."""
    import json

    from mlflow_server.tracking import REEVAL_COLUMNS, SHARED_VIEW_PREFIX, VIEW_COLUMNS, view_key

    loggers = {}
    for study in ("view-a", "view b"):
        logger = loggers[study] = StudyLogger(server.uri, tmp_path / study)
        assert logger.view_url() is None  # nothing delivered yet
        logger.start_study(study, experiment_name="views")
        for number, ne in enumerate((0.93, 0.91, 0.95)):
            logger.log_trial(number, metrics={"val_ne": ne, "test_ne": ne + 0.01})
        # a repeat of trial 1's architecture: its figures again, not in the view
        logger.log_trial(3, metrics={"val_ne": 0.91}, tags={"reused_from": 1})
        # a tuned baseline's recipe trial: under its baseline in the runs, not in the view
        logger.log_baseline_tuning("dlrm", 0, metrics={"val_ne": 0.5})
        assert logger.flush(timeout_s=30) == 0
    experiment = client.get_experiment_by_name("views")
    url = loggers["view b"].view_url()
    assert url == (f"{server.uri}/#/experiments/{experiment.experiment_id}/runs"
                   "?viewStateShareKey=ranknas-view_b")  # fmt: skip
    view = json.loads(experiment.tags[SHARED_VIEW_PREFIX + view_key("view b")])
    assert view["orderByKey"] == "metrics.`val_ne`" and view["orderByAsc"] is True
    assert view["selectedColumns"] == list(VIEW_COLUMNS)
    logged = {f"metrics.`{m}`" for m in ("val_ne", "test_ne", "val_auc", "mflops", "params")}
    assert {c for c in VIEW_COLUMNS if c.startswith("metrics.")} == logged  # no `runs`
    shown = client.search_runs([experiment.experiment_id], filter_string=view["searchFilter"],
                               order_by=["metrics.val_ne ASC"])  # fmt: skip
    assert {r.data.tags["ranknas.study"] for r in shown} == {"view b"}
    names = [r.info.run_name for r in shown]  # the baseline, without val_ne, last
    assert names == ["trial-1", "trial-0", "trial-2", "baseline-dlrm"]  # not the study's run
    # after `reevaluate` (seed means on trials 1 and 2): by the rank the study's summary
    # writes (`leaderboard.view_ranks`: trial 2 best by its seeds), the rank and the seed
    # means' columns shown
    loggers["view b"].start_study("view b", experiment_name="views", reevaluated=True)
    for number, mean, rank in ((1, 0.92, 2), (2, 0.90, 1), (0, None, 3)):
        metrics = {"rank": rank} | ({"reeval_mean_val_ne": mean} if mean else {})
        loggers["view b"].log_trial(number, metrics=metrics, status=None)
    assert loggers["view b"].flush(timeout_s=30) == 0
    experiment = client.get_experiment_by_name("views")
    view = json.loads(experiment.tags[SHARED_VIEW_PREFIX + view_key("view b")])
    assert view["orderByKey"] == "metrics.`rank`" and view["orderByAsc"] is True
    assert view["selectedColumns"][0] == "metrics.`rank`"
    assert set(REEVAL_COLUMNS) < set(view["selectedColumns"]) == set(view["columnOrder"][1:])
    shown = client.search_runs([experiment.experiment_id], filter_string=view["searchFilter"],
                               order_by=["metrics.rank ASC"])  # fmt: skip
    names = [r.info.run_name for r in shown]  # the baseline, without a rank here, after
    assert names == ["trial-2", "trial-1", "trial-0", "baseline-dlrm"]  # not the study's run


def test_the_outbox_keeps_what_it_logged_and_an_old_outbox_says_it_cannot(tmp_path: Path) -> None:
    """`logged()` names every trial and baseline queued for its server, delivered or not;
    an outbox written before it kept them gains the columns and answers None."""
    logger = StudyLogger("http://127.0.0.1:1", tmp_path / "new")  # nothing is delivered
    logger.start_study("study-l")
    assert logger.logged() == set()
    _log_trial(logger, 3)
    logger.log_baseline("dlrm", metrics={"val_ne": 0.9})
    logger.log_baseline_tuning("dlrm", 0, metrics={"val_ne": 0.91})
    assert logger.logged() == {"trial:3", "baseline:dlrm", "baseline:dlrm:recipe-0"}
    moved = StudyLogger("http://127.0.0.1:2", tmp_path / "new")  # a new server: none there
    assert moved.logged() == set()
    same = StudyLogger("http://user:secret@127.0.0.1:1/", tmp_path / "new")  # the same one
    assert same.logged() == logger.logged()
    with sqlite3.connect(tmp_path / "new" / "outbox.db") as conn:
        assert {row[0] for row in conn.execute("SELECT uri FROM records")} == {"http://127.0.0.1:1"}
    old = tmp_path / "old"
    old.mkdir()
    with sqlite3.connect(old / "outbox.db") as conn:
        conn.execute("CREATE TABLE records (id INTEGER PRIMARY KEY AUTOINCREMENT, kind TEXT "
                     "NOT NULL, payload TEXT, state TEXT NOT NULL DEFAULT 'pending', "
                     "created_at REAL NOT NULL, finished_at REAL, error TEXT)")  # fmt: skip
        conn.execute("INSERT INTO records (kind, state, created_at) VALUES ('trial', 'done', 0)")
    assert StudyLogger("http://127.0.0.1:1", old).logged() is None


def test_a_tuned_baseline_run_is_named_by_its_architecture(
    tmp_path: Path, server: ServerInfo, client: MlflowClient
) -> None:
    """Its recipe runs came first and made its run, named `baseline-dlrm`; the baseline's
    own record found it and kept that name."""
    logger = StudyLogger(server.uri, tmp_path / "outbox")
    logger.start_study("study-named")
    logger.log_baseline_tuning("dlrm", 0, metrics={"val_ne": 0.91})
    name = "baseline-dlrm mlp>dot 0.1 MFLOPs"
    logger.log_baseline("dlrm", metrics={"val_ne": 0.9}, run_name=name)
    assert logger.flush(timeout_s=30) == 0
    (run,) = [r for r in _runs(client, "study-named") if r.data.tags["ranknas.kind"] == "baseline"]
    assert run.info.run_name == name


def test_a_database_as_tracking_uri_is_shown_the_ui_that_serves_it() -> None:
    """With `tracking_uri: sqlite:///mlruns.db` the study's view was printed as the address
    `sqlite:///mlruns.db/#/experiments/...`, which no browser opens."""
    from mlflow_server.tracking import study_view_url

    served = study_view_url("http://127.0.0.1:5000/", "3", "s")
    assert served.startswith("http://127.0.0.1:5000/#/experiments/3/runs?viewStateShareKey=")
    local = study_view_url("sqlite:///mlruns.db", "3", "s")
    assert local.startswith("http://127.0.0.1:5000/#/experiments/3/runs?viewStateShareKey=")
    assert local.endswith("(once `mlflow ui --backend-store-uri sqlite:///mlruns.db` runs)")
