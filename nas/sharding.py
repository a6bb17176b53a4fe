"""The sharding plan of a trial's embedding tables and its predicted step cost.

With `sharding.devices > 0` in the study config, every trial places its tables with the
configured sharder (`cost_models.sharding.sharders`) and, where `ranknas shard train` saved a cost
model, predicts the embedding step cost of the most loaded device.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from cost_models.sharding.cost_net import load_cost_net
from cost_models.sharding.sharders import make_sharder
from cost_models.sharding.tables import tables_from_architecture
from cost_models.sharding.topology import Topology
from search_space.architecture import Architecture


def plan_trial_sharding(
    arch: Architecture,
    devices: int,
    method: str,
    model_dir: str,
    batch_size: int,
    pooling_factors: dict[str, float] | None = None,
) -> dict[str, Any]:
    """`pooling_factors`: a multi-valued feature's mean ids per row (1 for the others)."""
    tables = tables_from_architecture(arch, pooling_factors)
    topology = Topology(devices)
    plan = make_sharder(method, model_dir, batch_size).plan(tables, topology)
    record: dict[str, Any] = plan.to_dict()
    record["pooling_factors"] = {t.name: t.pooling_factor for t in tables if t.pooling_factor != 1}
    if (Path(model_dir) / "cost_net.json").exists():
        predicted = load_cost_net(model_dir).plan_costs(tables, plan, topology)
        record["predicted_step_ms"] = float(predicted.sum(1).max())
    return record
