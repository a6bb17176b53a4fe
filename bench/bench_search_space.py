"""Cost of sampling + validating and of building architectures, per space and per preset.

    .venv/bin/python bench/bench_search_space.py [--samples 300] [--repeats 5]

Targets (issue: foundation): sample + validate under 1 ms; build under 50 ms for the
presets on CPU. The reference column builds the preset's EmbeddingBagCollection alone, so
the difference is what ranknas adds on top of torchrec. Prints a Markdown table.
"""

from __future__ import annotations

import argparse
import logging
import platform
import statistics
import time

import torch

from search_space.architecture import analyze
from search_space.builder import build_model, embedding_bag_collection
from search_space.presets import PRESETS, preset
from search_space.schema import synthetic_schema
from search_space.spaces import SPACES, make_space


def per_call_ms(fn, calls: int, repeats: int) -> tuple[float, float]:
    """Median and spread (min..max) of the per-call time over `repeats` runs of `calls`."""
    runs = []
    for _ in range(repeats):
        start = time.perf_counter()
        for i in range(calls):
            fn(i)
        runs.append((time.perf_counter() - start) / calls * 1e3)
    return statistics.median(runs), max(runs) - min(runs)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--samples", type=int, default=300)
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    logging.getLogger("torch.fx._symbolic_trace").setLevel(logging.ERROR)
    schema = synthetic_schema()
    print(
        f"machine: {platform.processor() or platform.machine()}, "
        f"{torch.get_num_threads()} torch threads, torch {torch.__version__}"
    )
    print(f"schema: synthetic default ({schema.num_dense} dense, {schema.num_sparse} features)\n")

    print("| space | sample + validate (ms, median) | build sampled (ms, median) |")
    print("|---|---|---|")
    for name in SPACES:
        space = make_space({"type": name}, schema)
        sample, spread = per_call_ms(
            lambda i, s=space: analyze(s.sample(i)), args.samples, args.repeats
        )
        archs = [space.sample(i) for i in range(50)]
        build, build_spread = per_call_ms(lambda i, a=archs: build_model(a[i]), 50, args.repeats)
        print(
            f"| {name} | {sample:.3f} (±{spread / 2:.3f}) | {build:.1f} (±{build_spread / 2:.1f}) |"
        )

    print("\n| preset | build (ms, median) | EmbeddingBagCollection alone (ms) | ratio |")
    print("|---|---|---|---|")
    for name in PRESETS:
        arch = preset(name, schema)
        build, _ = per_call_ms(lambda i, a=arch: build_model(a), 10, args.repeats)
        alone, _ = per_call_ms(
            lambda i, a=arch: embedding_bag_collection(a.embedding), 10, args.repeats
        )
        print(f"| {name} | {build:.1f} | {alone:.1f} | {build / alone:.2f} |")


if __name__ == "__main__":
    main()
