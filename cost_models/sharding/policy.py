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
        """Logits `[R, D]` from one table's encoding `[E]`, the devices' encodings
        `[R, D, E]` and the pair state `[R, D, NUM_STATE]`."""
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
    """An episode's tables, encoded once."""

    cost_codes: torch.Tensor  # [n, Ec], the cost model's encodings
    codes: torch.Tensor  # [n, Ep], the policy's (with gradients)
    sizes: torch.Tensor  # [n] bytes
    single_ms: torch.Tensor  # [n] predicted cost of each table alone on a device

    @classmethod
    def encode(
        cls, tables: Sequence[TableSpec], policy: PolicyNet, cost_net: CostNet, topology: Topology
    ) -> _Tables:
        features = torch.from_numpy(table_features(tables))
        with torch.no_grad():
            cost_codes = cost_net.encode(features)
            single = cost_net.device_ms(cost_codes, torch.ones(len(tables)), topology)
        normalized = cost_net.normalize(features)
        sizes = torch.tensor([float(t.size_bytes) for t in tables])
        return cls(cost_codes, policy.table_encoder(normalized), sizes, single)


class _Devices:
    """Each episode's devices: predicted cost, table count, free memory. How the cost model
    rates a table joining a device, and how the policy scores that, is the subclasses' part."""

    def __init__(
        self, tables: _Tables, policy: PolicyNet, cost_net: CostNet, topology: Topology, r: int
    ) -> None:
        d = topology.num_devices
        self.tables, self.policy, self.cost_net, self.topology = tables, policy, cost_net, topology
        self.capacity = float(topology.memory_bytes)
        self.scale = float(tables.single_ms.sum()) / d
        # What a table adds to a device at least: its cost alone less the fixed cost of a
        # kernel call (taken as the cheapest table's cost alone).
        self.marginal = (tables.single_ms - tables.single_ms.min()).clamp_min(0.0).tolist()
        self.single_ms = tables.single_ms.tolist()
        self.per_device = len(tables.sizes) / d
        self.count = torch.zeros(r, d)
        self.cost = torch.zeros(r, d)
        self.free = torch.full((r, d), self.capacity)
        self.row_starts = torch.arange(r) * d  # flat index of each episode's device 0
        self.ones = torch.ones(r)

    def cost_with(self, i: int) -> torch.Tensor:
        """Each device's predicted ms if table `i` joined it, `[R, D]`: the cost model's
        prediction, but never below the device's cost so far plus the table's marginal cost,
        nor below the table's cost alone."""
        floor = torch.clamp_min(self.cost + self.marginal[i], self.single_ms[i])
        return torch.maximum(self.predicted_with(i), floor)

    def predicted_with(self, i: int) -> torch.Tensor:
        """The cost model's ms of each device with table `i` added, `[R, D]`."""
        raise NotImplementedError

    def logits(self, i: int, new_cost: torch.Tensor) -> torch.Tensor:
        """The policy's logits `[R, D]` for placing table `i` on each device."""
        raise NotImplementedError

    def place(self, i: int, action: torch.Tensor, new_cost: torch.Tensor) -> None:
        """Table `i` joins device `action[r]` of each episode `r`, at cost `new_cost`."""
        flat = self.row_starts + action
        before = self.cost.view(-1)[flat]
        after = new_cost.view(-1)[flat]
        self.cost.view(-1)[flat] = after
        self.count.view(-1).index_add_(0, flat, self.ones)
        self.free.view(-1).index_add_(0, flat, self.ones, alpha=-float(self.tables.sizes[i]))
        self.add_codes(i, flat, after - before)

    def add_codes(self, i: int, flat: torch.Tensor, cost_increase: torch.Tensor) -> None:
        """Record table `i` on the devices at the flat indices `flat` (one per episode),
        whose costs rose by `cost_increase`."""
        raise NotImplementedError


class _SummedDevices(_Devices):
    """Devices as the sums of their tables' encodings, fed whole to the cost model and the
    policy at every step: the computation that REINFORCE differentiates."""

    def __init__(
        self, tables: _Tables, policy: PolicyNet, cost_net: CostNet, topology: Topology, r: int
    ) -> None:
        super().__init__(tables, policy, cost_net, topology, r)
        d = topology.num_devices
        self.cost_codes = torch.zeros(r, d, tables.cost_codes.shape[1])
        self.codes = torch.zeros(r, d, tables.codes.shape[1])

    @torch.no_grad()
    def predicted_with(self, i: int) -> torch.Tensor:
        summed = self.cost_codes + self.tables.cost_codes[i]
        return self.cost_net.device_ms(summed, self.count + 1, self.topology)

    def logits(self, i: int, new_cost: torch.Tensor) -> torch.Tensor:
        devices = self.codes / self.per_device
        return self.policy.score(self.tables.codes[i], devices, self.pair_state(i, new_cost))

    def pair_state(self, i: int, new_cost: torch.Tensor) -> torch.Tensor:
        """The cost and memory features of placing table `i` on each device,
        `[R, D, NUM_STATE]` (`_ProjectedDevices` takes the same features apart)."""
        now_max = self.cost.max(-1, keepdim=True).values.expand_as(self.cost)
        after_max = torch.maximum(new_cost, now_max)
        costs = [self.cost, new_cost, new_cost - self.cost, after_max, now_max]
        used = 1.0 - self.free / self.capacity
        state = [
            *(c / self.scale for c in costs),
            (new_cost > now_max).float(),
            used,
            used + self.tables.sizes[i] / self.capacity,
            self.count / self.per_device,
        ]
        return torch.stack(state, dim=-1)

    def add_codes(self, i: int, flat: torch.Tensor, cost_increase: torch.Tensor) -> None:
        for summed, codes in ((self.cost_codes, self.tables.cost_codes),
                              (self.codes, self.tables.codes.detach())):  # fmt: skip
            width = summed.shape[-1]
            summed.view(-1, width).index_add_(0, flat, codes[i].expand(len(flat), width))


class _ProjectedDevices(_Devices):
    """Devices for planning, without gradients: the arithmetic of `_SummedDevices` up to
    float rounding, at a fraction of the work. The cost model's heads and the policy's
    scorer begin with a linear layer, so a device's first-layer output is a sum of terms:
    its tables' and its own state's (which change only where a table lands: one device
    per episode and step), the joining table's, and the pair's (the costs with the table,
    which change everywhere at every step). The per-device sums are kept and updated where
    a table lands, instead of projecting all R x D devices again at every step."""

    def __init__(
        self, tables: _Tables, policy: PolicyNet, cost_net: CostNet, topology: Topology, r: int
    ) -> None:
        super().__init__(tables, policy, cost_net, topology, r)
        self._project_heads(cost_net, r * topology.num_devices)
        self._project_scorer(policy, r * topology.num_devices)

    def _project_heads(self, cost_net: CostNet, devices: int) -> None:
        first = [head[0] for head in cost_net.heads]  # each head: linear, ReLU, linear
        last = [head[2] for head in cost_net.heads]
        weight = torch.stack([layer.weight for layer in first])  # [3, H, Ec]
        bias = torch.stack([layer.bias for layer in first])  # [3, H]
        self.table_heads = torch.einsum("khe,ne->nkh", weight, self.tables.cost_codes)
        self.joining_heads = (self.table_heads + bias)[:, :, None, :]  # [n, 3, 1, H]
        self.head_out = [(layer.weight[0], layer.bias[0]) for layer in last]
        self.head_sums = torch.zeros(len(first), devices, weight.shape[1])

    def _project_scorer(self, policy: PolicyNet, devices: int) -> None:
        """The scorer's first layer, taken apart by what its inputs change with (features
        as in `_SummedDevices.pair_state`)."""
        layer = policy.scorer[0]
        e, size = self.tables.codes.shape[1], self.tables.sizes[:, None] / self.capacity
        on_table, on_devices, on_state = layer.weight.T.split([e, e, NUM_STATE])
        w = on_state / torch.tensor([self.scale] * 5 + [1.0] * 4)[:, None]  # [NUM_STATE, Hs]
        codes = self.tables.codes
        self.joining = codes @ on_table + layer.bias + size * w[7]  # [n, Hs]
        self.landed = (codes @ on_devices + w[8]) / self.per_device + size * (w[6] + w[7])
        self.on_cost = w[0] - w[2]
        self.on_now_max = w[4]
        self.on_pair = torch.stack([w[1] + w[2], w[3], w[5]])  # new, after max, new > max
        self.scorer_rest = list(policy.scorer)[1:]
        self.scorer_sums = torch.zeros(devices, layer.weight.shape[0])

    def predicted_with(self, i: int) -> torch.Tensor:
        hidden = torch.add(self.head_sums, self.joining_heads[i]).relu_()
        # One matrix-vector product per head: a batched product with one column is slower.
        forward, backward, megabytes = (
            nn.functional.softplus(torch.addmv(b, x, w)).view(self.cost.shape)
            for x, (w, b) in zip(hidden, self.head_out, strict=True)
        )
        return forward + backward + self.topology.comm_ms(megabytes)

    def logits(self, i: int, new_cost: torch.Tensor) -> torch.Tensor:
        now_max = self.cost.max(-1, keepdim=True).values
        pair = [new_cost, torch.maximum(new_cost, now_max), (new_cost > now_max).float()]
        pair = torch.stack(pair, dim=-1).view(-1, len(pair))
        hidden = torch.addmm(self.scorer_sums, pair, self.on_pair)
        joining = torch.addr(self.joining[i], now_max[:, 0], self.on_now_max, beta=1)
        hidden.view(*self.cost.shape, -1).add_(joining[:, None, :]).relu_()
        return run_mlp(self.scorer_rest, hidden).view(self.cost.shape)

    def add_codes(self, i: int, flat: torch.Tensor, cost_increase: torch.Tensor) -> None:
        heads = self.table_heads[i][:, None, :].expand(-1, len(flat), -1)
        self.head_sums.index_add_(1, flat, heads)
        landed = torch.addr(self.landed[i], cost_increase, self.on_cost)
        self.scorer_sums.index_add_(0, flat, landed)


def _draw(
    log_p: torch.Tensor, generator: torch.Generator | None, greedy_first: bool
) -> tuple[torch.Tensor, torch.Tensor]:
    """An action per row of log-probabilities `log_p` (row 0 takes the argmax when
    `greedy_first`), and the probabilities."""
    probs = torch.softmax(log_p, -1)
    action = torch.multinomial(probs.detach(), 1, generator=generator).squeeze(-1)
    if greedy_first:
        action[0] = probs[0].argmax()
    return action, probs


def _sample(
    logits: torch.Tensor, generator: torch.Generator | None, greedy_first: bool
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """An action per row of `logits` (-inf where masked; episode 0 takes the argmax when
    `greedy_first`), its log-probability and the entropy: the arithmetic of
    `torch.distributions.Categorical`, without its per-call argument checks."""
    log_p = logits - logits.logsumexp(-1, keepdim=True)
    action, probs = _draw(log_p, generator, greedy_first)
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
    encoded = _Tables.encode(tables, policy, cost_net, topology)
    learning = torch.is_grad_enabled()
    projected = not learning if projected is None else projected
    kind = _ProjectedDevices if projected else _SummedDevices
    devices = kind(encoded, policy, cost_net, topology, episodes)
    n, fixed = len(tables), len(pinned)
    ranks = torch.zeros(episodes, n, dtype=torch.long)
    for i, rank in enumerate(pinned):
        ranks[:, i] = rank
        devices.place(i, ranks[:, i], devices.cost_with(i))
    order = list(range(fixed))
    order += (fixed + torch.argsort(encoded.single_ms[fixed:], descending=True)).tolist()
    log_prob, entropy = torch.zeros(episodes), torch.zeros(episodes)
    overflow_step = torch.full((episodes,), 0 if (devices.free < 0).any() else n)
    for step, i in enumerate(order[fixed:], start=fixed):
        new_cost = devices.cost_with(i)
        logits = devices.logits(i, new_cost)
        fits = devices.free >= encoded.sizes[i]
        stuck = ~fits.any(-1)
        if stuck.any():
            overflow_step = torch.where(stuck & (overflow_step == n), step, overflow_step)
            fits[stuck] = True  # place anyway: the episode is marked as overflowing
        logits = logits.masked_fill(~fits, float("-inf"))
        if learning:
            action, step_log_prob, step_entropy = _sample(logits, generator, greedy_first)
            log_prob = log_prob + step_log_prob
            entropy = entropy + step_entropy / (n - fixed)
        else:
            log_p = logits - logits.logsumexp(-1, keepdim=True)
            action = _draw(log_p, generator, greedy_first)[0]
        devices.place(i, action, new_cost)
        ranks[:, i] = action
    t = SOFT_MAX_TEMPERATURE
    soft = t * torch.logsumexp(devices.cost / devices.scale / t, dim=-1)
    cost = devices.cost.max(-1).values
    return Episodes(ranks, cost, soft, devices.scale, log_prob, entropy, overflow_step, order)


# ---------------------------------------------------------------------- files


def save_policy(policy: PolicyNet, directory: str | Path) -> None:
    save_net(policy, directory, "policy")


def load_policy(directory: str | Path) -> PolicyNet:
    return load_net(PolicyNet, PolicyConfig, directory, "policy", "sharding policy")
