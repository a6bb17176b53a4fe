"""The RL sharder: REINFORCE on the cost model, DreamShard's loop, saving and reusing."""

import functools
import json

import numpy as np
import pytest
import torch
from test_cost_model import synthetic_samples
from torchrec.distributed.types import ShardingType

from cost_models.sharding.cost_net import CostNet, CostSample, FitConfig, fit_cost_net, run_mlp
from cost_models.sharding.measure import KernelTime, Measurer
from cost_models.sharding.plan import make_plan
from cost_models.sharding.policy import (
    PolicyNet,
    _draw_by_inverse_cdf,
    _ProjectedDevices,
    _sample,
    _schedule,
    _SummedDevices,
    _Tables,
    load_policy,
    run_episodes,
)
from cost_models.sharding.refine import device_costs, refine
from cost_models.sharding.sharders import RLSharder
from cost_models.sharding.sharders.dim_greedy import DimGreedy
from cost_models.sharding.sharders.lookup_greedy import LookupGreedy
from cost_models.sharding.sharders.rl import (
    EPISODE_WORK,
    MAX_EPISODES,
    MIN_EPISODES,
    MODEL_ERROR,
    ROW_MODES,
    episode_count,
    robust_max_ms,
    row_wise_tables,
)
from cost_models.sharding.sharders.size_greedy import SizeGreedy
from cost_models.sharding.sharders.size_lookup_greedy import SizeLookupGreedy
from cost_models.sharding.splitting import choose_splits, column_cuts
from cost_models.sharding.tables import (
    TableSpec,
    column_shards,
    fills_row_shards,
    generate_tables,
    row_shards,
)
from cost_models.sharding.topology import Topology
from cost_models.sharding.torchrec_adapter import build_ebc, to_sharding_plan
from cost_models.sharding.training import (
    RLConfig,
    TaskConfig,
    quick_config,
    sample_task,
    train_policy,
    train_sharder,
)
from search_space.errors import RanknasError


def greedy_reward(policy, net, tasks) -> float:
    with torch.no_grad():
        return float(np.mean([run_episodes(policy, net, *t, 1, True).reward for t in tasks]))


@pytest.fixture(scope="module")
def learned():
    """A cost model fitted to synthetic costs, and a policy trained on it; the policy's
    greedy reward on 10 fixed tasks before and after training."""
    torch.manual_seed(0)
    net, _ = fit_cost_net(synthetic_samples(150), FitConfig(epochs=30, sets_per_batch=32))
    pool = generate_tables(60, seed=3)
    tasks = TaskConfig(min_tables=8, max_tables=16, max_devices=4)
    rng = np.random.default_rng(1)
    fixed = [sample_task(pool, rng, tasks) for _ in range(10)]
    policy = PolicyNet()
    before = greedy_reward(policy, net, fixed)
    history = train_policy(policy, net, pool, RLConfig(iterations=60, episodes=8, lr=3e-3), tasks)
    return net, policy, pool, history, before, greedy_reward(policy, net, fixed)


def test_policy_learns_on_the_cost_model(learned):
    net, policy, pool, history, before, after = learned
    assert len(history) == 60
    assert after > before  # lower predicted cost on the same tasks
    tables, topology = pool[:12], Topology(3)
    plan = RLSharder(policy, net).plan(tables, topology)
    assert sorted(plan.assignment) == sorted(u.name for u in plan.units(tables))


def test_choose_splits_cuts_only_tables_above_the_limit_into_the_fewest_shards():
    tables = [TableSpec("hot", 1000, 64, 40.0), TableSpec("odd", 1000, 12, 90.0)]
    tables += [TableSpec(f"s{i}", 1000, 16, 4.0) for i in range(8)]

    def cost(ts):  # a fixed cost per table plus one per looked-up column
        return np.asarray([0.1 + 0.001 * t.embedding_dim * t.pooling_factor for t in ts])

    splits = choose_splits(tables, 4, cost, limit_share=1.0)
    limit = cost(tables).sum() / 4
    assert splits == {"hot": 4}  # 2 shards still cost more than the limit; 12 columns: no cut
    assert cost(column_shards(tables[0], 4))[0] <= limit < cost(column_shards(tables[0], 2))[0]
    assert choose_splits(tables, 2, cost, limit_share=1.0) == {"hot": 2}  # at most one per device
    assert choose_splits(tables, 4, cost, limit_share=10.0) == {}


def lookup_bound_samples(count: int) -> list[CostSample]:
    """Device sets whose cost is mostly looked-up columns (as for wide, pooled tables)."""
    pool = generate_tables(200, seed=5)
    rng = np.random.default_rng(5)
    samples = []
    for _ in range(count):
        tables = tuple(pool[i] for i in rng.choice(len(pool), rng.integers(1, 12), replace=False))
        forward = 0.01 + 1e-4 * sum(t.embedding_dim * t.pooling_factor for t in tables)
        samples.append(CostSample(tables, KernelTime(forward, 2 * forward)))
    return samples


def test_rl_sharder_cuts_a_dominant_table_below_the_table_wise_floor():
    torch.manual_seed(0)
    net, _ = fit_cost_net(lookup_bound_samples(200), FitConfig(epochs=40, sets_per_batch=32))
    hot = TableSpec("hot", 2000, 128, 60.0)
    tables = [hot, *(TableSpec(f"s{i}", 1000, 16, 2.0) for i in range(7))]
    topology = Topology(4)
    floor = net.alone_ms([hot], topology)[0]
    by_columns = RLSharder(PolicyNet(), net, row_cut_heavy=False).plan(tables, topology)
    assert by_columns.splits.get("hot", 1) > 1 and not by_columns.row_wise
    # Even cut into 4 column shards (the most on 4 devices), each shard reads all 60 ids a
    # row and stays above a balanced device: cut by rows, the lookups are shared out.
    assert column_cuts(tables, 4, functools.partial(net.alone_ms, topology=topology), 1.0)[1] == {
        "hot"
    }
    plan = RLSharder(PolicyNet(), net).plan(tables, topology)
    assert plan.row_wise == {"hot": (0, 1, 2, 3)} and not plan.splits
    for p in (by_columns, plan):
        assert sorted(p.assignment) == sorted(u.name for u in p.units(tables))
        assert sum(p.memory_bytes) == sum(t.size_bytes for t in tables)
        assert net.plan_costs(tables, p, topology).sum(1).max() < floor
    plan_costs = [
        float(net.plan_costs(tables, p, topology).sum(1).max()) for p in (by_columns, plan)
    ]
    assert plan_costs[1] < plan_costs[0]  # kept because it is predicted cheaper
    table_wise = RLSharder(PolicyNet(), net, split_limits=(), row_cut_heavy=False)
    assert not table_wise.plan(tables, topology).splits


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
        assert sorted(plan.assignment) == sorted(u.name for u in plan.units(tables))
        assert set(plan.assignment.values()) <= set(range(devices))
    assert load_policy(tmp_path).config == trained.policy.config


def test_episodes_fill_a_fixed_amount_of_work():
    assert episode_count(800, 128) == MIN_EPISODES  # the largest benchmark workload
    assert episode_count(50, 4) == MAX_EPISODES
    assert MIN_EPISODES < episode_count(400, 64) < MAX_EPISODES
    assert episode_count(400, 64) * 400 * 64 <= EPISODE_WORK


def test_refine_brings_a_bad_plan_near_the_balance_bound_within_memory(learned):
    net, *_ = learned
    units = generate_tables(40, seed=5)
    topology = Topology(4, memory_bytes=int(0.6 * sum(t.size_bytes for t in units)))
    start = [i % 2 for i in range(len(units))]  # two devices idle
    before = device_costs(net, units, start, topology)
    ranks = refine(net, units, start, topology)
    after = device_costs(net, units, ranks, topology)
    assert after.max() < 0.7 * before.max()
    assert after.max() <= 1.10 * after.mean()  # within 10% of the balance bound
    sizes = torch.tensor([float(t.size_bytes) for t in units])
    used = torch.zeros(4).index_add_(0, torch.tensor(ranks), sizes)
    assert (used <= topology.memory_bytes).all()
    assert refine(net, units, ranks, topology) == ranks  # a local optimum stays put


def test_the_refined_rl_plan_is_never_rated_worse_than_the_unrefined(learned):
    """The local search never raises the max of the plan it starts from. (The sharder's
    final plan is selected by the robust max, which may trade a little max for balance.)"""
    net, policy, pool, *_ = learned
    tables, topology = pool[:30], Topology(4)

    def rated(ranks):  # the floored device costs that the episodes and `refine` use
        return float(device_costs(net, tables, ranks, topology).max())

    plain = RLSharder(policy, net, select=False).plan(tables, topology)
    start = [plain.assignment[t.name] for t in tables]
    assert rated(refine(net, tables, start, topology)) <= rated(start) + 1e-6


def test_robust_max_charges_for_every_device_near_the_max():
    one_peak = torch.tensor([1.0, 0.8, 0.8, 0.8])
    all_peak = torch.tensor([1.0, 1.0, 1.0, 1.0])
    assert robust_max_ms(one_peak, 0.0) == robust_max_ms(all_peak, 0.0) == 1.0
    # Four devices at the max: about the max plus one standard deviation of their error.
    assert robust_max_ms(all_peak, 0.1) > 1.05 * robust_max_ms(one_peak, 0.1)
    assert robust_max_ms(one_peak, 0.1) == pytest.approx(1.0, abs=0.02)


def test_the_selected_plan_is_rated_no_worse_than_the_policys_or_any_heuristics(learned):
    net, policy, pool, *_ = learned
    tables, topology = pool[:30], Topology(4)

    def score(plan):
        ranks = [plan.assignment[t.name] for t in tables]
        return robust_max_ms(device_costs(net, tables, ranks, topology), MODEL_ERROR)

    selected = score(RLSharder(policy, net, split_limits=()).plan(tables, topology))
    assert selected <= score(RLSharder(policy, net, split_limits=(), select=False).plan(
        tables, topology)) + 1e-9  # fmt: skip
    for sharder in (SizeLookupGreedy(), LookupGreedy(), SizeGreedy(), DimGreedy()):
        assert selected <= score(sharder.plan(tables, topology)) + 1e-9


def test_a_table_bigger_than_a_device_is_cut_by_rows_within_a_host(learned):
    net, policy, *_ = learned
    huge = TableSpec("huge", 400_000, 64, 20.0)  # 102 MB
    tables = [huge, *(TableSpec(f"s{i}", 5_000, 16, 2.0) for i in range(12))]
    # 2 hosts x 4 devices of 60 MB: half a host holds the table, so it may stay in host 0.
    hosts = Topology(8, memory_bytes=60_000_000, local_world_size=4)
    plan = RLSharder(policy, net, row_mode="host").plan(tables, hosts)
    assert plan.row_wise == {"huge": (0, 1, 2, 3)}
    assert max(plan.memory_bytes) <= hosts.memory_bytes
    assert sorted(plan.assignment) == sorted(u.name for u in plan.units(tables))
    module_plan = to_sharding_plan(plan, build_ebc(tables)).plan[""]
    assert module_plan["huge"].sharding_type == ShardingType.TABLE_ROW_WISE.value
    # 2 hosts x 2 devices of 45 MB: no host has room to spare; row-wise over every device.
    small_hosts = Topology(4, memory_bytes=45_000_000, local_world_size=2)
    plan = RLSharder(policy, net, row_mode="host").plan(tables, small_hosts)
    assert plan.row_wise == {"huge": (0, 1, 2, 3)}
    assert max(plan.memory_bytes) <= small_hosts.memory_bytes
    module_plan = to_sharding_plan(plan, build_ebc(tables)).plan[""]
    assert module_plan["huge"].sharding_type == ShardingType.ROW_WISE.value


def test_each_device_loses_only_the_memory_of_its_own_row_shards(learned):
    """A table cut by rows inside host 0 leaves host 1 empty: the other tables fit only if
    host 1's devices keep all their memory (a uniform deduction finds no plan)."""
    net, policy, *_ = learned
    huge = TableSpec("huge", 400_000, 64, 20.0)  # 102 MB: 25.6 MB on each device of host 0
    small = [TableSpec(f"s{i}", 40_000, 64, 2.0) for i in range(30)]  # 10.2 MB each
    tables = [huge, *small]
    hosts = Topology(8, memory_bytes=60_000_000, local_world_size=4)
    assert sum(t.size_bytes for t in small) > 8 * (hosts.memory_bytes - huge.size_bytes / 4)
    plan = RLSharder(policy, net, row_mode="host").plan(tables, hosts)
    assert plan.row_wise == {"huge": (0, 1, 2, 3)}
    assert max(plan.memory_bytes) <= hosts.memory_bytes
    assert sorted(plan.assignment) == sorted(u.name for u in plan.units(tables))
    on_host_1 = sum(plan.assignment[t.name] >= 4 for t in small)
    assert on_host_1 >= 17  # host 0's devices hold at most 3 small tables beside a shard


def test_episodes_start_from_the_pinned_row_shards_cost_and_memory(learned):
    net, policy, pool, *_ = learned
    shards = row_shards(TableSpec("huge", 400_000, 64, 20.0), 2)
    units = [*shards, *pool[:10]]
    topology = Topology(4, memory_bytes=int(0.6 * sum(t.size_bytes for t in units)))
    with torch.no_grad():
        episodes = run_episodes(policy, net, units, topology, 4, True, pinned=[1, 3])
    assert (episodes.ranks[:, :2] == torch.tensor([1, 3])).all()
    assert (episodes.overflow_step == len(units)).all()
    for ranks, cost in zip(episodes.ranks.tolist(), episodes.cost_ms.tolist(), strict=True):
        rated = device_costs(net, units, ranks, topology)  # every unit, the shards included
        assert cost == pytest.approx(float(rated.max()), rel=1e-4)
    pinned_refine = refine(net, units, [1, 1, *([0] * 10)], topology, pinned=2)
    assert pinned_refine[:2] == [1, 1]


def test_table_row_wise_inside_a_host_beats_row_wise_across_hosts_on_a_slow_link(learned):
    net, policy, *_ = learned
    huge = TableSpec("huge", 400_000, 64, 20.0)  # 102 MB
    # Light tables beside it: the big table's partial sums are most of the traffic (with
    # heavier ones, their all-to-all, which no cut keeps in a host, decides the max).
    tables = [huge, *(TableSpec(f"s{i}", 5_000, 4, 1.0) for i in range(12))]
    # 2 hosts x 4 devices, 1 GB/s across hosts (NVLink-class inside).
    slow = Topology(8, memory_bytes=60_000_000, local_world_size=4, inter_host_bw=1e6)
    plans = {mode: RLSharder(policy, net, row_mode=mode).plan(tables, slow) for mode in
             ("auto", "host", "world")}  # fmt: skip
    assert plans["auto"].row_wise == plans["host"].row_wise == {"huge": (0, 1, 2, 3)}
    assert plans["world"].row_wise == {"huge": tuple(range(8))}
    # Either cut with the small tables where the host plan put them: the policy's places for
    # them (trained here in seconds) move with the CPU's float rounding, and only the cut
    # of the big table is compared.
    small = {t.name: plans["host"].assignment[t.name] for t in tables[1:]}
    cuts = {mode: make_plan(small, tables, 8, mode, row_wise=plans[mode].row_wise)
            for mode in ("host", "world")}  # fmt: skip
    costs = {mode: net.plan_costs(tables, plan, slow) for mode, plan in cuts.items()}
    assert costs["host"][:, 2].max() < costs["world"][:, 2].max()
    assert costs["host"].sum(1).max() < costs["world"].sum(1).max()
    # One host of 8: cutting over "one host" is cutting over every device; nothing differs.
    one_host = Topology(8, memory_bytes=60_000_000)
    assert RLSharder(policy, net, row_mode="host").plan(tables, one_host).row_wise == {
        "huge": tuple(range(8))
    }


def test_episode_fast_paths_compute_exactly_what_torch_modules_do():
    """The episode loop's direct kernel calls and sampling change no plan: bit for bit the
    results of the nn.Modules and of `torch.distributions.Categorical`."""
    torch.manual_seed(0)
    policy, net = PolicyNet(), CostNet()
    x = torch.randn(15, 128, policy.scorer[0].in_features)
    assert torch.equal(run_mlp(policy.scorer, x), policy.scorer(x))
    summed = torch.rand(15, 128, net.config.embedding) * 3
    expected = torch.nn.functional.softplus(torch.cat([h(summed) for h in net.heads], dim=-1))
    assert torch.equal(net.predict(summed), expected)
    logits = torch.randn(15, 128).masked_fill(torch.rand(15, 128) < 0.3, float("-inf"))
    action, log_prob, entropy = _sample(logits, torch.Generator().manual_seed(3), slice(0, 1))
    dist = torch.distributions.Categorical(logits=logits)
    sampled = torch.multinomial(dist.probs, 1, generator=torch.Generator().manual_seed(3))
    sampled = sampled.squeeze(-1)
    sampled[0] = dist.probs[0].argmax()
    assert torch.equal(action, sampled)
    assert torch.equal(log_prob, dist.log_prob(action))
    assert torch.equal(entropy, dist.entropy())
    # Planning draws by the inverse CDF: other draws, the same distribution, never a mask.
    rows = logits[1:3].repeat(10_000, 1)
    drawn = _draw_by_inverse_cdf(rows, torch.Generator().manual_seed(4), slice(0, None, 5000))
    assert torch.equal(drawn[::5000], rows[::5000].argmax(-1))
    for first, r in ((0, 1), (1, 2)):  # rows alternate between logits[1] and logits[2]
        counts = torch.bincount(drawn[first::2], minlength=128) / len(drawn[first::2])
        assert torch.allclose(counts, dist.probs[r], atol=0.01)
        assert (counts[logits[r] == float("-inf")] == 0).all()


def test_projected_devices_compute_what_summed_devices_do():
    """Planning's cached first-layer projections, with groups of tables in one loop, give
    at every step the costs and logits of feeding each group's summed encodings whole (up
    to float rounding), and the same plans."""
    torch.manual_seed(0)
    policy, net = PolicyNet().eval(), CostNet().eval()
    tables = generate_tables(40, seed=2)
    topology = Topology(6, memory_bytes=int(sum(t.size_bytes for t in tables) / 3))
    groups = [tables[5:], [*column_shards(tables[0], 2), *tables[1:]]]
    generator = torch.Generator().manual_seed(1)
    with torch.no_grad():
        encoded = _Tables.encode(groups, policy, net, topology)
        together = _ProjectedDevices(encoded, policy, net, topology, 2)
        schedule = _schedule(encoded, [list(range(len(g))) for g in groups], 2)
        alone = [_SummedDevices(_Tables.encode([g], policy, net, topology), policy, net,
                                topology, 2) for g in groups]  # fmt: skip
        for step, units in enumerate(schedule):
            new_cost = together.cost_with(units)
            logits = together.logits(units, new_cost)
            action = torch.randint(6, (4,), generator=generator)
            for g, devices in enumerate(alone):
                rows = slice(2 * g, 2 * g + 2)
                if step < len(groups[g]):
                    cost = devices.cost_with(torch.full((2,), step))
                    assert torch.allclose(new_cost[rows], cost, rtol=1e-5)
                    expected = devices.logits(torch.full((2,), step), cost)
                    assert torch.allclose(logits[rows], expected, rtol=1e-4, atol=1e-5)
                    devices.place(torch.full((2,), step), action[rows], cost)
            together.place(units, action, new_cost, units == encoded.nothing)
        runs = [
            run_episodes(policy, net, tables, topology, 8, True, generator.manual_seed(3), (), p)
            for p in (False, True)
        ]
    assert torch.equal(runs[0].ranks, runs[1].ranks)
    assert torch.allclose(runs[0].cost_ms, runs[1].cost_ms)


def test_a_table_is_cut_by_rows_only_into_shards_that_all_hold_rows():
    # torchrec's blocks are ceil(rows / parts): 11,147 rows in blocks of 88 fill 127 of 128.
    table = TableSpec("t", 11_147, 16, 40.0)
    assert not fills_row_shards(table, 128) and fills_row_shards(table, 64)
    with pytest.raises(RanknasError, match="do not fill 128 row shards"):
        row_shards(table, 128)
    assert sum(s.num_embeddings for s in row_shards(table, 64)) == 11_147


def test_a_heavy_table_too_short_for_every_device_is_cut_over_one_host():
    tables = [TableSpec("short", 50, 64, 80.0), TableSpec("long", 100_000, 64, 80.0)]
    topology = Topology(16)  # 2 hosts of 8: 50 rows fill 8 blocks of 7, not 16 of 4
    first, second, every = tuple(range(8)), tuple(range(8, 16)), tuple(range(16))
    expected = {  # the longest first; hosts taken in turn ("auto" without estimates: "host")
        "auto": {"long": first, "short": second},
        "host": {"long": first, "short": second},
        "world": {"long": every, "short": first},
    }
    for mode in ROW_MODES:
        assert row_wise_tables(tables, topology, None, mode, {"short", "long"}) == expected[mode]
        assert row_wise_tables(tables, topology, None, mode) == {}  # neither is too big
