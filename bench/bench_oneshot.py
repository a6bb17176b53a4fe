"""Rank correlation between supernet-inherited scores and stand-alone scores.

Trains a supernet over a small DAG space, samples N architectures, scores each with
inherited weights (after a short fine-tune on the validation split) and stand-alone
(trained from scratch on the same budget), and prints Kendall's tau as Markdown.

    .venv/bin/python bench/bench_oneshot.py --archs 30
"""

from __future__ import annotations

import argparse
import random
import time

import torch

from nas.oneshot.search import Scorer, kendall_tau
from nas.oneshot.supernet import Supernet, sample_arch, train_supernet
from search_space.architecture import analyze, digest
from search_space.builder import build_model
from search_space.spaces import make_space
from search_space.spaces.dag import DagConfig
from trainers.data.synthetic import SyntheticConfig, generate_synthetic
from trainers.trainer import TrainConfig, train


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--archs", type=int, default=30)
    parser.add_argument("--rows", type=int, default=30_000)
    parser.add_argument("--supernet-steps", type=int, default=1500)
    parser.add_argument("--standalone-steps", type=int, default=150)
    parser.add_argument("--finetune-steps", type=int, default=5)
    parser.add_argument("--sampling", choices=["nasrec", "spos"], default="nasrec")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    torch.set_num_threads(1)

    data = generate_synthetic(SyntheticConfig(rows=args.rows, seed=args.seed))
    train_data, valid, _ = data.split((0.8, 0.1, 0.1), seed=args.seed)
    config = DagConfig(num_blocks=3, widths=[16, 32], counts=[4, 8], embedding_dims=[8])
    space = make_space(config, train_data.schema)

    started = time.monotonic()
    supernet = Supernet(space, seed=args.seed)
    curve = train_supernet(
        supernet,
        train_data,
        steps=args.supernet_steps,
        batch_size=256,
        sampling=args.sampling,
        seed=args.seed,
    )
    supernet_seconds = time.monotonic() - started
    scorer = Scorer(supernet, valid, finetune_steps=args.finetune_steps, batch_size=256)

    rng, seen, inherited, standalone = random.Random(args.seed + 1), set(), [], []
    while len(inherited) < args.archs:
        values, arch = sample_arch(space, rng, "spos")
        if digest(arch) in seen:
            continue
        seen.add(digest(arch))
        inherited.append(scorer(values).ne)
        model = build_model(arch, seed=args.seed)
        result = train(
            model,
            train_data,
            valid,
            config=TrainConfig(batch_size=256, max_steps=args.standalone_steps, evals=1),
        )
        standalone.append(result.validation["ne"])
        analyze(arch)
    tau = kendall_tau(inherited, standalone)
    seconds = time.monotonic() - started
    print("| archs | supernet steps | sampling | fine-tune steps | stand-alone steps | "
          "supernet loss (last) | Kendall tau | seconds |")  # fmt: skip
    print("|---|---|---|---|---|---|---|---|")
    print(
        f"| {args.archs} | {args.supernet_steps} ({supernet_seconds:.0f}s) | {args.sampling} | "
        f"{args.finetune_steps} | {args.standalone_steps} | {curve[-1][1]:.4f} | {tau:.3f} | "
        f"{seconds:.0f} |"
    )


if __name__ == "__main__":
    main()
