"""The trainer: budgets, metrics, failures as results, pruning, reproducibility, and the
acceptance ordering on the synthetic data (interaction models near the Bayes floor, LR not)."""

import json
import math
from dataclasses import replace

import numpy as np
import pytest
import torch
from sklearn.metrics import log_loss

from nas.cli import main
from search_space.builder import build_model
from search_space.errors import RanknasError
from search_space.presets import preset
from trainers.data import SyntheticConfig, bayes_metrics, generate_synthetic
from trainers.metrics import entropy, ranking_metrics
from trainers.trainer import TrainConfig, evaluate, train


@pytest.fixture(scope="module")
def splits():
    return generate_synthetic(SyntheticConfig(rows=6000, seed=1)).split()


def _train(splits, arch="dlrm", **config):
    train_part, valid, test = splits
    model = build_model(preset(arch, train_part.schema), seed=0)
    return train(model, train_part, valid, test, TrainConfig(batch_size=128, **config))


def test_metrics_follow_their_definitions():
    rng = np.random.default_rng(0)
    labels = (rng.random(5000) < 0.2).astype(np.float32)
    p = np.clip(0.2 + 0.1 * rng.standard_normal(5000), 0.01, 0.99)
    metrics = ranking_metrics(p, labels)
    assert metrics["logloss"] == pytest.approx(log_loss(labels, p))
    assert metrics["ne"] == pytest.approx(metrics["logloss"] / entropy(labels.mean()))
    assert metrics["calibration"] == pytest.approx(p.mean() / labels.mean())
    constant = ranking_metrics(np.full(5000, labels.mean()), labels)
    assert constant["ne"] == pytest.approx(1.0, abs=1e-6)


def test_budget_in_steps_and_examples(splits):
    assert _train(splits, max_steps=7).steps == 7
    result = _train(splits, max_examples=12800, early_stopping_patience=0)
    assert (result.steps, result.examples) == (100, 12800)
    assert result.status == "complete" and result.throughput > 0
    assert _train(splits, max_epochs=0.5).examples == 2304  # 4800 rows / 2, whole batches
    assert {"ne", "logloss", "auc", "calibration"} <= set(result.validation)
    assert {"ne", "logloss", "auc", "calibration"} <= set(result.test)
    assert len(result.curves["val_ne"]) >= 1 and result.peak_memory_bytes > 0


def test_a_cpu_run_is_reproducible_given_a_seed(splits):
    first = _train(splits, max_steps=20, seed=3)
    second = _train(splits, max_steps=20, seed=3)
    assert first.validation == second.validation
    assert first.curves == second.curves


def test_a_nan_loss_ends_the_run_with_a_reason(splits):
    train_part, valid, test = splits
    model = build_model(preset("dlrm", train_part.schema), seed=0)
    with torch.no_grad():
        model.head.bias.fill_(float("nan"))
    config = TrainConfig(batch_size=128, log_every=5, start_at_base_rate=False)
    result = train(model, train_part, valid, test, config)
    assert result.status == "failed"
    assert "nan" in result.failure_reason
    assert result.non_finite  # the same seed goes nan again: a rerun does not retry it


def test_an_exception_in_a_step_is_a_failed_result_not_a_crash(splits):
    train_part, valid, test = splits
    model = build_model(preset("dlrm", train_part.schema), seed=0)

    def broken(*args):
        raise RuntimeError("kernel exploded")

    model.head.register_forward_hook(lambda *args: broken())
    result = train(model, train_part, valid, test, TrainConfig(batch_size=128, max_steps=3))
    assert result.status == "failed"
    assert result.failure_reason == "RuntimeError: kernel exploded"
    assert not result.non_finite


def test_the_eval_callback_can_prune_and_early_stopping_stops(splits):
    seen = []

    def prune_at_second(step, examples, metrics):
        seen.append((step, examples, metrics["ne"]))
        return len(seen) == 2

    train_part, valid, test = splits
    model = build_model(preset("dlrm", train_part.schema), seed=0)
    config = TrainConfig(batch_size=128, max_steps=40, evals=4)
    result = train(model, train_part, valid, test, config, on_eval=prune_at_second)
    assert result.status == "pruned" and len(seen) == 2 and seen[1][0] == 20
    stopped = _train(splits, max_steps=200, evals=20, early_stopping_patience=1, dense_lr=0.5)
    assert stopped.stopped_early and stopped.steps < 200


def test_the_run_ends_with_the_best_evaluations_weights(splits):
    train_part, valid, test = splits
    model = build_model(preset("dlrm", train_part.schema), seed=0)
    config = TrainConfig(batch_size=128, max_steps=300, evals=10, early_stopping_patience=0,
                         sparse_lr=0.5, dense_lr=0.01)  # fmt: skip
    result = train(model, train_part, valid, test, config)  # overfits 4,800 rows for 8 epochs
    best_step, best_ne = min(result.curves["val_ne"], key=lambda point: point[1])
    assert result.restored_step == best_step < 300
    # the curve ends with the evaluation the restore was decided on (it stopped a step short)
    assert result.curves["val_ne"][-1][0] == 300 and result.curves["val_ne"][-1][1] > best_ne
    # the validation split (600 rows) is within eval_examples: the curve saw all of it
    assert result.validation["ne"] == pytest.approx(best_ne, abs=1e-6)
    assert evaluate(model, valid)["ne"] == pytest.approx(result.validation["ne"], abs=1e-6)
    kept = train(build_model(preset("dlrm", train_part.schema), seed=0), train_part, valid,
                 test, replace(config, restore_best=False))  # fmt: skip
    assert kept.restored_step is None and kept.validation["ne"] > result.validation["ne"]


def test_a_run_worse_than_the_base_rate_is_a_failure(splits):
    # five steps from a logit of 0 (p = 0.5): not better than predicting the mean
    result = _train(splits, max_steps=5, start_at_base_rate=False)
    assert result.status == "failed" and result.validation["ne"] >= 1.0
    assert result.failure_reason.startswith("diverged: validation NE")
    # five steps: no divergence, too few (was: "fewer epochs ... may help")
    assert "still learning after 5 steps" in result.failure_reason
    assert result.time_limit is None
    # a time limit ended it (`budget.trial_seconds: 0.001`): "more examples" would not help
    timed = _train(splits, max_seconds=1e-9, start_at_base_rate=False)
    assert timed.steps == 1 and timed.time_limit == 1e-9
    assert timed.status == "failed" and "its time limit of 1e-09 s ended it after 1 step" in (
        timed.failure_reason
    )


def test_a_run_worse_than_the_base_rate_is_told_what_it_lacked():
    from trainers.trainer import TrainResult, _why_no_better

    def told(losses: list[float], ne: list[float]) -> str:
        curves = {"train_loss": list(enumerate(losses)), "val_ne": list(enumerate(ne))}
        return _why_no_better(TrainResult("failed", curves=curves, steps=40, examples=20_480))

    assert "diverged; a lower learning rate" in told([0.5, 0.5, 0.9, 3.0], [1.2, 1.5])
    assert "overfit; fewer epochs" in told([0.5, 0.4, 0.3, 0.2], [0.99, 0.98, 1.01])
    # lowest at the first evaluation (30 epochs, 6 evaluations: the first after 5 of them)
    curves = {"train_loss": list(enumerate([0.5, 0.4, 0.3, 0.2])),
              "val_ne": [(13, 1.02), (26, 1.08), (40, 1.15)]}  # fmt: skip
    early = _why_no_better(TrainResult("failed", curves=curves, steps=40, examples=20_480))
    assert "lowest at its first evaluation (step 13 of 40)" in early
    assert "more evaluations (training.evals" in early
    assert "still learning after 40 steps (20,480 examples)" in told([0.6, 0.5], [1.05, 1.01])
    # a new user's log (4% positives, 46 steps at lr 0.002): the loss's two points rose by
    # noise while validation NE fell at every evaluation; "a lower learning rate may help"
    # made it worse (1.0108 -> 1.0296), a higher one reached 0.92
    falling = [1.0274, 1.0225, 1.018, 1.0145, 1.0128, 1.0115, 1.0108]
    assert "still learning after 40 steps" in told([0.1784, 0.1811], falling)
    assert "still learning after 40 steps" in told([0.5, 0.51], [1.05, 1.05])  # within noise
    # validation NE up while the loss stays flat: not overfit (nothing was learnt to overfit)
    assert "still learning after 40 steps" in told([0.5, 0.51], [1.01, 1.02])
    # early stopping ended it: "still learning" contradicted it; one step is no "steps"
    curves = {"train_loss": [(0, 0.5), (1, 0.5)], "val_ne": [(0, 1.01), (1, 1.02), (2, 1.01)]}
    stopped = TrainResult("failed", curves=curves, steps=1, examples=512, stopped_early=True)
    assert "early stopping ended it after 1 step (512 examples)" in _why_no_better(stopped)
    # 0.1% positives: one in the 2,000 validation rows (the advice was a higher lr)
    rare = TrainResult("failed", curves=curves, validation={"base_rate": 0.0005,
                                                            "examples": 2000.0})  # fmt: skip
    assert "its 2,000 validation rows hold 1 positive label: too few" in _why_no_better(rare)
    constant = TrainResult("failed", curves={"val_ne": [(0, 1.0), (1, 1.01)]},
                           validation={"ne": 1.01, "auc": 0.5})  # fmt: skip
    assert "AUC is 0.5: its score does not vary with the input" in _why_no_better(constant)
    # learning rates 500x and 2e7x the defaults: NE 4.1 to 8.8 from the first evaluation was
    # told "a higher learning rate may help", or (saturated: AUC 0.5) to check the features
    lower = "above 1.5 at every evaluation, confidently wrong from its first steps: it diverged"
    assert lower in told([0.9, 0.7, 0.8, 0.7], [4.3, 4.12])
    saturated = TrainResult("failed", curves={"val_ne": [(0, 6.1), (1, 5.64)]},
                            validation={"ne": 5.64, "auc": 0.5})  # fmt: skip
    assert lower in _why_no_better(saturated)


def test_cli_train_prints_json_with_the_bayes_floor(capsys):
    code = main(["train", "--arch", "deepfm", "--rows", "4000", "--epochs", "3", "--json"])
    assert code == 0
    summary = json.loads(capsys.readouterr().out)
    assert summary["status"] == "complete"
    assert 0 < summary["bayes_val_ne"] < summary["val_ne"]


def test_cli_data_synth_writes_data_schema_and_stats(tmp_path, capsys):
    out = tmp_path / "synth"
    assert main(["data", "synth", "--out", str(out), "--rows", "3000", "--format", "csv"]) == 0
    assert {"data.csv", "schema.yaml", "stats.json"} <= {p.name for p in out.iterdir()}
    code = main(["train", "--arch", "dlrm", "--data", str(out / "data.csv"), "--schema",
                 str(out / "schema.yaml"), "--epochs", "5", "--batch-size", "128",
                 "--json"])  # fmt: skip
    assert code == 0


def test_cli_train_bad_schema_is_a_clear_error(tmp_path, capsys):
    data = tmp_path / "clicks.csv"
    data.write_text("y,a,b\n1,0.5,x\n0,0.1,y\n")
    schema = tmp_path / "schema.yaml"
    schema.write_text("label: y\ndense: [a, missing_col]\ncategorical: [b]\n")
    assert main(["train", "--arch", "dlrm", "--data", str(data), "--schema", str(schema)]) == 2
    err = capsys.readouterr().err
    assert "missing_col" in err and "Traceback" not in err


# The acceptance ordering. Margin to the Bayes floor stated at this size (100k rows, one
# epoch): interaction models within 0.10 NE, logistic regression at least 0.025 NE worse than
# each of them (0.029 behind wukong since every run starts at the base rate, which helped
# logistic regression by 0.010 NE). BENCHMARKS.md records the numbers at larger sizes.
MARGIN_TO_BAYES = 0.10
LR_GAP = 0.025


def test_interaction_models_approach_the_bayes_floor_and_lr_does_not():
    data = generate_synthetic(SyntheticConfig(rows=100_000, seed=0))
    train_part, valid, test = data.split()
    bayes = bayes_metrics(valid).ne
    config = TrainConfig(batch_size=512, dense_lr=3e-3, sparse_lr=0.1, evals=2)
    ne = {}
    for name in ("logistic_regression", "dlrm", "dcnv2", "wukong"):
        model = build_model(preset(name, data.schema), seed=0)
        result = train(model, train_part, valid, test, config)
        assert result.status == "complete"
        ne[name] = result.validation["ne"]
    assert all(math.isfinite(v) for v in ne.values())
    for name in ("dlrm", "dcnv2", "wukong"):
        assert ne[name] - bayes < MARGIN_TO_BAYES, (ne, bayes)
        assert ne["logistic_regression"] - ne[name] > LR_GAP, (ne, bayes)


def test_a_run_starts_at_the_training_click_rate(splits):
    """At 3% clicks a logit of 0 (p = 0.5) has NE ~4: the output bias starts at the training
    rate's log-odds, so one nearly frozen step predicts about the base rate (NE ~1), and
    logistic regression is not failed as diverged on a short budget."""
    rng = np.random.default_rng(0)
    rare = [replace(p, labels=(rng.random(len(p)) < 0.03).astype(np.float32), true_prob=None)
            for p in splits]  # fmt: skip
    result = _train(rare, max_steps=1, dense_lr=1e-9, sparse_lr=1e-9, restore_best=False)
    assert result.validation["ne"] == pytest.approx(1.0, abs=0.02)
    lr = _train(rare, arch="logistic_regression", max_epochs=1)
    assert lr.status == "complete" and lr.validation["ne"] < 1.0


def test_a_cosine_schedule_takes_the_dense_lr_from_its_value_to_zero(splits):
    """`lr_schedule: cosine` (the default): the first step at dense_lr, falling to 0 at the
    end of the budget, in steps or in seconds, whichever ends the run first."""
    from trainers.trainer import budget_done, cosine_factor

    factors = [cosine_factor(budget_done(step, 0.0, 100, None)) for step in range(1, 101)]
    assert factors[0] == 1.0 and factors[-1] < 1e-3 and factors == sorted(factors, reverse=True)
    assert budget_done(51, elapsed=9.0, budget_steps=100, seconds=10.0) == 0.9  # time ends first
    assert budget_done(51, elapsed=9.0, budget_steps=None, seconds=None) == 0.0
    assert cosine_factor(budget_done(5, elapsed=30.0, budget_steps=None, seconds=10.0)) == 0.0
    one_step = [
        _train(splits, max_steps=1, lr_schedule=s).validation for s in ("constant", "cosine")
    ]
    assert one_step[0] == one_step[1]  # the first step is at dense_lr either way
    runs = [_train(splits, max_steps=40, lr_schedule=s) for s in ("constant", "cosine")]
    assert runs[0].validation != runs[1].validation and runs[1].status == "complete"
    with pytest.raises(RanknasError, match="lr_schedule must be one of constant, cosine, "):
        TrainConfig(lr_schedule="linear")


def test_cosine_restarts_anneal_the_dense_lr_over_each_evaluation_interval(splits, monkeypatch):
    """`cosine_restarts`: each evaluation sees weights trained down to a small lr, and the
    next interval starts at dense_lr again; with no intervals (seconds only), one cosine."""
    import trainers.trainer as trainer

    seen: list[float] = []
    monkeypatch.setattr(trainer, "set_lr", lambda optimizer, lr: seen.append(lr))
    _train(splits, max_steps=40, evals=2, lr_schedule="cosine_restarts",
           early_stopping_patience=0, dense_lr=0.004)  # fmt: skip
    assert len(seen) == 40 and seen[0] == seen[20] == 0.004
    assert seen[19] < 1e-4 and seen[39] < 1e-4
    assert seen[:20] == sorted(seen[:20], reverse=True) and seen[:20] == seen[20:]
    seen.clear()
    _train(splits, max_seconds=0.5, lr_schedule="cosine_restarts", dense_lr=0.004)
    assert seen[0] == 0.004 and seen == sorted(seen, reverse=True)


def test_cli_train_without_a_budget_trains_until_an_epoch_does_not_improve(capsys):
    """No --examples/--epochs/--seconds: epochs until early stopping ends them (at most 10),
    the best epoch's weights kept; a budget given keeps the one-cosine protocol."""
    args = ["train", "--arch", "dlrm", "--rows", "4000", "--json"]
    assert main(args) == 0
    summary = json.loads(capsys.readouterr().out)
    epoch = 3200  # the training split: 80% of the rows
    assert summary["stopped_early"] and epoch < summary["examples"] < 10 * epoch
    assert summary["restored_step"] < summary["steps"]
    main([*args, "--epochs", "1"])  # on 4,000 rows one epoch is not better than the base rate
    assert json.loads(capsys.readouterr().out)["examples"] <= epoch


@pytest.mark.slow  # torch.compile's first compile of a forward and backward: ~30 s here
def test_a_compiled_step_trains_as_the_eager_step_does():
    from helpers import check_training_ends_alike

    data = generate_synthetic(SyntheticConfig(rows=12_000, seed=1))

    def train_both(way, model, train_part, valid, config):  # compiled, then eager
        return train(model, train_part, valid, config=replace(config, compile=way == 0))

    check_training_ends_alike(lambda: build_model(preset("dcnv2", data.schema), seed=0), data,
                              train_both)  # fmt: skip


def test_validation_rows_of_one_label_fail_the_run_saying_so():
    """Streamed rows are split on the fly, past the split's own check: a validation part of
    one label failed as "diverged: validation NE nan", with advice to train longer."""
    from trainers.trainer import TrainResult, _check_diverged

    labels = np.zeros(50)
    result = TrainResult(status="complete", validation=ranking_metrics(np.full(50, 0.1), labels))
    _check_diverged(result)
    assert result.status == "failed"
    assert result.failure_reason.startswith("the validation rows hold one label only")
