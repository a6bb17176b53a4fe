"""Everything that speaks torchrec: collections, `ShardingPlan`s, the planner, its estimates.

- `build_ebc(tables)`: an `EmbeddingBagCollection` with one table per spec (feature = name).
- `to_sharding_plan(plan, ebc)`: a `ShardingPlan` (table-wise; column-wise for split
  tables; row-wise or table-row-wise for row-split ones) that `DistributedModelParallel`
  accepts.
- `torchrec_topology` / `planner_constraints`: our workload in the planner's terms
  (table-wise, optionally column-wise; each table's pooling factor).
- `analytic_compute_ms(tables)`: torchrec's `EmbeddingPerfEstimator` forward + backward
  compute per table for a whole batch on one device; a device's analytic estimate is the
  sum over its tables (the planner cannot see that tables share a kernel).
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Iterator, Sequence

import torch
from torchrec.distributed.embeddingbag import EmbeddingBagCollectionSharder
from torchrec.distributed.planner import ParameterConstraints
from torchrec.distributed.planner import Topology as TorchrecTopology
from torchrec.distributed.planner.enumerators import EmbeddingEnumerator
from torchrec.distributed.planner.shard_estimators import EmbeddingPerfEstimator
from torchrec.distributed.sharding_plan import (
    column_wise,
    construct_module_sharding_plan,
    row_wise,
    table_row_wise,
    table_wise,
)
from torchrec.distributed.types import ShardingPlan
from torchrec.modules.embedding_configs import EmbeddingBagConfig, PoolingType
from torchrec.modules.embedding_modules import EmbeddingBagCollection

from cost_models.sharding.plan import Plan
from cost_models.sharding.tables import TableSpec
from cost_models.sharding.topology import Topology
from search_space.errors import RanknasError


def build_ebc(tables: Sequence[TableSpec], device: str = "meta") -> EmbeddingBagCollection:
    """One summing table per spec, its feature named like the table; `meta` allocates nothing."""
    configs = [
        EmbeddingBagConfig(
            name=t.name,
            embedding_dim=t.embedding_dim,
            num_embeddings=t.num_embeddings,
            feature_names=[t.name],
            pooling=PoolingType.SUM,
        )
        for t in tables
    ]
    return EmbeddingBagCollection(tables=configs, device=torch.device(device))


def to_sharding_plan(
    plan: Plan,
    ebc: EmbeddingBagCollection,
    module_path: str = "",
    device_type: str = "cpu",
    compute_kernel: str | None = None,
) -> ShardingPlan:
    """`plan` as a `ShardingPlan` for `ebc` at `module_path` (e.g. "embedding_bags"):
    table-wise for whole tables, column-wise for column-split ones, row-wise for tables cut
    by rows over every rank and table-row-wise for tables cut over one host's ranks.
    `compute_kernel`: torchrec's default for the device where None ("dense" on CPU: the
    tables are plain parameters); "fused" runs fbgemm's kernel, with the sharder's
    optimizer applied in the backward pass (table-row-wise tables keep the default, and so
    do tables whose shards are not a multiple of 4 columns wide, which fbgemm's kernel
    refuses: those train as plain parameters)."""
    local_size = _local_size(plan)
    widths = {name: config.embedding_dim for name, config in _table_configs(ebc).items()}
    generators = {}
    for name, ranks in plan.table_ranks().items():
        shard_width = widths.get(name, 4) // max(1, plan.splits.get(name, 1))
        kernel = compute_kernel if shard_width % 4 == 0 else None
        if name in plan.row_wise:
            whole_world = list(ranks) == list(range(plan.num_devices))
            generators[name] = (
                row_wise(compute_kernel=kernel)
                if whole_world
                else table_row_wise(ranks[0] // local_size)
            )
        elif len(ranks) == 1:
            generators[name] = table_wise(rank=ranks[0], compute_kernel=kernel)
        else:
            generators[name] = column_wise(ranks=ranks, compute_kernel=kernel)
    module_plan = construct_module_sharding_plan(
        ebc,
        generators,
        local_size=local_size,
        world_size=plan.num_devices,
        device_type=device_type,
    )
    return ShardingPlan({module_path: module_plan})


def _table_configs(ebc: EmbeddingBagCollection) -> dict:
    return {config.name: config for config in ebc.embedding_bag_configs()}


def _local_size(plan: Plan) -> int:
    """Devices per host: what the table-row-wise tables span (all devices if none)."""
    every = list(range(plan.num_devices))
    hosts = {tuple(r) for r in plan.row_wise.values() if list(r) != every}
    sizes = {len(r) for r in hosts}
    if len(sizes) > 1 or any(list(r) != list(range(r[0], r[0] + len(r))) or r[0] % len(r)
                             for r in hosts):  # fmt: skip
        raise RanknasError(
            f"plan: row-wise tables must span all {plan.num_devices} ranks or the ranks of "
            f"one host (equal, aligned blocks); got {sorted(hosts)}"
        )
    return sizes.pop() if sizes else plan.num_devices


def torchrec_topology(topology: Topology, reserved_share: float = 0.0) -> TorchrecTopology:
    """A CPU topology: each device's memory is its DDR capacity, less `reserved_share` of it
    (torchrec's storage reservations keep back a share of HBM only, none of a CPU's)."""
    with quiet_planner():
        return TorchrecTopology(
            world_size=topology.num_devices,
            compute_device="cpu",
            ddr_cap=int(topology.memory_bytes * (1 - reserved_share)),
            local_world_size=min(topology.local_world_size, topology.num_devices),
            intra_host_bw=topology.intra_host_bw,
            inter_host_bw=topology.inter_host_bw,
        )


def planner_constraints(
    tables: Sequence[TableSpec], column_wise_min_dim: int | None = None
) -> dict[str, ParameterConstraints]:
    """Table-wise on the fused kernel (the one `measure` times), with each pooling factor;
    also column-wise in shards at least `column_wise_min_dim` wide, when given."""
    sharding_types = ["table_wise"] + (["column_wise"] if column_wise_min_dim else [])
    return {
        t.name: ParameterConstraints(
            sharding_types=sharding_types,
            compute_kernels=["fused"],
            pooling_factors=[t.pooling_factor],
            min_partition=column_wise_min_dim,
        )
        for t in tables
    }


def analytic_compute_ms(tables: Sequence[TableSpec], batch_size: int) -> dict[str, float]:
    """torchrec's estimated forward + backward compute (ms) of each table for `batch_size`
    examples on the device that holds it."""
    topology = torchrec_topology(Topology(num_devices=1, memory_bytes=1 << 50))
    constraints = planner_constraints(tables)
    enumerator = EmbeddingEnumerator(
        topology=topology,
        batch_size=batch_size,
        constraints=constraints,
        estimator=EmbeddingPerfEstimator(topology, constraints=constraints),
    )
    with quiet_planner():
        options = enumerator.enumerate(build_ebc(tables), [EmbeddingBagCollectionSharder()])
    estimates = {}
    for option in options:
        perf = option.shards[0].perf
        estimates[option.name] = perf.fwd_compute + perf.bwd_compute
    return estimates


@contextlib.contextmanager
def quiet_planner() -> Iterator[None]:
    """Silence the planner's advice for real clusters (TopologyFactory, dry-run sizes)."""
    logger = logging.getLogger("torchrec.distributed.planner")
    level = logger.level
    logger.setLevel(logging.ERROR)
    try:
        yield
    finally:
        logger.setLevel(level)
