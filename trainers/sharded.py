"""Training sharded, as production trains: `training.processes: N` in a study.

`train_sharded` (in the study's process) writes a job directory (the architecture, the
train config, the plan, the rows), starts `torchrun --nproc_per_node N -m trainers.sharded
JOB` and reads back the result and the gathered weights (`train_sharded_in_turn`: several
jobs, one after the other, on one launch). Each rank builds the same model
from the seed, shards its tables by the plan with torchrec's `DistributedModelParallel`
(`trainers.distributed.shard`: gloo on CPU, nccl on GPU) and runs `trainer.train`, the one
training loop, with `Sharded` doing what differs: every rank takes the same global batch
and trains on its slice of the rows; an evaluation runs each rank's slice and gathers the
logits, so every rank sees the same metrics and stops at the same step; snapshots keep
each rank's own shards. Each rank times its steps; the result records the slowest rank's
median (`step_ms`) and every rank's (`device_step_ms`).
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import math
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.distributed as dist
from safetensors.torch import load_file, save_file
from torch import nn
from torchrec.optim.optimizers import in_backward_optimizer_filter
from torchrec.sparse.jagged_tensor import KeyedJaggedTensor

from cost_models.sharding.plan import Plan
from cost_models.sharding.topology import Topology
from cost_models.sharding.torchrun import process_group, torchrun
from search_space.architecture import Architecture
from search_space.builder import RankingModel, build_model
from search_space.errors import RanknasError
from search_space.schema import DatasetSchema
from trainers.config import TrainConfig
from trainers.data.dataset import Batch, TabularData
from trainers.metrics import ranking_metrics
from trainers.processes import gone_from_here, process_identity
from trainers.steps import EagerStep
from trainers.trainer import Parallel, TrainResult, rank_threads, train

EVAL_BATCH = 8192
TIMED_AFTER = 3  # steps left out of the step time (warm-up)
SPLITS = ("train", "valid", "test")
JOB_FOLDER = "ranknas-sharded-"  # then the process's identity, then tempfile's suffix
# the models whose sharded steps measure the runtime's own cost: logistic regression, whose
# layers and lookups are a small share of its step, the same with a wide MLP on top, whose
# dense part is most of it, and the same with wide embeddings, whose pooled vectors are
# (bench/bench_step_prediction.py). The first two at dim 1: at dim 16 a study's
# predictions erred as much (BENCHMARKS.md)
RUNTIME_PROBE = "logistic_regression"
PROBE_MLP = [512, 512]
PROBE_WIDE_DIM = 64


@dataclasses.dataclass(frozen=True)
class ShardedJob:
    """One sharded training run: `arch` on `plan.num_devices` processes."""

    arch: Architecture
    splits: tuple[TabularData, TabularData, TabularData]
    config: TrainConfig
    plan: Plan
    label: str = "training"


def train_sharded(
    arch: Architecture,
    splits: tuple[TabularData, TabularData, TabularData],
    config: TrainConfig,
    plan: Plan,
    label: str = "training",
) -> tuple[TrainResult, RankingModel]:
    """Train `arch` on `plan.num_devices` processes; the model comes back whole."""
    return train_sharded_in_turn([ShardedJob(arch, splits, config, plan, label)])[0]


def train_sharded_in_turn(jobs: list[ShardedJob]) -> list[tuple[TrainResult, RankingModel]]:
    """Train `jobs` one after the other on one torchrun launch (its processes start and
    import torch and torchrec once: most of a short run's time on CPU); each model comes
    back whole. Every job must take the same number of processes."""
    devices = {job.plan.num_devices for job in jobs}
    if len(devices) != 1:
        raise ValueError(f"jobs launched together take one number of processes, not {devices}")
    models = [build_model(job.arch, seed=job.config.seed) for job in jobs]
    if any(f.multi_valued for job in jobs for f in job.splits[0].schema.categorical):
        return [(_failed("multi-valued features do not train sharded yet"), m) for m in models]
    with _job_folder() as tmp:
        folders = [Path(tmp) / str(i) for i in range(len(jobs))]
        for folder, job in zip(folders, jobs, strict=True):
            folder.mkdir()
            _write_job(folder, job)
        processes = devices.pop()
        run = torchrun(processes, "trainers.sharded", [str(f) for f in folders],
                       rank_threads(processes))  # fmt: skip
        done = [(f / "result.json").exists() for f in folders]
        first = done.index(False) if False in done else len(jobs)  # the job that failed
        lost = f"not trained: job {first + 1} of {len(jobs)} on its launch failed first"
        whys = [f"sharded training failed: {_why(run)}" if i == first else lost
                for i in range(len(jobs))]  # fmt: skip
        return [_read_result(*job) for job in zip(folders, jobs, models, whys, strict=True)]


def _job_folder() -> tempfile.TemporaryDirectory:
    """A launch's job folder (its rows and weights), named by this process. Folders that
    processes of this machine killed before their clean-up (`kill -9`) left are removed
    first."""
    for folder in Path(tempfile.gettempdir()).glob(f"{JOB_FOLDER}*"):
        owner = folder.name.removeprefix(JOB_FOLDER).rsplit("-", 1)[0]
        with contextlib.suppress(OSError):  # another run on this machine removed it first
            if gone_from_here(owner) and folder.stat().st_uid == os.getuid():
                shutil.rmtree(folder, ignore_errors=True)
    return tempfile.TemporaryDirectory(prefix=f"{JOB_FOLDER}{process_identity() or 'unknown'}-")


def _read_result(
    folder: Path, job: ShardedJob, model: RankingModel, why: str
) -> tuple[TrainResult, RankingModel]:
    """A job's result, `why` where it has none: rank 0 writes it once every rank has
    trained the job, so a launch that died in a later job keeps the earlier ones."""
    if not (folder / "result.json").exists():
        return _failed(why), model
    fields = json.loads((folder / "result.json").read_text())
    fields["curves"] = {k: [tuple(p) for p in v] for k, v in fields["curves"].items()}
    result = TrainResult(**fields | {"plan": job.plan.to_dict()})
    if (folder / "weights.safetensors").exists():
        model.load_state_dict(load_file(folder / "weights.safetensors"))
    return result, model


def measure_runtime_ms(
    cluster: Topology, batch_per_device: int = 512, steps: int = 40
) -> dict[str, Any]:
    """What the parts of a predicted step leave out of a sharded one: the runtime's fixed
    cost a step (the input distribution of the ids, awaitables, DDP's hooks: `runtime_ms`),
    the dense part's slowdown beside it (`dense_factor`; on a shared CPU, gloo's threads
    take cores from the layers) and the cost of each MB of pooled embeddings a device takes
    (`ms_per_pooled_mb`: their copies and regrouping, beyond the all-to-all's bytes). Three
    probe models are trained as a study's sharded trial trains, on `cluster.num_devices`
    local processes with `batch_per_device` rows each, twice each in mirrored order: their
    mean measured steps less their predicted parts (on `cluster`, its measured links) fit
    `runtime_ms + (dense_factor - 1) x dense part + ms_per_pooled_mb x pooled MB`."""
    splits = timing_splits(steps, cluster.num_devices * batch_per_device)
    archs = probe_architectures(splits[0].schema)
    order = (0, 1, 2, 2, 1, 0)  # mirrored: the machine's drift weighs on each probe alike
    guessed = [_predicted(archs[i], cluster, batch_per_device) for i in order]
    predicted, plans = [g[0] for g in guessed], [g[1] for g in guessed]
    measured = time_sharded_steps([archs[i] for i in order], splits, plans, batch_per_device, steps)
    timed: dict[int, list[dict]] = {}
    for i, guess, result in zip(order, predicted, measured, strict=True):
        left_out = result.step_ms - guess["predicted_step_ms"]
        timed.setdefault(i, []).append(
            guess | {"measured_step_ms": result.step_ms, "left_out_ms": left_out}
        )
    probes = [_mean(timed[i]) for i in range(len(archs))]
    small, large, wide = probes
    slowdown = max(0.0, (large["left_out_ms"] - small["left_out_ms"])
                   / max(large["dense_alone_ms"] - small["dense_alone_ms"], 1e-6))  # fmt: skip
    beyond = wide["left_out_ms"] - small["left_out_ms"] - slowdown * (
        wide["dense_alone_ms"] - small["dense_alone_ms"])  # fmt: skip
    per_mb = max(0.0, beyond / max(wide["pooled_mb"] - small["pooled_mb"], 1e-6))
    runtime = small["left_out_ms"] - slowdown * small["dense_alone_ms"]
    return {"runtime_ms": max(0.0, runtime - per_mb * small["pooled_mb"]),
            "dense_factor": 1.0 + slowdown, "ms_per_pooled_mb": per_mb,
            "runtime_batch_per_device": batch_per_device, "probes": probes}  # fmt: skip


def _mean(runs: list[dict]) -> dict:
    """A probe's timings, averaged over its runs."""
    return runs[0] | {k: statistics.mean(r[k] for r in runs) for k, v in runs[0].items()
                      if isinstance(v, float)} | {"runs": len(runs)}  # fmt: skip


def probe_architectures(schema: DatasetSchema) -> list[Architecture]:
    """The three probes of `measure_runtime_ms`: logistic regression (dim 1), with a wide
    MLP on top, and at `PROBE_WIDE_DIM`."""
    from search_space.presets import load_architecture

    small = load_architecture(RUNTIME_PROBE, schema)
    spec = small.to_dict()
    mlp = spec | {"name": f"{RUNTIME_PROBE}+mlp", "output": "mlp", "blocks": [
        *spec["blocks"], {"name": "mlp", "op": "mlp", "inputs": ["features"],
                          "params": {"widths": PROBE_MLP}}]}  # fmt: skip
    wide = spec | {"name": f"{RUNTIME_PROBE}@{PROBE_WIDE_DIM}",
                   "embedding": spec["embedding"] | {"dim": PROBE_WIDE_DIM}}  # fmt: skip
    return [small, *(Architecture.from_dict(s).bind(schema) for s in (mlp, wide))]


def _predicted(arch: Architecture, cluster: Topology, batch_per_device: int) -> tuple[dict, Plan]:
    """A probe's dense part timed alone and its step predicted on `cluster`, and the plan
    the prediction is for."""
    from cost_models.latency.model import measure_dense_step_ms
    from cost_models.sharding.cost_net import PACKAGED_MODEL
    from cost_models.sharding.step import pooled_mb, predict_step
    from cost_models.sharding.tables import tables_from_architecture
    from search_space.architecture import analyze
    from trainers.trainer import resolve_device

    dense_ms = measure_dense_step_ms(arch, batch_per_device, resolve_device("auto"), threads=1)
    predicted = predict_step(arch, cluster, "size_greedy", str(PACKAGED_MODEL),
                             batch_per_device, dense_ms, analyze(arch).dense_params)  # fmt: skip
    probe = {"probe": arch.name, "predicted_step_ms": predicted["step_ms"],
             "dense_alone_ms": dense_ms,
             "pooled_mb": pooled_mb(tables_from_architecture(arch), batch_per_device)}  # fmt: skip
    return probe, Plan.from_dict(predicted["plan"])


def timing_splits(steps: int, batch_size: int) -> tuple[TabularData, TabularData, TabularData]:
    """Synthetic rows (its default schema) whose training split is `steps` full batches."""
    from trainers.data.synthetic import SyntheticConfig, generate_synthetic

    rows = steps * batch_size * 10 // 8 + 10  # the training split is 0.8 of them
    return generate_synthetic(SyntheticConfig(rows=rows, seed=0)).split((0.8, 0.1, 0.1), seed=0)


def time_sharded_step(
    arch: Architecture, splits: tuple, plan: Plan, batch_per_device: int, steps: int
) -> TrainResult:
    """`steps` steps of `arch` trained as a study's sharded trial trains it (the default
    recipe), `batch_per_device` rows a step on each of `plan`'s devices: the result's
    `step_ms` is the slowest rank's median."""
    return time_sharded_steps([arch], splits, [plan], batch_per_device, steps)[0]


def time_sharded_steps(
    archs: list[Architecture], splits: tuple, plans: list[Plan], batch_per_device: int, steps: int
) -> list[TrainResult]:
    """`time_sharded_step` of each architecture with its plan, in turn on one launch."""
    from trainers.trainer import resolve_device

    batch_size = plans[0].num_devices * batch_per_device
    config = TrainConfig(batch_size=batch_size, max_steps=steps, evals=1,
                         early_stopping_patience=0, device=resolve_device("auto").type)  # fmt: skip
    jobs = [ShardedJob(a, splits, config, p, "timed") for a, p in zip(archs, plans, strict=True)]
    results = [result for result, _ in train_sharded_in_turn(jobs)]
    for arch, result in zip(archs, results, strict=True):
        if not result.step_ms:  # a run that diverged in these few steps was timed all the same
            why = result.failure_reason
            raise RanknasError(f"{arch.name}: the timed sharded run failed: {why}")
    return results


def _why(run: subprocess.CompletedProcess) -> str:
    """A failed torchrun's cause: its ranks' own last error, not torchrun's summary of it
    ("ChildFailedError:", whose text is a table of the ranks); for a rank killed by a
    signal, the signal and what the C++ runtime said before it."""
    lines = [line.strip() for line in run.stderr.splitlines()]
    errors = [line for line in lines if "Error" in line and "ChildFailedError" not in line]
    if errors:
        return errors[-1]
    signals = [line.split(":", 1)[1].strip() for line in lines
               if line.startswith("traceback") and "Signal" in line]  # fmt: skip
    said = [line for line in lines if line.startswith("terminate called")]
    if signals:  # torchrun's table ends with the root cause
        return "; ".join(["a rank died: " + signals[-1], *said[-1:]])
    return f"torchrun exited {run.returncode}"


def _failed(reason: str) -> TrainResult:
    return TrainResult(status="failed", failure_reason=reason)


def _write_job(folder: Path, job: ShardedJob) -> None:
    (folder / "architecture.json").write_text(job.arch.to_json())
    (folder / "plan.json").write_text(json.dumps(job.plan.to_dict()))
    job_config = {"train": dataclasses.asdict(job.config), "label": job.label,
                  "schema": job.splits[0].schema.to_dict()}  # fmt: skip
    (folder / "job.json").write_text(json.dumps(job_config))
    arrays = {}
    for name, rows in zip(SPLITS, job.splits, strict=True):
        arrays |= {f"{name}_dense": rows.dense, f"{name}_ids": rows.categorical,
                   f"{name}_labels": rows.labels}  # fmt: skip
    np.savez(folder / "rows.npz", **arrays)


# ---------------------------------------------------------------------- one rank


class Sharded(Parallel):
    """One rank's share of the step and of the evaluations (see the module doc)."""

    def __init__(self, features: list[str], device: torch.device) -> None:
        self.features, self.device = features, device
        self.rank, self.world = dist.get_rank(), dist.get_world_size()
        self.step_ms: list[float] = []

    def optimizers(self, model: nn.Module, config: TrainConfig) -> list[torch.optim.Optimizer]:
        """The dense parameters' Adam/AdamW; the tables update in the backward pass."""
        dense = [p for _, p in in_backward_optimizer_filter(model.named_parameters())]
        cls = torch.optim.AdamW if config.dense_optimizer == "adamw" else torch.optim.Adam
        return [cls(dense, lr=config.dense_lr, weight_decay=config.weight_decay)]

    def step(self, model: nn.Module, optimizers: list):
        eager = EagerStep(model, optimizers, bf16=False)

        def take(batch: Batch) -> torch.Tensor:
            local = self._local(batch, batch.labels.shape[0] // self.world)
            started = time.perf_counter()
            mean = eager(local).clone()
            self.step_ms.append(1e3 * (time.perf_counter() - started))
            dist.all_reduce(mean)  # every rank sees the same loss, and stops with the others
            return mean / self.world

        return take

    def _local(self, batch: Batch, local: int, rows: torch.Tensor | None = None) -> Batch:
        """This rank's `local` rows of a global batch (of `rows` of it, if given)."""
        dense, sparse, labels = batch
        mine = torch.arange(self.rank * local, (self.rank + 1) * local)
        if rows is not None:
            mine = rows[mine]
        ids = sparse.values().view(len(self.features), -1)[:, mine].reshape(-1)
        kjt = KeyedJaggedTensor.from_lengths_sync(
            keys=self.features, values=ids, lengths=torch.ones(ids.numel(), dtype=torch.int32)
        )
        return Batch(dense[mine].to(self.device), kjt.to(self.device), labels[mine].to(self.device))

    @torch.no_grad()
    def evaluate(self, model: nn.Module, data, rows: int | None = None) -> dict:
        subset = data if rows is None or rows >= len(data) else data.head(rows)
        model.eval()
        probabilities, labels = [], []
        for batch in subset.loader(EVAL_BATCH):
            n = batch.labels.shape[0]
            local = math.ceil(n / self.world)
            padded = torch.arange(local * self.world).clamp(max=n - 1)  # equal slices
            dense, sparse, _ = self._local(batch, local, padded)
            logits = model(dense, sparse).float()
            gathered = [torch.empty_like(logits) for _ in range(self.world)]
            dist.all_gather(gathered, logits)
            probabilities.append(torch.sigmoid(torch.cat(gathered)[:n]).cpu())
            labels.append(batch.labels)
        model.train()
        return ranking_metrics(torch.cat(probabilities).numpy(), torch.cat(labels).numpy())

    def snapshot(self, model: nn.Module) -> dict[str, Any]:
        """This rank's shards and the dense weights, copied (no communication)."""
        return {k: [s.tensor.clone() for s in v.local_shards()] if _sharded(v) else v.clone()
                for k, v in model.state_dict().items()}  # fmt: skip

    def restore(self, model: nn.Module, state: dict[str, Any]) -> None:
        with torch.no_grad():
            for key, value in model.state_dict().items():
                if _sharded(value):
                    for shard, saved in zip(value.local_shards(), state[key], strict=True):
                        shard.tensor.copy_(saved)
                else:
                    value.copy_(state[key])


def _sharded(value: Any) -> bool:
    return hasattr(value, "local_shards")


def gather_state(model: nn.Module) -> dict[str, torch.Tensor] | None:
    """The whole state dict on rank 0 (None elsewhere): each table's shards put together
    from every rank (every rank must call it)."""
    rank, world = dist.get_rank(), dist.get_world_size()
    state = {}
    for key, value in model.state_dict().items():
        if not _sharded(value):
            state[key] = value.detach().cpu().clone()
            continue
        mine = [(s.metadata.shard_offsets, s.tensor.detach().cpu()) for s in value.local_shards()]
        parts: list = [None] * world
        dist.all_gather_object(parts, mine)
        if rank == 0:
            whole = torch.empty(tuple(value.size()), dtype=mine[0][1].dtype if mine else None)
            for part in parts:
                for (row, col), tensor in part:
                    whole[row : row + tensor.shape[0], col : col + tensor.shape[1]] = tensor
            state[key] = whole
    return state if rank == 0 else None


def run_rank(job: Path) -> None:
    from cost_models.sharding.torchrec_adapter import to_sharding_plan
    from trainers.distributed import EMBEDDINGS, shard
    from trainers.trainer import _start_at_base_rate, resolve_device

    spec = json.loads((job / "job.json").read_text())
    config = TrainConfig(**spec["train"])
    schema = DatasetSchema.from_dict(spec["schema"])
    arrays = np.load(job / "rows.npz")
    splits = [TabularData(arrays[f"{n}_dense"], arrays[f"{n}_ids"], arrays[f"{n}_labels"], schema)
              for n in SPLITS]  # fmt: skip
    cuda = resolve_device(config.device).type == "cuda"
    device = torch.device(f"cuda:{dist.get_rank() % torch.cuda.device_count()}" if cuda else "cpu")
    arch = Architecture.from_json((job / "architecture.json").read_text())
    model = build_model(arch, seed=config.seed)
    if config.start_at_base_rate:
        _start_at_base_rate(model, splits[0].label_mean)
    plan = Plan.from_dict(json.loads((job / "plan.json").read_text()))
    sharding = to_sharding_plan(
        plan, getattr(model, EMBEDDINGS), EMBEDDINGS, device.type, compute_kernel="fused"
    )  # the sparse optimizer in backward
    dmp = shard(model, sharding, device, config.sparse_lr, config.sparse_optimizer)
    parallel = Sharded(schema.feature_names, device)
    run_config = dataclasses.replace(config, start_at_base_rate=False, device=device.type)
    result = train(dmp, *splits, run_config, label=spec["label"], parallel=parallel)
    timed = parallel.step_ms[TIMED_AFTER:] or parallel.step_ms or [0.0]
    per_rank: list = [None] * dist.get_world_size()
    dist.all_gather_object(per_rank, statistics.median(timed))
    result.step_ms, result.device_step_ms = max(per_rank), per_rank
    state = gather_state(dmp)
    if dist.get_rank() == 0:
        if state is not None and result.status != "failed":
            save_file(state, str(job / "weights.safetensors"))
        # whole or absent: the next job's failure may kill this rank mid-write
        (job / "result.part").write_text(json.dumps(dataclasses.asdict(result)))
        os.replace(job / "result.part", job / "result.json")


def main() -> None:
    with process_group():
        for job in sys.argv[1:]:  # in turn, the same processes
            run_rank(Path(job))


if __name__ == "__main__" and "RANK" in os.environ:
    main()
