"""Ranking metrics: NE, logloss, AUC, calibration (scikit-learn computes the AUC)."""

from __future__ import annotations

import math

import numpy as np
from sklearn.metrics import roc_auc_score


def entropy(rate: float) -> float:
    """Binary entropy (nats) of a base rate: the logloss of always predicting it."""
    if rate <= 0.0 or rate >= 1.0:
        return 0.0
    return -(rate * math.log(rate) + (1 - rate) * math.log(1 - rate))


def ranking_metrics(probabilities: np.ndarray, labels: np.ndarray) -> dict[str, float]:
    """NE (logloss over the entropy of the observed base rate), logloss, AUC and
    calibration (mean predicted CTR over observed CTR) of one evaluation set."""
    if labels.shape[0] == 0:
        raise ValueError("no rows to evaluate")
    labels = labels.astype(np.float64)
    base_rate = float(labels.mean())
    if not np.isfinite(probabilities).all():  # a diverged model: say so, do not raise
        nan = float("nan")
        return {"ne": nan, "logloss": nan, "auc": nan, "calibration": nan,
                "base_rate": base_rate, "examples": float(labels.shape[0])}  # fmt: skip
    probabilities = np.clip(probabilities.astype(np.float64), 1e-7, 1 - 1e-7)
    # the mean cross-entropy in numpy: scikit-learn's log_loss gives the same number after
    # checks that take 4 of the 12 ms of these metrics on 20,000 rows (a GPU trial runs 8)
    logloss = float(-np.mean(labels * np.log(probabilities)
                             + (1 - labels) * np.log1p(-probabilities)))  # fmt: skip
    both_classes = 0.0 < base_rate < 1.0
    return {
        "ne": logloss / entropy(base_rate) if both_classes else float("nan"),
        "logloss": logloss,
        "auc": float(roc_auc_score(labels, probabilities)) if both_classes else float("nan"),
        "calibration": float(probabilities.mean()) / base_rate if base_rate > 0 else float("nan"),
        "base_rate": base_rate,
        "examples": float(labels.shape[0]),
    }
