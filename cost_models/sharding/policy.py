"""The RL sharder's policy and the estimated MDP it acts in (DreamShard).

An episode places tables one at a time, largest predicted cost first. At each step the
policy scores every (table, device) pair from the table's features, the summed features
of the tables the device already holds, and cost features from the cost model: the
device's predicted cost now and with the table added, the plan's current max, and memory
use. Costs are divided by the ideal balanced load (sum of single-table costs / devices)
and table counts by the mean per device, so one policy serves any table count and device
count. Devices without room are masked. The reward is minus a soft maximum of the predicted
device costs at the end, in units of the balanced load: the max, plus a little for every
other device close to it (log-sum-exp at temperature `SOFT_MAX_TEMPERATURE`). When one
table alone sets the max, that still ranks the plans, and it keeps a margin against the
model's errors on the devices just below. No hardware is involved.

A device's cost in an episode never drops when a table joins: the model's prediction is
floored by the cost so far plus the table's marginal cost (its cost alone less the fixed
cost of a kernel call) and by the table's cost alone. A learned model is not monotone
everywhere, and a policy trained on it learns to exploit exactly those mistakes (e.g.
"eight more tables on the busiest device cost nothing").
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import torch
from torch import nn

from cost_models.sharding.cost_net import CostNet, mlp, run_mlp
from cost_models.sharding.files import load_net, save_net
from cost_models.sharding.tables import NUM_FEATURES, TableSpec, table_features
from cost_models.sharding.topology import Topology

NUM_STATE = 9  # cost and memory features per (table, device) pair; see `_Devices.observe`
SOFT_MAX_TEMPERATURE = 0.05  # in units of the balanced load


@dataclass(frozen=True)
class PolicyConfig:
    embedding: int = 32
    hidden: int = 64


class PolicyNet(nn.Module):
    def __init__(self, config: PolicyConfig | None = None) -> None:
        super().__init__()
        self.config = c = config or PolicyConfig()
        self.table_encoder = mlp(NUM_FEATURES, c.hidden, c.embedding)
        self.scorer = mlp(2 * c.embedding + NUM_STATE, c.hidden, c.hidden, 1)

    def score(
        self, table: torch.Tensor, devices: torch.Tensor, state: torch.Tensor
    ) -> torch.Tensor:
        """Logits `[R, D]` from one table's encoding `[E]` (or each row's, `[R, 1, E]`),
        the devices' encodings `[R, D, E]` and the pair state `[R, D, NUM_STATE]`."""
        table = table.expand(*devices.shape[:-1], -1)
        return run_mlp(self.scorer, torch.cat([table, devices, state], dim=-1)).squeeze(-1)


@dataclass
class Episodes:
    """`R` placements of the same tables (ranks in `tables` order) and what REINFORCE needs."""

    ranks: torch.Tensor  # [R, n]
    cost_ms: torch.Tensor  # [R] predicted max-device ms
    soft_cost: torch.Tensor  # [R] the soft maximum, in units of scale_ms
    scale_ms: float  # the balanced load that rewards are measured in
    log_prob: torch.Tensor  # [R] (zeros without gradients: planning needs none)
    entropy: torch.Tensor  # [R] mean per step (zeros without gradients)
    overflow_step: torch.Tensor  # [R] first step where no device had room (n if none)
    order: list[int]  # placement order, indices into tables

    @property
    def reward(self) -> torch.Tensor:
        return -self.soft_cost


@dataclass
class _Tables:
    """The episodes' units, encoded once: each group's (the units that every episode of the
    group places) one after the other, then a row of zeros, "nothing": what the episodes of
    a group that has placed all its units place while longer groups go on."""

    cost_codes: torch.Tensor  # [N + 1, Ec], the cost model's encodings
    codes: torch.Tensor  # [N + 1, Ep], the policy's (with gradients)
    sizes: torch.Tensor  # [N + 1] bytes
    single_ms: torch.Tensor  # [N + 1] predicted cost of each unit alone on a device
    # What a unit adds to a device at least: its cost alone less the fixed cost of a kernel
    # call (taken as the cost alone of its group's cheapest unit).
    marginal_ms: torch.Tensor  # [N + 1]
    scale_ms: torch.Tensor  # [N + 1] its group's balanced load (sum of costs alone / devices)
    per_device: torch.Tensor  # [N + 1] its group's units per device
    groups: list[range]  # each group's rows

    @classmethod
    def encode(
        cls,
        groups: Sequence[Sequence[TableSpec]],
        policy: PolicyNet,
        cost_net: CostNet,
        topology: Topology,
    ) -> _Tables:
        units = [t for group in groups for t in group]
        features = torch.from_numpy(table_features(units))
        with torch.no_grad():
            cost_codes = cost_net.encode(features)
            single = cost_net.device_ms(cost_codes, torch.ones(len(units)), topology)
        starts = list(itertools.accumulate((len(g) for g in groups), initial=0))
        spans = [range(a, b) for a, b in itertools.pairwise(starts)]
        d = topology.num_devices
        marginal = torch.cat([(single[s] - single[s].min()).clamp_min(0.0) for s in spans])
        scale = torch.cat([single[s].sum().expand(len(s)) / d for s in spans])
        per_device = torch.cat([torch.full((len(s),), len(s) / d) for s in spans])
        sizes = torch.tensor([float(t.size_bytes) for t in units])
        codes = policy.table_encoder(cost_net.normalize(features))
        encodings = [torch.cat([x, x.new_zeros(1, x.shape[1])]) for x in (cost_codes, codes)]
        per_unit = [torch.cat([x, x.new_tensor([fill])]) for x, fill in
                    ((sizes, 0.0), (single, 0.0), (marginal, 0.0), (scale, 1.0),
                     (per_device, 1.0))]  # fmt: skip
        return cls(*encodings, *per_unit, spans)

    @property
    def nothing(self) -> int:
        """The index of the row of zeros."""
        return len(self.sizes) - 1

    def order(self, group: int, pinned: int) -> list[int]:
        """Group `group`'s placement order (its indices): the first `pinned` units as they
        are, then the rest by cost alone, largest first."""
        single = self.single_ms[self.groups[group]][pinned:]
        return [*range(pinned), *(pinned + torch.argsort(single, descending=True)).tolist()]


class _Devices:
    """Each episode's devices: predicted cost and free memory. How the cost model rates a
    unit joining a device, and how the policy scores that, is the subclasses' part. Methods
    take `units`, `[R]`: the unit each episode places at this step."""

    def __init__(
        self,
        tables: _Tables,
        policy: PolicyNet,
        cost_net: CostNet,
        topology: Topology,
        episodes: int,
    ) -> None:
        """`episodes` per group of `tables`, the groups one after the other."""
        d, r = topology.num_devices, episodes * len(tables.groups)
        self.tables, self.policy, self.cost_net, self.topology = tables, policy, cost_net, topology
        self.capacity = float(topology.memory_bytes)
        first_units = torch.tensor([g.start for g in tables.groups]).repeat_interleave(episodes)
        self.scale = tables.scale_ms[first_units][:, None]  # [R, 1]
        self.per_device = tables.per_device[first_units][:, None]  # [R, 1]
        self.cost = torch.zeros(r, d)
        self.free = torch.full((r, d), self.capacity)
        self.flat_cost, self.flat_free = self.cost.view(-1), self.free.view(-1)
        self.row_starts = torch.arange(r) * d  # flat index of each episode's device 0
        self.start_codes()

    def start_codes(self) -> None:
        """Set up what the subclass keeps of the devices' units, for devices with none."""
        raise NotImplementedError

    def cost_with(self, units: torch.Tensor) -> torch.Tensor:
        """Each device's predicted ms if its episode's unit joined it, `[R, D]`: the cost
        model's prediction, but never below the device's cost so far plus the unit's
        marginal cost, nor below the unit's cost alone."""
        floor = torch.maximum(self.cost + self.tables.marginal_ms[units][:, None],
                              self.tables.single_ms[units][:, None])  # fmt: skip
        return torch.maximum(self.predicted_with(units), floor)

    def predicted_with(self, units: torch.Tensor) -> torch.Tensor:
        """The cost model's ms of each device with its episode's unit added, `[R, D]`."""
        raise NotImplementedError

    def logits(self, units: torch.Tensor, new_cost: torch.Tensor) -> torch.Tensor:
        """The policy's logits `[R, D]` for placing each episode's unit on each device."""
        raise NotImplementedError

    def place(
        self,
        units: torch.Tensor,
        action: torch.Tensor,
        new_cost: torch.Tensor,
        finished: torch.Tensor | None = None,
    ) -> None:
        """Each episode's unit joins its device `action`, at cost `new_cost`; episodes
        `finished` (a mask) have nothing left to place."""
        flat = self.row_starts + action
        if finished is not None:
            units, flat = units[~finished], flat[~finished]
        self.flat_cost.index_copy_(0, flat, new_cost.view(-1)[flat])
        self.flat_free.index_add_(0, flat, self.tables.sizes[units], alpha=-1)
        self.add_codes(units, flat)

    def add_codes(self, units: torch.Tensor, flat: torch.Tensor) -> None:
        """Record `units` on the devices at the flat indices `flat`."""
        raise NotImplementedError


class _SummedDevices(_Devices):
    """Devices as the sums of their units' encodings, fed whole to the cost model and the
    policy at every step: the computation that REINFORCE differentiates."""

    def start_codes(self) -> None:
        self.count = torch.zeros_like(self.cost)
        self.cost_codes = torch.zeros(*self.cost.shape, self.tables.cost_codes.shape[1])
        self.codes = torch.zeros(*self.cost.shape, self.tables.codes.shape[1])

    @torch.no_grad()
    def predicted_with(self, units: torch.Tensor) -> torch.Tensor:
        summed = self.cost_codes + self.tables.cost_codes[units][:, None, :]
        return self.cost_net.device_ms(summed, self.count + 1, self.topology)

    def logits(self, units: torch.Tensor, new_cost: torch.Tensor) -> torch.Tensor:
        devices = self.codes / self.per_device[..., None]
        state = self.pair_state(units, new_cost)
        return self.policy.score(self.tables.codes[units][:, None, :], devices, state)

    def pair_state(self, units: torch.Tensor, new_cost: torch.Tensor) -> torch.Tensor:
        """The cost and memory features of placing each episode's unit on each device,
        `[R, D, NUM_STATE]` (`_ProjectedDevices` takes the same features apart)."""
        now_max = self.cost.max(-1, keepdim=True).values.expand_as(self.cost)
        after_max = torch.maximum(new_cost, now_max)
        costs = [self.cost, new_cost, new_cost - self.cost, after_max, now_max]
        used = 1.0 - self.free / self.capacity
        state = [
            *(c / self.scale for c in costs),
            (new_cost > now_max).float(),
            used,
            used + self.tables.sizes[units][:, None] / self.capacity,
            self.count / self.per_device,
        ]
        return torch.stack(state, dim=-1)

    def add_codes(self, units: torch.Tensor, flat: torch.Tensor) -> None:
        self.count.view(-1).index_add_(0, flat, torch.ones(len(flat)))
        for summed, codes in ((self.cost_codes, self.tables.cost_codes),
                              (self.codes, self.tables.codes.detach())):  # fmt: skip
            summed.view(-1, summed.shape[-1]).index_add_(0, flat, codes[units])


class _ProjectedDevices(_Devices):
    """Devices for planning, without gradients: the arithmetic of `_SummedDevices` up to
    float rounding, at a fraction of the work. The cost model's heads and the policy's
    scorer begin with a linear layer, so a device's first-layer output is a sum of terms:
    its units' and its memory's (which change only where a unit lands: one device per
    episode and step), the joining unit's, and the pair's (the costs with the unit, which
    change everywhere at every step). The per-device sums are kept and updated where a
    unit lands, instead of projecting all R x D devices again at every step."""

    def start_codes(self) -> None:
        heads, scorer = self._project_heads(self.cost_net), self._project_scorer(self.policy)
        # Each unit's terms side by side, so that a step gathers its units' terms once.
        self.unit_terms = torch.cat([*heads, *scorer], dim=1)
        self.widths = [x.shape[1] for x in (*heads, *scorer)]
        self.step_terms: tuple[torch.Tensor, list[torch.Tensor]] | None = None

    def _project_heads(self, cost_net: CostNet) -> tuple[torch.Tensor, torch.Tensor]:
        """Each unit's first-layer terms of the heads (with the bias, for the joining unit;
        without, for a unit on a device), `[N + 1, 3 x H]` each."""
        first = [head[0] for head in cost_net.heads]  # each head: linear, ReLU, linear
        last = [head[2] for head in cost_net.heads]
        weight = torch.cat([layer.weight for layer in first])  # [3 x H, Ec]
        bias = torch.cat([layer.bias for layer in first])
        self.head_out = [(layer.weight[0], layer.bias[0]) for layer in last]
        self.head_sums = torch.zeros(len(first), self.cost.numel(), first[0].weight.shape[0])
        self.head_outputs = torch.zeros(len(first), self.cost.numel())
        self.head_hidden = torch.empty(len(first), *self.cost.shape, first[0].weight.shape[0])
        on_device = self.tables.cost_codes @ weight.T
        return on_device + bias, on_device

    def _project_scorer(self, policy: PolicyNet) -> tuple[torch.Tensor, torch.Tensor]:
        """Each unit's first-layer terms of the scorer, for the joining unit and for a unit
        on a device (with the memory it takes), `[N + 1, Hs]` each; the weights of the
        pair's features (as in `_SummedDevices.pair_state`)."""
        layer, tables = policy.scorer[0], self.tables
        size = tables.sizes[:, None] / self.capacity
        on_table, on_devices, w = layer.weight.T.split([tables.codes.shape[1]] * 2 + [NUM_STATE])
        joining = tables.codes @ on_table + layer.bias + size * w[7]
        landed = (tables.codes @ on_devices + w[8]) / tables.per_device[:, None] \
            + size * (w[6] + w[7])  # fmt: skip
        # The pair's features that change at every step: cost, new cost, max after, new > max.
        self.on_pair = torch.stack([w[0] - w[2], w[1] + w[2], w[3], w[5]])
        self.pair = torch.zeros(len(self.on_pair), *self.cost.shape)
        self.on_now_max = w[4]
        middle, _, out = list(policy.scorer)[2:]  # after the first ReLU (applied in place)
        self.scorer_middle = (middle.weight.T.contiguous(), middle.bias)
        self.scorer_out = (out.weight[0], out.bias[0])
        self.scorer_hidden = torch.empty(self.cost.numel(), middle.weight.shape[0])
        self.logits_out = torch.empty(self.cost.numel())
        self.scorer_sums = torch.zeros(self.cost.numel(), layer.weight.shape[0])
        return joining, landed

    def terms(self, units: torch.Tensor) -> list[torch.Tensor]:
        """The units' first-layer terms (see `_project_heads`, `_project_scorer`), gathered
        once per step."""
        if self.step_terms is None or self.step_terms[0] is not units:
            self.step_terms = (units, self.unit_terms[units].split(self.widths, dim=1))
        return self.step_terms[1]

    def predicted_with(self, units: torch.Tensor) -> torch.Tensor:
        joining = self.terms(units)[0].view(len(units), 3, 1, -1).transpose(0, 1)
        sums = self.head_sums.view(len(self.head_out), *self.cost.shape, -1)
        hidden = torch.add(sums, joining, out=self.head_hidden).relu_().view(self.head_sums.shape)
        # One matrix-vector product per head: a batched product with one column is slower.
        for x, (w, b), out in zip(hidden, self.head_out, self.head_outputs, strict=True):
            torch.addmv(b, x, w, out=out)
        forward, backward, megabytes = nn.functional.softplus(self.head_outputs)
        return (forward + backward + self.topology.comm_ms(megabytes)).view(self.cost.shape)

    def logits(self, units: torch.Tensor, new_cost: torch.Tensor) -> torch.Tensor:
        now_max = self.cost.max(-1, keepdim=True).values
        scaled_max = now_max / self.scale
        cost, new, after_max, over = self.pair  # in units of the balanced load
        torch.div(self.cost, self.scale, out=cost)
        torch.div(new_cost, self.scale, out=new)
        torch.maximum(new, scaled_max, out=after_max)
        over.copy_(new_cost > now_max)
        hidden = torch.addmm(self.scorer_sums, self.pair.view(len(self.pair), -1).T, self.on_pair)
        joining = torch.addr(self.terms(units)[2], scaled_max[:, 0], self.on_now_max)
        hidden.view(*self.cost.shape, -1).add_(joining[:, None, :]).relu_()
        # The scorer's last two layers into kept buffers; its last (one output) as a
        # matrix-vector product.
        (w, b), (w_out, b_out) = self.scorer_middle, self.scorer_out
        torch.addmm(b, hidden, w, out=self.scorer_hidden).relu_()
        return torch.addmv(b_out, self.scorer_hidden, w_out, out=self.logits_out).view(
            self.cost.shape
        )

    def add_codes(self, units: torch.Tensor, flat: torch.Tensor) -> None:
        _, on_device, _, landed = self.terms(units)
        self.head_sums.index_add_(1, flat, on_device.view(len(flat), 3, -1).transpose(0, 1))
        self.scorer_sums.index_add_(0, flat, landed)


def _draw_by_inverse_cdf(
    logits: torch.Tensor, generator: torch.Generator | None, greedy: slice | None
) -> torch.Tensor:
    """An action per row of `logits` (-inf where masked; the rows `greedy` take the argmax),
    drawn with the probabilities of `_sample` but in a few cheap ops (`torch.multinomial`
    checks its input at every call: a fifth of a planning step)."""
    cdf = torch.softmax(logits, -1).cumsum(-1, dtype=torch.float64)
    uniform = torch.rand(len(cdf), 1, generator=generator, dtype=torch.float64)
    # The first device whose cumulative probability exceeds the draw: never a masked one.
    action = torch.searchsorted(cdf, uniform * cdf[:, -1:], right=True).squeeze(-1)
    action.clamp_max_(cdf.shape[-1] - 1)  # rounding: a draw equal to the total
    if greedy is not None:
        action[greedy] = logits[greedy].argmax(-1)
    return action


def _sample(
    logits: torch.Tensor, generator: torch.Generator | None, greedy: slice | None
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """An action per row of `logits` (-inf where masked; the rows `greedy` take the
    argmax), its log-probability and the entropy: the arithmetic of
    `torch.distributions.Categorical`, without its per-call argument checks."""
    log_p = logits - logits.logsumexp(-1, keepdim=True)
    probs = torch.softmax(log_p, -1)
    action = torch.multinomial(probs.detach(), 1, generator=generator).squeeze(-1)
    if greedy is not None:
        action[greedy] = probs[greedy].argmax(-1)
    log_prob = log_p.gather(-1, action[:, None]).squeeze(-1)
    entropy = -(log_p.clamp(min=torch.finfo(log_p.dtype).min) * probs).sum(-1)
    return action, log_prob, entropy


def run_episodes(
    policy: PolicyNet,
    cost_net: CostNet,
    tables: Sequence[TableSpec],
    topology: Topology,
    episodes: int,
    greedy_first: bool = False,
    generator: torch.Generator | None = None,
    pinned: Sequence[int] = (),
    projected: bool | None = None,
) -> Episodes:
    """Place `tables` `episodes` times in parallel, sampling actions from the policy
    (episode 0 takes the argmax when `greedy_first`). Gradients reach the policy only.
    The first `len(pinned)` tables go first to the ranks `pinned` lists (row shards): every
    device starts with their memory and their predicted cost. Without gradients (planning),
    devices keep their first-layer projections (`_ProjectedDevices`, unless `projected` is
    False); with them (training), each step feeds the summed encodings whole."""
    return run_episode_groups(policy, cost_net, [tables], topology, episodes, greedy_first,
                              generator, pinned, projected)[0]  # fmt: skip


def run_episode_groups(
    policy: PolicyNet,
    cost_net: CostNet,
    groups: Sequence[Sequence[TableSpec]],
    topology: Topology,
    episodes: int,
    greedy_first: bool = False,
    generator: torch.Generator | None = None,
    pinned: Sequence[int] = (),
    projected: bool | None = None,
) -> list[Episodes]:
    """`run_episodes` of several groups of tables (e.g. the same tables cut in different
    ways) in one loop: one step of every group at a time, so that the fixed cost of a
    step is paid once. Each group starts with the same `pinned` units."""
    encoded = _Tables.encode(groups, policy, cost_net, topology)
    learning = torch.is_grad_enabled()
    projected = not learning if projected is None else projected
    kind = _ProjectedDevices if projected else _SummedDevices
    devices = kind(encoded, policy, cost_net, topology, episodes)
    orders = [encoded.order(g, len(pinned)) for g in range(len(groups))]
    schedule = _schedule(encoded, orders, episodes)  # [steps, R]
    finished = schedule == encoded.nothing
    some_finished = finished.any(-1).tolist()
    lengths = torch.tensor([len(g) for g in groups]).repeat_interleave(episodes)
    fixed, r = len(pinned), len(lengths)
    greedy = slice(None, None, episodes) if greedy_first else None
    placed = [torch.full((r,), rank) for rank in pinned]
    for step, action in enumerate(placed):
        devices.place(schedule[step], action, devices.cost_with(schedule[step]))
    log_prob, entropy = torch.zeros(r), torch.zeros(r)
    overflow_step = torch.where((devices.free < 0).any(-1), 0, lengths)
    for step in range(fixed, len(schedule)):
        units, done = schedule[step], finished[step] if some_finished[step] else None
        new_cost = devices.cost_with(units)
        logits = devices.logits(units, new_cost)
        full = devices.free < encoded.sizes[units][:, None]
        stuck = full.all(-1)
        if stuck.any():
            overflow_step = torch.where(stuck & (overflow_step == lengths), step, overflow_step)
            full[stuck] = False  # place anyway: the episode is marked as overflowing
        logits = logits.masked_fill(full, float("-inf"))
        if learning:
            action, step_log_prob, step_entropy = _sample(logits, generator, greedy)
            live = 1.0 if done is None else (~done).float()
            log_prob = log_prob + live * step_log_prob
            entropy = entropy + live * step_entropy / (lengths - fixed)
        else:
            action = _draw_by_inverse_cdf(logits, generator, greedy)
        devices.place(units, action, new_cost, done)
        placed.append(action)
    actions = torch.stack(placed, dim=1)  # [R, steps]
    t = SOFT_MAX_TEMPERATURE
    soft = t * torch.logsumexp(devices.cost / devices.scale / t, dim=-1)
    cost = devices.cost.max(-1).values
    out = []
    for g, order in enumerate(orders):
        rows = slice(g * episodes, (g + 1) * episodes)
        ranks = torch.empty(episodes, len(order), dtype=torch.long)
        ranks[:, order] = actions[rows, : len(order)]
        scale = float(devices.scale[g * episodes])
        out.append(Episodes(ranks, cost[rows], soft[rows], scale, log_prob[rows], entropy[rows],
                            overflow_step[rows], order))  # fmt: skip
    return out


def _schedule(tables: _Tables, orders: list[list[int]], episodes: int) -> torch.Tensor:
    """`[steps, R]`: the unit (index into `tables`) each episode places at each step, each
    group's in its order, then nothing."""
    steps = max(len(order) for order in orders)
    columns = [
        torch.tensor([group.start + i for i in order] + [tables.nothing] * (steps - len(order)))
        for group, order in zip(tables.groups, orders, strict=True)
    ]
    return torch.stack(columns, dim=1).repeat_interleave(episodes, dim=1)


# ---------------------------------------------------------------------- files


def save_policy(policy: PolicyNet, directory: str | Path) -> None:
    save_net(policy, directory, "policy")


def load_policy(directory: str | Path) -> PolicyNet:
    return load_net(PolicyNet, PolicyConfig, directory, "policy", "sharding policy")
