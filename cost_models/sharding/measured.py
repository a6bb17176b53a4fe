"""Measured selection and local search: the cost model proposes, this machine's timings decide.

The cost model is off by about 8% per device set, and a plan picked because the model
rates it lowest is the plan whose errors flatter it most: measured, the RL plan's devices
were 8-10% costlier than predicted where the heuristics' were 1-5% (BENCHMARKS.md). No
margin on the prediction undoes a bias that is systematic per plan, so with a `Measurer`
the RL sharder times what it would otherwise only predict:

1. **Selection.** The candidate cuts, then the candidate plans (the policy's, the greedy
   heuristics', torchrec's) are timed device by device, costliest predicted first; a
   candidate is dropped as soon as one of its devices measures above the best max so far,
   and a candidate that is not has its costliest device timed `SAMPLES` times.
2. **Local search.** Then, round after round, the measured costliest device gives up a
   unit (a move) or trades one (a swap). The model ranks every change by its predicted
   effect on the two devices, relative to their predicted costs and applied to their
   measured ones (the model's scale can be off on this machine); the best-ranked are timed
   in turn, and the first whose two devices both measure below the old max (each the
   median of `samples` timings) is kept. It stops when none of a round's `tries` changes
   passes, or after `max_rounds`.

A device's cost is the measured forward + backward of its units on the kernel plus their
analytic communication (`topology.traffic_megabytes`), as the benchmarks count it. The
search's timings are its own: a plan judged by the timings that selected it looks better
than it is, so a benchmark times the result with another `Measurer`.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import torch

from cost_models.sharding.cost_net import CostNet
from cost_models.sharding.measure import Measurer
from cost_models.sharding.plan import Plan
from cost_models.sharding.refine import Placement, changes_off
from cost_models.sharding.tables import TableSpec
from cost_models.sharding.topology import Topology, traffic_megabytes

SAMPLES = 5  # timings whose median decides a device's cost before a change is kept
TRIES = 8  # changes timed per round before the search gives up
MIN_GAIN = 0.005  # a change must lower the max by this share: less is timing noise


def measured_device_ms(
    tables: Sequence[TableSpec],
    topology: Topology,
    measurer: Measurer,
    host_groups: Mapping[str, int],
    samples: int = 1,
) -> float:
    """One device's measured kernel ms (median of `samples` timings) and analytic comm ms."""
    if not tables:
        return 0.0
    traffic = traffic_megabytes(tables, host_groups, measurer.config.batch_size)
    return measurer.measure(tables, samples).total_ms + float(topology.comm_ms(*traffic))


def measured_plan_ms(
    plan: Plan, tables: Sequence[TableSpec], topology: Topology, measurer: Measurer
) -> list[float]:
    """Each device's `measured_device_ms` under `plan` (0 where empty)."""
    groups = plan.host_row_groups()
    return [measured_device_ms(ts, topology, measurer, groups) for ts in plan.device_tables(tables)]


def plan_max_ms(
    net: CostNet,
    plan: Plan,
    tables: Sequence[TableSpec],
    topology: Topology,
    measurer: Measurer,
    stop_above: float = float("inf"),
) -> float:
    """`MeasuredSearch.max_ms` of a whole plan: its costliest predicted devices timed first,
    stopped once one reaches `stop_above`, else the costliest device settled."""
    sets = plan.device_tables(tables)
    units = [unit for units in sets for unit in units]
    ranks = [device for device, units in enumerate(sets) for _ in units]
    search = MeasuredSearch(net, units, topology, measurer, host_groups=plan.host_row_groups())
    return search.max_ms(ranks, stop_above)


class MeasuredSearch:
    """Selection and local search over placements of `units` (a device per unit); the first
    `pinned` units (row shards) stay where they are."""

    def __init__(
        self,
        net: CostNet,
        units: Sequence[TableSpec],
        topology: Topology,
        measurer: Measurer,
        pinned: int = 0,
        host_groups: Mapping[str, int] | None = None,
        max_rounds: int | None = None,
        tries: int = TRIES,
    ) -> None:
        self.net, self.units, self.topology, self.measurer = net, list(units), topology, measurer
        self.pinned, self.host_groups = pinned, dict(host_groups or {})
        self.max_rounds = max_rounds or max(20, 2 * topology.num_devices)
        self.tries = tries
        self.rounds = self.kept = 0  # what the last `refine` did

    def device_ms(self, ranks: Sequence[int], device: int, samples: int = 1) -> float:
        tables = [u for u, r in zip(self.units, ranks, strict=True) if r == device]
        return measured_device_ms(tables, self.topology, self.measurer, self.host_groups, samples)

    def select(self, candidates: Sequence[Sequence[int]]) -> list[int]:
        """The candidate with the lowest measured max (the first of equals); give the likely
        best first, as each later one is timed only until a device passes the best max."""
        best, best_max = list(candidates[0]), float("inf")
        for ranks in candidates:
            cost = self.max_ms(ranks, best_max)
            if cost < best_max:
                best, best_max = list(ranks), cost
        return best

    @torch.no_grad()
    def max_ms(self, ranks: Sequence[int], stop_above: float = float("inf")) -> float:
        """The measured max-device cost of `ranks`: the costliest predicted devices are timed
        first, and once a device reaches `stop_above` its cost is returned (the rest
        untimed); else the costliest device is settled (`_settled_top`), so that a plan
        does not win on one lucky timing of its max."""
        predicted = Placement(self.net, self.units, ranks, self.topology).costs()
        measured = [0.0] * self.topology.num_devices
        for device in torch.argsort(predicted, descending=True).tolist():
            measured[device] = self.device_ms(ranks, device)
            if measured[device] >= stop_above:
                return measured[device]
        return measured[self._settled_top(list(ranks), measured, set())]

    @torch.no_grad()
    def refine(self, ranks: Sequence[int]) -> list[int]:
        """`ranks` improved by measured moves and swaps off the costliest device."""
        placement = Placement(self.net, self.units, ranks, self.topology, self.pinned)
        devices = range(self.topology.num_devices)
        measured = [self.device_ms(ranks, d) for d in devices]
        settled: set[int] = set()
        self.rounds = self.kept = 0
        while self.rounds < self.max_rounds:
            self.rounds += 1
            top = self._settled_top(placement.rank.tolist(), measured, settled)
            if not self._improve(placement, measured, settled, top):
                break
            self.kept += 1
        return placement.rank.tolist()

    def _settled_top(self, ranks: Sequence[int], measured: list[float], settled: set[int]) -> int:
        """The costliest device once its cost is the median of `SAMPLES` timings: one lucky
        or unlucky timing should neither make nor hide the max."""
        while (top := max(range(len(measured)), key=measured.__getitem__)) not in settled:
            measured[top] = self.device_ms(ranks, top, SAMPLES)
            settled.add(top)
        return top

    def _improve(
        self, placement: Placement, measured: list[float], settled: set[int], top: int
    ) -> bool:
        """Keep the first of the model's `tries` best-ranked changes off `top` that lowers
        the measured max; False if none does."""
        changes = changes_off(placement, top)
        if len(changes) == 0:
            return False
        predicted = placement.costs()
        now = torch.tensor(measured)
        # The model's relative change on each device: its scale can be off on this machine.
        scale = now / predicted.clamp_min(1e-9)
        scale[predicted <= 0] = scale[predicted > 0].median()  # empty devices: a typical one
        estimate = torch.maximum(
            scale[top] * changes.top_after, scale[changes.dest] * changes.dest_after
        )
        estimate = torch.where(changes.ok, estimate, torch.inf)
        limit = measured[top] * (1 - MIN_GAIN)
        for i in torch.argsort(estimate)[: self.tries].tolist():
            if float(estimate[i]) >= limit:
                break
            change = changes.change(i)
            after = placement.rank.clone()
            for unit, _, dst in change:
                after[unit] = dst
            ranks, dest = after.tolist(), int(changes.dest[i])
            if max(self.device_ms(ranks, top), self.device_ms(ranks, dest)) >= limit:
                continue
            costs = self.device_ms(ranks, top, SAMPLES), self.device_ms(ranks, dest, SAMPLES)
            if max(costs) < limit:
                placement.apply(change)
                measured[top], measured[dest] = costs
                settled.update((top, dest))
                return True
        return False
