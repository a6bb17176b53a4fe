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
from search_space.spaces import make_space
from search_space.spaces.around import AroundConfig
from study_helpers import tiny_config
from trainers.data import SyntheticConfig, generate_synthetic


def test_a_shuffle_moves_one_features_values_between_rows_and_nothing_else(tmp_path):
    from helpers import write_genre_log
    from trainers.data.load import load_dataset

    csv, schema = write_genre_log(tmp_path, rows=50)
    data = load_dataset(str(csv), schema_path=str(schema))
    features = ["shop", "genres"]
    rows = np.tile(np.arange(len(data))[:, None], (1, 2))
    assert _read_from(data, features, rows) is not data
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
    data = generate_synthetic(SyntheticConfig(rows=200, seed=0))
    space = make_space(AroundConfig(base="dlrm", feature_dims=[0, 4, 16]), data.schema)
    free = [f.name for f in space.base.embedding.features][:5]
    points = screened_points(space, free)
    left_out = [[n for n, v in p.items() if n.startswith("dim.") and v == 0] for p in points]
    assert left_out == [[f"dim.{n}" for n in free[:k]] for k in (5, 2, 1)]
    for point in points:
        used = [f.name for f in space.decode(point).embedding.used]
        assert used == [f.name for f in space.base.embedding.features if f"dim.{f.name}"
                        not in [n for n, v in point.items() if v == 0]]  # fmt: skip


@pytest.mark.parametrize("listed", [True, False])
def test_a_study_around_its_baseline_starts_with_the_features_worth_least_left_out(
    tmp_path, capsys, listed
):
    from helpers import write_genre_log

    csv, schema = write_genre_log(tmp_path, rows=3000)
    data = {"source": str(csv), "schema": str(schema)}
    space = {"type": "around", "base": "dlrm", "feature_dims": [0, 4], "insert_ops": []}
    config = tiny_config(tmp_path, "screen", data=data, baselines=["dlrm"] if listed else [],
                         budget={"trials": 1}) | {"search_space": space}  # fmt: skip
    lines: list[str] = []
    study = run_study(parse_config(config), progress=lines.append)
    found = study.user_attrs.get(StudyAttr.FEATURE_IMPORTANCE)
    if not listed:
        assert found is None
        assert any("not among the study's trained baselines" in line for line in lines)
        return
    importance = found["features"]
    assert found["baseline"] == "dlrm" and set(importance) == {"shop", "genres"}
    # the clicks follow the genres alone
    assert importance["genres"]["mean"] > 0.02 > 10 * importance["shop"]["mean"]
    free = worth_least(importance, found["margin"])
    assert free == ["shop"]
    said = "the search started with shop left out (their NE rises: shop "
    assert any(said in line for line in lines)
    assert main(["status", "screen", "--storage", config["storage"]]) == 0
    assert said in capsys.readouterr().out
    first = study.trials[0]
    assert first.params["dim.shop"] == 0 and first.params["dim.genres"] == 4
    arch = read_architecture(first.user_attrs[TrialAttr.DIR])
    assert [f.name for f in arch.embedding.used] == ["genres"]
