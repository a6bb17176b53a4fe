"""Preprocessing fitted on the training split: one transform per dense column, and the
vocabulary (or the hashing) of each categorical column read by name.

`fit_dense` chooses and fits them (`log1p` where a column is heavy-tailed like a count or
an amount: non-negative numbers whose maximum is over `COUNT_RATIO` times their median plus
one; a year is not one), `apply_dense` runs
`search_space.preprocessing.transform_dense` on a split. Validation and test rows are
transformed with the training split's statistics; nothing is fitted on them.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import replace
from typing import Any

import numpy as np
import torch

from search_space.preprocessing import (
    CLIP,
    FIRST_ID,
    MISSING_ID,
    OOV_ID,
    encode_value,
    number_form,
    number_forms,
    transform_dense,
)
from trainers.data.dataset import Jagged, RawColumn, TabularData
from trainers.data.report import warn_constant_categorical, warn_constant_dense, warn_far_dense

COUNT_RATIO = 10.0
FAR_RATIO = 10.0  # a standard deviation this many times its central values': far values in it
TRIM = 0.005  # the central values: between these quantiles
FAR_SHARE = 0.01  # at most this share of a column is "far"; more are a part of it
UNSEEN_GAP = 0.3  # test values unseen in training: this share more than validation's is said
logger = logging.getLogger(__name__)


def fit_dense(train: TabularData) -> list[dict[str, Any]]:
    """A transform per dense column of `train` (JSON-ready: column, log1p, mean, std), from
    its present values (blanks, NaN here, are filled with the mean by the transform)."""
    transforms, constant, far = [], [], {}
    for k, column in enumerate(train.schema.dense):
        x = train.dense[:, k].astype(np.float64)
        x = x[~np.isnan(x)]
        if not len(x) or x.min() == x.max():
            constant.append(column)
        if not len(x):
            transforms.append(dense_transform(column, False, 0.0, 1.0))
            continue
        log1p = is_heavy_tailed(x.min(), x.max(), np.median(x))
        y = np.log1p(x) if log1p else x
        mean, std, far[column] = scaled_without_far_values(y, float(y.mean()), float(y.std()))
        transforms.append(dense_transform(column, log1p, mean, std))
    warn_constant_dense(_source(train), constant)
    warn_far_dense(_source(train), far)
    return transforms


def _source(train: TabularData) -> str:
    """What a warning about `train` names: its file, or its data set."""
    return train.bad_rows.source if train.bad_rows else f"data set {train.schema.name!r}"


def scaled_without_far_values(
    values: np.ndarray, mean: float, std: float
) -> tuple[float, float, np.ndarray]:
    """The mean and standard deviation to standardize a column by, and its values left out
    of them. A few values far from all others (a sentinel such as 1e15 for "unknown", in a
    column with negative numbers, which log1p does not take) made the standard deviation
    so large that every other row's value became one point: the model saw a constant.
    Where the standard deviation is over `FAR_RATIO` times that of the values between
    the column's `TRIM` and 1 - `TRIM` quantiles (normal data: 1.07; Student's t with 3
    degrees of freedom: 1.3), the values beyond `FAR_RATIO` of those from the median are
    left out (the transform clips them), if they are at most `FAR_SHARE` of the column:
    more are a part of its distribution (a second cluster), not a code."""
    low, median, high = np.quantile(values, [TRIM, 0.5, 1 - TRIM])
    central = values[(values >= low) & (values <= high)]
    spread = float(central.std()) if len(central) else 0.0
    if spread <= 0 or std <= FAR_RATIO * spread:
        return mean, std, values[:0]
    far = np.abs(values - median) > FAR_RATIO * spread
    if not far.any() or far.mean() > FAR_SHARE:
        return mean, std, values[:0]
    kept = values[~far]
    return float(kept.mean()), float(kept.std()), values[far]


def is_heavy_tailed(low: float, high: float, median: float) -> bool:
    """Counts and amounts (non-negative, a long right tail: visits, prices, durations) get
    log1p, as Criteo models do for counts; standardized raw, a few large values would
    squeeze every other row's value towards one point."""
    return bool(low >= 0 and high > COUNT_RATIO * (median + 1))


def dense_transform(column: str, log1p: bool, mean: float, std: float) -> dict[str, Any]:
    """One column's transform as JSON; a constant column keeps std 1."""
    return {"column": column, "log1p": log1p, "mean": mean, "std": std if std > 1e-9 else 1.0}


def apply_dense(data: TabularData, transforms: list[dict[str, Any]]) -> TabularData:
    """`data` with its dense columns transformed; without transforms, blanks become 0."""
    if not transforms:
        return replace(data, dense=np.nan_to_num(data.dense, nan=0.0))
    dense = transform_dense(torch.from_numpy(data.dense), transforms).numpy()
    return replace(data, dense=dense)


def column_vocabulary(raw: RawColumn) -> list[str]:
    """The values of `raw` seen at least its `min_count` times, most frequent first (ties:
    first seen first); value k gets id k + 2 (id 0: missing, 1: out of vocabulary). A
    multi-valued column counts items."""
    codes = raw.codes.values
    counts = np.bincount(codes[codes >= 0], minlength=len(raw.values))
    order = np.argsort(-counts, kind="stable")
    return [raw.values[i] for i in order if counts[i] >= raw.min_count]


def column_ids(raw: RawColumn, vocabulary: list[str], buckets: int | None) -> np.ndarray:
    """The id of each item of `raw`: through `vocabulary` or hashed into `buckets`, value by
    value with the function the exported model runs."""
    if buckets is not None:
        lookup = np.asarray([encode_value(v, None, buckets) for v in raw.values], np.int64)
    else:  # the values are stripped and present: encode_value would only look them up
        lookup = vocabulary_ids(vocabulary_positions(vocabulary), raw.values)
    return item_ids(lookup, raw.codes.values)


def vocabulary_positions(vocabulary: Sequence[Any]) -> Any:
    """A training vocabulary as a pandas Index, for `vocabulary_ids`."""
    import pandas as pd

    return pd.Index(vocabulary)


def vocabulary_ids(positions: Any, values: Sequence[Any]) -> np.ndarray:
    """Each value's id: FIRST_ID + its place in the vocabulary (`vocabulary_positions`),
    OOV_ID where it is not there (the same ids as the exported model's index)."""
    found = positions.get_indexer(values)
    return np.where(found >= 0, found + FIRST_ID, OOV_ID).astype(np.int64)


def item_ids(lookup: np.ndarray, codes: np.ndarray) -> np.ndarray:
    """Per item, the id of its code's value in `lookup`; code -1 (missing): MISSING_ID."""
    return np.append(lookup, MISSING_ID)[np.where(codes >= 0, codes, len(lookup))]


def fit_vocabulary(train: TabularData) -> dict[str, list[str]]:
    """Per categorical column read by name and not hashed: `column_vocabulary` of its
    training rows."""
    return {
        name: column_vocabulary(raw)
        for name, raw in train.raw_values.items()
        if raw.hash_size is None
    }


def apply_vocabulary(
    data: TabularData, vocabulary: dict[str, list[str]], hashing: dict[str, int] | None = None
) -> TabularData:
    """`data` with the ids of its columns read by name from `vocabulary` (a value not in
    it, such as one never seen in training, gets the out-of-vocabulary id) or hashed
    (`hashing`: column -> buckets), value by value with the exported model's function."""
    hashing = hashing or {}
    if not vocabulary and not hashing:
        return data
    categorical = data.categorical.copy()
    features = list(data.schema.categorical)
    multi_hot = dict(data.multi_hot)
    for k, feature in enumerate(features):
        raw = data.raw_values.get(feature.name)
        if raw is None or (feature.name not in vocabulary and feature.name not in hashing):
            continue
        buckets = hashing.get(feature.name)
        known = vocabulary.get(feature.name, [])
        ids = column_ids(raw, known, buckets)
        if raw.multi_valued:
            multi_hot[feature.name] = Jagged(raw.codes.offsets, ids)
            categorical[:, k] = -1
        else:
            categorical[:, k] = ids
        cardinality = buckets if buckets is not None else len(known) + FIRST_ID
        features[k] = replace(feature, cardinality=cardinality)
    schema = replace(data.schema, categorical=tuple(features))
    return replace(data, categorical=categorical, schema=schema, multi_hot=multi_hot)


def fit_categorical(train: TabularData) -> dict[str, Any]:
    """How the columns read by name become ids, as JSON: vocabularies (min-count applied),
    hashed columns' buckets and how their file wrote whole numbers (served ones are
    hashed as written so), min-counts above 1, multi-valued columns' separators."""
    raws = train.raw_values.items()
    warn_constant_categorical(_source(train), [n for n, raw in raws if _one_value(raw)])
    return {
        "vocabulary": fit_vocabulary(train),
        "hashing": {n: raw.hash_size for n, raw in raws if raw.hash_size is not None},
        "whole_numbers": {
            n: form
            for n, raw in raws
            if raw.hash_size is not None and (form := number_form(number_forms(raw.values)))
        },
        "min_count": {n: raw.min_count for n, raw in raws if raw.min_count > 1},
        "multi_valued": {n: {"separator": raw.separator} for n, raw in raws if raw.multi_valued},
    }


def _one_value(raw: RawColumn) -> bool:
    """A single-valued column with one value and no blank in every training row."""
    codes = raw.codes.values
    return (
        not raw.multi_valued
        and len(codes) > 0
        and bool((codes >= 0).all())
        and (len(np.unique(codes)) == 1)
    )


def fit_preprocessing(train: TabularData, dense: bool = True) -> dict[str, Any]:
    """Everything fitted on the training split, as JSON: dense transforms (`dense=False`:
    none, the values as read), vocabularies and hashing (`fit_categorical`)."""
    return {"dense": fit_dense(train) if dense else []} | fit_categorical(train)


def apply_preprocessing(data: TabularData, fitted: dict[str, Any]) -> TabularData:
    if not fitted:
        return apply_dense(data, [])
    categorical = apply_vocabulary(data, fitted["vocabulary"], fitted.get("hashing"))
    return apply_dense(categorical, fitted["dense"])


def warn_unseen_in_test(valid: TabularData, test: TabularData, fitted: dict[str, Any]) -> None:
    """Name the columns read through a vocabulary whose test values the training rows never
    saw far more often than validation's (a test file of other items, all out of
    vocabulary, raised test NE without a word): validation chooses the models, and the
    test then measures them on rows unlike those."""
    names = [f.name for f in valid.schema.categorical]
    for name in fitted.get("vocabulary") or {}:
        k = names.index(name)
        if valid.schema.categorical[k].multi_valued or not len(valid) or not len(test):
            continue
        shares = [float((part.categorical[:, k] == OOV_ID).mean()) for part in (valid, test)]
        if shares[1] - shares[0] > UNSEEN_GAP:
            logger.warning("%s: %.0f%% of the test rows' %s values are unseen in training "
                           "(validation: %.0f%%): the test measures rows unlike those the "
                           "models were chosen on; check that the files belong together",
                           test.bad_rows.source if test.bad_rows else "the test split",
                           100 * shares[1], name, 100 * shares[0])  # fmt: skip


def describe(fitted: dict[str, Any]) -> str:
    """One line: which columns got log1p (all are standardized and clipped, but Criteo's
    counts), and the vocabularies' sizes."""
    fixed = [t["column"] for t in fitted["dense"] if t.get("clip", CLIP) is None]  # Criteo's
    logged = [t["column"] for t in fitted["dense"] if t["log1p"] and t["column"] not in fixed]
    shown = f"log1p on {', '.join(logged)}, then " if logged else ""
    parts = []
    if fixed:
        parts.append(f"dense columns {fixed[0]}..{fixed[-1]}: log(1 + max(x, 0)), a blank 0")
    if len(fixed) < len(fitted["dense"]):
        parts.append(f"dense columns: {shown}standardized with training statistics, clipped "
                     "to +-5 sd")  # fmt: skip
    if fitted["vocabulary"]:
        counts = {fitted.get("min_count", {}).get(k) for k in fitted["vocabulary"]}
        one = counts.pop() if len(counts) == 1 else None  # said once (26 Criteo columns)
        sizes = ", ".join(
            f"{k} {len(v):,}"
            + (f" (min count {m})" if (m := fitted.get("min_count", {}).get(k)) and not one
               else "")
            for k, v in fitted["vocabulary"].items()
        )  # fmt: skip
        each = f", min count {one}" if one else ""
        parts.append(f"training-split vocabularies{each} ({sizes}; other values: out of "
                     "vocabulary)")  # fmt: skip
    if fitted.get("hashing"):
        by_size: dict[int, list[str]] = {}
        for column, buckets in fitted["hashing"].items():
            by_size.setdefault(buckets, []).append(column)
        hashed = "; ".join(f"{', '.join(c)} into {n:,} buckets" for n, c in by_size.items())
        parts.append(f"hashed: {hashed}")
    return "; ".join(parts)
