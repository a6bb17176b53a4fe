"""Training the RL sharder, DreamShard's way.

1. Measure every training table alone, and the device sets of random and heuristic plans
   on training tasks (table sets drawn from the training pool, plus a heavier tail of
   tables, device counts and memory drawn too); fit the cost model.
2. Repeat: train the policy with REINFORCE on the cost model (no hardware in that loop;
   half the tasks with their heavy tables cut into column shards first, as the RL sharder
   cuts them), measure the device sets of the plans it proposes on fresh training tasks
   (column shards included), refit.
3. Report the cost model's error on measured plans of held-out tasks (tables from the
   disjoint evaluation pool) next to torchrec's analytic estimate.
"""

from __future__ import annotations

import functools
import json
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np
import torch

from cost_models.sharding.cost_net import (
    CostNet,
    CostNetConfig,
    CostSample,
    FitConfig,
    fit_cost_net,
    save_cost_net,
)
from cost_models.sharding.evaluate import calibration, compare_estimators, plan_samples
from cost_models.sharding.measure import MeasureConfig, Measurer, single_threaded
from cost_models.sharding.plan import Plan, make_plan
from cost_models.sharding.policy import PolicyNet, run_episodes, save_policy
from cost_models.sharding.sharders import make_sharder
from cost_models.sharding.sharders.rl import SPLIT_LIMITS, RLSharder
from cost_models.sharding.splitting import choose_splits
from cost_models.sharding.tables import (
    PoolConfig,
    TableSpec,
    generate_tables,
    placement_units,
    train_eval_pools,
)
from cost_models.sharding.topology import Topology


@dataclass(frozen=True)
class TaskConfig:
    """How training tasks are drawn: table count, tables per device, memory headroom."""

    min_tables: int = 10
    max_tables: int = 120
    tables_per_device: tuple[float, float] = (3.0, 16.0)
    max_devices: int = 32
    memory_slack: tuple[float, float] = (1.3, 4.0)  # device memory / (total bytes / devices)


@dataclass(frozen=True)
class RLConfig:
    iterations: int = 250  # per round
    episodes: int = 16
    lr: float = 1e-3
    entropy: float = 0.01
    overflow_penalty: float = 1.0  # reward lost by an episode that ran out of memory
    split_share: float = 0.5  # tasks whose heavy tables are first cut as the RL sharder cuts


@dataclass(frozen=True)
class ShardTrainConfig:
    train_pool: int = 800
    eval_pool: int = 1000
    tail_tables: int = 120  # more training tables from a heavier tail (see `tail_pool`)
    initial_tasks: int = 40
    rounds: int = 4
    tasks_per_round: int = 10
    eval_tasks: int = 12
    seed: int = 0
    pool: PoolConfig = field(default_factory=PoolConfig)
    tasks: TaskConfig = field(default_factory=TaskConfig)
    fit: FitConfig = field(default_factory=FitConfig)
    refit: FitConfig = field(default_factory=lambda: FitConfig(epochs=100, lr=1e-3))
    rl: RLConfig = field(default_factory=RLConfig)
    measure: MeasureConfig = field(default_factory=MeasureConfig)


@dataclass
class TrainedSharder:
    cost_net: CostNet
    policy: PolicyNet
    report: dict[str, Any]

    def sharder(self, episodes: int | None = None) -> RLSharder:
        return RLSharder(self.policy, self.cost_net, episodes)

    def save(self, directory: str | Path) -> None:
        save_cost_net(self.cost_net, directory)
        save_policy(self.policy, directory)
        (Path(directory) / "report.json").write_text(json.dumps(self.report, indent=2))


def sample_task(
    pool: Sequence[TableSpec], rng: np.random.Generator, config: TaskConfig
) -> tuple[list[TableSpec], Topology]:
    """A random table set from `pool` and devices with room to spare."""
    count = int(rng.integers(config.min_tables, min(config.max_tables, len(pool)) + 1))
    tables = [pool[i] for i in rng.choice(len(pool), count, replace=False)]
    devices = round(count / rng.uniform(*config.tables_per_device))
    devices = int(np.clip(devices, 2, config.max_devices))
    total = sum(t.size_bytes for t in tables)
    largest = max(t.size_bytes for t in tables)
    memory = max(total / devices * rng.uniform(*config.memory_slack), 1.05 * largest)
    return tables, Topology(devices, memory_bytes=int(memory))


@single_threaded
def train_policy(
    policy: PolicyNet,
    cost_net: CostNet,
    pool: Sequence[TableSpec],
    config: RLConfig,
    tasks: TaskConfig,
    seed: int = 0,
) -> list[float]:
    """REINFORCE on the cost model: mean-reward baseline over the episodes of one task,
    entropy bonus. Returns each iteration's mean reward (see `policy.Episodes.reward`)."""
    rng = np.random.default_rng(seed)
    generator = torch.Generator().manual_seed(seed)
    optimizer = torch.optim.Adam(policy.parameters(), lr=config.lr)
    policy.train()
    history = []
    for _ in range(config.iterations):
        tables, topology = sample_task(pool, rng, tasks)
        if rng.random() < config.split_share:
            tables = _cut_heavy_tables(tables, topology, cost_net, float(rng.choice(SPLIT_LIMITS)))
        episodes = run_episodes(
            policy, cost_net, tables, topology, config.episodes, generator=generator
        )
        overflow = (episodes.overflow_step < len(tables)).float()
        reward = episodes.reward - config.overflow_penalty * overflow
        advantage = (reward - reward.mean()) / (reward.std() + 1e-6)
        loss = -(advantage * episodes.log_prob).mean() - config.entropy * episodes.entropy.mean()
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        history.append(float(reward.mean()))
    policy.eval()
    return history


@single_threaded
def train_sharder(
    config: ShardTrainConfig, measurer: Measurer, log: Callable[[str], None] = print
) -> TrainedSharder:
    """DreamShard's loop: collect real costs, fit the cost model, train the policy on it."""
    start = time.perf_counter()
    rng = np.random.default_rng(config.seed)
    train_pool, eval_pool = train_eval_pools(
        config.train_pool, config.eval_pool, config.seed, config.pool
    )
    train_pool += tail_pool(config)
    tasks = [sample_task(train_pool, rng, config.tasks) for _ in range(config.initial_tasks)]
    log(f"measuring {len(train_pool)} training tables alone, then {len(tasks)} training tasks")
    samples = plan_samples(_one_per_device(train_pool), train_pool, measurer)
    samples += _collect(tasks, ["random", "size_lookup_greedy"], measurer, config.seed, log)
    log(f"measured {len(samples)} device sets ({measurer.kernel}); fitting the cost model")
    net_config = CostNetConfig(
        batch_size=config.measure.batch_size, kernel=measurer.kernel, device=measurer.device
    )
    net, losses = fit_cost_net(samples, config.fit, net_config)
    policy = PolicyNet()
    rewards: list[float] = []
    for round_ in range(config.rounds):
        rewards += train_policy(
            policy, net, train_pool, config.rl, config.tasks, config.seed + round_
        )
        tasks = [sample_task(train_pool, rng, config.tasks) for _ in range(config.tasks_per_round)]
        samples += _collect_policy(tasks, policy, net, measurer)
        net, refit_losses = fit_cost_net(samples, config.refit, net)
        log(
            f"round {round_ + 1}/{config.rounds}: mean reward {np.mean(rewards[-20:]):.3f}, "
            f"{len(samples)} measured sets, cost-model loss {refit_losses[-1]:.4f}"
        )
    eval_tasks = [sample_task(eval_pool, rng, config.tasks) for _ in range(config.eval_tasks)]
    held_out = _collect(eval_tasks, ["random", "lookup_greedy"], measurer, config.seed)
    held_out += _collect_policy(eval_tasks, policy, net, measurer)
    batch = config.measure.batch_size
    calibrated = calibration(samples, batch)
    report = {
        "kernel": measurer.kernel,
        "device": measurer.device,
        "measured_sets": len(samples),
        "held_out_sets": len(held_out),
        "fit_loss": [losses[0], losses[-1]],
        "reward": [float(np.mean(rewards[:20])), float(np.mean(rewards[-20:]))],
        "errors": compare_estimators(net, held_out, calibrated, batch),
        "torchrec_calibration": list(calibrated),
        "seconds": round(time.perf_counter() - start, 1),
        "config": asdict(config),
    }
    return TrainedSharder(net, policy, report)


def _cut_heavy_tables(
    tables: list[TableSpec], topology: Topology, cost_net: CostNet, limit: float
) -> list[TableSpec]:
    """The task's tables with the heavy ones cut into column shards, as `RLSharder` would."""
    cost_alone = functools.partial(cost_net.alone_ms, topology=topology)
    return placement_units(tables, choose_splits(tables, topology.num_devices, cost_alone, limit))


def tail_pool(config: ShardTrainConfig) -> list[TableSpec]:
    """`config.tail_tables` tables with more rows and more multi-hot features than the pool:
    the costliest tables are rare in a power-law pool, and a cost model that has not seen
    their kind underestimates them, and with them the floor they set under a plan."""
    heavier = replace(config.pool, rows_decade_scale=3.0, one_hot_share=0.2)
    tables = generate_tables(config.tail_tables, config.seed + 7919, heavier)
    return [replace(t, name=f"tail{i}") for i, t in enumerate(tables)]


def _one_per_device(tables: Sequence[TableSpec]) -> Plan:
    return make_plan({t.name: i for i, t in enumerate(tables)}, tables, len(tables), "singles")


def _collect(
    tasks: Sequence[tuple[list[TableSpec], Topology]],
    methods: Sequence[str],
    measurer: Measurer,
    seed: int,
    log: Callable[[str], None] | None = None,
) -> list[CostSample]:
    """Measured device sets of each method's plan on each task; with `log`, progress with
    the time left about five times along the way."""
    samples, start, every = [], time.perf_counter(), max(1, len(tasks) // 5)
    for k, (tables, topology) in enumerate(tasks):
        for method in methods:
            plan = make_sharder(method, seed=seed + k).plan(tables, topology)
            samples += plan_samples(plan, tables, measurer)
        done = k + 1
        if log is not None and (done % every == 0 or done == len(tasks)):
            left = (time.perf_counter() - start) / done * (len(tasks) - done)
            log(f"  tasks {done}/{len(tasks)}: {len(samples)} device sets, ~{left:.0f} s left")
    return samples


def _collect_policy(
    tasks: Sequence[tuple[list[TableSpec], Topology]],
    policy: PolicyNet,
    net: CostNet,
    measurer: Measurer,
) -> list[CostSample]:
    sharder = RLSharder(policy, net)
    samples = []
    for tables, topology in tasks:
        samples += plan_samples(sharder.plan(tables, topology), tables, measurer)
    return samples


def quick_config(seed: int = 0) -> ShardTrainConfig:
    """A few seconds' worth of training, for tests and smoke runs."""
    return ShardTrainConfig(
        train_pool=60,
        eval_pool=40,
        tail_tables=10,
        initial_tasks=4,
        rounds=1,
        tasks_per_round=2,
        eval_tasks=2,
        seed=seed,
        tasks=TaskConfig(min_tables=6, max_tables=20, max_devices=4),
        fit=FitConfig(epochs=30),
        refit=FitConfig(epochs=5),
        rl=RLConfig(iterations=5, episodes=4),
        measure=MeasureConfig(batch_size=64, warmup=1, repeats=3),
        pool=PoolConfig(max_rows=20_000),
    )
