"""The random baseline: largest tables first, each to a device drawn at random among those
with room for it."""

from collections.abc import Sequence

import numpy as np

from cost_models.sharding.plan import Plan, make_plan
from cost_models.sharding.sharders.base import Sharder, check_capacity, unplaced_error
from cost_models.sharding.tables import TableSpec
from cost_models.sharding.topology import Topology


class RandomSharder(Sharder):
    name = "random"

    def __init__(self, seed: int = 0) -> None:
        self.seed = seed

    def plan(self, tables: Sequence[TableSpec], topology: Topology) -> Plan:
        check_capacity(tables, topology)
        rng = np.random.default_rng(self.seed)
        free = np.full(topology.num_devices, topology.memory_bytes, dtype=np.int64)
        order = sorted(range(len(tables)), key=lambda i: -tables[i].size_bytes)
        assignment = {}
        for step, i in enumerate(order):
            t = tables[i]
            candidates = np.flatnonzero(free >= t.size_bytes)
            if not len(candidates):
                raise unplaced_error([tables[j] for j in order[step:]], free.tolist(), self.name)
            rank = int(rng.choice(candidates))
            assignment[t.name] = rank
            free[rank] -= t.size_bytes
        return make_plan(assignment, tables, topology.num_devices, self.name)
