"""Logistic regression: ranknas's preset against scikit-learn's on the same split.

    .venv/bin/python bench/bench_lr_reference.py        # ~2 min on 2 cores

Issue 40 asks that the presets reach their potential under `ranknas train`; logistic
regression is the one an outside library fits to convergence. Both read the synthetic data
(200,000 rows, split 80/10/10): scikit-learn's `LogisticRegression` (lbfgs) on the dense
columns and one-hot categorical ids, at two regularizations; the preset trained by
`trainers.trainer.train` for one epoch (the studies' protocol) and for up to five with
early stopping, at two embedding learning rates. Prints validation and test NE.
"""

from __future__ import annotations

import time

import scipy.sparse as sp
from sklearn.linear_model import LogisticRegression
from sklearn.preprocessing import OneHotEncoder

from search_space.builder import build_model
from search_space.presets import preset
from trainers.data import SyntheticConfig, generate_synthetic
from trainers.metrics import ranking_metrics
from trainers.trainer import TrainConfig, train


def main() -> None:
    train_part, valid, test = generate_synthetic(SyntheticConfig(rows=200_000)).split()
    encoder = OneHotEncoder(handle_unknown="ignore").fit(train_part.categorical)

    def features(data):
        return sp.hstack([sp.csr_matrix(data.dense), encoder.transform(data.categorical)]).tocsr()

    def ne(model, data) -> float:
        return ranking_metrics(model.predict_proba(features(data))[:, 1], data.labels)["ne"]

    print("| model | validation NE | test NE | notes |\n|---|---|---|---|")
    for c in (0.1, 1.0):
        started = time.perf_counter()
        fitted = LogisticRegression(C=c, max_iter=300).fit(features(train_part), train_part.labels)
        print(f"| scikit-learn LR, C={c} | {ne(fitted, valid):.4f} | {ne(fitted, test):.4f} | "
              f"{time.perf_counter() - started:.0f} s |", flush=True)  # fmt: skip
    for epochs, sparse_lr in ((1, 0.05), (5, 0.05), (5, 0.2)):
        model = build_model(preset("logistic_regression", train_part.schema), seed=0)
        config = TrainConfig(max_epochs=epochs, sparse_lr=sparse_lr, device="cpu")
        result = train(model, train_part, valid, test, config)
        print(f"| ranknas logistic_regression, {epochs} epoch(s), sparse lr {sparse_lr} | "
              f"{result.validation['ne']:.4f} | {result.test['ne']:.4f} | {result.steps} steps, "
              f"stopped early: {result.stopped_early} |", flush=True)  # fmt: skip


if __name__ == "__main__":
    main()
