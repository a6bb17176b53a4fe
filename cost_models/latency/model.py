"""Architecture latency: measured on a device, and predicted from an architecture encoding.

`measure_latency` times a built `RankingModel` at a batch size: the forward pass (eval mode,
no grad), a training step (forward + backward of the BCE loss) and, when asked, the dense
part's training step alone (what a sharded study's predicted step takes from it), as medians
over repeats after warm-ups. On a CPU with one torch thread the clock is that thread's CPU
time, blind to other processes taking the core; otherwise it is wall time, CUDA synchronized.

`LatencyPredictor` is a gradient-boosted regressor on log latency over `arch_features`
(exact FLOPs and params, per-op block counts and FLOPs, depth, activation sizes). It is
saved as JSON holding its training measurements and refit on load: no pickle, and with a
fixed random state the reloaded predictor predicts exactly what the saved one did.
`FlopsBaseline` (a line through log latency vs log FLOPs) is what it has to beat.
"""

from __future__ import annotations

import json
import random
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from sklearn.ensemble import GradientBoostingRegressor

from cost_models.sharding.cost_net import errors
from cost_models.sharding.measure import device_name, torch_threads
from search_space.architecture import Analysis, Architecture, analyze, digest
from search_space.blocks import OPS
from search_space.builder import build_model, example_batch
from search_space.errors import RanknasError
from search_space.files import looked_for
from search_space.spaces import SearchSpace

FORMAT_VERSION = 1
TIMED_ROWS = 1000  # rows of each table in a model built to time its dense part
FILE_KIND = "ranknas latency predictor"
REGRESSOR_PARAMS = {
    "n_estimators": 300,
    "learning_rate": 0.05,
    "max_depth": 3,
    "subsample": 0.8,
    "random_state": 0,
}


# ---------------------------------------------------------------------- measurement


# What a predictor can be fitted to (`Latency`'s fields), and what each one is.
TARGETS = {
    "forward_ms": "forward latency",
    "train_step_ms": "training step",
    "dense_step_ms": "the dense part's training step",
}


@dataclass(frozen=True)
class Latency:
    forward_ms: float
    train_step_ms: float
    batch_size: int
    device: str
    dense_step_ms: float | None = None  # measured with `dense=True`


def measure_latency(
    arch: Architecture,
    batch_size: int = 512,
    device: str | torch.device = "cpu",
    warmup: int = 3,
    repeats: int = 15,
    threads: int = 1,
    dense: bool = False,
) -> Latency:
    """Median forward and training-step time (ms) of the built `arch` on `device`, and with
    `dense` its dense part's step (`measure_dense_step_ms`)."""
    device = torch.device(device)
    with torch_threads(threads):
        model, dense_x, sparse, labels = _example(arch, batch_size, device)

        def train_step() -> None:
            model.zero_grad(set_to_none=True)
            F.binary_cross_entropy_with_logits(model(dense_x, sparse), labels).backward()

        model.eval()
        with torch.no_grad():
            forward_ms = _median_ms(lambda: model(dense_x, sparse), device, warmup, repeats)
        model.train()
        train_ms = _median_ms(train_step, device, warmup, repeats)
        dense_ms = None
        if dense:
            (step,) = _dense_steps([arch], batch_size, device)
            dense_ms = _median_ms(step, device, warmup, repeats)
    return Latency(forward_ms, train_ms, batch_size, _device_label(device, threads), dense_ms)


def measure_dense_step_ms(
    arch: Architecture,
    batch_size: int = 512,
    device: str | torch.device = "cpu",
    warmup: int = 3,
    repeats: int = 15,
    threads: int = 1,
) -> float:
    """Median training step (ms) of `arch`'s dense part alone: its blocks and head, forward
    and backward, from given pooled embeddings, as a data-parallel device runs it while the
    embedding lookups are the sharded tables' (the sharding cost model's) part."""
    device = torch.device(device)
    with torch_threads(threads):
        (step,) = _dense_steps([arch], batch_size, device)
        return _median_ms(step, device, warmup, repeats)


def measure_dense_step_ratio(
    arch: Architecture,
    reference: Architecture,
    batch_size: int = 512,
    device: str | torch.device = "cpu",
    warmup: int = 3,
    repeats: int = 45,
    threads: int = 1,
) -> float:
    """`arch`'s dense step over `reference`'s: one step of each in turn, `repeats` times,
    the ratio of their medians. Both see the same moments of the machine's load; timed one
    after the other, even two copies of one model differed by up to 15% on a shared CPU."""
    device = torch.device(device)
    with torch_threads(threads):
        steps = _dense_steps([arch, reference], batch_size, device)
        timed, timed_reference = _times_ms(steps, device, warmup, repeats)
    return float(np.median(timed) / np.median(timed_reference))


def _dense_steps(
    archs: Sequence[Architecture], batch_size: int, device: torch.device
) -> list[Callable[[], None]]:
    """The dense part's training step of each built architecture (`_dense_step`)."""
    steps = []
    for arch in archs:
        model, dense, sparse, labels = _example(arch, batch_size, device, small_tables=True)
        model.train()
        steps.append(_dense_step(model, dense, sparse, labels))
    return steps


def _dense_step(model, dense: torch.Tensor, sparse, labels: torch.Tensor) -> Callable[[], None]:
    """One training step of `model`'s dense part from its pooled embeddings, fixed once."""
    pooled = None
    if model.feature_names:
        with torch.no_grad():
            pooled = model.embed(sparse)
        pooled.requires_grad_(True)

    def step() -> None:
        model.zero_grad(set_to_none=True)
        F.binary_cross_entropy_with_logits(model.interact(dense, pooled), labels).backward()

    return step


def _example(arch: Architecture, batch_size: int, device: torch.device, small_tables: bool = False):
    """The built model (seed 0) and a batch of `example_batch` with labels, on `device`;
    `small_tables`: each table cut to `TIMED_ROWS` rows, for the dense part's step alone,
    which meets pooled embeddings of the same shape from any table (a production table, 10^9
    rows and tens of GB, was allocated, or failed to be, only to be timed around)."""
    if small_tables:
        small = tuple(replace(f, num_embeddings=min(f.num_embeddings, TIMED_ROWS))
                      for f in arch.embedding.features)  # fmt: skip
        arch = replace(arch, embedding=replace(arch.embedding, features=small))
    model = build_model(arch, seed=0, device=device)
    dense, sparse = example_batch(arch, batch_size)
    labels = torch.randint(0, 2, (batch_size,), generator=torch.Generator().manual_seed(0))
    return model, dense.to(device), sparse.to(device), labels.float().to(device)


def _median_ms(run: Callable[[], Any], device: torch.device, warmup: int, repeats: int) -> float:
    return float(np.median(_times_ms([run], device, warmup, repeats)[0]))


def _times_ms(
    runs: Sequence[Callable[[], Any]], device: torch.device, warmup: int, repeats: int
) -> list[list[float]]:
    """Each run's times (ms), the runs taken in turn `repeats` times after `warmup` each."""
    on_cpu_thread = device.type == "cpu" and torch.get_num_threads() == 1
    clock = time.thread_time if on_cpu_thread else time.perf_counter
    for _ in range(warmup):
        for run in runs:
            run()
    times: list[list[float]] = [[] for _ in runs]
    for _ in range(repeats):
        for run, timed in zip(runs, times, strict=True):
            _synchronize(device)
            start = clock()
            run()
            _synchronize(device)
            timed.append((clock() - start) * 1e3)
    return times


def _synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _device_label(device: torch.device, threads: int) -> str:
    if device.type == "cuda":
        return f"cuda {torch.cuda.get_device_name(device)}"
    return device_name(threads)


def collect(
    space: SearchSpace,
    count: int,
    seed: int = 0,
    progress: Callable[[int, int], None] | None = None,
    **measure_options: Any,
) -> list[tuple[Architecture, Latency]]:
    """Measure `count` distinct architectures sampled from `space` (fewer if the space runs
    out of new ones); `progress(done, count)` is called after each measurement."""
    rng, seen, measured = random.Random(seed), set(), []
    for _ in range(50 * count):
        if len(measured) == count:
            break
        arch = space.sample(rng)
        key = digest(arch)
        if key in seen:
            continue
        seen.add(key)
        measured.append((arch, measure_latency(arch, **measure_options)))
        if progress is not None:
            progress(len(measured), count)
    return measured


# ---------------------------------------------------------------------- encoding


def arch_features(arch: Architecture) -> tuple[list[str], np.ndarray]:
    """Named numeric features of a bound architecture, the same names for every one."""
    analysis = analyze(arch)
    emb = arch.embedding
    ops = {name: arch.block(name).op for name in analysis.order}
    features: dict[str, float] = {
        "flops": analysis.flops,
        "dense_params": analysis.dense_params,
        "embedding_params": analysis.embedding_params,
        "blocks": len(analysis.order),
        "depth": _depth(analysis),
        "activations": sum(analysis.shapes[name].numel for name in analysis.order),
        "merged_inputs": sum(_numel(analysis.input_shapes[name]) for name in analysis.order),
        "merge_projections": len(analysis.projections),
        "head_inputs": analysis.shapes[arch.output_block].numel,
        "num_dense": arch.num_dense or 0,
        "embedding_dim": emb.dim,
        "embedding_features": len(emb.used),
        "embedding_width": sum(emb.feature_dim(f) for f in emb.used),
        "projected_features": sum(emb.feature_dim(f) != emb.dim for f in emb.used),
    }
    for op in OPS:
        features[f"{op}_blocks"] = sum(o == op for o in ops.values())
        features[f"{op}_flops"] = sum(analysis.block_flops[n] for n, o in ops.items() if o == op)
    return list(features), np.array(list(features.values()), dtype=np.float64)


def _depth(analysis: Analysis) -> int:
    """Blocks on the longest path from the raw inputs to the output."""
    depth: dict[str, int] = {}
    for name in analysis.order:
        inputs = analysis.arch.block(name).inputs
        depth[name] = 1 + max((depth.get(source, 0) for source in inputs), default=0)
    return depth[analysis.arch.output_block]


def _numel(shape: Any) -> int:
    return sum(s.numel for s in shape) if isinstance(shape, tuple) else shape.numel


def feature_matrix(archs: Sequence[Architecture]) -> tuple[list[str], np.ndarray]:
    """The features of several architectures, one row each."""
    encoded = [arch_features(arch) for arch in archs]
    if not encoded:
        raise ValueError("no architectures to encode")
    return encoded[0][0], np.stack([values for _, values in encoded])


# ---------------------------------------------------------------------- predictors


class LatencyPredictor:
    """Gradient-boosted trees on log latency over `arch_features`."""

    def __init__(self, batch_size: int = 512, device: str = "", target: str = "forward_ms") -> None:
        self.batch_size, self.device, self.target = batch_size, device, target
        self.source = "latency predictor"  # named in errors; the file once loaded
        self.schema: dict[str, Any] | None = None  # the data's its architectures were sized by
        self.feature_names: list[str] = []
        self.features = np.empty((0, 0))
        self.latencies = np.empty(0)
        self.params = dict(REGRESSOR_PARAMS)  # only what differs from sklearn's defaults
        self.regressor = GradientBoostingRegressor(**self.params)

    def fit(self, archs: Sequence[Architecture], latencies: Sequence[float]) -> LatencyPredictor:
        names, features = feature_matrix(archs)
        return self._fit(names, features, np.asarray(latencies, dtype=np.float64))

    def _fit(
        self, names: list[str], features: np.ndarray, latencies: np.ndarray
    ) -> LatencyPredictor:
        self.feature_names, self.features, self.latencies = names, features, latencies
        self.regressor.fit(features, np.log(latencies))
        return self

    def predict(self, archs: Sequence[Architecture]) -> np.ndarray:
        names, features = feature_matrix(archs)
        if names != self.feature_names:
            differ = sorted(set(self.feature_names) ^ set(names)) or ["(order)"]
            raise RanknasError(
                f"{self.source}: fitted on other architecture features than this version "
                f"computes (differ: {', '.join(differ)}); refit it with `ranknas latency fit`"
            )
        return np.exp(self.regressor.predict(features))

    def evaluate(
        self, archs: Sequence[Architecture], measured: Sequence[float]
    ) -> dict[str, float]:
        """MAPE (%) and Kendall's tau of the predictions against `measured`."""
        return errors(self.predict(archs), measured)

    def to_dict(self) -> dict[str, Any]:
        return {
            "kind": FILE_KIND,
            "format_version": FORMAT_VERSION,
            "target": self.target,
            "device": self.device,
            "batch_size": self.batch_size,
            "regressor": {"type": "GradientBoostingRegressor", "params": self.params},
            "feature_names": self.feature_names,
            "features": self.features.tolist(),
            "latencies_ms": self.latencies.tolist(),
        } | ({"schema": self.schema} if self.schema else {})

    def save(self, path: str | Path) -> None:
        Path(path).parent.mkdir(parents=True, exist_ok=True)
        Path(path).write_text(json.dumps(self.to_dict()))

    @classmethod
    def load(cls, path: str | Path) -> LatencyPredictor:
        """Read a saved predictor and refit it on its stored measurements."""
        data = _read_predictor_file(Path(path))
        predictor = cls(data["batch_size"], data["device"], data["target"])
        predictor.source = str(path)
        predictor.schema = data.get("schema") if isinstance(data.get("schema"), dict) else None
        features = np.asarray(data["features"], dtype=np.float64)
        try:
            predictor.params = data["regressor"]["params"]
            predictor.regressor = GradientBoostingRegressor(**predictor.params)
            return predictor._fit(data["feature_names"], features, np.array(data["latencies_ms"]))
        except (TypeError, ValueError) as exc:
            raise RanknasError(f"{path}: cannot refit from 'regressor.params' ({exc})") from None


def _read_predictor_file(path: Path) -> dict[str, Any]:
    try:
        data = json.loads(path.read_text())
    except OSError as exc:
        raise RanknasError(f"{path}: cannot read the latency predictor ({exc.strerror})"
                           f"{looked_for(path, exc)}") from None  # fmt: skip
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise RanknasError(f"{path}: not a latency predictor JSON file ({exc})") from None
    if not isinstance(data, dict) or data.get("kind") != FILE_KIND:
        raise RanknasError(f"{path}: not a latency predictor (kind is not {FILE_KIND!r})")
    if data.get("format_version") != FORMAT_VERSION:
        raise RanknasError(
            f"{path}: format_version {data.get('format_version')!r}, this ranknas reads "
            f"{FORMAT_VERSION}; refit it with `ranknas latency fit`"
        )
    for field, kind in (("target", str), ("device", str), ("batch_size", int),
                        ("regressor", dict), ("feature_names", list), ("features", list),
                        ("latencies_ms", list)):  # fmt: skip
        if not isinstance(data.get(field), kind):
            raise RanknasError(f"{path}: field {field!r} is missing or not a {kind.__name__}")
    if data["target"] not in TARGETS:
        raise RanknasError(f"{path}: target {data['target']!r} is not one of {', '.join(TARGETS)}")
    _check_measurements(path, data)
    return data


def _check_measurements(path: Path, data: dict[str, Any]) -> None:
    width, rows = len(data["feature_names"]), data["features"]
    if not rows or len(rows) != len(data["latencies_ms"]):
        raise RanknasError(f"{path}: 'features' and 'latencies_ms' must be non-empty, same length")
    for index, row in enumerate(rows):
        if not isinstance(row, list) or len(row) != width:
            raise RanknasError(f"{path}: features[{index}] must hold {width} numbers")
    if not all(isinstance(v, int | float) and v > 0 for v in data["latencies_ms"]):
        raise RanknasError(f"{path}: 'latencies_ms' must be positive numbers")
    if not isinstance(data["regressor"].get("params"), dict):
        raise RanknasError(f"{path}: field 'regressor.params' is missing or not a mapping")


class FlopsBaseline:
    """log latency = a + b * log FLOPs, fitted by least squares."""

    def fit(self, archs: Sequence[Architecture], latencies: Sequence[float]) -> FlopsBaseline:
        self.slope, self.intercept = np.polyfit(_log_flops(archs), np.log(latencies), 1)
        return self

    def predict(self, archs: Sequence[Architecture]) -> np.ndarray:
        return np.exp(self.intercept + self.slope * _log_flops(archs))

    def evaluate(
        self, archs: Sequence[Architecture], measured: Sequence[float]
    ) -> dict[str, float]:
        return errors(self.predict(archs), measured)


def _log_flops(archs: Sequence[Architecture]) -> np.ndarray:
    return np.log([max(analyze(arch).flops, 1) for arch in archs])


def holdout_split(count: int, holdout: float, seed: int) -> tuple[list[int], list[int]]:
    """Shuffled (train, test) indices with `holdout` of them, at least 2, in the test set."""
    order = list(range(count))
    random.Random(seed).shuffle(order)
    test = max(2, round(holdout * count))
    return sorted(order[test:]), sorted(order[:test])
