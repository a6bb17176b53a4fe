"""The neural cost model (AutoShard / DreamShard): what one device's tables cost per step.

Per-table features (21) -> shared encoder MLP (21 -> 128 -> 32, exp at the end) -> sum
over a device's tables -> three heads (32 -> 64 -> 1): forward ms, backward ms, and the
megabytes the device's shards exchange in all-to-alls (turned into ms by the topology's
hierarchical all-to-all, `Topology.comm_ms`). A device's cost is the sum of the three; a
plan's cost is the max over devices. Heads predict
in linear space (softplus of their output), so "a fixed cost per device plus a share per
table" is what a linear head computes and anything else is learned on top; training
minimizes the MSE of log costs, so errors are relative.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from scipy.stats import kendalltau
from torch import nn

from cost_models.sharding.files import load_net, save_net
from cost_models.sharding.measure import KernelTime, single_threaded
from cost_models.sharding.methods import PACKAGED_MODEL as PACKAGED_MODEL
from cost_models.sharding.plan import Plan
from cost_models.sharding.tables import NUM_FEATURES, TableSpec, row_shard_name, table_features
from cost_models.sharding.topology import Topology, comm_megabytes, traffic_megabytes
from search_space.errors import RanknasError

HEADS = ("forward_ms", "backward_ms", "comm_mb")


@dataclass(frozen=True)
class CostNetConfig:
    hidden: int = 128
    embedding: int = 32
    head_hidden: int = 64
    batch_size: int = 512  # examples per step that the costs are for (the measurements')
    kernel: str = ""  # what the measurements timed, for the record
    device: str = ""


@dataclass(frozen=True)
class CostSample:
    """One measured device: its tables and their kernel time."""

    tables: tuple[TableSpec, ...]
    time: KernelTime


@dataclass(frozen=True)
class FitConfig:
    epochs: int = 300
    lr: float = 3e-3
    weight_decay: float = 1e-5
    sets_per_batch: int = 128
    seed: int = 0


def mlp(*widths: int) -> nn.Sequential:
    """Linear layers of these widths with ReLU between them (none after the last)."""
    layers: list[nn.Module] = []
    for a, b in itertools.pairwise(widths):
        layers += [nn.Linear(a, b), nn.ReLU()]
    return nn.Sequential(*layers[:-1])


def run_mlp(layers: Iterable[nn.Module], x: torch.Tensor) -> torch.Tensor:
    """`layers(x)` for an `mlp`, the same kernels called directly: an episode step runs a
    dozen layers on small tensors, where nn.Module's per-call dispatch costs as much as
    the arithmetic."""
    for layer in layers:
        x = nn.functional.linear(x, layer.weight, layer.bias) if isinstance(layer, nn.Linear) \
            else torch.relu(x)  # fmt: skip
    return x


class Exp(nn.Module):
    """exp, capped: encodings are positive and log-linear in the log-scaled features, so a
    table's share of the cost can grow like dim x pooling factor, as lookups do."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x.clamp(max=20.0).exp()


MAX_Z = 8.0


class CostNet(nn.Module):
    def __init__(self, config: CostNetConfig | None = None) -> None:
        super().__init__()
        self.config = c = config or CostNetConfig()
        self.encoder = nn.Sequential(mlp(NUM_FEATURES, c.hidden, c.embedding), Exp())
        self.heads = nn.ModuleList(mlp(c.embedding, c.head_hidden, 1) for _ in HEADS)
        self.register_buffer("feature_mean", torch.zeros(NUM_FEATURES))
        self.register_buffer("feature_std", torch.ones(NUM_FEATURES))

    def fit_normalization(self, features: torch.Tensor) -> None:
        self.feature_mean.copy_(features.mean(0))
        self.feature_std.copy_(features.std(0).clamp_min(1e-3))

    def normalize(self, features: torch.Tensor) -> torch.Tensor:
        """Standardized features, clipped to `MAX_Z` standard deviations: a table unlike any
        measured one (e.g. 10 rows, every id read thousands of times) must not send the
        exponential encoder to absurd costs. Training pools stay within about 8."""
        return ((features - self.feature_mean) / self.feature_std).clamp(-MAX_Z, MAX_Z)

    def encode(self, features: torch.Tensor) -> torch.Tensor:
        """`[N, 21]` raw table features -> `[N, embedding]`."""
        return self.encoder(self.normalize(features))

    def predict(self, summed: torch.Tensor) -> torch.Tensor:
        """Summed table encodings `[..., embedding]` -> `[..., 3]`: forward ms, backward ms,
        megabytes (softplus keeps them positive)."""
        heads = [run_mlp(head, summed) for head in self.heads]
        return nn.functional.softplus(torch.cat(heads, dim=-1))

    def device_ms(
        self, summed: torch.Tensor, count: torch.Tensor, topology: Topology
    ) -> torch.Tensor:
        """Total ms of devices with `count` table-wise or column-wise units whose encodings
        sum to `summed`; 0 if empty. The comm head's megabytes go through the topology's
        all-to-all."""
        costs = self.predict(summed)
        total = costs[..., 0] + costs[..., 1] + topology.comm_ms(costs[..., 2])
        return torch.where(count > 0, total, torch.zeros_like(total))

    @torch.no_grad()
    def alone_ms(self, tables: Sequence[TableSpec], topology: Topology) -> np.ndarray:
        """Predicted ms (compute and communication) of each table alone on a device."""
        encoded = self.encode(torch.from_numpy(table_features(tables)))
        return self.device_ms(encoded, torch.ones(len(tables)), topology).numpy()

    @torch.no_grad()
    def plan_costs(self, tables: Sequence[TableSpec], plan: Plan, topology: Topology) -> np.ndarray:
        """Predicted `[num_devices, 3]` ms: forward, backward, communication (0 where empty).
        The comm head rates table-wise and column-wise units; row shards' traffic is
        computed from their sizes (`topology.traffic_megabytes`)."""
        units = plan.units(tables)
        encoded = self.encode(torch.from_numpy(table_features(units)))
        ranks = torch.tensor([plan.assignment[t.name] for t in units])
        d = plan.num_devices
        costs = self.predict(torch.zeros(d, encoded.shape[1]).index_add_(0, ranks, encoded))
        rows = {row_shard_name(t, j) for t, rs in plan.row_wise.items() for j in range(len(rs))}
        if rows:  # the comm head rates the whole units only
            whole = torch.tensor([t.name not in rows for t in units])
            codes = torch.zeros(d, encoded.shape[1]).index_add_(0, ranks[whole], encoded[whole])
            has_whole = torch.bincount(ranks[whole], minlength=d) > 0
            a2a_mb = torch.where(has_whole, self.predict(codes)[:, 2], 0.0).double()
        else:
            a2a_mb = costs[:, 2].double()
        reduce_mb = torch.zeros(d, dtype=torch.float64)
        groups, batch = plan.host_row_groups(), self.config.batch_size
        for t, rank in zip(units, ranks.tolist(), strict=True):
            if t.name in rows:
                a2a, reduce = traffic_megabytes([t], groups, batch)
                a2a_mb[rank] += a2a
                reduce_mb[rank] += reduce
        costs[:, 2] = topology.comm_ms(a2a_mb, reduce_mb).float()
        empty = torch.bincount(ranks, minlength=d) == 0
        costs[empty] = 0.0
        return costs.numpy()


# ---------------------------------------------------------------------- training


def _batch(
    net: CostNet, samples: Sequence[CostSample], features: Sequence[torch.Tensor]
) -> tuple[torch.Tensor, torch.Tensor]:
    """Predicted and measured `[len(samples), 3]` for a minibatch of device sets."""
    index = torch.cat([torch.full((len(f),), i) for i, f in enumerate(features)])
    encoded = net.encode(torch.cat(list(features)))
    summed = torch.zeros(len(samples), encoded.shape[1]).index_add_(0, index, encoded)
    batch_size = net.config.batch_size
    target = torch.tensor(
        [
            [s.time.forward_ms, s.time.backward_ms, comm_megabytes(s.tables, batch_size)]
            for s in samples
        ]
    )
    return net.predict(summed), target


@single_threaded
def fit_cost_net(
    samples: Sequence[CostSample],
    config: FitConfig | None = None,
    net: CostNet | CostNetConfig | None = None,
) -> tuple[CostNet, list[float]]:
    """Train a new net (from a `CostNetConfig`, or the default) or keep training `net` on
    measured device sets; returns the net and the per-epoch mean loss (MSE of log costs)."""
    config = config or FitConfig()
    if not samples:
        raise RanknasError("no measurements to fit the cost model on")
    torch.manual_seed(config.seed)
    features = [torch.from_numpy(table_features(s.tables)) for s in samples]
    if not isinstance(net, CostNet):
        net = CostNet(net)
        net.fit_normalization(torch.cat(features))
    optimizer = torch.optim.AdamW(net.parameters(), lr=config.lr, weight_decay=config.weight_decay)
    schedule = torch.optim.lr_scheduler.CosineAnnealingLR(optimizer, config.epochs)
    history = []
    for _ in range(config.epochs):
        losses = []
        for chunk in torch.randperm(len(samples)).split(config.sets_per_batch):
            predicted, target = _batch(
                net, [samples[i] for i in chunk], [features[i] for i in chunk]
            )
            loss = (predicted.log() - target.log()).pow(2).mean()
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            losses.append(loss.item())
        schedule.step()
        history.append(float(np.mean(losses)))
    return net, history


@torch.no_grad()
def predict_kernel_ms(net: CostNet, table_sets: Sequence[Sequence[TableSpec]]) -> np.ndarray:
    """Predicted forward + backward kernel ms of each set."""
    out = []
    for tables in table_sets:
        summed = net.encode(torch.from_numpy(table_features(tables))).sum(0)
        costs = net.predict(summed)
        out.append(float(costs[0] + costs[1]))
    return np.asarray(out)


def errors(predicted: Sequence[float], measured: Sequence[float]) -> dict[str, float]:
    """MAPE (%) and Kendall's tau of predictions against measurements."""
    predicted, measured = np.asarray(predicted), np.asarray(measured)
    tau = kendalltau(predicted, measured).statistic
    return {
        "mape": float(np.mean(np.abs(predicted - measured) / measured) * 100),
        "kendall_tau": float(tau),
    }


# ---------------------------------------------------------------------- files


def save_cost_net(net: CostNet, directory: str | Path) -> None:
    save_net(net, directory, "cost_net")


def load_cost_net(directory: str | Path) -> CostNet:
    return load_net(CostNet, CostNetConfig, directory, "cost_net", "cost model")
