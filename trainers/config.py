"""`TrainConfig`: how a candidate is trained, the defaults that studies, baselines and
`ranknas train` share. Apart from the loop so that the CLI parser can show the defaults
without importing torch."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal, get_args

from search_space.errors import RanknasError

LrSchedule = Literal["constant", "cosine", "cosine_restarts"]
LR_SCHEDULES: tuple[str, ...] = get_args(LrSchedule)
# `ranknas train` without a budget: epochs until one does not improve on the best (at most
# 10), each annealed by its own cosine, so that early stopping, not an example count, ends
# the run; the best epoch's weights are kept (bench/bench_train_budget.py)
UNTIL_STOPPED = {"max_epochs": 10, "evals": 10, "lr_schedule": "cosine_restarts",
                 "early_stopping_patience": 1}  # fmt: skip


@dataclass
class TrainConfig:
    """How to train one candidate. The budget is whichever of examples/steps/seconds ends
    first; with none set, one epoch."""

    batch_size: int = 512
    max_examples: int | None = None
    max_epochs: float | None = None
    max_steps: int | None = None
    max_seconds: float | None = None
    dense_optimizer: Literal["adam", "adamw"] = "adam"
    dense_lr: float = 2e-3
    weight_decay: float = 0.0
    sparse_optimizer: Literal["adagrad", "rowwise_adagrad", "sgd"] = "adagrad"
    sparse_lr: float = 0.05
    # the dense lr over the run: cosine from dense_lr to 0 over the budget (steps, examples,
    # epochs or seconds, whichever ends first); cosine_restarts: the same over each
    # evaluation's interval, for budgets that early stopping ends (each evaluation then
    # sees annealed weights); or constant
    lr_schedule: LrSchedule = "cosine"
    evals: int = 6  # intermediate validation evaluations over the budget
    eval_examples: int | None = 20_000  # validation rows used at intermediate evaluations
    early_stopping_patience: int = 2  # evaluations without improvement; 0 = off
    restore_best: bool = True  # end with the weights of the best evaluation
    # a fresh model: the output bias starts at the training click rate's log-odds (False:
    # keep the weights given, a warm start)
    start_at_base_rate: bool = True
    log_every: int = 20  # steps between train-loss curve points
    seed: int = 0
    device: str = "auto"  # auto | cpu | cuda | cuda:N
    bf16: bool = True  # autocast on CUDA
    # on CUDA, with one id per row and feature: tables joined per width, batches resident
    # on the GPU, the step replayed as a CUDA graph (trainers/steps.py); False: the eager
    # reference path (one table per feature, host batches), which other cases always run
    cuda_graph: bool = True
    # the dense part of the training step (blocks and head) compiled by torch.compile, its
    # elementwise work fused: for long runs of large models, after tens of seconds of
    # compiling (21 s for dcnv2 on 2 CPU cores); evaluation runs the module as is
    compile: bool = False

    def __post_init__(self) -> None:
        positive = ("batch_size", "max_examples", "max_epochs", "max_steps", "max_seconds",
                    "evals", "log_every")  # fmt: skip
        for name in positive:
            value = getattr(self, name)
            if value is not None and value <= 0:
                raise RanknasError(f"train config: {name} must be > 0, got {value}")
        if self.lr_schedule not in LR_SCHEDULES:
            raise RanknasError(f"train config: lr_schedule must be one of "
                               f"{', '.join(LR_SCHEDULES)}, got {self.lr_schedule!r}")  # fmt: skip
        for name in ("dense_lr", "sparse_lr"):
            if not getattr(self, name) > 0:
                raise RanknasError(f"train config: {name} must be > 0")


def cpu_label(threads: int) -> str:
    """How a run on the CPU is named (trial attributes, MLflow tags, the launcher's lines)."""
    return f"cpu ({threads} thread{'' if threads == 1 else 's'})"
