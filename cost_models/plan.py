"""A sharding plan: which device holds each table (table-wise), and each device's memory."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from cost_models.tables import TableSpec


@dataclass(frozen=True)
class Plan:
    """Table-wise placement: table name -> device rank, and the bytes each device holds."""

    assignment: Mapping[str, int]
    num_devices: int
    memory_bytes: tuple[int, ...]
    method: str = ""

    def device_tables(self, tables: Sequence[TableSpec]) -> list[list[TableSpec]]:
        """The tables on each rank, in `tables` order."""
        devices: list[list[TableSpec]] = [[] for _ in range(self.num_devices)]
        for t in tables:
            devices[self.assignment[t.name]].append(t)
        return devices

    def to_dict(self) -> dict[str, Any]:
        return {
            "method": self.method,
            "num_devices": self.num_devices,
            "assignment": dict(self.assignment),
            "memory_bytes": list(self.memory_bytes),
        }


def make_plan(
    assignment: Mapping[str, int], tables: Sequence[TableSpec], num_devices: int, method: str
) -> Plan:
    memory = [0] * num_devices
    for t in tables:
        memory[assignment[t.name]] += t.size_bytes
    return Plan(dict(assignment), num_devices, tuple(memory), method)
