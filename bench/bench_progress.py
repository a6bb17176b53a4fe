"""What the progress display costs a training run.

    .venv/bin/python bench/bench_progress.py            # ~2 min on 2 shared cores

1. `Bar.update`, the call the training loop makes every step, timed per call (best of 5
   runs of 300,000 calls) with the display off (a library call), as plain lines (a log)
   and as a tqdm bar (a terminal; drawn into memory, at most 4 times a second); and one
   redraw of the tqdm bar (median of 2,000), which happens at most 4 times a second.
2. `trainers.trainer.train` on the dlrm preset (synthetic data, batch 512, 150 steps, one
   torch thread) with each display, in rounds whose order rotates; the median time per
   step of each, and the ratio to "off" within each round (median).

Prints Markdown.
"""

from __future__ import annotations

import argparse
import io
import logging
import os
import statistics
import time

import torch

from search_space.builder import build_model
from search_space.presets import preset
from trainers import progress
from trainers.data import SyntheticConfig, generate_synthetic
from trainers.trainer import TrainConfig, train

MODES = ("off", "lines", "terminal")


def display(mode: str) -> None:
    if mode == "off":
        progress.configure(enabled=False)
    else:
        progress.configure(stream=io.StringIO(), terminal=mode == "terminal", line_seconds=10)


def update_ns(mode: str, calls: int = 300_000) -> float:
    display(mode)
    best = float("inf")
    for _ in range(5):
        with progress.bar(10**12, "bench", "examples") as bar:
            started = time.perf_counter()
            for _ in range(calls):
                bar.update(512)
            best = min(best, (time.perf_counter() - started) / calls)
    return best * 1e9


def redraw_us(draws: int = 2000) -> float:
    display("terminal")
    times = []
    with progress.bar(10**9, "bench", "examples") as bar:
        bar.show("loss", 0.4521)
        bar.show("val NE", 0.8712)
        for _ in range(draws):
            bar.n += 512
            started = time.perf_counter()
            bar._draw()
            times.append(time.perf_counter() - started)
    return statistics.median(times) * 1e6


def step_ms(mode: str, splits, steps: int) -> float:
    display(mode)
    train_part, valid, _ = splits
    model = build_model(preset("dlrm", train_part.schema), seed=0)
    config = TrainConfig(max_steps=steps, evals=1, device="cpu", seed=0)
    result = train(model, train_part, valid, config=config)
    return result.train_seconds / result.steps * 1e3


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--steps", type=int, default=150)
    parser.add_argument("--rounds", type=int, default=9)
    args = parser.parse_args()
    logging.getLogger("torch.fx._symbolic_trace").setLevel(logging.ERROR)
    torch.set_num_threads(1)
    load = os.getloadavg()[0]
    print("# Progress display cost\n")
    print("| display | `Bar.update` per call (ns) |")
    print("|---|---|")
    for mode in MODES:
        print(f"| {mode} | {update_ns(mode):.0f} |")
    drawn = redraw_us()
    print(f"\nOne redraw of the tqdm bar: {drawn:.0f} µs; at 4 a second, "
          f"{drawn * 4 / 1e4:.3f}% of the run's time.")  # fmt: skip
    splits = generate_synthetic(SyntheticConfig(rows=200_000)).split()
    step_ms("off", splits, 20)  # warm-up
    times: dict[str, list[float]] = {m: [] for m in MODES}
    for i in range(args.rounds):
        for mode in MODES[i % 3 :] + MODES[: i % 3]:
            times[mode].append(step_ms(mode, splits, args.steps))
    progress.configure(enabled=False)
    print(f"\ndlrm, batch 512, {args.steps} steps, {args.rounds} rotated rounds, 1 torch thread "
          f"(load average {load:.1f} before, {os.getloadavg()[0]:.1f} after):\n")  # fmt: skip
    print("| display | ms / step (median) | / off, same round (median, range) |")
    print("|---|---|---|")
    for mode in MODES:
        ratio = [t / o for t, o in zip(times[mode], times["off"], strict=True)]
        print(f"| {mode} | {statistics.median(times[mode]):.2f} | "
              f"{statistics.median(ratio):.3f} ({min(ratio):.3f}–{max(ratio):.3f}) |")  # fmt: skip


if __name__ == "__main__":
    main()
