"""Reading a study back: trial rows, the leaderboard, the NE-vs-cost Pareto front, status."""

from __future__ import annotations

import csv
import io
import math
from typing import Any

import optuna
from optuna.trial import FrozenTrial, TrialState

from nas.trial_record import StudyAttr
from search_space.errors import RanknasError

COLUMNS = ("trial", "state", "val_ne", "test_ne", "val_auc", "mflops", "params", "latency_ms",
           "throughput", "digest", "worker", "failure_reason")  # fmt: skip


def trial_row(trial: FrozenTrial) -> dict[str, Any]:
    attrs = trial.user_attrs
    row = {"trial": trial.number, "state": trial.state.name.lower()}
    row |= {key: attrs.get(key) for key in COLUMNS if key not in row}
    return row


def rows(study: optuna.Study, include_all: bool = False) -> list[dict[str, Any]]:
    """Complete trials, best first (by the first objective); every trial with `include_all`."""
    trials = study.get_trials(deepcopy=False)
    complete = sorted(
        (t for t in trials if t.state == TrialState.COMPLETE), key=lambda t: t.values[0]
    )
    others = [t for t in trials if t.state != TrialState.COMPLETE] if include_all else []
    return [trial_row(t) for t in [*complete, *others]]


def pareto_front(study: optuna.Study) -> list[dict[str, Any]]:
    """Complete trials that no other beats on both validation NE and MFLOPs."""
    points = [r for r in rows(study) if r["val_ne"] is not None and r["mflops"] is not None]
    front = [
        p
        for p in points
        if not any(
            q["val_ne"] <= p["val_ne"]
            and q["mflops"] <= p["mflops"]
            and (q["val_ne"], q["mflops"]) != (p["val_ne"], p["mflops"])
            for q in points
        )
    ]
    return sorted(front, key=lambda r: r["mflops"])


def best_trial(study: optuna.Study, which: str = "best") -> FrozenTrial:
    """`best` (lowest first objective among complete trials) or a trial number."""
    trials = study.get_trials(deepcopy=False)
    if which == "best":
        complete = [t for t in trials if t.state == TrialState.COMPLETE]
        if not complete:
            raise RanknasError(f"study {study.study_name!r} has no complete trial yet")
        return min(complete, key=lambda t: t.values[0])
    if not which.isdigit() or int(which) >= len(trials):
        raise RanknasError(f"--trial must be 'best' or a trial number below {len(trials)}")
    trial = trials[int(which)]
    if trial.state != TrialState.COMPLETE:
        raise RanknasError(f"trial {which} is {trial.state.name.lower()}, not complete")
    return trial


def status(study: optuna.Study) -> dict[str, Any]:
    trials = study.get_trials(deepcopy=False)
    counts = {s.name.lower(): sum(t.state == s for t in trials) for s in TrialState}
    complete = [t for t in trials if t.state == TrialState.COMPLETE]
    best = min(complete, key=lambda t: t.values[0]) if complete else None
    return {
        "study": study.study_name,
        "budget_trials": study.user_attrs.get(StudyAttr.BUDGET_TRIALS),
        "searcher": study.user_attrs.get(StudyAttr.SEARCHER),
        "objectives": study.user_attrs.get(StudyAttr.OBJECTIVES),
        "trials": counts,
        "best_trial": best.number if best else None,
        "best_val_ne": best.user_attrs.get("val_ne") if best else None,
        "bayes_ne": study.user_attrs.get(StudyAttr.BAYES_NE),
    }


def to_csv(table: list[dict[str, Any]]) -> str:
    """CSV of rows that share their keys (leaderboard rows: `COLUMNS`)."""
    out = io.StringIO()
    writer = csv.DictWriter(out, fieldnames=list(table[0]) if table else list(COLUMNS))
    writer.writeheader()
    writer.writerows(table)
    return out.getvalue()


def format_table(table: list[dict[str, Any]]) -> str:
    """Aligned columns; the latency column only when some trial has a latency."""
    header = ["trial", "state", "val NE", "test NE", "AUC", "MFLOPs", "params", "latency ms",
              "digest"]  # fmt: skip
    lines = [[str(r["trial"]), r["state"], _num(r["val_ne"]), _num(r["test_ne"]),
              _num(r["val_auc"]), _num(r["mflops"], 3), str(r["params"] or "-"),
              _num(r["latency_ms"], 3), r["digest"] or "-"] for r in table]  # fmt: skip
    if all(r["latency_ms"] is None for r in table):
        drop = header.index("latency ms")
        header = header[:drop] + header[drop + 1 :]
        lines = [line[:drop] + line[drop + 1 :] for line in lines]
    return align(header, lines)


def align(header: list[str], lines: list[list[str]]) -> str:
    """A plain-text table: each column as wide as its widest cell."""
    widths = [max(len(x) for x in col) for col in zip(header, *lines, strict=False)]
    return "\n".join(
        "  ".join(cell.ljust(w) for cell, w in zip(line, widths, strict=True)).rstrip()
        for line in [header, *lines]
    )


def format_reevaluation(table: list[dict[str, Any]]) -> str:
    """The rows of `nas.reevaluate.reevaluate_study`."""
    header = ["trial", "recorded val NE", "mean val NE", "sd", "mean test NE", "MFLOPs", "seeds"]
    lines = [[str(r["trial"]), _num(r["recorded_val_ne"]), _num(r["mean_val_ne"]),
              _num(r["sd_val_ne"]), _num(r["mean_test_ne"]), _num(r["mflops"], 3),
              str(r["seeds"])] for r in table]  # fmt: skip
    return align(header, lines)


def _num(value: float | None, digits: int = 4) -> str:
    return (
        "-"
        if value is None or (isinstance(value, float) and math.isnan(value))
        else f"{value:.{digits}f}"
    )


def pareto_png(study: optuna.Study) -> bytes:
    """NE vs MFLOPs of every complete trial, the Pareto front highlighted, as PNG bytes."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    points = [r for r in rows(study) if r["val_ne"] is not None]
    front = pareto_front(study)
    figure, axes = plt.subplots(figsize=(6, 4), dpi=120)
    axes.scatter([p["mflops"] for p in points], [p["val_ne"] for p in points], s=14,
                 color="0.6", label="trials")  # fmt: skip
    axes.plot([p["mflops"] for p in front], [p["val_ne"] for p in front], "o-",
              color="tab:red", label="Pareto front")  # fmt: skip
    bayes = study.user_attrs.get(StudyAttr.BAYES_NE)
    if bayes:
        axes.axhline(
            bayes, color="tab:green", linestyle="--", label=f"Bayes-optimal NE {bayes:.3f}"
        )
    axes.set(xlabel="MFLOPs per example", ylabel="validation NE", title=study.study_name)
    axes.set_xscale("log")
    axes.legend()
    figure.tight_layout()
    out = io.BytesIO()
    figure.savefig(out, format="png")
    plt.close(figure)
    return out.getvalue()
