"""The dot interaction's pair selection: one index_select of the flattened products (now)
against indexing them by rows and columns (before), side by side in one process.

    .venv/bin/python bench/bench_dot_interaction.py            # ~4 min on 2 shared cores

1. The dense part's training step (`cost_models.latency.model`'s, what a step-time study
   times) of each preset that reads a dot interaction, on the default synthetic schema (16
   categorical features) and on the co-design schema (26, `bench/codesign.yaml`): the two
   selections timed a step at a time in turn, the ratio of their medians, per repeat.
2. `trainers.trainer.train` on synthetic rows: examples/s of a whole training run (lookups,
   optimizers and loader included), the two selections alternating run by run.

One torch thread (as a study's trial on this machine). Prints Markdown: medians of the
repeats, "±" half their spread (max − min).
"""

from __future__ import annotations

import argparse
import platform
import statistics
from collections.abc import Iterator
from contextlib import contextmanager

import torch

import search_space.blocks as blocks
from cost_models.latency.model import _dense_steps, _times_ms
from search_space.builder import build_model
from search_space.presets import preset
from trainers.data import SyntheticConfig, generate_synthetic
from trainers.trainer import TrainConfig, train

CODESIGN_CARDINALITIES = (1460, 583, 101312, 22026, 305, 24, 10000, 633, 3, 10000, 5683, 83515,
                          3194, 27, 10000, 54613, 10, 5652, 2173, 4, 70465, 18, 15, 10000, 105,
                          10000)  # fmt: skip
PRESETS = ("dlrm", "dhen")  # the presets whose blocks select pairs of inner products


def rows_and_columns(x: torch.Tensor, pairs: torch.Tensor) -> torch.Tensor:
    """The selection before: the products indexed by the pairs' rows and columns."""
    n = x.shape[1]
    return torch.bmm(x, x.transpose(1, 2))[:, pairs // n, pairs % n]


@contextmanager
def selection(name: str) -> Iterator[None]:
    now = blocks.pairwise_dot
    blocks.pairwise_dot = rows_and_columns if name == "before" else now
    try:
        yield
    finally:
        blocks.pairwise_dot = now


def fmt(values: list[float], digits: int) -> str:
    half = (max(values) - min(values)) / 2
    return f"{statistics.median(values):,.{digits}f} (±{half:,.{digits}f})"


def dense_steps(schema, repeats: int, steps: int) -> list[list[str]]:
    cpu, table = torch.device("cpu"), []
    for name in PRESETS:
        arch = preset(name, schema)
        ms: dict[str, list[float]] = {"before": [], "now": []}
        for _ in range(repeats):
            first, second = _dense_steps([arch, arch], 512, cpu)  # two copies of the model

            def before(step=first) -> None:
                with selection("before"):
                    step()

            for key, times in zip(ms, _times_ms([before, second], cpu, 3, steps), strict=True):
                ms[key].append(statistics.median(times))
        ratios = [n / b for n, b in zip(ms["now"], ms["before"], strict=True)]
        table.append([name, str(len(schema.categorical)), fmt(ms["before"], 3),
                      fmt(ms["now"], 3), fmt(ratios, 3)])  # fmt: skip
    return table


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--steps", type=int, default=30, help="dense steps of each, in turn")
    parser.add_argument("--rows", type=int, default=100_000)
    parser.add_argument("--train-repeats", type=int, default=3)
    args = parser.parse_args()
    torch.set_num_threads(1)
    print(f"Machine: {platform.processor() or platform.machine()}, torch {torch.__version__}, "
          "1 thread\n")  # fmt: skip

    print("| preset | categorical features | dense step before, ms | now, ms | now / before |")
    print("|---|---|---|---|---|")
    schemas = [
        SyntheticConfig(rows=10).schema,
        SyntheticConfig(rows=10, cardinalities=CODESIGN_CARDINALITIES).schema,
    ]
    for schema in schemas:
        for row in dense_steps(schema, args.repeats, args.steps):
            print("| " + " | ".join(row) + " |")

    data = generate_synthetic(SyntheticConfig(rows=args.rows, seed=0))
    splits = data.split((0.8, 0.1, 0.1), seed=0)
    print(f"\n`train`, {args.rows:,} synthetic rows (80% trained, one epoch), batch 512:\n")
    print("| preset | examples/s before | now | now / before |")
    print("|---|---|---|---|")
    for name in PRESETS:
        speed = {"before": [], "now": []}
        for _ in range(args.train_repeats):
            for key in ("before", "now"):
                with selection(key):
                    model = build_model(preset(name, data.schema), seed=0)
                    config = TrainConfig(batch_size=512, max_epochs=1, seed=0, device="cpu",
                                         evals=1)  # fmt: skip
                    speed[key].append(train(model, *splits, config).throughput)
        ratios = [n / b for n, b in zip(speed["now"], speed["before"], strict=True)]
        print(f"| {name} | {fmt(speed['before'], 0)} | {fmt(speed['now'], 0)} | "
              f"{fmt(ratios, 3)} |")  # fmt: skip


if __name__ == "__main__":
    main()
