"""Validation NE of the presets trained in fp32, under bf16 autocast with the network's inputs
left in fp32 (before `search_space.builder.AUTOCAST_INPUTS`), and under bf16 autocast with
them cast first (the GPU's default since): the numbers side by side, per seed.

    .venv/bin/python bench/bench_autocast_ne.py --out bench/results/autocast_ne_cpu.json

The trainer runs autocast on CUDA only; here each run forces it on the CPU's bf16 autocast,
whose op lists differ from CUDA's in details, so this checks the numerics the cast brings,
not a GPU's. Quickstart recipe (`trial_train_config`), synthetic rows split 80/10/10.
"""

from __future__ import annotations

import argparse
import json
import statistics
from pathlib import Path

import torch

from nas.config import load_config
from nas.protocol import trial_train_config
from search_space import builder
from search_space.builder import build_model
from search_space.presets import preset
from trainers import trainer
from trainers.data import SyntheticConfig, generate_synthetic
from trainers.steps import EagerStep

WAYS = {"fp32": (False, False), "bf16_inputs_fp32": (True, False), "bf16": (True, True)}


def validation_ne(model: str, seed: int, way: str, data) -> float:
    autocast, cast_inputs = WAYS[way]
    builder.AUTOCAST_INPUTS = cast_inputs
    # the trainer asks for autocast on CUDA only: this step takes it on the CPU too
    trainer.EagerStep = lambda m, o, bf16, compiled=False: EagerStep(m, o, autocast, compiled)
    try:
        config = trial_train_config(load_config("examples/quickstart.yaml"), seed)
        config.device = "cpu"
        train_part, valid, _ = data
        net = build_model(preset(model).bind(train_part.schema), seed=seed)
        return trainer.train(net, train_part, valid, config=config).validation["ne"]
    finally:
        builder.AUTOCAST_INPUTS, trainer.EagerStep = True, EagerStep


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--models", default="dlrm,dcnv2,deepfm,wukong,dhen")
    parser.add_argument("--seeds", type=int, default=3)
    parser.add_argument("--rows", type=int, default=100_000)
    parser.add_argument("--out", type=Path, default=Path("runs/autocast_ne.json"))
    args = parser.parse_args()
    torch.set_num_threads(2)
    data = generate_synthetic(SyntheticConfig(rows=args.rows)).split()
    rows = []
    print("| model | " + " | ".join(WAYS) + " | bf16 - fp32 |\n|---|---|---|---|---|")
    for model in args.models.split(","):
        seeds = range(args.seeds)
        runs = {way: [validation_ne(model, s, way, data) for s in seeds] for way in WAYS}
        rows.append({"model": model, **runs})
        cells = [f"{statistics.mean(v):.4f} ± {statistics.stdev(v):.4f}" for v in runs.values()]
        delta = statistics.mean(runs["bf16"]) - statistics.mean(runs["fp32"])
        print(f"| {model} | " + " | ".join(cells) + f" | {delta:+.4f} |", flush=True)
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps({"rows": args.rows, "seeds": args.seeds, "ne": rows}))


if __name__ == "__main__":
    main()
