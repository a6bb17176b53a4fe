"""What leaving out the co-design data's signal-free features does to DLRM: its dense step
and its NE, against DLRM on every feature (issue 41).

    .venv/bin/python bench/bench_left_out_features.py --seeds 5      # ~1 min on 2 cores

The data of `bench/codesign.yaml` (synthetic, 100k rows, 26 categorical features with
Criteo's table-size spread): its truth (`trainers.data.synthetic._Truth`) reads 19 of the
26 features. DLRM with the other 7 at dim 0 (left out: no table, no lookup, the dot one
feature smaller each) against DLRM on all 26: the dense part's training step, the two
timed a step at a time in turn (`measure_dense_step_ratio`, per repeat), and the
validation NE of one epoch per seed, both on the same split and seeds (paired). Prints
Markdown.
"""

from __future__ import annotations

import argparse
import statistics
from dataclasses import replace
from pathlib import Path

import torch
import yaml

from cost_models.latency.model import measure_dense_step_ratio
from search_space.builder import build_model
from search_space.presets import preset
from trainers.data import SyntheticConfig, generate_synthetic
from trainers.data.synthetic import _Truth
from trainers.trainer import TrainConfig, train


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, default=5)
    parser.add_argument("--repeats", type=int, default=3, help="dense-step ratio timings")
    args = parser.parse_args()
    torch.set_num_threads(1)
    data_config = yaml.safe_load(Path("bench/codesign.yaml").read_text())["data"]
    config = SyntheticConfig(rows=data_config["rows"], seed=data_config["seed"],
                             cardinalities=data_config["cardinalities"])  # fmt: skip
    truth = _Truth(config)
    read = {f for f, _ in truth.first} | {f for g in truth.groups.values() for f, _ in g}
    data = generate_synthetic(config)
    full = preset("dlrm", data.schema)
    features = tuple(f if i in read else replace(f, dim=0)
                     for i, f in enumerate(full.embedding.features))  # fmt: skip
    fewer = replace(full, embedding=replace(full.embedding, features=features))
    left_out = [f.name for f in features if f.dim == 0]
    print(f"left out: {', '.join(left_out)} ({len(left_out)} of {len(features)})\n")
    ratios = [measure_dense_step_ratio(fewer, full, 512) for _ in range(args.repeats)]
    print("dense step, left out / all: " + ", ".join(f"{r:.3f}" for r in ratios) + "\n")
    splits = data.split((0.8, 0.1, 0.1), seed=0)
    print("| seed | val NE, all features | left out | difference |\n|---|---|---|---|")
    differences = []
    for seed in range(args.seeds):
        ne = []
        for arch in (full, fewer):
            run = TrainConfig(batch_size=512, max_examples=100_000, seed=seed, device="cpu")
            ne.append(train(build_model(arch, seed=seed), *splits, run).validation["ne"])
        differences.append(ne[1] - ne[0])
        print(f"| {seed} | {ne[0]:.4f} | {ne[1]:.4f} | {differences[-1]:+.4f} |")
    sd = statistics.stdev(differences) if len(differences) > 1 else 0.0
    print(f"\nmean difference {statistics.fmean(differences):+.4f} (sd {sd:.4f}); lower on "
          f"{sum(d < 0 for d in differences)} of {len(differences)} seeds")  # fmt: skip


if __name__ == "__main__":
    main()
