"""MLflow run params read as the architecture: the same flat description of the network
(blocks, ops, inputs, op params, embedding dims) for trials, repeats and baselines, with the
searcher's raw encodings kept apart under `space.`."""

from dataclasses import replace
from pathlib import Path
from typing import Any

import optuna

from mlflow_server import StudyLogger
from nas.config import parse_config
from nas.runner import _finished_record, log_unlogged, run_study
from nas.trial_record import LOGGED, architecture_params, read_architecture
from search_space.architecture import Architecture, BlockSpec
from search_space.presets import preset
from search_space.schema import synthetic_schema
from study_helpers import tiny_config


class RecordingLogger:
    """What a study would send to MLflow, kept in memory."""

    def __init__(self) -> None:
        self.trials: dict[int, dict[str, Any]] = {}
        self.baselines: dict[str, dict[str, Any]] = {}

    def start_study(self, *args: Any, **kwargs: Any) -> None:
        pass

    def log_trial(self, number: int, **run: Any) -> None:
        self.trials[number] = run

    def log_baseline(self, key: str, **run: Any) -> None:
        self.baselines[key] = run

    def log_baseline_tuning(self, *args: Any, **run: Any) -> None:
        pass

    server = "memory"
    update_subject = staticmethod(StudyLogger.update_subject)

    def logged(self) -> set[str]:
        return {f"trial:{n}" for n in self.trials} | {f"baseline:{k}" for k in self.baselines}

    def lost_runs(self) -> bool:  # memory loses nothing
        return False


def test_architecture_params_are_read_off_the_spec():
    arch = preset("dlrm", synthetic_schema())
    params = architecture_params(arch)
    for block in arch.blocks:
        assert params[f"{block.name}.op"] == block.op
        assert params[f"{block.name}.inputs"] == ",".join(block.inputs)
    widths = arch.block("bottom").params["widths"]
    assert params["bottom.widths"] == ",".join(str(w) for w in widths)
    assert params["embedding.dim"] == str(arch.embedding.dim)
    assert params["output"] == arch.output_block
    assert not any(key.startswith("embedding.c") for key in params)  # no feature has its own dim


def test_architecture_params_name_differing_feature_dims_and_skip_dead_blocks():
    arch = preset("dlrm", synthetic_schema())
    first, *rest = arch.embedding.features
    features = (replace(first, dim=2 * arch.embedding.dim), *rest)
    dead = BlockSpec("unused", "mlp", ("dense",), {"widths": [4]})
    changed = Architecture(
        blocks=(dead, *arch.blocks),
        embedding=replace(arch.embedding, features=features),
        num_dense=arch.num_dense,
        output=arch.output_block,
    )
    params = architecture_params(changed)
    assert params[f"embedding.{first.name}.dim"] == str(2 * arch.embedding.dim)
    assert [key for key in params if key.startswith("embedding.")] == [
        "embedding.dim",
        f"embedding.{first.name}.dim",
    ]
    assert not any(key.startswith("unused.") for key in params)


def test_trials_repeats_and_baselines_log_the_architecture_they_trained(tmp_path):
    space = {"type": "dag", "num_blocks": 1, "ops": ["mlp"], "widths": [8],
             "embedding_dims": [4, 8], "max_inputs": 1}  # fmt: skip
    # two architectures (two embedding dims): a budget of 3 is met by repeats
    raw = tiny_config(tmp_path, "params", search_space=space, budget={"trials": 3},
                      training={"lr_schedule": "constant"}, baselines=["dlrm"])  # fmt: skip
    logger = RecordingLogger()
    study = run_study(parse_config(raw), logger=logger, progress=lambda line: None)
    repeats = [t for t in study.trials if "reused_from" in t.user_attrs]
    assert repeats and len(logger.trials) == len(study.trials)
    for trial in study.trials:
        params = logger.trials[trial.number]["params"]
        trained = study.trials[trial.user_attrs.get("reused_from", trial.number)]
        spec = read_architecture(trained.user_attrs["trial_dir"])
        assert architecture_params(spec).items() <= params.items()
        block = spec.blocks[0]
        assert params[f"{block.name}.inputs"] == ",".join(block.inputs)
        encodings = {k.removeprefix("space."): v for k, v in params.items()
                     if k.startswith("space.")}  # fmt: skip
        assert encodings and encodings.items() <= trial.params.items()  # kept apart
        assert not any(key.startswith(f"{block.name}.in") and key != f"{block.name}.inputs"
                       for key in params)  # fmt: skip
    for repeat in repeats:
        earlier = logger.trials[repeat.user_attrs["reused_from"]]["params"]
        shown = {k: v for k, v in logger.trials[repeat.number]["params"].items()
                 if not k.startswith("space.")}  # fmt: skip
        assert shown == {k: v for k, v in earlier.items() if not k.startswith("space.")}
    baseline = logger.baselines["dlrm"]["params"]
    spec = read_architecture(Path(study.user_attrs["baselines:dlrm"]["dir"]))
    assert architecture_params(spec).items() <= baseline.items()
    assert baseline["top.op"] == "mlp" and baseline["interaction.inputs"] == "sparse,bottom"
    assert baseline["architecture"].endswith("MFLOPs")
    # the records of a study that ran without MLflow, rebuilt from what it recorded: the
    # same runs, without the learning curves (their searcher encodings: every parameter);
    # every trial here was marked by its worker, so only the unmarked baseline is logged
    config, trials = parse_config(raw), study.get_trials(deepcopy=False)
    rebuilt = {t.number: _finished_record(t, trials, config) for t in trials}
    attrs = study.user_attrs["baselines:dlrm"]
    study.set_user_attr("baselines:dlrm", {k: v for k, v in attrs.items() if k != LOGGED})
    later = RecordingLogger()
    log_unlogged(study, config, later, progress=lambda line: None)
    assert later.trials == {} and later.baselines.keys() == {"dlrm"}
    assert study.user_attrs["baselines:dlrm"][LOGGED] == ["memory"]
    other = RecordingLogger()  # another server: everything is logged there too, once
    other.server = "other"
    log_unlogged(study, config, other, progress=lambda line: None)
    assert other.trials.keys() == logger.trials.keys() and other.baselines.keys() == {"dlrm"}
    assert study.user_attrs["baselines:dlrm"][LOGGED] == ["memory", "other"]
    for number, live in [*logger.trials.items(), *logger.baselines.items()]:
        again = (rebuilt | later.baselines)[number]
        for key in ("run_name", "metrics", "tags", "status"):  # a baseline's worker: unknown
            assert _without_worker(live[key]) == _without_worker(again[key]), (number, key)
        assert {k: v for k, v in live["params"].items() if not k.startswith("space.")} == {
            k: v for k, v in again["params"].items() if not k.startswith("space.")
        }
        assert live["artifacts"].keys() <= again["artifacts"].keys()
    # a trial stopped while training (no metrics.json): failed, as `_failed` logs it; one
    # whose files are on another machine: left to that machine's worker
    trained = next(t for t in trials if "reused_from" not in t.user_attrs)
    directory = tmp_path / "stopped"
    directory.mkdir()
    (directory / "architecture.json").write_text(
        (Path(trained.user_attrs["trial_dir"]) / "architecture.json").read_text()
    )
    stopped = optuna.trial.create_trial(
        state=optuna.trial.TrialState.FAIL,
        params=trained.params,
        distributions=trained.distributions,
        user_attrs={"trial_dir": str(directory), "failure_reason": "RuntimeError: out of memory"},
    )
    record = _finished_record(stopped, trials, config)
    assert record["status"] == "FAILED" and record["metrics"] == {}
    assert record["tags"]["failure_reason"] == "RuntimeError: out of memory"
    described = logger.trials[trained.number]["run_name"].split(" ", 1)[1]
    assert record["run_name"].split(" ", 1)[1] == described
    elsewhere = optuna.trial.create_trial(
        state=optuna.trial.TrialState.COMPLETE,
        value=0.9,
        params=trained.params,
        distributions=trained.distributions,
        user_attrs={"trial_dir": "/elsewhere/7"},
    )
    assert _finished_record(elsewhere, trials, config) is None


def _without_worker(value: Any) -> Any:
    return {k: v for k, v in value.items() if k != "worker"} if isinstance(value, dict) else value


def test_a_study_of_a_file_logs_no_synthetic_row_count(tmp_path):
    """A CSV study's parent run showed data.rows = 100000, the synthetic data's default
    (the file held 4,000 rows; a user trial)."""
    synthetic = parse_config(tiny_config(tmp_path, "synthetic")).mlflow_params()
    assert "rows" in synthetic["data"]
    (tmp_path / "clicks.csv").write_text("y,x\n1,0.5\n0,0.2\n")
    own = tiny_config(tmp_path, "file") | {"data": {"source": str(tmp_path / "clicks.csv")}}
    params = parse_config(own, check_files=False).mlflow_params()
    assert "rows" not in params["data"] and "cardinalities" not in params["data"]
    assert params["data"]["source"].endswith("clicks.csv")
