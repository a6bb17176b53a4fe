"""Multi-process training with torchrec's DistributedModelParallel and a given sharding plan.

Run under torchrun (gloo on CPU, nccl on GPU):

    torchrun --nproc_per_node 2 -m trainers.distributed --arch dlrm --steps 50 --out run.json
    ranknas shard plan tables.json --devices 2 --json > plan.json   # tables: t_<feature>
    torchrun --nproc_per_node 2 -m trainers.distributed --plan plan.json ...

Each rank times its steps (forward, backward, both optimizers; the median after
`WARMUP_STEPS`): `step_ms` is the slowest rank's, as a synchronous step waits for it.

Every rank builds the same model from the same seed; `DistributedModelParallel` shards the
embedding tables by the plan, table-wise and column-wise (one fused kernel per rank with
row-wise Adagrad applied in the backward pass) and replicates the dense part (DDP). Each
rank trains on its slice of every global batch, so one process with the whole batch takes
the same steps: the test compares the two.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path

import torch
import torch.distributed as dist
import torch.nn.functional as F
from fbgemm_gpu.split_embedding_configs import EmbOptimType
from torchrec.distributed.embeddingbag import EmbeddingBagCollectionSharder
from torchrec.distributed.model_parallel import DistributedModelParallel
from torchrec.distributed.types import ShardingEnv, ShardingPlan
from torchrec.optim.keyed import KeyedOptimizerWrapper
from torchrec.optim.optimizers import in_backward_optimizer_filter
from torchrec.sparse.jagged_tensor import KeyedJaggedTensor

from cost_models.sharding.plan import Plan, make_plan
from cost_models.sharding.sharders.base import counted
from cost_models.sharding.tables import TableSpec, tables_from_architecture
from cost_models.sharding.torchrec_adapter import to_sharding_plan
from cost_models.sharding.torchrun import process_group
from search_space.architecture import Architecture
from search_space.arguments import positive, seed
from search_space.builder import RankingModel, build_model
from search_space.errors import RanknasError
from search_space.presets import PRESETS, preset
from trainers.data.synthetic import SyntheticConfig, generate_synthetic

WARMUP_STEPS = 3  # left out of the step time
EMBEDDINGS = "embedding_bags"  # the EmbeddingBagCollection's attribute in RankingModel
SPARSE_OPTIMIZERS = {
    "adagrad": EmbOptimType.EXACT_ADAGRAD,
    "rowwise_adagrad": EmbOptimType.EXACT_ROWWISE_ADAGRAD,
    "sgd": EmbOptimType.EXACT_SGD,
}


MAKE_A_PLAN = "make one with `ranknas shard plan TABLES --devices N --json > plan.json`"


def read_plan(path: Path) -> Plan:
    """A plan file as `ranknas shard plan --json` writes it."""
    try:
        return Plan.from_dict(json.loads(path.read_text()))
    except OSError as exc:
        raise RanknasError(f"--plan {path}: {exc.strerror.lower()}; {MAKE_A_PLAN}") from None
    except (ValueError, KeyError, TypeError) as exc:  # not JSON, or JSON of something else
        raise RanknasError(f"--plan {path}: not a sharding plan ({type(exc).__name__}: {exc}); "
                           f"{MAKE_A_PLAN}") from None  # fmt: skip


def load_plan(path: Path | None, tables: list[TableSpec], world_size: int) -> Plan:
    """The plan in `path` (`read_plan`), for these tables on `world_size` ranks; round robin
    table-wise if None."""
    if path is None:
        assignment = {t.name: i % world_size for i, t in enumerate(tables)}
        return make_plan(assignment, tables, world_size, "round_robin")
    plan = read_plan(path)
    names, planned = {t.name for t in tables}, set(plan.table_ranks())
    if plan.num_devices != world_size:  # the table lists said nothing (printed twice)
        raise RanknasError(f"{path}: the plan is for {counted(plan.num_devices, 'device')} and "
                           f"this run has {counted(world_size, 'process')}: plan again with "
                           f"--devices {world_size}, or run {plan.num_devices} (torchrun "
                           "--nproc_per_node)")  # fmt: skip
    if names != planned:
        missing, extra = sorted(names - planned), sorted(planned - names)
        raise RanknasError(f"{path}: the plan is for other tables than this model's (not "
                           f"planned: {missing[:5]}; not the model's: {extra[:5]}); plan this "
                           "model's tables: `ranknas shard plan ARCH --schema SCHEMA "
                           "--devices N --json`")  # fmt: skip
    return plan


def shard(
    model: RankingModel,
    plan: ShardingPlan,
    device: torch.device,
    sparse_lr: float,
    sparse_optimizer: str = "rowwise_adagrad",
) -> DistributedModelParallel:
    """Row-wise Adagrad keeps one accumulator per row *of each shard*, so column shards
    update differently from the whole table; plain SGD does not depend on the plan."""
    optimizer = SPARSE_OPTIMIZERS[sparse_optimizer]
    sharder = EmbeddingBagCollectionSharder(
        fused_params={"optimizer": optimizer, "learning_rate": sparse_lr}
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


def one_hot_ids(sparse: KeyedJaggedTensor, num_features: int) -> torch.Tensor:
    """The batch's ids as `[F, B]`; this script slices batches per rank assuming one id per
    example and feature, so a multi-valued (multi-hot) feature is refused, not mis-sliced."""
    if sparse.values().numel() != num_features * sparse.stride():
        raise RanknasError(
            "trainers.distributed slices batches per rank with one id per example and "
            "feature; multi-valued (multi-hot) features are not supported here"
        )
    return sparse.values().view(num_features, -1)


def train_distributed(args: argparse.Namespace) -> dict:
    rank, world = dist.get_rank(), dist.get_world_size()
    device = torch.device(f"cuda:{rank % torch.cuda.device_count()}" if args.cuda else "cpu")
    data = generate_synthetic(SyntheticConfig(rows=args.rows, seed=args.seed))
    arch = preset(args.arch, data.schema)
    if args.arch_file:
        arch = Architecture.load(args.arch_file).bind(data.schema)
    model = build_model(arch, seed=args.seed)
    features = data.schema.feature_names
    plan = load_plan(args.plan, tables_from_architecture(arch), world)
    sharding = to_sharding_plan(
        plan, getattr(model, EMBEDDINGS), EMBEDDINGS, device.type, compute_kernel="fused"
    )  # the sparse optimizer in backward
    dmp = shard(model, sharding, device, args.sparse_lr, args.sparse_optimizer)
    dense_optimizer = KeyedOptimizerWrapper(
        dict(in_backward_optimizer_filter(dmp.named_parameters())),
        lambda params: torch.optim.Adam(params, lr=args.dense_lr),
    )
    local = args.batch_size // world
    losses, step_ms = [], []
    batches = iter(data.loader(args.batch_size, drop_last=True))  # equal slices per rank
    for _ in range(args.steps):
        dense, sparse, labels = next(batches)
        started = time.perf_counter()
        rows = slice(rank * local, (rank + 1) * local)  # this rank's slice of the global batch
        ids = one_hot_ids(sparse, len(features))[:, rows].reshape(-1)
        local_sparse = type(sparse).from_lengths_sync(
            keys=features, values=ids, lengths=torch.ones(ids.numel(), dtype=torch.int32)
        )
        logits = dmp(dense[rows].to(device), local_sparse.to(device))
        loss = F.binary_cross_entropy_with_logits(logits, labels[rows].to(device))
        dense_optimizer.zero_grad()
        loss.backward()
        dense_optimizer.step()
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        step_ms.append(1e3 * (time.perf_counter() - started))
        global_loss = loss.detach().clone()
        dist.all_reduce(global_loss)
        losses.append(global_loss.item() / world)
    timed = step_ms[WARMUP_STEPS:] or step_ms
    rank_ms = [None] * world
    dist.all_gather_object(rank_ms, statistics.median(timed))
    return {"world_size": world, "plan": plan.table_ranks(), "losses": losses,
            "rank_step_ms": rank_ms, "step_ms": max(rank_ms)}  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--arch", default="dlrm", choices=list(PRESETS))
    parser.add_argument("--arch-file", type=Path, help="an architecture JSON (instead of --arch)")
    parser.add_argument("--rows", type=positive(int), default=20_000)
    parser.add_argument("--steps", type=positive(int), default=20)
    parser.add_argument("--batch-size", type=positive(int), default=256, help="global batch size")
    parser.add_argument("--dense-lr", type=float, default=1e-3)
    parser.add_argument("--sparse-lr", type=float, default=0.05)
    parser.add_argument(
        "--sparse-optimizer", choices=list(SPARSE_OPTIMIZERS), default="rowwise_adagrad"
    )
    parser.add_argument(
        "--plan", type=Path, help="plan JSON from `ranknas shard plan --json`; default: round robin"
    )
    parser.add_argument("--seed", type=seed, default=0)
    parser.add_argument("--cuda", action="store_true", help="nccl on GPUs instead of gloo")
    parser.add_argument("--out", type=Path, help="rank 0 writes the losses here as JSON")
    args = parser.parse_args(argv)
    try:
        if args.plan is not None:
            read_plan(args.plan)  # a missing or broken file, said before the process group
        if args.arch_file is not None and not args.arch_file.is_file():
            raise RanknasError(f"--arch-file {args.arch_file}: no such file")
        if args.cuda and not (torch.cuda.is_available() and dist.is_nccl_available()):
            raise RanknasError("--cuda trains on GPUs with nccl: this machine has no CUDA GPU "
                               "(or this torch no nccl); drop --cuda to train on CPUs with "
                               "gloo")  # fmt: skip
        with process_group("nccl" if args.cuda else "gloo"):
            result = train_distributed(args)
            if dist.get_rank() == 0:
                _report(result, args.out)
    except RanknasError as exc:  # every rank says it: torchrun stops the others at the first
        print(f"error: {exc}", file=sys.stderr)
        return 2
    return 0


def _report(result: dict, out: Path | None) -> None:
    if out is not None:
        out.write_text(json.dumps(result))
    losses = result["losses"]
    print(f"{result['world_size']} processes, {len(losses)} steps: loss {losses[0]:.4f} -> "
          f"{losses[-1]:.4f}, step {result['step_ms']:.1f} ms (slowest rank)"
          + (f"; wrote {out}" if out is not None else ""))  # fmt: skip


if __name__ == "__main__":
    if "RANK" not in os.environ and not {"-h", "--help"} & set(sys.argv[1:]):
        # it printed nothing and exited 0: no process group to join outside torchrun
        print("error: run it under torchrun, which starts its processes: torchrun "
              "--nproc_per_node 2 -m trainers.distributed --arch dlrm --steps 50 (--help: "
              "the options)", file=sys.stderr)  # fmt: skip
        sys.exit(2)
    sys.exit(main())
