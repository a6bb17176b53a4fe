"""Training hyper-parameters searched with the architecture (`training.search`)."""

import csv
import io
import json
import random
from pathlib import Path

import optuna
import pytest

from nas import reevaluate
from nas.baselines import _tuned_recipe, load_baseline, tuning_study_name
from nas.config import parse_config
from nas.leaderboard import format_verdict, to_csv, verdict
from nas.leaderboard import rows as leaderboard_rows
from nas.protocol import prepare_data
from nas.recipe import RecipeSpace, log_grid, with_recipe
from nas.runner import run_study
from nas.trial_record import recorded
from search_space.errors import RanknasError
from search_space.schema import synthetic_schema
from search_space.spaces import make_space
from study_helpers import counted, tiny_config

TWO_ARCHITECTURES = {"type": "dag", "num_blocks": 1, "ops": ["mlp"], "widths": [8],
                     "embedding_dims": [4, 8], "max_inputs": 1}  # fmt: skip
SEARCH = {"dense_lr": {"low": 0.001, "high": 0.01}, "batch_size": [64, 128], "grid": 3}


def _space(search=SEARCH, batch_size=128) -> RecipeSpace:
    training = {"batch_size": batch_size, "search": search}
    config = parse_config(tiny_config(Path("/tmp"), "r", search_space=TWO_ARCHITECTURES,
                                      training=training))  # fmt: skip
    return with_recipe(make_space(config.search_space, synthetic_schema()), config.training)


def test_log_ranges_are_grids_and_lists_are_choices():
    assert log_grid(0.001, 0.01, 3) == (0.001, 0.0032, 0.01)
    space = _space()
    params = space.parameters()
    assert params["train.dense_lr"].choices == (0.001, 0.0032, 0.01)
    assert params["train.batch_size"].choices == (64, 128)
    assert "train.sparse_lr" not in params  # not searched: the study's own


def test_a_recipe_scales_the_learning_rates_to_its_batch_size():
    space = _space()
    values = space.sample_values(random.Random(0)) | {"train.dense_lr": 0.01,
                                                      "train.batch_size": 64}  # fmt: skip
    recipe = space.recipe(values)
    assert recipe["batch_size"] == 64
    assert recipe["dense_lr"] == pytest.approx(0.01 * (64 / 128) ** 0.5, rel=1e-3)
    assert recipe["sparse_lr"] == pytest.approx(0.05 * (64 / 128) ** 0.5, rel=1e-3)
    assert recipe["weight_decay"] == 0.0
    same = values | {"train.batch_size": 128}
    assert space.decode(values) == space.decode(same)  # one architecture,
    assert space.identity(values) != space.identity(same)  # two candidates


def test_starting_points_and_encodings_start_at_the_study_recipe():
    space = _space(batch_size=128)
    encoded = space.encode(space.decode(space.sample_values(random.Random(1))))
    assert encoded["train.dense_lr"] == 0.0032  # nearest to training.dense_lr 0.002 in log
    assert encoded["train.batch_size"] == 128
    space.check_values(encoded)


def test_a_mutation_changes_one_parameter_of_the_architecture_or_the_recipe():
    space = _space()
    rng = random.Random(3)
    values = space.sample_values(rng)
    for _ in range(20):
        child = space.mutate_values(values, rng)
        changed = [k for k in values if child[k] != values[k]]
        assert len(changed) == 1 or space.decode(child) != space.decode(values), changed
        assert space.identity(child) != space.identity(values)


@pytest.mark.parametrize(
    ("training", "match"),
    [
        ({"search": {"dense_lr": {"low": 0.1, "high": 0.01}}}, "low 0.1 is above high"),
        ({"search": {"grid": 3}}, "at least one of"),
        ({"search": {"batch_size": [0, 64]}}, "batch size must be >= 1"),
        ({"search": {"weight_decay": [-1.0]}}, "weight decay must be >= 0"),
    ],
)
def test_bad_searches_are_refused_naming_the_field(training, match):
    with pytest.raises(RanknasError, match=match):
        parse_config(tiny_config(Path("/tmp"), "bad", training=training))


def test_one_shot_searchers_refuse_a_searched_recipe():
    config = tiny_config(Path("/tmp"), "one", searcher={"type": "oneshot"},
                         training={"search": {"batch_size": [64]}})  # fmt: skip
    with pytest.raises(RanknasError, match="sampling searchers"):
        parse_config(config)


def test_a_study_trains_each_trial_with_its_own_recipe_and_reevaluates_with_it(
    tmp_path, monkeypatch
):
    config = parse_config(tiny_config(tmp_path, "recipes", search_space=TWO_ARCHITECTURES,
                                      budget={"trials": 4}, searcher={"type": "random"},
                                      training={"batch_size": 128, "lr_schedule": "constant",
                                                "search": SEARCH}))  # fmt: skip
    study = run_study(config, progress=lambda line: None)
    done = counted(study)
    assert len(done) == 4  # 2 architectures x 6 recipes: the same architecture trains again
    assert len({t.user_attrs["digest"] for t in done}) < 4
    for trial in done:
        recipe = trial.user_attrs["recipe"]
        assert recipe["batch_size"] == trial.params["train.batch_size"]
        metrics = json.loads((tmp_path / "recipes" / "trials" / str(trial.number)
                              / "metrics.json").read_text())  # fmt: skip
        train_rows = 3200  # tiny_config: 4,000 rows split 80/10/10, 3 epochs
        assert metrics["steps"] == 3 * train_rows // recipe["batch_size"]
    read = csv.DictReader(io.StringIO(to_csv(leaderboard_rows(study))))
    assert all(json.loads(row["recipe"])["batch_size"] > 0 for row in read)  # JSON, for scripts
    seen = []
    real = reevaluate.train_architecture

    def spy(*args, **kwargs):
        seen.append(kwargs.get("recipe"))
        return real(*args, **kwargs)

    monkeypatch.setattr(reevaluate, "train_architecture", spy)
    rows = reevaluate.reevaluate_study(config, top=1, seeds=1, progress=lambda line: None)
    best = study.trials[int(rows[0]["trial"])]
    assert seen == [best.user_attrs["recipe"]]
    from nas.commands import _Exported, _provenance

    card = _provenance(study, _Exported.of_trial(best), {})["training recipe"]  # the card's row
    assert f"dense_lr {best.user_attrs['recipe']['dense_lr']}" in card and "search" not in card


TUNED = {"search": SEARCH | {"batch_size": None}, "lr_schedule": "constant"}


def test_a_tuned_baseline_is_compared_at_its_best_recipe(tmp_path, monkeypatch):
    import nas.baselines

    config = parse_config(tiny_config(tmp_path, "tuned", search_space=TWO_ARCHITECTURES,
                                      baselines=["dlrm"], training=TUNED,
                                      best_baseline={"tune": 3, "seeds": 0},
                                      budget={"trials": 1}))  # fmt: skip
    lines, trained = [], []
    train = nas.baselines.train_architecture
    monkeypatch.setattr(nas.baselines, "train_architecture",
                        lambda *a, **k: trained.append(k["label"]) or train(*a, **k))  # fmt: skip
    study = run_study(config, progress=lines.append)
    tuning = optuna.load_study(study_name=tuning_study_name("tuned", "dlrm"),
                               storage=config.storage)  # fmt: skip
    assert all(t.state.is_finished() for t in tuning.trials)
    tried = [t for t in tuning.trials if not t.user_attrs.get("repeat")]  # a redraw: replaced
    assert len(tried) == 3 and len({t.params["train.dense_lr"] for t in tried}) == 3
    assert tuning.trials[0].params == {"train.dense_lr": 0.0032}  # the study's own recipe first
    record = recorded(study)["dlrm"]
    best = min((t for t in tuning.trials if t.value is not None), key=lambda t: t.value)
    assert record["tuned"] == 3 and record["recipe"] == best.user_attrs["recipe"]
    assert record["val_ne"] == best.value  # the best recipe trial's run is the baseline's
    trained_as = [f"baseline dlrm recipe {n}" for n in range(1, 4)]  # counted from 1, as the log
    assert trained == trained_as  # not trained again
    assert sum(line.startswith("baseline dlrm recipe") for line in lines) == 3
    # the study's 0.002 is no grid point: its first recipe said so, not silently 0.0032
    assert ("tuning baseline dlrm: its first recipe, the study's own, is taken at the nearest "
            "points of training.search's grid (dense_lr 0.002 as 0.0032)") in lines  # fmt: skip
    assert f"at its best of 3 recipes (dense_lr {record['recipe']['dense_lr']}" in "".join(lines)
    assert "each at its best of 3 recipes" in format_verdict(verdict(study))


def test_tuning_resumes_where_it_stopped(tmp_path):
    config = parse_config(tiny_config(tmp_path, "resumed", search_space=TWO_ARCHITECTURES,
                                      baselines=["dlrm"], training=TUNED,
                                      best_baseline={"tune": 2, "seeds": 0}))  # fmt: skip
    data = prepare_data(config)
    arch = load_baseline("dlrm", data.train.schema)
    name = tuning_study_name("resumed", "dlrm")
    first = optuna.create_study(study_name=name, storage=config.storage)
    done = first.ask({"train.dense_lr": optuna.distributions.CategoricalDistribution(
        (0.001, 0.0032, 0.01))})  # fmt: skip
    done.set_user_attr("recipe", {"dense_lr": 0.001})
    first.tell(done, 0.95)
    first.ask()  # a trial whose process died: RUNNING forever
    recipe, _, tried = _tuned_recipe(config, "dlrm", arch, data, None, lambda line: None)
    tuning = optuna.load_study(study_name=name, storage=config.storage)
    states = [(t.state.name, bool(t.user_attrs.get("interrupted"))) for t in tuning.trials
              if not t.user_attrs.get("repeat")]  # fmt: skip
    assert tried == 2
    assert states == [("COMPLETE", False), ("FAIL", True), ("COMPLETE", False)]
    best = min((t for t in tuning.trials if t.value is not None), key=lambda t: t.value)
    assert recipe == best.user_attrs["recipe"]


def test_tuning_needs_a_searched_recipe(tmp_path):
    with pytest.raises(RanknasError, match=r"best_baseline\.tune needs training\.search"):
        parse_config(tiny_config(tmp_path, "t", baselines=["dlrm"],
                                 best_baseline={"tune": 2}))  # fmt: skip


def test_a_claimed_trial_records_its_recipe_with_its_digest(tmp_path, monkeypatch):
    """Points are drawn outside the study lock: another worker that sees a digest must see
    the whole identity, so the recipe and the digest are written in one transaction
    (`_claimed`)."""
    import nas.runner
    from nas.runner import _claimed, _drawn

    space = _space()
    url = f"sqlite:///{tmp_path / 'claims.db'}"
    study = optuna.create_study(storage=url, study_name="claims")
    trial = study.ask()
    written = []
    write = nas.runner.set_user_attrs
    spy = lambda trial, attrs: (written.append(set(attrs)), write(trial, attrs))  # noqa: E731
    monkeypatch.setattr(nas.runner, "set_user_attrs", spy)
    _claimed(_drawn(trial, space), space)
    assert written == [{"recipe", "digest"}]
    stored = optuna.load_study(study_name="claims", storage=url).trials[0].user_attrs
    assert stored["recipe"] == trial.user_attrs["recipe"] and stored["digest"]
