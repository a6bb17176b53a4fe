"""Does the search beat the engineers' models? Every preset against the search's pick.

For each data size and seed, one study like `examples/quickstart.yaml`: the six
presets trained as baselines, then TPE over the `around` space of the best of them
(`base: best_baseline`: the best seed mean of every baseline; startup trials are its
variants) held to its FLOPs (`max_mflops: base`, the first target's condition; the
quickstart itself has no ceiling: `--max-mflops none`), then `reevaluate` of the three best
trials (`--top`) and every baseline with three fresh seeds. The pick is the trial with the best mean
validation NE; it is compared with the baseline of best mean validation NE, on mean test
NE (which selected nothing) and FLOPs. `--base dlrm` searches around a fixed model instead; with
`--around-best` as well, a second study searches around the best baseline when that is
another model. The data seed and the study seed are the seed, so each seed is a fresh
synthetic data set (same generator, other draws).

    .venv/bin/python bench/bench_vs_baselines.py --rows 200000 --seeds 0 1 2   # ~3 min/seed

Prints one Markdown row per (rows, seed) and a summary; --out keeps the rows as JSON.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import resource
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import yaml

sys.path.insert(0, str(Path(__file__).parent))
from bench_search_efficiency import quiet_single_thread

from nas.config import parse_config
from nas.leaderboard import verdict
from nas.reevaluate import confirm_study, reevaluate_study
from nas.runner import run_study
from trainers.data.synthetic import write_synthetic_criteo

QUICKSTART = Path(__file__).parent.parent / "examples" / "quickstart.yaml"
# --tune's hyper-parameter space, for the trials and the baselines' recipe trials alike:
# the quickstart's (5-point log grids, 4x either way of its recipe)
TUNED_RECIPES = yaml.safe_load(QUICKSTART.read_text())["training"]["search"]


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, nargs="+", default=[200_000])
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2, 3, 4])
    parser.add_argument("--trials", type=int, default=20)
    parser.add_argument("--searchers", nargs="+", default=["tpe"],
                        choices=["tpe", "random", "evolution", "ax"],
                        help="a study per searcher; the first one searches around the best "
                        "preset (--around-best)")  # fmt: skip
    parser.add_argument("--population", type=int,
                        help="evolution's population (default: the config's)")  # fmt: skip
    parser.add_argument("--base", default="best_baseline",
                        help="the model searched around: best_baseline or a preset")  # fmt: skip
    parser.add_argument("--around-best", action="store_true",
                        help="with a preset as --base: also search around the best "
                        "baseline")  # fmt: skip
    parser.add_argument("--criteo", action="store_true",
                        help="each seed's rows as a Criteo-format TSV (`ranknas data synth "
                        "--format criteo`), read as users' files are")  # fmt: skip
    parser.add_argument("--top", type=int, default=3,
                        help="best trials retrained with fresh seeds (the finalists)")  # fmt: skip
    parser.add_argument("--work-dir", type=Path,
                        help="keep the studies here (default: a temporary directory); a "
                        "second run with the same directory resumes them, training only "
                        "what is missing")  # fmt: skip
    parser.add_argument("--reeval-seeds", type=int, default=3,
                        help="fresh seeds of the finalists and every baseline (the verdict's "
                        "seed means); a rerun with more trains only the new seeds")  # fmt: skip
    parser.add_argument("--max-mflops", default="base",
                        help="objectives.max_mflops: none, base, best_baseline or a number "
                        "(default: base, the base's FLOPs)")  # fmt: skip
    parser.add_argument("--confirm-seeds", type=int,
                        help="budget.confirm_seeds (default: the quickstart's)")  # fmt: skip
    parser.add_argument("--lr-schedule", choices=("constant", "cosine"),
                        help="training.lr_schedule of every run, trials and baselines alike "
                        "(default: the quickstart's)")  # fmt: skip
    parser.add_argument("--tune", type=int, default=0,
                        help="best_baseline.tune: recipe trials per baseline, the trials "
                        "drawing their recipes from the same training.search (the "
                        "quickstart's); 0: its one recipe for every model")  # fmt: skip
    parser.add_argument("--baselines", nargs="+",
                        help="the presets trained as baselines (default: the "
                        "quickstart's six)")  # fmt: skip
    parser.add_argument("--confirm-pair", type=int, default=0, metavar="N",
                        help="then `ranknas confirm` with N seeds: the verdict's pair on seeds "
                        "that chose nothing (0: not)")  # fmt: skip
    parser.add_argument("--out", type=Path, help="JSON file for the rows")
    return parser.parse_args()


def quickstart_config(
    directory: Path, name: str, rows: int, seed: int, criteo: bool = False
) -> dict[str, Any]:
    """`examples/quickstart.yaml` on `rows` rows drawn with `seed` (synthetic, or the same
    generator's rows written as a Criteo TSV in `directory`), one pass over them per model,
    stored in `directory`, without MLflow, at the quickstart's one recipe (its recipe search
    and tuned baselines left out: `study(tune=K)` puts them back)."""
    config = yaml.safe_load(QUICKSTART.read_text())
    config["training"].pop("search", None)
    config["best_baseline"]["tune"] = 0
    config |= {"name": name, "seed": seed, "storage": f"sqlite:///{directory}/studies.db",
               "output_dir": str(directory / name), "mlflow": {"tracking_uri": None}}  # fmt: skip
    config["data"] |= {"rows": rows, "seed": seed}
    if criteo:
        path = directory / f"criteo-{rows}-{seed}.tsv"
        if not path.exists():
            write_synthetic_criteo(path, rows, seed)
        config["data"] = {"source": f"criteo:{path}", "seed": seed}
    config["budget"]["examples_per_trial"] = rows
    return config


def study(
    directory: Path,
    name: str,
    rows: int,
    seed: int,
    trials: int,
    base: str,
    criteo: bool,
    searcher: str = "tpe",
    population: int | None = None,
    top: int = 3,
    confirm_seeds: int | None = None,
    reeval_seeds: int = 3,
    max_mflops: str | None = None,
    lr_schedule: str | None = None,
    tune: int = 0,
    baselines: list[str] | None = None,
    confirm_pair: int = 0,
) -> dict:
    """One study as the quickstart's, on `rows` rows and `seed` (synthetic, or the same
    generator's rows written as a Criteo TSV); its seed-mean verdict (with `confirm_pair`,
    tested on that many seeds that chose nothing)."""
    config = quickstart_config(directory, name, rows, seed, criteo)
    config["budget"]["trials"] = trials
    if max_mflops is not None:
        config["objectives"]["max_mflops"] = None if max_mflops == "none" else max_mflops
    if confirm_seeds is not None:
        config["budget"]["confirm_seeds"] = confirm_seeds
    if lr_schedule is not None:
        config["training"]["lr_schedule"] = lr_schedule
    if baselines:
        config["baselines"] = baselines
    if tune:
        config["training"]["search"] = TUNED_RECIPES
        config["best_baseline"]["tune"] = tune
    config["search_space"]["base"] = base
    config["searcher"]["type"] = searcher
    if population:
        config["searcher"] |= {"population": population, "sample_size": min(4, population)}
    parsed = parse_config(config)
    started, cpu = time.perf_counter(), _cpu_seconds()
    found = run_study(parsed, progress=lambda line: None)
    reevaluate_study(parsed, top=top, seeds=reeval_seeds, progress=lambda line: None)  # all bases
    if confirm_pair:
        confirm_study(parsed, confirm_pair, progress=lambda line: None)
    v = verdict(found)
    minutes = (time.perf_counter() - started) / 60
    cpu_minutes = (_cpu_seconds() - cpu) / 60
    around = found.user_attrs.get("around_base", base)
    return {"rows": rows, "seed": seed, "base": around, "configured_base": base,
            "searcher": searcher, "minutes": minutes, "cpu_minutes": cpu_minutes, "tune": tune,
            "confirmed": sum(  # repeats copy runs
                bool(t.user_attrs.get("runs")) and "reused_from" not in t.user_attrs
                for t in found.trials),
            "bayes_ne": found.user_attrs.get("bayes_ne")} | _flat(v)  # fmt: skip


def _cpu_seconds() -> float:
    """User + system CPU seconds of this process and its finished children."""
    own, children = (resource.getrusage(who) for who in
                     (resource.RUSAGE_SELF, resource.RUSAGE_CHILDREN))  # fmt: skip
    return own.ru_utime + own.ru_stime + children.ru_utime + children.ru_stime


def _flat(v: dict[str, Any]) -> dict[str, Any]:
    found, base, paired = v["best_trial"], v["best_baseline"], v["paired"] or {}
    return {
        # the verdict's p (corrected for the finalists and looks), and its single test's
        "p_value": paired.get("p_value"), "p_single": paired.get("p_single"),
        "found_better_seeds": paired.get("found_better"),
        "trial": found["trial"], "found_val_ne": found["val_ne"], "found_test_ne":
        found["test_ne"], "found_mflops": found["mflops"], "baseline": base["baseline"],
        "baseline_val_ne": base["val_ne"], "baseline_test_ne": base["test_ne"],
        "baseline_mflops": base["mflops"], "wins_test": found["test_ne"] < base["test_ne"],
        "wins_val": v["search_lower"], "flops_ratio": v["flops_ratio"],
        "confirmed_pair": v.get("confirmed", False), "basis": v["basis"],
        # the test on the seeds that chose the pair, where a confirmation replaced it
        "selection_p_value": (v.get("selection_paired") or {}).get("p_value"),
        "selection_p_single": (v.get("selection_paired") or {}).get("p_single"),
    }  # fmt: skip


def markdown(rows: list[dict]) -> str:
    lines = ["| rows | seed | searcher | around | pick: val / test NE, MFLOPs | best baseline: "
             "val / test NE, MFLOPs | test NE delta | FLOPs ratio | wins on test | "
             "paired p (val) | tuned | minutes (CPU) |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|"]  # fmt: skip
    for r in rows:
        lines.append(
            f"| {r['rows']:,} | {r['seed']} | {r['searcher']} | {r['base']} | "
            f"{r['found_val_ne']:.4f} / "
            f"{r['found_test_ne']:.4f}, {r['found_mflops']:.3f} | {r['baseline']}: "
            f"{r['baseline_val_ne']:.4f} / {r['baseline_test_ne']:.4f}, "
            f"{r['baseline_mflops']:.3f} | {r['found_test_ne'] - r['baseline_test_ne']:+.4f} | "
            f"{r['flops_ratio']:.2f} | {'yes' if r['wins_test'] else 'no'} | {_p(r)} | "
            f"{r.get('tune') or 'no'} | {r['minutes']:.1f} ({r.get('cpu_minutes', 0):.1f}) |"
        )
    return "\n".join(lines)


def _p(row: dict) -> str:
    p = row.get("p_value")
    return "—" if p is None else f"{p:.3f} ({row['found_better_seeds']} seeds better)"


def summary(rows: list[dict]) -> str:
    """Per data size: each searcher around its configured base, and the first searcher
    around the preset that the seed means found best."""
    out = []
    for rows_count in sorted({r["rows"] for r in rows}):
        sized = [r for r in rows if r["rows"] == rows_count]
        groups = {
            f"{s} around {b}": [r for r in sized if (r["searcher"], r["configured_base"]) == (s, b)]
            for s, b in dict.fromkeys((r["searcher"], r["configured_base"]) for r in sized)
        }
        groups[f"{sized[0]['searcher']} around the best preset"] = [
            r for r in sized if r.get("around_best")
        ]
        for name, group in groups.items():
            if not group:
                continue
            wins = sum(r["wins_test"] for r in group)
            at_flops = sum(r["wins_test"] and r["flops_ratio"] <= 1 for r in group)
            gap = statistics.median(r["found_test_ne"] - r["baseline_test_ne"] for r in group)
            floors = [r["found_val_ne"] - r["bayes_ne"] for r in group if r["bayes_ne"]]
            floor = f"{statistics.median(floors):.4f}" if floors else "unknown (files)"
            out.append(f"- {rows_count:,} rows, {name}: the pick beats the best baseline "
                       f"on test NE in {wins} of {len(group)} seeds ({at_flops} at no more "
                       f"FLOPs); median test NE delta {gap:+.4f}; median gap of the pick to "
                       f"the Bayes floor (validation) {floor}")  # fmt: skip
    return "\n".join(out)


def main() -> None:
    args = parse_args()
    quiet_single_thread()
    results = []
    with contextlib.ExitStack() as stack:
        tmp = args.work_dir or stack.enter_context(
            tempfile.TemporaryDirectory(prefix="ranknas-vs-baselines-")
        )
        for rows in args.rows:
            for seed in args.seeds:
                for searcher in args.searchers:
                    row = study(Path(tmp), f"r{rows}-s{seed}-{searcher}", rows, seed, args.trials,
                                args.base, args.criteo, searcher, args.population,
                                args.top, args.confirm_seeds, args.reeval_seeds,
                                args.max_mflops, args.lr_schedule, args.tune,
                                args.baselines, args.confirm_pair)  # fmt: skip
                    row["around_best"] = (
                        searcher == args.searchers[0] and row["baseline"] == row["base"]
                    )
                    results.append(row)
                    print(markdown([row]).splitlines()[-1], flush=True)
                best = next(
                    r["baseline"] for r in results if (r["rows"], r["seed"]) == (rows, seed)
                )
                if args.around_best and best != results[-1]["base"]:
                    row = study(Path(tmp), f"r{rows}-s{seed}-best", rows, seed, args.trials, best,
                                args.criteo, args.searchers[0], args.population,
                                args.top, args.confirm_seeds, args.reeval_seeds,
                                args.max_mflops, args.lr_schedule, args.tune,
                                args.baselines, args.confirm_pair)  # fmt: skip
                    results.append(
                        row | {"around_best": True, "configured_base": "the best preset"}
                    )
                    print(markdown([row]).splitlines()[-1], flush=True)
    print()
    print(markdown(results))
    print()
    print(summary(results))
    if args.out:
        args.out.write_text(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
