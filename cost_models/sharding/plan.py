"""A sharding plan: where each table, or each column or row shard of a split table, is placed.

Table-wise placement puts a whole table on one device. A table named in `splits` is cut
by columns into that many equal shards (`<table>/cw<j>`, see `tables.column_shards`),
each placed on its own: torchrec's column-wise sharding. The heaviest table then no
longer sets a floor under the plan's cost. A table named in `row_wise` is cut by rows
into one block per listed rank (`<table>/rw<j>` on the j-th rank, see
`tables.row_shards`): torchrec's row-wise sharding when the ranks are all devices,
table-row-wise when they are the devices of one host. Row shards spread a table too big
for one device, and its lookups, but each returns full-width partial sums.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from cost_models.sharding.tables import TableSpec, placement_units, row_shard_name, shard_name


@dataclass(frozen=True)
class Plan:
    """Placement unit (table or column shard) -> device rank, and the bytes each device holds."""

    assignment: Mapping[str, int]
    num_devices: int
    memory_bytes: tuple[int, ...]
    method: str = ""
    splits: Mapping[str, int] = field(default_factory=dict)  # table -> column shards
    row_wise: Mapping[str, tuple[int, ...]] = field(default_factory=dict)  # table -> ranks

    def units(self, tables: Sequence[TableSpec]) -> list[TableSpec]:
        """What is placed: `tables`, with every split table replaced by its shards."""
        return placement_units(tables, self.splits, self.row_wise)

    def device_tables(self, tables: Sequence[TableSpec]) -> list[list[TableSpec]]:
        """The placement units on each rank, in `units(tables)` order."""
        devices: list[list[TableSpec]] = [[] for _ in range(self.num_devices)]
        for t in self.units(tables):
            devices[self.assignment[t.name]].append(t)
        return devices

    def table_ranks(self) -> dict[str, list[int]]:
        """Table -> the ranks of its column shards in column order (one rank if whole)."""
        shards = {shard_name(t, j) for t, parts in self.splits.items() for j in range(parts)}
        shards |= {row_shard_name(t, j) for t, rs in self.row_wise.items() for j in range(len(rs))}
        ranks = {name: [rank] for name, rank in self.assignment.items() if name not in shards}
        for table, parts in self.splits.items():
            ranks[table] = [self.assignment[shard_name(table, j)] for j in range(parts)]
        for table, row_ranks in self.row_wise.items():
            ranks[table] = list(row_ranks)
        return ranks

    def host_row_groups(self) -> dict[str, int]:
        """Row shard -> the size of its group, for the tables cut over the ranks of one host
        (table-row-wise); row-wise tables over every rank are not listed."""
        return host_row_groups(self.row_wise, self.num_devices)

    def to_dict(self) -> dict[str, Any]:
        return {
            "method": self.method,
            "num_devices": self.num_devices,
            "assignment": dict(self.assignment),
            "splits": dict(self.splits),
            "row_wise": {table: list(ranks) for table, ranks in self.row_wise.items()},
            "memory_bytes": list(self.memory_bytes),
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Plan:
        return cls(
            assignment=dict(data["assignment"]),
            num_devices=int(data["num_devices"]),
            memory_bytes=tuple(data["memory_bytes"]),
            method=data.get("method", ""),
            splits=dict(data.get("splits", {})),
            row_wise={t: tuple(ranks) for t, ranks in data.get("row_wise", {}).items()},
        )


def host_row_groups(row_wise: Mapping[str, Sequence[int]], num_devices: int) -> dict[str, int]:
    """Row shard -> the size of its group, for the tables of `row_wise` cut over fewer than
    `num_devices` ranks (the ranks of one host)."""
    return {
        row_shard_name(table, j): len(ranks)
        for table, ranks in row_wise.items()
        if len(ranks) < num_devices
        for j in range(len(ranks))
    }


def make_plan(
    assignment: Mapping[str, int],
    tables: Sequence[TableSpec],
    num_devices: int,
    method: str,
    splits: Mapping[str, int] | None = None,
    row_wise: Mapping[str, Sequence[int]] | None = None,
) -> Plan:
    """A plan placing the units of `tables` (split by `splits`) as `assignment` says; the row
    shards of each table in `row_wise` go to the ranks listed for it, in order."""
    splits = {name: parts for name, parts in (splits or {}).items() if parts > 1}
    row_wise = {name: tuple(ranks) for name, ranks in (row_wise or {}).items()}
    assignment = dict(assignment) | {
        row_shard_name(t, j): rank for t, ranks in row_wise.items() for j, rank in enumerate(ranks)
    }
    memory = [0] * num_devices
    for t in placement_units(tables, splits, row_wise):
        memory[assignment[t.name]] += t.size_bytes
    return Plan(assignment, num_devices, tuple(memory), method, splits, row_wise)
