"""Bayesian optimization with Ax (the Ax 1.x `Client` API) as an Optuna sampler.

Each new trial rebuilds an Ax client from the study's complete trials (attach + complete),
so the study's storage stays the only state: resume and several workers work as for the
other searchers. Ax's default generation strategy starts with quasi-random (Sobol) trials,
then fits a BoTorch model; with a cost objective it optimizes the NE-vs-cost Pareto front.
"""

from __future__ import annotations

import logging
from typing import Any

from ax.api.client import Client
from ax.api.configs import ChoiceParameterConfig
from optuna import Study
from optuna.distributions import BaseDistribution
from optuna.trial import FrozenTrial, TrialState

from nas.searchers.base import SpaceSampler
from search_space.spaces import SearchSpace


def _ax_name(name: str) -> str:
    return name.replace(".", "__")  # Ax parameter names are identifiers


def _kind(choices: list[Any]) -> str:
    if all(isinstance(c, bool) for c in choices):
        return "bool"
    return "int" if all(isinstance(c, int) for c in choices) else "str"


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
        logging.getLogger("ax").setLevel(logging.WARNING)

    def sample_relative(
        self, study: Study, trial: FrozenTrial, search_space: dict[str, BaseDistribution]
    ) -> dict[str, Any]:
        client = self._client(study)
        ((_, parameters),) = client.get_next_trials(max_trials=1).items()
        by_ax_name = {_ax_name(n): n for n in self.space.parameters()}
        return {by_ax_name[k]: v for k, v in parameters.items()}

    def _client(self, study: Study) -> Client:
        # Spread seeds apart: seed s+1 must not replay seed s shifted by one trial.
        client = Client(random_seed=self.seed * 1_000_003 + len(study.trials))
        client.configure_experiment(parameters=self._parameters(), name=study.study_name)
        objective = ", ".join(f"-{name}" for name in self.objective_names)
        constraints = [f"{n} <= {v}" for n, v in self.objective_thresholds.items()]
        client.configure_optimization(objective=objective, outcome_constraints=constraints or None)
        for frozen in study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,)):
            index = client.attach_trial({_ax_name(k): v for k, v in frozen.params.items()})
            client.complete_trial(
                index, dict(zip(self.objective_names, frozen.values, strict=True))
            )
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
                    is_ordered=kind == "int",
                )
            )
        return configs
