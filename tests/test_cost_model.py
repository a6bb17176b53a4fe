"""Measurements on the real kernel, communication cost, and the neural cost model."""

from dataclasses import replace

import numpy as np
import pytest
import torch

from cost_models.sharding.cost_net import (
    CostNet,
    CostSample,
    FitConfig,
    errors,
    fit_cost_net,
    load_cost_net,
    predict_kernel_ms,
    save_cost_net,
)
from cost_models.sharding.evaluate import analytic_comm_ms, analytic_kernel_ms, measure_plans
from cost_models.sharding.measure import EMBEDDING_BAG, FBGEMM, KernelTime, MeasureConfig, Measurer
from cost_models.sharding.plan import make_plan
from cost_models.sharding.tables import TableSpec, generate_tables
from cost_models.sharding.topology import Topology, comm_megabytes

SMALL = MeasureConfig(batch_size=64, warmup=1, repeats=3)


def test_fbgemm_kernel_measures_and_caches(tmp_path):
    tables = generate_tables(3, seed=2)
    measurer = Measurer(SMALL, cache_dir=tmp_path)
    assert measurer.kernel == FBGEMM  # fbgemm-gpu-cpu is installed on this project's machines
    first = measurer.measure_many([tables, tables[:1]])
    assert all(t.forward_ms > 0 and t.backward_ms > 0 for t in first)
    assert measurer.measure([]) == KernelTime(0.0, 0.0)
    again = Measurer(SMALL, cache_dir=tmp_path)  # a new process reads the cache from disk
    assert again.measure(tables[::-1]) == first[0]  # order does not matter
    renamed = [replace(t, name=f"x{i}") for i, t in enumerate(tables)]
    assert again.measure(renamed) == first[0]  # nor do names
    assert measurer.device in again.cache_path.read_text()


def test_fallback_kernel_measures():
    time = Measurer(SMALL, kernel=EMBEDDING_BAG).measure(generate_tables(2, seed=3))
    assert time.forward_ms > 0 and time.backward_ms > 0


def test_repeated_samples_take_the_median():
    measurer = Measurer(SMALL)
    tables = generate_tables(2, seed=5)
    measurer.measure(tables, samples=3)
    stored = np.asarray(next(iter(measurer._cache.values())))
    assert stored.shape == (3, 2)
    assert measurer.measure(tables).forward_ms == pytest.approx(np.median(stored[:, 0]))


def test_comm_cost_from_sizes_and_topology():
    tables = [TableSpec("a", 10, 64, pooling_factor=2.0)]
    assert comm_megabytes(tables, 1000) == pytest.approx(1000 * (64 * 8 + 2 * 8) / 1e6)
    inside, across = Topology(8), Topology(16)
    assert across.comm_ms(1.0) > inside.comm_ms(1.0)  # crossing hosts is slower
    plans = {
        "first": make_plan({"a": 0}, tables, 2, "x"),
        "second": make_plan({"a": 1}, tables, 2, "y"),
    }
    costs = measure_plans(plans, tables, Measurer(SMALL), inside)
    assert costs["first"].shape == (2, 3) and costs["first"][1].sum() == 0
    assert costs["first"][0].min() > 0
    assert np.array_equal(costs["first"][0], costs["second"][1])  # the same set, timed once


# 2 hosts x 8 devices; 1 MB/ms inside a host, 0.1 MB/ms across hosts.
HOSTS = Topology(16, local_world_size=8, intra_host_bw=1e6, inter_host_bw=1e5)


def test_hierarchical_comm_of_a_hand_computed_case():
    """Batch 100, a table of 16 columns read 16 times per example (lat.: latency)."""
    table = TableSpec("t", 1600, 16, pooling_factor=16.0)
    a2a_latency = 3 * 0.03  # ids and outputs forward, gradients backward; crossing hosts
    # Table-wise: 100 x (16 x 8 + 16 x 8) bytes; 7/16 of them to its host, 8/16 across.
    whole = make_plan({"t": 0}, [table], 16, "tw")
    expected = max(7 / 16 * 25_600 / 1e6, 8 / 16 * 25_600 / 1e5) + a2a_latency
    assert analytic_comm_ms(whole, [table], HOSTS, 100)[0] == pytest.approx(expected)
    assert analytic_comm_ms(whole, [table], HOSTS, 100)[1:].sum() == 0
    # Row-wise over all 16: each shard gets 1 id per example and reduces full-width sums
    # over every device: 100 x (16 x 8 + 1 x 8) bytes, split like an all-to-all.
    flat = make_plan({}, [table], 16, "rw", row_wise={"t": range(16)})
    rw = 8 / 16 * 13_600 / 1e5 + a2a_latency
    assert analytic_comm_ms(flat, [table], HOSTS, 100) == pytest.approx(np.full(16, rw))
    # Table-row-wise on host 1: 2 ids per example each, 7/8 of the 12,800 bytes of partial
    # sums reduced inside the host (+ 2 reductions' latency), 1/8 of them sent in the all-to-all.
    host = make_plan({}, [table], 16, "twrw", row_wise={"t": range(8, 16)})
    twrw = 8 / 16 * (1_600 + 1_600) / 1e5 + a2a_latency + 7 / 8 * 12_800 / 1e6 + 2 * 0.01
    assert analytic_comm_ms(host, [table], HOSTS, 100) == pytest.approx([0.0] * 8 + [twrw] * 8)
    assert twrw < rw < expected
    # On one host there is no slow link: the all-to-all runs at the intra-host bandwidth.
    one_host = Topology(8, intra_host_bw=1e6, inter_host_bw=1e5)
    tw_one_host = 7 / 8 * 25_600 / 1e6 + 3 * 0.01
    assert analytic_comm_ms(whole, [table], one_host, 100)[0] == pytest.approx(tw_one_host)
    assert Topology(1).comm_ms(5.0) == 0.0  # one device talks to no one


def test_cost_model_rates_row_shards_with_the_analytic_comm():
    """Devices holding only row shards get exactly the analytic communication."""
    net, table = CostNet(), TableSpec("t", 1600, 16, pooling_factor=16.0)
    for ranks in (range(16), range(8)):
        plan = make_plan({}, [table], 16, "rows", row_wise={"t": ranks})
        predicted = net.plan_costs([table], plan, HOSTS)[:, 2]
        expected = analytic_comm_ms(plan, [table], HOSTS, net.config.batch_size)
        assert predicted == pytest.approx(expected, rel=1e-5)


def synthetic_samples(count: int, seed: int = 0) -> list[CostSample]:
    """Device sets with a known, non-additive cost: overhead per call + per table + lookups."""
    pool = generate_tables(200, seed=seed)
    rng = np.random.default_rng(seed)
    samples = []
    for _ in range(count):
        tables = tuple(pool[i] for i in rng.choice(len(pool), rng.integers(1, 12), replace=False))
        lookups = sum(t.embedding_dim * t.pooling_factor for t in tables)
        forward = 0.05 + 0.01 * len(tables) + 2e-5 * lookups
        samples.append(CostSample(tables, KernelTime(forward, 2 * forward)))
    return samples


def test_cost_net_training_lowers_the_loss_and_generalizes():
    train, held_out = synthetic_samples(200), synthetic_samples(60, seed=1)
    net, history = fit_cost_net(train, FitConfig(epochs=60, sets_per_batch=32))
    assert history[-1] < 0.2 * history[0]
    measured = [s.time.total_ms for s in held_out]
    result = errors(predict_kernel_ms(net, [s.tables for s in held_out]), measured)
    assert result["mape"] < 25 and result["kendall_tau"] > 0.6
    # refitting keeps training the same net
    refit, more = fit_cost_net(train, FitConfig(epochs=3), net)
    assert refit is net and more[-1] <= history[0]


def test_plan_costs_max_over_devices_and_empty_devices(tmp_path):
    net = CostNet()
    tables = generate_tables(6, seed=1)
    plan = make_plan({t.name: i % 2 for i, t in enumerate(tables)}, tables, 3, "test")
    costs = net.plan_costs(tables, plan, Topology(3))
    assert costs.shape == (3, 3) and (costs[:2] > 0).all() and (costs[2] == 0).all()
    save_cost_net(net, tmp_path)
    assert np.allclose(load_cost_net(tmp_path).plan_costs(tables, plan, Topology(3)), costs)


def test_torchrec_analytic_estimate_is_per_table_sum():
    samples = synthetic_samples(3)
    both = analytic_kernel_ms(samples, 512)
    assert (both > 0).all()
    alone = analytic_kernel_ms([CostSample((t,), KernelTime(1, 1)) for t in samples[0].tables], 512)
    assert both[0] == pytest.approx(alone.sum())


def test_encoder_shapes():
    net = CostNet()
    assert [m.out_features for m in net.encoder.modules() if isinstance(m, torch.nn.Linear)] == [
        128,
        32,
    ]
    assert all(head[-1].out_features == 1 and head[0].out_features == 64 for head in net.heads)
