"""`ranknas latency ...`: measure an architecture, fit a latency predictor, predict with it.

`register(commands)` adds the `latency` command to the CLI's subparsers. User mistakes
raise RanknasError, which the CLI prints as one line.
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import asdict

from cost_models.latency.model import (
    TARGETS,
    FlopsBaseline,
    LatencyPredictor,
    collect,
    holdout_split,
    measure_latency,
)
from search_space.errors import RanknasError

MIN_ARCHS = 4


def _measure_kwargs(args: argparse.Namespace) -> dict:
    import torch

    if args.batch_size < 1 or args.repeats < 1 or args.threads < 1:
        raise RanknasError("--batch-size, --repeats and --threads must be at least 1")
    if args.device.startswith("cuda") and not torch.cuda.is_available():
        raise RanknasError(f"--device {args.device}: no CUDA device on this machine")
    return {"batch_size": args.batch_size, "device": args.device, "threads": args.threads,
            "repeats": args.repeats}  # fmt: skip


def cmd_measure(args: argparse.Namespace) -> int:
    from search_space.presets import load_architecture
    from search_space.schema import load_schema

    arch = load_architecture(args.arch, load_schema(args.schema))
    latency = measure_latency(arch, **_measure_kwargs(args), dense=True)
    if args.json:
        print(json.dumps(asdict(latency) | {"architecture": arch.name or args.arch}, indent=2))
    else:
        print(f"{arch.name or args.arch}: forward {latency.forward_ms:.3f} ms, training step "
              f"{latency.train_step_ms:.3f} ms (its dense part {latency.dense_step_ms:.3f} ms) "
              f"at batch {latency.batch_size} on {latency.device} (medians of "
              f"{args.repeats})")  # fmt: skip
    return 0


def cmd_fit(args: argparse.Namespace) -> int:
    from search_space.schema import load_schema
    from search_space.spaces import load_space

    if args.archs < MIN_ARCHS:
        raise RanknasError(f"--archs must be at least {MIN_ARCHS}")
    if not 0 < args.holdout < 1:
        raise RanknasError("--holdout must be between 0 and 1")
    schema = load_schema(args.schema)
    space = load_space(args.space, schema)
    sized_by = args.schema or (
        "the built-in synthetic data's schema (--schema: yours; "
        "`ranknas data schema STUDY.yaml` prints a study's)"
    )
    print(f"architectures of {args.space}, sized by {sized_by}: {schema.num_dense} dense, "
          f"{schema.num_sparse} categorical features")  # fmt: skip
    options = _measure_kwargs(args) | {"dense": args.target == "dense_step_ms"}
    measured = collect(space, args.archs, args.seed, progress=_progress, **options)
    if len(measured) < MIN_ARCHS:
        raise RanknasError(f"{args.space}: found only {len(measured)} distinct architectures")
    archs = [arch for arch, _ in measured]
    latencies = [getattr(latency, args.target) for _, latency in measured]
    _report_held_out(archs, latencies, args.holdout, args.seed, args.target)
    device = measured[0][1].device
    predictor = LatencyPredictor(args.batch_size, device, args.target).fit(archs, latencies)
    predictor.schema = schema.to_dict()  # `predict` sizes a preset by it
    predictor.save(args.out)
    print(f"saved {args.out}: {TARGETS[args.target]}, fitted on all {len(archs)} "
          f"measurements ({predictor.device})")  # fmt: skip
    return 0


def _progress(done: int, count: int) -> None:
    if done % 10 == 0 or done == count:
        print(f"measured {done}/{count}", file=sys.stderr, flush=True)


def _report_held_out(
    archs: list, latencies: list[float], holdout: float, seed: int, target: str
) -> None:
    train, test = holdout_split(len(archs), holdout, seed)
    fit_archs, fit_y = [archs[i] for i in train], [latencies[i] for i in train]
    test_archs, test_y = [archs[i] for i in test], [latencies[i] for i in test]
    print(f"{TARGETS[target]}, held out {len(test)} of {len(archs)} architectures:")
    for name, model in (("predictor", LatencyPredictor()), ("FLOPs-only line", FlopsBaseline())):
        e = model.fit(fit_archs, fit_y).evaluate(test_archs, test_y)
        print(f"  {name:<16} MAPE {e['mape']:5.1f}%  Kendall tau {e['kendall_tau']:.3f}")


def cmd_predict(args: argparse.Namespace) -> int:
    from search_space.presets import load_architecture
    from search_space.schema import DatasetSchema, load_schema

    predictor = LatencyPredictor.load(args.predictor)
    if args.schema is None and predictor.schema is not None:  # the data it was fitted on
        schema, sized_by = DatasetSchema.from_dict(predictor.schema), "the fit's schema"
    else:
        schema, sized_by = load_schema(args.schema), args.schema or "the built-in schema"
    arch = load_architecture(args.arch, schema)
    predicted = float(predictor.predict([arch])[0])
    features = {"dense": schema.num_dense, "categorical": schema.num_sparse}
    if args.json:
        record = {"architecture": arch.name or args.arch, predictor.target: predicted,
                  "batch_size": predictor.batch_size, "device": predictor.device,
                  "sized_by": sized_by, "features": features}  # fmt: skip
        print(json.dumps(record, indent=2))
    else:
        print(f"{arch.name or args.arch}: predicted {TARGETS[predictor.target]} "
              f"{predicted:.3f} ms at batch {predictor.batch_size} on {predictor.device} "
              f"(sized by {sized_by}: {features['dense']} dense, {features['categorical']} "
              "categorical features)")  # fmt: skip
    return 0
