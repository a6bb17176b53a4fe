"""Regularized evolution (Real et al., 2019; NASRec's searcher) as an Optuna sampler.

Until `population` trials are complete, architectures are sampled at random. Then each new
trial takes the last `population` complete trials (aging: the oldest drop out), draws a
tournament of `sample_size`, and mutates the best of it by one parameter of the space.
The population is read from the study's storage, so resume and several workers need no
state of their own.
"""

from __future__ import annotations

import random
from typing import Any

from optuna import Study
from optuna.distributions import BaseDistribution
from optuna.trial import FrozenTrial, TrialState

from nas.searchers.base import SpaceSampler
from search_space.spaces import SearchSpace


class RegularizedEvolutionSampler(SpaceSampler):
    def __init__(
        self, space: SearchSpace, population: int = 16, sample_size: int = 4, seed: int = 0
    ) -> None:
        super().__init__(space, seed)
        self.population = population
        self.sample_size = sample_size

    def sample_relative(
        self, study: Study, trial: FrozenTrial, search_space: dict[str, BaseDistribution]
    ) -> dict[str, Any]:
        complete = study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,))
        if len(complete) < self.population:
            return {}  # the random sampler fills every parameter
        rng = random.Random(self.seed * 1_000_003 + trial.number)
        population = sorted(complete, key=lambda t: t.number)[-self.population :]
        parent = min(rng.sample(population, self.sample_size), key=lambda t: t.values[0])
        return self.space.mutate_values(dict(parent.params), rng)
