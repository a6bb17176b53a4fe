"""Bayesian optimization with Ax (the Ax 1.x `Client` API) as an Optuna sampler.

The study's storage stays the only state: a sampler builds its Ax client from the study's
finished trials the first time it asks, and afterwards only tells it what finished since
(its own proposals by their Ax index, other workers' trials attached), so an ask costs
Ax's model fit, not a rebuild that grows with the study. Resume and several workers work
as for the other searchers. Ax's default generation strategy starts with quasi-random
(Sobol) trials, then fits a BoTorch model; with a cost objective it optimizes the
NE-vs-cost Pareto front.
"""

from __future__ import annotations

import logging
import warnings
from typing import Any

from ax.api.client import Client
from ax.api.configs import ChoiceParameterConfig
from ax.utils.common.logger import set_stderr_log_level
from optuna import Study
from optuna.distributions import BaseDistribution
from optuna.trial import FrozenTrial, TrialState

from cost_models.sharding.measure import torch_threads
from nas.searchers.base import SpaceSampler
from search_space.spaces import SearchSpace

FINISHED = (TrialState.COMPLETE, TrialState.FAIL, TrialState.PRUNED)
# Warnings of Ax's about its own workings, at every ask, that a study can do nothing about:
# a front without thresholds (Ax infers them), a tensor copied inside its MOO code, and the
# GP's covariance given jitter to factor (linear_operator, on a few dozen repeated points).
LIBRARY_NOISE = ("Encountered a `MultiObjective` without objective thresholds",
                 "To copy construct from a tensor", "A not p.d., added jitter")  # fmt: skip


def _ax_name(name: str) -> str:
    return name.replace(".", "__")  # Ax parameter names are identifiers


def _kind(choices: list[Any]) -> str:
    if all(isinstance(c, bool) for c in choices):
        return "bool"
    if all(isinstance(c, int) for c in choices):
        return "int"
    numbers = all(isinstance(c, int | float) and not isinstance(c, bool) for c in choices)
    return "float" if numbers else "str"  # a searched learning rate: an ordered float choice


class AxSampler(SpaceSampler):
    def __init__(
        self,
        space: SearchSpace,
        objective_names: list[str],
        objective_thresholds: dict[str, float] | None = None,
        seed: int = 0,
    ) -> None:
        super().__init__(space, seed)
        self.objective_names = objective_names
        self.objective_thresholds = objective_thresholds or {}
        self._client: Client | None = None
        self._study_name = ""
        self._proposed: dict[int, int] = {}  # Optuna trial number -> Ax trial index
        self._told: set[int] = set()  # Optuna trial numbers the client knows the end of
        set_stderr_log_level(logging.WARNING)  # Ax's own handler prints every trial at INFO

    def sample_relative(
        self, study: Study, trial: FrozenTrial, search_space: dict[str, BaseDistribution]
    ) -> dict[str, Any]:
        client = self._updated_client(study)
        with torch_threads(1), warnings.catch_warnings():  # a GP of a few dozen rows: 1 thread
            for message in LIBRARY_NOISE:
                warnings.filterwarnings("ignore", message=message)
            ((index, parameters),) = client.get_next_trials(max_trials=1).items()
        self._proposed[trial.number] = index
        by_ax_name = {_ax_name(n): n for n in self.space.parameters()}
        return {by_ax_name[k]: v for k, v in parameters.items()}

    def _updated_client(self, study: Study) -> Client:
        """This sampler's client for `study`, told every trial finished since the last ask."""
        if self._client is None or self._study_name != study.study_name:
            self._client, self._study_name = self._new_client(study), study.study_name
            self._proposed, self._told = {}, set()
        for frozen in study.get_trials(deepcopy=False, states=FINISHED):
            if frozen.number not in self._told:
                self._tell(frozen)
                self._told.add(frozen.number)
        return self._client

    def _tell(self, frozen: FrozenTrial) -> None:
        index = self._proposed.pop(frozen.number, None)
        if frozen.state != TrialState.COMPLETE:
            if index is not None:
                self._client.mark_trial_failed(index)
            return
        if index is None:  # another worker's trial, or one from before a resume
            index = self._client.attach_trial({_ax_name(k): v for k, v in frozen.params.items()})
        values = dict(zip(self.objective_names, frozen.values, strict=True))
        self._client.complete_trial(index, values)

    def _new_client(self, study: Study) -> Client:
        # Spread seeds apart: seed s+1 must not replay seed s shifted by one trial.
        # (numpy's seeds are 32-bit: a resumed or joining worker's seed is a 32-bit hash)
        client = Client(random_seed=(self.seed * 1_000_003 + len(study.trials)) % 2**32)
        client.configure_experiment(parameters=self._parameters(), name=study.study_name)
        objective = ", ".join(f"-{name}" for name in self.objective_names)
        constraints = [f"{n} <= {v}" for n, v in self.objective_thresholds.items()]
        client.configure_optimization(objective=objective, outcome_constraints=constraints or None)
        return client

    def _parameters(self) -> list[ChoiceParameterConfig]:
        configs = []
        for name, parameter in self.space.parameters().items():
            choices = list(parameter.choices)
            kind = _kind(choices)
            configs.append(
                ChoiceParameterConfig(
                    name=_ax_name(name),
                    values=choices,
                    parameter_type=kind,
                    is_ordered=kind in ("int", "float"),
                )
            )
        return configs
