"""Preprocessing fitted on the training split: one transform per dense column.

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
from trainers.data.dataset import TabularData

COUNT_RATIO = 10.0


def fit_dense(train: TabularData) -> list[dict[str, Any]]:
    """A transform per dense column of `train` (JSON-ready: column, log1p, mean, std)."""
    transforms = []
    for k, column in enumerate(train.schema.dense):
        x = train.dense[:, k].astype(np.float64)
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
    dense = transform_dense(torch.from_numpy(data.dense), transforms).numpy()
    return replace(data, dense=dense)


def describe(transforms: list[dict[str, Any]]) -> str:
    """One line: which columns got log1p; all are standardized and clipped."""
    logged = [t["column"] for t in transforms if t["log1p"]]
    shown = f"log1p on {', '.join(logged)}, then " if logged else ""
    return f"dense columns: {shown}standardized with training statistics, clipped to +-5 sd"
