"""The learned sharder: a trained policy places tables on the cost model's estimated MDP.

It runs one greedy episode and `episodes - 1` sampled ones in parallel and keeps the
feasible plan the policy's objective (a soft max-device cost, see `policy`) rates best.
No measurement happens here.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import torch

from cost_models.cost_net import CostNet, load_cost_net
from cost_models.measure import single_threaded
from cost_models.plan import Plan, make_plan
from cost_models.policy import Episodes, PolicyNet, load_policy, run_episodes
from cost_models.sharders.base import Sharder, check_capacity, unplaced_error
from cost_models.tables import TableSpec
from cost_models.topology import Topology


class RLSharder(Sharder):
    name = "rl"

    def __init__(
        self, policy: PolicyNet, cost_net: CostNet, episodes: int = 16, seed: int = 0
    ) -> None:
        self.policy, self.cost_net = policy.eval(), cost_net.eval()
        self.episodes, self.seed = episodes, seed

    @classmethod
    def load(cls, directory: str | Path, episodes: int = 16) -> RLSharder:
        """The policy and cost model that `ranknas shard train` saved in `directory`."""
        return cls(load_policy(directory), load_cost_net(directory), episodes)

    @single_threaded
    def plan(self, tables: Sequence[TableSpec], topology: Topology) -> Plan:
        check_capacity(tables, topology)
        generator = torch.Generator().manual_seed(self.seed)
        with torch.no_grad():
            episodes = run_episodes(
                self.policy, self.cost_net, tables, topology, self.episodes, True, generator
            )
        feasible = episodes.overflow_step == len(tables)
        if not feasible.any():
            raise _stuck_error(episodes, tables, topology)
        best = int(torch.where(feasible, episodes.soft_cost, torch.inf).argmin())
        ranks = episodes.ranks[best].tolist()
        assignment = {t.name: rank for t, rank in zip(tables, ranks, strict=True)}
        return make_plan(assignment, tables, topology.num_devices, self.name)


def _stuck_error(episodes: Episodes, tables: Sequence[TableSpec], topology: Topology):
    """The tables the furthest-reaching episode could not place, and the memory left then."""
    best = int(episodes.overflow_step.argmax())
    step = int(episodes.overflow_step[best])
    free = [topology.memory_bytes] * topology.num_devices
    for i in episodes.order[:step]:
        free[int(episodes.ranks[best, i])] -= tables[i].size_bytes
    return unplaced_error([tables[i] for i in episodes.order[step:]], free, RLSharder.name)
