"""The learned sharder: a trained policy places tables on the cost model's estimated MDP.

Candidate cuts of the heaviest tables into column shards (none, and the cuts that
`splitting.choose_splits` proposes at each of `split_limits`) are each screened with the
policy's greedy episode (all candidates' episodes in one loop); the cut whose greedy plan
has the lowest predicted max-device cost wins and gets `episodes - 1` sampled episodes
more: by default as many as fit a fixed
amount of work (16 for 800 tables on 128 devices, up to 512 for small workloads; more
samples keep a margin against the cost model's errors). Of that cut's episodes, the
feasible plan with the lowest soft max-device cost (see `policy`: it keeps a margin
against the model's errors on the devices just below the max) is kept.

Tables bigger than a device are cut by rows first (`row_wise_tables`): over one host's
devices or over every device, whichever the cost model's compute and the topology's
hierarchical communication rate lower (`row_mode` forces one, for comparisons). Their
shards are pinned in the episodes: each device starts with its own shards' memory and
predicted cost, and the other tables are placed around them.

Selection (`select`, on by default): the greedy heuristics (the AutoShard/DreamShard
baselines, and torchrec's greedy partitioner on the cost model's estimates) place the
chosen cut's units too, and of their plans and the policy's, the one with the lowest
robust predicted cost (`robust_max_ms`: the expected max under the model's per-device
error) is returned. When no episode fits in memory, the best-rated heuristic plan is
used. With `refine=True` (off by default), the policy's plan and the best heuristic plan
are first improved by local search (`refine`: moves and swaps off the costliest device);
measured, that was worse in 7 of 8 held-out pools (BENCHMARKS.md, "Sharding across kinds
of table pools"): the search balances the model's predictions, errors included.

With a `measurer` (off by default: planning then takes seconds to minutes, not under a
second), the candidate cuts and plans (with torchrec's table-wise plan where nothing is
cut) are ranked as above but chosen by their measured max-device cost on this machine,
and the chosen plan is improved by measured moves and swaps
(`measured.MeasuredSearch`): the model proposes, the timings decide.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import torch

from cost_models.sharding.cost_net import CostNet, load_cost_net, predict_kernel_ms
from cost_models.sharding.measure import Measurer, single_threaded
from cost_models.sharding.measured import MeasuredSearch, plan_max_ms
from cost_models.sharding.plan import Plan, host_row_groups, make_plan
from cost_models.sharding.policy import Episodes, PolicyNet, load_policy, run_episode_groups
from cost_models.sharding.refine import device_costs, refine
from cost_models.sharding.sharders.base import (
    GreedySharder,
    Sharder,
    check_capacity,
    unplaced_error,
)
from cost_models.sharding.sharders.dim_greedy import DimGreedy
from cost_models.sharding.sharders.lookup_greedy import LookupGreedy
from cost_models.sharding.sharders.size_greedy import SizeGreedy
from cost_models.sharding.sharders.size_lookup_greedy import SizeLookupGreedy
from cost_models.sharding.splitting import choose_splits, column_cuts
from cost_models.sharding.tables import (
    TableSpec,
    fills_row_shards,
    placement_units,
    row_shards,
)
from cost_models.sharding.topology import Topology, traffic_megabytes
from search_space.errors import RanknasError

SPLIT_LIMITS = (1.0, 0.5)  # shares of a balanced device's load above which a table is cut
# A cut that adds more shards than this share of the tables (and than the devices) is not
# screened: at 800 tables on 128 devices the 0.5 limit cut 124 tables into 942 shards, and
# its screening episode over twice the units made planning 1.6x slower.
MAX_EXTRA_UNITS = 0.25
GREEDY_SHARDERS = (SizeLookupGreedy, LookupGreedy, SizeGreedy, DimGreedy)  # the baselines
# Episodes x placed units x devices that one plan may cost (16 episodes of 800 x 128).
EPISODE_WORK = 16 * 800 * 128
MIN_EPISODES, MAX_EPISODES = 16, 512
# The cost model's relative error on one device's cost (held-out MAPE ~8%: a normal error's
# mean absolute value is 0.8 of its standard deviation), and the fixed draws of errors
# that `robust_max_ms` averages over.
MODEL_ERROR = 0.1
ERROR_DRAWS = 64


@dataclass(frozen=True)
class _Best:
    """A cut's best feasible episode."""

    splits: dict[str, int]
    units: list[TableSpec]
    ranks: list[int]
    cost_ms: float  # predicted max-device cost
    soft_ms: float  # soft max-device cost


class RLSharder(Sharder):
    name = "rl"

    def __init__(
        self,
        policy: PolicyNet,
        cost_net: CostNet,
        episodes: int | None = None,
        seed: int = 0,
        split_limits: Sequence[float] = SPLIT_LIMITS,
        refine: bool = False,
        row_mode: str = "auto",
        select: bool = True,
        model_error: float = MODEL_ERROR,
        measurer: Measurer | None = None,
        row_cut_heavy: bool = True,
    ) -> None:
        self.policy, self.cost_net = policy.eval(), cost_net.eval()
        self.episodes, self.seed, self.split_limits = episodes, seed, tuple(split_limits)
        self.refine, self.row_mode = refine, row_mode
        self.select, self.model_error = select, model_error
        self.measurer = measurer
        self.row_cut_heavy = row_cut_heavy
        self.search: MeasuredSearch | None = None  # the last measured search, for reports

    @classmethod
    def load(
        cls, directory: str | Path, episodes: int | None = None, measurer: Measurer | None = None
    ) -> RLSharder:
        """The policy and cost model that `ranknas shard train` saved in `directory`."""
        return cls(load_policy(directory), load_cost_net(directory), episodes, measurer=measurer)

    @single_threaded
    @torch.inference_mode()  # no autograd bookkeeping: a third of an episode step's overhead
    def plan(self, tables: Sequence[TableSpec], topology: Topology) -> Plan:
        """Tables too big for a device are cut by rows; so, in a second plan, are the heavy
        tables (`row_cut_heavy`: a cost alone above a balanced device's, where the lookups
        rather than the columns set the floor, and a column cut does not split the
        lookups). With row cuts in "auto" mode on several hosts, every distinct cut (the
        estimate's choice, all in hosts, none in hosts) is planned. Of the plans, the one
        with the lowest measured max (with a measurer) or robust predicted max is kept: the
        estimate prices a row shard before the other tables are placed around it. With a
        measurer, every baseline's plan of the whole tables (the greedy heuristics',
        torchrec's table-wise and column-wise) is one more candidate: it costs a few timings
        (the column-wise planner takes about as long as the measured search at 128
        devices), and the plan kept then measures no worse than any of them."""
        check_capacity(tables, topology, cut=True)
        shard_ms = functools.partial(self._row_shard_ms, topology=topology)
        modes = ROW_MODES if self.row_mode == "auto" and topology.hosts > 1 else (self.row_mode,)
        heavies = [frozenset()]
        if self.row_cut_heavy:
            heavies += [heavy] if (heavy := self._heavy(tables, topology)) else []
        cuts: list[tuple[dict[str, tuple[int, ...]], int | None]] = []
        for i, heavy in enumerate(heavies):
            for mode in modes:
                cut = row_wise_tables(
                    tables, topology, shard_ms if mode == "auto" else None, mode, heavy
                )
                # Without a measurer the heavy tables' cut is planned by its greedy episode
                # alone: sampling it too would double the planning time.
                episodes = 1 if i and self.measurer is None else self.episodes
                cuts += [(cut, episodes)] if cut not in (c for c, _ in cuts) else []
        plans, stuck = [], None
        for cut, n in cuts:
            try:
                plans.append(self._plan_around(tables, topology, cut, n))
            except RanknasError as exc:  # what is left does not pack beside the row shards
                stuck = exc
        if not plans:
            assert stuck is not None  # every cut failed: each said why
            plans = [self._plan_cutting_more(tables, topology, cuts[0][0], modes[0], stuck)]
        if self.measurer is not None:
            return self._measured_best([*plans, *self._baseline_plans(tables, topology)],
                                       tables, topology)  # fmt: skip
        if len(plans) == 1:
            return plans[0]
        return min(plans, key=lambda plan: self._predicted_max(tables, plan, topology))

    def _plan_cutting_more(
        self,
        tables: Sequence[TableSpec],
        topology: Topology,
        cut: dict[str, tuple[int, ...]],
        mode: str,
        stuck: RanknasError,
    ) -> Plan:
        """A plan with the largest whole tables cut by rows too, one more at a time (each
        planned by the greedy episode, in the first row mode), until the rest packs: a
        table just under a device's size fits an empty device, yet not one beside a row
        shard of a larger table (two tables of 48 and 38 GiB on eight devices of 40 GiB
        found no plan; with 80 GiB devices, or 64 of them, they did)."""
        shard_ms = functools.partial(self._row_shard_ms, topology=topology)
        whole = sorted((t for t in tables if t.name not in cut), key=lambda t: -t.size_bytes)
        for more in range(1, min(len(whole), MORE_ROW_CUTS) + 1):
            heavy = {*cut, *(t.name for t in whole[:more])}
            wider = row_wise_tables(tables, topology, shard_ms if mode == "auto" else None,
                                    mode, heavy)  # fmt: skip
            try:
                return self._plan_around(tables, topology, wider, 1)
            except RanknasError as exc:
                stuck = exc
        raise stuck

    def _predicted_max(self, tables: Sequence[TableSpec], plan: Plan, topology: Topology) -> float:
        costs = torch.from_numpy(self.cost_net.plan_costs(tables, plan, topology).sum(1))
        return robust_max_ms(costs, self.model_error)

    def _baseline_plans(self, tables: Sequence[TableSpec], topology: Topology) -> list[Plan]:
        """The greedy heuristics' and torchrec's plans of the whole tables (those that fit)."""
        plans = []
        for sharder in (greedy() for greedy in GREEDY_SHARDERS):
            try:
                plans.append(sharder.plan(tables, topology))
            except RanknasError:  # a table too big for a device, or no room left
                continue
        torchrec = (self._torchrec_plan(tables, topology, column_wise=c) for c in (False, True))
        return plans + [plan for plan in torchrec if plan]

    def _measured_best(
        self, plans: Sequence[Plan], tables: Sequence[TableSpec], topology: Topology
    ) -> Plan:
        """The plan with the lowest measured max (the first of equals; each later one timed
        only until a device passes the best max)."""
        best, best_ms = plans[0], float("inf")
        for plan in plans:
            cost = plan_max_ms(self.cost_net, plan, tables, topology, self.measurer, best_ms)
            best, best_ms = (plan, cost) if cost < best_ms else (best, best_ms)
        return best

    def _heavy(self, tables: Sequence[TableSpec], topology: Topology) -> frozenset[str]:
        """The tables above a balanced device's load that no column cut brings under it and
        that a host's row shards fill (those of one host, or of every device)."""
        cost_alone = functools.partial(self.cost_net.alone_ms, topology=topology)
        heavy = column_cuts(tables, topology.num_devices, cost_alone, 1.0)[1]
        by_name = {t.name: t for t in tables}
        return frozenset(n for n in heavy if fills_row_shards(by_name[n], topology.host_size))

    def _plan_around(
        self,
        tables: Sequence[TableSpec],
        topology: Topology,
        row_wise: dict[str, tuple[int, ...]],
        episodes: int | None = None,
    ) -> Plan:
        """The plan of `tables` with those in `row_wise` cut by rows over the ranks listed
        (`episodes`: the policy's episodes, by default `episode_count`'s)."""
        by_name = {t.name: t for t in tables}
        pinned = [
            (shard, rank)
            for name, ranks in row_wise.items()
            for shard, rank in zip(row_shards(by_name[name], len(ranks)), ranks, strict=True)
        ]
        rest = [t for t in tables if t.name not in row_wise]
        host_groups = host_row_groups(row_wise, topology.num_devices)
        chosen = self._place(rest, topology, pinned, host_groups, episodes)
        ranks = self._select(chosen, topology, len(pinned), host_groups)
        assignment = {t.name: r for t, r in zip(chosen.units, ranks, strict=True)}
        return make_plan(
            assignment, tables, topology.num_devices, self.name, chosen.splits, row_wise
        )

    def _row_shard_ms(self, table: TableSpec, group: int, topology: Topology) -> float:
        """Predicted compute and analytic communication of one of `group` row shards."""
        shard = row_shards(table, group)[0]
        host_groups = {shard.name: group} if group < topology.num_devices else {}
        traffic = traffic_megabytes([shard], host_groups, self.cost_net.config.batch_size)
        return float(predict_kernel_ms(self.cost_net, [[shard]])[0] + topology.comm_ms(*traffic))

    def _place(
        self,
        tables: Sequence[TableSpec],
        topology: Topology,
        pinned: Sequence[tuple[TableSpec, int]] = (),
        host_groups: Mapping[str, int] | None = None,
        episodes: int | None = None,
    ) -> _Best:
        """The policy's best episode placing `tables` (cut by the best candidate cut) on
        devices that already hold the `pinned` row shards (the first units, at their ranks:
        each device's memory and cost start from its own shards; `host_groups`: those cut
        inside a host)."""
        check_capacity([*tables, *(shard for shard, _ in pinned)], topology)
        generator = torch.Generator().manual_seed(self.seed)
        candidates = self._candidate_splits(tables, topology)
        held = [shard for shard, _ in pinned]
        pinned_ranks = [rank for _, rank in pinned]
        most_units = len(held) + len(placement_units(tables, candidates[-1]))  # the last cuts most
        count = episodes or episode_count(most_units, topology.num_devices)
        screen = count if len(candidates) == 1 else 1
        groups = [held + placement_units(tables, splits) for splits in candidates]
        runs = self._episodes(groups, topology, screen, True, generator, pinned_ranks)
        screened, stuck = [], None
        for splits, units, episodes in zip(candidates, groups, runs, strict=True):
            best = _best(episodes, splits, units)
            screened += [best] if best else []
            stuck = stuck or (None if best else (episodes, units))
        if not screened:
            return self._packed_by_heuristic(stuck, candidates[0], topology, pinned_ranks)
        chosen = min(screened, key=lambda b: (b.cost_ms, b.soft_ms))
        if self.measurer is not None and len(screened) > 1:
            chosen = self._measured_cut(screened, chosen, topology, len(held), host_groups)
        if count > screen:
            more = self._episodes(
                [chosen.units], topology, count - screen, False, generator, pinned_ranks
            )[0]
            chosen = min(filter(None, [chosen, _best(more, chosen.splits, chosen.units)]),
                         key=lambda b: b.soft_ms)  # fmt: skip
        return chosen

    def _measured_cut(
        self,
        screened: list[_Best],
        predicted: _Best,
        topology: Topology,
        pinned: int,
        host_groups: Mapping[str, int] | None,
    ) -> _Best:
        """Of the candidate cuts' greedy plans, the one with the lowest measured max (the
        model's choice first and on ties): the model can misjudge what a cut saves."""
        best, best_ms = predicted, float("inf")
        for b in [predicted, *(b for b in screened if b is not predicted)]:
            search = MeasuredSearch(self.cost_net, b.units, topology, self.measurer, pinned,
                                    host_groups)  # fmt: skip
            cost = search.max_ms(b.ranks, best_ms)
            best, best_ms = (b, cost) if cost < best_ms else (best, best_ms)
        return best

    def _packed_by_heuristic(
        self,
        stuck: tuple[Episodes, list[TableSpec]],
        splits: dict[str, int],
        topology: Topology,
        pinned_ranks: Sequence[int],
    ) -> _Best:
        """When no episode fits in memory (the policy places by cost, not to pack tight),
        the greedy heuristics' plan of the first candidate cut's units (`stuck`: its
        episodes and units) that the cost model rates lowest; the furthest episode's error
        if none of them fits either."""
        units = stuck[1]
        heuristic = self._heuristic_ranks(units, topology, pinned_ranks)
        if not heuristic:
            raise _stuck_error(*stuck, topology)
        rate = functools.partial(device_costs, self.cost_net, units, topology=topology)
        cost, best = min((float(rate(r).max()), i) for i, r in enumerate(heuristic))
        return _Best(splits, units, heuristic[best], cost, cost)

    def _select(
        self, chosen: _Best, topology: Topology, pinned: int, host_groups: Mapping[str, int]
    ) -> list[int]:
        """Of the policy's plan and the greedy heuristics' plans of the same units (with the
        `pinned` first units where they are), the one with the lowest robust predicted cost
        (`robust_max_ms`). With `refine`, the policy's plan and the best heuristic plan are
        first improved by local search. With a measurer, the one with the lowest measured
        max, improved by the measured search (`host_groups`: the table-row-wise shards)."""
        rate = functools.partial(device_costs, self.cost_net, chosen.units, topology=topology)
        score = functools.partial(robust_max_ms, relative_error=self.model_error)
        if not (self.select or self.refine or self.measurer):
            return chosen.ranks
        heuristic = self._heuristic_ranks(chosen.units, topology, chosen.ranks[:pinned])
        starts = [chosen.ranks]
        if heuristic and self.refine:
            starts.append(min(heuristic, key=lambda ranks: float(rate(ranks).max())))
            starts = [refine(self.cost_net, chosen.units, r, topology, pinned=pinned)
                      for r in starts]  # fmt: skip
        candidates = starts + (heuristic if self.select else [])
        ranked = sorted(candidates, key=lambda ranks: score(rate(ranks)))
        if self.measurer is None:
            return ranked[0]
        if pinned == 0 and not chosen.splits:  # torchrec's plan is then one of these units'
            ranked += self._torchrec_ranks(chosen.units, topology)
        self.search = MeasuredSearch(self.cost_net, chosen.units, topology, self.measurer,
                                     pinned, host_groups)  # fmt: skip
        return self.search.refine(self.search.select(ranked))

    def _heuristic_ranks(
        self, units: Sequence[TableSpec], topology: Topology, pinned_ranks: Sequence[int]
    ) -> list[list[int]]:
        """Each greedy heuristic's ranks for `units`, the first ones (row shards) held at
        `pinned_ranks`: the AutoShard/DreamShard baselines, and torchrec's greedy partitioner
        (largest cost first, onto the least loaded device) on the cost model's estimates."""
        held = list(zip(units, pinned_ranks, strict=False))
        rest = units[len(held) :]
        alone = dict(zip((t.name for t in units), self.cost_net.alone_ms(units, topology),
                         strict=True))  # fmt: skip
        sharders = (*(greedy() for greedy in GREEDY_SHARDERS), PredictedCostGreedy(alone))
        out = []
        for sharder in sharders:
            try:
                assignment = sharder.place(rest, topology, held)
            except RanknasError:  # this heuristic finds no room: the others may
                continue
            out.append([*pinned_ranks, *(assignment[t.name] for t in rest)])
        return out

    def _torchrec_ranks(self, tables: Sequence[TableSpec], topology: Topology) -> list[list[int]]:
        """torchrec's table-wise planner's ranks for `tables` (none if it finds no plan)."""
        plan = self._torchrec_plan(tables, topology)
        return [[plan.assignment[t.name] for t in tables]] if plan else []

    def _torchrec_plan(
        self, tables: Sequence[TableSpec], topology: Topology, column_wise: bool = False
    ) -> Plan | None:
        """torchrec's planner's plan (table-wise, or also column-wise), None if it finds none."""
        from cost_models.sharding.sharders.torchrec_planner import TorchrecPlanner

        planner = TorchrecPlanner(self.cost_net.config.batch_size, column_wise)
        try:
            return planner.plan(tables, topology)
        except RanknasError:
            return None

    def _candidate_splits(
        self, tables: Sequence[TableSpec], topology: Topology
    ) -> list[dict[str, int]]:
        """No cut, then the distinct cuts proposed at each split limit that add at most
        `MAX_EXTRA_UNITS` of the table count (or the device count) in shards."""
        candidates: list[dict[str, int]] = [{}]
        cost_alone = functools.partial(self.cost_net.alone_ms, topology=topology)
        for limit in self.split_limits:
            splits = choose_splits(tables, topology.num_devices, cost_alone, limit)
            extra = sum(parts - 1 for parts in splits.values())
            if splits not in candidates and extra <= max(
                topology.num_devices, MAX_EXTRA_UNITS * len(tables)
            ):
                candidates.append(splits)
        return candidates

    def _episodes(
        self,
        groups: Sequence[Sequence[TableSpec]],
        topology: Topology,
        count: int,
        greedy_first: bool,
        generator: torch.Generator,
        pinned: Sequence[int] = (),
    ) -> list[Episodes]:
        """`count` episodes of each group of units, all in one loop."""
        with torch.inference_mode():
            return run_episode_groups(self.policy, self.cost_net, groups, topology, count,
                                      greedy_first, generator, pinned)  # fmt: skip


ROW_MODES = ("auto", "host", "world")
MORE_ROW_CUTS = 16  # whole tables `_plan_cutting_more` cuts by rows at most, largest first
ShardMs = Callable[[TableSpec, int], float]  # (table, row shards) -> one shard's ms


def row_wise_tables(
    tables: Sequence[TableSpec],
    topology: Topology,
    shard_ms: ShardMs | None = None,
    mode: str = "auto",
    heavy: Collection[str] = (),
) -> dict[str, tuple[int, ...]]:
    """Tables too big for one device, and the tables named in `heavy`, cut by rows: over
    the devices of one host (table-row-wise: the partial sums are reduced inside the host,
    only the reduced output crosses hosts), or over every device (row-wise: more devices
    share the lookups, but every partial sum crosses hosts). A host is possible where there
    are several and half of one host's memory holds the table (hosts taken in turn). Mode
    "host" then takes it, "world" never does, and "auto" takes whichever adds less to the
    busiest device holding its shards, with `shard_ms(table, group)` the cost of one of
    `group` shards on one device (compute and the topology's communication), before the
    other tables are placed around them (`RLSharder.plan` also plans the other modes' cuts
    and keeps the best). Without `shard_ms`, "auto" is "host". A heavy table with too few
    rows for a shard on every device is cut over a host in every mode."""
    if mode not in ROW_MODES:
        raise RanknasError(f"row-wise mode {mode!r}: choose one of {', '.join(ROW_MODES)}")
    device, host, hosts = topology.memory_bytes, topology.host_size, topology.hosts
    world = topology.num_devices
    load = [0.0] * hosts  # the row shards' ms on each device of each host
    out: dict[str, tuple[int, ...]] = {}
    for t in sorted(tables, key=lambda t: -t.size_bytes):
        if t.size_bytes <= device and t.name not in heavy:
            continue
        h = sum(len(ranks) < world for ranks in out.values()) % hosts
        short = not fills_row_shards(t, world)  # a heavy table too short for every device
        inside = shard_ms(t, host) if shard_ms else 0.0
        spread = shard_ms(t, world) if shard_ms and not short else 0.0
        in_host = mode != "world" and hosts > 1 and t.size_bytes <= 0.5 * host * device
        if short:
            in_host = True
        elif in_host and mode == "auto":
            in_host = load[h] + inside <= max(load) + spread
        if in_host:
            out[t.name] = tuple(range(h * host, (h + 1) * host))
            load[h] += inside
        else:
            out[t.name] = tuple(range(world))
            load = [x + spread for x in load]
    return out


class PredictedCostGreedy(GreedySharder):
    """torchrec's greedy partitioner on given estimates: largest first, least loaded device."""

    name = "predicted_cost_greedy"

    def __init__(self, cost_ms: Mapping[str, float]) -> None:
        self.cost_ms = cost_ms

    def weight(self, table: TableSpec) -> float:  # type: ignore[override]
        return float(self.cost_ms[table.name])


def robust_max_ms(device_ms: torch.Tensor, relative_error: float) -> float:
    """The expected max-device cost if each device's measured cost strays from its
    prediction by an independent normal relative error of std `relative_error` (fixed
    draws, so plans are compared on the same errors). With many devices near the max, the
    largest positive error sets the measured max: a plan with one device well above the
    others scores about its max, one with many devices at the same max scores higher."""
    draws = torch.randn(ERROR_DRAWS, len(device_ms), generator=torch.Generator().manual_seed(0))
    return float((device_ms * (1 + relative_error * draws)).max(-1).values.mean())


def episode_count(units: int, devices: int) -> int:
    """Episodes for a plan of `units` on `devices`: a fixed amount of work, within bounds."""
    return int(min(MAX_EPISODES, max(MIN_EPISODES, EPISODE_WORK // (units * devices))))


def _best(episodes: Episodes, splits: dict[str, int], units: list[TableSpec]) -> _Best | None:
    """The feasible episode with the lowest soft cost, or None if all ran out of memory."""
    feasible = episodes.overflow_step == len(units)
    if not feasible.any():
        return None
    soft_ms = torch.where(feasible, episodes.soft_cost * episodes.scale_ms, torch.inf)
    i = int(soft_ms.argmin())
    ranks = episodes.ranks[i].tolist()
    return _Best(splits, units, ranks, float(episodes.cost_ms[i]), float(soft_ms[i]))


def _stuck_error(episodes: Episodes, tables: Sequence[TableSpec], topology: Topology):
    """The tables the furthest-reaching episode could not place, and the memory left then."""
    best = int(episodes.overflow_step.argmax())
    step = int(episodes.overflow_step[best])
    free = [topology.memory_bytes] * topology.num_devices
    for i in episodes.order[:step]:
        free[int(episodes.ranks[best, i])] -= tables[i].size_bytes
    return unplaced_error([tables[i] for i in episodes.order[step:]], free, RLSharder.name)
