"""Co-design on a production-shaped schema (issue 41): does a search held to the best
baseline's predicted step time find a model as good (NE within seed noise, paired seeds)
that trains faster on the study's cluster, and what did it change?

    .venv/bin/python bench/bench_codesign.py --config bench/codesign.yaml --seeds 5

Runs `ranknas search` and `ranknas reevaluate --top 3 --front` on the config (the top 3
by recorded NE and the Pareto front's trials cheaper than the best baseline; resumable: a
second run trains nothing new), then prints, for each re-evaluated trial against the best
baseline: seed-mean validation NE and its paired t-test, predicted step time on the
study's cluster and on 128 devices (16 hosts), and what differs from the base. Writes
the figures to bench/results/codesign.json.

`--measure N` checks the ratios against this machine: each trial's dense part over the
baseline's, timed a step of each in turn (`measure_dense_step_ratio`, the median of N
measurements), in place of the ratio the study used.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

RANKNAS = [sys.executable, "-m", "nas.cli"]
PARTS = ("dense_ms", "allreduce_ms", "embedding_ms", "all_to_all_ms")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--config", default="bench/codesign.yaml")
    parser.add_argument("--seeds", type=int, default=5)
    parser.add_argument("--top", type=int, default=3)
    parser.add_argument("--out", default="bench/results/codesign.json")
    parser.add_argument("--measure", type=int, default=0, metavar="N")
    args = parser.parse_args()
    subprocess.run([*RANKNAS, "search", args.config], check=True)
    subprocess.run([*RANKNAS, "reevaluate", args.config, "--top", str(args.top),
                    "--seeds", str(args.seeds), "--front"], check=True)  # fmt: skip
    report = summarize(args.config, args.measure)
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(report, indent=2))
    print(markdown(report))


def summarize(config_path: str, measure: int = 0) -> dict:
    from cost_models.sharding.step import predict_step, topology
    from nas import leaderboard
    from nas.config import load_config
    from nas.protocol import prepare_data
    from nas.storage import load_study
    from nas.trial_record import StudyAttr, TrialAttr, read_architecture, read_step

    config = load_config(config_path)
    study = load_study(config.name, config.storage)
    means = leaderboard.seed_means(study)
    base_key = Path(study.user_attrs[StudyAttr.AROUND_BASE]).stem
    base = leaderboard.recorded(study)[base_key]
    base_step = read_step(base["dir"])
    data = prepare_data(config)
    pooling = data.pooling_factors
    base_arch = read_architecture(base["dir"])

    def at_128(directory: str, step: dict) -> float:
        arch = read_architecture(directory)
        shard = config.sharding
        return predict_step(arch, topology(128, 16), shard.method, shard.model_dir,
                            config.training.batch_size, step["dense_ms"],
                            _dense_params(arch), pooling)["step_ms"]  # fmt: skip

    base_128 = at_128(base["dir"], base_step)
    rows = []
    for trial in study.get_trials(deepcopy=False):
        key = str(trial.number)
        if key not in means:
            continue
        step = read_step(trial.user_attrs[TrialAttr.DIR])
        paired = leaderboard.paired_seeds(study, key, f"baseline:{base_key}")
        rows.append({
            "trial": trial.number,
            "mean_val_ne": means[key]["val_ne"],
            "mean_test_ne": means[key]["test_ne"],
            "paired": paired,
            "step_ms": step["step_ms"],
            "step_ratio_16": step["step_ms"] / base_step["step_ms"],
            "step_ratio_128": at_128(trial.user_attrs[TrialAttr.DIR], step) / base_128,
            "mflops": trial.user_attrs.get("mflops"),
            "changes": changes(read_architecture(trial.user_attrs[TrialAttr.DIR]), base_arch),
            "parts": {k: step[k] for k in PARTS},
        })  # fmt: skip
        if measure:
            rows[-1]["measured"] = measured_ratio(base, base_step, trial, step, measure)
    return {
        "config": config_path,
        "best_baseline": {"name": base_key, "mean_val_ne": means[f"baseline:{base_key}"]["val_ne"],
                          "step_ms": base_step["step_ms"], "step_ms_128": base_128,
                          "parts": {k: base_step[k] for k in PARTS}},
        "trials": rows,
        "feature_importance": study.user_attrs.get(StudyAttr.FEATURE_IMPORTANCE),
        "best": leaderboard.describe_best(leaderboard.study_best(study)),
        "verdict": leaderboard.format_verdict(leaderboard.verdict(study)),
    }  # fmt: skip


def measured_ratio(base: dict, base_step: dict, trial, step: dict, times: int) -> dict:
    """The step ratio with the dense parts' ratio timed here (`measure_dense_step_ratio`,
    the median of `times` measurements) in place of the one the study used."""
    import numpy as np

    from cost_models.latency.model import measure_dense_step_ratio
    from nas.trial_record import TrialAttr, read_architecture

    arch = read_architecture(trial.user_attrs[TrialAttr.DIR])
    reference = read_architecture(base["dir"])
    ratio = float(np.median([measure_dense_step_ratio(arch, reference) for _ in range(times)]))
    rest = {name: s["step_ms"] - s["dense_ms"]  # every part but the dense one
            for name, s in (("base", base_step), ("trial", step))}  # fmt: skip
    base_ms = base_step["dense_ms"]
    return {
        "dense_ratio": ratio,
        "study_dense_ratio": step["dense_ms"] / base_ms,
        "step_ratio_16": (ratio * base_ms + rest["trial"]) / (base_ms + rest["base"]),
    }


def _dense_params(arch) -> int:
    from search_space.architecture import analyze

    return analyze(arch).dense_params


def changes(arch, base) -> list[str]:
    """What differs from the base in the architecture itself (`architecture_params`, as
    MLflow shows it), not in the searcher's raw values: a dropped connection that the
    around space restores (it would cut the sparse features off) is no change."""
    from nas.trial_record import architecture_params

    mine, theirs = architecture_params(arch), architecture_params(base)
    return [f"{k}={v}" for k, v in sorted(mine.items()) if theirs.get(k) != v] + [
        f"{k} (base {v}): gone" for k, v in sorted(theirs.items()) if k not in mine
    ]


def markdown(report: dict) -> str:
    b = report["best_baseline"]
    lines = [f"best baseline {b['name']}: mean val NE {b['mean_val_ne']:.4f}, predicted step "
             f"{b['step_ms']:.3f} ms on 16 devices, {b['step_ms_128']:.3f} ms on 128",
             "", "| trial | mean val NE | vs baseline (p) | step ms (16) | x baseline (16) | "
             "x baseline (128) | x baseline (16), dense part timed here | changes |",
             "|---|---|---|---|---|---|---|---|"]  # fmt: skip
    for r in report["trials"]:
        p = r["paired"] or {}
        delta = r["mean_val_ne"] - b["mean_val_ne"]
        timed = f"{r['measured']['step_ratio_16']:.2f}" if "measured" in r else "n/a"
        lines.append(f"| {r['trial']} | {r['mean_val_ne']:.4f} | {delta:+.4f} "
                     f"(p={p.get('p_value', float('nan')):.2g}) | {r['step_ms']:.3f} | "
                     f"{r['step_ratio_16']:.2f} | {r['step_ratio_128']:.2f} | {timed} | "
                     f"{', '.join(r['changes']) or 'none'} |")  # fmt: skip
    return "\n".join([*lines, "", report["best"], report["verdict"]])


if __name__ == "__main__":
    main()
