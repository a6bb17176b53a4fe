"""Which tables to cut column-wise before placing them.

With table-wise placement alone, the costliest table sets a floor under every plan: the
device that holds it costs at least that much. Cutting such a table into column shards
(each reads the same ids into fewer columns) lowers the floor, at a price: every shard
pays the per-lookup overhead and receives the ids again. So only tables that alone cost
more than `limit_share` of a balanced device are cut, into the fewest shards that bring a
shard under that limit.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np

from cost_models.sharding.tables import TableSpec, column_shards, column_split_options

CostAlone = Callable[[Sequence[TableSpec]], np.ndarray]  # ms of each table alone on a device


def choose_splits(
    tables: Sequence[TableSpec], num_devices: int, cost_alone: CostAlone, limit_share: float
) -> dict[str, int]:
    """Table name -> column shards, for every table whose cost alone exceeds `limit_share`
    times the balanced load: a device's fixed cost (the cheapest table's cost alone) plus
    the devices' share of every table's cost above it. (Summing costs alone would count
    the per-call cost once per table: with 15 tables a device, it made the balanced load
    about twice what a device costs, and cut no table.)"""
    alone = cost_alone(tables)
    fixed = float(alone.min())
    limit = limit_share * (fixed + float(alone.sum() - fixed * len(alone)) / num_devices)
    heavy = [
        (t, options)
        for t, cost in zip(tables, alone, strict=True)
        if cost > limit and (options := column_split_options(t, num_devices))
    ]
    if not heavy:
        return {}
    candidates = [column_shards(t, parts)[0] for t, options in heavy for parts in options]
    shard_costs = iter(cost_alone(candidates))
    splits = {}
    for t, options in heavy:
        costs = [next(shard_costs) for _ in options]
        under = [parts for parts, cost in zip(options, costs, strict=True) if cost <= limit]
        splits[t.name] = under[0] if under else options[-1]
    return splits
