"""What the DAG space's points are worth when the output block reads what its inputs miss.

A point of `search_space: {type: dag}` whose chosen connections reach only the dense (or
only the categorical) features decodes, since session 33, with the missing kind added to
the output block's inputs (`DagSpace.unreached`). This draws the same `--samples` points
of the default space (`examples/space_dag.yaml`) both ways, trains every point whose two
architectures differ both ways with the same seed, on the quickstart's data and protocol
(one pass over the rows), and prints what a random search over each space would have
drawn: how many points were blind, their NE, and the best and mean NE over all points.

    PYTHONPATH=. .venv/bin/python bench/bench_dag_reach.py --rows 100000 --samples 40 \\
        --out runs.jsonl

Runs are appended to --out as they finish, and a rerun skips those already there.
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import yaml

sys.path.insert(0, str(Path(__file__).parent))
from bench_around_changes import done_runs
from bench_search_efficiency import quiet_single_thread
from bench_vs_baselines import quickstart_config

from nas.config import parse_config
from nas.protocol import architecture_costs, prepare_data, train_architecture
from search_space.architecture import digest
from search_space.spaces import make_space
from search_space.spaces.base import raw_inputs_reaching
from search_space.spaces.dag import DagSpace

SPACE = Path(__file__).parents[1] / "examples" / "space_dag.yaml"


class BlindDagSpace(DagSpace):
    """The DAG space as it decoded before: the output block reads what it chose, only."""

    def unreached(self, blocks: list, inputs: tuple[str, ...]) -> tuple[str, ...]:
        return ()


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=100_000)
    parser.add_argument("--data-seed", type=int, default=0, help="the synthetic data set")
    parser.add_argument("--samples", type=int, default=40, help="points drawn (seeds 0..N-1)")
    parser.add_argument("--seed", type=int, default=101, help="the training seed of every run")
    parser.add_argument("--out", type=Path, required=True, help="JSON lines, one per run")
    parser.add_argument("--report", action="store_true", help="print the table of --out only")
    return parser.parse_args()


def run(args: argparse.Namespace) -> None:
    done = {(r["sample"], r["space"]) for r in done_runs(args.out)}
    with tempfile.TemporaryDirectory(prefix="ranknas-dag-reach-") as tmp:
        config = quickstart_config(Path(tmp), "reach", args.rows, args.data_seed)
        config["search_space"] = yaml.safe_load(SPACE.read_text())["search_space"]
        study_config = parse_config(config)
        data = prepare_data(study_config)
        spaces = {"reads both": make_space(study_config.search_space, data.train.schema)}
        spaces["as before"] = BlindDagSpace(data.train.schema, study_config.search_space)
        for sample in range(args.samples):
            values = spaces["reads both"].sample_values(random.Random(sample))
            archs = {name: space.decode(values) for name, space in spaces.items()}
            same = digest(archs["reads both"]) == digest(archs["as before"])
            for name, arch in archs.items():
                if (sample, name) in done or (same and name == "as before"):
                    continue
                started = time.perf_counter()
                result, _ = train_architecture(arch, data, study_config, args.seed, label=name)
                reached = sorted(raw_inputs_reaching(arch.blocks, arch.output_block))
                line = {"sample": sample, "space": name, "same": same, "reaches": reached,
                        "status": result.status, "val_ne": result.validation.get("ne"),
                        "mflops": architecture_costs(arch, study_config).mflops,
                        "seconds": time.perf_counter() - started}  # fmt: skip
                with args.out.open("a") as f:
                    f.write(json.dumps(line) + "\n")
                print(json.dumps(line), flush=True)


def report(runs: list[dict[str, Any]]) -> str:
    """A Markdown table: per space, what its points scored (a failed run counts as NE 1)."""
    by = {(r["sample"], r["space"]): r for r in runs}
    samples = sorted({s for s, _ in by})
    for s in samples:  # a point both spaces decode alike was trained once
        if (s, "as before") not in by:
            by[(s, "as before")] = by[(s, "reads both")]
    blind = [s for s in samples if not by[(s, "as before")]["same"]]

    def ne(sample: int, space: str) -> float:
        r = by[(sample, space)]
        return r["val_ne"] if r["status"] == "complete" and r["val_ne"] is not None else 1.0

    lines = ["| space | points | blind | failed (NE >= 1) | best val NE | mean val NE | "
             "mean val NE, the blind points |", "|---|---|---|---|---|---|---|"]  # fmt: skip
    for space in ("as before", "reads both"):
        nes = [ne(s, space) for s in samples]
        reach = [by[(s, space)]["reaches"] for s in samples]
        lines.append(
            f"| {space} | {len(samples)} | {sum(r != ['dense', 'sparse'] for r in reach)} | "
            f"{sum(n >= 1 for n in nes)} | {min(nes):.4f} | {statistics.mean(nes):.4f} | "
            f"{statistics.mean(ne(s, space) for s in blind):.4f} |"
        )
    deltas = [ne(s, "reads both") - ne(s, "as before") for s in blind]
    lines.append(f"\nThe {len(blind)} points that were blind: NE lower when repaired in "
                 f"{sum(d < 0 for d in deltas)} of {len(deltas)}, median change "
                 f"{statistics.median(deltas):+.4f}.")  # fmt: skip
    return "\n".join(lines)


def main() -> None:
    args = parse_args()
    quiet_single_thread()
    if not args.report:
        run(args)
    print(report(done_runs(args.out)))


if __name__ == "__main__":
    main()
