"""What every searcher shares: the search space as Optuna distributions.

A searcher is an Optuna sampler, so every searcher records into the same Optuna storage,
resumes from it, and shares it between workers: the storage is the system of record.
"""

from __future__ import annotations

from typing import Any

from optuna import Study
from optuna.distributions import BaseDistribution, CategoricalDistribution, IntDistribution
from optuna.samplers import BaseSampler, RandomSampler
from optuna.trial import FrozenTrial

from search_space.spaces import Categorical, SearchSpace


def distributions(space: SearchSpace) -> dict[str, BaseDistribution]:
    """The space's typed parameters as Optuna distributions."""
    return {
        name: CategoricalDistribution(p.choices)
        if isinstance(p, Categorical)
        else IntDistribution(p.low, p.high)
        for name, p in space.parameters().items()
    }


class SpaceSampler(BaseSampler):
    """A sampler that proposes whole architectures of `space` in `sample_relative`; any
    parameter it leaves out (e.g. before it has enough history) is drawn at random."""

    def __init__(self, space: SearchSpace, seed: int = 0) -> None:
        self.space = space
        self.seed = seed
        self._random = RandomSampler(seed=seed)

    def infer_relative_search_space(
        self, study: Study, trial: FrozenTrial
    ) -> dict[str, BaseDistribution]:
        return distributions(self.space)

    def sample_independent(
        self,
        study: Study,
        trial: FrozenTrial,
        param_name: str,
        param_distribution: BaseDistribution,
    ) -> Any:
        return self._random.sample_independent(study, trial, param_name, param_distribution)
