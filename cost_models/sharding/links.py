"""This machine's links as a `Topology` sees them: latency and bandwidth of the collectives a
sharded step runs (all-to-all and all-reduce), measured with torch.distributed on local
processes (gloo on CPU, nccl on GPUs).

    torchrun --nproc_per_node 2 -m cost_models.sharding.links --out links.json

`Topology`'s defaults are torchrec's planner constants for NVLink-class links; on a CPU
machine whose processes talk through gloo over loopback a collective costs milliseconds,
and a prediction of its sharded step must use what this measures (`measured_topology`).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import tempfile
import time
from pathlib import Path

import torch
import torch.distributed as dist

from cost_models.sharding.topology import Topology
from cost_models.sharding.torchrun import process_group, torchrun
from search_space.errors import RanknasError

SMALL, LARGE = 8, 1 << 20  # float32 elements per rank: latency, then bandwidth


def _median_ms(run, repeats: int = 20, warmup: int = 3) -> float:
    times = []
    for i in range(warmup + repeats):
        dist.barrier()
        started = time.perf_counter()
        run()
        if i >= warmup:
            times.append(1e3 * (time.perf_counter() - started))
    return statistics.median(times)


def measure() -> dict[str, float]:
    """On every rank: each collective's median time for a tiny and a 4 MB buffer, and the
    latency and bandwidth (bytes per ms that leave a rank) they imply."""
    world = dist.get_world_size()
    out: dict[str, float] = {"processes": world}
    for name in ("all_to_all", "all_reduce"):
        ms = {}
        for size in (SMALL, LARGE):
            buffer, result = torch.ones(size), torch.empty(size)
            if name == "all_to_all":
                ms[size] = _median_ms(lambda b=buffer, r=result: dist.all_to_all_single(r, b))
            else:
                ms[size] = _median_ms(lambda b=buffer: dist.all_reduce(b))
        # bytes that leave a rank: (W-1)/W of the buffer in an all-to-all, 2 (W-1)/W of it in
        # a ring all-reduce
        moved = LARGE * 4 * (world - 1) / world * (2 if name == "all_reduce" else 1)
        out[f"{name}_latency_ms"] = ms[SMALL]
        out[f"{name}_bytes_per_ms"] = moved / max(ms[LARGE] - ms[SMALL], 1e-6)
    return out


def measured_topology(
    links: dict[str, float], devices: int | None = None, local_world_size: int = 8
) -> Topology:
    """`devices` (default: the measured processes) whose links inside a host are the
    measured ones: the all-to-all's bandwidth, and the latency of one collective."""
    return Topology(
        devices or int(links["processes"]),
        local_world_size=local_world_size,
        intra_host_bw=links["all_to_all_bytes_per_ms"],
        intra_host_latency_ms=links["all_to_all_latency_ms"],
    )


# what a study reads of a links file: its default where an older file lacks it, and whether
# it must be above 0 (a rate or a factor) or may be 0 (a latency or a cost)
READ_FIELDS = {"all_to_all_bytes_per_ms": (None, True), "all_to_all_latency_ms": (None, False),
               "runtime_ms": (0.0, False), "dense_factor": (1.0, True),
               "ms_per_pooled_mb": (0.0, False)}  # fmt: skip


def read_links(path: str) -> dict[str, float]:
    """A file of `ranknas shard links`; a clear error if it is not one, or holds a value no
    measurement gives. In a file measured without them, `runtime_ms` (the sharded runtime's
    fixed cost a step) and `ms_per_pooled_mb` (its cost per MB of pooled embeddings) are 0
    and `dense_factor` (the dense part's slowdown inside a sharded step) 1."""
    remeasure = "measure with `ranknas shard links --out FILE`"
    try:
        data = json.loads(Path(path).read_text())
        links = {k: float(data[k] if default is None else data.get(k, default))
                 for k, (default, _) in READ_FIELDS.items()}  # fmt: skip
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise RanknasError(f"sharding.links {path}: not a file of `ranknas shard links` "
                           f"({type(exc).__name__}: {exc}); {remeasure}") from None  # fmt: skip
    for key, value in links.items():
        positive = READ_FIELDS[key][1]
        if not math.isfinite(value) or value < 0 or (positive and value == 0):
            bound = "above 0" if positive else "0 or more"
            raise RanknasError(f"sharding.links {path}: {key} is {data[key]!r}; a measured "
                               f"one is a number {bound}: {remeasure}")  # fmt: skip
    return links


def measure_links(processes: int) -> dict[str, float]:
    """`measure` on `processes` local processes (torchrun), as rank 0 saw it."""
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "links.json"
        run = torchrun(processes, "cost_models.sharding.links", ["--out", str(out)])
        if run.returncode:
            raise RanknasError(f"measuring the links failed: {run.stderr.strip()[-500:]}")
        return json.loads(out.read_text())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    with process_group():
        result = measure()
        if dist.get_rank() == 0:
            args.out.write_text(json.dumps(result, indent=2))


if __name__ == "__main__" and "RANK" in os.environ:
    main()
