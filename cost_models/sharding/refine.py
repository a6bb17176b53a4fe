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
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from cost_models.sharding.cost_net import CostNet
from cost_models.sharding.measure import single_threaded
from cost_models.sharding.policy import SOFT_MAX_TEMPERATURE
from cost_models.sharding.tables import TableSpec, table_features
from cost_models.sharding.topology import Topology

MAX_ROUNDS = 400


class _Load:
    """Per-device summed encodings, cost floors, unit counts and free bytes."""

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


@torch.no_grad()
def device_costs(
    net: CostNet, units: Sequence[TableSpec], ranks: Sequence[int], topology: Topology
) -> torch.Tensor:
    """Each device's floored predicted ms under `ranks` (what `refine` minimizes the max of)."""
    load = _Load(net, units, topology)
    rank = torch.tensor(list(ranks))
    d = topology.num_devices
    summed = torch.zeros(d, load.codes.shape[1]).index_add_(0, rank, load.codes)
    floor = torch.zeros(d).index_add_(0, rank, load.marginal)
    return load.costs(summed, floor, torch.bincount(rank, minlength=d).float())


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
    load = _Load(net, units, topology)
    d = topology.num_devices
    rank = torch.tensor(list(ranks))
    summed = torch.zeros(d, load.codes.shape[1]).index_add_(0, rank, load.codes)
    floor = torch.zeros(d).index_add_(0, rank, load.marginal)
    count = torch.bincount(rank, minlength=d).float()
    free = load.capacity - torch.zeros(d).index_add_(0, rank, load.sizes)
    cost = load.costs(summed, floor, count)
    movable = torch.arange(len(rank)) >= pinned
    tau = SOFT_MAX_TEMPERATURE * float(cost.sum()) / d
    for _ in range(max_rounds):
        top = int(cost.argmax())
        change = _best_change(load, rank, movable, summed, floor, count, free, cost, top, tau)
        if change is None:
            break
        for unit, src, dst in change:
            rank[unit] = dst
            for device, sign in ((src, -1.0), (dst, 1.0)):
                summed[device] += sign * load.codes[unit]
                floor[device] += sign * load.marginal[unit]
                count[device] += sign
                free[device] -= sign * load.sizes[unit]
        cost = load.costs(summed, floor, count)
    return rank.tolist()


def _best_change(load, rank, movable, summed, floor, count, free, cost, top, tau):
    """The move or swap off device `top` that lowers the soft max most, as
    [(unit, from, to), ...], or None when none lowers it without raising the max."""
    on_top = ((rank == top) & movable).nonzero().squeeze(1)
    elsewhere = ((rank != top) & movable).nonzero().squeeze(1)
    if len(on_top) == 0:
        return None
    peak = float(cost.max())
    weights = torch.exp((cost - peak) / tau)
    total = float(weights.sum())
    codes, marginal, sizes = load.codes, load.marginal, load.sizes

    # Moves: unit k of `top` to device j.
    top_after = load.costs(
        summed[top] - codes[on_top], floor[top] - marginal[on_top], count[top] - 1
    )
    dest_after = load.costs(
        summed[None] + codes[on_top, None], floor[None] + marginal[on_top, None], count[None] + 1
    )
    move_ok = free[None] >= sizes[on_top, None]
    move_ok[:, top] = False
    move_soft, move_max = _after(
        cost,
        weights,
        total,
        peak,
        tau,
        top,
        top_after[:, None],
        torch.arange(len(cost))[None],
        dest_after,
    )

    # Swaps: unit k of `top` with unit v on device rank[v].
    dev = rank[elsewhere]
    delta_codes = codes[elsewhere][None] - codes[on_top, None]  # [K, V, E] into top
    delta_floor = marginal[elsewhere][None] - marginal[on_top, None]
    top_swap = load.costs(summed[top] + delta_codes, floor[top] + delta_floor, count[top])
    dest_swap = load.costs(
        summed[dev][None] - delta_codes, floor[dev][None] - delta_floor, count[dev][None]
    )
    swap_ok = (free[top] + sizes[on_top, None] >= sizes[elsewhere][None]) & (
        free[dev][None] + sizes[elsewhere][None] >= sizes[on_top, None]
    )
    swap_soft, swap_max = _after(
        cost, weights, total, peak, tau, top, top_swap, dev[None], dest_swap
    )

    current = tau * torch.log(torch.tensor(total)) + peak
    best, change = float(current) - 1e-9, None
    for soft, new_max, ok, kind in (
        (move_soft, move_max, move_ok, "move"),
        (swap_soft, swap_max, swap_ok, "swap"),
    ):
        soft = torch.where(ok & (new_max <= peak + 1e-9), soft, torch.inf)
        if soft.numel() == 0:  # no unit elsewhere to swap with
            continue
        i = int(soft.argmin())
        k, j = divmod(i, soft.shape[1])
        if float(soft.flatten()[i]) < best:
            best = float(soft.flatten()[i])
            unit = int(on_top[k])
            if kind == "move":
                change = [(unit, top, j)]
            else:
                other = int(elsewhere[j])
                change = [(unit, top, int(rank[other])), (other, int(rank[other]), top)]
    return change


def _after(cost, weights, total, peak, tau, top, top_new, dest, dest_new):
    """Soft max and max of the plan after device `top` becomes `top_new` and device `dest`
    becomes `dest_new` (broadcast to one shape)."""
    top_new, dest_new = torch.broadcast_tensors(top_new, dest_new)
    dest = dest.expand_as(top_new)
    rest = total - float(weights[top]) - weights[dest]
    soft_sum = rest + torch.exp((top_new - peak) / tau) + torch.exp((dest_new - peak) / tau)
    soft = tau * torch.log(soft_sum.clamp_min(1e-30)) + peak
    others = cost.clone()
    others[top] = -torch.inf
    order = torch.argsort(others, descending=True)
    first, second = order[0], order[1] if len(order) > 1 else order[0]
    rest_max = torch.where(dest == first, others[second], others[first]).clamp_min(0.0)
    return soft, torch.maximum(torch.maximum(top_new, dest_new), rest_max)
