"""Local search on the cost model: moves and swaps off the costliest device.

A sampled or greedy placement leaves its most loaded device some way above the mean
device cost (the balance bound no plan can beat). Each round here takes the device with
the highest predicted cost and tries every move of one of its units to another device and
every swap of one of its units with a unit elsewhere, all at once on tensors, and applies
the one that lowers the plan's soft maximum (the RL reward, `policy.SOFT_MAX_TEMPERATURE`)
the most without raising its max. It stops when nothing helps or after `max_rounds`.

Device costs are the cost model's, floored as in the RL episodes so that the search cannot
exploit a non-monotone prediction: a device costs at least the cheapest table's cost alone
plus every other unit's marginal cost (its cost alone less that fixed cost).

`Placement` and `changes_off` are shared with the measured search (`measured.py`), which
ranks the same changes by their predicted effect but lets timings decide.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from cost_models.sharding.cost_net import CostNet
from cost_models.sharding.measure import single_threaded
from cost_models.sharding.policy import SOFT_MAX_TEMPERATURE
from cost_models.sharding.tables import TableSpec, table_features
from cost_models.sharding.topology import Topology

MAX_ROUNDS = 400
Change = list[tuple[int, int, int]]  # (unit, from device, to device) for each unit moved


class _Load:
    """Per-unit encodings, marginal costs and sizes, and how a device's cost follows."""

    def __init__(self, net: CostNet, units: Sequence[TableSpec], topology: Topology) -> None:
        self.net, self.topology = net, topology
        with torch.no_grad():
            self.codes = net.encode(torch.from_numpy(table_features(units)))
            single = net.device_ms(self.codes, torch.ones(len(units)), topology)
        self.base = float(single.min())
        self.marginal = single - self.base
        self.sizes = torch.tensor([float(t.size_bytes) for t in units])
        self.capacity = float(topology.memory_bytes)

    def costs(self, summed: torch.Tensor, floor: torch.Tensor, count: torch.Tensor):
        """Device ms for summed encodings, summed marginals and unit counts (any shape)."""
        predicted = self.net.device_ms(summed, count, self.topology)
        return torch.where(count > 0, torch.maximum(predicted, floor + self.base), 0.0)


class Placement:
    """A device per unit and each device's sums, kept up to date as units move."""

    def __init__(
        self,
        net: CostNet,
        units: Sequence[TableSpec],
        ranks: Sequence[int],
        topology: Topology,
        pinned: int = 0,
    ) -> None:
        self.load = load = _Load(net, units, topology)
        d = topology.num_devices
        self.rank = rank = torch.tensor(list(ranks))
        self.summed = torch.zeros(d, load.codes.shape[1]).index_add_(0, rank, load.codes)
        self.floor = torch.zeros(d).index_add_(0, rank, load.marginal)
        self.count = torch.bincount(rank, minlength=d).float()
        self.free = load.capacity - torch.zeros(d).index_add_(0, rank, load.sizes)
        self.movable = torch.arange(len(rank)) >= pinned  # the first `pinned`: row shards

    def costs(self) -> torch.Tensor:
        """Each device's floored predicted ms."""
        return self.load.costs(self.summed, self.floor, self.count)

    def apply(self, change: Change) -> None:
        load = self.load
        for unit, src, dst in change:
            self.rank[unit] = dst
            for device, sign in ((src, -1.0), (dst, 1.0)):
                self.summed[device] += sign * load.codes[unit]
                self.floor[device] += sign * load.marginal[unit]
                self.count[device] += sign
                self.free[device] -= sign * load.sizes[unit]


@dataclass(frozen=True)
class Changes:
    """Every move of a unit off device `top` and every swap of one with a unit elsewhere:
    the two devices' predicted ms after each, and whether memory allows it."""

    top: int
    unit: torch.Tensor  # [N] the unit leaving `top`
    other: torch.Tensor  # [N] the unit joining `top` (-1 for a move)
    dest: torch.Tensor  # [N] the other device
    top_after: torch.Tensor  # [N]
    dest_after: torch.Tensor  # [N]
    ok: torch.Tensor  # [N]

    def __len__(self) -> int:
        return len(self.unit)

    def change(self, i: int) -> Change:
        unit, other, dest = int(self.unit[i]), int(self.other[i]), int(self.dest[i])
        moved = [(unit, self.top, dest)]
        return moved if other < 0 else [*moved, (other, dest, self.top)]


@torch.no_grad()
def changes_off(placement: Placement, top: int) -> Changes:
    """Every move and swap of a movable unit on device `top` (moves first)."""
    p, load = placement, placement.load
    d = len(p.count)
    on_top = ((p.rank == top) & p.movable).nonzero().squeeze(1)
    elsewhere = ((p.rank != top) & p.movable).nonzero().squeeze(1)
    codes, marginal, sizes = load.codes, load.marginal, load.sizes
    k, v = len(on_top), len(elsewhere)

    # Moves: unit k of `top` to device j.
    move_top = load.costs(p.summed[top] - codes[on_top], p.floor[top] - marginal[on_top],
                          p.count[top] - 1)  # fmt: skip
    move_dest = load.costs(p.summed[None] + codes[on_top, None],
                           p.floor[None] + marginal[on_top, None], p.count[None] + 1)  # fmt: skip
    move_ok = p.free[None] >= sizes[on_top, None]
    move_ok[:, top] = False

    # Swaps: unit k of `top` with unit v on device rank[v].
    dev = p.rank[elsewhere]
    delta_codes = codes[elsewhere][None] - codes[on_top, None]  # [K, V, E] into top
    delta_floor = marginal[elsewhere][None] - marginal[on_top, None]
    swap_top = load.costs(p.summed[top] + delta_codes, p.floor[top] + delta_floor, p.count[top])
    swap_dest = load.costs(p.summed[dev][None] - delta_codes, p.floor[dev][None] - delta_floor,
                           p.count[dev][None])  # fmt: skip
    swap_ok = (p.free[top] + sizes[on_top, None] >= sizes[elsewhere][None]) & (
        p.free[dev][None] + sizes[elsewhere][None] >= sizes[on_top, None]
    )
    flat = lambda x: x.reshape(-1)  # noqa: E731
    return Changes(
        top=top,
        unit=torch.cat([on_top.repeat_interleave(d), on_top.repeat_interleave(v)]),
        other=torch.cat([torch.full((k * d,), -1), elsewhere.repeat(k)]),
        dest=torch.cat([torch.arange(d).repeat(k), dev.repeat(k)]),
        top_after=torch.cat([move_top.repeat_interleave(d), flat(swap_top)]),
        dest_after=torch.cat([flat(move_dest), flat(swap_dest)]),
        ok=torch.cat([flat(move_ok), flat(swap_ok)]),
    )


@torch.no_grad()
def device_costs(
    net: CostNet, units: Sequence[TableSpec], ranks: Sequence[int], topology: Topology
) -> torch.Tensor:
    """Each device's floored predicted ms under `ranks` (what `refine` minimizes the max of)."""
    return Placement(net, units, ranks, topology).costs()


@torch.no_grad()
@single_threaded
def refine(
    net: CostNet,
    units: Sequence[TableSpec],
    ranks: Sequence[int],
    topology: Topology,
    max_rounds: int = MAX_ROUNDS,
    pinned: int = 0,
) -> list[int]:
    """`ranks` (a device per unit, memory respected) improved by moves and swaps; the first
    `pinned` units (row shards) stay where they are."""
    placement = Placement(net, units, ranks, topology, pinned)
    cost = placement.costs()
    tau = SOFT_MAX_TEMPERATURE * float(cost.sum()) / topology.num_devices
    for _ in range(max_rounds):
        change = _best_change(placement, cost, tau)
        if change is None:
            break
        placement.apply(change)
        cost = placement.costs()
    return placement.rank.tolist()


def _best_change(placement: Placement, cost: torch.Tensor, tau: float) -> Change | None:
    """The move or swap off the costliest device that lowers the soft max most, or None
    when none lowers it without raising the max."""
    changes = changes_off(placement, int(cost.argmax()))
    if len(changes) == 0:
        return None
    soft, new_max = _after(cost, tau, changes)
    peak = float(cost.max())
    current = tau * torch.log(torch.exp((cost - peak) / tau).sum()) + peak
    soft = torch.where(changes.ok & (new_max <= peak + 1e-9), soft, torch.inf)
    i = int(soft.argmin())
    return changes.change(i) if float(soft[i]) < float(current) - 1e-9 else None


def _after(cost: torch.Tensor, tau: float, changes: Changes):
    """Soft max and max of the plan after each change (its two devices' new costs)."""
    top, dest = changes.top, changes.dest
    peak = float(cost.max())
    weights = torch.exp((cost - peak) / tau)
    rest = float(weights.sum()) - float(weights[top]) - weights[dest]
    soft_sum = (rest + torch.exp((changes.top_after - peak) / tau)
                + torch.exp((changes.dest_after - peak) / tau))  # fmt: skip
    soft = tau * torch.log(soft_sum.clamp_min(1e-30)) + peak
    others = cost.clone()
    others[top] = -torch.inf
    order = torch.argsort(others, descending=True)
    first, second = order[0], order[1] if len(order) > 1 else order[0]
    rest_max = torch.where(dest == first, others[second], others[first]).clamp_min(0.0)
    return soft, torch.maximum(torch.maximum(changes.top_after, changes.dest_after), rest_max)
