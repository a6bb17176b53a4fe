"""Check that a plan (whole tables and column shards) runs under torchrec's DMP.

    python -m torch.distributed.run --nproc_per_node 2 -m cost_models.sharding.dmp_check \\
        --tables tables.json --plan plan.json

Every process builds the tables' EmbeddingBagCollection on the meta device, shards it
with the plan (gloo on CPU), runs forward and backward on a random KeyedJaggedTensor and
prints one line; the exit code is 0 when all of that worked.
"""

from __future__ import annotations

import argparse
import json
import logging
from collections.abc import Sequence

import torch
import torch.distributed as dist
from torchrec.distributed.embeddingbag import EmbeddingBagCollectionSharder
from torchrec.distributed.model_parallel import DistributedModelParallel
from torchrec.distributed.types import ShardingEnv
from torchrec.sparse.jagged_tensor import KeyedJaggedTensor

from cost_models.sharding.plan import Plan
from cost_models.sharding.tables import TableSpec, load_tables
from cost_models.sharding.torchrec_adapter import build_ebc, to_sharding_plan
from cost_models.sharding.torchrun import process_group
from search_space.errors import RanknasError


def random_batch(tables: Sequence[TableSpec], batch_size: int, seed: int) -> KeyedJaggedTensor:
    """One to three ids per example and table, drawn uniformly from each table's rows."""
    generator = torch.Generator().manual_seed(seed)
    lengths = torch.randint(1, 4, (len(tables) * batch_size,), generator=generator)
    values = []
    for i, t in enumerate(tables):
        count = int(lengths[i * batch_size : (i + 1) * batch_size].sum())
        values.append(torch.randint(0, t.num_embeddings, (count,), generator=generator))
    return KeyedJaggedTensor(
        keys=[t.name for t in tables], values=torch.cat(values), lengths=lengths
    )


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--tables", required=True, help="table file (YAML or JSON)")
    parser.add_argument("--plan", required=True, help="plan JSON, as `ranknas shard plan --json`")
    parser.add_argument("--batch-size", type=int, default=8, help="examples per process")
    args = parser.parse_args(argv)
    logging.getLogger("torch.fx._symbolic_trace").setLevel(logging.ERROR)
    tables = load_tables(args.tables)
    with open(args.plan) as f:
        plan = Plan.from_dict(json.load(f))
    with process_group("gloo"):
        if plan.num_devices != dist.get_world_size():
            raise RanknasError(f"{args.plan}: the plan is for {plan.num_devices} devices, "
                               f"not {dist.get_world_size()}")  # fmt: skip
        check(tables, plan, args.batch_size)  # then the rank exits 0 (`process_group`)


def check(tables: Sequence[TableSpec], plan: Plan, batch_size: int) -> None:
    """This rank's forward and backward through the plan's DMP, and its line."""
    rank, world = dist.get_rank(), dist.get_world_size()
    ebc = build_ebc(tables)
    model = DistributedModelParallel(
        ebc,
        env=ShardingEnv.from_process_group(dist.group.WORLD),
        plan=to_sharding_plan(plan, ebc),
        sharders=[EmbeddingBagCollectionSharder()],
        device=torch.device("cpu"),
    )
    pooled = model(random_batch(tables, batch_size, seed=rank)).values()
    pooled.sum().backward()
    local = sorted(name for name, r in plan.assignment.items() if r == rank)
    print(f"rank {rank}/{world}: ok, output {tuple(pooled.shape)}, tables {local}", flush=True)


if __name__ == "__main__":
    main()
