"""Search efficiency: one-shot, DNAS, regularized evolution and random at equal examples.

Each searcher runs as a real study (`nas.runner.run_study`, SQLite in a temp dir, no MLflow)
over the same DAG space on the built-in synthetic data. Every training example counts:
supernet training (DNAS: its weight and architecture batches), the fine-tunes that score
one-shot candidates, and the stand-alone training of every trial. Each study gives a curve
of NE against the examples consumed so far, read two ways (`View`): the best validation NE
recorded so far (one training run per trial), and the re-evaluated one: every incumbent
retrained with fresh seeds and scored on the test split, which removes the luck of the
best of many single runs. From each:

- the NE at equal examples (fractions of evolution's whole budget);
- the examples each searcher needs to reach the best NE evolution reaches in its whole
  budget, and evolution's own examples to get there (the target: one-shot or DNAS need at
  least 5x fewer), seed by seed and on the median curves;
- the FLOPs of each searcher's best architecture against the FLOPs budget. Evolution and
  random get the budget as a hard constraint (`objectives.max_mflops`: an architecture over
  it is pruned untrained, costing no examples); one-shot and DNAS get it as the target of
  their cost term: TuNAS's absolute value |mflops / budget - 1| (`oneshot`, `dnas`), or as a
  ceiling max(0, mflops / budget - 1) (`oneshot-ceiling`, `dnas-ceiling`), which, like the
  constraint, does not push architectures up toward the budget.

    .venv/bin/python bench/bench_search_efficiency.py --seed 0 --reeval-seeds 5  # 5-8 min
    .venv/bin/python bench/bench_search_efficiency.py --report     # tables (+ plot) of all seeds

Each `--seed` run adds its curves and incumbents to --out/seed-N.json (a searcher run again
replaces its entry); re-evaluation runs are cached in --out/reeval-cache.json; `--reeval`
re-evaluates the saved incumbents (with more seeds, say); `--report` prints Markdown from
every file there, with medians over seeds, and saves --plot. `--set KEY=VALUE` overrides a
one-shot/DNAS searcher setting for tuning runs (use another --out).
"""

from __future__ import annotations

import argparse
import json
import logging
import math
import statistics
import tempfile
import time
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import optuna
import torch
from optuna.trial import TrialState

from nas.config import StudyConfig, load_config, parse_config
from nas.oneshot.phase import PHASE_SEARCHERS, phase_attr
from nas.protocol import StudyData, prepare_data, train_architecture, trial_train_config
from nas.reevaluate import REEVAL_SEED
from nas.runner import run_study
from search_space.architecture import Architecture

SEARCHERS = ("oneshot", "oneshot-ceiling", "dnas", "dnas-ceiling", "evolution", "random")
FRACTIONS = (0.125, 0.25, 0.5, 1.0)
TARGET_SPEEDUP = 5.0


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seed", type=int, help="run every searcher with this study seed")
    parser.add_argument("--report", action="store_true", help="tables from --out")
    parser.add_argument("--reeval", action="store_true",
                        help="re-evaluate the incumbents already in --out with --reeval-seeds "
                        "seeds (the missing ones only)")  # fmt: skip
    parser.add_argument("--searchers", default=",".join(SEARCHERS))
    parser.add_argument("--out", default="ranknas-data/bench_search_efficiency")
    parser.add_argument("--plot", default="bench/search_efficiency.png")
    parser.add_argument("--rows", type=int, default=100_000)
    parser.add_argument("--trials", type=int, default=48, help="evolution and random")
    parser.add_argument("--examples-per-trial", type=int, default=80_000)
    parser.add_argument("--budget-mflops", type=float, default=0.05)
    parser.add_argument("--population", type=int, default=12, help="evolution")
    parser.add_argument("--top-k", type=int, default=4, help="one-shot and DNAS")
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                        help="one-shot/DNAS searcher setting over the example's, e.g. "
                        "refine_candidates=16 (repeatable)")  # fmt: skip
    parser.add_argument("--reeval-seeds", type=int, default=3, help="per incumbent")
    return parser.parse_args()


def study_config(tmp: Path, name: str, seed: int, args: argparse.Namespace) -> StudyConfig:
    """The study of one searcher (`name`: a searcher type, `-ceiling` for the ceiling cost
    term): the space and searcher settings of examples/oneshot.yaml and examples/dnas.yaml,
    one FLOPs budget for all."""
    searcher = name.removesuffix("-ceiling")
    base = load_config(Path(__file__).parent.parent / "examples" / f"{_example(searcher)}.yaml")
    searcher_section = base.searcher.model_dump() | {"type": searcher, "top_k": args.top_k}
    if searcher in PHASE_SEARCHERS:
        searcher_section["target_mflops"] = args.budget_mflops
        searcher_section["cost_penalty"] = "above" if name.endswith("-ceiling") else "absolute"
        for item in args.set:
            key, _, value = item.partition("=")
            searcher_section[key] = json.loads(value)
        trials = args.top_k
        objectives = {"metric": "ne"}
    else:
        searcher_section |= {"population": args.population, "sample_size": 4}
        trials = args.trials
        objectives = {"metric": "ne", "max_mflops": args.budget_mflops}
    return parse_config(
        {
            "name": f"eff-{name}-{seed}",
            "data": {"source": "synthetic", "rows": args.rows, "seed": 0},
            "search_space": base.search_space.model_dump(mode="json"),
            "searcher": searcher_section,
            "objectives": objectives,
            "budget": {"trials": trials, "examples_per_trial": args.examples_per_trial},
            "training": base.training.model_dump() | {"evals": 1},
            "storage": f"sqlite:///{tmp / 'studies.db'}",
            "output_dir": str(tmp / f"{name}-{seed}"),
            "mlflow": {"tracking_uri": None},
            "seed": seed,
        }
    )


def _is_phase(name: str) -> bool:
    return name.removesuffix("-ceiling") in PHASE_SEARCHERS


def _example(searcher: str) -> str:
    return "dnas" if searcher == "dnas" else "oneshot"


def trial_examples(trial: optuna.trial.FrozenTrial) -> int:
    """Training examples a trial consumed (0 for one pruned untrained)."""
    trial_dir = trial.user_attrs.get("trial_dir")
    metrics = Path(trial_dir) / "metrics.json" if trial_dir else None
    if metrics is None or not metrics.exists():
        return 0
    return int(json.loads(metrics.read_text()).get("examples") or 0)


def study_curve(study: optuna.Study, searcher: str) -> dict[str, Any]:
    """Best NE so far against examples consumed so far, trial by trial (after the phase),
    and the incumbents: each trial that became the best so far, with its architecture."""
    phase = study.user_attrs.get(phase_attr(searcher.removesuffix("-ceiling")), {})
    consumed = int(phase.get("examples", 0))
    best, best_mflops, points, incumbents = math.inf, math.nan, [], []
    for trial in sorted(study.get_trials(deepcopy=False), key=lambda t: t.number):
        consumed += trial_examples(trial)
        if trial.state == TrialState.COMPLETE and trial.values[0] < best:
            best, best_mflops = trial.values[0], trial.user_attrs["mflops"]
            arch_file = Path(trial.user_attrs["trial_dir"]) / "architecture.json"
            incumbents.append(
                {
                    "examples": consumed,
                    "trial": trial.number,
                    "ne": best,
                    "mflops": best_mflops,
                    "digest": trial.user_attrs["digest"],
                    "architecture": arch_file.read_text(),
                }
            )
        points.append((consumed, best))
    return {
        "points": points,
        "incumbents": incumbents,
        "phase_examples": int(phase.get("examples", 0)),
        "best_ne": best,
        "best_mflops": best_mflops,
        "bayes_ne": study.user_attrs.get("bayes_ne"),
    }


def reevaluate(
    incumbents: list[dict], config: StudyConfig, data: StudyData, seeds: int, cache_path: Path
) -> None:
    """Retrain every incumbent stand-alone with `seeds` fresh training seeds, exactly as its
    study trains a trial, and add the mean validation and test NE (`reeval_val_ne`,
    `reeval_test_ne`) and their spread across seeds. The test split is never seen by any
    searcher, and the fresh seeds remove the luck that made a trial the best of many."""
    cache = json.loads(cache_path.read_text()) if cache_path.exists() else {}
    setting = f"{config.data.rows}:{trial_train_config(config, 0).max_examples}"
    for incumbent in incumbents:
        runs = []
        for k in range(seeds):
            seed = REEVAL_SEED + k
            key = f"{incumbent['digest']}:{seed}:{setting}"
            if key not in cache:
                arch = Architecture.from_json(incumbent["architecture"])
                result, _ = train_architecture(arch, data, config, seed)
                cache[key] = [result.validation["ne"], result.test["ne"]]
                cache_path.write_text(json.dumps(cache))
            runs.append(cache[key])
        val, test = zip(*runs, strict=True)
        incumbent |= {
            "reeval_val_ne": statistics.fmean(val),
            "reeval_val_sd": statistics.stdev(val) if seeds > 1 else 0.0,
            "reeval_test_ne": statistics.fmean(test),
            "reeval_test_sd": statistics.stdev(test) if seeds > 1 else 0.0,
        }


def run_seed(args: argparse.Namespace) -> None:
    path = Path(args.out) / f"seed-{args.seed}.json"
    results: dict[str, Any] = json.loads(path.read_text())["results"] if path.exists() else {}
    cache = Path(args.out) / "reeval-cache.json"
    cache.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="ranknas-eff-") as tmp:
        for searcher in args.searchers.split(","):
            config = study_config(Path(tmp), searcher, args.seed, args)
            started = time.monotonic()
            study = run_study(config, progress=lambda line: None)
            results[searcher] = study_curve(study, searcher) | {
                "seconds": round(time.monotonic() - started, 1)
            }
            r = results[searcher]
            reevaluate(r["incumbents"], config, prepare_data(config), args.reeval_seeds, cache)
            final = r["incumbents"][-1]
            print(
                f"<!-- seed {args.seed} {searcher}: best NE {r['best_ne']:.4f} "
                f"({r['best_mflops']:.4f} MFLOPs) after {r['points'][-1][0]:,} examples, "
                f"{r['seconds']:.0f} s; re-evaluated test NE {final['reeval_test_ne']:.4f} "
                f"± {final['reeval_test_sd']:.4f} -->",
                flush=True,
            )
    path.parent.mkdir(parents=True, exist_ok=True)
    settings = {k: v for k, v in vars(args).items() if k not in ("report", "seed", "searchers")}
    path.write_text(
        json.dumps({"seed": args.seed, "settings": settings, "results": results}, indent=1)
    )


def reevaluate_saved(args: argparse.Namespace) -> None:
    """`reevaluate` the incumbents of every seed file under --out, in place."""
    cache = Path(args.out) / "reeval-cache.json"
    for path in sorted(Path(args.out).glob("seed-*.json")):
        run = json.loads(path.read_text())
        with tempfile.TemporaryDirectory(prefix="ranknas-eff-") as tmp:
            saved = argparse.Namespace(**(vars(args) | run["settings"]))  # as it was trained
            config = study_config(Path(tmp), "evolution", run["seed"], saved)
            data = prepare_data(config)
            for searcher, result in run["results"].items():
                reevaluate(result["incumbents"], config, data, args.reeval_seeds, cache)
                print(f"<!-- seed {run['seed']} {searcher}: re-evaluated -->", flush=True)
        path.write_text(json.dumps(run, indent=1))


# --------------------------------------------------------------------------- report


def best_at(points: list[list[float]], examples: float) -> float:
    """The best NE found within `examples` (nan before the first result)."""
    within = [ne for consumed, ne in points if consumed <= examples and math.isfinite(ne)]
    return within[-1] if within else math.nan


def examples_to_reach(points: list[list[float]], target: float) -> float:
    """Examples consumed when the best NE first reached `target` (inf if never)."""
    return next((consumed for consumed, ne in points if ne <= target + 1e-12), math.inf)


def median(values: list[float]) -> float:
    finite = [v for v in values if not math.isnan(v)]
    return statistics.median(finite) if finite else math.nan


def fmt_examples(value: float) -> str:
    return "not reached" if math.isinf(value) else f"{value / 1e6:.2f}M"


@dataclass(frozen=True)
class View:
    """One way to read a study's result: its curve of (examples consumed, NE) and its best.
    `recorded`: the best validation NE among the trials, as the study saw it (one training
    run per trial, so the best of many is partly luck). `re-evaluated`: the test NE,
    averaged over fresh training seeds, of the architecture the study held as its best at
    that point (see `reevaluate`); its best is the best of those incumbents, a target at
    least as hard as the one the study ended with."""

    name: str
    label: str
    key: str  # the incumbents' field this view reads

    def points(self, result: dict) -> list[list[float]]:
        if self.name == "recorded":
            return result["points"]
        return [[inc["examples"], inc[self.key]] for inc in result["incumbents"]]

    def best(self, result: dict) -> dict:
        """The incumbent with the best NE in this view."""
        return min(result["incumbents"], key=lambda inc: inc[self.key])


RECORDED = View("recorded", "best validation NE recorded", "ne")
REEVALUATED = View(
    "re-evaluated", "test NE of the incumbent, mean of fresh seeds", "reeval_test_ne"
)


def report(args: argparse.Namespace) -> None:
    runs = [json.loads(p.read_text()) for p in sorted(Path(args.out).glob("seed-*.json"))]
    runs = [r for r in runs if "evolution" in r["results"]]
    if not runs:
        raise SystemExit(f"no seed-*.json with an evolution study under {args.out}")
    searchers = [s for s in SEARCHERS if all(s in r["results"] for r in runs)]
    seeds = [r["seed"] for r in runs]
    settings = runs[0]["settings"]
    budget = median([r["results"]["evolution"]["points"][-1][0] for r in runs])
    print(f"Seeds {seeds}; evolution/random: {settings['trials']} trials of "
          f"{settings['examples_per_trial']:,} examples (those over the FLOPs budget pruned "
          f"untrained: evolution consumed {budget / 1e6:.2f}M, median); one-shot/DNAS: "
          f"top {settings['top_k']} trained stand-alone; FLOPs budget "
          f"{settings['budget_mflops']} MFLOPs.\n")  # fmt: skip
    print_noise(runs, searchers)
    views = [RECORDED]
    if all("reeval_test_ne" in inc for r in runs for s in searchers
           for inc in r["results"][s]["incumbents"]):  # fmt: skip
        views.append(REEVALUATED)
    for view in views:
        print(f"#### {view.label}\n")
        print_equal_examples(runs, searchers, budget, view)
        print_examples_to_reach(runs, searchers, view)
        print_median_reach(runs, searchers, view)
        print_reverse_speedup(runs, searchers, view)
        print_flops(runs, searchers, settings["budget_mflops"], view)
    if args.plot:
        plot(runs, searchers, Path(args.plot), views)


def print_noise(runs: list[dict], searchers: list[str]) -> None:
    """How noisy one training run is, from the re-evaluations: the spread of an
    architecture's validation NE over fresh seeds, and how much better each searcher's
    recorded best is than the same architecture's mean validation NE over fresh seeds."""
    incumbents = [inc for r in runs for s in searchers for inc in r["results"][s]["incumbents"]]
    spread = {inc["digest"]: inc["reeval_val_sd"] for inc in incumbents if "reeval_val_sd" in inc}
    if not spread:
        return

    def luck(result: dict) -> float:
        final = result["incumbents"][-1]
        return final["reeval_val_ne"] - final["ne"]

    lucky = [f"{s} {median([luck(r['results'][s]) for r in runs]):+.4f}" for s in searchers]
    print(f"One run's noise: an architecture's validation NE over fresh seeds has a median "
          f"standard deviation of {median(list(spread.values())):.4f} ({len(spread)} "
          "architectures). How much better each searcher's recorded best is than the same "
          "architecture's mean over fresh seeds (median over seeds): "
          + ", ".join(lucky) + ".\n")  # fmt: skip


def print_equal_examples(runs: list[dict], searchers: list[str], budget: float, view: View) -> None:
    marks = [f * budget for f in FRACTIONS]
    print("| searcher | " + " | ".join(f"NE at {m / 1e6:.2f}M" for m in marks)
          + " | examples consumed in all | seconds |")  # fmt: skip
    print("|---" * (len(marks) + 3) + "|")
    for s in searchers:
        cells = [median([best_at(view.points(r["results"][s]), m) for r in runs]) for m in marks]
        total = median([r["results"][s]["points"][-1][0] for r in runs])
        seconds = median([r["results"][s]["seconds"] for r in runs])
        shown = " | ".join("—" if math.isnan(c) else f"{c:.4f}" for c in cells)
        print(f"| {s} | {shown} | {total / 1e6:.2f}M | {seconds:.0f} |")
    print()


def print_examples_to_reach(runs: list[dict], searchers: list[str], view: View) -> None:
    print("| seed | evolution's best NE | " + " | ".join(f"{s}: examples" for s in searchers)
          + " | best speed-up over evolution (one-shot or DNAS) |")  # fmt: skip
    print("|---" * (len(searchers) + 3) + "|")
    speedups = []
    for r in runs:
        target = view.best(r["results"]["evolution"])[view.key]
        needed = {s: examples_to_reach(view.points(r["results"][s]), target) for s in searchers}
        speedup = max(needed["evolution"] / needed[s] for s in searchers if _is_phase(s))
        speedups.append(speedup)
        cells = " | ".join(fmt_examples(needed[s]) for s in searchers)
        shown = f"{speedup:.2f}x" if speedup > 0 else "not reached"
        print(f"| {r['seed']} | {target:.4f} | {cells} | {shown} |")
    met = sum(s >= TARGET_SPEEDUP for s in speedups)
    print(f"\nThe {TARGET_SPEEDUP:.0f}x target met in {met} of {len(runs)} seeds "
          f"(median speed-up {statistics.median(speedups):.2f}x; 0 where one-shot and DNAS "
          "never reach evolution's best NE).\n")  # fmt: skip


def median_curve(runs: list[dict], searcher: str, view: View) -> list[list[float]]:
    """The median over seeds of a searcher's curve, at every point where any seed's moves."""
    marks = sorted({x for r in runs for x, _ in view.points(r["results"][searcher])})
    curve = [[x, median([best_at(view.points(r["results"][searcher]), x) for r in runs])]
             for x in marks]  # fmt: skip
    return [[x, ne] for x, ne in curve if not math.isnan(ne)]


def print_median_reach(runs: list[dict], searchers: list[str], view: View) -> None:
    """Seed by seed, "reaching evolution's best" is decided by one draw each; on the median
    curves over the seeds: the examples each needs to reach what evolution's median curve
    reaches at the end of its budget."""
    target = median_curve(runs, "evolution", view)[-1][1]
    evolution = examples_to_reach(median_curve(runs, "evolution", view), target)
    cells = []
    for s in searchers:
        needed = examples_to_reach(median_curve(runs, s, view), target)
        ratio = "" if s == "evolution" or math.isinf(needed) else f", {evolution / needed:.1f}x"
        cells.append(f"{s} {fmt_examples(needed)}{ratio}")
    print(f"On the median curves: evolution ends at {target:.4f}; examples to reach it: "
          + "; ".join(cells) + ".\n")  # fmt: skip


def print_reverse_speedup(runs: list[dict], searchers: list[str], view: View) -> None:
    """The other way round: the examples evolution needs to match each phase searcher's
    best NE, against the examples that searcher needed for it."""
    phase = [s for s in searchers if _is_phase(s)]
    print("| searcher | its best NE (median) | examples it needed | examples evolution needs "
          "to match it | ratio per seed | median ratio |")  # fmt: skip
    print("|---|---|---|---|---|---|")
    for s in phase:
        best, own, evo, ratios = [], [], [], []
        for r in runs:
            target = view.best(r["results"][s])[view.key]
            best.append(target)
            own.append(examples_to_reach(view.points(r["results"][s]), target))
            evo.append(examples_to_reach(view.points(r["results"]["evolution"]), target))
            ratios.append(evo[-1] / own[-1])
        shown = ", ".join("∞" if math.isinf(x) else f"{x:.1f}x" for x in ratios)
        mid = median(ratios)
        print(f"| {s} | {median(best):.4f} | {fmt_examples(median(own))} | "
              f"{fmt_examples(median(evo))} | {shown} | "
              f"{'∞' if math.isinf(mid) else f'{mid:.1f}x'} |")  # fmt: skip
    print()


def print_flops(runs: list[dict], searchers: list[str], budget_mflops: float, view: View) -> None:
    print("| searcher | MFLOPs of the best architecture per seed | median | within budget |")
    print("|---|---|---|---|")
    for s in searchers:
        values = [view.best(r["results"][s])["mflops"] for r in runs]
        within = sum(v <= budget_mflops for v in values)
        shown = ", ".join(f"{v:.4f}" for v in values)
        print(f"| {s} | {shown} | {median(values):.4f} | {within} / {len(values)} |")
    print()


def plot(runs: list[dict], searchers: list[str], path: Path, views: list[View]) -> None:
    """One panel per view: the median curve of each searcher over the seeds."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, len(views), figsize=(7 * len(views), 4.2), squeeze=False)
    for ax, view in zip(axes[0], views, strict=True):
        for s in searchers:
            end = median([r["results"][s]["points"][-1][0] for r in runs])  # where it stopped
            grid = [end * i / 200 for i in range(1, 201)]
            curve = [median([best_at(view.points(r["results"][s]), x) for r in runs])
                     for x in grid]  # fmt: skip
            (line,) = ax.plot([x / 1e6 for x in grid], curve, label=s, drawstyle="steps-post")
            ax.plot([end / 1e6], [curve[-1]], "o", color=line.get_color())
        ax.set_xlabel("training examples consumed (millions)")
        ax.set_ylabel(f"{view.label} (median of {len(runs)} seeds)", fontsize=8)
        ax.set_title(f"Search efficiency on the synthetic data: {view.name}")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    print(f"Plot: `{path}`.\n")


def quiet_single_thread() -> None:
    """Benchmark settings: no library chatter, one torch thread (as studies train)."""
    warnings.filterwarnings("ignore")
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    logging.getLogger("torch.fx._symbolic_trace").setLevel(logging.ERROR)
    torch.set_num_threads(1)


def main() -> None:
    args = parse_args()
    quiet_single_thread()
    if args.report:
        report(args)
    elif args.reeval:
        reevaluate_saved(args)
    elif args.seed is not None:
        run_seed(args)
    else:
        raise SystemExit("give --seed N to run, or --report")


if __name__ == "__main__":
    main()
