"""The learned sharder: a trained policy places tables on the cost model's estimated MDP.

For each candidate cut of the heaviest tables into column shards (none, and the cuts
`splitting.choose_splits` proposes at each of `split_limits`), it runs one greedy episode
and `episodes - 1` sampled ones in parallel, and keeps the feasible plan whose soft
max-device cost (see `policy`) the cost model rates lowest. No measurement happens here.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from pathlib import Path

import torch

from cost_models.cost_net import CostNet, load_cost_net
from cost_models.measure import single_threaded
from cost_models.plan import Plan, make_plan
from cost_models.policy import Episodes, PolicyNet, load_policy, run_episodes
from cost_models.sharders.base import Sharder, check_capacity, unplaced_error
from cost_models.splitting import choose_splits
from cost_models.tables import TableSpec, placement_units
from cost_models.topology import Topology

SPLIT_LIMITS = (1.0, 0.6)  # shares of a balanced device's load above which a table is cut


class RLSharder(Sharder):
    name = "rl"

    def __init__(
        self,
        policy: PolicyNet,
        cost_net: CostNet,
        episodes: int = 16,
        seed: int = 0,
        split_limits: Sequence[float] = SPLIT_LIMITS,
    ) -> None:
        self.policy, self.cost_net = policy.eval(), cost_net.eval()
        self.episodes, self.seed, self.split_limits = episodes, seed, tuple(split_limits)

    @classmethod
    def load(cls, directory: str | Path, episodes: int = 16) -> RLSharder:
        """The policy and cost model that `ranknas shard train` saved in `directory`."""
        return cls(load_policy(directory), load_cost_net(directory), episodes)

    @single_threaded
    def plan(self, tables: Sequence[TableSpec], topology: Topology) -> Plan:
        check_capacity(tables, topology)
        best: tuple[float, Plan] | None = None
        stuck = None
        for splits in self._candidate_splits(tables, topology):
            units = placement_units(tables, splits)
            episodes = self._episodes(units, topology)
            feasible = episodes.overflow_step == len(units)
            if not feasible.any():
                stuck = stuck or (episodes, units)
                continue
            soft_ms = torch.where(feasible, episodes.soft_cost * episodes.scale_ms, torch.inf)
            i = int(soft_ms.argmin())
            if best is None or float(soft_ms[i]) < best[0]:
                ranks = episodes.ranks[i].tolist()
                assignment = {t.name: r for t, r in zip(units, ranks, strict=True)}
                plan = make_plan(assignment, tables, topology.num_devices, self.name, splits)
                best = (float(soft_ms[i]), plan)
        if best is None:
            raise _stuck_error(*stuck, topology)
        return best[1]

    def _candidate_splits(
        self, tables: Sequence[TableSpec], topology: Topology
    ) -> list[dict[str, int]]:
        """No cut, then the distinct cuts proposed at each split limit."""
        candidates: list[dict[str, int]] = [{}]
        cost_alone = functools.partial(self.cost_net.alone_ms, bandwidth=topology.bandwidth)
        for limit in self.split_limits:
            splits = choose_splits(tables, topology.num_devices, cost_alone, limit)
            if splits not in candidates:
                candidates.append(splits)
        return candidates

    def _episodes(self, units: Sequence[TableSpec], topology: Topology) -> Episodes:
        generator = torch.Generator().manual_seed(self.seed)
        with torch.no_grad():
            return run_episodes(
                self.policy, self.cost_net, units, topology, self.episodes, True, generator
            )


def _stuck_error(episodes: Episodes, tables: Sequence[TableSpec], topology: Topology):
    """The tables the furthest-reaching episode could not place, and the memory left then."""
    best = int(episodes.overflow_step.argmax())
    step = int(episodes.overflow_step[best])
    free = [topology.memory_bytes] * topology.num_devices
    for i in episodes.order[:step]:
        free[int(episodes.ranks[best, i])] -= tables[i].size_bytes
    return unplaced_error([tables[i] for i in episodes.order[step:]], free, RLSharder.name)
