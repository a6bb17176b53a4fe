"""Logistic regression: ranknas's preset against scikit-learn's on the same split.

    .venv/bin/python bench/bench_lr_reference.py        # ~2 min on 2 cores
    .venv/bin/ranknas data synth --out /tmp/c --rows 200000 --format criteo
    .venv/bin/python bench/bench_lr_reference.py --data criteo:/tmp/c/data.tsv

Issue 40 asks that the presets reach their potential under `ranknas train`; logistic
regression is the one an outside library fits to convergence. Both read the same split
(the synthetic data: 200,000 rows split 80/10/10 at random; a file: as `ranknas train`
splits and preprocesses it, in file order with dense columns log1p'd where count-like and
standardized): scikit-learn's `LogisticRegression` (lbfgs) on the dense columns and one-hot
categorical ids, at two regularizations; the preset trained by `trainers.trainer.train`
for one epoch (the studies' protocol) and until early stopping (`ranknas train`'s default
without a budget), at two embedding learning rates. Prints validation and test NE.
"""

from __future__ import annotations

import argparse
import itertools
import time

import scipy.sparse as sp
from sklearn.linear_model import LogisticRegression
from sklearn.preprocessing import OneHotEncoder

from nas.protocol import fit_on_training, split_method
from search_space.builder import build_model
from search_space.presets import preset
from trainers.config import UNTIL_STOPPED
from trainers.data import SyntheticConfig, generate_synthetic, load_dataset
from trainers.data.preprocess import apply_preprocessing
from trainers.metrics import ranking_metrics
from trainers.trainer import TrainConfig, train


def splits(source: str) -> tuple:
    """The training, validation and test rows `ranknas train --data SOURCE` trains on."""
    if source == "synthetic":
        return generate_synthetic(SyntheticConfig(rows=200_000)).split()
    data = load_dataset(source, None)
    method = split_method("auto", data, source)
    parts = data.split(seed=0, method=method)
    fitted = fit_on_training(parts[0], "auto", source)
    return tuple(apply_preprocessing(part, fitted) for part in parts)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data", default="synthetic", help="synthetic or criteo:PATH")
    train_part, valid, test = splits(parser.parse_args().data)
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
    runs = {"1 epoch": {"max_epochs": 1}, "until early stopping": UNTIL_STOPPED}
    for (name, budget), sparse_lr in itertools.product(runs.items(), (0.05, 0.2)):
        model = build_model(preset("logistic_regression", train_part.schema), seed=0)
        config = TrainConfig(sparse_lr=sparse_lr, device="cpu", **budget)
        result = train(model, train_part, valid, test, config)
        print(f"| ranknas logistic_regression, {name}, sparse lr {sparse_lr} | "
              f"{result.validation['ne']:.4f} | {result.test['ne']:.4f} | {result.steps} steps, "
              f"stopped early: {result.stopped_early} |", flush=True)  # fmt: skip


if __name__ == "__main__":
    main()
