"""The sharding plan of a trial's embedding tables and its predicted step time.

With `sharding.devices > 0` in the study config, every trial places its tables with the
configured sharder (`cost_models.sharding.sharders`) on the study's topology and, where
`ranknas shard train` saved a cost model, predicts the embedding step cost of the most
loaded device. With `objectives.cost: step_ms` or `max_step_ms`, it also predicts the
whole training step of one device of that cluster (`predict_step`).
"""

from __future__ import annotations

import functools
from pathlib import Path
from typing import Any

import numpy as np

from cost_models.sharding.cost_net import PACKAGED_MODEL, CostNet, load_cost_net
from cost_models.sharding.links import measured_topology, read_links
from cost_models.sharding.plan import Plan
from cost_models.sharding.sharders import make_sharder
from cost_models.sharding.tables import DTYPE_BYTES, TableSpec, tables_from_architecture
from cost_models.sharding.topology import Topology
from search_space.architecture import Architecture


def topology(devices: int, hosts: int | None = None, links: str | None = None) -> Topology:
    """`devices` over `hosts` hosts (None: torchrec's 8 devices per host); `links`: a file
    of `ranknas shard links`, whose measured collectives replace the intra-host constants."""
    local = 8 if hosts is None else devices // hosts  # `Topology.host_size` caps it
    if links is None:
        return Topology(devices, local_world_size=local)
    return measured_topology(read_links(links), devices, local)


def plan_trial_sharding(
    arch: Architecture,
    cluster: Topology,
    method: str,
    model_dir: str,
    batch_size: int,
    pooling_factors: dict[str, float] | None = None,
    plan: Plan | None = None,
) -> dict[str, Any]:
    """The plan as JSON, with `predicted_embedding_step_ms` (the embedding part of the most
    loaded device: the whole step is `predict_step`'s) where `model_dir` holds a cost model.
    `batch_size`: per device; `pooling_factors`: a multi-valued feature's mean ids per row
    (1 for the others); `plan`: the sharder's, already made (by `predict_step`)."""
    tables = tables_from_architecture(arch, pooling_factors)
    plan = plan or make_sharder(method, model_dir, batch_size).plan(tables, cluster)
    record: dict[str, Any] = plan.to_dict()
    record["hosts"] = cluster.hosts
    record["pooling_factors"] = {t.name: t.pooling_factor for t in tables if t.pooling_factor != 1}
    if (Path(model_dir) / "cost_net.json").exists():
        per_device = _device_costs(_cost_net(str(model_dir)), tables, plan, cluster, batch_size)
        record["predicted_embedding_step_ms"] = float(per_device.sum(1).max())
    return record


def predict_step(
    arch: Architecture,
    cluster: Topology,
    method: str,
    model_dir: str,
    batch_size: int,
    dense_ms: float,
    dense_params: int,
    pooling_factors: dict[str, float] | None = None,
    runtime_ms: float = 0.0,
    dense_factor: float = 1.0,
    ms_per_pooled_mb: float = 0.0,
) -> dict[str, Any]:
    """The predicted training step (ms) of one device of `cluster`, each device with a batch
    of `batch_size`, and its parts: the dense part measured alone (`dense_ms`: blocks and
    head forward and backward, data-parallel on every device), the all-reduce of the dense
    gradients (the topology's links), and the most loaded device's embedding lookups
    (forward, backward) and all-to-all traffic under the study's sharder's plan (the
    sharding cost model of `model_dir`, else the one shipped with ranknas), and
    `runtime_ms`, the sharded runtime's fixed cost per step; `dense_factor`: the dense
    part's time inside a sharded step over its time alone (`ranknas shard links` measures
    both), and `ms_per_pooled_mb`, what the runtime adds for each MB of pooled embeddings a
    device takes a step (its batch's every feature, whichever device looked it up). The
    parts run one after another: nothing overlaps."""
    tables = tables_from_architecture(arch, pooling_factors)
    plan = make_sharder(method, model_dir, batch_size).plan(tables, cluster)
    cost_dir = model_dir if (Path(model_dir) / "cost_net.json").exists() else str(PACKAGED_MODEL)
    net = _cost_net(cost_dir)
    shipped = Path(cost_dir).resolve() == PACKAGED_MODEL.resolve()  # given, or fallen back to
    source = "the sharding cost model shipped with ranknas" if shipped else model_dir
    per_device = _device_costs(net, tables, plan, cluster, batch_size)
    busiest = int(per_device.sum(1).argmax())
    allreduce_ms = cluster.allreduce_ms(4 * dense_params / 1e6)
    embedding_ms = float(per_device[busiest, :2].sum())
    comm_ms = float(per_device[busiest, 2])
    in_step_ms = dense_ms * dense_factor
    pooled_ms = ms_per_pooled_mb * pooled_mb(tables, batch_size)
    return {
        "step_ms": in_step_ms + allreduce_ms + embedding_ms + comm_ms + runtime_ms + pooled_ms,
        "dense_ms": in_step_ms,
        "dense_alone_ms": dense_ms,
        "dense_factor": dense_factor,
        "runtime_ms": runtime_ms,
        "pooled_ms": pooled_ms,
        "allreduce_ms": allreduce_ms,
        "embedding_ms": embedding_ms,
        "all_to_all_ms": comm_ms,
        "busiest_device": busiest,
        "devices": cluster.num_devices,
        "hosts": cluster.hosts,
        "batch_per_device": batch_size,
        "sharder": method,
        "cost_model": f"{source} ({net.config.device}, {net.config.kernel})",
        "plan": plan.to_dict(),
    }


def pooled_mb(tables: list[TableSpec], batch_size: int) -> float:
    """The pooled embeddings one device takes a step (MB): a vector per feature per row."""
    return batch_size * sum(t.embedding_dim * DTYPE_BYTES[t.dtype] for t in tables) / 1e6


@functools.cache
def _cost_net(directory: str) -> CostNet:
    return load_cost_net(directory)


def _device_costs(net: CostNet, tables, plan, cluster: Topology, batch_size: int) -> np.ndarray:
    """`[devices, 3]` ms (lookups forward, backward, communication) at `batch_size`: the
    cost net's, made at its own batch, scaled in proportion."""
    return net.plan_costs(tables, plan, cluster) * (batch_size / net.config.batch_size)
