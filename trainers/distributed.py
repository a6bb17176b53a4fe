"""Multi-process training with torchrec's DistributedModelParallel and a given sharding plan.

Run under torchrun (gloo on CPU, nccl on GPU):

    torchrun --nproc_per_node 2 -m trainers.distributed --arch dlrm --steps 50 --out run.json

Every rank builds the same model from the same seed; `DistributedModelParallel` shards the
embedding tables table-wise by the plan (one fused kernel per rank with row-wise Adagrad
applied in the backward pass) and replicates the dense part (DDP). Each rank trains on its
slice of every global batch, so one process with the whole batch takes the same steps: the
test compares the two.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
from pathlib import Path

import torch
import torch.distributed as dist
import torch.nn.functional as F
from fbgemm_gpu.split_embedding_configs import EmbOptimType
from torchrec.distributed.embeddingbag import EmbeddingBagCollectionSharder
from torchrec.distributed.model_parallel import DistributedModelParallel
from torchrec.distributed.sharding_plan import construct_module_sharding_plan, table_wise
from torchrec.distributed.types import ShardingEnv, ShardingPlan
from torchrec.optim.keyed import KeyedOptimizerWrapper
from torchrec.optim.optimizers import in_backward_optimizer_filter

from search_space.builder import RankingModel, build_model
from search_space.presets import PRESETS, preset
from trainers.data.synthetic import SyntheticConfig, generate_synthetic

EMBEDDINGS = "embedding_bags"  # the EmbeddingBagCollection's attribute in RankingModel


def table_wise_plan(
    model: RankingModel, ranks: dict[str, int], world_size: int, device_type: str
) -> ShardingPlan:
    """A torchrec plan placing each feature's table whole on the given rank."""
    per_table = {f"t_{feature}": table_wise(rank=rank) for feature, rank in ranks.items()}
    module_plan = construct_module_sharding_plan(
        getattr(model, EMBEDDINGS),
        per_param_sharding=per_table,
        local_size=world_size,
        world_size=world_size,
        device_type=device_type,
    )
    return ShardingPlan({EMBEDDINGS: module_plan})


def shard(
    model: RankingModel, plan: ShardingPlan, device: torch.device, sparse_lr: float
) -> DistributedModelParallel:
    sharder = EmbeddingBagCollectionSharder(
        fused_params={"optimizer": EmbOptimType.EXACT_ROWWISE_ADAGRAD, "learning_rate": sparse_lr}
    )
    reference = {k: v.detach().clone() for k, v in model.state_dict().items()}
    dmp = DistributedModelParallel(
        module=model,
        env=ShardingEnv.from_process_group(dist.group.WORLD),
        device=device,
        plan=plan,
        sharders=[sharder],
    )
    _copy_table_weights(dmp, reference)
    return dmp


def _copy_table_weights(dmp: DistributedModelParallel, reference: dict[str, torch.Tensor]) -> None:
    """Give the sharded tables the weights of the unsharded model (the sharded kernel
    initializes its own), so that any world size starts from the same point."""
    with torch.no_grad():
        for key, value in dmp.state_dict().items():
            if not hasattr(value, "local_shards") or key not in reference:
                continue
            for local in value.local_shards():
                rows, cols = local.metadata.shard_offsets
                height, width = local.metadata.shard_sizes
                local.tensor.copy_(reference[key][rows : rows + height, cols : cols + width])


def train_distributed(args: argparse.Namespace) -> dict:
    rank, world = dist.get_rank(), dist.get_world_size()
    device = torch.device(f"cuda:{rank % torch.cuda.device_count()}" if args.cuda else "cpu")
    data = generate_synthetic(SyntheticConfig(rows=args.rows, seed=args.seed))
    model = build_model(preset(args.arch, data.schema), seed=args.seed)
    features = data.schema.feature_names
    ranks = json.loads(args.plan) if args.plan else {f: i % world for i, f in enumerate(features)}
    dmp = shard(model, table_wise_plan(model, ranks, world, device.type), device, args.sparse_lr)
    dense_optimizer = KeyedOptimizerWrapper(
        dict(in_backward_optimizer_filter(dmp.named_parameters())),
        lambda params: torch.optim.Adam(params, lr=args.dense_lr),
    )
    local = args.batch_size // world
    losses = []
    batches = iter(data.loader(args.batch_size))
    for _ in range(args.steps):
        dense, sparse, labels = next(batches)
        rows = slice(rank * local, (rank + 1) * local)  # this rank's slice of the global batch
        ids = sparse.values().view(len(features), -1)[:, rows].reshape(-1)
        local_sparse = type(sparse).from_lengths_sync(
            keys=features, values=ids, lengths=torch.ones(ids.numel(), dtype=torch.int32)
        )
        logits = dmp(dense[rows].to(device), local_sparse.to(device))
        loss = F.binary_cross_entropy_with_logits(logits, labels[rows].to(device))
        dense_optimizer.zero_grad()
        loss.backward()
        dense_optimizer.step()
        global_loss = loss.detach().clone()
        dist.all_reduce(global_loss)
        losses.append(global_loss.item() / world)
    return {"world_size": world, "plan": ranks, "losses": losses}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--arch", default="dlrm", choices=list(PRESETS))
    parser.add_argument("--rows", type=int, default=20_000)
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--batch-size", type=int, default=256, help="global batch size")
    parser.add_argument("--dense-lr", type=float, default=1e-3)
    parser.add_argument("--sparse-lr", type=float, default=0.05)
    parser.add_argument("--plan", help='JSON {"feature": rank}; default: round robin')
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--cuda", action="store_true", help="nccl on GPUs instead of gloo")
    parser.add_argument("--out", type=Path, help="rank 0 writes the losses here as JSON")
    args = parser.parse_args()
    dist.init_process_group("nccl" if args.cuda else "gloo")
    try:
        result = train_distributed(args)
        # Free the sharded model (and its communication threads) while the group is alive:
        # left to interpreter exit, a joinable thread can abort the process.
        gc.collect()
        dist.barrier()
        if dist.get_rank() == 0 and args.out:
            args.out.write_text(json.dumps(result))
    finally:
        dist.destroy_process_group()


if __name__ == "__main__" and "RANK" in os.environ:
    main()
