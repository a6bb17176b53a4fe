"""The sharder interface: `plan(tables, topology) -> Plan`, and what every sharder shares."""

from __future__ import annotations

import math
from abc import ABC, abstractmethod
from collections.abc import Callable, Sequence
from typing import ClassVar

import numpy as np

from cost_models.sharding.methods import CW_MIN_DIM, RESERVED_SHARE
from cost_models.sharding.plan import Plan, make_plan
from cost_models.sharding.tables import TableSpec
from cost_models.sharding.topology import GIB, Topology
from search_space.errors import RanknasError


class Sharder(ABC):
    """Places every table on exactly one device without exceeding any device's memory."""

    name: ClassVar[str]

    @abstractmethod
    def plan(self, tables: Sequence[TableSpec], topology: Topology) -> Plan: ...


def check_capacity(
    tables: Sequence[TableSpec],
    topology: Topology,
    cut: bool = False,
    reserved: float = 0.0,
    footprint: Callable[[TableSpec], float] | None = None,
) -> None:
    """Raise `RanknasError` when some table (unless the sharder cuts tables: rl by rows,
    torchrec_cw by columns), or all of them together, cannot fit in what the sharder uses of
    each device (`reserved`: the share it keeps back, torchrec's 15%; `footprint`: a table's
    bytes as the sharder counts them, default its rows)."""
    kept = f" (this method keeps {reserved:.0%} of each device back)" if reserved else ""
    if footprint is not None:
        kept = kept.removesuffix(")") + " and counts each table with its input and output buffers)"
    footprint = footprint or (lambda t: t.size_bytes)
    capacity = int(topology.memory_bytes * (1 - reserved))
    total = sum(t.size_bytes for t in tables)
    if total > capacity * topology.num_devices:  # first: no cutting helps then
        shortfall = total - capacity * topology.num_devices
        many, devices = len(tables) != 1, topology.num_devices
        raise RanknasError(
            f"the {counted(len(tables), 'table')} need{'s' * (not many)} {gib(total)} GiB but "
            f"{counted(devices, 'device')} of {gib(topology.memory_bytes)} GiB "
            f"hold{'s' * (devices == 1)} {gib(capacity * devices)} GiB{kept}"
            f" (short by {gib(shortfall)} GiB): add devices or raise --memory-gb"
        )
    too_big = [] if cut else [t for t in tables if footprint(t) > capacity]
    if too_big:
        listed = ", ".join(f"{t.name} ({gib(footprint(t))} GiB)" for t in too_big[:10])
        more = f" and {len(too_big) - 10} more" if len(too_big) > 10 else ""
        largest = max(footprint(t) for t in too_big)
        columns = _by_columns(too_big, topology.memory_bytes)
        raise RanknasError(
            f"table(s) {listed}{more} do not fit on one device of "
            f"{gib(topology.memory_bytes)} GiB{kept} (short by {gib(largest - capacity)} GiB): "
            f"raise --memory-gb to at least {gib(largest / (1 - reserved), up=True)}, or plan "
            f"with --method rl, which cuts tables by rows{columns}"
        )


def gib(size: float, up: bool = False) -> str:
    """`size` bytes in GiB: two decimals from 1 GiB, three significant digits below (a
    limit of 0.02 GiB was told "short by 0.00 GiB"); `up`: rounded up, so that a bound said
    is enough."""
    value = size / GIB
    digits = 2 if value >= 1 or value <= 0 else 2 - math.floor(math.log10(value))
    if digits > 2 and _rounded(value, digits, up) >= 10.0 ** (3 - digits):
        digits -= 1  # rounded up to the next power of ten: 1.00, not 1.000
    return f"{_rounded(value, digits, up):.{digits}f}"


def _rounded(value: float, digits: int, up: bool) -> float:
    return math.ceil(value * 10**digits) / 10**digits if up else round(value, digits)


def _by_columns(tables: Sequence[TableSpec], capacity: int) -> str:
    """torchrec_cw as a second way, where its narrowest column shards of every table fit
    in what its planner leaves of a device."""
    fits = all(t.embedding_dim >= 2 * CW_MIN_DIM
               and t.size_bytes * CW_MIN_DIM / t.embedding_dim <= (1 - RESERVED_SHARE) * capacity
               for t in tables)  # fmt: skip
    return " (or torchrec_cw, by columns)" if fits else ""


def counted(number: int, noun: str) -> str:
    """`3 tables`, `1 device`, `2 processes`."""
    plural = "es" if noun.endswith("s") else "s"
    return f"{number} {noun}{plural * (number != 1)}"


def unplaced_error(unplaced: Sequence[TableSpec], free: Sequence[int], method: str) -> RanknasError:
    """The error for tables left over when no device has room for them any more."""
    need = sum(t.size_bytes for t in unplaced)
    shortfall = max(t.size_bytes for t in unplaced) - max(free)
    names = ", ".join(t.name for t in unplaced[:10]) + (" ..." if len(unplaced) > 10 else "")
    return RanknasError(
        f"{method}: no device has room for table(s) {names} ({need / GIB:.2f} GiB in all; the "
        f"largest is {shortfall / GIB:.2f} GiB more than the freest device has left): "
        "add devices, raise --memory-gb, or try another --method"
    )


def largest_first(tables: Sequence[TableSpec], weight: Callable[[TableSpec], float]) -> list[int]:
    """Table indices by decreasing weight, ties broken by decreasing size."""
    return sorted(range(len(tables)), key=lambda i: (-weight(tables[i]), -tables[i].size_bytes))


class GreedySharder(Sharder):
    """Largest-first by `weight`, each table to the least-loaded device with room for it."""

    @staticmethod
    @abstractmethod
    def weight(table: TableSpec) -> float: ...

    def plan(self, tables: Sequence[TableSpec], topology: Topology) -> Plan:
        check_capacity(tables, topology)
        return make_plan(self.place(tables, topology), tables, topology.num_devices, self.name)

    def place(
        self,
        tables: Sequence[TableSpec],
        topology: Topology,
        held: Sequence[tuple[TableSpec, int]] = (),
    ) -> dict[str, int]:
        """Table name -> rank, on devices that already hold the `held` units (row shards):
        their memory and weight count from the start."""
        load = np.zeros(topology.num_devices)
        free = np.full(topology.num_devices, topology.memory_bytes, dtype=np.int64)
        for unit, rank in held:
            load[rank] += self.weight(unit)
            free[rank] -= unit.size_bytes
        assignment = {}
        order = largest_first(tables, self.weight)
        for step, i in enumerate(order):
            t = tables[i]
            fits = free >= t.size_bytes
            if not fits.any():
                raise unplaced_error([tables[j] for j in order[step:]], free.tolist(), self.name)
            rank = int(np.argmin(np.where(fits, load, np.inf)))
            assignment[t.name] = rank
            load[rank] += self.weight(t)
            free[rank] -= t.size_bytes
        return assignment
