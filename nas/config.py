"""The study config: one YAML file says what to search, on which data, how, and where to record.

Validated with pydantic; every error names the field and what is allowed (see
`examples/quickstart.yaml` for a commented config).
"""

from __future__ import annotations

import itertools
import re
from pathlib import Path
from typing import Any, Literal

from pydantic import (
    ConfigDict,
    Field,
    PrivateAttr,
    ValidationError,
    ValidationInfo,
    field_validator,
    model_validator,
)

from cost_models.sharding.methods import DEFAULT_MODEL, MAX_DEVICES, model_to_use
from nas.defaults import DEFAULT_STORAGE, DEFAULT_TRACKING_URI
from search_space.arguments import DEVICE_PATTERN, SEED_MAX
from search_space.errors import RanknasError
from search_space.files import looked_for, read_data_file
from search_space.preset_names import ARCHITECTURE_SUFFIXES, checks_files, unknown_architecture
from search_space.sections import Section as _Section
from search_space.space_configs import AnySpaceConfig, format_validation_error
from trainers.config import LrSchedule, TrainConfig

SEARCHERS = ("random", "evolution", "tpe", "nsga2", "ax", "oneshot", "dnas")
_TRAIN = TrainConfig()  # the one source of training defaults
DEFAULT_EXAMPLES = 200_000  # a trial's budget when neither examples nor epochs are given


class SplitConfig(_Section):
    method: Literal["auto", "random", "ordered", "time"] = Field(
        default="auto",
        description="auto: random for synthetic data, time when the schema (or `column`) "
        "names a time column, else ordered (file order); streamed data: file order, checked "
        "against the time column if one is named",
    )
    column: str | None = Field(default=None, description="time: the event-time column")
    fractions: tuple[float, float, float] = (0.8, 0.1, 0.1)
    ties: Literal["together", "file_order"] | None = Field(
        default=None,
        description="time: rows of one time on one side of each boundary (together, the "
        "default), or in file order across it, as a study recorded before that rule (2026-12-01) "
        "was split",
    )

    @field_validator("fractions", mode="before")
    @classmethod
    def _three(cls, value: Any) -> Any:
        if isinstance(value, list | tuple) and len(value) != 3:  # pydantic: "fractions.2: required"
            raise ValueError("need three numbers (train, validation, test) summing to 1, not "
                             f"{len(value)}: {list(value)}")  # fmt: skip
        return value

    @field_validator("fractions")
    @classmethod
    def _fractions(cls, value: tuple[float, float, float]) -> tuple[float, float, float]:
        if not all(f > 0 for f in value) or abs(sum(value) - 1) > 1e-6:
            raise ValueError("need three numbers above 0 (train, validation, test: validation "
                             f"selects, test reports) summing to 1, not {list(value)}")  # fmt: skip
        return value


class StreamConfig(_Section):
    """Training on data bigger than memory (`trainers/data/stream.py`)."""

    enabled: bool = Field(default=False, description="read the source in chunks while training")
    min_count: int = Field(default=1, ge=1, description="rarer values: out of vocabulary")
    hash_size: int | None = Field(
        default=None, ge=2, description="hash ids into this many buckets (huge vocabularies)"
    )
    shuffle_rows: int = Field(default=1 << 18, ge=1, description="rows shuffled together")
    chunk_rows: int = Field(default=1 << 16, ge=1, description="rows read at a time")
    prefetch_batches: int = Field(default=8, ge=1, description="batches made ahead")
    memory_rows: int = Field(
        default=500_000, ge=0, description="validation/test held in memory up to this size"
    )
    cache: bool = Field(
        default=True,
        description="encode the rows once into a row cache that later passes and runs read",
    )
    cache_dir: str | None = Field(
        default=None, description="where row caches live (default: .ranknas-cache/ beside the data)"
    )


class DataConfig(_Section):
    source: str = Field(default="synthetic", description="synthetic | criteo:PATH | PATH")
    schema_path: str | None = Field(default=None, alias="schema")
    rows: int = Field(default=100_000, ge=1_000, description="rows of synthetic data")
    cardinalities: list[int] | None = Field(
        default=None,
        description="synthetic data: each categorical feature's table size, e.g. a "
        "production log's spread (default: 16 sizes from 10 to 20,000)",
    )
    seed: int = Field(default=0, ge=0, le=SEED_MAX,
                      description="the data's seed (synthetic rows, random split), "
                      "apart from the training seeds")  # fmt: skip
    split: SplitConfig = SplitConfig()
    train: str | None = Field(
        default=None,
        description="with valid and test: files split as you made them (source, split unused)",
    )
    valid: str | None = None
    test: str | None = None

    @field_validator("cardinalities")
    @classmethod
    def _table_sizes(cls, value: list[int] | None) -> list[int] | None:
        if value is not None and (not value or min(value) < 2):
            raise ValueError(f"got {value}: give one table size of at least 2 per feature")
        return value

    preprocessing: Literal["auto", "none"] = Field(
        default="auto",
        description="auto: for CSV/Parquet files, dense columns log1p'd where count-like, "
        "standardized and clipped with training-split statistics; none: as read (a Criteo "
        "file's counts: log(1 + max(x, 0)) either way)",
    )

    max_bad_rows: int | None = Field(
        default=1000,
        ge=0,
        description="malformed rows a load skips before it stops (null: "
        "no limit); each skipped row is named in a warning",
    )
    max_bad_fraction: float | None = Field(
        default=0.01,
        ge=0,
        le=1,
        description="the share of malformed rows a load accepts (null: no limit)",
    )
    stream: StreamConfig = Field(
        default=StreamConfig(),
        description="true (or a mapping of StreamConfig): stream `source` (a Parquet "
        "directory or file, or criteo:PATH) instead of loading it",
    )

    model_config = ConfigDict(extra="forbid", populate_by_name=True)

    @field_validator("stream", mode="before")
    @classmethod
    def _stream_flag(cls, value: Any) -> Any:
        return {"enabled": value} if isinstance(value, bool) else value

    @model_validator(mode="after")
    def _criteo_schema(self) -> DataConfig:
        if self.source.startswith("criteo:") and self.schema_path and not self.train:
            raise ValueError("data.schema: a Criteo file's columns and encoding are its "
                             "reader's (label, I1..I13, C1..C26; min count 10 in memory), so "
                             "a schema would be ignored: drop it (streamed, data.stream "
                             "takes min_count or hash_size)")  # fmt: skip
        return self

    @model_validator(mode="after")
    def _streamable(self) -> DataConfig:
        if not self.stream.enabled:
            unread = {"min_count": self.stream.min_count != 1,
                      "hash_size": self.stream.hash_size is not None}  # fmt: skip
            given = [name for name, set_so in unread.items() if set_so]
            if given:  # `{enabled: false, hash_size: 1000}` ran with a vocabulary, unsaid
                raise ValueError(f"data.stream.{given[0]} applies to streamed data only: set "
                                 "data.stream.enabled: true, or drop it (a file read in memory "
                                 "takes min_count / hash_size per column in its schema; a "
                                 "Criteo file in memory: min count 10)")  # fmt: skip
            return self
        if self.source == "synthetic" or self.train:
            raise ValueError("data.stream reads one source: set data.source to a Parquet "
                             "directory or file, or criteo:PATH")  # fmt: skip
        if self.split.method not in ("auto", "ordered"):
            raise ValueError("data.stream splits in file order: use split.method auto or "
                             "ordered (write the files in time order for a time "
                             "split)")  # fmt: skip
        return self

    @model_validator(mode="after")
    def _files_together(self) -> DataConfig:
        files = [self.train, self.valid, self.test]
        if any(files) and not all(files):
            raise ValueError("data.train, data.valid and data.test go together: give all three")
        if any(files) and not self.schema_path:
            raise ValueError("data.train/valid/test need data.schema (the columns)")
        named = {"train": self.train, "valid": self.valid, "test": self.test}
        for (one, a), (other, b) in itertools.combinations(named.items(), 2):
            if a and b and Path(a).expanduser().resolve() == Path(b).expanduser().resolve():
                raise ValueError(
                    f"data.{one} and data.{other} are one file ({a}): a model measured on the "
                    "rows it trained on (or selected on its test rows) looks better than it "
                    "is; give three files of different rows, later ones for validation and "
                    "test, or one file as data.source (split for you)"
                )
        return self

    @field_validator("split", mode="before")
    @classmethod
    def _shorthands(cls, value: Any) -> Any:
        """`split: time` (as `--split time`) or `split: [0.8, 0.1, 0.1]` alone."""
        if isinstance(value, str):
            return {"method": value}
        return {"fractions": value} if isinstance(value, list | tuple) else value


class SearcherConfig(_Section):
    type: Literal["random", "evolution", "tpe", "nsga2", "ax", "oneshot", "dnas"] = "tpe"
    population: int = Field(default=16, ge=2, description="evolution: population size")
    sample_size: int = Field(default=4, ge=1, description="evolution: tournament size")
    startup_trials: int = Field(
        default=5,
        ge=0,
        description="tpe/nsga2/ax: random trials first (around: variants of the base)",
    )
    # oneshot / dnas (nas/oneshot/): a phase before the trials, then its top_k are trained
    top_k: int = Field(default=3, ge=1, description="oneshot/dnas: candidates enqueued")
    supernet_steps: int = Field(default=300, ge=1, description="oneshot/dnas: training steps")
    supernet_sampling: Literal["nasrec", "spos"] = Field(
        default="nasrec", description="oneshot: any-connection (NASRec) or uniform single path"
    )
    supernet_lr_schedule: Literal["constant", "cosine"] = Field(
        default="constant", description="oneshot: cosine decays the learning rates to 0"
    )
    supernet_grad_clip: float | None = Field(
        default=None, gt=0, description="oneshot: max norm of the dense gradients"
    )
    warmup_fraction: float = Field(
        default=0.25, ge=0, le=1, description="oneshot: full-supernet warm-up; dnas: weights only"
    )
    oneshot_search: Literal["evolution", "reinforce"] = "evolution"
    search_candidates: int = Field(default=32, ge=1, description="oneshot: candidates scored")
    finetune_steps: int = Field(
        default=20, ge=0, description="oneshot/dnas_rescore: fine-tune steps before scoring"
    )
    finetune_batch_size: int | None = Field(
        default=None, ge=1, description="oneshot/dnas: fine-tune batch (default: batch_size)"
    )
    score_rows: int = Field(default=5000, ge=100, description="oneshot/dnas: validation rows")
    refine_candidates: int = Field(
        default=0, ge=0, description="oneshot/dnas: the best rescored after a longer fine-tune"
    )
    refine_steps: int = Field(default=160, ge=1, description="oneshot/dnas: that longer fine-tune")
    target_mflops: float | None = Field(default=None, gt=0, description="oneshot/dnas: budget")
    cost_weight: float = Field(default=0.0, ge=0, description="weight of |mflops/target - 1|")
    cost_penalty: Literal["absolute", "above"] = Field(
        default="absolute",
        description="absolute: |mflops/target - 1|, TuNAS (a target); above: "
        "max(0, mflops/target - 1) (a ceiling)",
    )
    dnas_tau_start: float = Field(default=5.0, gt=0, description="dnas: Gumbel temperature")
    dnas_tau_end: float = Field(default=0.5, gt=0)
    dnas_arch_lr: float = Field(default=0.01, gt=0, description="dnas: Adam lr of the logits")
    dnas_rescore: int = Field(
        default=0,
        ge=0,
        description="dnas: score this many of the most probable architectures with inherited "
        "weights (as oneshot does) and enqueue the best; 0: the argmax and the most probable",
    )

    @model_validator(mode="after")
    def _tournament_fits(self) -> SearcherConfig:
        if self.sample_size > self.population:
            raise ValueError("sample_size must not exceed population")
        if self.cost_weight > 0 and self.target_mflops is None:
            raise ValueError("cost_weight > 0 needs target_mflops")
        return self


class ObjectiveConfig(_Section):
    metric: Literal["ne", "logloss"] = "ne"
    cost: Literal["none", "mflops", "params", "latency_ms", "step_ms"] = Field(
        default="none",
        description="a second objective to minimize (Pareto front); step_ms: the predicted "
        "training step on the `sharding:` cluster",
    )
    max_mflops: float | Literal["best_baseline", "base"] | None = Field(
        default=None,
        description="constraint: an architecture above it is skipped without training (not "
        "counted in the budget); best_baseline: the MFLOPs of the study's best baseline; "
        "base: those of the around space's base",
    )
    max_step_ms: float | Literal["best_baseline", "base"] | None = Field(
        default=None,
        description="constraint: an architecture whose predicted training step on the "
        "`sharding:` cluster is slower is skipped without training; best_baseline / base: "
        "that model's step time",
    )
    max_params: int | None = Field(default=None, gt=0, description="constraint (dense params)")
    max_latency_ms: float | None = Field(default=None, gt=0, description="constraint (forward)")
    latency_batch_size: int = Field(default=512, ge=1, description="batch of latency_ms")
    latency_model: str | None = Field(
        default=None, description="predictor JSON (`ranknas latency fit`); default: measure"
    )

    @field_validator("max_mflops", "max_step_ms", mode="before")
    @classmethod
    def _ceiling(cls, value: Any, info: ValidationInfo) -> float | str | None:
        if value is None or value in ("best_baseline", "base"):
            return value
        try:
            number = float(value)
        except (TypeError, ValueError):
            number = 0.0
        if isinstance(value, bool) or not number > 0:
            unit = "MFLOPs" if info.field_name == "max_mflops" else "ms"
            raise ValueError(
                f"got {value!r}: use a number of {unit} above 0, best_baseline or base"
            )
        return number

    @property
    def needs_latency(self) -> bool:
        return self.cost == "latency_ms" or bool(self.max_latency_ms or self.latency_model)

    @property
    def needs_step_time(self) -> bool:
        return self.cost == "step_ms" or self.max_step_ms is not None

    def ceilings(self) -> dict[str, float | str]:
        """The constraints that may name a model (best_baseline, base), by cost."""
        named = {"mflops": self.max_mflops, "step_ms": self.max_step_ms}
        return {cost: value for cost, value in named.items() if value is not None}


class BudgetConfig(_Section):
    trials: int = Field(default=20, ge=1)
    examples_per_trial: int | None = Field(
        default=None, ge=1, description=f"default: {DEFAULT_EXAMPLES:,} (or epochs_per_trial)"
    )
    epochs_per_trial: float | None = Field(
        default=None, gt=0, description="instead of examples_per_trial: passes over the data"
    )
    trial_seconds: float | None = Field(
        default=None,
        gt=0,
        description="a trial's training stops after this many seconds "
        "(wall clock; trials then differ by machine speed, so NE compare less well)",
    )
    time_limit_minutes: float | None = Field(
        default=None, gt=0, description="each `search` worker's searching, after the baselines"
    )
    max_failures: int | None = Field(default=None, ge=1, description="default: trials")
    confirm_seeds: int = Field(
        default=0,
        ge=0,
        description="a trial whose first run would become the study's best (join its Pareto "
        "front) trains this many more seeds, and its value is their mean: the best trials are "
        "seed means, not the luckiest runs; 0: one run per trial",
    )

    @model_validator(mode="after")
    def _one_size(self) -> BudgetConfig:
        if self.epochs_per_trial and self.examples_per_trial:
            raise ValueError("give examples_per_trial or epochs_per_trial, not both")
        return self


class LogRange(_Section):
    """A learning rate searched on a log grid from `low` to `high`."""

    low: float = Field(gt=0)
    high: float = Field(gt=0)

    @model_validator(mode="after")
    def _ordered(self) -> LogRange:
        if self.low > self.high:
            raise ValueError(f"low {self.low} is above high {self.high}")
        return self


class TrainingSearchConfig(_Section):
    """Training hyper-parameters searched with the architecture (nas/recipe.py): each
    trial draws them as flat parameters `train.<name>`; what is left out stays fixed."""

    dense_lr: LogRange | None = Field(default=None, description="{low, high}: log grid")
    sparse_lr: LogRange | None = Field(default=None, description="{low, high}: log grid")
    weight_decay: list[float] | None = Field(default=None, min_length=1)
    batch_size: list[int] | None = Field(
        default=None, min_length=1,
        description="choices; the lrs scale by sqrt(batch_size / training.batch_size)",
    )  # fmt: skip
    grid: int = Field(default=7, ge=1, le=50, description="points in each log range")

    @field_validator("weight_decay", "batch_size")
    @classmethod
    def _choices(cls, value: list | None, info: ValidationInfo) -> list | None:
        least = 1 if info.field_name == "batch_size" else 0
        if value is not None and any(v < least for v in value):
            raise ValueError(f"every {info.field_name.replace('_', ' ')} must be >= {least}")
        return value

    @model_validator(mode="after")
    def _something(self) -> TrainingSearchConfig:
        if not any((self.dense_lr, self.sparse_lr, self.weight_decay, self.batch_size)):
            raise ValueError("name at least one of dense_lr, sparse_lr, weight_decay, batch_size")
        return self


class TrainingConfig(_Section):
    """How every trial, baseline and re-evaluation is trained; the defaults are the
    trainer's (`trainers.trainer.TrainConfig`), which `ranknas train` uses too."""

    batch_size: int = Field(default=_TRAIN.batch_size, ge=1)
    dense_optimizer: Literal["adam", "adamw"] = _TRAIN.dense_optimizer
    dense_lr: float = Field(default=_TRAIN.dense_lr, gt=0)
    lr_schedule: LrSchedule = Field(
        default=_TRAIN.lr_schedule,
        description="the dense lr over each run: cosine from dense_lr to 0 over the budget; "
        "cosine_restarts: the same over each evaluation's interval; or constant",
    )
    weight_decay: float = Field(default=_TRAIN.weight_decay, ge=0)
    sparse_optimizer: Literal["adagrad", "rowwise_adagrad", "sgd"] = _TRAIN.sparse_optimizer
    sparse_lr: float = Field(default=_TRAIN.sparse_lr, gt=0)
    evals: int = Field(default=_TRAIN.evals, ge=1, description="validation evaluations per run")
    early_stopping_patience: int = Field(
        default=_TRAIN.early_stopping_patience,
        ge=0,
        description="stop after this many evaluations without improvement; 0: never",
    )
    restore_best: bool = Field(
        default=_TRAIN.restore_best, description="end with the best evaluation's weights"
    )
    device: str = Field(
        default="auto", description="auto (a GPU where there is one), cpu, cuda or cuda:N"
    )
    threads: int = Field(
        default=1,
        ge=1,
        description="CPU threads per worker; small ranking models train fastest on one "
        "thread per process: run more workers to use more cores",
    )
    processes: int = Field(
        default=1,
        ge=1,
        le=64,
        description="above 1: every trial, baseline and re-evaluation trains sharded, under "
        "torchrun with torchrec's DistributedModelParallel on this many processes (gloo on "
        "CPU, nccl on GPUs), its tables placed by the study's sharder",
    )
    search: TrainingSearchConfig | None = Field(
        default=None,
        description="hyper-parameters searched with the architecture by sampling searchers",
    )
    cuda_graph: bool = Field(
        default=_TRAIN.cuda_graph,
        description="on a GPU: tables joined per width, batches held on the GPU and the step "
        "replayed as a CUDA graph (one id per row and feature); false: the eager reference",
    )
    compile: bool = Field(
        default=_TRAIN.compile,
        description="the training step's dense part compiled by torch.compile (elementwise "
        "work fused): worth its tens of seconds of compiling per run only for long runs of large "
        "models (MLPerf's DLRM-DCNv2 shape: 1.43x the examples/s on an H100)",
    )

    @field_validator("device")
    @classmethod
    def _device(cls, value: str) -> str:
        if not re.fullmatch(DEVICE_PATTERN, value):
            raise ValueError(f"{value!r}: use auto, cpu, cuda or cuda:N")
        return value


class WorkersConfig(_Section):
    """Worker processes that `ranknas search` starts on the study (`--workers` overrides
    `count`): round-robin over the visible GPUs, each pinned to its GPU; on CPU they split
    the cores."""

    count: int | None = Field(default=None, ge=1, description="default: 1, or per_device x GPUs")
    per_device: int | None = Field(default=None, ge=1, description="at most this many per GPU")


class PruningConfig(_Section):
    type: Literal["none", "median", "hyperband"] = "none"
    startup_trials: int = Field(default=3, ge=0, description="median: trials before pruning")


class ShardingConfig(_Section):
    devices: int = Field(
        default=0, ge=0, le=MAX_DEVICES, description="0: do not plan; else plan each trial"
    )
    method: Literal[
        "random", "dim_greedy", "size_greedy", "lookup_greedy", "size_lookup_greedy",
        "torchrec", "torchrec_cw", "rl",
    ] = "size_lookup_greedy"  # fmt: skip
    model_dir: str = Field(
        default=str(DEFAULT_MODEL),
        description="the folder `ranknas shard train --out` wrote (the cost model, and the "
        "policy of method rl); the default one, where none was trained: the model shipped "
        "with ranknas",
    )
    hosts: int | None = Field(
        default=None, ge=1, description="hosts the devices are spread over (default: 8 a host)"
    )
    links: str | None = Field(
        default=None,
        description="JSON from `ranknas shard links`: the links inside a host are these "
        "measured ones (default: torchrec's NVLink-class constants)",
    )
    dense_model: str | None = Field(
        default=None,
        description="predictor JSON of the dense part's step (`ranknas latency fit --target "
        "dense_step_ms`, at training.batch_size): a step's dense part is predicted, the same "
        "for a model in every study; default: timed on the training device (in turn with "
        "the model max_step_ms names, where it names one)",
    )
    runtime_ms: float | None = Field(
        default=None,
        ge=0,
        description="the sharded runtime's fixed cost per step, added to predicted steps; "
        "default: the one `ranknas shard links` measured into the links file, else 0 (7.5-10.5 "
        "ms measured on a 2-core CPU with gloo)",
    )

    @field_validator("links", "dense_model")
    @classmethod
    def _file_exists(cls, path: str | None, info: ValidationInfo) -> str | None:
        if path is not None and checks_files(info.context) and not Path(path).is_file():
            made_by = ("`ranknas shard links --out FILE`" if info.field_name == "links"
                       else "`ranknas latency fit --target dense_step_ms`")  # fmt: skip
            raise ValueError(f"{path}: no such file{looked_for(Path(path))}; {made_by} makes one")
        return path

    @model_validator(mode="after")
    def _model_there(self, info: ValidationInfo) -> ShardingConfig:
        if self.devices and checks_files(info.context):  # a mistyped one: the shipped model
            try:
                model_to_use(self.model_dir, "model_dir")
            except RanknasError as exc:  # said under `sharding:`
                raise ValueError(str(exc)) from None
        return self

    @model_validator(mode="after")
    def _hosts_divide_devices(self) -> ShardingConfig:
        if self.hosts is not None and not self.devices:
            raise ValueError(f"hosts: {self.hosts} given, but no devices: set devices to the "
                             "devices the hosts hold together (8 a host: 16 on 2)")  # fmt: skip
        if self.hosts is not None and self.devices % self.hosts:
            raise ValueError(f"hosts: {self.hosts} must divide devices ({self.devices}) evenly")
        return self


class BestBaselineConfig(_Section):
    """How a study picks `best_baseline` (search_space.base, objectives.max_mflops): by seed
    means, as the verdict compares models, not by one run's luck."""

    top: int | None = Field(
        default=None,
        ge=2,
        description="the best single runs retrained; null: every baseline, as the verdict "
        "compares them (reevaluate reuses the runs: no extra training)",
    )
    seeds: int = Field(
        default=3,
        ge=0,
        description="fresh seeds each (reevaluate's, reused by it); 0: the single runs decide",
    )
    tune: int = Field(
        default=0,
        ge=0,
        description="recipe trials per baseline over training.search (TPE, outside the "
        "budget): each baseline is compared at its best recipe; 0: the study's recipe",
    )


class MlflowConfig(_Section):
    tracking_uri: str | None = Field(
        default=DEFAULT_TRACKING_URI, description="null: do not log to MLflow"
    )
    experiment: str | None = Field(
        default=None,
        description="the MLflow experiment of the study's runs (null: the study's name)",
    )

    @field_validator("tracking_uri")
    @classmethod
    def _uri(cls, uri: str | None) -> str | None:
        schemes = ("http://", "https://", "sqlite:///", "postgresql://", "databricks")
        if uri is not None and (uri.startswith("file:") or uri.startswith(("/", "./", "~"))):
            raise ValueError(
                f"{uri!r}: MLflow 3 takes no file store (it refuses one as in maintenance "
                "mode); use sqlite:///PATH/mlflow.db, or http://HOST:PORT (`ranknas mlflow up` "
                "starts one at http://127.0.0.1:5000), or null to not log"
            )
        if uri is not None and not uri.startswith(schemes):
            raise ValueError(
                f"{uri!r} is not a tracking URI; use http://HOST:PORT (`ranknas mlflow up` "
                "starts one at http://127.0.0.1:5000) or null to not log"
            )
        return uri


def baseline_key(name_or_file: str) -> str:
    """`dlrm` for a preset, the file's stem for an architecture file."""
    path = Path(name_or_file)
    return path.stem if path.suffix.lower() in ARCHITECTURE_SUFFIXES else name_or_file


class StudyConfig(_Section):
    # the model a named step ceiling is of (`runner._with_ceilings`), not a setting: a
    # candidate's dense part is timed in turn with it (`protocol._step`)
    _step_reference: Any = PrivateAttr(default=None)

    name: str
    data: DataConfig = DataConfig()
    search_space: AnySpaceConfig
    searcher: SearcherConfig = SearcherConfig()
    objectives: ObjectiveConfig = ObjectiveConfig()
    budget: BudgetConfig = BudgetConfig()
    training: TrainingConfig = TrainingConfig()
    pruning: PruningConfig = PruningConfig()
    workers: WorkersConfig = WorkersConfig()
    storage: str = DEFAULT_STORAGE
    mlflow: MlflowConfig = MlflowConfig()
    sharding: ShardingConfig = ShardingConfig()
    baselines: list[str] = Field(
        default_factory=list,
        description="preset names or architecture files trained like every trial, outside "
        "the budget and unseen by the searcher, to compare the search against",
    )
    best_baseline: BestBaselineConfig = BestBaselineConfig()
    output_dir: str | None = Field(default=None, description="default: ranknas-data/studies/NAME")
    heartbeat_seconds: int = Field(default=10, ge=1)
    seed: int = Field(default=0, ge=0, le=SEED_MAX)

    @field_validator("name")
    @classmethod
    def _name(cls, name: str) -> str:
        if not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,99}", name):
            raise ValueError("use letters, digits, '.', '_' and '-' (up to 100)")
        return name

    @field_validator("baselines")
    @classmethod
    def _baselines(cls, names: list[str], info: ValidationInfo) -> list[str]:
        if not checks_files(info.context):
            return names
        problems = [p for p in map(unknown_architecture, names) if p]
        if problems:  # before any data is read
            raise ValueError("; ".join(problems))
        return names

    @field_validator("storage")
    @classmethod
    def _storage(cls, url: str) -> str:
        from nas.storage import standard_url

        url = standard_url(url)
        if not re.match(r"^(sqlite|postgresql|postgresql\+\w+|mysql\+?\w*)://", url):
            raise ValueError(
                "must be an RDB URL: sqlite:///PATH.db or postgresql://USER@HOST:PORT/DB"
            )
        from sqlalchemy.engine import make_url

        try:
            database = "-" if url.startswith("sqlite") else make_url(url).database
        except Exception:  # malformed: opening the storage says how, naming it
            database = "-"
        if not database:
            raise ValueError(  # the server's default database (postgres) took Optuna's tables
                "names no database: give it after the host, postgresql://USER@HOST:PORT/DB"
            )
        return url

    @model_validator(mode="after")
    def _consistent(self) -> StudyConfig:
        if self.searcher.type == "nsga2" and self.objectives.cost == "none":
            raise ValueError("searcher nsga2 needs a second objective: set objectives.cost")
        if self.pruning.type != "none" and self.objectives.cost != "none":
            raise ValueError("pruning works with one objective only: set objectives.cost: none")
        if self.searcher.type in ("oneshot", "dnas") and self.data.stream.enabled:
            raise ValueError(f"searcher {self.searcher.type} needs the data in memory: "
                             "data.stream works with the sampling searchers")  # fmt: skip
        if self.searcher.type in ("oneshot", "dnas") and self.search_space.type != "dag":
            raise ValueError(f"searcher {self.searcher.type} needs search_space.type: dag")
        for cost, value in self.objectives.ceilings().items():
            if value == "best_baseline" and not self.baselines:
                raise ValueError(
                    f"objectives.max_{cost}: best_baseline needs `baselines:` to train"
                )
            if value == "base" and self.search_space.type != "around":
                raise ValueError(f"objectives.max_{cost}: base needs search_space.type: around")
        if self.objectives.needs_step_time and not self.sharding.devices:
            raise ValueError("objectives step_ms / max_step_ms predict the step on a cluster: "
                             "set sharding.devices (and hosts) to the devices it has (0, the "
                             "default, plans nothing)")  # fmt: skip
        if self.sharding.dense_model and not self.objectives.needs_step_time:
            raise ValueError("sharding.dense_model predicts the dense part of a step: it needs "
                             "objectives.cost: step_ms or max_step_ms")  # fmt: skip
        base = getattr(self.search_space, "base", None)
        if base == "best_baseline" and not self.baselines:
            raise ValueError("search_space.base: best_baseline needs `baselines:` to train")
        if (0 in (getattr(self.search_space, "feature_dims", None) or ())
                and base != "best_baseline"
                and baseline_key(base) not in map(baseline_key, self.baselines)):  # fmt: skip
            raise ValueError(
                "search_space.feature_dims holds 0: the study first measures what each feature "
                f"is worth to its base, trained as a baseline: add {base} to `baselines:` (or "
                "set search_space.base: best_baseline)"
            )
        if self.training.processes > 1 and self.pruning.type != "none":
            raise ValueError("training.processes > 1 trains in other processes, which cannot "
                             "report to a pruner: set pruning.type: none")  # fmt: skip
        if self.training.processes > 1 and self.training.compile:
            raise ValueError("training.compile compiles the one-process step; training.processes "
                             "> 1 trains sharded steps, uncompiled: drop one of them")  # fmt: skip
        if self.training.processes > 1 and self.data.stream.enabled:
            raise ValueError("training.processes > 1 needs the data in memory: drop data.stream")
        if self.training.processes > 1 and self.training.batch_size % self.training.processes:
            raise ValueError(f"training.batch_size {self.training.batch_size} must split evenly "
                             f"over training.processes {self.training.processes}")  # fmt: skip
        if self.best_baseline.tune and not self.training.search:
            raise ValueError("best_baseline.tune needs training.search: the hyper-parameters "
                             "to tune the baselines over")  # fmt: skip
        if self.training.search and self.searcher.type in ("oneshot", "dnas"):
            raise ValueError(f"training.search works with the sampling searchers, not "
                             f"{self.searcher.type} (its supernet trains one recipe)")  # fmt: skip
        return self

    @property
    def multi_objective(self) -> bool:
        return self.objectives.cost != "none"

    @property
    def study_dir(self) -> Path:
        return Path(self.output_dir or f"ranknas-data/studies/{self.name}")

    @property
    def mlflow_experiment(self) -> str:
        """The MLflow experiment of the study's runs."""
        return self.mlflow.experiment or self.name

    def mlflow_params(self) -> dict[str, Any]:
        """The config as the study's MLflow params, with passwords in URLs redacted."""
        from nas.storage import redact

        params = self.model_dump(mode="json")
        if self.data.train or self.data.source != "synthetic":  # a file's: not its row count
            for synthetic_only in ("rows", "cardinalities"):
                params["data"].pop(synthetic_only, None)
        params["storage"] = redact(self.storage)
        if self.mlflow.tracking_uri:
            params["mlflow"]["tracking_uri"] = redact(self.mlflow.tracking_uri)
        return params

    @property
    def step_reference(self) -> Any:
        """`protocol.StepReference` of a step ceiling that names a model, else None."""
        return self._step_reference

    def with_step_reference(self, reference: Any) -> StudyConfig:
        config = self.model_copy()
        config._step_reference = reference
        return config


def parse_config(data: Any, source: str = "study config", check_files: bool = True) -> StudyConfig:
    """Validate a study config mapping; errors name `source` (the file), the field and what
    is allowed, one line each. `check_files`: whether the model files it names (baselines,
    an around space's base) must exist from the current directory."""
    if not isinstance(data, dict):
        raise RanknasError(f"{source}: expected a mapping with name, search_space, ...")
    if set(data) == {"search_space"}:  # examples/space_*.yaml: a study's section alone
        raise RanknasError(
            f"{source}: holds a search_space section only, not a study: put it under "
            "`search_space:` in a study config (as examples/quickstart.yaml does), or draw "
            f"architectures from it with `ranknas space sample {source}`"
        )
    try:
        config = StudyConfig.model_validate(data, context={"check_files": check_files})
    except ValidationError as exc:
        space = data.get("search_space")
        tag = space.get("type") if isinstance(space, dict) else None
        lines = format_validation_error(exc, source, joiner=": ", models=[StudyConfig])
        lines = lines.splitlines()
        if tag:  # a space error's location carries the union tag: drop it
            lines = [line.replace(f"search_space.{tag}.", "search_space.") for line in lines]
        raise RanknasError("\n".join(lines)) from None
    return config


def load_config(path: str | Path, check_files: bool = True) -> StudyConfig:
    data = read_data_file(path, "the study config")
    return parse_config(data, source=str(path), check_files=check_files)
