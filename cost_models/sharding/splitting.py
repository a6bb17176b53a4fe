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


def balanced_load(alone: np.ndarray, num_devices: int) -> float:
    """A balanced device's cost: a device's fixed cost (the cheapest table's cost alone) plus
    the devices' share of every table's cost above it."""
    fixed = float(alone.min())
    return fixed + float(alone.sum() - fixed * len(alone)) / num_devices


def choose_splits(
    tables: Sequence[TableSpec], num_devices: int, cost_alone: CostAlone, limit_share: float
) -> dict[str, int]:
    """Table name -> column shards, for every table whose cost alone exceeds `limit_share`
    times the balanced load (`balanced_load`). (Summing costs alone would count
    the per-call cost once per table: with 15 tables a device, it made the balanced load
    about twice what a device costs, and cut no table.)"""
    return column_cuts(tables, num_devices, cost_alone, limit_share)[0]


def column_cuts(
    tables: Sequence[TableSpec], num_devices: int, cost_alone: CostAlone, limit_share: float
) -> tuple[dict[str, int], set[str]]:
    """`choose_splits`' cuts (into the fewest shards under the limit, else the most), and
    the tables above the limit that no column cut brings under it: every column shard
    reads all of the table's ids, so where the lookups cost most, only a cut by rows
    (which shares them out) lowers the floor."""
    if not tables:  # every table cut by rows already (one table larger than a device)
        return {}, set()
    alone = cost_alone(tables)
    limit = limit_share * balanced_load(alone, num_devices)
    over = [t for t, cost in zip(tables, alone, strict=True) if cost > limit]
    heavy = [(t, options) for t in over if (options := column_split_options(t, num_devices))]
    candidates = [column_shards(t, parts)[0] for t, options in heavy for parts in options]
    shard_costs = iter(cost_alone(candidates)) if candidates else iter(())
    splits, stuck = {}, {t.name for t in over}
    for t, options in heavy:
        costs = [next(shard_costs) for _ in options]
        under = [parts for parts, cost in zip(options, costs, strict=True) if cost <= limit]
        splits[t.name] = under[0] if under else options[-1]
        stuck -= {t.name} if under else set()
    return splits, stuck
