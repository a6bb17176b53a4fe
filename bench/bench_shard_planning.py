"""RL sharder planning time: CPU seconds of the planning thread, median of --repeats.

    .venv/bin/python bench/bench_shard_planning.py [--configs 800x128] [--repeats 5]

Workloads as in `bench_sharding.py` (the held-out split of the training pool, 2x the
balanced share of memory per device); the model is the one `bench_sharding.py` trains
into --model. Prints one line per workload and the plan's digest (the same digest before
and after a change means the same plan).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import statistics
import time
from pathlib import Path

from bench_sharding import held_out_pool, load_or_train, workload

from cost_models.sharding.measure import Measurer
from cost_models.sharding.sharders import RLSharder


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--model", type=Path, default=Path("runs/sharding/model"))
    parser.add_argument("--cache", type=Path, default=Path("runs/sharding/measurements"))
    parser.add_argument("--configs", default="800x128", help="TABLESxDEVICES,...")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    trained, _ = load_or_train(args.model, Measurer(cache_dir=args.cache))
    sharder = RLSharder(trained.policy, trained.cost_net)
    pool = held_out_pool(trained.report)
    for config in args.configs.split(","):
        count, devices = (int(x) for x in config.split("x"))
        tables, topology = workload(pool, count, devices, args.seed)
        seconds = []
        for _ in range(args.repeats):
            start = time.thread_time()
            plan = sharder.plan(tables, topology)
            seconds.append(time.thread_time() - start)
        digest = hashlib.sha256(json.dumps(plan.to_dict(), sort_keys=True).encode()).hexdigest()
        print(f"{count} x {devices}: median {statistics.median(seconds):.2f} CPU s "
              f"(runs: {', '.join(f'{s:.2f}' for s in seconds)}); plan {digest[:12]}")  # fmt: skip


if __name__ == "__main__":
    main()
