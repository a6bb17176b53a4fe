"""Searchers: each one an Optuna sampler, chosen by name in the study config.

| name | what it is |
|---|---|
| random | uniform sampling of the space (Optuna's RandomSampler) |
| evolution | regularized evolution with the space's mutation (`evolution.py`) |
| tpe | Tree-structured Parzen Estimator, multivariate (Optuna's TPESampler) |
| nsga2 | NSGA-II for the NE-vs-cost Pareto front (Optuna's NSGAIISampler) |
| ax | Bayesian optimization through Ax's `Client` (`ax_bo.py`) |
| oneshot, dnas | a supernet phase enqueues its top candidates (`nas/oneshot/`), then random |
"""

from __future__ import annotations

import logging

import optuna
from optuna.samplers import BaseSampler

from search_space.spaces import SearchSpace


def make_sampler(
    name: str,
    space: SearchSpace,
    *,
    objective_names: list[str],
    seed: int,
    population: int = 16,
    sample_size: int = 4,
    startup_trials: int = 5,
    objective_thresholds: dict[str, float] | None = None,
) -> BaseSampler:
    if name in ("random", "oneshot", "dnas"):  # oneshot/dnas enqueue their candidates first
        return optuna.samplers.RandomSampler(seed=seed)
    if name == "tpe":
        return optuna.samplers.TPESampler(
            seed=seed, multivariate=True, n_startup_trials=startup_trials, constant_liar=True
        )
    if name == "nsga2":
        return optuna.samplers.NSGAIISampler(seed=seed, population_size=max(4, startup_trials))
    if name == "evolution":
        from nas.searchers.evolution import RegularizedEvolutionSampler

        return RegularizedEvolutionSampler(space, population, sample_size, seed)
    if name == "ax":
        disabled = logging.root.manager.disable
        logging.disable(max(disabled, logging.INFO))  # Ax's import announces its SQL storage
        try:
            from nas.searchers.ax_bo import AxSampler
        finally:
            logging.disable(disabled)

        return AxSampler(space, objective_names, objective_thresholds, seed)
    raise ValueError(f"unknown searcher {name!r}")
