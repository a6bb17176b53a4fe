"""Preprocessing fitted on the training split: one transform per dense column, and the
vocabulary of each categorical column read by name.

`fit_dense` chooses and fits them (`log1p` where a column looks like a count: whole,
non-negative, heavy-tailed numbers whose maximum is over `COUNT_RATIO` times their median
plus one; a year is not one), `apply_dense` runs
`search_space.preprocessing.transform_dense` on a split. Validation and test rows are
transformed with the training split's statistics; nothing is fitted on them.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import numpy as np
import torch

from search_space.preprocessing import transform_dense
from search_space.schema import CategoricalFeature
from trainers.data.dataset import TabularData
from trainers.data.encoding import MISSING_ID
from trainers.data.encoding import RARE_ID as OOV_ID

FIRST_ID = OOV_ID + 1

COUNT_RATIO = 10.0


def fit_dense(train: TabularData) -> list[dict[str, Any]]:
    """A transform per dense column of `train` (JSON-ready: column, log1p, mean, std), from
    its present values (blanks, NaN here, are filled with the mean by the transform)."""
    transforms = []
    for k, column in enumerate(train.schema.dense):
        x = train.dense[:, k].astype(np.float64)
        x = x[~np.isnan(x)]
        count_like = bool(len(x)) and x.min() >= 0 and bool(np.all(x == np.floor(x))) and (
            x.max() > COUNT_RATIO * (np.median(x) + 1)
        )  # fmt: skip
        y = np.log1p(x) if count_like else x
        std = float(y.std()) if len(y) else 1.0
        transforms.append({"column": column, "log1p": bool(count_like),
                           "mean": float(y.mean()) if len(y) else 0.0,
                           "std": std if std > 1e-9 else 1.0})  # fmt: skip
    return transforms


def apply_dense(data: TabularData, transforms: list[dict[str, Any]]) -> TabularData:
    """`data` with its dense columns transformed; without transforms, blanks become 0."""
    if not transforms:
        return replace(data, dense=np.nan_to_num(data.dense, nan=0.0))
    dense = transform_dense(torch.from_numpy(data.dense), transforms).numpy()
    return replace(data, dense=dense)


def fit_vocabulary(train: TabularData) -> dict[str, list[str]]:
    """Per categorical column read by name: its values seen in training, most frequent
    first; value k gets id k + 2 (id 0: missing, 1: out of vocabulary)."""
    vocabulary = {}
    for name, (codes, values) in train.raw_values.items():
        present = codes[codes >= 0]
        counts = np.bincount(present, minlength=len(values))
        order = np.argsort(-counts, kind="stable")
        vocabulary[name] = [values[i] for i in order if counts[i] > 0]
    return vocabulary


def apply_vocabulary(data: TabularData, vocabulary: dict[str, list[str]]) -> TabularData:
    """`data` with those columns' ids from `vocabulary`: a value never seen in training
    (validation and test may have them) gets the out-of-vocabulary id."""
    if not vocabulary:
        return data
    categorical = data.categorical.copy()
    features = list(data.schema.categorical)
    for k, feature in enumerate(features):
        if feature.name not in vocabulary:
            continue
        codes, values = data.raw_values[feature.name]
        index = {v: i + FIRST_ID for i, v in enumerate(vocabulary[feature.name])}
        lookup = np.asarray([index.get(v, OOV_ID) for v in values] + [MISSING_ID], np.int64)
        categorical[:, k] = lookup[np.where(codes >= 0, codes, len(values))]
        features[k] = CategoricalFeature(feature.name, len(vocabulary[feature.name]) + FIRST_ID)
    schema = replace(data.schema, categorical=tuple(features))
    return replace(data, categorical=categorical, schema=schema)


def fit_preprocessing(train: TabularData) -> dict[str, Any]:
    """Everything fitted on the training split, as JSON: dense transforms, vocabularies."""
    return {"dense": fit_dense(train), "vocabulary": fit_vocabulary(train)}


def apply_preprocessing(data: TabularData, fitted: dict[str, Any]) -> TabularData:
    if not fitted:
        return apply_dense(data, [])
    return apply_vocabulary(apply_dense(data, fitted["dense"]), fitted["vocabulary"])


def describe(fitted: dict[str, Any]) -> str:
    """One line: which columns got log1p (all are standardized and clipped), and the
    vocabularies' sizes."""
    logged = [t["column"] for t in fitted["dense"] if t["log1p"]]
    shown = f"log1p on {', '.join(logged)}, then " if logged else ""
    parts = []
    if fitted["dense"]:
        parts.append(f"dense columns: {shown}standardized with training statistics, clipped "
                     "to +-5 sd")  # fmt: skip
    if fitted["vocabulary"]:
        sizes = ", ".join(f"{k} {len(v):,}" for k, v in fitted["vocabulary"].items())
        parts.append(f"training-split vocabularies ({sizes}; other values: out of vocabulary)")
    return "; ".join(parts)
