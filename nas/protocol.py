"""The trial protocol: how a study prepares its data and costs, trains and records one
architecture. Trials (`nas.runner`), baselines (`nas.baselines`) and re-evaluation
(`nas.reevaluate`) all go through here, so they are comparable by construction.
"""

from __future__ import annotations

import functools
import json
import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import optuna

from cost_models.sharding.links import read_links
from cost_models.sharding.methods import model_to_use
from cost_models.sharding.plan import Plan
from cost_models.sharding.step import plan_trial_sharding, predict_step, topology
from nas.config import DEFAULT_EXAMPLES, DataConfig, ShardingConfig, StudyConfig
from nas.protocol_diff import (
    RECORDED_SINCE,
    cluster_changes,
    other_settings,
    protocol_changes,
    recorded_training,
    training_protocol,
)
from nas.storage import redact
from nas.trial_record import (
    SHARDING_FILE,
    STEP_FILE,
    TRAINED_PLAN_FILE,
    StudyAttr,
    TrialAttr,
    write_metrics,
    write_weights,
)
from search_space.architecture import Analysis, Architecture, analyze, digest
from search_space.builder import RankingModel, build_model
from search_space.errors import RanknasError
from trainers.data import TabularData, bayes_metrics, load_dataset
from trainers.data.criteo import dense_transforms, hex_ids
from trainers.data.dataset import warn_if_too_few_to_rank
from trainers.data.preprocess import (
    apply_preprocessing,
    describe,
    fit_preprocessing,
    warn_unseen_in_test,
)
from trainers.trainer import Rows, TrainConfig, TrainResult, resolve_device, train

EvalHook = Callable[[int, int, dict[str, float]], bool]


@dataclass
class StudyData:
    train: Rows  # in memory, or streamed from files (`data.stream`)
    valid: Rows
    test: Rows
    bayes_ne: float | None  # the floor no model can beat, known for synthetic data
    split: str = ""  # how the rows were split, in words
    # fitted on the training split (`trainers.data.preprocess.fit_preprocessing`): dense
    # transforms, vocabularies, hashed and multi-valued columns
    preprocessing: dict[str, Any] = field(default_factory=dict)
    auto_split: str | None = None  # the split method `auto` chooses on this data

    @property
    def pooling_factors(self) -> dict[str, float]:
        """Each multi-valued feature's mean ids per training row (a lookup's pooling)."""
        lists = getattr(self.train, "multi_hot", {})  # streamed rows have none in memory
        return {name: float(j.lengths.mean()) for name, j in lists.items() if len(j.lengths)}


def prepare_data(config: StudyConfig) -> StudyData:
    d = config.data
    data = (_prepare_files(config) if d.train else
            _prepare_stream(config) if d.stream.enabled else _prepare_split(config))  # fmt: skip
    warn_if_too_few_to_rank(data.valid)
    return data


def _prepare_split(config: StudyConfig) -> StudyData:
    """One source split into training, validation and test rows."""
    d = config.data
    options: dict[str, Any] = {"rows": d.rows, "seed": d.seed} if d.source == "synthetic" else {}
    if d.source != "synthetic":
        options |= _bad_row_limits(d)
    if d.source == "synthetic" and d.cardinalities:
        options["cardinalities"] = tuple(d.cardinalities)
    if d.split.column and d.source != "synthetic" and not d.source.startswith("criteo:"):
        options["time_column"] = d.split.column
    data = load_dataset(d.source, d.schema_path, **options)
    method = split_method(d.split.method, data, d.source)
    parts = data.split(d.split.fractions, seed=d.seed, method=method,
                       ties_together=d.split.ties != "file_order",
                       source=None if d.source == "synthetic" else d.source)  # fmt: skip
    fitted = fit_on_training(parts[0], d.preprocessing, d.source)
    train_part, valid, test = (apply_preprocessing(p, fitted) for p in parts)
    bayes = bayes_metrics(valid).ne if data.true_prob is not None else None
    described = "; ".join(filter(None, [describe_split(method, data, d.seed), describe(fitted)]))
    auto = split_method("auto", data, d.source)
    return StudyData(train_part, valid, test, bayes, described, fitted, auto)


def _bad_row_limits(d: DataConfig) -> dict[str, Any]:
    return {"max_bad_rows": d.max_bad_rows, "max_bad_fraction": d.max_bad_fraction}


def fit_on_training(train: TabularData, setting: str, source: str) -> dict[str, Any]:
    """What the training split fits: the ids of categorical columns read by name always
    (validation and test values must not enter a vocabulary), the dense transforms where
    `wants_preprocessing`; a Criteo file's counts always the transform its models take
    (`criteo.dense_transforms`), and its ids as hex values (`criteo.hex_ids`): exports
    carry both, and serve the file's own lines."""
    fitted = fit_preprocessing(train, dense=wants_preprocessing(setting, source))
    if source.startswith("criteo:"):
        fitted["dense"] = dense_transforms()
        fitted["hex_ids"] = hex_ids(train.schema, fitted["vocabulary"])
    return fitted


def _prepare_stream(config: StudyConfig) -> StudyData:
    """The source read in chunks: split in file order, preprocessing fitted in one pass."""
    from trainers.data.stream import StreamOptions, open_stream

    d, s = config.data, config.data.stream
    options = StreamOptions(**s.model_dump(exclude={"enabled"}) | _bad_row_limits(d))
    dense = wants_preprocessing(d.preprocessing, d.source)
    # auto: file order, checked against the time column; ordered: file order as it is
    anyway = "set data.split.method: ordered" if d.split.method == "auto" else None
    data = open_stream(d.source, d.schema_path, fractions=d.split.fractions, options=options,
                       dense_preprocessing=dense, time_order=anyway,
                       time_column=d.split.column)  # fmt: skip
    parts = [data.description, describe(data.fitted), data.cache_note]
    described = "; ".join(filter(None, parts))
    return StudyData(data.train, data.valid, data.test, None, described, data.fitted, "ordered")


def study_protocol(config: StudyConfig, data: StudyData) -> dict[str, Any]:
    """What every run of a study shares, so that its runs compare: the data (the split and
    preprocessing settings, the rows and positive labels each part holds, the schema; the
    generator's settings for synthetic rows) and the training recipe. Not the device,
    threads or file paths: workers on other machines may differ in those."""
    d = config.data
    parts = (data.train, data.valid, data.test)
    split = d.split.model_dump(mode="json") | {"ties": d.split.ties or "together"}
    described = {"split": split, "seed": d.seed,
                 "preprocessing": d.preprocessing, "rows": [len(p) for p in parts],
                 "schema": data.train.schema.to_dict()}  # fmt: skip
    positives = [_positives(p) for p in parts]
    if None not in positives:  # a file rewritten in place with as many rows shows in these
        described["positives"] = positives
    if d.stream.enabled:
        described["stream"] = d.stream.model_dump(mode="json", include={"min_count", "hash_size"})
    if d.source == "synthetic" and not d.train:
        described["synthetic_rows"] = d.rows
    return {"data": described, "training": training_protocol(config)}


def _positives(part: Any) -> int | None:
    """The positive labels of a split: counted in memory, or by the pass that read a
    streamed one (None for a row cache written before they were counted)."""
    if hasattr(part, "labels"):
        return int(np.count_nonzero(part.labels))
    return getattr(part, "positives", None)


def _split_methods(protocol: dict[str, Any]) -> set[str | None]:
    return {(protocol["data"].get("split") or {}).get("method")}


def _with_split_method(protocol: dict[str, Any], method: str) -> dict[str, Any]:
    """`protocol` split by `method`: `auto` and the method it chooses on the data split
    alike."""
    split = protocol["data"].get("split") or {}
    return protocol | {"data": protocol["data"] | {"split": split | {"method": method}}}


def _with_split_column(protocol: dict[str, Any]) -> dict[str, Any]:
    """`protocol` with its split's time column named: none named splits on the schema's time
    column, as naming that column does (`column` only overrides the schema's `time`)."""
    split = protocol["data"].get("split") or {}
    time = (protocol["data"].get("schema") or {}).get("time")
    if split.get("method") not in ("auto", "time") or split.get("column") or not time:
        return protocol
    return protocol | {"data": protocol["data"] | {"split": split | {"column": time}}}


def check_protocol(study: optuna.Study, config: StudyConfig, data: StudyData) -> None:
    """Refuses to add runs to `study` under another protocol than the one it recorded
    (`study_protocol`); records it where none is (a new study, or one from before)."""
    now = study_protocol(config, data)
    recorded = study.user_attrs.get(StudyAttr.PROTOCOL)
    if recorded is None:
        study.set_user_attr(StudyAttr.PROTOCOL, now)
        return
    original, training_before = recorded, recorded.get("training", {})
    training = recorded_training(recorded, now["training"])
    if _split_methods(recorded) | _split_methods(now) == {"auto", data.auto_split}:
        recorded, now = (_with_split_method(p, data.auto_split) for p in (recorded, now))
    recorded, now = _with_split_column(recorded), _with_split_column(now)
    if "positives" not in recorded["data"] or "positives" not in now["data"]:
        now["data"].pop("positives", None)  # recorded, or cached, before they were counted
        recorded = recorded | {"data": {k: v for k, v in recorded["data"].items()
                                        if k != "positives"}}  # fmt: skip
    # a study split before the tie rule: its rows say whether the split is the same
    recorded_split = recorded["data"].get("split") or {}
    ties = now["data"]["split"].pop("ties") if "ties" not in recorded_split else None
    changes = protocol_changes(recorded | {"training": training}, now)
    changes += cluster_changes(study.user_attrs, config)  # `baseline add`'s step is predicted
    if changes:
        moved = any(c.startswith("data.rows:") for c in changes)
        why = ("" if ties != "together" or not moved or not data.split.startswith("in time")
               else " (a time split now keeps rows of one time on one side of each boundary, "
               "since 2026-12-01; `data.split.ties: file_order` splits as this study "
               "did)")  # fmt: skip
        raise other_settings(config, changes, why)
    if unrecorded := {k: now["training"][k] for k in RECORDED_SINCE if k not in training_before}:
        # held from now on: taken as today's once, not again at every resume
        study.set_user_attr(StudyAttr.PROTOCOL, original | {
            "training": training_before | unrecorded})  # fmt: skip
    _check_dense_scaling(study, config, data)


def _check_dense_scaling(study: optuna.Study, config: StudyConfig, data: StudyData) -> None:
    """Refuses a study whose recorded runs saw its dense columns scaled otherwise: its
    exports would pair those runs' weights with the new transforms. The same rows fit the
    same unless the file's values changed, or ranknas changed how it fits (since
    2026-12-07 a few values far from all others are left out of a column's scaling)."""
    recorded = (study.user_attrs.get(StudyAttr.PREPROCESSING) or {}).get("dense") or []
    now = data.preprocessing.get("dense") or []
    changed = [f"{old['column']}: mean {old['mean']:.4g} -> {new['mean']:.4g}, std "
               f"{old['std']:.4g} -> {new['std']:.4g}"
               for old, new in zip(recorded, now, strict=False) if old != new]  # fmt: skip
    if changed:
        raise RanknasError(
            f"study {config.name!r} in {redact(config.storage)} was run with its dense columns "
            f"scaled otherwise ({'; '.join(changed[:3])}): the file's values changed, or this "
            "version scales them otherwise (it leaves a few values far from all others out "
            "of a column's scaling, and gives a Criteo file's counts log(1 + x) unscaled); "
            "runs under both would not compare: give the study a new name"
        )


def wants_preprocessing(setting: str, source: str) -> bool:
    """`auto`: your CSV/Parquet files; the synthetic data is standardized by construction
    and Criteo's counts take a fixed transform (`fit_on_training`)."""
    return setting == "auto" and source != "synthetic" and not source.startswith("criteo:")


def _prepare_files(config: StudyConfig) -> StudyData:
    """Train, validation and test from three files, as the user split them; the vocabularies
    (and with `preprocessing: auto` the dense transforms) come from the training file."""
    d = config.data
    parts = [load_dataset(path, d.schema_path, **_bad_row_limits(d))
             for path in (d.train, d.valid, d.test)]  # fmt: skip
    fitted = fit_on_training(parts[0], d.preprocessing, d.train or "")
    train_part, valid, test = (apply_preprocessing(p, fitted) for p in parts)
    warn_unseen_in_test(valid, test, fitted)
    described = f"from files (train {d.train}, validation {d.valid}, test {d.test})"
    described = "; ".join(filter(None, [described, describe(fitted)]))
    return StudyData(train_part, valid, test, None, described, fitted)


def split_method(method: str, data: TabularData, source: str) -> str:
    """`auto`: random for synthetic rows (they have no order), time when the data has a time
    column, else the file's order: offline numbers should measure the future, as production
    does."""
    if method == "random" and data.time is not None:
        logging.getLogger(__name__).warning(
            "%s: a random split of rows that have a time (%s): validation and test rows come "
            "from the same times as the training rows, so their NE reads better than a model "
            "does on later rows; split method auto or time splits in time order", source,
            data.schema.time)  # fmt: skip
    if method != "auto":
        return method
    if source == "synthetic":
        return "random"
    return "time" if data.time is not None else "ordered"


def describe_split(method: str, data: TabularData, seed: int) -> str:
    return {"random": f"random (data seed {seed})", "ordered": "in file order",
            "time": f"in time order ({data.schema.time})"}[method]  # fmt: skip


@dataclass
class Costs:
    """What an architecture costs before it is trained."""

    mflops: float
    params: int
    latency_ms: float | None = None
    step: dict[str, Any] | None = None  # `cost_models.sharding.step.predict_step`, where asked for

    @property
    def step_ms(self) -> float | None:
        return None if self.step is None else self.step["step_ms"]

    def summary(self) -> dict[str, float]:
        out = {"mflops": self.mflops, "params": self.params}
        out |= {} if self.latency_ms is None else {"latency_ms": self.latency_ms}
        return out | ({} if self.step_ms is None else {"step_ms": self.step_ms})

    def objective(self, name: str) -> float | None:
        return {"mflops": self.mflops, "params": float(self.params),
                "latency_ms": self.latency_ms, "step_ms": self.step_ms}.get(name)  # fmt: skip


@dataclass(frozen=True)
class StepReference:
    """The model a step ceiling names (`max_step_ms: base | best_baseline`) and its dense
    part's time, as the ceiling was made. A candidate's dense part is that time scaled by
    the two models timed in turn (`measure_dense_step_ratio`): the ceiling and the
    candidate then compare as if timed together, whatever the machine's load did since."""

    name: str
    arch: Architecture
    dense_ms: float

    def dense_ms_of(
        self, arch: Architecture, batch_size: int, device: Any, threads: int
    ) -> tuple[float, str]:
        """`arch`'s dense part (ms) and where it came from."""
        from cost_models.latency.model import measure_dense_step_ratio

        if digest(arch) == digest(self.arch):
            return self.dense_ms, f"that of {self.name}, the same model"
        ratio = measure_dense_step_ratio(arch, self.arch, batch_size, device, threads=threads)
        return self.dense_ms * ratio, (
            f"timed in turn with {self.name} on the training device, {device}: {ratio:.3f}x "
            f"its {self.dense_ms:.3f} ms"
        )


def architecture_costs(
    arch: Architecture, config: StudyConfig, pooling_factors: dict[str, float] | None = None
) -> Costs:
    """FLOPs and params; the forward latency and the predicted step time where the study
    asks for them (`pooling_factors`: `StudyData.pooling_factors`, where known)."""
    analysis = analyze(arch)
    latency_ms = _latency_ms(arch, config) if config.objectives.needs_latency else None
    step = (
        _step(arch, analysis, config, pooling_factors)
        if config.objectives.needs_step_time
        else None
    )
    return Costs(analysis.flops / 1e6, analysis.dense_params, latency_ms, step)


def over_constraint(costs: Costs, config: StudyConfig) -> str | None:
    """Why an architecture is not trained (over a constraint of `objectives`), or None."""
    o = config.objectives
    reason = None
    if isinstance(o.max_mflops, float) and costs.mflops > o.max_mflops:
        reason = f"{costs.mflops:.4g} MFLOPs exceeds objectives.max_mflops={o.max_mflops:.4g}"
    elif o.max_params and costs.params > o.max_params:
        reason = f"{costs.params} params exceeds objectives.max_params={o.max_params}"
    elif o.max_latency_ms and costs.latency_ms is not None and costs.latency_ms > o.max_latency_ms:
        reason = (f"{costs.latency_ms:.3f} ms forward latency (batch {o.latency_batch_size}) "
                  f"exceeds objectives.max_latency_ms={o.max_latency_ms}")  # fmt: skip
    elif (
        isinstance(o.max_step_ms, float)
        and costs.step_ms is not None
        and costs.step_ms > o.max_step_ms
    ):
        reason = (f"{costs.step_ms:.3f} ms predicted training step on {costs.step['devices']} "
                  f"devices exceeds objectives.max_step_ms={o.max_step_ms:.3f}")  # fmt: skip
    return reason


def _step(
    arch: Architecture, analysis: Analysis, config: StudyConfig, pooling_factors: dict | None
) -> dict[str, Any]:
    """The predicted training step on the study's cluster (`predict_step`), each device
    with a trial's rows of one process (`per_device_batch`); its dense part predicted by
    `sharding.dense_model`, else timed on the training device: in turn with the model the
    step ceiling names, where it names one (`StepReference`)."""
    from cost_models.latency.model import measure_dense_step_ms

    t, shard, reference = config.training, config.sharding, config.step_reference
    device, batch = resolve_device(t.device), per_device_batch(config)
    if shard.dense_model is not None:
        predictor = dense_predictor(shard.dense_model, batch)
        dense_ms = float(predictor.predict([arch])[0])
        source = f"predicted by {shard.dense_model}, fitted on {predictor.device}"
    elif reference is not None:
        dense_ms, source = reference.dense_ms_of(arch, batch, device, t.threads)
    else:
        dense_ms = measure_dense_step_ms(arch, batch, device, threads=t.threads)
        source = f"measured on the training device, {device}"
    measured = read_links(shard.links) if shard.links else {}
    runtime_ms = (
        shard.runtime_ms if shard.runtime_ms is not None else measured.get("runtime_ms", 0.0)
    )
    cluster = topology(shard.devices, shard.hosts, shard.links)
    step = predict_step(arch, cluster, shard.method, sharding_model(shard), batch, dense_ms,
                        analysis.dense_params, pooling_factors, runtime_ms,
                        measured.get("dense_factor", 1.0),
                        measured.get("ms_per_pooled_mb", 0.0))  # fmt: skip
    return step | {"dense_source": source}


def sharding_model(shard: ShardingConfig) -> str:
    """`sharding.model_dir`, or the model shipped with ranknas where that is the default
    folder and none was trained there, as `ranknas shard plan` plans (method rl failed on a
    fresh clone with "no readable sharding policy")."""
    return str(model_to_use(shard.model_dir, "sharding.model_dir")[0])


def per_device_batch(config: StudyConfig) -> int:
    """The rows a device takes a step: a trial's batch, split over `training.processes`
    when it trains sharded (each of a predicted cluster's devices takes as many)."""
    return config.training.batch_size // config.training.processes


def plan_sharding(
    arch: Architecture, config: StudyConfig, directory: Path, data: StudyData, costs: Costs
) -> dict | None:
    """The embedding sharding plan of `sharding.devices` devices (none when not asked): the
    one the predicted step was made with, where `costs` has one."""
    shard = config.sharding
    if not shard.devices:
        return None
    batch = per_device_batch(config)
    cluster = topology(shard.devices, shard.hosts, shard.links)
    made = Plan.from_dict(costs.step["plan"]) if costs.step is not None else None
    plan = plan_trial_sharding(arch, cluster, shard.method, sharding_model(shard), batch,
                               data.pooling_factors, made)  # fmt: skip
    (directory / SHARDING_FILE).write_text(json.dumps(plan, indent=2))
    return plan


def record_result(
    directory: Path,
    costs: Costs,
    sharding: dict | None,
    result: TrainResult,
    model: RankingModel | None,
    runs: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """Write the weights (of a complete or diverged run) and metrics.json (with `runs`, the
    per-seed figures of a confirmed trial); returns the metrics."""
    diverged = (result.failure_reason or "").startswith("diverged")
    if model is not None and (result.status == "complete" or diverged):
        write_weights(directory, model)
    if costs.step is not None:
        (directory / STEP_FILE).write_text(json.dumps(costs.step, indent=2))
    if result.plan is not None:
        (directory / TRAINED_PLAN_FILE).write_text(json.dumps(result.plan, indent=2))
    summary = result.summary() | costs.summary() | (runs or {})
    if sharding and "predicted_embedding_step_ms" in sharding:
        summary[TrialAttr.PREDICTED_STEP_MS] = sharding["predicted_embedding_step_ms"]
    write_metrics(directory, summary)
    return summary


def _latency_ms(arch: Architecture, config: StudyConfig) -> float:
    """Forward latency at `objectives.latency_batch_size`: predicted by
    `objectives.latency_model` if set, else measured on the training device."""
    from cost_models.latency.model import measure_latency

    o, t = config.objectives, config.training
    if o.latency_model is None:
        device = resolve_device(t.device)
        return measure_latency(arch, o.latency_batch_size, device, threads=t.threads).forward_ms
    return float(latency_predictor(o.latency_model, o.latency_batch_size).predict([arch])[0])


def latency_predictor(path: str, batch_size: int) -> Any:
    """`objectives.latency_model`, loaded (and refitted) once per process."""
    return _predictor(path, batch_size, "forward_ms",
                      "objectives.latency_model", "objectives.latency_batch_size")  # fmt: skip


def dense_predictor(path: str, batch_size: int) -> Any:
    """`sharding.dense_model`, loaded (and refitted) once per process."""
    return _predictor(path, batch_size, "dense_step_ms", "sharding.dense_model",
                      "a device's batch (training.batch_size / processes)")  # fmt: skip


@functools.cache
def _predictor(path: str, batch_size: int, target: str, field: str, batch_field: str) -> Any:
    from cost_models.latency.model import LatencyPredictor

    predictor = LatencyPredictor.load(path)
    if predictor.target != target:
        raise RanknasError(
            f"{field} {path} predicts {predictor.target}, this setting takes a predictor of "
            f"{target}: fit one with `ranknas latency fit SPACE --target {target}`"
        )
    if predictor.batch_size != batch_size:
        raise RanknasError(
            f"{field} {path} was fitted at batch size {predictor.batch_size}, "
            f"{batch_field} is {batch_size}"
        )
    return predictor


def trial_train_config(
    config: StudyConfig, seed: int, recipe: dict[str, Any] | None = None
) -> TrainConfig:
    """How the study trains one trial stand-alone (its budget and `training` section);
    `recipe` (a trial's searched hyper-parameters, `nas.recipe`) overrides the section."""
    t, budget = config.training, config.budget
    if recipe:
        t = t.model_copy(update=recipe)
    return TrainConfig(
        batch_size=t.batch_size,
        max_examples=None
        if budget.epochs_per_trial
        else budget.examples_per_trial or DEFAULT_EXAMPLES,
        max_epochs=budget.epochs_per_trial,
        max_seconds=budget.trial_seconds,
        dense_optimizer=t.dense_optimizer,
        dense_lr=t.dense_lr,
        lr_schedule=t.lr_schedule,
        weight_decay=t.weight_decay,
        sparse_optimizer=t.sparse_optimizer,
        sparse_lr=t.sparse_lr,
        evals=t.evals,
        early_stopping_patience=t.early_stopping_patience,
        restore_best=t.restore_best,
        seed=seed,
        device=t.device,
        cuda_graph=t.cuda_graph,
        compile=t.compile,
    )


def train_architecture(
    arch: Architecture,
    data: StudyData,
    config: StudyConfig,
    seed: int,
    on_eval: Callable[[int, int, dict[str, float]], bool] | None = None,
    label: str = "training",
    recipe: dict[str, Any] | None = None,
) -> tuple[TrainResult, RankingModel]:
    """Train `arch` from scratch exactly as the study trains a trial, with `seed` (and the
    trial's searched `recipe`, if any); `label` names the run on its progress bar."""
    train_config = trial_train_config(config, seed, recipe)
    if config.training.processes > 1:
        return _train_sharded(arch, data, config, train_config, label)
    model = build_model(arch, seed=seed)
    result = train(model, data.train, data.valid, data.test, train_config, on_eval, label)
    return result, model


def _train_sharded(
    arch: Architecture, data: StudyData, config: StudyConfig, train_config, label: str
) -> tuple[TrainResult, RankingModel]:
    """`training.processes` > 1: trained under torchrun, its tables placed on that many
    devices (one host) by the study's sharder; no pruning (the config refuses it)."""
    from cost_models.sharding.sharders import make_sharder
    from cost_models.sharding.tables import tables_from_architecture
    from trainers.sharded import train_sharded

    processes, shard = config.training.processes, config.sharding
    tables = tables_from_architecture(arch, data.pooling_factors)
    cluster = topology(processes, None, shard.links)  # one host, its links
    plan = make_sharder(shard.method, sharding_model(shard), per_device_batch(config)).plan(
        tables, cluster
    )
    return train_sharded(arch, (data.train, data.valid, data.test), train_config, plan, label)
