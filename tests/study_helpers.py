"""Tiny study configs for the integration tests: seconds per trial on 2 CPU cores."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import optuna
import yaml
from optuna.trial import FrozenTrial, TrialState

from nas.storage import load_study


def tiny_config(tmp_path: Path, name: str, **overrides: Any) -> dict[str, Any]:
    config: dict[str, Any] = {
        "name": name,
        "data": {"source": "synthetic", "rows": 4000, "seed": 0},
        "search_space": {
            "type": "dag",
            "num_blocks": 2,
            "widths": [8, 16],
            "counts": [2, 4],
            "embedding_dims": [4],
        },
        "searcher": {"type": "random"},
        "budget": {"trials": 3, "epochs_per_trial": 3},
        "training": {"batch_size": 128, "evals": 2},
        "storage": f"sqlite:///{tmp_path / 'studies.db'}",
        "output_dir": str(tmp_path / name),
        "mlflow": {"tracking_uri": None},
        "heartbeat_seconds": 1,
    }
    return merged(config, overrides)


def merged(config: dict[str, Any], overrides: dict[str, Any]) -> dict[str, Any]:
    """`config` with `overrides`: a section given as a dict updates that section."""
    config = dict(config)
    for key, value in overrides.items():
        if isinstance(value, dict) and isinstance(config.get(key), dict):
            config[key] = config[key] | value
        else:
            config[key] = value
    return config


def pruned_repeats_config(tmp_path: Path, name: str, **overrides: Any) -> dict[str, Any]:
    """A random search with median pruning over six architectures, 5 trials: with seed 0
    trial 1 diverges (NE above 1 at a sparse lr of 0.5, failed), 0 and 7 complete, 3, 6
    and 16 are pruned, and the sampler proposes the complete (trial 2), the pruned (5) and
    the diverged one (11) again before the budget is met (at trial 16)."""
    space = {"type": "dag", "num_blocks": 1, "ops": ["mlp", "dot", "fm"], "widths": [8],
             "embedding_dims": [4, 8], "max_inputs": 1}  # fmt: skip
    pruning = {"type": "median", "startup_trials": 2}
    config = tiny_config(tmp_path, name, search_space=space, budget={"trials": 5},
                         training={"evals": 3, "sparse_lr": 0.5}, pruning=pruning)  # fmt: skip
    return merged(config, overrides)


def write_config(tmp_path: Path, config: dict[str, Any]) -> Path:
    path = tmp_path / f"{config['name']}.yaml"
    path.write_text(yaml.safe_dump(config))
    return path


def counted(study: optuna.Study) -> list[FrozenTrial]:
    """The trials a budget counts: complete or pruned, neither skipped over a constraint nor
    a repeat of an architecture trained before."""
    return [
        t
        for t in study.get_trials(deepcopy=False)
        if t.state in (TrialState.COMPLETE, TrialState.PRUNED)
        and not t.user_attrs.get("over_constraint")
        and "reused_from" not in t.user_attrs
    ]


def recorded_study(
    url: str,
    trials: list[tuple[float, float]],
    baselines: dict[str, tuple[float, float]] | None = None,
    reevaluation: dict[str, list[float]] | None = None,
    name: str = "recorded",
) -> optuna.Study:
    """A study as a search leaves it, nothing trained: one complete trial per `(val_ne,
    mflops)`, baselines by key, and `reevaluate`'s runs (key: the trial number or
    `baseline:<key>`; one validation NE per seed, test NE 0.001 above it)."""
    from optuna.distributions import FloatDistribution
    from optuna.trial import create_trial

    study = optuna.create_study(study_name=name, storage=url)
    for number, (ne, mflops) in enumerate(trials):
        attrs = {"val_ne": ne, "test_ne": ne + 0.001, "mflops": mflops, "params": 100,
                 "digest": f"digest{number}"}  # fmt: skip
        study.add_trial(create_trial(values=[ne], params={"x": number / 100},
                                     distributions={"x": FloatDistribution(0, 1)},
                                     user_attrs=attrs))  # fmt: skip
    for order, (key, (ne, mflops)) in enumerate((baselines or {}).items()):
        study.set_user_attr(f"baselines:{key}", {"name": key, "order": order, "status": "complete",
                            "val_ne": ne, "test_ne": ne + 0.001, "mflops": mflops,
                            "digest": f"base-{key}", "dir": "/nonexistent"})  # fmt: skip
    if reevaluation:
        study.set_user_attr("reevaluation", {key: {str(10_000 + k): [ne, ne + 0.001]
                                                   for k, ne in enumerate(runs)}
                                             for key, runs in reevaluation.items()})  # fmt: skip
    return study


def check_nothing_lost_or_duplicated(config: dict, tracking_uri: str) -> optuna.Study:
    """The study has its budget of trials and no architecture trained twice; every finished
    trial is in MLflow exactly once, a failed one as failed (an interrupted one as killed).
    Returns the study."""
    study = load_study(config["name"], config["storage"])
    done = [t for t in study.trials if t.state in (TrialState.COMPLETE, TrialState.PRUNED)]
    assert len(counted(study)) == config["budget"]["trials"]
    trained = [t.user_attrs["digest"] for t in done if "reused_from" not in t.user_attrs]
    assert len(trained) == len(set(trained)), "an architecture was trained twice"

    from mlflow import MlflowClient

    client = MlflowClient(tracking_uri=tracking_uri)
    experiment = client.get_experiment_by_name(config["name"])
    runs = trial_runs(client, experiment.experiment_id)
    numbers = [int(r.data.tags["ranknas.trial"]) for r in runs]
    assert len(numbers) == len(set(numbers)), "a trial was logged twice"
    for trial in done:
        assert trial.number in numbers, f"finished trial {trial.number} is not in MLflow"
    status = {int(r.data.tags["ranknas.trial"]): r.info.status for r in runs}
    for trial in study.trials:
        if trial.state == TrialState.FAIL:  # an interrupted one was stopped, not failed
            stopped = trial.user_attrs.get("failure_reason") == "interrupted"
            expected = "KILLED" if stopped else "FAILED"
            assert status.get(trial.number) == expected, f"killed trial {trial.number}"
    for run in runs:  # a repeat names the trial that trained its architecture
        trial = study.trials[int(run.data.tags["ranknas.trial"])]
        repeat = "reused_from" in trial.user_attrs
        kinds = {"repeat" if repeat else "trial"}
        if trial.state == TrialState.FAIL:  # a repeat whose worker died: a failed trial now
            kinds.add("trial")
        assert run.data.tags["ranknas.kind"] in kinds, trial.number  # the view leaves repeats out
        if repeat:
            assert run.data.tags["reused_from"] == str(trial.user_attrs["reused_from"])
    return study


def trial_runs(client, experiment_id: str) -> list:
    """Every trial's MLflow run: trained ones (kind trial) and repeats (kind repeat)."""
    found = (client.search_runs([experiment_id], f"tags.`ranknas.kind` = '{kind}'")
             for kind in ("trial", "repeat"))  # fmt: skip
    return [run for runs in found for run in runs]


def repeats_said(lines: list[str]) -> int:
    """The repeats a study's progress lines tell: each line, and a run of the same line
    said as a count ("(the line above 4 more times)")."""
    said = sum("not trained again, not counted" in line for line in lines)
    return said + sum(int(line.split()[3]) for line in lines if line.startswith("(the line above"))
