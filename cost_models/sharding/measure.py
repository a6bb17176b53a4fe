"""Microbenchmarks: forward + backward time of one device's set of tables on the real kernel.

The kernel is the one a sharded torchrec run uses on CPU: fbgemm's fused
`SplitTableBatchedEmbeddingBagsCodegen` with every table in host memory (EXACT_SGD, so the
backward pass applies the update as in training). Where fbgemm does not load, the
fallback is one `nn.EmbeddingBag` per table; `Measurer.kernel` says which ran.

Weights are written (every page touched) before timing, and every repeat reads a fresh
batch drawn from each table's Zipf id distribution at `batch_size` examples (bag sizes
average the table's pooling factor), so caches hold what a training step would.

A device is a dedicated core, but this machine is shared, so two corrections: time is the
CPU time of the one thread that runs the kernel (`time.thread_time`, blind to other
processes taking the core), and every repeat runs right after a fixed reference kernel
and is scaled by the reference's time then against its time on a quiet machine. That
takes out what the thread's CPU time still sees (a busy sibling hyperthread, a host
stealing the virtual CPU, other processes' cache traffic). After warm-ups, the timed
repeats are reduced with a trimmed mean (extremes dropped); asking for several samples
re-runs the whole benchmark (fresh kernel and inputs) and keeps the median. Results are
cached on disk per device, keyed by device name, kernel, batch size and the table set,
with the reference's quiet time, so that a cache stays in one unit.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import json
import os
import platform
import re
import tempfile
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import ParamSpec, TypeVar

import numpy as np
import torch
from scipy.stats import trim_mean
from torch import nn

from cost_models.sharding.tables import TableSpec, zipf_indices
from cost_models.sharding.topology import GIB
from search_space.errors import RanknasError

P = ParamSpec("P")
R = TypeVar("R")
FBGEMM = "fbgemm SplitTableBatchedEmbeddingBagsCodegen (CPU, host memory, EXACT_SGD)"
EMBEDDING_BAG = "torch nn.EmbeddingBag, one per table"
CACHE_FORMAT = 7  # entries: key -> list of [forward_ms, backward_ms] samples
# The reference kernel timed next to every measurement (see `Measurer._time`): small enough
# (125 KiB) that what the measured tables did to the caches cannot change its time.
REFERENCE = (TableSpec("reference", 1_000, 32, 2.0),)
# of the memory the machine has available: a device's tables, timed, may take this much
HOST_MEMORY_SHARE = 0.8


@dataclass(frozen=True)
class MeasureConfig:
    batch_size: int = 512
    warmup: int = 3
    repeats: int = 10
    trim: float = 0.2  # share of the repeats dropped at each end
    threads: int = 1
    seed: int = 0


@dataclass(frozen=True)
class KernelTime:
    forward_ms: float
    backward_ms: float

    @property
    def total_ms(self) -> float:
        return self.forward_ms + self.backward_ms


@contextlib.contextmanager
def torch_threads(count: int) -> Iterator[None]:
    """Run the block with `count` intra-op threads. Small ops on one thread are faster, and
    much faster when other processes keep the cores busy (OpenMP threads then spin)."""
    before = torch.get_num_threads()
    torch.set_num_threads(count)
    try:
        yield
    finally:
        torch.set_num_threads(before)


@contextlib.contextmanager
def _autograd() -> Iterator[None]:
    """Gradients on, also when a caller plans under `torch.inference_mode` or `no_grad`:
    the timed backward pass needs them."""
    with torch.inference_mode(False), torch.enable_grad():
        yield


def single_threaded(fn: Callable[P, R]) -> Callable[P, R]:
    """Decorate a function that runs many small torch ops: it runs on one thread."""

    @functools.wraps(fn)
    def wrapper(*args: P.args, **kwargs: P.kwargs) -> R:
        with torch_threads(1):
            return fn(*args, **kwargs)

    return wrapper


@functools.cache
def available_kernel() -> str:
    """`FBGEMM` if its CPU kernel runs forward and backward here, else `EMBEDDING_BAG`."""
    try:
        module = _fbgemm_module([TableSpec("probe", 8, 4)])
        out = module(torch.tensor([1, 2]), torch.tensor([0, 1, 2]))
        out.sum().backward()
    except Exception:  # any failure to load or run means: use the fallback
        return EMBEDDING_BAG
    return FBGEMM


def device_name(threads: int) -> str:
    """The CPU model (from /proc/cpuinfo where there is one) and the thread count."""
    model = platform.processor() or platform.machine()
    cpuinfo = Path("/proc/cpuinfo")
    if cpuinfo.exists():
        found = re.search(r"^model name\s*:\s*(.+)$", cpuinfo.read_text(), re.MULTILINE)
        model = found.group(1).strip() if found else model
    return f"cpu {model} x{threads} threads"


class Measurer:
    """Times table sets on this machine's CPU; `cache_dir=None` keeps results in memory."""

    def __init__(
        self,
        config: MeasureConfig | None = None,
        cache_dir: str | Path | None = None,
        kernel: str | None = None,
    ) -> None:
        self.config = config or MeasureConfig()
        self.kernel = kernel or available_kernel()
        self.device = device_name(self.config.threads)
        slug = re.sub(r"[^A-Za-z0-9]+", "-", self.device).strip("-")
        self.cache_path = Path(cache_dir) / f"{slug}.json" if cache_dir else None
        self._cache = self._load_cache()
        self._dirty = False
        self.timed = 0  # table sets timed by this measurer (not read from its cache)
        self._reference: tuple[nn.Module, list[tuple[torch.Tensor, torch.Tensor]]] | None = None
        self._reference_ms = self._load_file().get("reference_ms")

    @property
    def reference_ms(self) -> float:
        """The reference kernel's time on this machine when it is least loaded (its fastest
        median over a few runs); every measurement is expressed at that speed."""
        if self._reference_ms is None:
            runs = [np.median(self._time_reference(30)) for _ in range(5)]
            self._reference_ms = float(min(runs)) * 1e3
        return self._reference_ms

    def measure(self, tables: Sequence[TableSpec], samples: int = 1) -> KernelTime:
        """Forward and backward ms of `tables` as one device's kernel call (0 for none): the
        median of at least `samples` independent timings (each a trimmed mean of repeats)."""
        if not tables:
            return KernelTime(0.0, 0.0)
        stored = self._cache.setdefault(self._key(tables), [])
        while len(stored) < samples:
            stored.append(self._time(tables, len(stored)))
            self._dirty = True
            self.timed += 1
        forward, backward = np.median(np.asarray(stored), axis=0)
        return KernelTime(float(forward), float(backward))

    def missing(self, tables: Sequence[TableSpec], samples: int) -> bool:
        """Whether `measure(tables, samples)` would time `tables` (not all from the cache)."""
        return bool(tables) and len(self._cache.get(self._key(tables), [])) < samples

    def timings(self, tables: Sequence[TableSpec], samples: int) -> list[KernelTime]:
        """`samples` independent timings of `tables` (taking what is missing), unreduced:
        their spread is the measurement noise."""
        self.measure(tables, samples)
        stored = self._cache[self._key(tables)][:samples]
        return [KernelTime(float(f), float(b)) for f, b in stored]

    def measure_many(
        self, table_sets: Sequence[Sequence[TableSpec]], samples: int = 1
    ) -> list[KernelTime]:
        results = [self.measure(tables, samples) for tables in table_sets]
        self.save()
        return results

    def save(self) -> None:
        if self.cache_path is None or not self._dirty:
            return
        self.cache_path.parent.mkdir(parents=True, exist_ok=True)
        entries = self._load_cache() | self._cache  # keep what other processes added
        data = {
            "format": CACHE_FORMAT,
            "device": self.device,
            "reference_ms": self.reference_ms,
            "entries": entries,
        }
        fd, tmp = tempfile.mkstemp(dir=self.cache_path.parent, suffix=".tmp")
        with os.fdopen(fd, "w") as f:
            json.dump(data, f)
        os.replace(tmp, self.cache_path)
        self._dirty = False

    # ------------------------------------------------------------------ internals

    def _key(self, tables: Sequence[TableSpec]) -> str:
        c = self.config
        signature = [self.device, self.kernel, c.batch_size, sorted(t.signature for t in tables)]
        return hashlib.sha1(json.dumps(signature).encode()).hexdigest()

    def _load_file(self) -> dict:
        if self.cache_path is None or not self.cache_path.exists():
            return {}
        try:
            data = json.loads(self.cache_path.read_text())
        except (json.JSONDecodeError, OSError):
            return {}  # a cache is disposable: start a fresh one
        return data if data.get("format") == CACHE_FORMAT else {}

    def _load_cache(self) -> dict[str, list[list[float]]]:
        return self._load_file().get("entries", {})

    def _time(self, tables: Sequence[TableSpec], sample: int) -> list[float]:
        """Forward and backward ms, each repeat right after a run of the reference kernel:
        the ratio to the reference's time then takes out how loaded the machine was."""
        check_host_memory([tables])
        c = self.config
        nominal = self.reference_ms / 1e3
        with torch_threads(c.threads), _autograd():
            rng = np.random.default_rng([c.seed, len(tables), sample])
            batches = [_inputs(tables, c.batch_size, rng) for _ in range(c.warmup + c.repeats)]
            module = self._module(tables)
            forward, backward, reference = [], [], []
            for ids, offsets in batches:
                reference += self._time_reference(1)
                start = time.thread_time()
                out = module(ids, offsets)
                mid = time.thread_time()
                out.backward(torch.ones_like(out))
                end = time.thread_time()
                forward.append(mid - start)
                backward.append(end - mid)
        timed = slice(c.warmup, None)
        scale = nominal / float(np.median(reference[timed])) * 1e3
        return [
            float(trim_mean(forward[timed], c.trim)) * scale,
            float(trim_mean(backward[timed], c.trim)) * scale,
        ]

    def _module(self, tables: Sequence[TableSpec]) -> nn.Module:
        return _fbgemm_module(tables) if self.kernel == FBGEMM else _EmbeddingBags(tables)

    def _time_reference(self, runs: int) -> list[float]:
        """Seconds of `runs` forward + backward passes of the reference kernel, each after
        an untimed one that brings its weights back into the caches."""
        times = []
        with torch_threads(self.config.threads), _autograd():
            if self._reference is None:
                rng = np.random.default_rng(0)
                batches = [_inputs(REFERENCE, self.config.batch_size, rng) for _ in range(4)]
                self._reference = (self._module(REFERENCE), batches)
            module, batches = self._reference
            for i in range(runs):
                module(*batches[i % len(batches)]).sum().backward()
                start = time.thread_time()
                out = module(*batches[(i + 1) % len(batches)])
                out.backward(torch.ones_like(out))
                times.append(time.thread_time() - start)
        return times


def _inputs(
    tables: Sequence[TableSpec], batch_size: int, rng: np.random.Generator
) -> tuple[torch.Tensor, torch.Tensor]:
    """One batch: table-major ids and offsets (fbgemm's layout), bag sizes averaging each
    table's pooling factor."""
    ids, lengths = [], []
    for t in tables:
        base, frac = divmod(t.pooling_factor, 1.0)
        bag = (base + (rng.random(batch_size) < frac)).astype(np.int64)
        ids.append(zipf_indices(t.num_embeddings, t.zipf_alpha, int(bag.sum()), rng))
        lengths.append(bag)
    offsets = np.concatenate([[0], np.cumsum(np.concatenate(lengths))])
    return torch.from_numpy(np.concatenate(ids)), torch.from_numpy(offsets)


def check_host_memory(table_sets: Sequence[Sequence[TableSpec]]) -> None:
    """Refuse, before any is built, table sets too large to time here: a device's tables
    are timed whole, in this machine's memory, as a sharded run on the CPU holds them (a
    50M-row table asked for 24 GiB and died in the allocator, or took the machine)."""
    available = _available_memory_bytes()
    largest = max(table_sets, key=lambda ts: sum(t.size_bytes for t in ts), default=[])
    need = sum(t.size_bytes for t in largest)
    if available is None or need <= HOST_MEMORY_SHARE * available:
        return
    names = ", ".join(t.name for t in largest[:5]) + (" ..." if len(largest) > 5 else "")
    raise RanknasError(
        f"timing a device's tables builds them in this machine's memory: one device's "
        f"({names}) take {need / GIB:.2f} GiB, more than the {HOST_MEMORY_SHARE:.0%} of the "
        f"{available / GIB:.2f} GiB available here it may take; time them on a machine with "
        "more memory, or plan without timing (`ranknas shard plan` without --measure predicts "
        "with the cost model)"
    )


def _available_memory_bytes() -> int | None:
    """The memory the kernel says new allocations can take (MemAvailable); None where it
    does not say (not Linux)."""
    try:
        with open("/proc/meminfo") as meminfo:
            for line in meminfo:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        return None
    return None


def _fbgemm_module(tables: Sequence[TableSpec]) -> nn.Module:
    from fbgemm_gpu.split_embedding_configs import EmbOptimType, SparseType
    from fbgemm_gpu.split_table_batched_embeddings_ops_common import EmbeddingLocation
    from fbgemm_gpu.split_table_batched_embeddings_ops_training import (
        ComputeDevice,
        SplitTableBatchedEmbeddingBagsCodegen,
    )

    precision = {"fp32": SparseType.FP32, "fp16": SparseType.FP16}[tables[0].dtype]
    if any(t.dtype != tables[0].dtype for t in tables):
        precision = SparseType.FP32  # one fused kernel holds one weight dtype
    specs = [
        (t.num_embeddings, t.embedding_dim, EmbeddingLocation.HOST, ComputeDevice.CPU)
        for t in tables
    ]
    module = SplitTableBatchedEmbeddingBagsCodegen(
        specs, optimizer=EmbOptimType.EXACT_SGD, learning_rate=0.01, weights_precision=precision
    )
    with torch.no_grad():  # initialize, as training would: no page is first touched while timed
        for weights in module.split_embedding_weights():
            weights.fill_(0.01)
    return module


class _EmbeddingBags(nn.Module):
    """The fallback kernel: one summing `nn.EmbeddingBag` per table, outputs concatenated."""

    def __init__(self, tables: Sequence[TableSpec]) -> None:
        super().__init__()
        self.bags = nn.ModuleList(
            nn.EmbeddingBag(t.num_embeddings, t.embedding_dim, mode="sum") for t in tables
        )

    def forward(self, ids: torch.Tensor, offsets: torch.Tensor) -> torch.Tensor:
        batch = (len(offsets) - 1) // len(self.bags)
        outputs = []
        for k, bag in enumerate(self.bags):
            bounds = offsets[k * batch : (k + 1) * batch + 1]
            outputs.append(bag(ids[bounds[0] : bounds[-1]], bounds[:-1] - bounds[0]))
        return torch.cat(outputs, dim=1)
