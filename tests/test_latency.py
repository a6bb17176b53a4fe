"""Architecture latency: measurement, the encoding, the predictor and its file, studies."""

import json
import re

import numpy as np
import optuna
import pytest
from optuna.trial import TrialState

from cost_models.latency.model import (
    FlopsBaseline,
    LatencyPredictor,
    arch_features,
    collect,
    holdout_split,
    measure_latency,
)
from nas.cli import main
from nas.config import parse_config
from nas.runner import run_study
from nas.storage import load_study
from search_space.architecture import Architecture, analyze
from search_space.blocks import OPS
from search_space.errors import RanknasError
from search_space.presets import preset
from search_space.schema import synthetic_schema
from search_space.spaces import make_space
from study_helpers import tiny_config, write_config

SPACE = {"type": "dag", "num_blocks": 4, "widths": [8, 32, 64], "counts": [2, 8],
         "embedding_dims": [4, 8]}  # fmt: skip


@pytest.fixture(scope="module")
def archs() -> list[Architecture]:
    space = make_space(SPACE, synthetic_schema())
    return [space.sample(seed) for seed in range(60)]


def synthetic_latency(arch: Architecture) -> float:
    """A cost with a fixed overhead per block, which FLOPs alone cannot see."""
    analysis = analyze(arch)
    return 0.05 + 0.2 * len(analysis.order) + analysis.flops / 2e5


def test_measured_latency_is_positive_and_a_training_step_costs_more():
    arch = preset("dcnv2", synthetic_schema())
    latency = measure_latency(arch, batch_size=64, warmup=1, repeats=5)
    assert 0 < latency.forward_ms < latency.train_step_ms
    assert latency.batch_size == 64 and latency.device.startswith("cpu")


def test_features_are_stable_and_carry_the_exact_costs(archs):
    names, values = arch_features(archs[0])
    again_names, again = arch_features(archs[0])
    assert names == again_names and np.array_equal(values, again)
    for arch in archs[:10]:
        other_names, features = arch_features(arch)
        assert other_names == names
        row, analysis = dict(zip(names, features, strict=True)), analyze(arch)
        assert row["flops"] == analysis.flops and row["dense_params"] == analysis.dense_params
        assert sum(row[f"{op}_blocks"] for op in OPS) == row["blocks"] == len(analysis.order)
        assert sum(row[f"{op}_flops"] for op in OPS) == sum(analysis.block_flops.values())
        assert 1 <= row["depth"] <= row["blocks"]


def test_predictor_beats_the_flops_line_where_blocks_have_a_fixed_cost(archs):
    latencies = [synthetic_latency(arch) for arch in archs]
    train, test = holdout_split(len(archs), 0.3, seed=0)
    assert not set(train) & set(test) and len(train) + len(test) == len(archs)
    fit = [archs[i] for i in train], [latencies[i] for i in train]
    held_out = [archs[i] for i in test], [latencies[i] for i in test]
    learned = LatencyPredictor().fit(*fit).evaluate(*held_out)
    baseline = FlopsBaseline().fit(*fit).evaluate(*held_out)
    assert np.isfinite(learned["mape"]) and learned["mape"] < 10
    assert learned["mape"] < baseline["mape"] and learned["kendall_tau"] > 0.7


def test_a_saved_predictor_reloads_to_identical_predictions(tmp_path, archs):
    predictor = LatencyPredictor(batch_size=256, device="test device")
    predictor.fit(archs[:40], [synthetic_latency(a) for a in archs[:40]])
    path = tmp_path / "latency.json"
    predictor.save(path)
    loaded = LatencyPredictor.load(path)
    assert np.array_equal(loaded.predict(archs[40:]), predictor.predict(archs[40:]))
    assert (loaded.batch_size, loaded.device) == (256, "test device")
    assert "pickle" not in path.read_text() and json.loads(path.read_text())["format_version"]


def _saved(tmp_path, archs, change):
    predictor = LatencyPredictor().fit(archs[:10], [synthetic_latency(a) for a in archs[:10]])
    data = predictor.to_dict()
    change(data)
    path = tmp_path / "predictor.json"
    path.write_text(json.dumps(data))
    return path


@pytest.mark.parametrize(
    ("change", "expected"),
    [
        (lambda d: d.update(format_version=99), "format_version 99"),
        (lambda d: d.pop("latencies_ms"), "'latencies_ms' is missing"),
        (lambda d: d["features"][3].pop(), "features[3] must hold"),
        (lambda d: d.update(kind="something else"), "not a latency predictor"),
        (lambda d: d["regressor"]["params"].update(depth=3), "cannot refit from 'regressor"),
    ],
)
def test_a_bad_predictor_file_is_one_error_naming_the_file(tmp_path, archs, change, expected):
    path = _saved(tmp_path, archs, change)
    with pytest.raises(RanknasError, match=re.escape(expected)) as error:
        LatencyPredictor.load(path)
    assert str(path) in str(error.value)


def test_missing_or_garbled_files_and_other_features_are_user_errors(tmp_path, archs, capsys):
    (tmp_path / "garbled.json").write_text("{not json")
    for name in ("missing.json", "garbled.json"):
        assert main(["latency", "predict", str(tmp_path / name), "dlrm"]) == 2
        err = capsys.readouterr().err
        assert name in err and "Traceback" not in err
    path = _saved(tmp_path, archs, lambda d: d["feature_names"].__setitem__(0, "old_flops"))
    with pytest.raises(
        RanknasError, match=re.escape(f"{path}: fitted on other architecture features")
    ):
        LatencyPredictor.load(path).predict(archs[:1])


def test_cli_measures_fits_and_predicts(tmp_path, capsys):
    assert main(["latency", "measure", "dlrm", "--batch-size", "16", "--repeats", "2",
                 "--json"]) == 0  # fmt: skip
    assert json.loads(capsys.readouterr().out)["forward_ms"] > 0
    space = tmp_path / "space.yaml"
    space.write_text(json.dumps({"search_space": tiny_config(tmp_path, "x")["search_space"]}))
    out = tmp_path / "predictor.json"
    assert main(["latency", "fit", str(space), "--archs", "6", "--batch-size", "16",
                 "--repeats", "2", "--out", str(out)]) == 0  # fmt: skip
    printed = capsys.readouterr().out
    assert "predictor" in printed and "FLOPs-only line" in printed and "Kendall tau" in printed
    assert main(["latency", "predict", str(out), "dlrm", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["batch_size"] == 16
    # fitted on a schema of its own: a preset is sized by it, not by the built-in one
    schema = tmp_path / "schema.yaml"
    schema.write_text("label: y\ndense: [price]\ncategorical: [{name: shop, cardinality: 7}]\n")
    assert main(["latency", "fit", str(space), "--archs", "6", "--batch-size", "16",
                 "--repeats", "2", "--schema", str(schema), "--out", str(out)]) == 0  # fmt: skip
    assert LatencyPredictor.load(out).schema["dense"] == ["price"]
    capsys.readouterr()
    assert main(["latency", "predict", str(out), "dlrm", "--json"]) == 0
    predicted = json.loads(capsys.readouterr().out)
    assert predicted["sized_by"] == "the fit's schema"
    assert predicted["features"] == {"dense": 1, "categorical": 1}


def test_collect_measures_distinct_architectures(tmp_path):
    space = make_space(tiny_config(tmp_path, "x")["search_space"], synthetic_schema())
    calls = []
    measured = collect(space, 3, seed=0, progress=lambda done, count: calls.append(done),
                       batch_size=8, warmup=0, repeats=1)  # fmt: skip
    assert calls == [1, 2, 3] and len({arch.to_json() for arch, _ in measured}) == 3


def test_a_study_skips_trials_over_max_latency_and_stops_when_none_fits(tmp_path, capsys):
    objectives = {"max_latency_ms": 1e-6, "latency_batch_size": 16}
    config = tiny_config(tmp_path, "fast", objectives=objectives, budget={"trials": 2})
    with pytest.raises(RanknasError, match=r"20 sampled architectures exceeded .* in a new study"):
        run_study(parse_config(config), progress=lambda line: None)
    study = load_study("fast", config["storage"])
    assert len(study.trials) == 20
    # what it advises is what a rerun allows: a new study (this one keeps its ceilings)
    looser = tiny_config(tmp_path, "fast", objectives=objectives | {"max_latency_ms": 1e3},
                         budget={"trials": 2})  # fmt: skip
    with pytest.raises(RanknasError, match=r"objectives.max_latency_ms: 1e-06 -> 1000\.0"):
        run_study(parse_config(looser), progress=lambda line: None)
    from nas.leaderboard import status  # and status says the ceiling, and why it stopped

    said = status(load_study("fast", config["storage"]))
    assert said["ceilings"]["max_latency_ms"] == 1e-6 and said["stopped_on_ceilings"]
    assert main(["status", "fast", "--storage", config["storage"]]) == 0
    out = capsys.readouterr().out
    assert "ceilings: objectives.max_latency_ms 1e-06; skipped trials" in out
    assert "its last search stopped: 20 sampled architectures were above its ceilings" in out
    for trial in study.trials:
        assert trial.state == TrialState.PRUNED and trial.user_attrs["latency_ms"] > 0
        assert "exceeds objectives.max_latency_ms=1e-06" in trial.user_attrs["failure_reason"]
        assert not (tmp_path / "fast" / "trials" / str(trial.number) / "model.safetensors").exists()


def test_a_study_minimizes_predicted_latency(tmp_path, archs, capsys):
    model = tmp_path / "latency.json"
    LatencyPredictor().fit(archs, [synthetic_latency(a) for a in archs]).save(model)
    objectives = {"cost": "latency_ms", "latency_model": str(model)}
    config = tiny_config(tmp_path, "lat", objectives=objectives, budget={"trials": 2})
    assert main(["search", str(write_config(tmp_path, config))]) == 0
    assert main(["leaderboard", "lat", "--storage", config["storage"]]) == 0
    assert "latency ms" in capsys.readouterr().out
    study = run_study(parse_config(config), progress=lambda line: None)  # resumes: no new trial
    assert [t.state for t in study.trials] == [TrialState.COMPLETE] * 2
    for trial in study.trials:
        arch = Architecture.load(
            tmp_path / "lat" / "trials" / str(trial.number) / "architecture.json"
        )
        predicted = float(LatencyPredictor.load(model).predict([arch])[0])
        assert trial.values[1] == trial.user_attrs["latency_ms"] == pytest.approx(predicted)
    config["objectives"]["latency_batch_size"] = 64
    config["name"] = "lat64"
    assert main(["search", str(write_config(tmp_path, config))]) == 2
    assert "fitted at batch size 512" in capsys.readouterr().err
    names = [s.study_name for s in optuna.get_all_study_summaries(config["storage"])]
    assert "lat64" not in names  # checked before the study is made: nothing to resume wrongly
    config["objectives"]["latency_model"] = str(tmp_path / "missing.json")
    config["name"] = "missing"
    assert main(["search", str(write_config(tmp_path, config))]) == 2
    assert "missing.json" in capsys.readouterr().err
    names = [s.study_name for s in optuna.get_all_study_summaries(config["storage"])]
    assert "missing" not in names
