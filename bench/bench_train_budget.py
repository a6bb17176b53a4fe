"""`ranknas train`'s budget: one epoch with the cosine schedule against early stopping.

    .venv/bin/python bench/bench_train_budget.py --seeds 0 1     # ~20 min on 2 cores

Issue 40 asks that `ranknas train`'s defaults train the presets to their potential: a
budget that early stopping ends, not a fixed example count. Every preset on the synthetic
data (200,000 rows, split 80/10/10), trained by `trainers.trainer.train` two ways with the
same learning rates:
- `one epoch, cosine`: the studies' protocol (the dense lr from its value to 0 over one
  epoch; six evaluations, patience 2);
- `until early stopping, plateau`: at most `--max-epochs` epochs, evaluated twice an epoch,
  the dense lr cut 10x at each evaluation that does not improve, stopped after 2 of them
  (the best evaluation's weights kept).
Prints validation and test NE (full splits), epochs trained and seconds, per preset and seed,
and the mean difference per preset.
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

from search_space.builder import build_model
from search_space.presets import PRESETS, preset
from trainers.data import SyntheticConfig, generate_synthetic
from trainers.trainer import TrainConfig, train

RECIPES = {
    "one epoch, cosine": lambda epochs: TrainConfig(max_epochs=1, device="cpu"),
    "until early stopping, cosine each epoch": lambda epochs: TrainConfig(
        max_epochs=epochs,
        evals=epochs,
        lr_schedule="cosine_restarts",
        early_stopping_patience=1,
        device="cpu",
    ),
}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, nargs="+", default=[0])
    parser.add_argument("--presets", nargs="+", default=sorted(PRESETS))
    parser.add_argument("--max-epochs", type=int, default=10)
    parser.add_argument("--recipes", nargs="+", default=list(RECIPES), choices=list(RECIPES))
    args = parser.parse_args()
    torch.set_num_threads(1)
    train_part, valid, test = generate_synthetic(SyntheticConfig(rows=200_000)).split()
    epoch = len(train_part)
    print("| preset | recipe | seed | validation NE | test NE | epochs | seconds |")
    print("|---|---|---|---|---|---|---|")
    found: dict[tuple[str, str], list[float]] = {}
    for name in args.presets:
        for recipe in args.recipes:
            make = RECIPES[recipe]
            for seed in args.seeds:
                config = make(args.max_epochs)
                config.seed = seed
                model = build_model(preset(name, train_part.schema), seed=seed)
                started = time.perf_counter()
                result = train(model, train_part, valid, test, config)
                found.setdefault((name, recipe), []).append(result.validation["ne"])
                print(f"| {name} | {recipe} | {seed} | {result.validation['ne']:.4f} | "
                      f"{result.test['ne']:.4f} | {result.examples / epoch:.1f} | "
                      f"{time.perf_counter() - started:.0f} |", flush=True)  # fmt: skip
    print("\nmean validation NE over the seeds (the difference to the first recipe)\n")
    print(f"| preset | {' | '.join(args.recipes)} |\n|---|{'---|' * len(args.recipes)}")
    for name in args.presets:
        means = [statistics.fmean(found[name, r]) for r in args.recipes]
        shown = [f"{m:.4f}" + (f" ({m - means[0]:+.4f})" if i else "") for i, m in enumerate(means)]
        print(f"| {name} | {' | '.join(shown)} |")


if __name__ == "__main__":
    main()
