"""Plans as torchrec `ShardingPlan`s, and a real DistributedModelParallel run on 2 processes."""

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

from torchrec.distributed.types import ShardingPlan, ShardingType

from cost_models.sharding.measure import Measurer
from cost_models.sharding.plan import Plan, make_plan
from cost_models.sharding.sharders import make_sharder
from cost_models.sharding.tables import (
    TableSpec,
    generate_tables,
    save_tables,
    shard_name,
    tables_from_architecture,
)
from cost_models.sharding.topology import Topology
from cost_models.sharding.torchrec_adapter import build_ebc, to_sharding_plan
from cost_models.sharding.training import quick_config, train_sharder
from search_space.builder import build_model
from search_space.presets import preset

ROOT = Path(__file__).resolve().parents[1]


def test_plan_converts_to_a_sharding_plan_for_a_built_model(small_schema):
    arch = preset("dlrm", small_schema)
    tables = tables_from_architecture(arch)
    plan = make_sharder("size_lookup_greedy").plan(tables, Topology(2))
    model = build_model(arch, seed=0)
    sharding = to_sharding_plan(plan, model.embedding_bags, "embedding_bags")
    assert isinstance(sharding, ShardingPlan)
    module_plan = sharding.get_plan_for_module("embedding_bags")
    assert set(module_plan) == {t.name for t in tables}
    for name, rank in plan.assignment.items():
        assert module_plan[name].sharding_type == ShardingType.TABLE_WISE.value
        assert module_plan[name].ranks == [rank]


def test_split_tables_become_column_wise_shards_on_their_ranks():
    tables = [TableSpec("wide", 1000, 64, 8.0), TableSpec("narrow", 500, 16)]
    shards = {shard_name("wide", j): rank for j, rank in enumerate([2, 0, 3, 0])}
    plan = make_plan(shards | {"narrow": 1}, tables, 4, "test", {"wide": 4})
    assert plan.memory_bytes == (2 * 1000 * 16 * 4, 500 * 16 * 4, 1000 * 16 * 4, 1000 * 16 * 4)
    module_plan = to_sharding_plan(plan, build_ebc(tables)).plan[""]
    assert module_plan["wide"].sharding_type == ShardingType.COLUMN_WISE.value
    assert module_plan["wide"].ranks == [2, 0, 3, 0]
    offsets = [s.shard_offsets[1] for s in module_plan["wide"].sharding_spec.shards]
    assert offsets == [0, 16, 32, 48]
    assert module_plan["narrow"].ranks == [1]


def test_row_split_tables_become_row_wise_or_table_row_wise_shards():
    tables = [TableSpec("huge", 10_001, 32, 40.0), TableSpec("big", 4_000, 16, 8.0),
              TableSpec("small", 100, 16)]  # fmt: skip
    row_wise = {"huge": (0, 1, 2, 3), "big": (2, 3)}  # every rank; host 1 of 2 x 2
    plan = make_plan({"small": 0}, tables, 4, "test", row_wise=row_wise)
    units = {u.name: u for u in plan.units(tables)}
    assert [units[f"huge/rw{j}"].num_embeddings for j in range(4)] == [2501, 2501, 2501, 2498]
    assert units["huge/rw0"].pooling_factor == 10.0  # hashed ids: a quarter of the lookups
    assert plan.memory_bytes[0] == (2501 * 32 + 100 * 16) * 4
    assert plan.memory_bytes[3] == (2498 * 32 + 2000 * 16) * 4
    module_plan = to_sharding_plan(plan, build_ebc(tables)).plan[""]
    assert module_plan["huge"].sharding_type == ShardingType.ROW_WISE.value
    assert module_plan["huge"].ranks == [0, 1, 2, 3]
    assert module_plan["big"].sharding_type == ShardingType.TABLE_ROW_WISE.value
    assert module_plan["big"].ranks == [2, 3]
    assert Plan.from_dict(plan.to_dict()) == plan


def test_torchrec_column_wise_plans_read_back_as_splits():
    tables = generate_tables(40, seed=3)
    total = sum(t.size_bytes for t in tables)
    memory = max(2 * total / 8, 1.1 * max(t.size_bytes for t in tables))
    plan = make_sharder("torchrec_cw").plan(tables, Topology(8, memory_bytes=int(memory)))
    assert plan.splits, "the planner should cut some of the widest tables"
    units = plan.units(tables)
    assert sorted(plan.assignment) == sorted(u.name for u in units)
    assert sum(plan.memory_bytes) == sum(t.size_bytes for t in tables)
    module_plan = to_sharding_plan(plan, build_ebc(tables)).plan[""]
    for name, parts in plan.splits.items():
        assert len(module_plan[name].ranks) == parts


def test_build_ebc_keeps_the_tables():
    tables = generate_tables(4, seed=2)
    configs = build_ebc(tables).embedding_bag_configs()
    assert [(c.name, c.num_embeddings, c.embedding_dim) for c in configs] == [
        (t.name, t.num_embeddings, t.embedding_dim) for t in tables
    ]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_dmp_runs_an_rl_plan_on_two_cpu_processes(tmp_path):
    config = quick_config(seed=1)
    sharder = train_sharder(config, Measurer(config.measure), log=lambda _: None).sharder()
    tables = generate_tables(6, seed=11)
    plan = sharder.plan(tables, Topology(2))
    save_tables(tables, tmp_path / "tables.json")
    (tmp_path / "plan.json").write_text(json.dumps(plan.to_dict()))
    command = [
        sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2",
        "--master_addr", "127.0.0.1", "--master_port", str(free_port()),
        "-m", "cost_models.sharding.dmp_check",
        "--tables", str(tmp_path / "tables.json"), "--plan", str(tmp_path / "plan.json"),
    ]  # fmt: skip
    env = os.environ | {"OMP_NUM_THREADS": "1"}
    done = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stdout + done.stderr
    for rank in (0, 1):
        assert f"rank {rank}/2: ok" in done.stdout, done.stdout + done.stderr
    placed = sorted(n for n, r in plan.assignment.items() if r == 0)
    assert f"tables {placed}" in done.stdout
