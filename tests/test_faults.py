"""Faults at random points of a study logged to a real MLflow server: SIGKILL and SIGTERM
inside and between trials. After a resume, the study has exactly its budget of trials, no
architecture trained twice, and every finished trial is in MLflow exactly once, with the
killed ones recorded as failed. (Interrupts, PostgreSQL workers and bad inputs have their
own tests: test_study.py, test_study_postgres.py, test_bad_inputs.py.)"""

import random
import signal
import subprocess
import sys
import time

import pytest
from optuna.trial import TrialState

from nas.commands import _logger
from nas.config import parse_config
from nas.runner import run_study
from nas.storage import DEATHS, SEED_OF, load_study
from study_helpers import (
    check_nothing_lost_or_duplicated,
    pruned_repeats_config,
    tiny_config,
    write_config,
)

TRIALS = 4


def _study_states(config: dict) -> dict[str, int]:
    try:
        trials = load_study(config["name"], config["storage"]).trials
    except Exception:  # not created yet
        return {}
    return {s.name: sum(t.state == s for t in trials) for s in TrialState}


@pytest.mark.slow  # about 60 s each on the 2-core VM; `make test-all` runs them
@pytest.mark.parametrize("sig", [signal.SIGKILL, signal.SIGTERM])
def test_a_study_killed_at_random_points_loses_and_duplicates_nothing(sig, tmp_path, server):
    config = tiny_config(tmp_path, f"faults-{sig.name.lower()}", data={"rows": 40_000},
                         budget={"trials": TRIALS, "epochs_per_trial": 1},
                         mlflow={"tracking_uri": server.uri})  # fmt: skip
    config["search_space"] = {"type": "around", "base": "dlrm"}
    command = [sys.executable, "-m", "nas.cli", "search", str(write_config(tmp_path, config))]
    rng = random.Random(sig.value)
    for _ in range(3):  # three kills, each at a random moment after a random trial
        process = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        target = rng.randint(0, TRIALS - 2)
        deadline = time.monotonic() + 90
        while time.monotonic() < deadline and process.poll() is None:
            if _study_states(config).get("COMPLETE", 0) > target:
                time.sleep(rng.uniform(0, 1.5))
                break
            time.sleep(0.2)
        process.send_signal(sig)
        process.wait(timeout=60)
    finished = subprocess.run(command, capture_output=True, text=True, timeout=300)
    assert finished.returncode == 0, finished.stdout + finished.stderr

    check_nothing_lost_or_duplicated(config, server.uri)


# `search` whose `tell` of a repeat of a trial in the state argv[2] kills the process: after
# the trial's MLflow record is queued, before Optuna records it.
KILLED_TELLING_A_REPEAT = """
import os, signal, sys
import optuna
from nas.cli import main
tell = optuna.Study.tell
def killing_tell(study, trial, *args, **kwargs):
    original = trial.user_attrs.get("reused_from")
    if original is not None and study.trials[original].state.name == sys.argv[2]:
        os.kill(os.getpid(), signal.SIGKILL)
    return tell(study, trial, *args, **kwargs)
optuna.Study.tell = killing_tell
sys.exit(main(["search", sys.argv[1]]))
"""


# about 70 s each: the pruned original in `make test`, the diverged one in `make test-all`
@pytest.mark.parametrize("original", ["PRUNED", pytest.param("FAIL", marks=pytest.mark.slow)])
def test_a_study_killed_while_telling_a_repeat_resumes_under_pruning(original, tmp_path, server):
    """Repeats of a pruned and of a diverged trial under median pruning: the process dies
    inside a repeat's `tell`; the resume fails that trial, draws its architecture again (a
    repeat again) and meets the budget, with every trial in MLflow once."""
    name = f"killed-repeat-{original.lower()}"
    config = pruned_repeats_config(tmp_path, name, mlflow={"tracking_uri": server.uri})
    path = str(write_config(tmp_path, config))
    killed = subprocess.run([sys.executable, "-c", KILLED_TELLING_A_REPEAT, path, original],
                            capture_output=True, text=True, timeout=300)  # fmt: skip
    assert killed.returncode == -signal.SIGKILL, killed.stdout + killed.stderr
    assert _study_states(config)["RUNNING"] == 1
    # resumed in process as a named worker: its sampler's seed, so its draws, are fixed
    parsed = parse_config(config)
    logger = _logger(parsed)
    study = run_study(parsed, progress=lambda line: None, logger=logger, worker="resumed")
    assert logger.flush(timeout_s=30) == 0

    check_nothing_lost_or_duplicated(config, server.uri)
    (retry,) = [t for t in study.trials if t.system_attrs.get(DEATHS)]  # `retry_first`'s mark
    dead = study.trials[retry.system_attrs[SEED_OF]]
    assert dead.state == TrialState.FAIL and "reused_from" in dead.user_attrs
    assert retry.params == dead.params and retry.user_attrs["reused_from"] != retry.number
    assert retry.state.name == original
