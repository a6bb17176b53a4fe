"""What checking a streamed split's time order costs, beside one parsing pass of the rows.

A streamed study under `split.method: auto` reads the time column of its Parquet files
before anything else (`trainers.data.stream.check_time_order`): one pass over that column
when the files are in order, two when two splits overlap. The baseline is one pass that
parses every row (`Source.chunks`), which the fitting pass and the row cache's writing each
make. Files: one Parquet file of `--rows` rows (a label, a dense and a categorical column,
epoch seconds), written in time order and shuffled.

    .venv/bin/python bench/bench_time_order.py --rows 2000000 --repeats 5
"""

from __future__ import annotations

import argparse
import contextlib
import statistics
import tempfile
import time
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from search_space.errors import RanknasError
from trainers.data.stream import _bounds, check_time_order
from trainers.data.stream_sources import open_source

SCHEMA = "label: y\ndense: [x]\ncategorical: [c]\ntime: ts\n"


def write_log(folder: Path, rows: int, shuffled: bool) -> Path:
    rng = np.random.default_rng(0)
    times = np.arange(rows) + 1_700_000_000
    if shuffled:
        times = rng.permutation(times)
    table = pa.table({"y": rng.integers(0, 2, rows).astype(np.int8), "x": rng.normal(size=rows),
                      "c": rng.integers(0, 1000, rows).astype(str), "ts": times})  # fmt: skip
    path = folder / f"{'shuffled' if shuffled else 'ordered'}.parquet"
    pq.write_table(table, path, row_group_size=1 << 16)
    return path


def timed(run, source) -> float:
    start = time.perf_counter()
    run(source)
    return time.perf_counter() - start


def check(source) -> None:
    with contextlib.suppress(RanknasError):  # the shuffled file: refused after a second pass
        check_time_order(source, _bounds(source.rows, (0.8, 0.1, 0.1)), "ordered")


def parse(source) -> None:
    for _ in source.chunks(0, source.rows):
        pass


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=2_000_000)
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as folder:
        (Path(folder) / "s.yaml").write_text(SCHEMA)
        print("| file | check s | one parsing pass s | check / pass |")
        print("|---|---|---|---|")
        for shuffled in (False, True):
            path = write_log(Path(folder), args.rows, shuffled)
            source = open_source(path, Path(folder) / "s.yaml")
            check(source)  # warm: the file in the page cache for both
            checks = [timed(check, source) for _ in range(args.repeats)]
            passes = [timed(parse, source) for _ in range(args.repeats)]
            print(
                f"| {path.stem}, {args.rows:,} rows | {_median(checks)} | {_median(passes)} "
                f"| {statistics.median(checks) / statistics.median(passes):.2f} |"
            )


def _median(seconds: list[float]) -> str:
    """The median and half the spread, as BENCHMARKS.md writes them."""
    return f"{statistics.median(seconds):.3f} (±{(max(seconds) - min(seconds)) / 2:.3f})"


if __name__ == "__main__":
    main()
