"""`ranknas search CONFIG --workers N`: worker processes placed on the machine's devices,
one command, one display, the budget met exactly."""

import os
import signal
import subprocess
import sys
import time

import optuna
import pytest
from mlflow import MlflowClient
from optuna.trial import TrialState

from nas.config import StudyConfig
from nas.launch import Placement, placements, worker_count
from nas.storage import load_study
from search_space.errors import RanknasError
from study_helpers import (
    check_nothing_lost_or_duplicated,
    counted,
    tiny_config,
    trial_runs,
    write_config,
)


def test_workers_go_round_robin_over_the_gpus_and_split_the_cores():
    places = placements(5, "auto", ["0", "3"], cores=16)
    assert [p.gpu for p in places] == ["0", "3", "0", "3", "0"]
    assert {p.threads for p in places} == {3}
    assert [p.label for p in places[:2]] == ["cuda:0", "cuda:3"]
    assert placements(2, "cpu", ["0"], cores=2) == [Placement(None, 1)] * 2  # device: cpu
    assert placements(3, "auto", [], cores=2)[0].label == "cpu (1 thread)"  # no GPU here
    assert {p.gpu for p in placements(2, "cuda:1", ["0", "1"], cores=4)} == {None}  # as asked


def test_the_worker_count_comes_from_the_flag_the_config_or_the_gpus(tmp_path):
    config = StudyConfig.model_validate(tiny_config(tmp_path, "w", workers={"per_device": 4}))
    assert worker_count(config, None, gpus=2) == 8
    assert worker_count(config, 6, gpus=2) == 6
    with pytest.raises(RanknasError, match="per_device=4"):
        worker_count(config, 9, gpus=2)
    plain = StudyConfig.model_validate(tiny_config(tmp_path, "p"))
    assert worker_count(plain, None, gpus=8) == 1


# ranknas itself, saying at the end whether the launcher loaded the trainer's libraries:
# only its workers train (importing torchrec takes seconds of the cores they start on)
LAUNCHER = (
    "import sys; from nas.cli import main; code = main(sys.argv[1:]); "
    "print('launcher loaded torchrec:', 'torchrec' in sys.modules); sys.exit(code)"
)


def _search(path, *args: str) -> subprocess.Popen:
    command = [sys.executable, "-c", LAUNCHER, "search", str(path), *args]
    return subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


def test_the_display_and_status_tell_a_skipped_trial_from_a_trained_one():
    """The one display said "trial 2 pruned on cpu" of a trial skipped untrained for its
    FLOPs, and `status` counted it as trained on cpu."""
    from optuna.trial import create_trial

    from nas.launch import _line
    from nas.leaderboard import _devices
    from nas.trial_record import TrialAttr

    why = "0.544 MFLOPs exceeds objectives.max_mflops (0.3)"
    skipped = create_trial(
        state=TrialState.PRUNED,
        user_attrs={
            TrialAttr.OVER_CONSTRAINT: True,
            TrialAttr.FAILURE_REASON: why,
            TrialAttr.DEVICE: "cpu",
        },
    )
    trained = create_trial(value=0.9, user_attrs={TrialAttr.DEVICE: "cpu", "val_ne": 0.9})
    skipped.number, trained.number = 2, 3
    assert _line(skipped) == f"trial 2 skipped untrained: {why}"
    assert _line(trained) == "trial 3 complete val NE 0.9000 on cpu"
    assert _devices([skipped, trained]) == {"cpu": 1}


def test_the_display_says_a_run_of_repeats_once():
    """A small space's searcher drew the same architectures dozens of times: the one display
    printed a line for each repeat ("trial 12 complete val NE 0.9000 on cpu (a repeat)")."""
    from optuna.trial import create_trial

    from nas.launch import _lines
    from nas.trial_record import TrialAttr

    def trial(number: int, repeat_of: int | None = None):
        attrs = {TrialAttr.DEVICE: "cpu", "val_ne": 0.9}
        made = create_trial(value=0.9, user_attrs=attrs | (
            {TrialAttr.REUSED_FROM: repeat_of} if repeat_of is not None else {}))  # fmt: skip
        made.number = number
        return made

    trials = [trial(0), trial(1, 0), trial(2, 0), trial(3, 0), trial(4), trial(5, 4)]
    assert _lines(trials) == [
        "trial 0 complete val NE 0.9000 on cpu",
        "trials 1, 2, 3: repeats of earlier architectures (not trained again, not counted)",
        "trial 4 complete val NE 0.9000 on cpu",
        "trial 5 complete val NE 0.9000 on cpu (a repeat)",
    ]
    many = _lines([trial(n, 0) for n in range(1, 9)])
    assert many == ["trials 1, 2, 3, 4, 5 and 3 more: repeats of earlier architectures (not "
                    "trained again, not counted)"]  # fmt: skip


def test_an_interrupted_trial_is_neither_a_failure_nor_trained_on_any_surface(tmp_path):
    """README: a trial stopped by Ctrl-C "is marked interrupted ... and not counted as a
    failure"; `status` said "5 complete, 2 fail" and the display "trial 2 fail".
    """
    from optuna.trial import create_trial

    from nas import leaderboard
    from nas.launch import _line
    from nas.trial_record import TrialAttr, mlflow_record

    attrs = {TrialAttr.FAILURE_REASON: "interrupted", TrialAttr.DEVICE: "cpu"}
    study = optuna.create_study(study_name="i", storage=f"sqlite:///{tmp_path / 's.db'}")
    study.add_trial(create_trial(value=0.9, user_attrs={TrialAttr.DEVICE: "cpu"}))
    study.add_trial(create_trial(state=TrialState.FAIL, user_attrs=attrs))
    oom = {TrialAttr.FAILURE_REASON: "OOM"}
    study.add_trial(create_trial(state=TrialState.FAIL, user_attrs=oom))
    stopped = study.trials[1]
    assert _line(stopped) == "trial 1 interrupted on cpu (retried on resume)"
    state = leaderboard.status(study)
    assert (state["trials"]["interrupted"], state["trials"]["fail"]) == (1, 1)
    assert state["devices"] == {"cpu": 1}
    assert [r["state"] for r in leaderboard.rows(study, include_all=True)][1:] == [
        "interrupted", "fail"]  # fmt: skip
    summary = {"status": "interrupted", "failure_reason": "interrupted"}
    assert mlflow_record({}, summary, {}, {}, {})["status"] == "KILLED"


def test_status_says_how_many_trials_each_device_trained(tmp_path, capsys):
    """`status` printed "trained on: cpu (1 thread) 4": the 4 was a count of trials."""
    from optuna.trial import create_trial

    from nas.cli import main
    from nas.trial_record import TrialAttr

    url = f"sqlite:///{tmp_path / 's.db'}"
    study = optuna.create_study(study_name="d", storage=url)
    for device in ("cpu (1 thread)", "cpu (1 thread)", "cuda:1"):
        study.add_trial(create_trial(value=0.9, user_attrs={TrialAttr.DEVICE: device}))
    assert main(["status", "d", "--storage", url]) == 0
    assert "trained on: cpu (1 thread): 2 trials, cuda:1: 1 trial" in capsys.readouterr().out


def test_two_workers_from_one_command_meet_the_budget_exactly(tmp_path, server):
    trials = 5
    # trials of ~2 s: with 0.3 s ones a worker that started a second late (a loaded machine)
    # found the budget spent by the other
    config = tiny_config(tmp_path, "two", budget={"trials": trials, "epochs_per_trial": 1},
                         data={"rows": 24_000}, training={"batch_size": 32},
                         searcher={"type": "tpe", "startup_trials": 2},
                         mlflow={"tracking_uri": server.uri})  # fmt: skip
    search = _search(write_config(tmp_path, config), "--workers", "2")
    output = search.communicate(timeout=600)[0]
    assert search.returncode == 0, output
    assert "2 workers: worker 0 on cpu (1 thread), worker 1 on cpu (1 thread)" in output
    study = load_study("two", config["storage"])
    assert len(counted(study)) == trials, "the budget was not met exactly"
    trained = [t for t in counted(study)]
    digests = [t.user_attrs["digest"] for t in trained]
    assert len(set(digests)) == len(digests), "an architecture was trained twice"
    assert len({t.user_attrs["worker"] for t in trained}) == 2, "both workers ran trials"
    assert {t.user_attrs["device"] for t in trained} == {"cpu (1 thread)"}
    assert f"trial {trained[0].number} complete" in output  # one display, from the storage
    assert "export the best" in output  # the leaderboard and summary, once
    assert "launcher loaded torchrec: False" in output
    # what the workers say besides their trials reaches the one display, once
    assert sum(line.startswith("data: ") for line in output.splitlines()) == 1, output
    assert not any(line.startswith("[1/") for line in output.splitlines()), output
    logs = sorted((tmp_path / "two" / "workers").glob("worker-*.log"))
    assert [p.name for p in logs] == ["worker-0.log", "worker-1.log"]
    check_nothing_lost_or_duplicated(config, server.uri)  # each worker's trials in MLflow


def test_a_launch_whose_mlflow_server_is_down_says_once_what_waits(tmp_path):
    """Each worker said "N records kept" with its own count, and the launcher another."""
    config = tiny_config(tmp_path, "down", budget={"trials": 2, "epochs_per_trial": 1},
                         mlflow={"tracking_uri": "http://127.0.0.1:9"})  # fmt: skip
    search = _search(write_config(tmp_path, config), "--workers", "2")
    output = search.communicate(timeout=600)[0]
    assert search.returncode == 0, output
    kept = [line for line in output.splitlines() if "records kept in" in line]
    assert len(kept) == 1 and kept[0].startswith("no MLflow server answers at"), output


def test_a_worker_started_with_its_search_waits_for_the_study_to_exist(tmp_path, capsys):
    """Started a few seconds after `search` (whose data was still loading), a worker was
    refused: "no study ..., did you mean" another one."""
    from nas.cli import main

    config = tiny_config(tmp_path, "together", budget={"trials": 2, "epochs_per_trial": 1})
    path = write_config(tmp_path, config)
    assert main(["worker", str(path), "--wait", "0.5"]) == 2
    out, err = capsys.readouterr()
    assert "waiting up to 0.5 s for `ranknas search` to create study 'together'" in out
    assert "a worker joins a started study: no study 'together'" in err
    assert "--wait SECONDS" not in err  # said only to one that did not wait
    # a storage that does not answer is no study still to come: said at once
    down = config | {"name": "unreachable", "storage": "postgresql://ranknas@127.0.0.1:9/db"}
    started = time.monotonic()
    assert main(["worker", str(write_config(tmp_path, down)), "--wait", "60"]) == 2
    out, err = capsys.readouterr()
    assert "waiting" not in out and "cannot open it" in err and time.monotonic() - started < 30
    command = [sys.executable, "-c", LAUNCHER, "worker", str(path), "--wait", "300"]
    worker = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                              text=True)  # fmt: skip
    before = []  # the worker waits (however slowly it started) ...
    while not (line := worker.stdout.readline()).startswith("waiting up to 300 s for") and line:
        before.append(line)
    assert line, before
    assert main(["search", str(path)]) == 0  # ... until the search creates the study
    output = worker.communicate(timeout=300)[0]
    assert worker.returncode == 0, output
    assert len(counted(load_study("together", config["storage"]))) == 2


def test_a_killed_worker_fails_the_command_only_if_the_budget_is_not_done(
    tmp_path, monkeypatch, capsys
):
    """A worker killed mid-trial: its trial is failed by heartbeats and retried by the
    others. The command said "a worker failed (above); fix what it says" and exited 2 when
    the others had finished the budget."""
    from nas.cli import main
    from nas.runner import run_study

    config = tiny_config(tmp_path, "killed", budget={"trials": 2, "max_failures": 50})
    run_study(StudyConfig.model_validate(config), progress=lambda line: None)
    codes = [0, -signal.SIGKILL]
    monkeypatch.setattr("nas.launch.launch", lambda *args: codes)
    path = write_config(tmp_path, config)
    assert main(["search", str(path), "--workers", "2"]) == 0
    captured = capsys.readouterr()
    assert "the other workers finished the study's budget" in captured.err
    assert "export the best" in captured.out
    assert main(["search", str(path), "--workers", "2", "--trials", "3"]) == 2
    assert (
        "a worker was killed (signal 9) before the budget was done: run the same command "
        "again to resume" in capsys.readouterr().err
    )
    # one worker stopped by its own `kill PID` (130), the others finished: the summary, as
    # for a killed one (it said "interrupted: run the same command again" over a done study)
    for codes[:] in ([0, 130], [0, 143]):  # Ctrl-C, SIGTERM
        assert main(["search", str(path), "--workers", "2"]) == 0
        assert "the other workers finished the study's budget" in capsys.readouterr().err
    codes[:] = [143, 0]  # before the budget was done: interrupted, resumed by the command
    assert main(["search", str(path), "--workers", "2", "--trials", "3"]) == 143
    codes[:] = [2, 2]  # refused (a changed protocol, say): a done budget does not hide it
    assert main(["search", str(path), "--workers", "2"]) == 2
    assert "a worker failed (above); fix what it says" in capsys.readouterr().err
    codes[:] = [-signal.SIGKILL, -signal.SIGKILL]  # none of them finished it
    assert main(["search", str(path), "--workers", "2"]) == 2


def test_what_every_worker_would_refuse_is_said_before_any_starts(tmp_path, capsys):
    """Another study's output_dir and a storage that does not answer: each worker said it,
    then "a worker failed (above) ... again to resume", and the refused study's worker logs
    were written into the other study's folder."""
    from nas.cli import main

    config = tiny_config(tmp_path, "mine")
    taken = tmp_path / "taken"
    taken.mkdir()
    (taken / "study.json").write_text('{"study": "theirs"}\n')
    config["output_dir"] = str(taken)
    assert main(["search", str(write_config(tmp_path, config)), "--workers", "2"]) == 2
    err = capsys.readouterr().err
    assert err.count("error:") == 1 and "holds study 'theirs'" in err, err
    assert not (taken / "workers").exists()
    config = tiny_config(tmp_path, "nowhere", storage="postgresql://postgres@127.0.0.1:9/test")
    assert main(["search", str(write_config(tmp_path, config)), "--workers", "2"]) == 2
    err = capsys.readouterr().err
    assert err.count("error:") == 1 and "cannot open it" in err, err


def test_an_error_every_worker_meets_is_said_once(tmp_path, capsys):
    """A data file that is not there: the error came once relayed, then once per worker
    ("worker 1 exited with status 2: error: ..."), then the command's own line."""
    from nas.cli import main

    config = tiny_config(tmp_path, "nofile")
    config["data"] = {"source": str(tmp_path / "gone.csv")}
    assert main(["search", str(write_config(tmp_path, config)), "--workers", "2"]) == 2
    err = capsys.readouterr().err
    assert err.count("gone.csv") == 1 and "exited with status" not in err, err
    assert "a worker failed (above); fix what it says, then run the command again" in err
    # a second launch: the logs keep the first's (written over before), and only its own
    # lines reach the display
    assert main(["search", str(tmp_path / "nofile.yaml"), "--workers", "2"]) == 2
    assert capsys.readouterr().err.count("gone.csv") == 1
    for log in (tmp_path / "nofile" / "workers").glob("worker-*.log"):
        text = log.read_text()
        assert text.count("=== launched") == 2 and text.count("gone.csv") == 2, text


# the workers forked from a server that imported the trainer, and each started afresh
@pytest.mark.slow  # 53 s each on a slow day; `make test-all` runs them
@pytest.mark.parametrize("start", ["forkserver", "spawn"])
def test_a_stopped_launch_stops_every_worker_and_resumes(start, tmp_path, server, monkeypatch):
    monkeypatch.setenv("RANKNAS_WORKER_START", start)
    config = tiny_config(tmp_path, f"stop-{start}", data={"rows": 48_000},
                         training={"batch_size": 32, "evals": 2},
                         budget={"trials": 4, "epochs_per_trial": 1},
                         mlflow={"tracking_uri": server.uri})  # fmt: skip
    path = write_config(tmp_path, config)
    search = _search(path, "--workers", "2")
    _wait_for_running(config, 2, timeout_s=300)  # stop it while both workers train
    assert search.poll() is None, search.communicate()[0]
    search.send_signal(signal.SIGTERM)
    output = search.communicate(timeout=120)[0]
    assert search.returncode == 143, output  # 128 + SIGTERM
    assert output.count("interrupted: run the same command") == 1, output  # relayed: not again
    study = load_study(config["name"], config["storage"])
    assert not [t for t in study.trials if t.state == TrialState.RUNNING], "a worker ran on"
    interrupted = [t for t in study.trials if t.user_attrs.get("failure_reason") == "interrupted"]
    assert len(interrupted) == 2
    for trial in interrupted:  # told as the workers stopped: the display's last look
        assert f"trial {trial.number} interrupted on cpu" in output, output
    # each stopped worker delivered its interrupted trial to MLflow before it exited
    client = MlflowClient(tracking_uri=server.uri)
    experiment = client.get_experiment_by_name(config["name"]).experiment_id
    runs = trial_runs(client, experiment)
    status = {int(r.data.tags["ranknas.trial"]): r.info.status for r in runs}
    assert [status.get(t.number) for t in interrupted] == ["KILLED", "KILLED"], status
    parents = client.search_runs([experiment], "tags.`ranknas.kind` = 'study'")
    assert [run.info.status for run in parents] == ["KILLED"]  # the launcher ended it
    again = _search(path, "--workers", "2")
    output = again.communicate(timeout=600)[0]
    assert again.returncode == 0, output
    # the interrupted trials in MLflow as killed: each worker's last delivery as it stopped
    check_nothing_lost_or_duplicated(config, server.uri)


def _wait_for_running(config: dict, count: int, timeout_s: float) -> None:
    """Until `count` trials of the study are RUNNING (at least), or `timeout_s` passed."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        time.sleep(0.3)
        try:
            running = [t for t in load_study(config["name"], config["storage"]).trials
                       if t.state == TrialState.RUNNING]  # fmt: skip
        except RanknasError:
            running = []
        if len(running) >= count:
            return


@pytest.mark.slow  # about 40 s each; `make test-all` runs them
@pytest.mark.parametrize("how", ["group-sigterm", "launcher-sigkill"])
def test_workers_stop_with_their_group_or_when_their_launcher_is_gone(how, tmp_path):
    """A SIGTERM to the whole group (systemd, SLURM) killed the server the workers were
    forked from, and the launcher took them all for ended while they trained on; a
    launcher killed outright left its workers running the study."""
    config = tiny_config(tmp_path, how, data={"rows": 48_000},
                         training={"batch_size": 32, "evals": 2},
                         budget={"trials": 4, "epochs_per_trial": 1})  # fmt: skip
    command = [sys.executable, "-c", LAUNCHER, "search", str(write_config(tmp_path, config)),
               "--workers", "2"]  # fmt: skip
    search = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                              text=True, start_new_session=True)  # fmt: skip
    _wait_for_running(config, 2, timeout_s=300)
    assert search.poll() is None, search.communicate()[0]
    if how == "group-sigterm":
        os.killpg(search.pid, signal.SIGTERM)
    else:
        search.kill()
    output = search.communicate(timeout=120)[0]
    if how == "group-sigterm":  # the launcher waited for its workers to record their trials
        assert search.returncode == 143, output
        study = load_study(config["name"], config["storage"])
        assert not [t for t in study.trials if t.state == TrialState.RUNNING], output
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:  # the workers record their trials as they stop
        study = load_study(config["name"], config["storage"])
        if not [t for t in study.trials if t.state == TrialState.RUNNING]:
            break
        time.sleep(0.5)
    study = load_study(config["name"], config["storage"])
    assert not [t for t in study.trials if t.state == TrialState.RUNNING], "a worker ran on"
    interrupted = [t for t in study.trials if t.user_attrs.get("failure_reason") == "interrupted"]
    assert len(interrupted) == 2, output


def test_the_display_relays_why_a_study_ended_but_not_a_workers_banner():
    """The pattern that keeps each worker's banner out of the display also kept out the
    line saying why the study ended before its budget."""
    from nas.launch import _LAUNCHER_SAYS

    assert _LAUNCHER_SAYS.match("study 'q': tpe over the dag space, 4 trials, storage sqlite:///x")
    assert not _LAUNCHER_SAYS.match("study 'q' ended at 2 of 4 trials: the searcher proposed 9 ")
    assert _LAUNCHER_SAYS.match("[3/20] complete val NE 0.8612 (best 0.8590, trial 1)")
    # the seed runs that choose the best baseline were left in the worker's log
    assert not _LAUNCHER_SAYS.match("[1/6] baseline dcnv2 seed 1000: val NE 0.8547")


def test_a_time_limit_is_said_once_for_all_workers(tmp_path, capsys):
    """Each worker said its search stopped at the time limit, each with its own count: one
    line per worker. The launcher says it once, with the count the study kept."""
    from nas.launch import _LAUNCHER_SAYS, _say_time_limit
    from nas.trial_record import StudyAttr

    said = "search: stopped by budget.time_limit_minutes (30 s of searching) at 3 of 9 trials"
    assert _LAUNCHER_SAYS.match(said)  # the workers' own lines: not relayed
    settings = tiny_config(tmp_path, "limited")
    settings["budget"]["trials"] = 9
    config = StudyConfig.model_validate(settings)
    optuna.create_study(study_name="limited", storage=config.storage).set_user_attr(
        StudyAttr.TIME_LIMITED, {"minutes": 0.5, "counted": 5}
    )
    _say_time_limit(config)
    out = capsys.readouterr().out
    assert out.count("stopped by budget.time_limit_minutes") == 1 and "at 5 of 9 trials" in out


def test_a_workers_warnings_go_where_one_process_writes_them():
    import sys

    from nas.launch import relayed_to

    assert relayed_to("WARNING: trial 3: the worker died (missed heartbeats)") is sys.stderr
    assert relayed_to("error: trial 0: cannot read the weights") is sys.stderr
    assert relayed_to("data: 3,200 training, 400 validation, 400 test rows") is sys.stdout


def test_a_resumed_launch_says_the_earlier_trials_once_not_a_line_each(tmp_path, capsys):
    """A launch on a study of 200 finished trials printed 200 "trial N complete" lines
    before its first new one (or before a worker's refusal of the config)."""
    from optuna.trial import create_trial

    from nas.launch import _Display, _finished_earlier, _Relay, _watch
    from nas.trial_record import TrialAttr

    config = StudyConfig.model_validate(tiny_config(tmp_path, "again", budget={"trials": 5}))
    assert _finished_earlier(config, "again.yaml") == set()  # a new study: nothing to say
    study = optuna.create_study(study_name="again", storage=config.storage)
    attrs = {TrialAttr.DEVICE: "cpu", "val_ne": 0.9}
    for _ in range(3):
        study.add_trial(create_trial(value=0.9, user_attrs=attrs))
    study.add_trial(create_trial(state=TrialState.FAIL, user_attrs={TrialAttr.DEVICE: "cpu"}))
    earlier = _finished_earlier(config, "again.yaml")
    assert earlier == {0, 1, 2, 3}
    assert capsys.readouterr().out == (
        "resuming: 3 of 5 trials done earlier, 1 failed (`ranknas leaderboard again.yaml` lists "
        "them)\n"
    )
    study.add_trial(create_trial(value=0.8, user_attrs=attrs | {"val_ne": 0.8}))  # this launch's
    _watch(config, [], _Display(config, _Relay([]), earlier))
    out = capsys.readouterr().out
    assert "trial 4 complete val NE 0.8000 on cpu" in out
    assert not any(f"trial {n} " in out for n in range(4)), out
