"""Categorical columns read by name: load + training-split vocabulary time, and the loader
with a multi-valued (multi-hot) column beside one-hot ones.

    .venv/bin/python bench/bench_vocab.py [--rows 200000] [--repeats 3]

Issue 12, item 2. A CSV of `--rows` rows (label, 2 dense columns, `user` with ~50,000
distinct values, `shop` with 100, `genres` with 1-4 of 30 genres per row as "g1|g7"),
written once to a temporary directory. Timed, medians over `--repeats`:

1. `load_tabular` + `fit_preprocessing` + `apply_preprocessing` on the three splits, with
   the one-hot columns only (user, shop): the baseline is the same script run from a tree
   without this change (`--one-hot-only` runs only this part and the one-hot loader, so it
   runs there too: `PYTHONPATH=<that checkout>`).
2. With `genres` as a multi-valued column as well.
3. The loader (batch 512, shuffled, one epoch of the training split): one-hot only vs with
   the multi-hot column; batches/s.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path

import numpy as np


def write_log(directory: Path, rows: int) -> Path:
    rng = np.random.default_rng(0)
    genres = np.array([f"g{i}" for i in range(30)])
    counts = rng.integers(1, 5, rows)
    cells = ["|".join(rng.choice(genres, k, replace=False)) for k in counts]
    lines = ["clicked,price,age,user,shop,genres"]
    users, shops = rng.zipf(1.3, rows) % 50_000, rng.integers(0, 100, rows)
    for i in range(rows):
        lines.append(f"{i % 2},{rng.normal():.3f},{i % 80},u{users[i]},s{shops[i]},{cells[i]}")
    path = directory / "log.csv"
    path.write_text("\n".join(lines) + "\n")
    return path


def schema(directory: Path, multi: bool) -> Path:
    text = "label: clicked\ndense: [price, age]\ncategorical:\n  - user\n  - shop\n"
    if multi:
        text += "  - {name: genres, multi_valued: true, pooling: mean}\n"
    path = directory / ("multi.yaml" if multi else "one_hot.yaml")
    path.write_text(text)
    return path


def prepared(csv: Path, schema_path: Path):
    from trainers.data import load_tabular
    from trainers.data.preprocess import apply_preprocessing, fit_preprocessing

    data = load_tabular(csv, schema_path)
    parts = data.split(method="ordered")
    fitted = fit_preprocessing(parts[0])
    return [apply_preprocessing(p, fitted) for p in parts]


def median_seconds(run, repeats: int) -> float:
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        run()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def loader_rate(train, repeats: int) -> float:
    loader = train.loader(512, shuffle=True, seed=0)
    seconds = median_seconds(lambda: sum(1 for _ in loader), repeats)
    return len(loader) / seconds


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rows", type=int, default=200_000)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--one-hot-only", action="store_true")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        directory = Path(tmp)
        csv = write_log(directory, args.rows)
        one_hot = schema(directory, multi=False)
        seconds = median_seconds(lambda: prepared(csv, one_hot), args.repeats)
        print(f"load + vocabulary, one-hot columns: {seconds:.2f} s")
        if args.one_hot_only:
            rate = loader_rate(prepared(csv, one_hot)[0], args.repeats)
            print(f"loader, batch 512 shuffled, one-hot only: {rate:,.0f} batches/s")
            return
        multi = schema(directory, multi=True)
        seconds = median_seconds(lambda: prepared(csv, multi), args.repeats)
        print(f"load + vocabulary, with the multi-valued column: {seconds:.2f} s")
        for name, path in (("one-hot only", one_hot), ("with multi-hot genres", multi)):
            rate = loader_rate(prepared(csv, path)[0], args.repeats)
            print(f"loader, batch 512 shuffled, {name}: {rate:,.0f} batches/s")


if __name__ == "__main__":
    main()
