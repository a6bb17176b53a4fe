"""How well the one-shot scorer ranks the architectures a search actually trains.

`bench_oneshot.py` ranks architectures drawn uniformly, most of them far from the best. A
search needs the ranking among good ones. This script runs the evolution study of
`bench_search_efficiency.py` (same data, space, budget and seed), keeps every architecture
it trained with its recorded validation NE, trains the supernet of `examples/oneshot.yaml`,
and scores each of those architectures with inherited weights after each fine-tune length
in --steps (the scorer's batch and rows from the example). One Markdown row per length:
Kendall tau with the recorded NE over all of them and over the better half, the proxy's
rank of the best one, and the recorded NE of the proxy's top 4.

    .venv/bin/python bench/bench_refine_rank.py --seed 0     # about 3 min on 2 cores

The study's trials are cached in --out/trials-seed-N.json.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

from optuna.trial import TrialState

sys.path.insert(0, str(Path(__file__).parent))
from bench_oneshot import better_half
from bench_search_efficiency import quiet_single_thread, study_config

from nas.oneshot.phase import make_scorer, trained_supernet
from nas.oneshot.search import kendall_tau
from nas.runner import prepare_data, run_study
from search_space.architecture import Architecture
from search_space.spaces import make_space


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--steps", default="40,160,320", help="fine-tune lengths to compare")
    parser.add_argument("--out", default="ranknas-data/bench_refine_rank")
    parser.add_argument("--rows", type=int, default=100_000)
    parser.add_argument("--trials", type=int, default=48)
    parser.add_argument("--population", type=int, default=12)
    parser.add_argument("--examples-per-trial", type=int, default=80_000)
    parser.add_argument("--budget-mflops", type=float, default=0.05)
    return parser.parse_args()


def trained_architectures(args: argparse.Namespace) -> list[dict]:
    """Every architecture the evolution study trained, with its recorded validation NE."""
    path = Path(args.out) / f"trials-seed-{args.seed}.json"
    if path.exists():
        return json.loads(path.read_text())
    settings = argparse.Namespace(**vars(args), top_k=4, set=[])
    with tempfile.TemporaryDirectory(prefix="ranknas-rank-") as tmp:
        config = study_config(Path(tmp), "evolution", args.seed, settings)
        study = run_study(config, progress=lambda line: print(line, file=sys.stderr))
        trained = [
            {
                "ne": t.values[0],
                "architecture": (Path(t.user_attrs["trial_dir"]) / "architecture.json").read_text(),
            }
            for t in study.get_trials(deepcopy=False)
            if t.state == TrialState.COMPLETE
        ]
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(trained))
    return trained


def main() -> None:
    args = parse_args()
    quiet_single_thread()
    trained = trained_architectures(args)
    recorded = [t["ne"] for t in trained]
    archs = [Architecture.from_json(t["architecture"]) for t in trained]
    settings = argparse.Namespace(**vars(args), top_k=4, set=[])
    with tempfile.TemporaryDirectory(prefix="ranknas-rank-") as tmp:
        config = study_config(Path(tmp), "oneshot", args.seed, settings)
    data = prepare_data(config)
    space = make_space(config.search_space, data.train.schema)
    supernet, _ = trained_supernet(config, space, data)
    scorer = make_scorer(config, supernet, data)
    best = min(range(len(recorded)), key=recorded.__getitem__)
    print("| seed | architectures | fine-tune steps | examples per architecture | Kendall tau | "
          "tau, better half | proxy's rank of the best | recorded NE of the proxy's top 4 | "
          "seconds |\n|---|---|---|---|---|---|---|---|---|")  # fmt: skip
    for steps in [int(s) for s in args.steps.split(",")]:
        started = time.monotonic()
        proxy = [scorer.inherited_ne(arch, steps) for arch in archs]
        order = sorted(range(len(proxy)), key=proxy.__getitem__)
        top4 = ", ".join(f"{recorded[i]:.4f}" for i in order[:4])
        print(f"| {args.seed} | {len(archs)} | {steps} | {steps * scorer.batch_size:,} | "
              f"{kendall_tau(proxy, recorded):.3f} | "
              f"{kendall_tau(*better_half(proxy, recorded)):.3f} | "
              f"{order.index(best) + 1} of {len(archs)} | {top4} | "
              f"{time.monotonic() - started:.0f} |", flush=True)  # fmt: skip


if __name__ == "__main__":
    main()
