"""torchrec's `EmbeddingShardingPlanner` as a baseline, through its public API.

`torchrec` plans table-wise only, as the other baselines do; `torchrec_cw` also lets the
planner cut tables column-wise, in shards at least `CW_MIN_DIM` columns wide (torchrec's
own default, 128, is meant for GPU tables of 128-512 columns; a quarter of our widest
tables plays the same part here). The planner budgets memory its own way (weights plus
input/output buffers, and 15% of each device kept back, as torchrec's recommended
`FixedPercentageStorageReservation` keeps back of a GPU's HBM: these plans are made on a
CPU topology, whose memory that reservation leaves alone, so the share is taken off each
device's capacity here), so it may refuse a workload that the other sharders can place.
"""

from collections.abc import Sequence

from torchrec.distributed.embeddingbag import EmbeddingBagCollectionSharder
from torchrec.distributed.planner import EmbeddingShardingPlanner
from torchrec.distributed.planner.storage_reservations import FixedPercentageStorageReservation
from torchrec.distributed.planner.types import PlannerError
from torchrec.distributed.types import ParameterSharding, ShardingType

from cost_models.sharding.methods import CW_MIN_DIM, RESERVED_SHARE
from cost_models.sharding.plan import Plan, make_plan
from cost_models.sharding.sharders.base import Sharder, check_capacity
from cost_models.sharding.tables import DTYPE_BYTES, TableSpec, shard_name
from cost_models.sharding.topology import Topology
from cost_models.sharding.torchrec_adapter import (
    build_ebc,
    planner_constraints,
    quiet_planner,
    torchrec_topology,
)
from search_space.errors import RanknasError


class TorchrecPlanner(Sharder):
    name = "torchrec"

    def __init__(self, batch_size: int = 512, column_wise: bool = False) -> None:
        self.batch_size = batch_size  # examples each table reads per step, over all devices
        self.column_wise = column_wise
        self.name = "torchrec_cw" if column_wise else "torchrec"

    def plan(self, tables: Sequence[TableSpec], topology: Topology) -> Plan:
        # column-wise, a table bigger than a device may fit as column shards: the planner says
        check_capacity(tables, topology, cut=self.column_wise, reserved=RESERVED_SHARE,
                       footprint=lambda t: self._footprint(t, topology))  # fmt: skip
        planner = EmbeddingShardingPlanner(
            topology=torchrec_topology(topology, RESERVED_SHARE),
            batch_size=max(1, self.batch_size // topology.num_devices),  # per rank
            constraints=planner_constraints(tables, CW_MIN_DIM if self.column_wise else None),
            storage_reservation=FixedPercentageStorageReservation(RESERVED_SHARE),
        )
        try:
            with quiet_planner():
                sharding = planner.plan(build_ebc(tables), [EmbeddingBagCollectionSharder()])
        except PlannerError as exc:
            first_line = str(exc).strip().splitlines()[0]
            raise RanknasError(f"{self.name} planner found no plan: {first_line} (it keeps "
                               f"{RESERVED_SHARE:.0%} of each device back): add devices, raise "
                               "--memory-gb, or try another --method") from None  # fmt: skip
        module_plan = sharding.plan[""]
        assignment, splits = {}, {}
        for t in tables:
            ranks = _column_ranks(t, module_plan[t.name])
            if len(ranks) == 1:
                assignment[t.name] = ranks[0]
            else:
                splits[t.name] = len(ranks)
                assignment |= {shard_name(t.name, j): r for j, r in enumerate(ranks)}
        return make_plan(assignment, tables, topology.num_devices, self.name, splits)

    def _footprint(self, table: TableSpec, topology: Topology) -> float:
        """A table-wise shard's bytes as torchrec's storage estimator counts them (without a
        pipeline): its rows, and every rank's batch of its ids (int64) and of its pooled
        output (at the table's dtype); a bound said from the rows alone fell short by these."""
        world_batch = max(1, self.batch_size // topology.num_devices) * topology.num_devices
        ids = world_batch * table.pooling_factor * 8
        output = world_batch * min(1.0, table.pooling_factor) * table.embedding_dim
        return table.size_bytes + ids + output * DTYPE_BYTES[table.dtype]


def _column_ranks(table: TableSpec, sharding: ParameterSharding) -> list[int]:
    """The ranks of the table's equal column shards, in column order (one if table-wise)."""
    if sharding.sharding_type == ShardingType.TABLE_WISE.value:
        return [sharding.ranks[0]]
    shards = sorted(sharding.sharding_spec.shards, key=lambda s: s.shard_offsets[1])
    widths = {s.shard_sizes[1] for s in shards}
    if sharding.sharding_type != ShardingType.COLUMN_WISE.value or len(widths) != 1:
        raise RanknasError(
            f"torchrec planner: table {table.name} got a {sharding.sharding_type} plan with "
            f"shard widths {sorted(widths)}, which ranknas plans cannot express"
        )
    return [s.placement.rank() for s in shards]
