"""The base's feature importance and the study's first points with features left out."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from nas.cli import main
from nas.config import parse_config
from nas.feature_screen import _read_from, feature_importance, screened_points, worth_least
from nas.runner import run_study
from nas.trial_record import StudyAttr, TrialAttr, read_architecture
from search_space.presets import preset
from search_space.space_configs import AroundConfig
from search_space.spaces import make_space
from study_helpers import tiny_config
from trainers.data import SyntheticConfig, generate_synthetic


def test_a_shuffle_moves_one_features_values_between_rows_and_nothing_else(tmp_path):
    from helpers import write_genre_log
    from trainers.data.load import load_dataset

    csv, schema = write_genre_log(tmp_path, rows=50)
    data = load_dataset(str(csv), schema_path=str(schema))
    features = ["shop", "genres"]
    rows = np.tile(np.arange(len(data))[:, None], (1, 2))
    unmoved = _read_from(data, features, rows)  # every feature read from its own row
    assert np.array_equal(unmoved.categorical, data.categorical)
    assert np.array_equal(unmoved.multi_hot["genres"].values, data.multi_hot["genres"].values)
    moved = np.random.default_rng(0).permutation(len(data))
    rows[:, 1] = moved  # genres of row i from row moved[i]
    shuffled = _read_from(data, features, rows)
    genres = data.multi_hot["genres"]
    for i in range(len(data)):
        j = moved[i]
        got = shuffled.multi_hot["genres"]
        assert list(got.values[got.offsets[i] : got.offsets[i + 1]]) == list(
            genres.values[genres.offsets[j] : genres.offsets[j + 1]]
        )
    assert np.array_equal(shuffled.categorical, data.categorical)  # shop kept, genres -1
    assert np.array_equal(shuffled.dense, data.dense)
    assert np.array_equal(shuffled.labels, data.labels)


def test_a_feature_the_model_cannot_see_is_worth_exactly_nothing():
    data = generate_synthetic(SyntheticConfig(rows=2000, seed=0))
    arch = preset("dlrm", data.schema)
    weights = {k: v.clone() for k, v in _model_weights(arch).items()}
    blind = arch.embedding.features[2].name
    table = next(k for k in weights if k.startswith("embedding_bags") and f"t_{blind}" in k)
    weights[table].zero_()  # every id of the feature looks up the same zero vector
    importance = feature_importance(arch, weights, data, repeats=3)
    assert set(importance) == {f.name for f in arch.embedding.features}
    assert importance[blind] == {"mean": 0.0, "sd": 0.0}
    assert all(v["mean"] != 0.0 for name, v in importance.items() if name != blind)


def _model_weights(arch) -> dict[str, torch.Tensor]:
    from search_space.builder import build_model

    return build_model(arch, seed=0).state_dict()


def test_worth_least_and_the_ladder_of_points():
    importance = {"a": {"mean": 0.02, "sd": 0.0}, "b": {"mean": -0.001, "sd": 0.0},
                  "c": {"mean": 0.0005, "sd": 0.0}, "d": {"mean": 0.0001, "sd": 0.0}}  # fmt: skip
    assert worth_least(importance, 0.001) == ["b", "d", "c"]
    space = _around([0, 4, 16])
    names = [f.name for f in space.base.embedding.features]
    free = names[:5]
    points = screened_points(space, free)
    assert _left_out(points) == [free[:k] for k in (5, 2, 1)]
    for point in points:
        used = [f.name for f in space.decode(point).embedding.used]
        assert used == [n for n in names if n not in _left_out([point])[0]]
    # every feature under the margin: one is kept (all at 0 would decode to all of them)
    assert set(_left_out(screened_points(space, names[::-1]))[0]) == set(names[1:])


def test_the_screen_says_when_its_shuffles_cannot_tell_the_margin():
    from nas.feature_screen import describe

    quiet = {"baseline": "dlrm", "margin": 0.0009, "rows": 10_000, "repeats": 5,
             "features": {"a": {"mean": 0.02, "sd": 0.0004}, "b": {"mean": -0.0002, "sd": 0.0002},
                          "c": {"mean": 0.0001, "sd": 0.0003}}}  # fmt: skip
    said = describe(quiet)
    assert said.startswith("baseline dlrm reads 1 of its 3 categorical features for 0.0009 NE")
    assert "b, c left out, then halves of them (their NE rises: b -0.0002, c +0.0001)" in said
    assert "partly chance" not in said
    noisy = quiet | {
        "rows": 500,
        "features": {name: v | {"sd": 0.007} for name, v in quiet["features"].items()},
    }
    assert (
        "but the shuffles' spread on 500 validation rows (median ±0.0035) is as large as "
        "the margin: which features look worthless is partly chance"
    ) in describe(noisy)


def test_the_points_with_a_recipe_searched_beside_them_train_at_the_studys():
    from nas.config import TrainingConfig
    from nas.recipe import with_recipe

    training = TrainingConfig(search={"dense_lr": {"low": 0.001, "high": 0.01}, "grid": 3})
    space = with_recipe(_around([0, 4, 16]), training)
    points = screened_points(space, ["c0"])
    assert _left_out(points) == [["c0"]]
    assert points[0]["train.dense_lr"] == space.base_values()["train.dense_lr"]
    space.check_values(points[0])


def test_feature_dims_without_the_bases_dim_start_at_the_nearest_and_say_so():
    """The screened points gave every kept feature feature_dims' first nonzero dim (4, for
    dlrm's 16) without a word, and the status line read their NE as the cost of the
    features left out alone (a user trial)."""
    from nas.feature_screen import _say_changed_dims

    space = _around([0, 4, 8])
    names = [f.name for f in space.base.embedding.features]
    points = screened_points(space, names[:1])
    assert {points[0][f"dim.{n}"] for n in names[1:]} == {8}  # the nearest, not the first
    said: list[str] = []
    _say_changed_dims(space, points, said.append)
    assert said == ["features: search_space.feature_dims [0, 4, 8] lacks the base's dim 16: the "
                    "screened starting points give those features dim 8 (add 16 to "
                    "feature_dims to keep the base's)"]  # fmt: skip
    kept = _around([0, 8, 16])
    _say_changed_dims(kept, screened_points(kept, names[:1]), said.append)
    assert len(said) == 1


def _around(feature_dims: list[int]):
    data = generate_synthetic(SyntheticConfig(rows=200, seed=0))
    return make_space(AroundConfig(base="dlrm", feature_dims=feature_dims), data.schema)


def _left_out(points: list[dict]) -> list[list[str]]:
    return [[n.removeprefix("dim.") for n, v in p.items() if n.startswith("dim.") and v == 0]
            for p in points]  # fmt: skip


def _screen_study(tmp_path, baselines: list[str], trials: int = 1):
    from helpers import write_genre_log

    csv, schema = write_genre_log(tmp_path, rows=3000)
    data = {"source": str(csv), "schema": str(schema)}
    space = {"type": "around", "base": "dlrm", "feature_dims": [0, 4], "insert_ops": []}
    return tiny_config(tmp_path, "screen", data=data, baselines=baselines,
                       budget={"trials": trials}) | {"search_space": space}  # fmt: skip


def test_a_study_around_its_baseline_starts_with_the_features_worth_least_left_out(
    tmp_path, capsys
):
    config = _screen_study(tmp_path, ["dlrm"])
    lines: list[str] = []
    study = run_study(parse_config(config), progress=lines.append)
    found = study.user_attrs[StudyAttr.FEATURE_IMPORTANCE]
    importance = found["features"]
    assert found["baseline"] == "dlrm" and set(importance) == {"shop", "genres"}
    # the clicks follow the genres alone
    assert importance["genres"]["mean"] > 0.02 > 10 * importance["shop"]["mean"]
    assert worth_least(importance, found["margin"]) == ["shop"]
    said = "the search started with shop left out (its NE rise: shop "
    assert any(said in line for line in lines)
    assert main(["status", "screen", "--storage", config["storage"]]) == 0
    assert said in capsys.readouterr().out
    first = study.trials[0]
    assert first.params["dim.shop"] == 0 and first.params["dim.genres"] == 4
    arch = read_architecture(first.user_attrs[TrialAttr.DIR])
    assert [f.name for f in arch.embedding.used] == ["genres"]

    # resumed: the screen is not measured again, nor queued again
    lines.clear()
    config["budget"] = config["budget"] | {"trials": 2}
    study = run_study(parse_config(config), progress=lines.append)
    assert not any(line.startswith("features:") for line in lines)
    assert study.user_attrs[StudyAttr.FEATURE_IMPORTANCE] == found
    assert study.trials[1].params != first.params


def test_without_the_bases_weights_the_study_starts_unscreened(tmp_path, monkeypatch):
    import nas.feature_screen

    # trained by a worker on another machine, or damaged
    monkeypatch.setattr(nas.feature_screen, "WEIGHTS_FILE", "elsewhere.safetensors")
    lines: list[str] = []
    study = run_study(parse_config(_screen_study(tmp_path, ["dlrm"])), progress=lines.append)
    assert StudyAttr.FEATURE_IMPORTANCE not in study.user_attrs
    said = "features: baseline dlrm's weights"
    assert any(line.startswith(said) and "cannot be read here" in line for line in lines), lines
    assert study.trials[0].state.is_finished()  # the search ran all the same


@pytest.mark.parametrize("baselines", [[], ["dcnv2"]])
def test_a_screen_without_its_base_among_the_baselines_is_refused(tmp_path, capsys, baselines):
    from study_helpers import write_config

    path = write_config(tmp_path, _screen_study(tmp_path, baselines))
    assert main(["search", str(path), "--no-mlflow"]) == 2
    err = capsys.readouterr().err
    assert (
        "search_space.feature_dims holds 0: the study first measures what each feature is "
        "worth to its base, trained as a baseline: add dlrm to `baselines:`"
    ) in err
    assert "Traceback" not in err
