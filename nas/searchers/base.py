"""What every searcher shares: the search space as Optuna distributions.

A searcher is an Optuna sampler, so every searcher records into the same Optuna storage,
resumes from it, and shares it between workers: the storage is the system of record.
"""

from __future__ import annotations

from optuna.distributions import BaseDistribution, CategoricalDistribution, IntDistribution

from search_space.spaces import Categorical, SearchSpace


def distributions(space: SearchSpace) -> dict[str, BaseDistribution]:
    """The space's typed parameters as Optuna distributions."""
    return {
        name: CategoricalDistribution(p.choices)
        if isinstance(p, Categorical)
        else IntDistribution(p.low, p.high)
        for name, p in space.parameters().items()
    }
