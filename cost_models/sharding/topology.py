"""Devices a plan places tables on: how many, their memory, and the links between them.

Defaults are torchrec's planner constants (`torchrec.distributed.planner.constants`):
32 GiB per device (HBM_CAP), 8 devices per host, NVLink-class bandwidth inside a host and
network bandwidth across hosts (bytes per millisecond).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from torchrec.distributed.planner.constants import (
    CROSS_NODE_BANDWIDTH,
    HBM_CAP,
    INTRA_NODE_BANDWIDTH,
)

from cost_models.sharding.tables import TableSpec

GIB = 1024**3
# Bytes per example a table-wise shard moves: pooled output (fp32) forward, its gradient
# backward, per output dim; and the int64 ids of the input all-to-all, per pooled id.
_BYTES_PER_DIM = 4 + 4
_BYTES_PER_ID = 8


@dataclass(frozen=True)
class Topology:
    num_devices: int
    memory_bytes: int = HBM_CAP
    local_world_size: int = 8
    intra_host_bw: float = INTRA_NODE_BANDWIDTH
    inter_host_bw: float = CROSS_NODE_BANDWIDTH

    @property
    def bandwidth(self) -> float:
        """Bytes/ms of the slowest link an all-to-all over all devices crosses."""
        if self.num_devices <= self.local_world_size:
            return self.intra_host_bw
        return self.inter_host_bw

    def comm_ms(self, megabytes: float) -> float:
        return megabytes * 1e6 / self.bandwidth


def comm_megabytes(tables: Sequence[TableSpec], batch_size: int) -> float:
    """Megabytes one device's table-wise shards send and receive per training step."""
    per_example = sum(
        t.embedding_dim * _BYTES_PER_DIM + t.pooling_factor * _BYTES_PER_ID for t in tables
    )
    return batch_size * per_example / 1e6
