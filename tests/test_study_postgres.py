"""Two workers share one study in PostgreSQL and run exactly the asked trials, none twice.

Needs a PostgreSQL server: the URL comes from RANKNAS_TEST_POSTGRES_URL (`.ci/run` sets it
to the machine's local server and starts it if it is down). Without the variable the tests
are skipped; with it set and nothing answering they fail, so CI cannot pass without
PostgreSQL.
"""

import os
import subprocess
import sys
import time
import uuid

import pytest
from mlflow import MlflowClient
from optuna.trial import TrialState
from sqlalchemy import create_engine, text

from nas.storage import load_study, normalize_url
from study_helpers import counted, tiny_config, trial_runs, write_config

URL = os.environ.get("RANKNAS_TEST_POSTGRES_URL")


pytestmark = pytest.mark.skipif(
    not URL, reason="RANKNAS_TEST_POSTGRES_URL is not set (.ci/run sets it)"
)


@pytest.fixture(autouse=True)
def _postgres_answers():
    try:
        with create_engine(normalize_url(URL)).connect() as connection:
            connection.execute(text("SELECT 1"))
    except Exception as exc:
        pytest.fail(f"RANKNAS_TEST_POSTGRES_URL={URL} is set but unreachable: {exc}")


def _worker(path, command: str = "worker") -> subprocess.Popen:
    """A `search` (it starts the study) or a `worker`: one joins a started study only."""
    command = [sys.executable, "-m", "nas.cli", command, str(path)]
    return subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


def _search_then_worker(path, name: str) -> tuple[subprocess.Popen, subprocess.Popen]:
    """A `search` and, once it has created the study, a `worker` joining it."""
    search = _worker(path, "search")
    deadline = time.monotonic() + 120
    while not _exists(name) and time.monotonic() < deadline and search.poll() is None:
        time.sleep(0.3)
    return search, _worker(path)


def _exists(name: str) -> bool:
    try:
        load_study(name, URL)
    except Exception:  # not created yet
        return False
    return True


def _check_distinct_and_exact(study, trials: int) -> None:
    done = [t for t in study.trials if t.state in (TrialState.COMPLETE, TrialState.PRUNED)]
    assert len(counted(study)) == trials, "the budget was not met exactly"
    trained = [t for t in done if "reused_from" not in t.user_attrs]
    digests = [t.user_attrs["digest"] for t in trained]
    assert len(set(digests)) == len(digests), "an architecture was trained twice"


def test_two_workers_finish_exactly_n_trials_with_no_duplicate(tmp_path):
    name = f"pg-{uuid.uuid4().hex[:8]}"
    trials = 6
    # trials of a few seconds each: the joining worker starts (imports, data) while the
    # first one still has trials to claim, also on a loaded machine
    config = tiny_config(tmp_path, name, budget={"trials": trials, "epochs_per_trial": 2},
                         storage=URL, data={"rows": 24_000},
                         training={"batch_size": 32, "evals": 2},
                         searcher={"type": "tpe", "startup_trials": 2})  # fmt: skip
    path = write_config(tmp_path, config)
    workers = _search_then_worker(path, name)
    outputs = [w.communicate(timeout=600)[0] for w in workers]
    assert all(w.returncode == 0 for w in workers), outputs
    study = load_study(name, URL)
    _check_distinct_and_exact(study, trials)
    assert len({t.user_attrs["worker"] for t in study.trials}) == 2, "both workers ran trials"


@pytest.mark.slow  # 29 s; `make test-all` runs it (SQLite's kill tests run in `make test`)
def test_a_worker_killed_mid_trial_costs_nothing(tmp_path, server):
    name = f"pg-kill-{uuid.uuid4().hex[:8]}"
    trials = 4
    config = tiny_config(tmp_path, name, storage=URL, data={"rows": 24_000},
                         budget={"trials": trials, "epochs_per_trial": 2, "max_failures": 50},
                         mlflow={"tracking_uri": server.uri})  # fmt: skip
    path = write_config(tmp_path, config)
    doomed, survivor = _search_then_worker(path, name)
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:  # kill the first worker inside one of its trials
        time.sleep(0.3)
        running = [t for t in _trials(name) if t.state == TrialState.RUNNING
                   and t.user_attrs.get("worker", "").endswith(f":{doomed.pid}")]  # fmt: skip
        if running:
            break
    doomed.kill()
    doomed.wait()
    output = survivor.communicate(timeout=600)[0]
    assert survivor.returncode == 0, output
    study = load_study(name, URL)
    _check_distinct_and_exact(study, trials)
    stale = [t for t in study.trials if t.state == TrialState.FAIL
             and not t.user_attrs.get("failure_reason")]  # fmt: skip
    assert len(stale) == 1, "the killed worker's trial should be failed by its heartbeats"
    client = MlflowClient(tracking_uri=server.uri)
    experiment = client.get_experiment_by_name(name)
    runs = trial_runs(client, experiment.experiment_id)
    logged = [int(r.data.tags["ranknas.trial"]) for r in runs]
    assert len(logged) == len(set(logged)), "a trial was logged twice"
    finished = [t.number for t in study.trials if t.state != TrialState.RUNNING]
    assert set(finished) <= set(logged), "a finished trial is missing from MLflow"


def _trials(name: str) -> list:
    return load_study(name, URL).trials if _exists(name) else []


def test_libpq_s_postgres_spelling_is_the_same_storage(tmp_path, capsys):
    """`postgres://` (libpq's, Heroku's) was refused as an unknown SQLAlchemy dialect: it
    is the same storage as `postgresql://`, in the YAML and in `--storage`."""
    from nas.cli import main
    from nas.config import parse_config

    assert URL.startswith("postgresql://"), URL
    spelled = "postgres://" + URL.removeprefix("postgresql://")
    name = f"pg-{uuid.uuid4().hex[:8]}"
    config = tiny_config(tmp_path, name, budget={"trials": 1, "max_failures": 50},
                         storage=spelled)  # fmt: skip
    assert parse_config(config).storage == URL
    assert main(["search", str(write_config(tmp_path, config))]) == 0
    capsys.readouterr()
    assert main(["status", name, "--storage", spelled]) == 0
    assert "1 complete" in capsys.readouterr().out


def test_mlflow_up_on_a_study_database_or_a_missing_one_says_so_at_once(tmp_path):
    """`mlflow up` on Optuna's database left MLflow's tables beside the studies' and printed
    alembic's traceback; on a database that does not exist it retried for a minute."""
    from mlflow_server import ServerConfig, up
    from nas.storage import open_storage
    from search_space.errors import RanknasError

    open_storage(URL)  # Optuna's tables, as a study leaves them
    with pytest.raises(RanknasError, match=r"holds Optuna's tables \(studies, trials\): a study "):
        up(ServerConfig(data_dir=tmp_path, port=0, backend_store_uri=URL))
    with create_engine(normalize_url(URL)).connect() as connection:
        assert "experiments" not in connection.dialect.get_table_names(connection)
    missing = URL.rsplit("/", 1)[0] + f"/no_such_{uuid.uuid4().hex[:8]}"
    started = time.monotonic()
    with pytest.raises(RanknasError, match=r"does not exist\); check the URI, and create the "):
        up(ServerConfig(data_dir=tmp_path, port=0, backend_store_uri=missing))
    assert time.monotonic() - started < 10
