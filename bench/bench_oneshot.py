"""Rank correlation between supernet-inherited and stand-alone scores, and its noise ceiling.

Trains a supernet over a small DAG space, samples N architectures, scores each with
inherited weights (after a short fine-tune) and stand-alone (trained from scratch), and
prints Kendall's tau as one Markdown row. The noise ceiling is the tau between two
stand-alone trainings of the same architectures with different seeds: no supernet can rank
the stand-alone scores better than they rank each other.

    .venv/bin/python bench/bench_oneshot.py --archs 30
    .venv/bin/python bench/bench_oneshot.py --archs 30 --per-shape --finetune-split valid

Stand-alone scores are cached in --cache (keyed by architecture, steps, seed and rows), so
a sweep over supernet settings trains each architecture once.
"""

from __future__ import annotations

import argparse
import json
import random
import time
from pathlib import Path

import torch

from nas.oneshot.search import Scorer, kendall_tau
from nas.oneshot.supernet import Supernet, sample_arch, train_supernet
from search_space.architecture import Architecture, digest
from search_space.builder import build_model
from search_space.space_configs import DagConfig
from search_space.spaces import make_space
from search_space.spaces.dag import DagSpace
from trainers.data.dataset import TabularData
from trainers.data.synthetic import SyntheticConfig, generate_synthetic
from trainers.trainer import TrainConfig, train

BATCH = 256
SPACE = DagConfig(num_blocks=3, widths=[16, 32], counts=[4, 8], embedding_dims=[8])


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--archs", type=int, default=30)
    parser.add_argument("--rows", type=int, default=100_000)
    parser.add_argument("--supernet-steps", type=int, default=1500)
    parser.add_argument("--supernet-lr", type=float, default=2e-3)
    parser.add_argument("--max-grad-norm", type=float, default=None)
    parser.add_argument("--lr-schedule", choices=["constant", "cosine"], default="constant")
    parser.add_argument("--sampling", choices=["nasrec", "spos"], default="nasrec")
    parser.add_argument(
        "--per-shape", action="store_true", help="one module per input shape (no slicing)"
    )
    parser.add_argument("--finetune-steps", type=int, default=20)
    parser.add_argument("--finetune-split", choices=["train", "valid"], default="train")
    parser.add_argument("--score-rows", type=int, default=None, help="default: all validation")
    parser.add_argument("--standalone-steps", type=int, default=300)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--cache", default="ranknas-data/bench_oneshot_standalone.json")
    return parser.parse_args()


def sample_distinct(space: DagSpace, count: int, seed: int) -> list[Architecture]:
    rng, seen, archs = random.Random(seed), set(), []
    while len(archs) < count:
        _, arch = sample_arch(space, rng, "spos")
        if digest(arch) not in seen:
            seen.add(digest(arch))
            archs.append(arch)
    return archs


def standalone_ne(
    arch: Architecture, train_data: TabularData, valid: TabularData, steps: int, seed: int
) -> float:
    config = TrainConfig(batch_size=BATCH, max_steps=steps, evals=1, seed=seed)
    return train(build_model(arch, seed=seed), train_data, valid, config=config).validation["ne"]


def cached_standalone(args, archs, train_data, valid, seed: int) -> list[float]:
    path = Path(args.cache)
    cache = json.loads(path.read_text()) if path.exists() else {}
    scores = []
    for arch in archs:
        key = f"{digest(arch)}:{args.standalone_steps}:{seed}:{args.rows}"
        if key not in cache:
            cache[key] = standalone_ne(arch, train_data, valid, args.standalone_steps, seed)
        scores.append(cache[key])
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(cache))
    return scores


def main() -> None:
    args = parse_args()
    torch.set_num_threads(1)
    data = generate_synthetic(SyntheticConfig(rows=args.rows, seed=args.seed))
    train_data, valid, _ = data.split((0.8, 0.1, 0.1), seed=args.seed)
    space = make_space(SPACE, train_data.schema)

    started = time.monotonic()
    supernet = Supernet(space, seed=args.seed, share_across_shapes=not args.per_shape)
    curve = train_supernet(
        supernet,
        train_data,
        steps=args.supernet_steps,
        batch_size=BATCH,
        sampling=args.sampling,
        dense_lr=args.supernet_lr,
        max_grad_norm=args.max_grad_norm,
        lr_schedule=args.lr_schedule,
        seed=args.seed,
    )
    supernet_seconds = time.monotonic() - started
    scorer = Scorer(
        supernet,
        valid,
        finetune_data=train_data if args.finetune_split == "train" else None,
        finetune_steps=args.finetune_steps,
        batch_size=BATCH,
        score_rows=args.score_rows,
    )
    archs = sample_distinct(space, args.archs, args.seed + 1)
    inherited = [scorer(space.encode(arch)).ne for arch in archs]
    standalone = cached_standalone(args, archs, train_data, valid, args.seed)
    other_seed = cached_standalone(args, archs, train_data, valid, args.seed + 1)
    losses = [loss for _, loss in curve]
    shown_loss = f"{losses[-1]:.4f} / {max(losses[len(losses) // 4 :]):.4f}" if losses else "-"
    print(
        f"| {args.archs} | {args.rows:,} | {args.supernet_steps} ({supernet_seconds:.0f}s) | "
        f"{'per shape' if args.per_shape else 'sliced'} | {args.sampling} | "
        f"{args.supernet_lr:g} {args.lr_schedule} | {args.max_grad_norm or '-'} | "
        f"{args.finetune_steps} on {args.finetune_split} | {args.standalone_steps} | "
        f"{shown_loss} | {kendall_tau(inherited, standalone):.3f} | "
        f"{kendall_tau(*better_half(inherited, standalone)):.3f} | "
        f"{kendall_tau(other_seed, standalone):.3f} / "
        f"{kendall_tau(*better_half(other_seed, standalone)):.3f} |"
    )


def better_half(inherited: list[float], standalone: list[float]) -> tuple[list[float], ...]:
    """The pairs whose stand-alone NE is at most the median: the ranking a search needs is
    among good architectures, not between good and diverged ones."""
    cut = sorted(standalone)[(len(standalone) - 1) // 2]
    kept = [(i, s) for i, s in zip(inherited, standalone, strict=True) if s <= cut]
    return [i for i, _ in kept], [s for _, s in kept]


HEADER = (
    "| archs | rows | supernet steps | weights | sampling | supernet lr | grad clip | "
    "fine-tune steps | stand-alone steps | supernet loss last / worst after 25% | "
    "Kendall tau | tau, better half | "
    "noise ceiling: tau of 2 stand-alone seeds, all / better half |\n"
    "|---|---|---|---|---|---|---|---|---|---|---|---|---|"
)

if __name__ == "__main__":
    print(HEADER)
    main()
