"""How well the learned latency predictor ranks and sizes architectures it has not seen.

Samples architectures from a DAG space, measures each (forward, a training step, and the
dense part's training step) on this machine, fits the predictor and the FLOPs-only baseline
on a share of them, and reports held-out MAPE and Kendall tau, medians over several random
splits. A second measurement of some architectures gives the noise floor: how well one
measurement predicts another.

    .venv/bin/python bench/bench_latency.py [--archs 150] [--space examples/space_dag.yaml]

About a minute on 2 shared CPU cores (one torch thread). Prints Markdown. `--device cuda`
times them on a GPU instead (eager steps, each synchronized).

With `--config STUDY.yaml --bases dlrm,dcnv2` the architectures come from the study's
`around` space around each of those bases (--archs each), sized by the study's data
schema, and `--save FILE` writes the dense-step predictor fitted on all of them: the
study's `sharding.dense_model`.
"""

from __future__ import annotations

import argparse
import time

import numpy as np

from cost_models.latency.model import (
    TARGETS,
    FlopsBaseline,
    LatencyPredictor,
    collect,
    holdout_split,
    measure_latency,
)
from cost_models.sharding.cost_net import errors
from search_space.schema import synthetic_schema
from search_space.spaces import load_space, make_space


def held_out(archs, latencies, holdout: float, seeds: int) -> dict[str, dict[str, float]]:
    """Median over `seeds` splits of each model's held-out errors."""
    results: dict[str, list[dict[str, float]]] = {"predictor": [], "flops_baseline": []}
    for seed in range(seeds):
        train, test = holdout_split(len(archs), holdout, seed)
        fit_archs, fit_y = [archs[i] for i in train], [latencies[i] for i in train]
        test_archs, test_y = [archs[i] for i in test], [latencies[i] for i in test]
        predictor = LatencyPredictor().fit(fit_archs, fit_y)
        baseline = FlopsBaseline().fit(fit_archs, fit_y)
        results["predictor"].append(predictor.evaluate(test_archs, test_y))
        results["flops_baseline"].append(baseline.evaluate(test_archs, test_y))
    return {
        name: {key: float(np.median([r[key] for r in runs])) for key in runs[0]}
        for name, runs in results.items()
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--space", default="examples/space_dag.yaml")
    parser.add_argument("--archs", type=int, default=150)
    parser.add_argument("--batch-size", type=int, default=512)
    parser.add_argument("--holdout", type=float, default=0.25)
    parser.add_argument("--splits", type=int, default=3)
    parser.add_argument("--noise-archs", type=int, default=30, help="measured twice")
    parser.add_argument("--config", help="a study config with an around space")
    parser.add_argument("--bases", default="dlrm", help="--config: the spaces' bases")
    parser.add_argument("--save", help="write the dense-step predictor fitted on all")
    parser.add_argument("--device", default="cpu", help="cpu (one thread), cuda, cuda:N")
    args = parser.parse_args()
    if args.archs - max(2, round(args.archs * args.holdout)) < 2:  # `holdout_split`
        parser.error(f"--archs {args.archs} leaves fewer than 2 architectures to fit beside "
                     f"the held-out ones (--holdout {args.holdout}): measure more")  # fmt: skip

    options = {"batch_size": args.batch_size, "dense": True, "device": args.device}
    started = time.perf_counter()
    measured = [m for space in spaces(args) for m in collect(space, args.archs, 0, **options)]
    seconds = time.perf_counter() - started
    archs = [arch for arch, _ in measured]
    device = measured[0][1].device
    source = f"{args.config} around {args.bases}" if args.config else args.space
    print(f"{len(archs)} architectures from {source}, batch {args.batch_size}, {device}; "
          f"measured in {seconds:.0f} s\n")  # fmt: skip
    print("| target | model | held-out MAPE | held-out Kendall tau |")
    print("|---|---|---|---|")
    for target in TARGETS:
        latencies = [getattr(latency, target) for _, latency in measured]
        for name, e in held_out(archs, latencies, args.holdout, args.splits).items():
            print(f"| {target} | {name} | {e['mape']:.1f}% | {e['kendall_tau']:.3f} |")
        print(f"| {target} | range measured | {min(latencies):.2f} to "
              f"{max(latencies):.2f} ms | |")  # fmt: skip
    twice = archs[: args.noise_archs]
    again = [measure_latency(arch, **options) for arch in twice]
    for target in TARGETS:
        first = [getattr(latency, target) for _, latency in measured[: args.noise_archs]]
        noise = errors([getattr(latency, target) for latency in again], first)
        print(f"| {target} | re-measurement ({args.noise_archs} archs) | {noise['mape']:.1f}% | "
              f"{noise['kendall_tau']:.3f} |")  # fmt: skip
    if args.save:
        dense = [latency.dense_step_ms for _, latency in measured]
        LatencyPredictor(args.batch_size, device, "dense_step_ms").fit(archs, dense).save(args.save)
        print(f"\nsaved {args.save}: the dense step, fitted on all {len(archs)}")


def spaces(args: argparse.Namespace) -> list:
    """`--space` on the synthetic schema, or the `--config` study's around space at each base."""
    if not args.config:
        return [load_space(args.space, synthetic_schema())]
    from nas.config import load_config
    from nas.protocol import prepare_data

    config = load_config(args.config)
    schema = prepare_data(config).train.schema
    return [make_space(config.search_space.model_copy(update={"base": base}), schema)
            for base in args.bases.split(",")]  # fmt: skip


if __name__ == "__main__":
    main()
