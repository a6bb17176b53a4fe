"""Two workers share one study in PostgreSQL and run exactly the asked trials, none twice.

Needs a PostgreSQL server: the URL comes from RANKNAS_TEST_POSTGRES_URL (`.ci/run` sets it
to the machine's local server); without it the test is skipped.
"""

import os
import subprocess
import sys
import uuid

import pytest
from optuna.trial import TrialState
from sqlalchemy import create_engine, text

from nas.storage import load_study, normalize_url
from study_helpers import tiny_config, write_config

URL = os.environ.get("RANKNAS_TEST_POSTGRES_URL")


def _reachable(url: str) -> bool:
    try:
        with create_engine(normalize_url(url)).connect() as connection:
            connection.execute(text("SELECT 1"))
        return True
    except Exception:
        return False


pytestmark = pytest.mark.skipif(
    not URL or not _reachable(URL),
    reason="set RANKNAS_TEST_POSTGRES_URL to a reachable PostgreSQL (as .ci/run does)",
)


def test_two_workers_finish_exactly_n_trials_with_no_duplicate(tmp_path):
    name = f"pg-{uuid.uuid4().hex[:8]}"
    trials = 6
    config = tiny_config(tmp_path, name, budget={"trials": trials}, storage=URL,
                         searcher={"type": "tpe", "startup_trials": 2})  # fmt: skip
    path = write_config(tmp_path, config)
    workers = [
        subprocess.Popen(
            [sys.executable, "-m", "nas.cli", "worker", str(path)],
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        for _ in range(2)
    ]
    outputs = [w.communicate(timeout=600)[0] for w in workers]
    assert all(w.returncode == 0 for w in workers), outputs
    study = load_study(name, URL)
    assert len(study.trials) == trials, "a trial beyond the budget was started"
    assert all(t.state in (TrialState.COMPLETE, TrialState.PRUNED) for t in study.trials)
    assert sorted(t.number for t in study.trials) == list(range(trials))
    by_worker = {t.user_attrs["worker"] for t in study.trials}
    assert len(by_worker) == 2, "both workers should have run trials"
