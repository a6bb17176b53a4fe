"""How good is the predicted step time (issue 41)? Predicted against measured training steps
of real sharded runs: torchrun, DistributedModelParallel, gloo on this machine's CPU.

    .venv/bin/python bench/bench_step_prediction.py --processes 2 --steps 40

For each architecture (the presets, and variants of DLRM with other embedding dims), the
step is predicted as a study predicts it (`nas.sharding.predict_step` on a topology of
`--processes` devices in one host, the plan of the study's default sharder, the dense
part measured alone in one thread) and then measured: `trainers.distributed` trains the
architecture with that plan (sparse SGD, the cost model's kernel) with a global batch of
`--processes` x 512 and reports the slowest rank's median step. Prints one Markdown row
per architecture and the median absolute error; writes bench/results/step_prediction.json.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

PER_DEVICE_BATCH = 512  # the shipped cost model's batch


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--processes", type=int, default=2)
    parser.add_argument("--steps", type=int, default=40)
    parser.add_argument("--out", default="bench/results/step_prediction.json")
    args = parser.parse_args()
    rows = [_one(name, arch, args) for name, arch in _architectures()]
    errors = [abs(r["error"]) for r in rows]
    report = {"processes": args.processes, "per_device_batch": PER_DEVICE_BATCH,
              "median_abs_error": statistics.median(errors), "rows": rows}  # fmt: skip
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(report, indent=2))
    print("| architecture | predicted ms | dense | all-reduce | lookups | all-to-all | "
          "measured ms | error |\n|---|---|---|---|---|---|---|---|")  # fmt: skip
    for r in rows:
        p = r["predicted"]
        print(f"| {r['name']} | {p['step_ms']:.2f} | {p['dense_ms']:.2f} | "
              f"{p['allreduce_ms']:.2f} | {p['embedding_ms']:.2f} | {p['all_to_all_ms']:.2f} | "
              f"{r['measured_ms']:.2f} | {r['error']:+.0%} |")  # fmt: skip
    print(f"\nmedian absolute error: {report['median_abs_error']:.0%}")


def _architectures():
    from search_space.architecture import Architecture
    from search_space.presets import PRESETS, load_architecture
    from search_space.schema import synthetic_schema

    schema = synthetic_schema()
    for name in sorted(PRESETS):
        if name != "logistic_regression":
            yield name, load_architecture(name, schema)
    for dim in (4, 64):
        data = load_architecture("dlrm", schema).to_dict()
        data["embedding"]["dim"] = dim
        data["name"] = f"dlrm-dim{dim}"
        yield data["name"], Architecture.from_dict(data).bind(schema)


def _one(name: str, arch, args: argparse.Namespace) -> dict:
    from cost_models.latency.model import measure_dense_step_ms
    from nas.sharding import predict_step, topology
    from search_space.architecture import analyze

    dense_ms = measure_dense_step_ms(arch, PER_DEVICE_BATCH, "cpu", threads=1)
    predicted = predict_step(arch, topology(args.processes), "size_lookup_greedy",
                             "runs/sharding/model", PER_DEVICE_BATCH, dense_ms,
                             analyze(arch).dense_params)  # fmt: skip
    rows = args.steps * args.processes * PER_DEVICE_BATCH  # every step a full batch
    with tempfile.TemporaryDirectory() as tmp:
        arch_file, plan_file, out = (Path(tmp) / n for n in ("a.json", "plan.json", "run.json"))
        arch_file.write_text(arch.to_json())
        plan_file.write_text(json.dumps(predicted["plan"]))
        command = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node",
                   str(args.processes), "--master_port", str(_free_port()), "-m",
                   "trainers.distributed", "--arch-file", str(arch_file), "--plan",
                   str(plan_file), "--steps", str(args.steps),
                   "--batch-size", str(args.processes * PER_DEVICE_BATCH),
                   "--sparse-optimizer", "sgd", "--rows", str(rows), "--out", str(out)]  # fmt: skip
        env = os.environ | {"OMP_NUM_THREADS": "1"}
        run = subprocess.run(command, env=env, capture_output=True, text=True)
        if run.returncode:
            raise SystemExit(f"{name}: torchrun failed:\n{run.stderr[-3000:]}")
        measured = json.loads(out.read_text())
    plan = {k: v for k, v in predicted.items() if k != "plan"}
    error = (predicted["step_ms"] - measured["step_ms"]) / measured["step_ms"]
    return {"name": name, "predicted": plan, "measured_ms": measured["step_ms"],
            "rank_ms": measured["rank_step_ms"], "error": error}  # fmt: skip


def _free_port() -> int:
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


if __name__ == "__main__":
    main()
