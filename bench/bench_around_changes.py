"""Which single changes of a model beat it? Every one-step variant in its `around` space.

Each variant (one parameter of `search_space: {type: around, base: BASE}` moved off the
base's value) and the base itself are trained with the same fresh seeds on one data set,
exactly as a study trains a trial (`examples/quickstart.yaml`'s protocol, one pass over
the rows). Deltas are paired: a variant's NE minus the base's with the same seed. When a
study loses to its base, this tells whether the search missed a better neighbour or the
space has none by more than the seeds' noise.

    PYTHONPATH=. .venv/bin/python bench/bench_around_changes.py --rows 1000000 \\
        --data-seed 1 --base dcnv2 --out runs.jsonl --part 1/2   # and --part 2/2 beside it

Runs are appended to --out as they finish, and a rerun skips those already there, so parts
can run side by side and the table is printed from whatever the file holds.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).parent))
from bench_search_efficiency import quiet_single_thread
from bench_vs_baselines import quickstart_config

from nas.config import parse_config
from nas.protocol import architecture_costs, prepare_data, train_architecture
from search_space.architecture import digest
from search_space.spaces import make_space
from search_space.spaces.around import AroundSpace

BASE = "base"


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=1_000_000)
    parser.add_argument("--data-seed", type=int, default=1, help="the synthetic data set")
    parser.add_argument("--criteo", action="store_true", help="the rows as a Criteo-format TSV")
    parser.add_argument("--base", default="dcnv2", help="a preset or an architecture file")
    parser.add_argument("--seeds", type=int, nargs="+", default=[101, 102, 103],
                        help="training seeds, the same for every variant (paired)")  # fmt: skip
    parser.add_argument("--only", nargs="+", help="these changes (names as printed) only")
    parser.add_argument("--part", default="1/1", help="K/N: every N-th change from the K-th")
    parser.add_argument("--out", type=Path, required=True, help="JSON lines, one per run")
    parser.add_argument("--report", action="store_true", help="print the table of --out only")
    return parser.parse_args()


def single_changes(space: AroundSpace) -> dict[str, dict[str, Any]]:
    """The base's values and, by name (`param=value`), each variant one parameter away
    that decodes to an architecture of its own."""
    base = space.base_values()
    seen = {digest(space.decode(base))}
    changes = {BASE: base}
    for name in space.active(base):
        for value in space.parameters()[name].choices:
            values = base | {name: value}
            key = digest(space.decode(values))
            if key not in seen:
                seen.add(key)
                changes[f"{name}={value}"] = values
    return changes


def done_runs(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def run(args: argparse.Namespace) -> None:
    part, parts = (int(x) for x in args.part.split("/"))
    done = {(r["change"], r["seed"]) for r in done_runs(args.out)}
    with tempfile.TemporaryDirectory(prefix="ranknas-around-changes-") as tmp:
        config = quickstart_config(Path(tmp), "changes", args.rows, args.data_seed, args.criteo)
        config["search_space"]["base"] = args.base
        study_config = parse_config(config)
        data = prepare_data(study_config)
        space = make_space(study_config.search_space, data.train.schema)
        changes = list(single_changes(space).items())
        mine = [c for i, c in enumerate(changes) if i % parts == part - 1]
        for name, values in mine:
            if args.only and name not in args.only and name != BASE:
                continue
            arch = space.decode(values)
            mflops = architecture_costs(arch, study_config).mflops
            for seed in args.seeds:
                if (name, seed) in done:
                    continue
                started = time.perf_counter()
                result, _ = train_architecture(arch, data, study_config, seed, label=name)
                line = {"change": name, "seed": seed, "status": result.status,
                        "val_ne": result.validation.get("ne"), "test_ne": result.test.get("ne"),
                        "mflops": mflops, "seconds": time.perf_counter() - started}  # fmt: skip
                with args.out.open("a") as f:
                    f.write(json.dumps(line) + "\n")
                print(json.dumps(line), flush=True)


def report(runs: list[dict[str, Any]]) -> str:
    """A Markdown table: each change's paired deltas against the base, best first."""
    by: dict[str, dict[int, dict[str, Any]]] = {}
    for r in runs:
        if r["status"] == "complete":
            by.setdefault(r["change"], {})[r["seed"]] = r
    base = by.get(BASE, {})
    rows = []
    for name, seeds in by.items():
        paired = sorted(s for s in seeds if s in base)
        if not paired:
            continue
        val = [seeds[s]["val_ne"] - base[s]["val_ne"] for s in paired]
        test = [seeds[s]["test_ne"] - base[s]["test_ne"] for s in paired]
        rows.append((statistics.mean(val), name, seeds, paired, val, test))
    lines = ["| change | MFLOPs (x base) | val NE, mean | val NE delta: mean (per seed) | "
             "test NE delta, mean | better on val |", "|---|---|---|---|---|---|"]  # fmt: skip
    base_mflops = next(iter(base.values()))["mflops"] if base else float("nan")
    for mean_val, name, seeds, paired, val, test in sorted(rows):
        mflops = next(iter(seeds.values()))["mflops"]
        per_seed = ", ".join(f"{d:+.4f}" for d in val)
        lines.append(
            f"| {name} | {mflops:.3f} ({mflops / base_mflops:.2f}) | "
            f"{statistics.mean(seeds[s]['val_ne'] for s in paired):.4f} | "
            f"{mean_val:+.4f} ({per_seed}) | {statistics.mean(test):+.4f} | "
            f"{sum(d < 0 for d in val)} of {len(val)} |"
        )
    if len(base) > 1:
        spread = statistics.stdev(r["val_ne"] for r in base.values())
        lines.append(f"\nThe base's validation NE over its {len(base)} seeds: standard "
                     f"deviation {spread:.4f}.")  # fmt: skip
    return "\n".join(lines)


def main() -> None:
    args = parse_args()
    quiet_single_thread()
    if not args.report:
        run(args)
    print(report(done_runs(args.out)))


if __name__ == "__main__":
    main()
