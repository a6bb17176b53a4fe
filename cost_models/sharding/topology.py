"""Devices a plan places tables on: hosts of devices, their memory, and the links between them.

Defaults are torchrec's planner constants (`torchrec.distributed.planner.constants`):
32 GiB per device (HBM_CAP), 8 devices per host, NVLink-class bandwidth inside a host and
network bandwidth across hosts (bytes per millisecond). Latencies are assumed orders of
magnitude (a collective over NVLink, one over the network), not measured.

Communication is analytic and hierarchical (DESIGN.md, "Sharding"): a device's traffic to
the other devices of its host runs at the intra-host bandwidth, its traffic to other
hosts at the inter-host bandwidth, both at once (the slower part sets the time).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from torchrec.distributed.planner.constants import (
    CROSS_NODE_BANDWIDTH,
    HBM_CAP,
    INTRA_NODE_BANDWIDTH,
)

from cost_models.sharding.tables import TableSpec

GIB = 1024**3
# Bytes per example a shard moves: pooled output (fp32) forward, its gradient backward,
# per output dim; and the int64 ids of the input all-to-all, per pooled id.
_BYTES_PER_DIM = 4 + 4
_BYTES_PER_ID = 8
INTRA_HOST_LATENCY_MS = 0.01
INTER_HOST_LATENCY_MS = 0.03
# Collectives per step: all-to-alls of ids and pooled outputs forward and of gradients
# backward; a table-row-wise reduction inside a host (reduce-scatter forward, all-gather
# backward).
ALL_TO_ALLS_PER_STEP = 3
HOST_REDUCTIONS_PER_STEP = 2


@dataclass(frozen=True)
class Topology:
    num_devices: int
    memory_bytes: int = HBM_CAP
    local_world_size: int = 8
    intra_host_bw: float = INTRA_NODE_BANDWIDTH
    inter_host_bw: float = CROSS_NODE_BANDWIDTH
    intra_host_latency_ms: float = INTRA_HOST_LATENCY_MS
    inter_host_latency_ms: float = INTER_HOST_LATENCY_MS

    @property
    def host_size(self) -> int:
        """Devices per host (all of them when they fit in one host)."""
        return min(self.local_world_size, self.num_devices)

    @property
    def hosts(self) -> int:
        return self.num_devices // self.host_size

    @property
    def all_to_all_ms_per_mb(self) -> float:
        """ms per megabyte of a device's all-to-all traffic: of what it exchanges with the
        W devices, (L - 1) / W stays in its host of L and (W - L) / W crosses hosts; the
        share for itself (1 / W) moves nothing. The two links run at once."""
        w, local = self.num_devices, self.host_size
        inside = (local - 1) / w / self.intra_host_bw
        across = (w - local) / w / self.inter_host_bw
        return 1e6 * max(inside, across)

    @property
    def all_to_all_latency_ms(self) -> float:
        if self.num_devices == 1:
            return 0.0
        latency = self.inter_host_latency_ms if self.hosts > 1 else self.intra_host_latency_ms
        return ALL_TO_ALLS_PER_STEP * latency

    def comm_ms(self, all_to_all_mb, host_reduce_mb=0.0):
        """ms per step of a device that exchanges `all_to_all_mb` in all-to-alls over every
        device and reduces `host_reduce_mb` inside its host (floats, arrays or tensors)."""
        reduce_latency = (host_reduce_mb > 0) * self.intra_host_latency_ms
        reduce_ms = host_reduce_mb * 1e6 / self.intra_host_bw
        reduce_ms = reduce_ms + HOST_REDUCTIONS_PER_STEP * reduce_latency
        a2a_ms = all_to_all_mb * self.all_to_all_ms_per_mb + self.all_to_all_latency_ms
        return a2a_ms + reduce_ms

    def allreduce_ms(self, megabytes: float) -> float:
        """ms of a ring all-reduce of `megabytes` (the dense gradients of data-parallel
        training) over every device: each sends and receives 2 (W - 1) / W of it, at the
        bandwidth of the slowest link it crosses."""
        w = self.num_devices
        if w == 1:
            return 0.0
        bandwidth, latency = self.intra_host_bw, self.intra_host_latency_ms
        if self.hosts > 1:
            bandwidth, latency = self.inter_host_bw, self.inter_host_latency_ms
        return 2 * (w - 1) / w * megabytes * 1e6 / bandwidth + 2 * latency


def comm_megabytes(tables: Sequence[TableSpec], batch_size: int) -> float:
    """Megabytes one device's table-wise, column-wise or row-wise shards send and receive
    per training step in all-to-alls (a row-wise shard's reduce-scatter of partial sums
    over every device moves as much as an all-to-all of its output)."""
    per_example = sum(
        t.embedding_dim * _BYTES_PER_DIM + t.pooling_factor * _BYTES_PER_ID for t in tables
    )
    return batch_size * per_example / 1e6


def traffic_megabytes(
    tables: Sequence[TableSpec], host_groups: Mapping[str, int], batch_size: int
) -> tuple[float, float]:
    """(all-to-all MB, host-reduction MB) per step of one device holding `tables`;
    `host_groups` names the table-row-wise shards among them with the size of their group
    (the L devices of one host). Such a shard receives its share of the ids in the
    all-to-all, reduces its full-width partial sums inside the host ((L - 1) / L of them
    leave the device) and sends only its 1 / L of the reduced output across the world."""
    whole = [t for t in tables if t.name not in host_groups]
    a2a, reduce = comm_megabytes(whole, batch_size), 0.0
    for t in tables:
        if (group := host_groups.get(t.name)) is not None:
            output = batch_size * t.embedding_dim * _BYTES_PER_DIM / 1e6
            a2a += batch_size * t.pooling_factor * _BYTES_PER_ID / 1e6 + output / group
            reduce += output * (group - 1) / group
    return a2a, reduce
