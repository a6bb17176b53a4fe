"""Sharding across kinds of table pools: every sharder's measured max-device cost against the
balance bound, the measurement noise, and planning time.

    .venv/bin/python bench/bench_shard_families.py [--configs 120x8,480x32] [--seeds 0]

Pools come from `cost_models.sharding.tables.pool_family` (no_dominant, one_dominant,
many_heavy, mixed) with fresh seeds: none of them is the pool the cost model and policy
were trained on (`bench_sharding.load_or_train`, trained first if --model holds none).
Each device gets 2x the balanced share of memory. Every device of every plan is timed on
the fused kernel as in `bench_sharding.py`; per plan:

- max: the measured max-device cost per step (ms), what the plan is judged by;
- bound: the plan's mean measured device cost, the balance bound (no placement of these
  units can have its max below it);
- noise: a plan's max-device cost from two independent timings of every device,
  |a - b| / mean (the `rl` and `rl_measured` plans);
- noise floor: the max / bound a perfectly balanced plan would be measured at, given the
  per-device noise of those two timings (the max of N noisy devices lies above their mean);
- planning: CPU seconds of the planning thread.

`rl_measured` is the RL sharder with a `Measurer` of its own (`measured.MeasuredSearch`:
candidate cuts and plans chosen by their measured max, then measured moves and swaps off
the costliest device). Its timings are not the ones that judge it: the judging `Measurer`
draws other inputs and keeps its own cache.

Ablations, not competitors: `rl_refined` (the policy's plan and the best heuristic's, each
improved by local search on the cost model, `refine=True`), `rl_policy` (the policy's plan
alone, no selection among the heuristics' plans: the RL sharder before issue 14's
selection) and `rl_select_max` (selection by the predicted max, no error margin).
Prints Markdown; JSON to --out.
"""

from __future__ import annotations

import argparse
import json
import logging
import statistics
import time
from pathlib import Path

import numpy as np
from bench_sharding import GREEDY_ON_RL_CUTS, MEMORY_SLACK, TABLE_WISE_RL, Bench, load_or_train

from cost_models.sharding.measure import MeasureConfig, Measurer
from cost_models.sharding.sharders import RLSharder
from cost_models.sharding.tables import POOL_FAMILIES, TableSpec, pool_family
from cost_models.sharding.topology import Topology

MEASURED = "rl_measured"  # the RL sharder choosing and refining by its own timings
REFINED = "rl_refined"
POLICY_ONLY = "rl_policy"  # the policy's plan, no selection among the heuristics' plans
SELECT_BY_MAX = "rl_select_max"  # selection by the predicted max, no error margin
RATED = ("rl", MEASURED)
ABLATIONS = (REFINED, POLICY_ONLY, SELECT_BY_MAX, TABLE_WISE_RL, GREEDY_ON_RL_CUTS)


def topology_for(tables: list[TableSpec], devices: int) -> Topology:
    total = sum(t.size_bytes for t in tables)
    memory = max(MEMORY_SLACK * total / devices, 1.05 * max(t.size_bytes for t in tables))
    return Topology(devices, memory_bytes=int(memory))


def timing_pairs(bench: Bench, tables: list[TableSpec], method: str) -> np.ndarray:
    """Two independent timings (ms) of every busy device of a plan: (devices, 2); the first
    is the one the plan was judged by."""
    plan = bench.plans[method]
    sets = [tuple(ts) for ts in plan.device_tables(tables) if ts]
    pairs = [[t.total_ms for t in bench.measurer.timings(ts, 2)] for ts in sets]
    bench.measurer.save()
    return np.asarray(pairs)


def noise(pairs: np.ndarray) -> float:
    """|max_a - max_b| / mean of a plan's max-device cost from two timings per device."""
    first, second = pairs.max(0)
    return abs(first - second) / ((first + second) / 2)


def noise_floor(pairs: np.ndarray, draws: int = 4000) -> float:
    """Max / mean a perfectly balanced plan would be measured at with this per-device noise:
    E[max_i (1 + s z_i)] over the plan's busy devices, s the relative sd of one timing
    (from the pairs' differences, Var(a - b) = 2 s^2), z standard normal."""
    relative = (pairs[:, 0] - pairs[:, 1]) / pairs.mean(1)
    spread = float(np.sqrt(np.mean(relative**2) / 2))
    z = np.random.default_rng(0).standard_normal((draws, len(pairs)))
    return float(np.mean((1 + spread * z).max(1)))


def summarize(results: list[dict]) -> str:
    methods = [m for m in results[0]["methods"] if "measured" in results[0]["methods"][m]]
    ratios = ["RL / best other", "RL / bound", "noise", "noise floor"]
    lines = [
        "| family | tables x devices | seed | "
        + " | ".join(methods)
        + " | "
        + " | ".join(f"{what} ({m})" for m in rated(results[0]) for what in ratios)
        + " |",
        "|" + "---|" * (len(methods) + 3 + len(rated(results[0])) * len(ratios)),
    ]
    for r in results:
        costs = {m: r["methods"][m].get("measured", float("nan")) for m in methods}
        cells = [f"{r['family']}", f"{r['tables']} x {r['devices']}", f"{r['seed']}"]
        cells += [f"{costs[m]:.3f}" for m in methods]
        for m, (to_best, to_bound) in rated(r).items():
            cells += [
                f"{to_best:.3f}",
                f"{to_bound:.3f}",
                f"{r['noise'][m]:.1%}",
                f"{r['noise_floor'][m]:.3f}",
            ]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def rated(result: dict) -> dict[str, tuple[float, float]]:
    """For `rl` and `rl_measured` (those run): max / the best competitor's max, and max /
    own bound."""
    costs = {m: v["measured"] for m, v in result["methods"].items() if "measured" in v}
    best_other = min(c for m, c in costs.items() if m not in (*RATED, *ABLATIONS))
    return {m: (costs[m] / best_other, costs[m] / result["methods"][m]["bound"])
            for m in RATED if m in costs}  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--model", type=Path, default=Path("runs/sharding/model"))
    parser.add_argument("--cache", type=Path, default=Path("runs/sharding/measurements"))
    parser.add_argument("--configs", default="120x8,480x32", help="TABLESxDEVICES,...")
    parser.add_argument("--families", default=",".join(POOL_FAMILIES))
    parser.add_argument("--seeds", type=int, nargs="+", default=[100])
    parser.add_argument("--skip", default="", help="methods not to run, comma-separated "
                        "(e.g. the ablations and rl_measured, whose timing of every candidate "
                        "takes hours at 128 devices)")  # fmt: skip
    parser.add_argument("--out", type=Path, default=Path("runs/bench_shard_families.json"))
    args = parser.parse_args()
    skipped = set(filter(None, args.skip.split(",")))
    logging.getLogger("torch.fx._symbolic_trace").setLevel(logging.ERROR)
    started = time.perf_counter()
    measurer = Measurer(cache_dir=args.cache)
    trained, _ = load_or_train(args.model, measurer)
    results = []
    for seed in args.seeds:
        bench = Bench(trained, measurer, seed)
        policy, net = trained.policy, trained.cost_net
        bench.sharders[REFINED] = RLSharder(policy, net, refine=True)
        bench.sharders[POLICY_ONLY] = RLSharder(policy, net, select=False)
        bench.sharders[SELECT_BY_MAX] = RLSharder(policy, net, model_error=0.0)
        own = Measurer(MeasureConfig(seed=seed + 1))  # not the judge's inputs or cache
        bench.sharders[MEASURED] = RLSharder(policy, net, measurer=own)
        bench.sharders = {m: s for m, s in bench.sharders.items() if m not in skipped}
        for family in args.families.split(","):
            for config in args.configs.split(","):
                count, devices = (int(x) for x in config.split("x"))
                tables = pool_family(family, count, seed)
                topology = topology_for(tables, devices)
                row = bench.run(tables, topology)
                row |= {"family": family, "tables": count, "devices": devices, "seed": seed}
                pairs = {m: timing_pairs(bench, tables, m) for m in RATED if m in bench.plans}
                row["noise"] = {m: noise(p) for m, p in pairs.items()}
                row["noise_floor"] = {m: noise_floor(p) for m, p in pairs.items()}
                results.append(row)
                print(f"<!-- {family} {config} seed {seed}: "
                      f"{time.perf_counter() - started:.0f} s -->", flush=True)  # fmt: skip
    print(summarize(results))
    for m in rated(results[0]):
        to_best, to_bound = zip(*(rated(r)[m] for r in results), strict=True)
        floors = [r["noise_floor"][m] for r in results]
        print(f"\n{m}: max / balance bound mean {np.mean(to_bound):.3f}, median "
              f"{statistics.median(to_bound):.3f} (noise floor mean {np.mean(floors):.3f}); "
              f"max / best other mean {np.mean(to_best):.3f}, "
              f"worst {max(to_best):.3f}")  # fmt: skip
    print("\nPlanning time (CPU s): " + ", ".join(
        f"{m} {max(r['methods'][m].get('seconds', 0) for r in results):.2f}"
        for m in results[0]["methods"]))  # fmt: skip
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(results, indent=1, default=float))
    print(f"\nKernel: {measurer.kernel}; device: {measurer.device}. "
          f"Total: {time.perf_counter() - started:.0f} s.")  # fmt: skip


if __name__ == "__main__":
    main()
