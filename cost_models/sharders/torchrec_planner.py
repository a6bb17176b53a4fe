"""torchrec's `EmbeddingShardingPlanner` as a baseline, through its public API, table-wise only.

The planner budgets memory its own way (weights plus input/output buffers, and 15% of each
device kept back, with torchrec's recommended `FixedPercentageStorageReservation`), so it
may refuse a workload that the other sharders can place.
"""

from collections.abc import Sequence

from torchrec.distributed.embeddingbag import EmbeddingBagCollectionSharder
from torchrec.distributed.planner import EmbeddingShardingPlanner
from torchrec.distributed.planner.storage_reservations import FixedPercentageStorageReservation
from torchrec.distributed.planner.types import PlannerError

from cost_models.plan import Plan, make_plan
from cost_models.sharders.base import Sharder, check_capacity
from cost_models.tables import TableSpec
from cost_models.topology import Topology
from cost_models.torchrec_adapter import (
    build_ebc,
    planner_constraints,
    quiet_planner,
    torchrec_topology,
)
from search_space.errors import RanknasError

RESERVED_SHARE = 0.15  # the share of memory torchrec's default reservation keeps back


class TorchrecPlanner(Sharder):
    name = "torchrec"

    def __init__(self, batch_size: int = 512) -> None:
        self.batch_size = batch_size  # examples each table reads per step, over all devices

    def plan(self, tables: Sequence[TableSpec], topology: Topology) -> Plan:
        check_capacity(tables, topology)
        planner = EmbeddingShardingPlanner(
            topology=torchrec_topology(topology),
            batch_size=max(1, self.batch_size // topology.num_devices),  # per rank
            constraints=planner_constraints(tables),
            storage_reservation=FixedPercentageStorageReservation(RESERVED_SHARE),
        )
        try:
            with quiet_planner():
                sharding = planner.plan(build_ebc(tables), [EmbeddingBagCollectionSharder()])
        except PlannerError as exc:
            first_line = str(exc).strip().splitlines()[0]
            raise RanknasError(f"torchrec planner found no plan: {first_line}") from None
        module_plan = sharding.plan[""]
        assignment = {name: module_plan[name].ranks[0] for name in (t.name for t in tables)}
        return make_plan(assignment, tables, topology.num_devices, self.name)
