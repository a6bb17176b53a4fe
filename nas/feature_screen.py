"""What each categorical feature is worth to a trained model: permutation importance.

A study around a model whose `feature_dims` may leave features out (a 0 among them) asks the
base, trained as a baseline, first: its validation NE with one feature's column shuffled
across rows (its values kept, their rows moved), minus its NE as it is, for each feature it
reads (scikit-learn's `permutation_importance`, `repeats` shuffles each). A feature that
carries nothing costs the step all the same (a table, a lookup, all-to-all bytes, one more
embedding in every interaction), yet one feature's 0 among 26 features' dims is rarely
drawn by a searcher on its own: the study starts from the base with the features worth
least left out (`screened_points`), and its searcher breeds from there. Validation rows
only: test data selects nothing.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np
import optuna
import torch
from safetensors.torch import load_file

from nas.leaderboard import TIE_MARGIN
from nas.trial_record import WEIGHTS_FILE, StudyAttr, recorded
from search_space.architecture import Architecture, digest
from search_space.builder import build_model
from trainers.data.dataset import TabularData
from trainers.trainer import evaluate

SCREEN_ROWS = 20_000  # validation rows scored per shuffle: ~0.1 s a forward on 2 cores
REPEATS = 5


class _Trained:
    """A trained model as scikit-learn scores it. Each column of X holds the rows one
    feature is read from: `arange` for the data as it is, a permutation for a shuffle."""

    def __init__(self, model: torch.nn.Module, data: TabularData, features: list[str]) -> None:
        self.model = model
        self.data = data
        self.features = features

    def fit(self, X: Any = None, y: Any = None) -> _Trained:
        return self  # trained already: the baseline's weights

    def ne(self, X: np.ndarray) -> float:
        return evaluate(self.model, _read_from(self.data, self.features, X))["ne"]


def _read_from(data: TabularData, features: list[str], rows: np.ndarray) -> TabularData:
    """`data` with feature `features[j]` of row i read from row `rows[i, j]`."""
    index = {f.name: k for k, f in enumerate(data.schema.categorical)}
    categorical, multi_hot = data.categorical.copy(), dict(data.multi_hot)
    for j, name in enumerate(features):
        if np.array_equal(rows[:, j], np.arange(len(data))):
            continue
        k = index[name]
        categorical[:, k] = data.categorical[rows[:, j], k]
        if name in multi_hot:
            multi_hot[name] = data.multi_hot[name].take(rows[:, j])
    return replace(data, categorical=categorical, multi_hot=multi_hot)


def feature_importance(
    arch: Architecture,
    weights: dict[str, torch.Tensor],
    valid: Any,
    repeats: int = REPEATS,
    seed: int = 0,
) -> dict[str, dict[str, float]]:
    """Per categorical feature `arch` reads: the mean and standard deviation over `repeats`
    shuffles of its validation NE rise (`valid`'s first `SCREEN_ROWS` rows) when the
    feature's column is shuffled; `weights` is the trained state dict."""
    from sklearn.inspection import permutation_importance  # 1 s to import: not at start-up

    model = build_model(arch, seed=seed)
    model.load_state_dict(weights)
    data = valid.head(min(SCREEN_ROWS, len(valid)))
    features = [f.name for f in arch.embedding.used]
    rows = np.tile(np.arange(len(data))[:, None], (1, len(features)))
    result = permutation_importance(
        _Trained(model, data, features), rows, data.labels,
        scoring=lambda estimator, X, y: -estimator.ne(X),
        n_repeats=repeats, random_state=seed,
    )  # fmt: skip
    return {name: {"mean": float(mean), "sd": float(sd)}
            for name, mean, sd in zip(features, result.importances_mean,
                                      result.importances_std, strict=True)}  # fmt: skip


def worth_least(importance: dict[str, dict[str, float]], margin: float) -> list[str]:
    """The features whose mean NE rise is below `margin`, least worth first."""
    order = sorted(importance, key=lambda name: importance[name]["mean"])
    return [name for name in order if importance[name]["mean"] < margin]


def screened_points(space: Any, free: list[str]) -> list[dict[str, Any]]:
    """The around space's base with `free`'s first k features left out, for k = all of
    them, then half as many, down to one (a recipe searched beside it: the study's)."""
    inner = getattr(space, "inner", space)  # a RecipeSpace's around space
    base = inner.base_values() | (space.base_values() if inner is not space else {})
    points, k = [], len(free)
    while k >= 1:
        points.append(base | {f"dim.{name}": 0 for name in free[:k]})
        k //= 2
    return points


def screen(
    study: optuna.Study, space: Any, data: Any, seed: int, progress: Callable[[str], None]
) -> list[dict[str, Any]]:
    """For a new study around a base whose features it may leave out: the base's feature
    importance (recorded as the study's `feature_importance`) and `screened_points` of the
    features worth less than `TIE_MARGIN` of its NE; [] for any other space, or without
    the base's weights (the base is not one of the study's trained baselines)."""
    inner = getattr(space, "inner", space)
    if not getattr(inner.config, "DROPS_FEATURES", False) or 0 not in (
        inner.config.feature_dims or ()
    ):
        return []
    found = study.user_attrs.get(StudyAttr.FEATURE_IMPORTANCE)
    if found is None:
        key, record = next(((k, r) for k, r in recorded(study).items()
                            if r.get("digest") == digest(inner.base)
                            and r.get("status") == "complete"), (None, None))  # fmt: skip
        if record is None:
            progress("features: the base is not among the study's trained baselines, so the "
                     "search starts without knowing which features it reads; list it under "
                     "baselines")  # fmt: skip
            return []
        weights = load_file(str(Path(record["dir"]) / WEIGHTS_FILE))
        importance = feature_importance(inner.base, weights, data.valid, seed=seed)
        found = {"baseline": key, "margin": TIE_MARGIN * record["val_ne"],
                 "features": importance}  # fmt: skip
        study.set_user_attr(StudyAttr.FEATURE_IMPORTANCE, found)
    progress(f"features: {describe(found)}")
    return screened_points(space, worth_least(found["features"], found["margin"]))


def describe(found: dict[str, Any]) -> str:
    """The study's `feature_importance` in one line: how many features the base reads, and
    which the search started without."""
    free = worth_least(found["features"], found["margin"])
    rises = ", ".join(f"{name} {found['features'][name]['mean']:+.4f}" for name in free)
    return (f"baseline {found['baseline']} reads {len(found['features']) - len(free)} of its "
            f"{len(found['features'])} categorical features for {found['margin']:.4f} NE or "
            f"more (each shuffled on validation rows); the search started with "
            + (f"{', '.join(free)} left out" if free else "every feature")
            + (", then halves of them" if len(free) > 1 else "")
            + (f" (their NE rises: {rises})" if free else ""))  # fmt: skip
