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


def _transfer_ms(small_ms: float, large_ms: float) -> float:
    """The large buffer's time less the latency, but at least half its time: where the tiny
    buffer's median came out as slow as the large one's (a noisy latency), the difference
    would imply any bandwidth at all (4,194,304 GB/s was recorded once)."""
    return max(large_ms - small_ms, large_ms / 2)


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
        out[f"{name}_bytes_per_ms"] = moved / _transfer_ms(ms[SMALL], ms[LARGE])
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
    data = _links_json(path)
    links = {}
    for key, (default, positive) in READ_FIELDS.items():
        value = data.get(key, default)
        number = isinstance(value, (int, float)) and not isinstance(value, bool)
        if not number or not math.isfinite(value) or value < 0 or (positive and value == 0):
            bound = "above 0" if positive else "0 or more"
            raise RanknasError(f"sharding.links {path}: {key} is {json.dumps(value)}; a "
                               f"measured one is a number {bound}: {REMEASURE}")  # fmt: skip
        links[key] = float(value)
    return links


def unmeasured_fields(path: str) -> list[str]:
    """What a links file lacks that `ranknas shard links` measures now: a file written before
    them predicts a sharded step without the runtime's own cost, far too low."""
    data = _links_json(path)
    return [k for k, (default, _) in READ_FIELDS.items() if default is not None and k not in data]


REMEASURE = "measure with `ranknas shard links --out FILE`"


def _links_json(path: str) -> dict:
    try:
        data = json.loads(Path(path).read_text())
    except (OSError, ValueError) as exc:
        raise RanknasError(f"sharding.links {path}: not a file of `ranknas shard links` "
                           f"({type(exc).__name__}: {exc}); {REMEASURE}") from None  # fmt: skip
    missing = [k for k, (default, _) in READ_FIELDS.items()
               if default is None and (not isinstance(data, dict) or k not in data)]  # fmt: skip
    if missing:
        raise RanknasError(f"sharding.links {path}: not a file of `ranknas shard links` (no "
                           f"{' or '.join(missing)}); {REMEASURE}")  # fmt: skip
    return data


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
