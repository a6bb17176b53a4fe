"""Streaming a Criteo-format file bigger than memory: loader rows/s, training rows/s, the
loader's share of a training step, and peak RSS; the in-memory loader as baseline on a
size that fits.

    python bench/bench_stream.py --rows 20000000 --out /tmp/stream-bench --clear-cache
    python bench/bench_stream.py --rows 20000000 --out /tmp/stream-bench
    python bench/bench_stream.py --mode memory --rows 2000000 --out /tmp/stream-bench

Each mode runs in its own process (peak RSS is per process). The file is written by
`write_synthetic_criteo` (what `ranknas data synth --format criteo` runs) unless it exists.
Streamed, the encoded rows go to a row cache beside the file (`.ranknas-cache/`): the first
run writes it (`--clear-cache` removes an earlier one), a second run reads it; `--no-cache`
parses the file on every pass.
"""

from __future__ import annotations

import argparse
import json
import resource
import shutil
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import torch

from nas.protocol import fit_on_training
from search_space.builder import build_model
from search_space.presets import load_architecture
from trainers.data import load_criteo
from trainers.data.preprocess import apply_preprocessing
from trainers.data.stream import StreamOptions, open_stream
from trainers.data.stream_cache import default_cache_dir
from trainers.data.synthetic import write_synthetic_criteo
from trainers.trainer import TrainConfig, train


def peak_rss_gib() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20


class RssParts:
    """The largest anonymous and file-backed resident memory seen, sampled by a thread (a
    memory map's pages read would be file-backed)."""

    def __init__(self, every_s: float = 0.2) -> None:
        self.peaks = {"RssAnon": 0, "RssFile": 0}
        threading.Thread(target=self._sample, args=(every_s,), daemon=True).start()

    def _sample(self, every_s: float) -> None:
        while True:
            for line in Path("/proc/self/status").read_text().splitlines():
                key, _, value = line.partition(":")
                if key in self.peaks:
                    self.peaks[key] = max(self.peaks[key], int(value.split()[0]))
            time.sleep(every_s)

    def gib(self) -> dict[str, float]:
        return {f"peak_{k}_gib": round(v / 2**20, 2) for k, v in self.peaks.items()}


class TimedRows:
    """A split whose training loader records how long the step waited for each batch."""

    def __init__(self, rows) -> None:
        self.rows, self.waited = rows, 0.0
        self.schema, self.label_mean = rows.schema, rows.label_mean

    def __len__(self) -> int:
        return len(self.rows)

    def head(self, n: int):
        return self.rows.head(n)

    def loader(self, batch_size: int, **options):
        inner = self.rows.loader(batch_size, **options)
        timed = self

        class Loader:
            def __len__(self) -> int:
                return len(inner)

            def __iter__(self) -> Iterator:
                batches = iter(inner)
                while True:
                    started = time.perf_counter()
                    try:
                        batch = next(batches)
                    except StopIteration:
                        return
                    timed.waited += time.perf_counter() - started
                    yield batch

        return Loader()


def loader_rate(rows, batch_size: int, limit: int) -> float:
    """Rows per second of the training loader alone (shuffled batches, nothing trained)."""
    started, seen = time.perf_counter(), 0
    for batch in rows.loader(batch_size, shuffle=True, drop_last=True):
        seen += len(batch.labels)
        if seen >= limit:
            break
    return seen / (time.perf_counter() - started)


def train_rate(train_rows, valid, examples: int, batch_size: int) -> dict:
    timed = TimedRows(train_rows)
    arch = load_architecture("dlrm", train_rows.schema)
    config = TrainConfig(batch_size=batch_size, max_examples=examples, evals=2,
                         early_stopping_patience=0, restore_best=False)  # fmt: skip
    started = time.perf_counter()
    result = train(build_model(arch, seed=0), timed, valid, None, config)
    return {
        "status": result.status,
        "val_ne": round(result.validation.get("ne", float("nan")), 4),
        "train_rows_per_s": round(result.throughput),
        "loader_share_of_step": round(timed.waited / result.train_seconds, 4),
        "train_seconds": round(result.train_seconds, 1),
        "run_seconds_with_evaluation": round(time.perf_counter() - started, 1),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--rows", type=int, default=20_000_000)
    parser.add_argument("--out", default="/tmp/ranknas-stream-bench")
    parser.add_argument("--mode", choices=["stream", "memory"], default="stream")
    parser.add_argument("--loader-rows", type=int, default=4_000_000)
    parser.add_argument("--train-examples", type=int, default=1_000_000)
    parser.add_argument("--batch-size", type=int, default=512)
    parser.add_argument("--min-count", type=int, default=10)
    parser.add_argument("--no-cache", action="store_true", help="stream: no row cache")
    parser.add_argument("--clear-cache", action="store_true", help="stream: write it anew")
    args = parser.parse_args()
    torch.set_num_threads(1)
    rss_parts = RssParts()
    path = Path(args.out) / f"criteo-{args.rows}.tsv"
    report: dict = {"mode": args.mode, "rows": args.rows, "file": str(path)}
    if not path.exists():
        started = time.perf_counter()
        write_synthetic_criteo(path, args.rows)
        report["write_seconds"] = round(time.perf_counter() - started, 1)
    report["file_gib"] = round(path.stat().st_size / 2**30, 2)
    started = time.perf_counter()
    if args.mode == "stream":
        if args.clear_cache:
            for cache in default_cache_dir(path).glob(f"{path.name}-*"):
                shutil.rmtree(cache)
        options = StreamOptions(min_count=args.min_count, cache=not args.no_cache)
        data = open_stream(f"criteo:{path}", options=options)
        train_rows, valid = data.train, data.valid
        opened = time.perf_counter() - started
        report["open_seconds"] = round(opened, 1)
        report["open_rows_per_s"] = round(len(data.train) / opened)
        report["row_cache"] = data.cache_note or "none"
    else:
        parts = load_criteo(path, min_count=args.min_count, use_cache=False).split(method="ordered")
        fitted = fit_on_training(parts[0], "auto", f"criteo:{path}")  # as a study fits it
        train_rows, valid, _ = (apply_preprocessing(part, fitted) for part in parts)
        report["load_seconds"] = round(time.perf_counter() - started, 1)
    report["peak_rss_gib_after_open"] = round(peak_rss_gib(), 2)
    report["train_rows"], report["valid_rows"] = len(train_rows), len(valid)
    limit = min(args.loader_rows, len(train_rows))
    report["loader_rows_per_s"] = round(loader_rate(train_rows, args.batch_size, limit))
    report["peak_rss_gib_after_loader"] = round(peak_rss_gib(), 2)
    report |= train_rate(train_rows, valid, args.train_examples, args.batch_size)
    report["peak_rss_gib"] = round(peak_rss_gib(), 2)
    report |= rss_parts.gib()
    print(json.dumps(report, indent=2), flush=True)


if __name__ == "__main__":
    main()
