"""How good is the predicted step time (issue 41)? Predicted against measured training steps
of real sharded runs: torchrun, DistributedModelParallel, gloo on this machine's CPU.

    .venv/bin/python bench/bench_step_prediction.py --processes 2 --steps 40 --out run1.json
    .venv/bin/python bench/bench_step_prediction.py --summarize run1.json run2.json run3.json
    .venv/bin/python bench/bench_step_prediction.py --study runs/step-error   # a study's own

For each architecture (the presets, and variants of DLRM with other embedding dims), the
step is predicted as a study predicts it (`cost_models.sharding.step.predict_step`: the
plan of the study's default sharder, the dense part measured alone in one thread) on
`--processes` devices in one host, three ways: with the topology's default links
(torchrec's NVLink-class constants); with this machine's links measured
(`cost_models.sharding.links`: gloo over loopback); and with those plus the sharded
runtime's fixed cost per step, measured on a probe model that is not in the set
(`trainers.sharded.measure_runtime_ms`, what `ranknas shard links` writes for a study).
Then each is measured as a study's sharded trial trains it (`trainers.sharded`, 512 rows
a process a step): the slowest rank's median step. Prints one Markdown row per
architecture and the median absolute errors; writes `--out`.

`--study DIR`: a study that trained its trials sharded (`training.processes`) and predicted
their steps (`objectives.cost: step_ms`), its trials' predicted against measured steps.
"""

from __future__ import annotations

import argparse
import json
import statistics
from pathlib import Path

PER_DEVICE_BATCH = 512  # the shipped cost model's batch


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--processes", type=int, default=2)
    parser.add_argument("--steps", type=int, default=40)
    parser.add_argument("--out", default="bench/results/step_prediction.json")
    parser.add_argument("--summarize", nargs="+", metavar="JSON",
                        help="print the median over repeats saved in these files")  # fmt: skip
    parser.add_argument("--study", metavar="DIR",
                        help="a finished study's output_dir: its trials' predicted step "
                        "against their measured one")  # fmt: skip
    args = parser.parse_args()
    if args.summarize:
        summarize([json.loads(Path(f).read_text()) for f in args.summarize])
        return
    if args.study:
        study_errors(Path(args.study))
        return
    from cost_models.sharding.links import measure_links, measured_topology
    from cost_models.sharding.step import topology
    from trainers.sharded import measure_runtime_ms, timing_splits

    links = measure_links(args.processes)
    clusters = {"constants": topology(args.processes), "links": measured_topology(links)}
    probe = measure_runtime_ms(clusters["links"], PER_DEVICE_BATCH, args.steps)
    overhead = probe["runtime_ms"]
    splits = timing_splits(args.steps, args.processes * PER_DEVICE_BATCH)
    runtime = {k: probe[k] for k in ("runtime_ms", "dense_factor", "ms_per_pooled_mb")}
    rows = [_one(name, arch, args, clusters, splits, runtime) for name, arch in _architectures()]
    errors = {how: statistics.median(abs(_error(r, how)) for r in rows)
              for how in ("constants", "links", "links+overhead")}  # fmt: skip
    report = {"processes": args.processes, "per_device_batch": PER_DEVICE_BATCH,
              "links": links, "overhead_probe": probe, "overhead_ms": overhead,
              "median_abs_error": errors, "rows": rows}  # fmt: skip
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(report, indent=2))
    print(f"links: {json.dumps(links)}; from the probes: the runtime's own "
          f"{overhead:.2f} ms a step, the dense part x{probe['dense_factor']:.2f}, "
          f"{probe['ms_per_pooled_mb']:.2f} ms per MB of pooled embeddings")  # fmt: skip
    print("| architecture | measured ms | predicted: constants | links | links + overhead | "
          "dense | lookups | all-to-all (links) |\n|---|---|---|---|---|---|---|---|")  # fmt: skip
    for r in rows:
        p, q = r["predicted"], r["predicted"]["links"]
        print(
            f"| {r['name']} | {r['measured_ms']:.2f} | {p['constants']['step_ms']:.2f} "
            f"({_error(r, 'constants'):+.0%}) | {q['step_ms']:.2f} ({_error(r, 'links'):+.0%}) "
            f"| {p['links+overhead']['step_ms']:.2f} ({_error(r, 'links+overhead'):+.0%}) | "
            f"{q['dense_ms']:.2f} | {q['embedding_ms']:.2f} | {q['all_to_all_ms']:.2f} |"
        )
    print("\nmedian absolute error: " + ", ".join(f"{k} {v:.0%}" for k, v in errors.items()))


def study_errors(directory: Path) -> None:
    """Each finished trial of a study that trained sharded and predicted its steps: the
    step it predicted (`step_time.json`) against the one it measured (`metrics.json`)."""
    rows = []
    for trial in sorted((directory / "trials").iterdir(), key=lambda d: int(d.name)):
        step, metrics = trial / "step_time.json", trial / "metrics.json"
        if not (step.exists() and metrics.exists()):
            continue
        predicted = json.loads(step.read_text())["step_ms"]
        measured = json.loads(metrics.read_text()).get("measured_step_ms")
        if measured:
            rows.append((trial.name, predicted, measured, (predicted - measured) / measured))
    if not rows:
        raise SystemExit(f"{directory}: no trial with both a predicted and a measured step")
    print("| trial | predicted ms | measured ms | error |\n|---|---|---|---|")
    for name, predicted, measured, error in rows:
        print(f"| {name} | {predicted:.2f} | {measured:.2f} | {error:+.0%} |")
    errors = [abs(r[3]) for r in rows]
    print(f"\n{len(rows)} trials: median absolute error {statistics.median(errors):.0%}, "
          f"largest {max(errors):.0%}")  # fmt: skip


def summarize(runs: list[dict]) -> None:
    """Per architecture, the median over the repeats of each prediction's error; then their
    median absolute value, and each repeat's own."""
    names = [r["name"] for r in runs[0]["rows"]]
    ways = ("constants", "links", "links+overhead")
    print(
        "| architecture | measured ms (median) | " + " | ".join(ways) + " |\n|---|---|---|---|---|"
    )
    medians = {how: [] for how in ways}
    for name in names:
        rows = [next(r for r in run["rows"] if r["name"] == name) for run in runs]
        cells = []
        for how in ways:
            error = statistics.median(_error(r, how) for r in rows)
            medians[how].append(abs(error))
            cells.append(f"{error:+.0%}")
        measured = statistics.median(r["measured_ms"] for r in rows)
        print(f"| {name} | {measured:.2f} | " + " | ".join(cells) + " |")
    print(
        f"\nmedian absolute error over {len(runs)} repeats: "
        + ", ".join(f"{how} {statistics.median(v):.0%}" for how, v in medians.items())
    )
    print(
        "each repeat's: "
        + "; ".join(
            ", ".join(f"{how} {run['median_abs_error'][how]:.0%}" for how in ways) for run in runs
        )
    )


def _error(row: dict, how: str) -> float:
    predicted = row["predicted"][how]
    predicted = predicted if isinstance(predicted, float) else predicted["step_ms"]
    return (predicted - row["measured_ms"]) / row["measured_ms"]


def _architectures():
    from search_space.presets import PRESETS, load_architecture
    from search_space.schema import synthetic_schema

    schema = synthetic_schema()
    for name in sorted(PRESETS):
        if name != "logistic_regression":
            yield name, load_architecture(name, schema)
    for dim in (32, 64):
        yield f"dlrm-dim{dim}", _with_dim(load_architecture("dlrm", schema), dim)


def _with_dim(arch, dim: int):
    from search_space.architecture import Architecture
    from search_space.schema import synthetic_schema

    data = arch.to_dict()
    data["embedding"]["dim"], data["name"] = dim, f"dlrm-dim{dim}"
    return Architecture.from_dict(data).bind(synthetic_schema())


def _one(name: str, arch, args: argparse.Namespace, clusters: dict, splits, runtime) -> dict:
    from cost_models.latency.model import measure_dense_step_ms
    from cost_models.sharding.plan import Plan
    from cost_models.sharding.step import predict_step
    from search_space.architecture import analyze
    from trainers.sharded import time_sharded_step

    dense_ms = measure_dense_step_ms(arch, PER_DEVICE_BATCH, "cpu", threads=1)
    predicted = {how: predict_step(arch, cluster, "size_lookup_greedy", "runs/sharding/model",
                                   PER_DEVICE_BATCH, dense_ms, analyze(arch).dense_params)
                 for how, cluster in clusters.items()}  # fmt: skip
    predicted["links+overhead"] = predict_step(
        arch,
        clusters["links"],
        "size_lookup_greedy",
        "runs/sharding/model",
        PER_DEVICE_BATCH,
        dense_ms,
        analyze(arch).dense_params,
        **runtime,
    )
    plan = Plan.from_dict(predicted["links"]["plan"])
    measured = time_sharded_step(arch, splits, plan, PER_DEVICE_BATCH, args.steps)
    for p in predicted.values():
        p.pop("plan")
    return {"name": name, "predicted": predicted, "measured_ms": measured.step_ms,
            "rank_ms": measured.device_step_ms}  # fmt: skip


if __name__ == "__main__":
    main()
