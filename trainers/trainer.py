"""The training loop that scores an architecture: train within a budget, evaluate, report.

`train` never raises for a failing run: a NaN/inf loss, an exception in a step or running
out of memory ends the run with `status="failed"` and a `failure_reason`, so a study can
record the trial and go on.
"""

from __future__ import annotations

import contextlib
import math
import os
import resource
import statistics
import time
import warnings
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any, Literal

import numpy as np
import torch
from torch import nn

from search_space.errors import RanknasError
from trainers import progress as bars
from trainers.config import TrainConfig, cpu_label
from trainers.data.dataset import Batch, ResidentBatches, TabularData
from trainers.data.stream import Rows
from trainers.fused_tables import FusedTables
from trainers.joint_tables import JointTables
from trainers.metrics import entropy, ranking_metrics
from trainers.steps import EagerStep, GraphStep, set_lr

# Called at each intermediate evaluation with (step, examples seen, validation metrics);
# returning True stops the run as "pruned" (a searcher's pruner decides).
EvalCallback = Callable[[int, int, dict[str, float]], bool]


@dataclass
class TrainResult:
    status: Literal["complete", "pruned", "failed"]
    failure_reason: str | None = None
    validation: dict[str, float] = field(default_factory=dict)
    test: dict[str, float] = field(default_factory=dict)
    curves: dict[str, list[tuple[int, float]]] = field(default_factory=dict)
    steps: int = 0
    examples: int = 0
    train_seconds: float = 0.0
    throughput: float = 0.0  # training examples per second, evaluations excluded
    peak_memory_bytes: int = 0
    device: str = "cpu"
    stopped_early: bool = False
    time_limit: float | None = None  # seconds: the time limit that ended the run, if one did
    # the loss or the predictions went nan/inf: the same seed does so again, unlike a
    # failure of the machine (out of memory)
    non_finite: bool = False
    restored_step: int | None = None  # the evaluation whose weights the run ended with
    # trained sharded (`trainers.sharded`): the slowest rank's median step, and each rank's
    step_ms: float | None = None
    device_step_ms: list[float] | None = None
    plan: dict[str, Any] | None = None  # the plan it trained with (`Plan.to_dict`)

    def summary(self) -> dict[str, Any]:
        """Flat, JSON-ready metrics."""
        out: dict[str, Any] = {"status": self.status, "failure_reason": self.failure_reason}
        out |= {f"val_{k}": v for k, v in self.validation.items()}
        out |= {f"test_{k}": v for k, v in self.test.items()}
        out |= {
            "steps": self.steps,
            "examples": self.examples,
            "train_seconds": round(self.train_seconds, 3),
            "throughput": round(self.throughput, 1),
            "peak_memory_bytes": self.peak_memory_bytes,
            "device": self.device,
            "stopped_early": self.stopped_early,
            "restored_step": self.restored_step,
        }
        if self.step_ms is not None:
            out["measured_step_ms"] = self.step_ms
            out |= {f"rank{i}_step_ms": ms for i, ms in enumerate(self.device_step_ms or [])}
        return out


def resolve_device(name: str) -> torch.device:
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if name.startswith("cuda") and not torch.cuda.is_available():
        raise RanknasError(f"device {name!r} asked for, but CUDA is not available here")
    return torch.device(name)


def rank_threads(processes: int) -> int:
    """Torch threads each of `processes` ranks on this machine takes: the cores, shared."""
    return max(1, torch.get_num_threads() // processes)


def device_label(name: str, processes: int = 1) -> str:
    """Where a run with device setting `name` trains, as a person finds it: the GPU's index
    among all the machine's (through CUDA_VISIBLE_DEVICES) and its name, or the CPU and
    its threads; sharded on `processes` (`trainers.sharded`), theirs."""
    device = resolve_device(name)
    if processes > 1:
        if device.type != "cuda":
            return f"torchrun: {processes} x {cpu_label(rank_threads(processes))}"
        gpus = min(processes, torch.cuda.device_count())  # rank r takes GPU r % count
        return f"torchrun: {processes} processes on {gpus} x {torch.cuda.get_device_name(0)}"
    if device.type != "cuda":
        return cpu_label(torch.get_num_threads())
    index = device.index if device.index is not None else torch.cuda.current_device()
    visible = os.environ.get("CUDA_VISIBLE_DEVICES", "").split(",")
    physical = visible[index].strip() if index < len(visible) and visible[index].strip() else index
    return f"cuda:{physical} ({torch.cuda.get_device_name(index)})"


# On a GPU, embedding tables up to this many weights (1 GiB in fp32) get dense gradients:
# Adagrad and SGD then update the untouched rows by exactly zero, as with sparse gradients,
# and skip coalescing the sparse gradient, which took 75-90% of an H100's step time
# (BENCHMARKS.md, "Trials on a GPU"). Larger tables keep sparse gradients.
DENSE_GRAD_LIMIT = 1 << 28
# Where the tables train as `JointTables` (pure torch; the tests run them on CPU too).
JOINT_TABLE_DEVICES = ("cuda",)


def make_optimizers(
    model: nn.Module, config: TrainConfig, capturable: bool = False
) -> tuple[torch.optim.Optimizer, torch.optim.Optimizer | None]:
    """Adam/AdamW for dense parameters; Adagrad (sparse gradients; dense ones for tables up
    to `DENSE_GRAD_LIMIT` on a GPU), torchrec's row-wise Adagrad or SGD for the embedding
    tables; none for tables that update themselves (`FusedTables`, `JointTables`).
    `capturable`: the dense optimizer keeps its step and learning rate on the model's
    device, as a CUDA graph needs."""
    sparse = [p for n, p in model.named_parameters() if n.startswith("embedding_bags.")]
    dense = [p for n, p in model.named_parameters() if not n.startswith("embedding_bags.")]
    dense_cls = torch.optim.AdamW if config.dense_optimizer == "adamw" else torch.optim.Adam
    lr = config.dense_lr
    if capturable:  # a tensor, so that the schedule reaches a replayed step
        lr = torch.tensor(lr, device=dense[0].device)
    # fused: one kernel for all dense parameters, the same update (7% of a small CPU step)
    dense_opt = dense_cls(dense, lr=lr, weight_decay=config.weight_decay, fused=True,
                          capturable=capturable)  # fmt: skip
    if not sparse or isinstance(getattr(model, "embedding_bags", None), FusedTables | JointTables):
        return dense_opt, None
    if config.sparse_optimizer == "rowwise_adagrad":
        from torchrec.optim import RowWiseAdagrad

        return dense_opt, RowWiseAdagrad(sparse, lr=config.sparse_lr)
    sparse_grads = not (sparse[0].is_cuda and sum(p.numel() for p in sparse) <= DENSE_GRAD_LIMIT)
    for bag in model.embedding_bags.embedding_bags.values():
        bag.sparse = sparse_grads  # gradients only for the rows a batch touches
    # Embedding-bag gradients are well-formed; checking each sparse tensor costs time.
    torch.sparse.check_sparse_tensor_invariants.disable()
    if config.sparse_optimizer == "sgd":
        return dense_opt, torch.optim.SGD(sparse, lr=config.sparse_lr)
    return dense_opt, torch.optim.Adagrad(sparse, lr=config.sparse_lr)


def _to(batch: Batch, device: torch.device) -> Batch:
    if device.type == "cpu":
        return batch
    return Batch(
        batch.dense.to(device, non_blocking=True),
        batch.sparse.to(device, non_blocking=True),
        batch.labels.to(device, non_blocking=True),
    )


def _batches(data: Rows, config: TrainConfig, resident_on: torch.device | None = None):
    """Shuffled training batches, epoch after epoch; drawn on `resident_on` from a copy of
    the data held there, if given."""
    if resident_on is not None:
        loader = ResidentBatches(data, config.batch_size, config.seed, resident_on)
    else:
        loader = data.loader(config.batch_size, shuffle=True, seed=config.seed, drop_last=True)
    if len(loader) == 0:
        raise RanknasError(
            f"the training split has {len(data)} rows, fewer than one batch of "
            f"{config.batch_size}: give more rows, or a smaller batch (training.batch_size in a "
            "study, --batch-size to ranknas train)"
        )
    while True:
        yield from loader


def predict(
    model: nn.Module, data: TabularData, batch_size: int = 8192, device: torch.device | None = None
) -> np.ndarray:
    """Predicted click probabilities for every row of `data`."""
    return _predictions(model, data, batch_size, device)[0]


EVAL_BATCH = 8192
HELD_EVAL_BATCH = 32_768  # rows held on a GPU: fewer, larger forwards (launch-bound)


@torch.no_grad()
def _predictions(
    model: nn.Module,
    data: Rows | ResidentBatches,
    batch_size: int = EVAL_BATCH,
    device: torch.device | None = None,
) -> tuple[np.ndarray, np.ndarray]:
    """Predicted click probabilities and labels, batch by batch (a streamed split too, or
    rows held on the model's device)."""
    device = device or next(model.parameters()).device
    batches = data if isinstance(data, ResidentBatches) else data.loader(batch_size)
    was_training = model.training
    model.eval()
    out, labels = [], []
    for batch in batches:  # held rows are on the device already: `_to` leaves them
        out.append(torch.sigmoid(model(*_to(batch, device)[:2]).float()))
        labels.append(batch.labels)
    model.train(was_training)
    if not out:
        return np.zeros(0, dtype=np.float32), np.zeros(0, dtype=np.float32)
    return torch.cat(out).cpu().numpy(), torch.cat(labels).cpu().numpy()


def evaluate(model: nn.Module, data: Rows, rows: int | None = None) -> dict[str, float]:
    return ranking_metrics(*_predictions(model, _head(data, rows)))


def _head(data: Rows, rows: int | None) -> Rows:
    return data if rows is None or rows >= len(data) else data.head(rows)


def _peak_memory(device: torch.device) -> int:
    if device.type == "cuda":
        return int(torch.cuda.max_memory_allocated(device))
    return int(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss) * 1024  # process peak RSS


def train(
    model: nn.Module,
    train_data: Rows,
    valid_data: Rows,
    test_data: Rows | None = None,
    config: TrainConfig | None = None,
    on_eval: EvalCallback | None = None,
    label: str = "training",
    parallel: Parallel | None = None,
) -> TrainResult:
    """Train `model` on `train_data` within the budget; evaluate on validation and test.
    `label` names the run on its progress bar. `parallel`: the model is one rank's share of
    a sharded model (`trainers.sharded`), whose optimizers, step, evaluation and snapshots
    it makes; the loop is this one."""
    config = config or TrainConfig()
    device = resolve_device(config.device)
    result = TrainResult(status="complete", device=str(device))
    ops = parallel or _Local()
    try:
        budget_steps = _budget_steps(len(train_data), config)
        total = budget_steps * config.batch_size if budget_steps else None
        if parallel is None:
            model.to(device)
            tables = _trained_tables(model, config, device, _single_valued(train_data))
        else:
            tables = contextlib.nullcontext()
        with bars.bar(total, label, unit="examples") as shown, tables:
            best = _loop(model, train_data, valid_data, config, on_eval, device, result, shown,
                         budget_steps, ops)  # fmt: skip
        if result.status != "failed":
            if config.restore_best:
                _restore_best(model, valid_data, config, best, result, ops)
            result.validation = ops.evaluate(model, valid_data)
            result.test = ops.evaluate(model, test_data) if test_data is not None else {}
            if result.status == "complete":
                _check_diverged(result)
    except torch.OutOfMemoryError as exc:
        result.status, result.failure_reason = "failed", f"out of memory: {exc}"
    except RanknasError:  # the user's input, not the candidate, is wrong
        raise
    except Exception as exc:  # a failing step is a result, not a crash of the caller
        result.status, result.failure_reason = "failed", f"{type(exc).__name__}: {exc}"
    result.peak_memory_bytes = _peak_memory(device)
    return result


def _single_valued(data: Rows) -> bool:
    return not any(f.multi_valued for f in data.schema.categorical)


def _graph_step(device: torch.device, config: TrainConfig, model: nn.Module, data: Rows) -> bool:
    """Whether the step can be a CUDA graph: joint tables, one id per row and feature."""
    if device.type != "cuda" or not config.cuda_graph:
        return False
    if not isinstance(getattr(model, "embedding_bags", None), JointTables | type(None)):
        return False
    if not _single_valued(data):
        warnings.warn("multi-valued features: the step runs eagerly, not as a CUDA graph",
                      stacklevel=3)  # fmt: skip
        return False
    return True


@contextlib.contextmanager
def _trained_tables(
    model: nn.Module, config: TrainConfig, device: torch.device, single_valued: bool
) -> Iterator[None]:
    """The model's tables train as `FusedTables` on CPU (1.2-1.7x the examples per second)
    or as `JointTables` on CUDA (one lookup and update per width, see `cuda_graph`), and are
    put back, trained, at the end."""
    tables = getattr(model, "embedding_bags", None)
    if device.type == "cpu" and FusedTables.fits(tables):
        model.embedding_bags = FusedTables(tables, config.sparse_optimizer, config.sparse_lr)
    elif device.type in JOINT_TABLE_DEVICES and config.cuda_graph and JointTables.fits(tables):
        model.embedding_bags = JointTables(tables, config.sparse_optimizer, config.sparse_lr,
                                           single_valued)  # fmt: skip
    else:
        yield
        return
    try:
        yield
    finally:
        model.embedding_bags.write_back(tables)
        model.embedding_bags = tables


@dataclass
class _Best:
    """The best intermediate evaluation: its NE on the evaluation rows, step and weights."""

    ne: float = math.inf
    step: int = 0
    state: dict[str, torch.Tensor] | None = None


def _restore_best(model, valid_data, config, best: _Best, result: TrainResult, ops) -> None:
    """Load the best evaluation's weights if the final ones are worse on the same rows; that
    last evaluation joins the curves (it is what the restore was decided on)."""
    if best.state is None:
        return
    final = ops.evaluate(model, valid_data, config.eval_examples)
    if result.curves["val_ne"] and result.curves["val_ne"][-1][0] != result.steps:
        result.curves["val_ne"].append((result.steps, final["ne"]))
        result.curves["val_auc"].append((result.steps, final["auc"]))
    if final["ne"] <= best.ne:
        return
    ops.restore(model, best.state)
    result.restored_step = best.step


class Parallel:
    """What a sharded run (`trainers.sharded`) does its own way inside `train`'s loop."""

    def optimizers(self, model: nn.Module, config: TrainConfig) -> list[torch.optim.Optimizer]:
        """The dense optimizer first (the schedule sets its lr), then any other."""
        raise NotImplementedError

    def step(self, model: nn.Module, optimizers: list) -> Callable[[Batch], torch.Tensor]:
        raise NotImplementedError

    def evaluate(self, model: nn.Module, data: Rows, rows: int | None = None) -> dict:
        raise NotImplementedError

    def snapshot(self, model: nn.Module) -> dict[str, Any]:
        raise NotImplementedError

    def restore(self, model: nn.Module, state: dict[str, Any]) -> None:
        raise NotImplementedError


class _Local(Parallel):
    """One process: the module's own state and evaluation. Once `hold_on(device)` is
    called, the rows it evaluates are copied to that device once and evaluated there (a
    trial's few hundred milliseconds of GPU training otherwise wait on host batches)."""

    def __init__(self) -> None:
        self._device: torch.device | None = None
        self._held: dict[tuple[int, int | None], ResidentBatches] = {}

    def hold_on(self, device: torch.device) -> None:
        self._device = device

    def evaluate(self, model: nn.Module, data: Rows, rows: int | None = None) -> dict:
        if self._device is None or not ResidentBatches.fits(data):
            return evaluate(model, data, rows)
        if rows is not None and rows >= len(data):
            rows = None  # every row: one copy
        key = (id(data), rows)  # the same split object for the whole run
        if key not in self._held:
            self._held[key] = ResidentBatches(_head(data, rows), HELD_EVAL_BATCH, 0,
                                              self._device, shuffle=False)  # fmt: skip
        return ranking_metrics(*_predictions(model, self._held[key]))

    def snapshot(self, model: nn.Module) -> dict[str, Any]:
        return {k: v.detach().to("cpu", copy=True) for k, v in model.state_dict().items()}

    def restore(self, model: nn.Module, state: dict[str, Any]) -> None:
        model.load_state_dict(state)


def _check_diverged(result: TrainResult) -> None:
    """Worse than predicting the base rate (NE >= 1) or no number at all: a failed run."""
    ne = result.validation.get("ne", math.nan)
    if result.validation.get("base_rate") in (0.0, 1.0):  # streamed rows, split on the fly
        result.status = "failed"
        result.failure_reason = ("the validation rows hold one label only: NE is undefined "
                                 "there; give more rows, or check the label column")  # fmt: skip
    elif not math.isfinite(result.validation.get("logloss", math.nan)):
        result.status, result.non_finite = "failed", True
        result.failure_reason = "validation predictions are nan/inf after training"
    elif not ne < 1.0:
        result.status = "failed"
        result.failure_reason = (
            f"diverged: validation NE {ne:.4f} >= 1.0 (worse than predicting the base rate; "
            f"{_why_no_better(result)})"
        )


# a training loss this much above its start is risen, not noise: a few batches of a log
# with 4% positives move it by a few percent
LOSS_NOISE = 0.05
FEW_LABELS = 10  # validation rows of the rarer label under this: NE there measures noise
# a validation NE above this at every evaluation, and well above a coin flip's (p = 0.5: an
# untrained model's start where it does not start at the base rate), is confidently wrong
# from the first steps: a step too large, not a model still learning, nor overfit
FAR_ABOVE_BASE = 1.5


def _far_above_base(rate: float | None) -> float:
    """`FAR_ABOVE_BASE`, or 1.2 times a coin flip's NE at base rate `rate` where higher."""
    if rate is None or not 0 < rate < 1:
        return FAR_ABOVE_BASE
    return max(FAR_ABOVE_BASE, 1.2 * math.log(2) / entropy(rate))


def _why_no_better(result: TrainResult) -> str:
    """What a run worse than the base rate most likely lacked, read off its curves: a
    training loss that rose beyond noise while validation NE did not fall to its end
    diverged; one that fell while validation NE turned back up overfit; anything else was
    still learning (a validation NE falling to its last evaluation beside a few noisy loss
    points that rose: "a lower learning rate" was the wrong advice). An AUC of exactly 0.5
    is a constant score."""
    rate, rows = result.validation.get("base_rate"), result.validation.get("examples")
    if rate is not None and rows:
        fewer = round(min(rate, 1 - rate) * rows)
        if fewer < FEW_LABELS:  # one row's loss decides its NE: nothing a recipe changes
            label = "positive" if rate <= 0.5 else "negative"
            return (f"its {rows:,.0f} validation rows hold {fewer} {label} label"
                    f"{'s' * (fewer != 1)}: too few for its NE to measure the model; give more "
                    "rows")  # fmt: skip
    ne = [value for _, value in result.curves.get("val_ne", [])]
    far = _far_above_base(rate)
    if min(ne or [result.validation.get("ne", 0.0)]) > far:  # its score may be one for
        # every row too (saturated): no check of the features would find anything
        return (f"its validation NE was above {far:.3g} at every evaluation, confidently "
                "wrong from its first steps: it diverged; a lower learning rate may "
                "help")  # fmt: skip
    if result.validation.get("auc") == 0.5:  # one score for every row: no ranking at all
        return ("its validation AUC is 0.5: its score does not vary with the input; check "
                "that the architecture reads the features (no recipe fixes that)")  # fmt: skip
    losses = [loss for _, loss in result.curves.get("train_loss", [])]
    quarter, first, last = max(1, len(losses) // 4), 0.0, 0.0  # no curve: neither branch
    if len(losses) >= 2:
        first, last = statistics.fmean(losses[:quarter]), statistics.fmean(losses[-quarter:])
    falling_to_the_end = len(ne) >= 2 and ne[-1] == min(ne) < ne[0]
    if last > first * (1 + LOSS_NOISE) and not falling_to_the_end:
        return "its training loss rose: it diverged; a lower learning rate may help"
    if last < first and len(ne) >= 2 and ne[-1] > min(ne):
        if ne[0] == min(ne):  # overfit before the first evaluation, perhaps: 30 epochs, 6 evals
            first_step = result.curves["val_ne"][0][0]
            return (f"its validation NE was lowest at its first evaluation (step {first_step:,} "
                    f"of {result.steps:,}) and rose from there: it overfit, perhaps before it; "
                    "more evaluations (training.evals, which early stopping keeps the best "
                    "of) or fewer epochs may help")  # fmt: skip
        return "its validation NE turned back up: it overfit; fewer epochs may help"
    steps = f"{result.steps} step{'s' * (result.steps != 1)} ({result.examples:,} examples)"
    if result.time_limit:  # "more examples" would not have helped: the clock ended it
        return (f"its time limit of {result.time_limit:g} s ended it after {steps}: a longer "
                "time limit may help")  # fmt: skip
    if result.stopped_early:  # "still learning" beside an early stop read as a contradiction
        return (f"its validation NE stopped improving and early stopping ended it after "
                f"{steps}: a higher learning rate, or a longer patience, may help")  # fmt: skip
    return (f"still learning after {steps}: more examples or epochs, or a higher learning "
            "rate, may help")  # fmt: skip


def _loop(
    model, train_data, valid_data, config, on_eval, device, result, shown, budget_steps, ops
) -> _Best:
    torch.manual_seed(config.seed)
    if config.start_at_base_rate:
        _start_at_base_rate(model, train_data.label_mean)
    model.to(device).train()
    if isinstance(ops, _Local):
        graph = _graph_step(device, config, model, train_data)
        optimizers = [o for o in make_optimizers(model, config, graph) if o is not None]
        bf16 = device.type == "cuda" and config.bf16
        take_step = (GraphStep if graph else EagerStep)(model, optimizers, bf16, config.compile)
    else:
        graph, optimizers = False, ops.optimizers(model, config)
        take_step = ops.step(model, optimizers)
    resident = device if graph and ResidentBatches.fits(train_data) else None
    if resident is not None:
        ops.hold_on(device)
    eval_every = max(1, budget_steps // config.evals) if budget_steps else 0
    restarts = config.lr_schedule == "cosine_restarts" and eval_every > 0
    # without evaluation intervals (a budget in seconds only), restarts are one cosine
    cosine = config.lr_schedule in ("cosine", "cosine_restarts") and not restarts
    curves = result.curves = {"train_loss": [], "val_ne": [], "val_auc": []}
    loss_sum, best, stale, eval_seconds = torch.zeros((), device=device), _Best(), 0, 0.0
    elapsed = 0.0
    started = time.perf_counter()
    for step, batch in enumerate(_batches(train_data, config, resident), start=1):
        if cosine:
            done = budget_done(step, elapsed, budget_steps, config.max_seconds)
            set_lr(optimizers[0], config.dense_lr * cosine_factor(done))
        elif restarts:  # the cosine over each evaluation's interval
            done = ((step - 1) % eval_every) / eval_every
            set_lr(optimizers[0], config.dense_lr * cosine_factor(done))
        if resident is None:
            batch = _to(batch, device)
        loss_sum += take_step(batch)
        result.steps, result.examples = step, result.examples + batch.labels.shape[0]
        shown.update(batch.labels.shape[0])
        if step % config.log_every == 0:  # one host sync per log interval
            mean_loss, loss_sum = loss_sum.item() / config.log_every, loss_sum.zero_()
            if not math.isfinite(mean_loss):
                result.status, result.non_finite = "failed", True
                result.failure_reason = f"training loss became {mean_loss} by step {step}"
                break
            curves["train_loss"].append((step, mean_loss))
            shown.show("loss", mean_loss)
        elapsed = time.perf_counter() - started - eval_seconds
        done = bool(budget_steps and step >= budget_steps) or bool(
            config.max_seconds and elapsed >= config.max_seconds
        )
        if done and not (budget_steps and step >= budget_steps):
            result.time_limit = config.max_seconds
        if eval_every and step % eval_every == 0 and not done:
            eval_started = time.perf_counter()
            metrics = ops.evaluate(model, valid_data, config.eval_examples)
            eval_seconds += time.perf_counter() - eval_started
            if not math.isfinite(metrics["logloss"]):
                result.status, result.non_finite = "failed", True
                result.failure_reason = f"validation predictions became nan/inf by step {step}"
                break
            curves["val_ne"].append((step, metrics["ne"]))
            curves["val_auc"].append((step, metrics["auc"]))
            shown.show("val NE", metrics["ne"])
            if on_eval is not None and on_eval(step, result.examples, metrics):
                result.status = "pruned"
                break
            stale = stale + 1
            if metrics["ne"] < best.ne:
                state = ops.snapshot(model) if config.restore_best else None
                best, stale = _Best(metrics["ne"], step, state), 0
            if config.early_stopping_patience and stale >= config.early_stopping_patience:
                result.stopped_early = True
                break
        if done:
            break
    result.train_seconds = time.perf_counter() - started - eval_seconds
    result.throughput = result.examples / result.train_seconds if result.train_seconds else 0.0
    return best


def budget_done(
    step: int, elapsed: float, budget_steps: int | None, seconds: float | None
) -> float:
    """The fraction of the budget spent before `step` (1-based): of its steps, or of its
    seconds (evaluations excluded), whichever ends the run first."""
    done = (step - 1) / budget_steps if budget_steps else 0.0
    if seconds:
        done = max(done, elapsed / seconds)
    return min(done, 1.0)


def cosine_factor(done: float) -> float:
    """The cosine schedule: 1 at the start of the budget, 0 at its end."""
    return 0.5 * (1.0 + math.cos(math.pi * done))


def _start_at_base_rate(model: nn.Module, rate: float) -> None:
    """Set the output bias to the log-odds of the training click rate. At a few percent of
    clicks a logit of 0 (p = 0.5) costs several times the base rate's loss, and a short
    budget spends its steps on the bias instead of the features."""
    head = getattr(model, "head", None)
    if not isinstance(head, nn.Linear) or head.bias is None:
        return
    rate = min(max(rate, 1e-6), 1 - 1e-6)
    with torch.no_grad():
        head.bias.fill_(math.log(rate / (1 - rate)))


def _budget_steps(rows: int, config: TrainConfig) -> int | None:
    """Steps the budget allows when it is counted in steps, examples or epochs (None: time
    only). With no budget at all, one epoch."""
    limits = []
    if config.max_steps:
        limits.append(config.max_steps)
    if config.max_examples:
        limits.append(max(1, config.max_examples // config.batch_size))
    if config.max_epochs:
        limits.append(max(1, int(config.max_epochs * rows) // config.batch_size))
    if not limits and not config.max_seconds:
        limits.append(max(1, rows // config.batch_size))
    return min(limits) if limits else None
