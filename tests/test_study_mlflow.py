"""A study logged to a real `mlflow server`: parent and nested runs with their content, and
an MLflow outage in the middle of the study loses nothing."""

import json
from pathlib import Path
from unittest import mock

import optuna
import pytest
import yaml
from mlflow import MlflowClient
from mlflow.entities import Run

from mlflow_server import StudyLogger, down, up
from mlflow_server.tracking import SHARED_VIEW_PREFIX, view_key
from nas import commands
from nas.commands import log_summary
from nas.config import parse_config
from nas.leaderboard import rows, study_best
from nas.runner import run_study
from nas.trial_record import RUN_STATUS, architecture_params, read_architecture
from search_space.architecture import analyze
from search_space.errors import RanknasError
from search_space.presets import preset
from search_space.schema import DatasetSchema
from study_helpers import tiny_config, write_config


def _runs(client: MlflowClient, experiment: str):
    experiment_id = client.get_experiment_by_name(experiment).experiment_id
    runs = client.search_runs([experiment_id], max_results=1000)
    parents = [r for r in runs if r.data.tags.get("ranknas.kind") == "study"]
    trials = {int(r.data.tags["ranknas.trial"]): r for r in runs if "ranknas.trial" in r.data.tags}
    baselines = [r for r in runs if r.data.tags.get("ranknas.kind") == "baseline"]
    assert len(parents) == 1
    assert len(trials) == len(runs) - 1 - len(baselines), "a trial was logged twice"
    return parents[0], trials


def test_baselines_are_nested_runs_tagged_as_baselines(tmp_path, server, capfd, monkeypatch):
    config, logger = _study(tmp_path, server, "with-baselines", trials=1)
    config.baselines = ["dlrm"]
    study = run_study(config, logger=logger, progress=lambda line: None)
    log_summary(logger, study, rows(study))
    assert logger.flush(timeout_s=30) == 0
    client = MlflowClient(tracking_uri=server.uri)
    parent, _ = _runs(client, "with-baselines")
    experiment_id = client.get_experiment_by_name("with-baselines").experiment_id
    (run,) = client.search_runs([experiment_id], "tags.`ranknas.kind` = 'baseline'")
    assert run.info.run_name == "baseline-dlrm mlp>dot>mlp 0.0677 MFLOPs"
    assert run.data.tags["baseline"] == "dlrm"
    assert run.data.tags["mlflow.parentRunId"] == parent.info.run_id
    assert run.data.metrics["val_ne"] == study.user_attrs["baselines:dlrm"]["val_ne"]
    board = client.download_artifacts(parent.info.run_id, "leaderboard.csv", str(tmp_path))
    assert ",dlrm" in Path(board).read_text()
    assert "verdict" in client.get_run(parent.info.run_id).data.tags
    note = client.get_run(parent.info.run_id).data.tags["mlflow.note.content"]
    assert "## Baselines" in note and "\ndlrm " in note and ": 1 trial, best first" in note

    # the registered version comes from the trial's own run; its description is the card
    from nas.cli import main

    trial_run = client.search_runs([experiment_id], "tags.`ranknas.trial` = '0'")[0]
    export = ["export", "with-baselines", "--storage", config.storage, "--out",
              str(tmp_path / "winner"), "--register", "wb",
              "--tracking-uri", server.uri]  # fmt: skip
    capfd.readouterr()
    experiments = {e.name for e in client.search_experiments()}
    assert main(export) == 0
    shown = "".join(capfd.readouterr())
    assert "registered wb version 1" in shown
    assert {e.name for e in client.search_experiments()} == experiments  # no empty one made
    assert "View run" not in shown and "INFO mlflow" not in shown  # MLflow's noise: -v only
    version = client.get_model_version("wb", "1")
    assert version.run_id == trial_run.info.run_id
    after = client.get_run(trial_run.info.run_id).info  # the export kept the trial's duration
    assert (after.end_time, after.status) == (trial_run.info.end_time, trial_run.info.status)
    assert "| study | with-baselines |" in version.description
    assert "baseline dlrm val / test NE" in version.description
    assert main(export) == 0  # the same model again: no version 2
    assert [v.version for v in client.search_model_versions("name = 'wb'")] == ["1"]
    capfd.readouterr()
    assert main(export[:6]) == 0  # without --register, the card it writes drops the registry
    assert "no longer says the model is registered as 'wb'" in capfd.readouterr().err
    assert main(export) == 0  # and says it again
    # a baseline's recorded run: registered from its own run, no alias by default
    base = [*export[:4], "--trial", "baseline:dlrm", "--out", str(tmp_path / "base"),
            "--register", "wbase", "--tracking-uri", server.uri]  # fmt: skip
    assert main(base) == 0
    assert "registered wbase version 1, no alias: baseline dlrm" in capfd.readouterr().out
    version = client.get_model_version("wbase", "1")
    assert version.run_id == run.info.run_id and not version.aliases
    assert "| baseline | dlrm |" in version.description

    # without --tracking-uri: the study config's server, else $MLFLOW_TRACKING_URI; a
    # server that does not answer stops the export before it writes anything
    yaml_file = tmp_path / "study.yaml"
    raw = tiny_config(tmp_path, "with-baselines", budget={"trials": 1},
                      mlflow={"tracking_uri": server.uri})  # fmt: skip
    yaml_file.write_text(yaml.safe_dump(raw | {"baselines": ["dlrm"]}))
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    assert main(["export", str(yaml_file), "--out", str(tmp_path / "w2"), "--register", "wb2"]) == 0
    monkeypatch.setenv("MLFLOW_TRACKING_URI", server.uri)
    assert main([*export[:5], str(tmp_path / "w3"), "--register", "wb3"]) == 0
    assert {m.name for m in client.search_registered_models()} >= {"wb", "wb2", "wb3"}
    capfd.readouterr()
    dead = "http://127.0.0.1:9"
    gone = [*export[:5], str(tmp_path / "w4"), "--register", "x", "--tracking-uri", dead]
    assert main(gone) == 2
    assert f"cannot reach the MLflow server at {dead}" in capfd.readouterr().err
    assert not (tmp_path / "w4").exists()

    # `status CONFIG` points to the study's view when the config's server holds it
    assert main(["status", str(yaml_file)]) == 0
    view = f"{server.uri}/#/experiments/{experiment_id}/runs?viewStateShareKey=ranknas-with-"
    assert f"compare them in MLflow: {view}" in capfd.readouterr().out
    yaml_file.write_text(yaml.safe_dump(raw | {"mlflow": {"tracking_uri": dead}}))
    assert main(["status", str(yaml_file)]) == 0
    shown = capfd.readouterr().out
    assert "study with-baselines: 1 complete" in shown and "MLflow" not in shown
    # by its name: the server its search logged to (the address was only given a config)
    assert main(["status", "with-baselines", "--storage", config.storage]) == 0
    assert f"compare them in MLflow: {view}" in capfd.readouterr().out


def _study(tmp_path, server, name, trials=3, **overrides):
    mlflow = {"tracking_uri": server.uri}
    config = parse_config(
        tiny_config(tmp_path, name, budget={"trials": trials}, mlflow=mlflow, **overrides)
    )
    logger = StudyLogger(server.uri, config.study_dir / "mlflow-outbox", request_timeout_s=5)
    return config, logger


def test_a_study_logs_a_parent_run_and_a_nested_run_per_trial(tmp_path, server):
    config, logger = _study(tmp_path, server, "logged")
    study = run_study(config, logger=logger, progress=lambda line: None)
    log_summary(logger, study, rows(study))
    assert logger.flush(timeout_s=30) == 0
    client = MlflowClient(tracking_uri=server.uri)
    parent, trials = _runs(client, "logged")
    assert sorted(trials) == [t.number for t in study.trials]
    for number, run in trials.items():
        assert run.data.tags["mlflow.parentRunId"] == parent.info.run_id
        assert {"searcher", "status", "digest", "worker"} <= set(run.data.tags)
        assert run.data.tags["digest"] == study.trials[number].user_attrs["digest"]
        assert {"val_ne", "val_logloss", "val_auc", "mflops", "params", "throughput"} <= set(
            run.data.metrics
        )
        spec = read_architecture(study.trials[number].user_attrs["trial_dir"])
        for name in analyze(spec).order:  # the network as the spec says, the encodings apart
            assert run.data.params[f"{name}.op"] == spec.block(name).op
            assert run.data.params[f"{name}.inputs"] == ",".join(spec.block(name).inputs)
        assert any(key.startswith("space.") for key in run.data.params)
        assert run.info.run_name.startswith(f"trial-{number} ")
        assert run.data.params["architecture"].endswith("MFLOPs")
        assert run.info.end_time - run.info.start_time > 0  # a real duration
        history = client.get_metric_history(run.info.run_id, "curve_val_ne")
        assert len(history) >= 1 and all(h.step > 0 for h in history)
        times = [h.timestamp for h in sorted(history, key=lambda h: h.step)]
        assert times == sorted(times) and run.info.start_time <= times[0] <= run.info.end_time
        files = {f.path for f in client.list_artifacts(run.info.run_id)}
        assert {"architecture.json", "architecture.png"} <= files
    summary = {f.path for f in client.list_artifacts(parent.info.run_id)}
    assert {"leaderboard.csv", "pareto_front.png", "pareto_front.csv"} <= summary
    best = min(t.values[0] for t in study.trials if t.values)
    summary_tags = client.get_run(parent.info.run_id).data.tags
    assert study.trials[int(summary_tags["best_trial"])].values[0] == best


def test_a_worker_joining_from_another_directory_is_logged_without_a_refusal(
    tmp_path, server, caplog
):
    """A worker whose config named the data by another path had its study record refused
    ("Changing param values is not allowed"): the first worker's params stand."""
    first = StudyLogger(server.uri, tmp_path / "a" / "outbox", request_timeout_s=5)
    second = StudyLogger(server.uri, tmp_path / "b" / "outbox", request_timeout_s=5)
    first.start_study("joined", params={"data": {"source": "clicks.csv"}, "seed": 0})
    assert first.flush(timeout_s=30) == 0
    second.start_study("joined", params={"data": {"source": "/m2/clicks.csv"}, "seed": 0},
                       tags={"joined_by": "m2"})  # fmt: skip
    assert second.flush(timeout_s=30) == 0 and "refused" not in caplog.text, caplog.text
    parent, _ = _runs(MlflowClient(tracking_uri=server.uri), "joined")
    assert parent.data.params["data.source"] == "clicks.csv"
    assert parent.data.tags["joined_by"] == "m2"  # the rest of its record was delivered


def test_mlflow_stopped_in_the_middle_of_a_study_loses_no_record(tmp_path, server, server_config):
    config, logger = _study(tmp_path, server, "outage", trials=4)
    seen = []

    def progress(line: str) -> None:  # the server goes away after trial 1, back after 3
        seen.append(line)
        if len(seen) == 1:
            down(server_config)
        if len(seen) == 3:
            up(server_config)

    study = run_study(config, logger=logger, progress=progress)
    assert logger.flush(timeout_s=60) == 0
    _, trials = _runs(MlflowClient(tracking_uri=server.uri), "outage")
    assert sorted(trials) == [t.number for t in study.trials]
    assert all(run.info.status in ("FINISHED", "KILLED", "FAILED") for run in trials.values())


def test_runs_the_server_lost_are_logged_again_on_resume(tmp_path, server):
    """The MLflow database deleted (or replaced) and the study resumed: the outbox knew its
    runs as logged, and the server kept only the parent run and the new trials."""
    config, logger = _study(tmp_path, server, "lost-runs", trials=2)
    run_study(config, logger=logger, progress=lambda line: None)
    assert logger.flush(timeout_s=30) == 0
    client = MlflowClient(tracking_uri=server.uri)
    experiment_id = client.get_experiment_by_name("lost-runs").experiment_id
    for run in client.search_runs([experiment_id]):  # as a fresh database would hold none
        client.delete_run(run.info.run_id)
    lines = []
    logger = StudyLogger(server.uri, config.study_dir / "mlflow-outbox", request_timeout_s=5)
    run_study(config, logger=logger, progress=lines.append)
    assert logger.flush(timeout_s=30) == 0
    assert any("holds none of the runs this study logged to it" in line for line in lines), lines
    _, trials = _runs(client, "lost-runs")
    assert sorted(trials) == [0, 1]
    # and not again at the next resume: the server has them now
    lines.clear()
    run_study(config, logger=logger, progress=lines.append)
    assert not any("logging them again" in line or "again (" in line for line in lines), lines


def test_reevaluation_is_logged_on_the_study_and_trial_runs(tmp_path, server, capsys, monkeypatch):
    from nas.cli import main
    from study_helpers import write_config

    # a baseline: the verdict (and its outcome tag) is checked below
    config, logger = _study(tmp_path, server, "reevaluated", baselines=["logistic_regression"])
    study = run_study(config, logger=logger, progress=lambda line: None)
    log_summary(logger, study, rows(study))
    assert logger.flush(timeout_s=30) == 0
    path = write_config(tmp_path, config.model_dump(mode="json"))
    client = MlflowClient(tracking_uri=server.uri)
    ended = {n: run.info.end_time for n, run in _runs(client, "reevaluated")[1].items()}
    assert main(["reevaluate", str(path), "--top", "2", "--seeds", "2"]) == 0
    best = capsys.readouterr().out.split("--trial ")[1].split()[0]
    parent, trials = _runs(client, "reevaluated")
    assert parent.info.status == "FINISHED"
    # the parent run moved to the seed means, and names the best as the commands do
    assert main(["leaderboard", str(path), "--json"]) == 0
    board = json.loads(capsys.readouterr().out)
    first = board["leaderboard"][0]
    assert parent.data.tags["best_trial"] == str(first["trial"]) == best
    assert parent.data.tags["best_basis"] == "seed means over 2 fresh seeds"
    assert parent.data.tags["best_digest"] == first["digest"]
    assert parent.data.metrics["best_val_ne"] == pytest.approx(first["mean_val_ne"])
    assert f"trial {best} (seed means" in parent.data.tags["mlflow.note.content"]
    assert str(board["verdict"]["best_trial"]["trial"]) == best
    assert parent.data.tags["verdict"].startswith("(seed means")  # the tag says verdict
    assert parent.data.tags["verdict_outcome"] == board["verdict"]["outcome"]
    assert main(["status", str(path), "--json"]) == 0
    assert str(json.loads(capsys.readouterr().out)["best_trial"]) == best
    assert main(["export", str(path), "--out", str(tmp_path / "winner")]) == 0
    assert f"exported trial {best} " in capsys.readouterr().out
    card = (tmp_path / "winner" / "model_card.md").read_text()
    assert f"trial {best} (seed means over 2 fresh seeds)" in card
    assert "reevaluation.csv" in {f.path for f in client.list_artifacts(parent.info.run_id)}
    retrained = [n for n, run in trials.items() if "reeval_mean_val_ne" in run.data.metrics]
    assert len(retrained) == 2 and int(best) in retrained
    # a retrained trial's run keeps its own duration (the search's training, not until now)
    assert {n: run.info.end_time for n, run in trials.items()} == ended
    for number in retrained:  # what the search logged is still there
        assert {"val_ne", "mflops"} <= set(trials[number].data.metrics)
        assert trials[number].data.metrics["reeval_seeds"] == 2
    # the view's order (`rank`): the leaderboard's, the best first, every trial ranked
    ranked = sorted(trials, key=lambda n: trials[n].data.metrics["rank"])
    assert ranked[0] == int(best)
    assert [n for n in ranked] == [r["trial"] for r in board["leaderboard"]]

    # another model under a baseline's name is refused; the finished run stays so
    other = tmp_path / "logistic_regression.json"
    other.write_text(preset("dlrm", DatasetSchema.from_dict(study.user_attrs["schema"])).to_json())
    made = []  # the command's logger, to wait for what it sent before reading the run
    real_logger = commands._logger
    monkeypatch.setattr(commands, "_logger", lambda c: made.append(real_logger(c)) or made[-1])
    assert main(["baseline", "add", str(path), str(other)]) == 2
    assert "would be shown as the preset 'logistic_regression'" in capsys.readouterr().err
    assert all(logger.flush(timeout_s=30) == 0 for logger in made)
    assert _runs(client, "reevaluated")[0].info.status == "FINISHED"


def test_a_stopped_study_ends_its_parent_run_in_the_configured_experiment(
    tmp_path, server, monkeypatch
):
    """`mlflow.experiment` was printed and then ignored (the runs went to an experiment
    named after the study), and a study stopped by Ctrl-C or an error showed RUNNING for
    good. Now: KILLED or FAILED, RUNNING again on resume, FINISHED at the end."""
    from nas import runner
    from nas.cli import main
    from study_helpers import write_config

    # max_failures: a tiny model diverging (NE >= 1 on 4,000 rows) is not what is tested
    raw = tiny_config(tmp_path, "stopped", budget={"trials": 4, "max_failures": 50},
                      mlflow={"tracking_uri": server.uri, "experiment": "team"})  # fmt: skip
    path = str(write_config(tmp_path, raw))
    outbox = parse_config(raw).study_dir / "mlflow-outbox"
    client = MlflowClient(tracking_uri=server.uri)
    train = runner.run_trial

    def parent_after(code: int, failure: BaseException | None, args=()) -> Run:
        calls = []

        def second_fails(*args, **kwargs):
            calls.append(1)
            if failure is not None and len(calls) == 2:
                raise failure
            return train(*args, **kwargs)

        monkeypatch.setattr(runner, "run_trial", second_fails)
        assert main(["search", *args]) == code
        assert StudyLogger(server.uri, outbox).flush(timeout_s=30) == 0
        return _runs(client, "team")[0]

    killed = parent_after(130, KeyboardInterrupt(), args=[path])
    assert killed.info.status == "KILLED"
    (stopped,) = [r for r in _runs(client, "team")[1].values() if r.info.status == "KILLED"]
    assert stopped.info.start_time <= stopped.info.end_time  # it started after it ended
    best = study_best(optuna.load_study(study_name="stopped", storage=raw["storage"]))
    assert best is not None or "diverged" in str(optuna.load_study(  # a tiny model's NE >= 1
        study_name="stopped", storage=raw["storage"]).trials[0].user_attrs)  # fmt: skip
    if best is not None:  # the best so far, as `status` names it
        assert killed.data.tags["best_trial"] == str(best["trial"])
        assert killed.data.metrics["best_val_ne"] == best["val_ne"]
    assert client.get_experiment_by_name("stopped") is None
    assert parent_after(2, RanknasError("a bad row"), args=[path]).info.status == "FAILED"
    # a storage failing mid-run: FAILED at once, without waiting on the storage again
    from optuna.exceptions import StorageInternalError

    from nas import commands

    finish, ending = runner._finish, commands._ending
    monkeypatch.setattr(commands, "_ending", lambda config: pytest.fail("read a failed storage"))
    monkeypatch.setattr(runner, "_finish", mock.Mock(side_effect=StorageInternalError("full")))
    assert parent_after(2, None, args=[path]).info.status == "FAILED"
    monkeypatch.setattr(runner, "_finish", finish)
    monkeypatch.setattr(commands, "_ending", ending)
    parent = parent_after(0, None, args=[path])
    assert parent.info.status == "FINISHED" and parent.data.tags["best_trial"]
    _, trials = _runs(client, "team")
    assert {run.info.status for run in trials.values()} >= {"FINISHED", "KILLED"}
    killed = [run.info.run_name for run in trials.values() if run.info.status != "FINISHED"]
    assert all(" MFLOPs" in name for name in killed), killed  # named as trained ones are
    # a `ranknas worker` joining the finished study (or finishing it, ending last) sums it
    # up: it left the parent run RUNNING for good
    assert main(["worker", path]) == 0
    assert StudyLogger(server.uri, outbox).flush(timeout_s=30) == 0
    joined = _runs(client, "team")[0]
    assert joined.info.status == "FINISHED"
    assert joined.data.tags["best_trial"] == parent.data.tags["best_trial"]

    # Another worker runs the study: its parent run is RUNNING again.
    other = StudyLogger(server.uri, tmp_path / "other-outbox")
    other.start_study("stopped", experiment_name="team")
    assert other.flush(timeout_s=30) == 0
    # this process stops on a mistake found before it started the study: not its to end
    (tmp_path / "no-data.yaml").write_text(yaml.safe_dump(raw | {"data": {"source": "no.csv"}}))
    monkeypatch.setattr(runner, "run_trial", train)
    assert main(["search", str(tmp_path / "no-data.yaml")]) == 2
    assert StudyLogger(server.uri, outbox).flush(timeout_s=30) == 0
    assert _runs(client, "team")[0].info.status == "RUNNING"
    # nor while the other worker's trial trains (the process's own are told before it stops)
    from nas.commands import _ending

    assert _ending(parse_config(raw))[1]["best_trial"] == parent.data.tags["best_trial"]
    optuna.load_study(study_name="stopped", storage=raw["storage"]).ask()
    assert _ending(parse_config(raw)) is None


def test_trials_and_baselines_run_before_mlflow_was_on_are_logged_once_it_is(
    tmp_path, server, capfd
):
    """A study run without MLflow, then re-evaluated and resumed with it: the earlier trials
    (repeats among them) and the baseline get whole runs, as the later ones do; once. The
    re-evaluation's metrics used to make empty runs, RUNNING for ever."""
    from nas.cli import main

    raw = tiny_config(tmp_path, "later", budget={"trials": 3}, baselines=["dlrm"],
                      mlflow={"tracking_uri": server.uri})  # fmt: skip
    config = parse_config(raw)
    earlier = run_study(config, progress=lambda line: None).trials  # no logger: MLflow off
    export = ["export", "later", "--storage", config.storage, "--out", str(tmp_path / "out"),
              "--register", "later", "--tracking-uri", server.uri]  # fmt: skip
    assert main(export) == 0  # no trial run to log the model into: said
    assert "has no run on" in capfd.readouterr().out
    assert main(["reevaluate", str(write_config(tmp_path, raw)), "--top", "1", "--seeds",
                 "1"]) == 0  # fmt: skip
    logger = StudyLogger(server.uri, config.study_dir / "mlflow-outbox", request_timeout_s=5)
    config.budget.trials = 6
    lines = []
    study = run_study(config, logger=logger, progress=lines.append)
    assert logger.flush(timeout_s=60) == 0
    assert not any(line.startswith("MLflow: logging") for line in lines)  # reevaluate did
    client = MlflowClient(tracking_uri=server.uri)
    _, runs = _runs(client, "later")
    assert sorted(runs) == [t.number for t in study.trials] and len(earlier) < len(runs)
    experiment_id = client.get_experiment_by_name("later").experiment_id
    (baseline,) = client.search_runs([experiment_id], "tags.`ranknas.kind` = 'baseline'")
    assert baseline.data.metrics["val_ne"] == study.user_attrs["baselines:dlrm"]["val_ne"]
    assert baseline.info.status == "FINISHED" and "reeval_mean_val_ne" in baseline.data.metrics
    for trial in study.trials:
        run = runs[trial.number]
        original = study.trials[trial.user_attrs.get("reused_from", trial.number)]
        state = {"COMPLETE": "complete", "PRUNED": "pruned"}.get(original.state.name, "failed")
        assert run.info.status == RUN_STATUS.get(state, "FAILED"), trial.number
        assert run.data.tags["digest"] == trial.user_attrs["digest"]
        assert run.data.metrics["val_ne"] == trial.user_attrs["val_ne"]
        network = architecture_params(read_architecture(trial.user_attrs["trial_dir"]))
        assert {"architecture", *network} <= set(run.data.params), trial.number
        if "reused_from" not in trial.user_attrs:
            files = {f.path for f in client.list_artifacts(run.info.run_id)}
            assert {"architecture.json", "architecture.png"} <= files, trial.number
    assert sum("reeval_mean_val_ne" in r.data.metrics for r in runs.values()) == 1
    for trial in earlier:  # the runs last as long as their trials did
        took = (trial.datetime_complete - trial.datetime_start).total_seconds()
        run = runs[trial.number].info
        assert abs((run.end_time - run.start_time) / 1000 - took) < 0.5, trial.number
    assert 0 <= baseline.info.end_time - baseline.info.start_time < 60_000
    view = client.get_experiment(experiment_id).tags[SHARED_VIEW_PREFIX + view_key("later")]
    assert "reeval_mean_val_ne" in view  # the search after `reevaluate` kept its columns
    queued = _trial_records(config.study_dir)
    lines.clear()
    study = run_study(config, logger=logger, progress=lines.append)  # nothing left to log
    assert _trial_records(config.study_dir) == queued
    assert not any(line.startswith("MLflow: logging") for line in lines)


def _trial_records(study_dir: Path) -> int:
    """The run records a study's outbox ever queued."""
    import sqlite3

    with sqlite3.connect(study_dir / "mlflow-outbox" / "outbox.db") as conn:
        return conn.execute("SELECT COUNT(*) FROM records WHERE kind = 'trial'").fetchone()[0]


def test_a_study_whose_mlflow_server_is_down_says_how_to_start_it(tmp_path, capsys):
    """It waited 30 s for a server nobody ran, then said only "MLflow unreachable"."""
    from nas.cli import main

    raw = tiny_config(tmp_path, "down", budget={"trials": 1},
                      mlflow={"tracking_uri": "http://127.0.0.1:9"})  # fmt: skip
    assert main(["search", str(write_config(tmp_path, raw))]) == 0
    err = capsys.readouterr().err
    assert "no MLflow server answers at http://127.0.0.1:9: 3 records kept in" in err
    assert "start it with `ranknas mlflow up --port 9` (and the --data-dir" in err
    # `status`, asked later, said "1 complete" and nothing of the records still waiting
    path = str(write_config(tmp_path, raw))
    assert main(["status", path]) == 0
    assert "MLflow: 3 records of this study wait in" in capsys.readouterr().out
    assert main(["status", path, "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["mlflow_records_waiting"] == 3


def test_seed_means_computed_without_mlflow_reach_it_with_the_runs(tmp_path, server):
    """`reevaluate --no-mlflow`, then MLflow on: the runs came, their seed means did not
    (the parent's best named "seed means" no run showed)."""
    from nas.cli import main

    raw = tiny_config(tmp_path, "means", budget={"trials": 2},
                      mlflow={"tracking_uri": server.uri})  # fmt: skip
    config = parse_config(raw)
    run_study(config, progress=lambda line: None)  # no logger: MLflow off
    path = str(write_config(tmp_path, raw))
    assert main(["reevaluate", path, "--top", "1", "--seeds", "2", "--no-mlflow"]) == 0
    logger = StudyLogger(server.uri, config.study_dir / "mlflow-outbox", request_timeout_s=5)
    study = run_study(config, logger=logger, progress=lambda line: None)
    assert logger.flush(timeout_s=60) == 0
    _, runs = _runs(MlflowClient(tracking_uri=server.uri), "means")
    (key,) = study.user_attrs["reevaluation"]
    means = runs[int(key)].data.metrics
    assert means["reeval_seeds"] == 2 and "reeval_mean_val_ne" in means
    # a third seed, MLflow off again: the run showed the 2-seed mean for ever
    assert main(["reevaluate", path, "--top", "1", "--seeds", "3", "--no-mlflow"]) == 0
    run_study(config, logger=logger, progress=lambda line: None)
    assert logger.flush(timeout_s=60) == 0
    _, runs = _runs(MlflowClient(tracking_uri=server.uri), "means")
    assert runs[int(key)].data.metrics["reeval_seeds"] == 3


def test_a_baseline_interrupted_while_tuning_ends_its_run_killed(tmp_path, server, monkeypatch):
    """Its run (its recipe runs' parent) stayed RUNNING until a rerun trained it."""
    import nas.baselines

    space = {"type": "dag", "num_blocks": 1, "ops": ["mlp"], "widths": [8],
             "embedding_dims": [4], "max_inputs": 1}  # fmt: skip
    training = {"search": {"dense_lr": {"low": 0.001, "high": 0.01}, "grid": 3}}
    config, logger = _study(tmp_path, server, "tuning-stopped", trials=1, search_space=space,
                            baselines=["dlrm"], training=training,
                            best_baseline={"tune": 2, "seeds": 0})  # fmt: skip
    train = nas.baselines.train_architecture

    def stopped(*args, **kwargs):
        if kwargs["label"] == "baseline dlrm recipe 2":
            raise KeyboardInterrupt
        return train(*args, **kwargs)

    monkeypatch.setattr(nas.baselines, "train_architecture", stopped)
    with pytest.raises(KeyboardInterrupt):
        run_study(config, logger=logger, progress=lambda line: None)
    assert logger.flush(timeout_s=30) == 0
    client = MlflowClient(tracking_uri=server.uri)
    experiment_id = client.get_experiment_by_name("tuning-stopped").experiment_id
    query = "tags.`ranknas.kind` = 'baseline'"
    (run,) = client.search_runs([experiment_id], query)
    assert run.info.status == "KILLED" and run.data.tags["status"] == "interrupted"

    monkeypatch.setattr(nas.baselines, "train_architecture", train)
    run_study(config, logger=logger, progress=lambda line: None)
    assert logger.flush(timeout_s=30) == 0
    (run,) = client.search_runs([experiment_id], query)  # the same run, trained and named
    assert run.info.status == "FINISHED" and run.data.tags["status"] == "complete"
    assert run.info.run_name.startswith("baseline-dlrm mlp>dot>mlp")
    # the recipe run the baseline kept is marked among its recipe runs
    recipes = client.search_runs([experiment_id], "tags.`ranknas.kind` = 'tuning'")
    chosen = [r for r in recipes if r.data.tags.get("chosen_recipe") == "True"]
    assert len(recipes) == 2 and len(chosen) == 1
    assert chosen[0].data.metrics["val_ne"] == min(r.data.metrics["val_ne"] for r in recipes)


def test_the_view_s_ranks_and_the_verdict_s_p_value_are_never_stale(tmp_path, server):
    """A run whose rank came back to a value it once had was skipped as logged (two runs
    then shared a rank, and the view's order was not the leaderboard's); a verdict that
    lost its p-value left the earlier one beside "no_win"."""
    from nas import leaderboard
    from study_helpers import recorded_study

    url = f"sqlite:///{tmp_path / 'studies.db'}"
    runs = {"0": [0.850, 0.851], "1": [0.852, 0.853], "baseline:dlrm": [0.86, 0.861]}
    study = recorded_study(url, [(0.85, 1.0), (0.852, 1.0)], baselines={"dlrm": (0.86, 1.0)},
                           reevaluation=runs, name="ranks")  # fmt: skip
    logger = StudyLogger(server.uri, tmp_path / "outbox", request_timeout_s=5)
    logger.start_study("ranks")
    for number in (0, 1):
        logger.log_trial(number, metrics={"val_ne": 0.85})
    orders = [{"trial:0": 1, "trial:1": 2}, {"trial:0": 2, "trial:1": 1},
              {"trial:0": 1, "trial:1": 2}]  # fmt: skip
    with mock.patch.object(leaderboard, "view_ranks", side_effect=orders):
        for _ in orders:
            log_summary(logger, study, rows(study))
    assert logger.flush(timeout_s=30) == 0
    parent, trials = _runs(MlflowClient(tracking_uri=server.uri), "ranks")
    assert {n: run.data.metrics["rank"] for n, run in trials.items()} == {0: 1, 1: 2}
    assert parent.data.metrics["verdict_p_value"] == pytest.approx(
        leaderboard.verdict(study)["paired"]["p_value"])  # fmt: skip
    # a verdict with no p-value (the best is a baseline's own architecture): none beside it
    with mock.patch.object(leaderboard, "verdict", return_value=leaderboard.verdict(study) | {
            "paired": None, "outcome": "no_win"}):  # fmt: skip
        log_summary(logger, study, rows(study))
    assert logger.flush(timeout_s=30) == 0
    parent, _ = _runs(MlflowClient(tracking_uri=server.uri), "ranks")
    assert parent.data.tags["verdict_outcome"] == "no_win"
    assert str(parent.data.metrics["verdict_p_value"]) == "nan"


def test_a_study_resumed_with_its_server_named_localhost_logs_nothing_again(tmp_path, server):
    """Logged to 127.0.0.1, resumed with localhost: every run was logged again "that ran
    without it", each metric then with two points."""
    config, logger = _study(tmp_path, server, "by-name", trials=1)
    run_study(config, logger=logger, progress=lambda line: None)
    assert logger.flush(timeout_s=30) == 0
    renamed = server.uri.replace("127.0.0.1", "localhost")
    lines = []
    logger = StudyLogger(renamed, config.study_dir / "mlflow-outbox", request_timeout_s=5)
    run_study(config, logger=logger, progress=lines.append)
    assert logger.flush(timeout_s=30) == 0
    assert not any("ran without it" in line or "again" in line for line in lines), lines
    client = MlflowClient(tracking_uri=server.uri)
    (run,) = _runs(client, "by-name")[1].values()
    assert len(client.get_metric_history(run.info.run_id, "val_ne")) == 1
