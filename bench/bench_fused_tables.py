"""The trainer on CPU with fused embedding tables (`trainers.fused_tables`) against torch's
tables (sparse gradients, torch Adagrad): examples per second and where each run ends.

    .venv/bin/python bench/bench_fused_tables.py            # ~4 min on 2 cores
    .venv/bin/python bench/bench_fused_tables.py --steps 400 --repeats 7

Each round trains every preset twice with `trainers.trainer.train` (the same model seed,
batches and steps, one torch thread): once as the trainer does on CPU (fused tables) and
once with torch's tables (`FusedTables.fits` patched to say no), in an order that
alternates from round to round. Throughput is `TrainResult.throughput` (evaluations
excluded); the speed-up is the ratio within a round, median over rounds (± half the
spread). Both runs of a round must end at the same validation NE up to float rounding
(the same arithmetic, summed in another order): the largest difference is printed.

Prints Markdown.
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics

import torch

from search_space.builder import build_model
from search_space.presets import preset
from trainers import progress
from trainers.data import SyntheticConfig, generate_synthetic
from trainers.fused_tables import FusedTables
from trainers.trainer import TrainConfig, train

PRESETS = ("dlrm", "deepfm", "dcnv2", "dhen", "wukong")


def run(name: str, data, config: TrainConfig, fused: bool) -> tuple[float, float]:
    """Examples per second and validation NE of one training run."""
    fits = FusedTables.fits
    if not fused:
        FusedTables.fits = staticmethod(lambda ebc: False)
    try:
        train_part, valid, _ = data
        model = build_model(preset(name, train_part.schema), seed=0)
        result = train(model, train_part, valid, config=config)
    finally:
        FusedTables.fits = fits
    assert result.status == "complete", result.failure_reason
    return result.throughput, result.validation["ne"]


def half_spread(values: list[float]) -> float:
    return (max(values) - min(values)) / 2


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--rows", type=int, default=200_000)
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--presets", default=",".join(PRESETS))
    args = parser.parse_args()
    torch.set_num_threads(1)
    progress.configure(enabled=False)
    data = generate_synthetic(SyntheticConfig(rows=args.rows, seed=0)).split()
    config = TrainConfig(batch_size=512, max_steps=args.steps, evals=1)
    print(f"Machine: {platform.processor() or platform.machine()}, {os.cpu_count()} cores, "
          f"torch {torch.__version__}, 1 thread; {args.rows:,} synthetic rows, "
          f"{args.steps} steps x 512, {args.repeats} rounds\n")  # fmt: skip
    print(
        "| preset | torch tables (ex/s) | fused tables (ex/s) | speed-up | max val NE difference |"
    )
    print("|---|---|---|---|---|")
    for name in args.presets.split(","):
        speeds: dict[bool, list[float]] = {True: [], False: []}
        ratios, ne_gap = [], 0.0
        for round_ in range(args.repeats):
            order = (True, False) if round_ % 2 == 0 else (False, True)
            results = {fused: run(name, data, config, fused) for fused in order}
            for fused, (speed, _) in results.items():
                speeds[fused].append(speed)
            ratios.append(results[True][0] / results[False][0])
            ne_gap = max(ne_gap, abs(results[True][1] - results[False][1]))
        cells = [f"{statistics.median(speeds[f]):,.0f} (±{half_spread(speeds[f]):,.0f})"
                 for f in (False, True)]  # fmt: skip
        cells += [f"**{statistics.median(ratios):.2f}x** ({min(ratios):.2f}-{max(ratios):.2f})",
                  f"{ne_gap:.5f}"]  # fmt: skip
        print(f"| {name} | " + " | ".join(cells) + " |", flush=True)


if __name__ == "__main__":
    main()
