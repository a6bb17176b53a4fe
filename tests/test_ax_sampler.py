"""The Ax sampler keeps one client and tells it only what finished since its last ask."""

import optuna
import pytest
from optuna.trial import TrialState

from nas.searchers.ax_bo import AxSampler
from nas.searchers.base import distributions
from search_space.schema import synthetic_schema
from search_space.spaces import make_space


@pytest.fixture(scope="module")
def space():
    return make_space({"type": "dag", "num_blocks": 2}, synthetic_schema())


def _run(study: optuna.Study, trials: int) -> None:
    for k in range(trials):
        trial = study.ask(distributions(study.sampler.space))
        if k % 4 == 3:
            study.tell(trial, state=TrialState.FAIL)
        else:
            study.tell(trial, [0.8 + 0.01 * k])


def _ax_trials(sampler: AxSampler) -> dict[str, int]:
    trials = sampler._client._experiment.trials.values()
    return {status: sum(t.status.name == status for t in trials) for status in
            ("COMPLETED", "FAILED", "RUNNING", "CANDIDATE")}  # fmt: skip


def test_one_client_told_each_finished_trial_once(space):
    sampler = AxSampler(space, ["ne"], seed=0)
    study = optuna.create_study(sampler=sampler, study_name="ax")
    _run(study, 6)
    client = sampler._client
    study.ask(distributions(space))  # tells the client about the sixth trial, proposes a seventh
    assert sampler._client is client
    assert _ax_trials(sampler) == {"COMPLETED": 5, "FAILED": 1, "RUNNING": 1, "CANDIDATE": 0}
    assert sampler._told == set(range(6))


def test_a_new_sampler_attaches_the_finished_trials_of_others(space):
    first = optuna.create_study(sampler=AxSampler(space, ["ne"], seed=1), study_name="shared")
    _run(first, 5)
    joining = AxSampler(space, ["ne"], seed=2)
    study = optuna.load_study(study_name="shared", storage=first._storage, sampler=joining)
    params = study.ask(distributions(space)).params
    assert set(params) == set(space.parameters())
    assert _ax_trials(joining)["COMPLETED"] == 4  # attached; the failed one is not


def test_a_joining_worker_s_hashed_seed_and_searched_learning_rates_are_taken(space):
    """A resumed or joining worker's seed is a 32-bit hash (numpy refused it once multiplied
    for Ax); a searched learning rate is an ordered float choice, proposed as a float."""
    from nas.config import TrainingSearchConfig
    from nas.recipe import RecipeSpace, recipe_parameters

    searched = recipe_parameters(TrainingSearchConfig(dense_lr={"low": 0.001, "high": 0.01}))
    recipes = RecipeSpace(space, searched, {"dense_lr": 0.002, "sparse_lr": 0.05,
                                            "weight_decay": 0.0, "batch_size": 512})  # fmt: skip
    sampler = AxSampler(recipes, ["ne"], seed=2**32 - 1)
    study = optuna.create_study(sampler=sampler, study_name="ax-joined")
    _run(study, 3)
    lrs = [t.params["train.dense_lr"] for t in study.trials]
    assert all(isinstance(lr, float) and lr in searched["train.dense_lr"].choices for lr in lrs)


def test_ax_fits_its_model_on_one_thread_and_gives_the_trials_theirs_back(space, monkeypatch):
    """With `training.threads: 2` and a busy process beside, an ask at 50 trials took 10.3 s,
    2.5 s on one thread (its GP's matrices are a few dozen rows; BENCHMARKS.md): the ask
    runs on one, the training keeps its own."""
    import torch

    sampler = AxSampler(space, ["ne"], seed=0)
    study = optuna.create_study(sampler=sampler, study_name="threads")
    _run(study, 2)
    seen = []
    gen = type(sampler._client).get_next_trials

    def recorded(client, *args, **kwargs):
        seen.append(torch.get_num_threads())
        return gen(client, *args, **kwargs)

    monkeypatch.setattr(type(sampler._client), "get_next_trials", recorded)
    threads = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        study.ask(distributions(space))
        assert seen == [1] and torch.get_num_threads() == 2
    finally:
        torch.set_num_threads(threads)


def test_asks_of_a_front_print_none_of_ax_s_own_warnings(space):
    """Ax warned at every ask of a two-objective study about thresholds it infers itself,
    and about a tensor copied inside its code: noise a user can do nothing about."""
    import warnings

    sampler = AxSampler(space, ["ne", "mflops"], seed=0)
    study = optuna.create_study(sampler=sampler, directions=["minimize", "minimize"])
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for k in range(7):  # past Ax's quasi-random start: its model's asks
            trial = study.ask(distributions(space))
            study.tell(trial, [0.8 + 0.01 * (k % 3), 1.0 + k])
    assert sampler._client._generation_strategy.current_node_name == "MBM"  # the model asked
    shown = [str(w.message) for w in caught]
    assert not [m for m in shown if "objective thresholds" in m or "copy construct" in m], shown
