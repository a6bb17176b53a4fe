"""Embedding sharding: measured max-device cost of every sharder's plan, planning time, and
the cost model's error next to torchrec's analytic estimator.

    .venv/bin/python bench/bench_sharding.py [--model DIR] [--cache DIR] [--configs 50x4,...]

Without a trained model in --model it first trains the cost model and the RL policy
(`ranknas shard train`'s defaults) and saves them there. Workloads are drawn from the
held-out split of the table pool, which training never saw; each device gets 2x the
balanced share of memory. A "device" is this CPU: each device's table set is timed on the
real fused kernel (forward + backward, batch 512, one thread), communication is computed
from tensor sizes and torchrec's bandwidth constants. Every device of every plan is
measured (no sampling), all plans of a workload interleaved in one shuffled pass; the 4
costliest devices of each plan are then timed twice more (again interleaved) and keep the
median (see `cost_models.sharding.evaluate.measure_plans`). The table-wise floor is the costliest
table alone on a device, among the 16 costliest by either estimator: only plans that cut
tables column-wise (rl, torchrec_cw) can go below it. Two ablations, not counted as
competitors: `rl_table_wise` is the RL sharder without column cuts, `greedy_rl_cuts` is
size-lookup-greedy placing the column shards of the RL plan. Measurements are cached in
--cache, so only the first run pays for them. Prints Markdown.
"""

from __future__ import annotations

import argparse
import json
import logging
import time
from pathlib import Path

import numpy as np
from scipy.stats import kendalltau

from cost_models.sharding.cost_net import CostSample, errors, load_cost_net, predict_kernel_ms
from cost_models.sharding.evaluate import analytic_kernel_ms, measure_plans
from cost_models.sharding.measure import KernelTime, Measurer
from cost_models.sharding.plan import Plan, make_plan
from cost_models.sharding.policy import load_policy
from cost_models.sharding.sharders import METHODS, RLSharder, make_sharder
from cost_models.sharding.tables import PoolConfig, TableSpec, train_eval_pools
from cost_models.sharding.topology import Topology
from cost_models.sharding.training import ShardTrainConfig, TrainedSharder, train_sharder
from search_space.errors import RanknasError

DEFAULT_CONFIGS = "50x4,50x8,200x16,200x32,800x64,800x128"
TABLE_WISE_RL = "rl_table_wise"
GREEDY_ON_RL_CUTS = "greedy_rl_cuts"
COLUMNS = (*METHODS, TABLE_WISE_RL, GREEDY_ON_RL_CUTS)
MEMORY_SLACK = 2.0


def load_or_train(directory: Path, measurer: Measurer) -> tuple[TrainedSharder, float]:
    if (directory / "policy.json").exists():
        report = json.loads((directory / "report.json").read_text())
        return TrainedSharder(load_cost_net(directory), load_policy(directory), report), 0.0
    start = time.perf_counter()
    trained = train_sharder(ShardTrainConfig(), measurer, log=lambda m: print(f"<!-- {m} -->"))
    trained.save(directory)
    return trained, time.perf_counter() - start


def held_out_pool(report: dict) -> list[TableSpec]:
    """The evaluation split of the pool the model was trained on."""
    config = report["config"]
    pool = PoolConfig(
        **{k: tuple(v) if isinstance(v, list) else v for k, v in config["pool"].items()}
    )
    return train_eval_pools(config["train_pool"], config["eval_pool"], config["seed"], pool)[1]


def workload(pool: list[TableSpec], count: int, devices: int, seed: int):
    rng = np.random.default_rng([seed, count, devices])
    tables = [pool[i] for i in rng.choice(len(pool), count, replace=False)]
    total = sum(t.size_bytes for t in tables)
    memory = max(MEMORY_SLACK * total / devices, 1.05 * max(t.size_bytes for t in tables))
    return tables, Topology(devices, memory_bytes=int(memory))


class Bench:
    def __init__(self, trained: TrainedSharder, measurer: Measurer, seed: int) -> None:
        self.trained, self.measurer, self.seed = trained, measurer, seed
        self.sharders = {m: make_sharder(m, seed=seed) for m in METHODS if m != "rl"}
        self.sharders["rl"] = RLSharder(trained.policy, trained.cost_net)
        # Ablation: the same policy without column cuts (not counted as a competitor).
        self.sharders[TABLE_WISE_RL] = RLSharder(trained.policy, trained.cost_net, split_limits=())
        self.offset, self.scale = trained.report["torchrec_calibration"]
        self.samples: dict[str, CostSample] = {}  # every measured device set, by signature
        self.plans: dict[str, Plan] = {}

    def run(self, tables: list[TableSpec], topology: Topology) -> dict:
        plans, row = {}, {"floor": self._table_wise_floor(tables, topology), "methods": {}}
        for method, sharder in self.sharders.items():
            start = time.thread_time()  # CPU time: the machine is shared, a device is not
            try:
                plans[method] = sharder.plan(tables, topology)
            except RanknasError as exc:
                row["methods"][method] = {"error": str(exc)}
                continue
            row["methods"][method] = {"seconds": time.thread_time() - start}
        if "rl" in plans:
            plans[GREEDY_ON_RL_CUTS] = greedy_on_cuts(plans["rl"], tables, topology)
            row["methods"][GREEDY_ON_RL_CUTS] = {"seconds": float("nan")}
        self.plans = plans  # the last run's plans, by method
        measured = measure_plans(plans, tables, self.measurer, topology, seed=self.seed)
        for method, plan in plans.items():
            row["methods"][method] |= self._costs(plan, tables, topology, measured[method])
        return row

    def _costs(self, plan, tables, topology, measured: np.ndarray) -> dict:
        sets = [tuple(ts) for ts in plan.device_tables(tables)]
        busy = [rank for rank, ts in enumerate(sets) if ts]
        samples = [CostSample(sets[rank], self.measurer.measure(sets[rank])) for rank in busy]
        self.samples |= {str(sorted(t.signature for t in s.tables)): s for s in samples}
        analytic = measured[:, 2].copy()  # communication, then torchrec's fitted compute
        batch = self.measurer.config.batch_size
        analytic[busy] += self.offset + self.scale * analytic_kernel_ms(samples, batch)
        predicted = self.trained.cost_net.plan_costs(tables, plan, topology).sum(1)
        return {
            "measured": float(measured.sum(1).max()),
            "bound": float(measured.sum(1).mean()),  # the mean device: no plan's max is lower
            "predicted": float(predicted.max()),
            "analytic": float(analytic.max()),
        }

    def _table_wise_floor(self, tables: list[TableSpec], topology: Topology) -> float:
        """The costliest table alone on a device, among the 16 costliest by either estimate:
        no plan that keeps tables whole can do better."""
        batch = self.measurer.config.batch_size
        singles = [CostSample((t,), KernelTime(0.0, 0.0)) for t in tables]
        by_model = predict_kernel_ms(self.trained.cost_net, [s.tables for s in singles])
        by_torchrec = analytic_kernel_ms(singles, batch)
        top = {int(i) for order in (by_model, by_torchrec) for i in np.argsort(order)[::-1][:16]}
        candidates = [tables[i] for i in sorted(top)]
        alone = make_plan({t.name: i for i, t in enumerate(candidates)}, candidates, len(top), "")
        costs = measure_plans({"alone": alone}, candidates, self.measurer, topology)["alone"]
        return float(costs.sum(1).max())


def greedy_on_cuts(plan: Plan, tables: list[TableSpec], topology: Topology) -> Plan:
    """Ablation: size-lookup-greedy placing the same column shards as `plan`, around its row
    shards (held where `plan` has them)."""
    cut = [t for t in tables if t.name in plan.row_wise]
    held = [(u, plan.assignment[u.name]) for u in plan.units(cut)]
    rest = plan.units([t for t in tables if t.name not in plan.row_wise])
    assignment = make_sharder("size_lookup_greedy").place(rest, topology, held)
    assignment |= {u.name: rank for u, rank in held}
    return make_plan(assignment, tables, topology.num_devices, "greedy", plan.splits,
                     plan.row_wise)  # fmt: skip


def markdown(header: list[str], rows: list[list[str]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    return "\n".join(lines + ["| " + " | ".join(r) + " |" for r in rows])


def cost_table(results: dict) -> tuple[str, list[float]]:
    rows, gains = [], []
    for (count, devices), row in results.items():
        m = row["methods"]
        cells = [f"{m[k]['measured']:.3f}" if "measured" in m[k] else "no plan" for k in COLUMNS]
        best = min(m[k]["measured"] for k in METHODS if k != "rl" and "measured" in m[k])
        gain = (1 - m["rl"]["measured"] / best) * 100
        gains.append(gain)
        rows.append([f"{count} x {devices}", f"{row['floor']:.3f}", *cells, f"{gain:+.1f}%"])
    header = ["tables x devices", "table-wise floor", *COLUMNS, "RL vs best other"]
    return markdown(header, rows), gains


def time_table(results: dict) -> str:
    rows = [
        [f"{c} x {d}", *(f"{row['methods'][k].get('seconds', float('nan')):.3f}" for k in COLUMNS)]
        for (c, d), row in results.items()
    ]
    return markdown(["tables x devices", *COLUMNS], rows)


def plan_ranking_tau(results: dict, key: str) -> float:
    """Mean over workloads of Kendall tau between predicted and measured plan max costs."""
    taus = []
    for row in results.values():
        plans = [v for v in row["methods"].values() if "measured" in v]
        taus.append(kendalltau([p[key] for p in plans], [p["measured"] for p in plans]).statistic)
    return float(np.mean(taus))


def error_table(bench: Bench, results: dict) -> str:
    report = bench.trained.report["errors"]
    samples = list(bench.samples.values())
    measured = [s.time.total_ms for s in samples]
    analytic = analytic_kernel_ms(samples, bench.measurer.config.batch_size)
    predicted = predict_kernel_ms(bench.trained.cost_net, [s.tables for s in samples])
    here = {
        "cost_model": errors(predicted, measured),
        "torchrec": errors(analytic, measured),
        "torchrec_calibrated": errors(bench.offset + bench.scale * analytic, measured),
    }
    ranking = {"cost_model": "predicted", "torchrec_calibrated": "analytic"}
    labels = {
        "cost_model": "learned cost model",
        "torchrec": "torchrec EmbeddingPerfEstimator",
        "torchrec_calibrated": "torchrec, line fitted to this CPU",
    }
    rows = []
    for name, label in labels.items():
        tau = f"{plan_ranking_tau(results, ranking[name]):.3f}" if name in ranking else "same"
        rows.append(
            [
                label,
                f"{report[name]['mape']:.1f}",
                f"{report[name]['kendall_tau']:.3f}",
                f"{here[name]['mape']:.1f}",
                f"{here[name]['kendall_tau']:.3f}",
                tau,
            ]
        )
    held_out = bench.trained.report["held_out_sets"]
    header = [
        "estimator",
        f"MAPE % ({held_out} held-out sets, training)",
        "Kendall tau",
        f"MAPE % ({len(samples)} device sets here)",
        "Kendall tau",
        "plan-ranking tau",
    ]
    return markdown(header, rows)


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--model", type=Path, default=Path("runs/sharding/model"))
    parser.add_argument("--cache", type=Path, default=Path("runs/sharding/measurements"))
    parser.add_argument("--configs", default=DEFAULT_CONFIGS, help="TABLESxDEVICES,...")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    logging.getLogger("torch.fx._symbolic_trace").setLevel(logging.ERROR)
    start = time.perf_counter()
    measurer = Measurer(cache_dir=args.cache)
    trained, train_seconds = load_or_train(args.model, measurer)
    pool = held_out_pool(trained.report)
    bench = Bench(trained, measurer, args.seed)
    results = {}
    for config in args.configs.split(","):
        count, devices = (int(x) for x in config.split("x"))
        results[(count, devices)] = bench.run(*workload(pool, count, devices, args.seed))
    costs, gains = cost_table(results)
    print("### Measured max-device cost per training step (ms, lower is better)\n")
    print(costs)
    print(f"\nRL vs the best other plan, mean over rows: {np.mean(gains):+.1f}%")
    print("\n### Planning time (CPU seconds of the planning thread)\n")
    print(time_table(results))
    print("\n### Cost prediction on held-out tables: per device set, and ranking plans\n")
    print(error_table(bench, results))
    print(
        f"\nKernel: {measurer.kernel}; device: {measurer.device}; batch "
        f"{measurer.config.batch_size}. Training: {train_seconds:.0f} s (0: loaded from "
        f"{args.model}). Total: {time.perf_counter() - start:.0f} s."
    )


if __name__ == "__main__":
    main()
