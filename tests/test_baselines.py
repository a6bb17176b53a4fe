"""Baselines inside a study: trained like trials, outside the budget, unseen by samplers,
on the leaderboard (text, CSV, JSON), in the verdict, and added to a finished study."""

import csv
import io
import json
import math
import statistics
from pathlib import Path

import pytest
import torch
from optuna.trial import TrialState
from safetensors.torch import load_file

from nas.baselines import recorded
from nas.cli import main
from nas.config import BestBaselineConfig, parse_config
from nas.leaderboard import baseline_rows, format_verdict, status, verdict
from nas.protocol import prepare_data
from nas.reevaluate import REEVAL_SEED, best_baseline_by_seed_means, reevaluate_study
from nas.runner import run_study
from nas.storage import load_study
from search_space.architecture import analyze, digest
from search_space.errors import RanknasError
from search_space.presets import preset
from search_space.schema import synthetic_schema
from study_helpers import counted, tiny_config, write_config


def _config(tmp_path, name, baselines=("logistic_regression", "dlrm"), **overrides):
    return tiny_config(tmp_path, name, baselines=list(baselines), **overrides)


def test_baselines_are_trained_outside_the_budget_and_never_reach_the_sampler(tmp_path):
    config = parse_config(_config(tmp_path, "base", budget={"trials": 2}))
    study = run_study(config, progress=lambda line: None)
    assert len(study.trials) == 2  # the budget: trials only
    assert all("baseline" not in str(t.params) for t in study.trials)
    bases = recorded(study)
    assert list(bases) == ["logistic_regression", "dlrm"]
    for key, record in bases.items():
        assert record["status"] == "complete" and 0 < record["val_ne"] < 1.5
        assert record["mflops"] > 0 and record["digest"]
        assert (tmp_path / "base" / "baselines" / key / "model.safetensors").exists()
    # resuming trains neither the trials nor the baselines again
    lines = []
    again = run_study(config, progress=lines.append)
    assert len(again.trials) == 2 and recorded(again) == bases
    assert not any("not in the config's `baselines`" in line for line in lines)
    # one taken out of the YAML stays in every table and verdict: said, not silent; one
    # added by `baseline add` (in no config) is not
    again.set_user_attr("baselines:logistic_regression", bases["logistic_regression"] | {
        "added": True})  # fmt: skip
    lines.clear()
    run_study(parse_config(_config(tmp_path, "base", baselines=(), budget={"trials": 2})),
              progress=lines.append)  # fmt: skip
    said = [line for line in lines if "not in the config's `baselines`" in line]
    assert len(said) == 1 and said[0].startswith("baselines dlrm: in the study"), lines


def test_a_baseline_interrupted_while_training_is_trained_by_the_rerun(tmp_path, monkeypatch):
    """Its claim outlived the Ctrl-C by three heartbeats: a rerun within them went on
    without the baseline, and said nothing."""
    import nas.baselines

    config = parse_config(tiny_config(tmp_path, "stopped", budget={"trials": 1},
                                      baselines=["dlrm", "logistic_regression"],
                                      heartbeat_seconds=30))  # fmt: skip
    train_one = nas.baselines._train_one

    def interrupted(study, config, key, *args, **kwargs):
        if key == "logistic_regression":
            raise KeyboardInterrupt
        return train_one(study, config, key, *args, **kwargs)

    monkeypatch.setattr(nas.baselines, "_train_one", interrupted)
    with pytest.raises(KeyboardInterrupt):
        run_study(config, progress=lambda line: None)
    monkeypatch.setattr(nas.baselines, "_train_one", train_one)
    study = run_study(config, progress=lambda line: None)
    assert set(recorded(study)) == {"dlrm", "logistic_regression"}


def test_leaderboard_and_status_show_baselines_and_the_verdict(tmp_path, capsys):
    config = _config(tmp_path, "board", budget={"trials": 2})
    storage = ["--storage", config["storage"]]
    assert main(["search", str(write_config(tmp_path, config)), "--no-mlflow"]) == 0
    out = capsys.readouterr().out
    assert "Baselines (trained like every trial" in out and "verdict (recorded runs)" in out

    assert main(["leaderboard", "board", *storage, "--json"]) == 0
    board = json.loads(capsys.readouterr().out)
    assert [b["baseline"] for b in board["baselines"]] == ["logistic_regression", "dlrm"]
    for b in board["baselines"]:
        assert {"val_ne", "test_ne", "val_logloss", "val_auc", "mflops", "params"} <= set(b)
    v = board["verdict"]
    assert v["best_baseline"]["baseline"] in ("logistic_regression", "dlrm")
    best_base = min(board["baselines"], key=lambda b: b["val_ne"])
    assert v["delta_val_ne"] == board["leaderboard"][0]["val_ne"] - best_base["val_ne"]
    assert v["search_lower"] == (v["delta_val_ne"] < 0)
    assert v["test_agrees"] == ((v["delta_test_ne"] < 0) == v["search_lower"])
    # single runs: nobody wins yet, and the JSON says what the text says
    assert v["outcome"] == ("search_leads" if v["search_lower"] else "baseline_leads")

    assert main(["leaderboard", "board", *storage, "--csv"]) == 0
    table = list(csv.DictReader(io.StringIO(capsys.readouterr().out)))
    assert list(table[0])[:2] == ["trial", "baseline"]  # MLflow's preview shows the first
    assert [r["baseline"] for r in table if r["baseline"]] == ["logistic_regression", "dlrm"]
    assert sum(not r["baseline"] for r in table) == 2

    bases = recorded(load_study("board", config["storage"]))
    assert main(["status", "board", *storage, "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["verdict"] == v
    assert main(["status", "board", *storage]) == 0
    assert "verdict" in capsys.readouterr().out

    # a baseline exports as a trial does: its recorded run's architecture and weights
    out = tmp_path / "dlrm-export"
    assert main(["export", "board", *storage, "--trial", "baseline:dlrm", "--out", str(out)]) == 0
    assert f"exported baseline dlrm (digest {bases['dlrm']['digest']})" in capsys.readouterr().out
    recorded_dir = Path(bases["dlrm"]["dir"])
    exported, trained = (load_file(d / "model.safetensors") for d in (out, recorded_dir))
    assert exported.keys() == trained.keys()
    assert all(torch.equal(exported[k], trained[k]) for k in trained)
    card = (out / "model_card.md").read_text()
    assert card.startswith("# board, baseline dlrm (") and "| baseline | dlrm |" in card
    assert main(["export", "board", *storage, "--trial", "baseline:dcn", "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert "no baseline 'dcn' (baseline:logistic_regression, baseline:dlrm;" in err


def test_a_baseline_whose_seed_mean_is_worse_than_the_base_rate_is_not_compared(tmp_path):
    """One diverged reevaluation seed put logistic regression's mean at 1.0031, shown as a
    complete baseline and compared."""
    from nas.leaderboard import rows

    config = parse_config(_config(tmp_path, "meaned", budget={"trials": 1}))
    study = run_study(config, progress=lambda line: None)
    first, second = str(REEVAL_SEED), str(REEVAL_SEED + 1)
    study.set_user_attr("reevaluation", {
        str(rows(study)[0]["trial"]): {first: [0.90, 0.91], second: [0.92, 0.93]},
        "baseline:dlrm": {first: [0.95, 0.95], second: [0.96, 0.96]},
        "baseline:logistic_regression": {first: [0.99, 0.99], second: [1.02, 1.0]},
    })  # fmt: skip
    v = verdict(load_study("meaned", config.storage))
    assert v["seed_means"] and v["best_baseline"]["baseline"] == "dlrm"
    assert v["failed_baselines"] == ["logistic_regression"]
    assert "failed or diverged, not compared: logistic_regression" in format_verdict(v)
    record = study.user_attrs["reevaluation"]
    del record["baseline:dlrm"]  # the only baseline with seed means diverged: recorded runs
    study.set_user_attr("reevaluation", record)
    v = verdict(load_study("meaned", config.storage))
    assert v["best_baseline"]["baseline"] == "dlrm" and v["basis"] == "recorded runs"
    assert v["failed_baselines"] == ["logistic_regression"]


def test_a_failed_baseline_is_left_out_of_the_verdict(tmp_path):
    config = parse_config(_config(tmp_path, "diverged", budget={"trials": 1}))
    study = run_study(config, progress=lambda line: None)
    record = recorded(study)["dlrm"] | {
        "status": "failed",
        "val_ne": 0.5,
        "failure_reason": "diverged: validation NE 1.0015",
    }
    study.set_user_attr("baselines:dlrm", record)  # a low NE, but from a failed run
    v = verdict(load_study("diverged", config.storage))
    assert v["best_baseline"]["baseline"] == "logistic_regression"
    assert v["failed_baselines"] == ["dlrm"]
    assert "failed or diverged, not compared: dlrm" in format_verdict(v)
    # nor is it a base to search around (a study searched around a diverged one, in vain)
    from nas.baselines import best_baseline

    assert best_baseline(study)[0] == "logistic_regression"
    from nas.runner import _best_baseline

    # nor a linear model, the others failed: the search ran around it (or under its FLOPs)
    space = {"type": "around", "base": "best_baseline"}
    single_runs = {"search_space": space, "best_baseline": {"seeds": 0}}
    around = parse_config(_config(tmp_path, "diverged") | single_runs)
    with pytest.raises(RanknasError, match=r"every baseline but logistic_regression failed "
                       r"\(dlrm\): the search would run around a linear model"):  # fmt: skip
        _best_baseline(study, around, None, lambda line: None)
    # one other that completed, however far behind: a model to search around
    linear = recorded(study)["logistic_regression"]
    study.set_user_attr("baselines:dcnv2", linear | {"val_ne": linear["val_ne"] + 0.01})
    best = _best_baseline(study, around, None, lambda line: None)
    assert best is not None and best[0] == "logistic_regression"
    study.set_user_attr("baselines:dcnv2", record | {"name": "dcnv2"})  # failed too
    study.set_user_attr("baselines:logistic_regression", record)
    assert best_baseline(study) is None
    around = parse_config(_config(tmp_path, "diverged") | {"search_space": space})
    with pytest.raises(RanknasError, match="no baseline trained to completion"):
        _best_baseline(study, around, None, lambda line: None)


@pytest.mark.parametrize(
    ("basis", "delta_test", "said"),
    [
        ("recorded runs", -0.002, "the search leads on single runs, not yet a verdict: trial 3"),
        (
            "recorded runs",
            0.0046,
            "the search leads on single runs, not yet a verdict (validation only: test NE "
            "disagrees): trial 3",
        ),
        ("seed means over 1 fresh seed", -0.001, "the search leads on too few seeds to test"),
    ],
)
def test_the_verdict_says_when_test_disagrees_and_when_it_rests_on_single_runs(
    basis, delta_test, said
):
    """A trial's single run, the best of the study's, "won" against the baseline's seed mean
    and lost once `reevaluate` retrained both (a user trial): it only leads until then."""
    v = {
        "basis": basis,
        "seed_means": basis.startswith("seed means"),
        "best_trial": {"trial": 3, "val_ne": 0.9039, "test_ne": 0.9091 + delta_test,
                       "mflops": 1.58},
        "best_baseline": {"baseline": "dlrm", "val_ne": 0.9047, "test_ne": 0.9091, "mflops": 1},
        "delta_val_ne": -0.0008,
        "delta_test_ne": delta_test,
        "flops_ratio": 1.58,
        "search_lower": True,
        "test_agrees": delta_test < 0,
        "not_compared": [],
        "dominated_baselines": [],
    }  # fmt: skip
    text = format_verdict(v)
    assert said in text
    assert ("reevaluate" in text) == (basis == "recorded runs")
    # a lucky single run dominates a baseline as easily as it leads: said beside it
    on_single_runs = "Pareto-dominated by the found architectures' single runs:" in text
    assert on_single_runs == (not v["seed_means"])


def _verdict_of(**fields) -> dict:
    return {
        "basis": "seed means over 3 fresh seeds",
        "seed_means": True,
        "best_trial": {"trial": 4, "val_ne": 0.9168, "test_ne": 0.91, "mflops": 1.0},
        "best_baseline": {"baseline": "dlrm", "val_ne": 0.9189, "test_ne": 0.92, "mflops": 1.0},
        "delta_val_ne": -0.0021,
        "delta_test_ne": -0.01,
        "flops_ratio": 1.0,
        "search_lower": True,
        "test_agrees": True,
        "not_compared": [],
        "dominated_baselines": [],
    } | fields  # fmt: skip


def test_a_win_within_seed_noise_is_undecided_and_a_tie_is_shown_equal():
    """The headline said "the search wins" and the next line "p=0.78: within seed noise";
    then "a tie" for a trial that lost on 3 of 3 seeds by 1% NE (p >= 0.05 on 3 seeds): a
    tie is two means shown within 0.1% NE of each other, else it is undecided."""
    paired = {"seeds": 3, "found_better": 2, "delta_val_ne_sd": 0.01}
    undecided = format_verdict(_verdict_of(paired=paired | {"p_value": 0.78}))
    assert ("undecided: within seed noise, not shown equal (the search's mean is lower): "
            "trial 4") in undecided  # fmt: skip
    assert "the search wins" not in undecided and "a tie" not in undecided
    tie = format_verdict(_verdict_of(paired=paired | {"p_value": 0.78}, equivalent=True))
    assert "a tie: shown within 0.1% NE of each other by seed (the search's mean" in tie
    # within seed noise nobody leads on validation: test NE has nothing to disagree with
    tie = format_verdict(_verdict_of(paired=paired | {"p_value": 0.78}, equivalent=True,
                                      delta_test_ne=0.004, test_agrees=False))  # fmt: skip
    assert "disagrees" not in tie and "(+0.0040)" in tie
    win = format_verdict(_verdict_of(paired=paired | {"p_value": 0.01}))
    assert "the search wins: trial 4" in win and "beyond seed noise" in win
    tiny = format_verdict(_verdict_of(paired=paired | {"p_value": 0.01}, flops_ratio=0.0016))
    assert "at 0.0016x its FLOPs" in tiny  # "0.00x" said nothing


def test_the_search_finding_the_baseline_itself_is_no_win():
    """A trial of the baseline's own architecture "won" by a luckier seed, and dominated it."""
    v = _verdict_of(same_architecture=True, search_lower=False)
    text = format_verdict(v)
    assert "no win: the search's best is baseline dlrm's own architecture" in text
    assert "the search wins" not in text


def test_baseline_add_on_a_finished_study_and_reevaluate_uses_seed_means(
    tmp_path, capsys, monkeypatch
):
    config = _config(tmp_path, "later", baselines=(), budget={"trials": 2})
    path = write_config(tmp_path, config)
    study = run_study(parse_config(config), progress=lambda line: None)
    assert verdict(study) is None and recorded(study) == {}

    assert main(["baseline", "add", str(path), "dlrm", "--no-mlflow"]) == 0
    assert "verdict (recorded runs)" in capsys.readouterr().out
    study = load_study("later", config["storage"])
    assert list(recorded(study)) == ["dlrm"] and len(study.trials) == 2
    assert recorded(study)["dlrm"]["added"]  # in no config: a search does not name it
    # added again, or its architecture under another name (recorded, or given twice in
    # one command): nothing trained twice, and said; what is added lists after the others
    schema = prepare_data(parse_config(config)).train.schema
    (tmp_path / "mine.json").write_text(preset("dlrm", schema).to_json())
    (tmp_path / "cross.json").write_text(preset("dcnv2", schema).to_json())
    capsys.readouterr()
    assert main(["baseline", "add", str(path), "dcnv2", "--no-mlflow"]) == 0
    assert main(["baseline", "add", str(path), "dlrm", str(tmp_path / "mine.json"),
                 str(tmp_path / "cross.json"), "--no-mlflow"]) == 0  # fmt: skip
    out = capsys.readouterr().out
    assert "baseline dlrm: recorded already, not trained again" in out
    assert "baseline mine: the architecture of baseline dlrm (digest" in out
    assert "baseline cross: the architecture of baseline dcnv2 (digest" in out
    study = load_study("later", config["storage"])
    assert list(recorded(study)) == ["dlrm", "dcnv2"]
    assert [b["baseline"] for b in baseline_rows(study)] == ["dlrm", "dcnv2"]  # as added
    assert [r["order"] for r in recorded(study).values()] == [0, 1]
    new = main(["baseline", "add", str(path), str(tmp_path / "cross.json"), "deepfm", "dcnv2",
                "--no-mlflow"])  # fmt: skip
    assert new == 0 and "training deepfm" in capsys.readouterr().out
    assert list(recorded(load_study("later", config["storage"]))) == ["dlrm", "dcnv2", "deepfm"]

    table = reevaluate_study(parse_config(config), top=1, seeds=2, progress=lambda line: None)
    assert len(table) == 4 and "baseline:dlrm" in {str(r["trial"]) for r in table}
    runs = load_study("later", config["storage"]).user_attrs["reevaluation"]
    assert set(runs["baseline:dlrm"]) == {str(REEVAL_SEED), str(REEVAL_SEED + 1)}
    v = verdict(load_study("later", config["storage"]))
    assert v["basis"] == "seed means over 2 fresh seeds"
    assert v["paired"]["looks"] == 1  # the round's verdict, tested once
    reevaluate_study(parse_config(config), top=1, seeds=2, progress=lambda line: None)
    assert verdict(load_study("later", config["storage"]))["paired"]["looks"] == 1  # no new run
    # a front of other trials' single runs does not dominate a baseline's seed mean
    assert "Pareto-dominated by the re-evaluated architectures' seed means:" in format_verdict(v)
    best = v["best_baseline"]["baseline"]
    assert (
        v["best_baseline"]["val_ne"] == sum(val for val, _ in runs[f"baseline:{best}"].values()) / 2
    )

    def no_data(config):
        raise AssertionError("the data was loaded before the baseline's name was checked")

    monkeypatch.setattr("nas.protocol.prepare_data", no_data)
    assert main(["baseline", "add", str(path), "no_such_model", "--no-mlflow"]) == 2
    assert "baselines: no_such_model: neither a preset" in capsys.readouterr().err


def test_reading_a_study_by_its_config_needs_not_find_its_model_files(
    tmp_path, monkeypatch, capsys
):
    """Relative model paths are read from the current directory: elsewhere, `search`
    says where it looked; `status` and `leaderboard` read only the study's records."""
    monkeypatch.chdir(tmp_path)
    schema = prepare_data(parse_config(_config(tmp_path, "probe"))).train.schema
    (tmp_path / "mine.json").write_text(preset("dlrm", schema).to_json())
    config = _config(tmp_path, "moved", baselines=("mine.json",), budget={"trials": 1})
    run_study(parse_config(config), progress=lambda line: None)
    path = write_config(tmp_path, config)
    (tmp_path / "elsewhere").mkdir()
    monkeypatch.chdir(tmp_path / "elsewhere")
    assert main(["search", str(path)]) == 2
    looked = f"looked for at {tmp_path / 'elsewhere' / 'mine.json'} (relative paths are from"
    assert "mine.json: neither a preset" in (err := capsys.readouterr().err) and looked in err
    assert main(["status", str(path)]) == 0 and main(["leaderboard", str(path)]) == 0
    assert "mine" in (out := capsys.readouterr().out) and "budget.trials" not in out
    # the YAML's budget raised since: status showed the last search's alone
    path = write_config(tmp_path, config | {"budget": {"trials": 3}})
    assert main(["status", str(path)]) == 0
    assert "(budget 1)\nthe config's budget.trials is 3: `ranknas search` runs up to it" in (
        capsys.readouterr().out)  # fmt: skip


def test_two_architectures_under_one_baseline_name_are_refused(tmp_path, capsys):
    """A baseline is keyed by its file's stem: another model under a recorded key was
    skipped, or shown with the recorded one's figures."""
    config = _config(tmp_path, "named", baselines=("dlrm",), budget={"trials": 1})
    run_study(parse_config(config), progress=lambda line: None)
    schema = prepare_data(parse_config(config)).train.schema
    (tmp_path / "other").mkdir()
    for path, model in ((tmp_path / "dlrm.json", "deepfm"), (tmp_path / "mine.json", "dcnv2"),
                        (tmp_path / "other" / "mine.json", "deepfm")):  # fmt: skip
        path.write_text(preset(model, schema).to_json())
    add = ["baseline", "add", str(write_config(tmp_path, config)), "--no-mlflow"]
    shown_as_dlrm = "dlrm.json would be shown as the preset 'dlrm' but holds another"
    assert main([*add, str(tmp_path / "dlrm.json")]) == 2
    assert shown_as_dlrm in capsys.readouterr().err
    fresh = _config(tmp_path, "fresh", baselines=(str(tmp_path / "dlrm.json"),))
    assert main(["search", str(write_config(tmp_path, fresh))]) == 2  # nothing recorded yet
    assert shown_as_dlrm in capsys.readouterr().err
    assert main([*add, str(tmp_path / "mine.json"), str(tmp_path / "other" / "mine.json")]) == 2
    assert "are both named 'mine' but hold different architectures" in capsys.readouterr().err
    assert list(recorded(load_study("named", config["storage"]))) == ["dlrm"]
    assert main([*add, "dlrm"]) == 0  # the same architecture again: nothing to train
    assert main([*add, str(tmp_path / "mine.json")]) == 0
    assert main([*add, str(tmp_path / "other" / "mine.json")]) == 2
    assert "holds baseline 'mine' with another architecture" in capsys.readouterr().err
    # a study that recorded dlrm.json before it was refused resumes with it as it is
    study = load_study("named", config["storage"])
    old = recorded(study)["dlrm"] | {"digest": digest(preset("deepfm", schema))}
    study.set_user_attr("baselines:dlrm", old)
    assert main([*add, str(tmp_path / "dlrm.json")]) == 0


def test_best_baseline_ceiling_skips_bigger_architectures_outside_the_budget(tmp_path):
    config = _config(tmp_path, "capped", baselines=("dlrm",), budget={"trials": 4},
                     objectives={"max_mflops": "best_baseline"},
                     searcher={"type": "random", "startup_trials": 2})  # fmt: skip
    config["search_space"] = {"type": "around", "base": "dcnv2"}
    lines = []
    study = run_study(parse_config(config), progress=lines.append)
    ceiling = study.user_attrs["mflops_ceiling"]
    assert ceiling == {"mflops": recorded(study)["dlrm"]["mflops"], "of": "baseline dlrm"}
    # the startup variants are drawn under the ceiling: none is skipped
    startup = [t for t in study.trials if "fixed_params" in t.system_attrs]
    assert len(startup) == 2 and all(t in counted(study) for t in startup)
    skipped = [t for t in study.trials if t.user_attrs.get("over_constraint")]
    assert len(counted(study)) == 4 and skipped  # DCNv2's variants are mostly above DLRM's FLOPs
    assert all(t.user_attrs["mflops"] <= ceiling["mflops"] for t in counted(study))
    for trial in skipped:
        assert trial.user_attrs["mflops"] > ceiling["mflops"]
        assert not (
            tmp_path / "capped" / "trials" / str(trial.number) / "model.safetensors"
        ).exists()
    assert sum(line.startswith("[") and "skipped:" in line for line in lines) == len(skipped)
    state = status(study)
    assert state["trials"]["skipped"] == len(skipped) and state["mflops_ceiling"] == ceiling


def test_base_ceiling_holds_an_around_search_to_its_base_flops(tmp_path):
    # On the tiny data many variants end near NE 1 (diverged): failures are not the point.
    config = tiny_config(tmp_path, "atbase", objectives={"max_mflops": "base"},
                         budget={"trials": 2, "max_failures": 20})  # fmt: skip
    config["search_space"] = {"type": "around", "base": "dcnv2"}
    study = run_study(parse_config(config), progress=lambda line: None)
    ceiling = study.user_attrs["mflops_ceiling"]
    base = preset("dcnv2", synthetic_schema(seed=0))
    assert ceiling == {"mflops": analyze(base).flops / 1e6, "of": "base dcnv2"}
    done = [t for t in study.trials if t.state == TrialState.COMPLETE]
    assert len(done) == 2 and all(t.user_attrs["mflops"] <= ceiling["mflops"] for t in done)


def test_an_around_search_of_the_best_baseline_goes_around_it_at_its_flops(tmp_path):
    config = _config(tmp_path, "atbest", baselines=("deepfm", "dlrm"),
                     objectives={"max_mflops": "base"},
                     budget={"trials": 2, "max_failures": 20})  # fmt: skip
    config["search_space"] = {"type": "around", "base": "best_baseline"}
    lines = []
    study = run_study(parse_config(config), progress=lines.append)
    bases = recorded(study)
    # chosen by the mean validation NE over 3 fresh seeds, the runs reevaluate makes
    runs = study.user_attrs["reevaluation"]
    assert sorted(runs) == ["baseline:deepfm", "baseline:dlrm"]
    assert all(sorted(r) == [str(REEVAL_SEED + k) for k in range(3)] for r in runs.values())
    means = {key: statistics.fmean(v for v, _ in runs[f"baseline:{key}"].values())
             for key in bases}  # fmt: skip
    best = min(means, key=means.__getitem__)
    assert study.user_attrs["around_base"] == best
    assert f"search: around the best baseline, {best}" in lines
    assert any(line.startswith("best baseline by mean validation NE: ") for line in lines)
    assert study.user_attrs["mflops_ceiling"] == {"mflops": bases[best]["mflops"],
                                                  "of": f"base {best}"}  # fmt: skip
    assert study.user_attrs["search_space"]["base"] == "best_baseline"  # as configured
    assert status(study)["around_base"] == best
    done = [t for t in study.trials if t.state == TrialState.COMPLETE]
    assert len(done) == 2 and all(t.user_attrs["mflops"] <= bases[best]["mflops"] for t in done)
    # a baseline added later that beats them all does not move the base of a resumed study
    study.set_user_attr("baselines:dcnv2", bases[best] | {"val_ne": 0.1, "order": 9})
    config["budget"] |= {"trials": 3}
    again = run_study(parse_config(config), progress=lines.append)
    assert again.user_attrs["around_base"] == best
    assert sum(t.state == TrialState.COMPLETE for t in again.trials) == 3
    # reevaluate reuses the baselines' runs: it trains the trials (and the dcnv2 added above)
    lines.clear()
    reevaluate_study(parse_config(config), top=2, seeds=3, progress=lines.append)
    _, reused, *runs = lines  # the trials it chose, then what it reuses
    assert reused == "6 of 15 runs already recorded, reused: training 9"
    trained = {line.split("] ")[1].split(" seed ")[0] for line in runs}
    assert len(runs) == 9 and {t for t in trained if "baseline" in t} == {"baseline dcnv2"}


def test_best_baseline_by_seed_means_overrules_a_lucky_single_run(tmp_path):
    config = parse_config(_config(tmp_path, "lucky", ("logistic_regression", "dlrm", "deepfm"),
                                  budget={"trials": 1}))  # fmt: skip
    study = run_study(config, progress=lambda line: None)
    bases = recorded(study)
    lucky, middle, steady = sorted(bases, key=lambda key: bases[key]["val_ne"])
    seeds = [str(REEVAL_SEED + k) for k in range(3)]
    study.set_user_attr("reevaluation", {
        f"baseline:{lucky}": {s: [0.95, 0.95] for s in seeds},
        f"baseline:{middle}": {s: [0.93, 0.93] for s in seeds},
        f"baseline:{steady}": {s: [0.90, 0.90] for s in seeds},
    })  # fmt: skip
    lines = []
    data = prepare_data(config)
    # every baseline's seed mean counts by default, the worst single run's too
    assert best_baseline_by_seed_means(study, config, data, lines.append) == steady
    assert lines[-1] == (f"best baseline by mean validation NE: {steady} 0.9000, "
                         f"{middle} 0.9300, {lucky} 0.9500")  # fmt: skip
    top_two = config.model_copy(update={"best_baseline": BestBaselineConfig(top=2)})
    assert best_baseline_by_seed_means(study, top_two, data, lines.append) == middle
    single_runs = config.model_copy(update={"best_baseline": BestBaselineConfig(seeds=0)})
    assert best_baseline_by_seed_means(study, single_runs, data, lines.append) is None

    # the verdict never sets one baseline's single run against the others' seed means
    trial = str(study.best_trials[0].number)
    study.set_user_attr("reevaluation", {
        trial: {s: [0.97, 0.97] for s in seeds},
        f"baseline:{steady}": {s: [0.96, 0.96] for s in seeds},
    })  # fmt: skip
    v = verdict(study)
    assert v["best_baseline"]["baseline"] == steady and v["best_baseline"]["val_ne"] == 0.96
    assert sorted(v["not_compared"]) == sorted([lucky, middle]) and not v["search_lower"]
    assert f"not compared: {', '.join(v['not_compared'])} (`ranknas reevaluate` retrains them" in (
        format_verdict(v)
    )


@pytest.mark.parametrize(
    ("trial_runs", "better", "said"),
    [  # against the baseline's 0.960, 0.962, 0.958 on the same seeds
        ((0.950, 0.949, 0.951), 3, "beyond seed noise"),  # lower by 0.009-0.013 on each seed
        ((0.955, 0.965, 0.957), 2, "within seed noise"),  # lower on average, not on every seed
    ],
)
def test_the_verdict_pairs_the_seeds_and_says_whether_the_difference_is_noise(
    tmp_path, trial_runs, better, said
):
    study = run_study(parse_config(_config(tmp_path, "paired", ("dlrm",), budget={"trials": 1})),
                      progress=lambda line: None)  # fmt: skip
    seeds = [str(REEVAL_SEED + k) for k in range(3)]

    def runs(values: tuple[float, ...]) -> dict[str, list[float]]:
        return {s: [v, v] for s, v in zip(seeds, values, strict=True)}

    trial = str(study.best_trials[0].number)
    study.set_user_attr("reevaluation", {trial: runs(trial_runs),
                                         "baseline:dlrm": runs((0.960, 0.962, 0.958))})  # fmt: skip
    v = verdict(study)
    assert v["search_lower"] and v["paired"]["seeds"] == 3
    # a script reading the JSON gets the text's outcome (it read search_wins: true beside an
    # "undecided" text)
    assert v["outcome"] == ("search_wins" if said == "beyond seed noise" else "undecided")
    assert v["paired"]["found_better"] == better
    assert (v["paired"]["p_value"] < 0.05) == (said == "beyond seed noise")
    assert f"{better} of 3 seeds" in format_verdict(v) and said in format_verdict(v)


def test_flops_ceilings_need_what_they_are_taken_from(tmp_path):
    config = tiny_config(tmp_path, "nobase", objectives={"max_mflops": "best_baseline"})
    with pytest.raises(RanknasError, match="best_baseline needs `baselines:`"):
        parse_config(config)
    config["objectives"] = {"max_mflops": "base"}
    with pytest.raises(RanknasError, match=r"base needs search_space\.type: around"):
        parse_config(config)
    config["objectives"] = {}
    config["search_space"] = {"type": "around", "base": "best_baseline"}
    with pytest.raises(RanknasError, match="base: best_baseline needs `baselines:`"):
        parse_config(config)
    for wrong in ("bestbaseline", -1, True):
        config["objectives"] = {"max_mflops": wrong}
        with pytest.raises(RanknasError, match=f"max_mflops: got {wrong!r}: use a number of"):
            parse_config(config)


def _one_trial_study(tmp_path, name):
    """A finished study of one trial and two baselines, not yet re-evaluated: its config."""
    config = parse_config(_config(tmp_path, name, budget={"trials": 1},
                                  best_baseline={"seeds": 0}))  # fmt: skip
    run_study(config, progress=lambda line: None)
    return config


def _second_run_replaced(monkeypatch, second):
    """`reevaluate` trains as it does but its second run, which `second(real, arch, data,
    config, seed, **options)` gives; (the real training, the seeds it was asked for)."""
    from nas import reevaluate

    real, calls = reevaluate.train_architecture, []

    def run(arch, data, config, seed, **options):
        calls.append(seed)
        train = second if len(calls) == 2 else lambda real, *args, **kw: real(*args, **kw)
        return train(real, arch, data, config, seed, **options)

    monkeypatch.setattr(reevaluate, "train_architecture", run)
    return real, calls


def test_a_reevaluation_run_that_fails_is_left_out_of_the_mean(tmp_path, monkeypatch):
    """A retrain that fails (out of memory, say) used to end `reevaluate` on a TypeError
    (its NE is None); it is said, and the mean is of the runs that have an NE."""
    import math

    from nas import reevaluate
    from trainers.trainer import TrainResult

    config = _one_trial_study(tmp_path, "flaky")
    real, calls = _second_run_replaced(
        monkeypatch,
        lambda real, *args, **options: (
            TrainResult(status="failed", failure_reason="out of memory: test"),
            None,
        ),
    )
    lines = []
    table = reevaluate_study(config, top=1, seeds=2, progress=lines.append, baselines=0)
    said = "failed (out of memory: test); left out of the mean, retried by a rerun"
    assert any(line.endswith(said) for line in lines), lines
    assert table[0]["seeds"] == 1 and math.isfinite(table[0]["mean_val_ne"])
    retrained = []

    def counted_run(arch, data, config, seed, **options):
        retrained.append(seed)
        return real(arch, data, config, seed, **options)

    monkeypatch.setattr(reevaluate, "train_architecture", counted_run)
    again = reevaluate_study(config, top=1, seeds=2, progress=lines.append, baselines=0)
    assert again[0]["seeds"] == 2 and retrained == [calls[1]]  # only the failed seed again


def test_a_diverged_seed_stays_in_the_mean_and_says_so(tmp_path, monkeypatch):
    """A seed whose run ended worse than the base rate (logistic regression at 1.0522 among
    0.92s) was averaged into the baseline's mean (0.9859, "2 seeds") without a word on any
    surface. It stays in the mean (it is what that seed gave), and the seeds' counts say it."""
    from dataclasses import replace

    from nas.leaderboard import COLUMNS, format_baselines, format_reevaluation

    def diverges(real, *args, **options):
        result, model = real(*args, **options)
        return replace(result, validation=result.validation | {"ne": 1.05}), model

    config = _one_trial_study(tmp_path, "wild")
    _second_run_replaced(monkeypatch, diverges)
    table = reevaluate_study(config, top=1, seeds=2, progress=lambda line: None, baselines=1)
    study = load_study(config.name, config.storage)
    runs = study.user_attrs["reevaluation"]
    diverged = {key: sum(val >= 1 for val, _ in seeds.values()) for key, seeds in runs.items()}
    assert diverged["0"] >= 1  # the run made to diverge: in the mean, and counted
    rows = {str(row["trial"]): row for row in table}
    assert {key: rows[key]["diverged"] for key in runs} == diverged
    assert rows["0"]["mean_val_ne"] > max(val for val, _ in runs["0"].values() if val < 1)
    assert f"2 ({diverged['0']} diverged)" in format_reevaluation(table)
    bases = [b for b in baseline_rows(study) if b["seeds"]]
    assert [b["diverged"] for b in bases] == [diverged["baseline:dlrm"]]
    assert "diverged" in COLUMNS  # in the JSON and CSV
    bases[0]["diverged"] = 1
    assert " 2 (1 diverged) " in format_baselines(bases)
    from nas.commands import _Exported, _provenance  # the model card's

    card = _provenance(study, _Exported.of_trial(study.trials[0]), {})
    said = f"(2 seeds, {diverged['0']} diverged)"
    assert card["this trial's val / test NE, mean over its seeds"].endswith(said), card


def test_a_seed_that_goes_nan_is_a_diverged_mean_and_never_retried(tmp_path, monkeypatch, capsys):
    """A retrain whose loss went nan was stored without an NE: left out of the mean (the
    other seed's 0.9x flattered the model) and trained again by every rerun, to go nan
    again. It is recorded at NE inf: the model's mean is inf, its seed counted diverged,
    never retried; every surface reads it (JSON without `Infinity`, in MLflow the largest
    float, which replaces the finite mean of fewer seeds)."""
    import json
    import math
    import sys
    from dataclasses import replace

    from nas import reevaluate
    from nas.leaderboard import format_reevaluation, pareto_front, reeval_metrics, seed_means

    def goes_nan(real, *args, **options):
        result, model = real(*args, **options)
        return replace(result, status="failed", non_finite=True, validation={}, test={},
                       failure_reason="training loss became nan by step 20"), model  # fmt: skip

    config = _one_trial_study(tmp_path, "nan")
    _second_run_replaced(monkeypatch, goes_nan)
    lines = []
    table = reevaluate_study(config, top=1, seeds=2, progress=lines.append, baselines=0)
    assert any("recorded at NE inf" in line and "not retried" in line for line in lines), lines
    row = table[0]
    assert (row["seeds"], row["diverged"], row["mean_val_ne"]) == (2, 1, math.inf)
    assert format_reevaluation(table).endswith(" 2 (1 diverged)")
    study = load_study(config.name, config.storage)
    mean = seed_means(study)["0"]
    assert mean["val_ne"] == math.inf and mean["sd_val_ne"] == math.inf
    huge = sys.float_info.max  # what MLflow's database makes of an inf
    assert reeval_metrics(mean) == {"reeval_mean_val_ne": huge, "reeval_sd_val_ne": huge,
                                    "reeval_mean_test_ne": huge, "reeval_seeds": 2,
                                    "reeval_diverged": 1}  # fmt: skip
    assert all(r["trial"] != 0 for r in pareto_front(study))
    retrained = []
    monkeypatch.setattr(reevaluate, "train_architecture",
                        lambda *args, **kw: retrained.append(args) or None)  # fmt: skip
    again = reevaluate_study(config, top=1, seeds=2, progress=lines.append, baselines=0)
    assert retrained == [] and again[0]["mean_val_ne"] == math.inf
    capsys.readouterr()
    assert main(["leaderboard", "nan", "--storage", config.storage, "--json"]) == 0

    def refused(constant):
        raise AssertionError(f"not JSON: {constant}")

    board = json.loads(capsys.readouterr().out, parse_constant=refused)
    assert board["leaderboard"][0]["mean_val_ne"] is None
    assert board["leaderboard"][0]["diverged"] == 1
    assert main(["leaderboard", "nan", "--storage", config.storage]) == 0
    trial_row = capsys.readouterr().out.splitlines()[1]  # the trials' table says why: inf
    assert trial_row.startswith("0 ") and trial_row.split()[3:6] == ["inf", "2", "(1"], trial_row


def test_every_preset_trains_on_a_log_of_ids_only(tmp_path):
    """No dense column (an Avazu-like log): DLRM, DHEN and Wukong read it through a bottom
    MLP, LR, DCNv2 and DeepFM beside the embeddings; each refused the whole study."""
    import numpy as np

    rng = np.random.default_rng(0)
    effect = rng.normal(0.0, 1.5, 30)
    lines = ["clicked,user,ad,t"]
    for t in range(3000):
        user, ad = rng.integers(30), rng.integers(20)
        lines.append(f"{int(rng.random() < 1 / (1 + np.exp(-effect[user])))},u{user},a{ad},{t}")
    (tmp_path / "ids.csv").write_text("\n".join(lines) + "\n")
    (tmp_path / "ids.yaml").write_text("label: clicked\ndense: []\ncategorical: [user, ad]\n"
                                       "time: t\n")  # fmt: skip
    data = {"source": str(tmp_path / "ids.csv"), "schema": str(tmp_path / "ids.yaml")}
    names = ["logistic_regression", "dlrm", "dcnv2", "deepfm", "dhen", "wukong"]
    config = _config(tmp_path, "ids", baselines=names, data=data, budget={"trials": 1})
    config["search_space"] = {"type": "around", "base": "best_baseline"}
    study = run_study(parse_config(config), progress=lambda line: None)
    bases = recorded(study)
    assert list(bases) == names and all(b["status"] == "complete" for b in bases.values())
    assert all(b["val_ne"] < 1 for b in bases.values())
    assert study.trials[0].state == TrialState.COMPLETE  # then its queued starting points


def test_a_preset_that_needs_categorical_features_says_so_on_data_without_any():
    from search_space.schema import DatasetSchema

    dense_only = DatasetSchema(("a", "b"), ())
    assert analyze(preset("logistic_regression", dense_only)).flops > 0  # w·dense + b
    with pytest.raises(RanknasError, match="preset dlrm on data with no categorical column: "):
        preset("dlrm", dense_only)


def test_status_of_a_study_whose_baselines_all_failed_says_so(tmp_path, capsys):
    """It said only "no trials (its search has not started: run `ranknas search`)"."""
    from study_helpers import recorded_study

    url = f"sqlite:///{tmp_path / 's.db'}"
    study = recorded_study(url, [], name="noise")
    reason = "diverged: validation NE 1.0100 >= 1, worse than the base rate"
    study.set_user_attr("baselines:dlrm", {"name": "dlrm", "order": 0, "status": "failed",
                                           "val_ne": 1.01, "mflops": 0.1,
                                           "failure_reason": reason})  # fmt: skip
    assert main(["status", "noise", "--storage", url]) == 0
    shown = capsys.readouterr().out
    assert (
        f"baselines: 1 recorded, none complete (dlrm; `ranknas leaderboard noise --storage {url}`"
        in shown
    )
    assert main(["leaderboard", "noise", "--storage", url]) == 0  # and it does say why
    table = capsys.readouterr().out.split("Baselines")[1].splitlines()
    assert table[1].endswith("failure reason") and table[2].endswith(reason), table


def test_status_names_the_baselines_recorded_before_the_search_and_unrun_starting_points(
    tmp_path, capsys
):
    """A search stopped while training its baselines: status said only "no trials". A
    finished study's starting points not run read as work still to come."""
    from optuna.trial import create_trial

    from study_helpers import recorded_study

    url = f"sqlite:///{tmp_path / 's.db'}"
    study = recorded_study(url, [], name="early")
    study.set_user_attr("baselines:dcnv2", {"name": "dcnv2", "order": 0, "status": "complete",
                                            "val_ne": 0.94, "mflops": 0.1})  # fmt: skip
    assert main(["status", "early", "--storage", url]) == 0
    assert "baselines: dcnv2 complete" in capsys.readouterr().out
    study.set_user_attr("budget_trials", 2)
    for _ in range(2):
        study.add_trial(create_trial(value=0.9, user_attrs={"val_ne": 0.9, "mflops": 0.05}))
    study.enqueue_trial({})
    assert main(["status", "early", "--storage", url]) == 0
    shown = capsys.readouterr().out
    assert "2 complete, 1 queued point left untrained (the budget was reached first)" in shown
    assert "baselines: dcnv2" not in shown  # the verdict speaks of them


def test_one_seed_reads_as_one():
    """`reevaluate --seeds 1` said "seed means over 1 fresh seeds" and an sd of 0.0000."""
    from nas.leaderboard import format_reevaluation, seeds_text

    assert seeds_text(1) == "1 fresh seed" and seeds_text(5, fresh=False) == "5 seeds"
    row = {"trial": 2, "recorded_val_ne": 0.98, "mean_val_ne": 0.99, "sd_val_ne": 0.0,
           "mean_test_ne": 0.99, "mflops": 0.08, "seeds": 1}  # fmt: skip
    assert format_reevaluation([row]).splitlines()[1].split()[3] == "-"  # no spread of one
    # every seed failed with an error: no mean ("inf" read as diverged); a diverged seed: inf
    failed = row | {"mean_val_ne": math.inf, "sd_val_ne": None, "mean_test_ne": None, "seeds": 0}
    assert format_reevaluation([failed]).splitlines()[1].split()[2] == "-"
    diverged = row | {"mean_val_ne": math.inf, "diverged": 1}
    assert format_reevaluation([diverged]).splitlines()[1].split()[2] == "inf"


def test_a_complete_run_just_under_the_base_rate_does_not_read_as_it():
    """A baseline at NE 0.99995 (complete) showed as 1.0000 beside the rule that NE >= 1
    has diverged: its table shows the digits that tell them apart."""
    from nas.leaderboard import format_baselines

    row = {"baseline": "logistic_regression", "state": "complete", "val_ne": 0.99995,
           "test_ne": 0.98, "val_auc": 0.5, "test_auc": 0.5, "mflops": 0.0, "params": 25,
           "digest": "d"}  # fmt: skip
    assert format_baselines([row]).splitlines()[1].split()[2] == "0.99995"


def test_a_p_value_under_the_threshold_never_reads_as_it():
    """p = 0.04994 printed as "p=0.05): beyond seed noise", beside the rule that p >= 0.05
    is within it."""
    from nas.leaderboard import p_text

    shown = [p_text(p) for p in (0.04994, 0.049, 0.0504, 0.12)]
    assert shown == ["0.0499", "0.049", "0.05", "0.12"]


def test_reevaluate_front_names_the_trials_it_leaves_out_as_trials():
    """It said "not 0, more than 1% worse", which reads as "none"."""
    from nas.reevaluate import _front_line

    line = _front_line([{"trial": 3}], [{"trial": 0}])
    assert "retraining 1 within 1% of its NE (trial 3); not trial 0, more than 1%" in line
    assert "; not trials 0, 2, more" in _front_line([], [{"trial": 0}, {"trial": 2}])
    assert "(trials 3, 4)" in _front_line([{"trial": 3}, {"trial": 4}], [])


def test_the_mlflow_view_shows_the_seed_means_the_baselines_were_chosen_by(tmp_path, server):
    """A study around its best baseline by seed means logged them on the baselines' runs,
    and its view (made as the study started, before any run had them) hid their columns."""
    import json

    from mlflow import MlflowClient

    from mlflow_server.tracking import REEVAL_COLUMNS, SHARED_VIEW_PREFIX, view_key

    config = _config(tmp_path, "meaned-view", budget={"trials": 1, "epochs_per_trial": 1},
                     best_baseline={"seeds": 2}, mlflow={"tracking_uri": server.uri})  # fmt: skip
    config["search_space"] = {"type": "around", "base": "best_baseline"}
    assert main(["search", str(write_config(tmp_path, config))]) == 0
    assert "reevaluation" in load_study("meaned-view", config["storage"]).user_attrs  # seeds
    experiment = MlflowClient(server.uri).get_experiment_by_name("meaned-view")
    view = json.loads(experiment.tags[SHARED_VIEW_PREFIX + view_key("meaned-view")])
    assert set(REEVAL_COLUMNS) < set(view["selectedColumns"]), view["selectedColumns"]


def test_baselines_are_listed_best_first():
    """The leaderboard and the MLflow note listed the baselines in the config's order:
    DLRM above the DCNv2 the verdict meets, a failed one between them."""
    from nas.leaderboard import best_first

    rows = [{"baseline": "dlrm", "val_ne": 0.8546, "mean_val_ne": 0.8573},
            {"baseline": "broken", "val_ne": None, "mean_val_ne": None},
            {"baseline": "dcnv2", "val_ne": 0.8535, "mean_val_ne": 0.8547},
            {"baseline": "dhen", "val_ne": 0.8560, "mean_val_ne": None}]  # fmt: skip
    assert [r["baseline"] for r in best_first(rows)] == ["dcnv2", "dhen", "dlrm", "broken"]


def test_confirm_retrains_the_verdict_s_pair_on_seeds_that_chose_nothing(tmp_path, capsys, server):
    """`ranknas confirm` trains the study's best trial and its best baseline, exactly as
    they were trained, on seeds apart from every re-evaluation's; the verdict tests there."""
    from mlflow import MlflowClient

    from nas.cli import main
    from nas.reevaluate import CONFIRM_SEED

    raw = _config(tmp_path, "sure", ("dlrm",), budget={"trials": 2}, best_baseline={"seeds": 0},
                  mlflow={"tracking_uri": server.uri})  # fmt: skip
    path = write_config(tmp_path, raw)
    config = parse_config(raw)
    run_study(config, progress=lambda line: None)
    assert main(["confirm", str(path), "--no-mlflow"]) == 2  # nothing chose a pair yet
    assert "has no verdict on seed means to confirm: `ranknas reevaluate CONFIG` first" in (
        capsys.readouterr().err
    )
    reevaluate_study(config, top=2, seeds=2, progress=lambda line: None)
    study = load_study("sure", config.storage)
    best = str(verdict(study)["best_trial"]["trial"])
    chosen = study.user_attrs["reevaluation"]
    assert main(["confirm", str(path), "--seeds", "2", "--no-mlflow"]) == 0
    out = capsys.readouterr().out
    assert f"confirming the verdict's pair, trial {best} and baseline dlrm" in out
    study = load_study("sure", config.storage)
    record = study.user_attrs["confirmation"]
    assert set(record) == {best, "baseline:dlrm"}  # the pair only
    assert all(set(runs) == {str(CONFIRM_SEED), str(CONFIRM_SEED + 1)} for runs in record.values())
    assert study.user_attrs["reevaluation"] == chosen  # the choosing seeds untouched
    v = verdict(study)
    assert v["confirmed"] and v["paired"]["seeds"] == 2 and v["paired"]["comparisons"] == 1
    assert "verdict (confirmation: seed means over the 2 seeds that chose nothing" in out
    # another seed trains only the new ones; the parent run has the confirmation's table
    # and the verdict's p, corrected for two confirmation rounds only
    assert main(["confirm", str(path), "--seeds", "3"]) == 0
    assert "4 of 6 runs already recorded, reused: training 2" in capsys.readouterr().out
    client = MlflowClient(server.uri)
    experiment = client.get_experiment_by_name("sure")
    (parent,) = client.search_runs([experiment.experiment_id], "tags.`ranknas.kind` = 'study'")
    assert "confirmation.csv" in {a.path for a in client.list_artifacts(parent.info.run_id)}
    assert parent.data.metrics["verdict_p_comparisons"] == 2
