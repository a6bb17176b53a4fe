"""The RL sharder: REINFORCE on the cost model, DreamShard's loop, saving and reusing."""

import json

import numpy as np
import torch
from test_cost_model import synthetic_samples

from cost_models.cost_net import CostNet, FitConfig, fit_cost_net
from cost_models.measure import Measurer
from cost_models.policy import PolicyNet, load_policy, run_episodes
from cost_models.sharders import RLSharder
from cost_models.tables import generate_tables
from cost_models.topology import Topology
from cost_models.training import (
    RLConfig,
    TaskConfig,
    quick_config,
    sample_task,
    train_policy,
    train_sharder,
)


def greedy_reward(policy, net, tasks) -> float:
    with torch.no_grad():
        return float(np.mean([run_episodes(policy, net, *t, 1, True).reward for t in tasks]))


def test_policy_learns_on_the_cost_model():
    torch.manual_seed(0)
    net, _ = fit_cost_net(synthetic_samples(150), FitConfig(epochs=30, sets_per_batch=32))
    pool = generate_tables(60, seed=3)
    tasks = TaskConfig(min_tables=8, max_tables=16, max_devices=4)
    rng = np.random.default_rng(1)
    fixed = [sample_task(pool, rng, tasks) for _ in range(10)]
    policy = PolicyNet()
    before = greedy_reward(policy, net, fixed)
    history = train_policy(policy, net, pool, RLConfig(iterations=60, episodes=8, lr=3e-3), tasks)
    assert len(history) == 60
    assert greedy_reward(policy, net, fixed) > before  # lower predicted cost on the same tasks
    tables, topology = pool[:12], Topology(3)
    plan = RLSharder(policy, net).plan(tables, topology)
    assert sorted(plan.assignment) == sorted(t.name for t in tables)


def test_episodes_respect_memory_masks():
    tables = generate_tables(12, seed=1)
    largest = max(t.size_bytes for t in tables)
    topology = Topology(
        3, memory_bytes=int(max(1.1 * sum(t.size_bytes for t in tables) / 3, largest))
    )
    episodes = run_episodes(PolicyNet(), CostNet(), tables, topology, episodes=8)
    sizes = torch.tensor([float(t.size_bytes) for t in tables])
    for ranks, stuck in zip(episodes.ranks, episodes.overflow_step, strict=True):
        used = torch.zeros(3).index_add_(0, ranks, sizes)
        assert stuck < len(tables) or (used <= topology.memory_bytes).all()
    assert episodes.log_prob.requires_grad


def test_dreamshard_loop_saves_a_policy_that_plans_other_sizes(tmp_path):
    config = quick_config()
    trained = train_sharder(config, Measurer(config.measure), log=lambda _: None)
    report = trained.report
    assert report["measured_sets"] > report["held_out_sets"] > 0
    assert set(report["errors"]) == {"cost_model", "torchrec", "torchrec_calibrated"}
    trained.save(tmp_path)
    assert {p.name for p in tmp_path.iterdir()} >= {
        "policy.safetensors",
        "policy.json",
        "cost_net.safetensors",
        "cost_net.json",
        "report.json",
    }
    assert json.loads((tmp_path / "policy.json").read_text()) == {"embedding": 32, "hidden": 64}
    loaded = RLSharder.load(tmp_path)
    for param, saved in zip(loaded.policy.parameters(), trained.policy.parameters(), strict=True):
        assert torch.equal(param, saved)
    for count, devices in [(7, 2), (90, 24)]:  # not the sizes it trained on
        tables = generate_tables(count, seed=count)
        plan = loaded.plan(tables, Topology(devices))
        assert sorted(plan.assignment) == sorted(t.name for t in tables)
        assert set(plan.assignment.values()) <= set(range(devices))
    assert load_policy(tmp_path).config == trained.policy.config
