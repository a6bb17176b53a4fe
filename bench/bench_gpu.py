"""Trial training on a GPU: throughput, GPU memory and model FLOP utilization (MFU).

    .venv/bin/python bench/bench_gpu.py --device cpu --threads 2     # this machine's CPU
    python3 bench/bench_gpu.py --device cuda                         # a GPU, if there is one

What a study's trial costs on each device: `trainers.trainer.train` (the loop every trial,
baseline and `ranknas train` run, bf16 autocast on CUDA) on the synthetic data set, for
each preset at the shapes the studies use, plus one production-scale model (MLPerf's
DLRM-DCNv2 widths: embedding dim 128, bottom MLP 512-256-128, a 3-layer low-rank cross
network, top MLP 1024-1024-512-256) on Criteo's shape (13 dense, 26 categorical). Every
run is `--steps` steps at one batch size after an untimed warm-up run; the figure is the
median of `--repeats` runs. MFU = 3 x forward FLOPs per example (exact, from `analyze`)
x examples/s over the device's dense bf16 peak (`--peak-tflops`, 989 for an H100 SXM).
A few hundred steps leave most models short of the base rate: their NE is not the point
here and is not checked.
Prints Markdown and writes JSON to `--out`.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

import numpy as np
import torch

from search_space.architecture import Architecture, BlockSpec, EmbeddingConfig, analyze
from search_space.builder import build_model
from search_space.presets import preset
from trainers.data import SyntheticConfig, generate_synthetic
from trainers.trainer import TrainConfig, train

PRESETS = ("logistic_regression", "dlrm", "dcnv2", "deepfm", "dhen", "wukong")


def mlperf_dlrm_dcnv2() -> Architecture:
    """MLPerf's DLRM-DCNv2 widths (embedding dim 128) in ranknas's block spec."""
    blocks = (
        BlockSpec("bottom", "mlp", ("dense",), {"widths": [512, 256, 128]}),
        BlockSpec("cross", "cross", ("sparse", "bottom"), {"num_layers": 3, "low_rank": 512}),
        BlockSpec("top", "mlp", ("cross",), {"widths": [1024, 1024, 512, 256]}),
    )
    return Architecture(blocks=blocks, embedding=EmbeddingConfig(128), name="mlperf_dlrm_dcnv2")


def run_once(arch: Architecture, data, batch: int, steps: int, device: str) -> dict:
    model = build_model(arch, seed=0)
    config = TrainConfig(
        batch_size=batch, max_steps=steps, evals=1, early_stopping_patience=0,
        restore_best=False, device=device, seed=0,
    )  # fmt: skip
    if device.startswith("cuda"):
        torch.cuda.reset_peak_memory_stats()
    result = train(model, data, data.take(np.arange(2048)), config=config)
    if result.status != "complete" and not result.failure_reason.startswith("diverged"):
        raise RuntimeError(f"{arch.name} batch {batch}: {result.failure_reason}")
    return {"throughput": result.throughput, "peak_memory_bytes": result.peak_memory_bytes}


def measure(arch, data, batch, steps, repeats, device, peak_tflops) -> dict:
    run_once(arch, data, batch, max(5, steps // 10), device)  # warm-up: allocator, kernels
    runs = [run_once(arch, data, batch, steps, device) for _ in range(repeats)]
    speeds = [r["throughput"] for r in runs]
    throughput = statistics.median(speeds)
    flops = analyze(arch).flops
    achieved = 3 * flops * throughput / 1e12
    return {
        "model": arch.name,
        "batch": batch,
        "examples_per_s": round(throughput),
        "spread": round((max(speeds) - min(speeds)) / 2),
        "mflops_per_example": round(flops / 1e6, 3),
        "train_tflops": round(achieved, 4),
        "mfu": round(achieved / peak_tflops, 5) if peak_tflops else None,
        "peak_memory_mib": round(max(r["peak_memory_bytes"] for r in runs) / 2**20, 1),
    }


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--batches", default="512,4096,16384")
    parser.add_argument("--steps", type=int, default=200, help="timed steps per run")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--rows", type=int, default=400_000)
    parser.add_argument("--threads", type=int, default=0, help="torch threads (0: default)")
    parser.add_argument("--models", default=",".join(PRESETS) + ",mlperf_dlrm_dcnv2")
    parser.add_argument("--peak-tflops", type=float, default=989.0)
    parser.add_argument("--out", type=Path, default=Path("runs/bench_gpu.json"))
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    small = generate_synthetic(SyntheticConfig(rows=args.rows))
    criteo = generate_synthetic(SyntheticConfig(rows=args.rows, num_dense=13, num_sparse=26))
    name = torch.cuda.get_device_name() if args.device.startswith("cuda") else "cpu"
    print(f"device: {name}, torch {torch.__version__}, threads {torch.get_num_threads()}")
    print("| model | batch | examples/s | MFLOPs/ex | train TFLOP/s | MFU | peak MiB |")
    print("|---|---|---|---|---|---|---|")
    rows = []
    for model in args.models.split(","):
        scaled = model == "mlperf_dlrm_dcnv2"
        data = criteo if scaled else small
        arch = (mlperf_dlrm_dcnv2() if scaled else preset(model)).bind(data.schema)
        for batch in map(int, args.batches.split(",")):
            started = time.perf_counter()
            row = measure(arch, data, batch, args.steps, args.repeats, args.device,
                          args.peak_tflops if args.device.startswith("cuda") else 0.0)  # fmt: skip
            rows.append(row)
            mfu = f"{row['mfu']:.2%}" if row["mfu"] is not None else "-"
            print(
                f"| {model} | {batch} | {row['examples_per_s']:,} (±{row['spread']:,}) | "
                f"{row['mflops_per_example']} | {row['train_tflops']} | {mfu} | "
                f"{row['peak_memory_mib']} |  ({time.perf_counter() - started:.0f} s)",
                flush=True,
            )
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps({"device": name, "rows": rows}, indent=1))


if __name__ == "__main__":
    main()
