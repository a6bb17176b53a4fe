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
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from nas.leaderboard import TIE_MARGIN
from nas.trial_record import WEIGHTS_FILE, read_weights, recorded

if TYPE_CHECKING:  # torch and the model only where importance is measured: `status` is light
    import optuna
    import torch

    from search_space.architecture import Architecture
    from trainers.data.dataset import TabularData

SCREEN_ROWS = 20_000  # validation rows scored per shuffle: ~0.1 s a forward on 2 cores
REPEATS = 5


@dataclass(frozen=True)
class Screen:
    """What a new study starts from: the base's `feature_importance` record and the points
    with the features worth least left out."""

    record: dict[str, Any]
    points: list[dict[str, Any]]


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
        from trainers.trainer import evaluate

        return evaluate(self.model, _read_from(self.data, self.features, X))["ne"]


def _read_from(data: TabularData, features: list[str], rows: np.ndarray) -> TabularData:
    """`data` with feature `features[j]` of row i read from row `rows[i, j]`."""
    index = {f.name: k for k, f in enumerate(data.schema.categorical)}
    categorical, multi_hot = data.categorical.copy(), dict(data.multi_hot)
    unmoved = np.arange(len(data))
    for j, name in enumerate(features):
        if np.array_equal(rows[:, j], unmoved):
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

    from search_space.builder import build_model

    model = build_model(arch, seed=seed)
    model.load_state_dict(weights)
    data = valid.head(SCREEN_ROWS)
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


def screens(search_space: Any) -> bool:
    """Whether a study in this space screens its base's features: a 0 among `feature_dims`
    (which only the around space takes)."""
    return 0 in (getattr(search_space, "feature_dims", None) or ())


def screened_points(space: Any, free: list[str]) -> list[dict[str, Any]]:
    """The around space's base with `free`'s first k features left out, for k = all of
    them (one kept, if they are all the base reads), then half as many, down to one (a
    recipe searched beside it: at the study's)."""
    around = getattr(space, "inner", space)  # a RecipeSpace's around space
    base = around.base_values() | (space.base_values() if around is not space else {})
    points, k = [], min(len(free), len(around.base.embedding.used) - 1)
    while k >= 1:
        points.append(base | {f"dim.{name}": 0 for name in free[:k]})
        k //= 2
    return points


def screen(
    study: optuna.Study, space: Any, data: Any, seed: int, progress: Callable[[str], None]
) -> Screen | None:
    """The base's feature importance on `data`'s validation rows and `screened_points` of
    the features worth less than `TIE_MARGIN` of its NE, for a study around a base whose
    features it may leave out; None for any other space, or, said in a progress line,
    without the base's trained weights."""
    from search_space.architecture import digest

    around = getattr(space, "inner", space)
    if not screens(around.config):
        return None
    wanted = digest(around.base)
    found = [(k, r) for k, r in recorded(study).items() if r.get("digest") == wanted]
    trained = [(k, r) for k, r in found if r.get("status") == "complete"]
    if not trained:
        why = (f"baseline {found[0][0]} is {found[0][1].get('status')}" if found else
               "the base is not among the study's baselines (list it under baselines)")  # fmt: skip
        progress(f"features: {why}; the search starts without a screen of its features")
        return None
    key, record = trained[0]
    weights = _weights(Path(record["dir"]) / WEIGHTS_FILE, key, progress)
    if weights is None:
        return None
    importance = feature_importance(around.base, weights, data.valid, seed=seed)
    found_record = {"baseline": key, "margin": TIE_MARGIN * record["val_ne"],
                    "rows": min(SCREEN_ROWS, len(data.valid)), "repeats": REPEATS,
                    "features": importance}  # fmt: skip
    free = worth_least(importance, found_record["margin"])
    points = screened_points(space, free)
    _say_changed_dims(around, points, progress)
    return Screen(found_record, points)


def _say_changed_dims(around: Any, points: list[dict], progress: Callable[[str], None]) -> None:
    """The screened points leave features out of the base, but where `feature_dims` lacks a
    kept feature's own dim they change that dim too: say so, or their NE reads as the cost
    of the features left out alone."""
    emb = around.base.embedding
    changed = {emb.feature_dim(f): point[f"dim.{f.name}"] for point in points for f in
               emb.features if point[f"dim.{f.name}"] not in (0, emb.feature_dim(f))}  # fmt: skip
    for dim, given in changed.items():
        progress(f"features: search_space.feature_dims {list(around.config.feature_dims)} lacks "
                 f"the base's dim {dim}: the screened starting points give those features "
                 f"dim {given} (add {dim} to feature_dims to keep the base's)")  # fmt: skip


def _weights(path: Path, key: str, progress: Callable[[str], None]) -> dict | None:
    """The baseline's trained weights; None, said, where they cannot be read here (trained
    by a worker on another machine, or damaged)."""
    from safetensors import SafetensorError

    try:
        return read_weights(path)
    except (OSError, SafetensorError) as exc:
        progress(f"features: baseline {key}'s weights {path} cannot be read here ({exc}); the "
                 "search starts without a screen of its features")  # fmt: skip
        return None


def describe(found: dict[str, Any]) -> str:
    """The study's `feature_importance` in one line: how many features the base reads,
    which the search started without, and whether the shuffles could tell."""
    free = worth_least(found["features"], found["margin"])
    rises = ", ".join(f"{name} {found['features'][name]['mean']:+.4f}" for name in free)
    text = (f"baseline {found['baseline']} reads {len(found['features']) - len(free)} of its "
            f"{len(found['features'])} categorical features for {found['margin']:.4f} NE "
            f"({TIE_MARGIN:.1%} of its NE) or more, each shuffled on validation rows; the "
            "search started with "
            + (f"{', '.join(free)} left out" if free else "every feature")
            + (", then halves of them" if len(free) > 1 else "")
            + (f" ({'their NE rises' if len(free) > 1 else 'its NE rise'}: {rises})"
               if free else ""))  # fmt: skip
    spread = noise(found)
    if spread >= found["margin"]:
        rows = f" on {found['rows']:,} validation rows" if "rows" in found else ""
        text += (f"; but the shuffles' spread{rows} (median ±{spread:.4f}) is as large as the "
                 "margin: which features look worthless is partly chance (more rows, a longer "
                 "log, would tell)")  # fmt: skip
    return text


def noise(found: dict[str, Any]) -> float:
    """The median standard error of the features' mean NE rise over their shuffles."""
    repeats = found.get("repeats", REPEATS)
    errors = sorted(v["sd"] / (repeats - 1) ** 0.5 for v in found["features"].values())
    return errors[len(errors) // 2] if errors else 0.0
