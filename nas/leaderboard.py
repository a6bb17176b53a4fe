"""Reading a study back: trial rows, the leaderboard, the NE-vs-cost Pareto front, status."""

from __future__ import annotations

import collections
import csv
import io
import json
import math
import statistics
import sys
from typing import Any

import optuna
from optuna.trial import FrozenTrial, TrialState

from nas.storage import SEED_OF
from nas.trial_record import (
    INTERRUPTED,
    StudyAttr,
    TrialAttr,
    counted_trials,
    exhausted,
    failure_reason,
    interrupted,
    mflops_text,
    recorded,
    repeats,
    skipped,
    stopped_on_ceilings,
)
from search_space.errors import RanknasError
from trainers.processes import gone_from_here

# mean_val_ne, mean_test_ne, seeds: the means over `reevaluate`'s fresh seeds, on
# re-evaluated trials; diverged: how many of those seeds' runs ended at NE >= 1 (in the mean)
COLUMNS = ("trial", "state", "val_ne", "test_ne", "val_auc", "test_auc", "test_calibration",
           "runs", "mean_val_ne", "mean_test_ne", "seeds", "diverged", "mflops", "params",
           "latency_ms", "step_ms", "measured_step_ms", "throughput", "digest", "worker",
           "recipe", "proposed_by", "failure_reason")  # fmt: skip
# a paired t-test's p-value under which a difference is beyond seed noise (the verdict),
# and the level of the two one-sided tests that show two finalists equivalent (a tie)
SIGNIFICANCE = 0.05
# two finalists tie when their seed means are shown to differ by less than this share of
# the lower one (0.1% NE; the wins over baselines in BENCHMARKS.md are 0.3-0.4%): seeds
# that merely fail to tell them apart are no tie, or the cheaper would win at any NE
TIE_MARGIN = 0.001
# `reevaluate --front` retrains the cheaper front trials up to this share worse in NE than
# the best baseline: one run's NE moves by ~0.5% with its seed, so 1% is rarely noise
FRONT_SLACK = 0.01
BASELINE_COLUMNS = ("baseline", "state", "val_ne", "test_ne", "val_logloss", "test_logloss",
                    "val_auc", "test_auc", "mflops", "params", "step_ms", "measured_step_ms",
                    "digest", "recipe", "failure_reason")  # fmt: skip


QUEUED = "a queued starting point, not run: a study that goes on (a larger budget) trains it"
# the same, in a study whose budget has room (stopped by its time limit, or Ctrl-C)
QUEUED_NEXT = "a queued starting point, not run yet: the next search trains it"
RETRY = "the retry of trial {}, which did not finish: the next search trains it first"


def trial_state(trial: FrozenTrial) -> str:
    """Optuna's state, `skipped` (over a constraint, told as pruned without training),
    `repeat` (an architecture trained before, told with that trial's result) or
    `interrupted` (failed by Ctrl-C or SIGTERM, retried on resume: not a failure)."""
    if trial.user_attrs.get(TrialAttr.OVER_CONSTRAINT):
        return "skipped"
    if TrialAttr.REUSED_FROM in trial.user_attrs:
        return "repeat"
    if interrupted(trial):
        return INTERRUPTED
    return trial.state.name.lower()


def trial_row(trial: FrozenTrial, room: bool = False) -> dict[str, Any]:
    """`trial`'s leaderboard row; `room`: its study's budget is not spent (a queued point
    is then trained by the next search as it is)."""
    attrs = trial.user_attrs
    row = {"trial": trial.number, "state": trial_state(trial)}
    row |= {key: attrs.get(key) for key in COLUMNS if key not in row}
    row["failure_reason"] = failure_reason(trial)
    if row["state"] == "waiting":  # a finished study listed it without a word
        first = trial.system_attrs.get(SEED_OF)  # a retry's first trial
        queued = QUEUED_NEXT if room else QUEUED
        row["failure_reason"] = queued if first is None else RETRY.format(first)
    if row["state"] == "complete" and row["runs"] is None:
        row["runs"] = 1  # not confirmed (`budget.confirm_seeds`): one training run
    return row


def rows(study: optuna.Study, include_all: bool = False) -> list[dict[str, Any]]:
    """Complete trials, the study's best (`study_best`) first, then the other re-evaluated
    trials by seed mean, then the rest by the first objective; with `include_all` then every
    other trial (failed, pruned, skipped, repeats) in trial order."""
    complete = by_recorded_run(study)
    best = _choose_best(study, complete)
    first = [r for r in complete if best and r["trial"] == best["trial"]]
    meaned = sorted((r for r in complete if r["mean_val_ne"] is not None and r not in first),
                    key=lambda r: r["mean_val_ne"])  # fmt: skip
    rest = [r for r in complete if r["mean_val_ne"] is None and r not in first]
    trials = study.get_trials(deepcopy=False)
    budget = study.user_attrs.get(StudyAttr.BUDGET_TRIALS)
    room = budget is not None and counted_trials(trials) < budget
    others = (
        [trial_row(t, room) for t in trials if trial_state(t) != "complete"] if include_all else []
    )
    return [*first, *meaned, *rest, *others]


def view_ranks(study: optuna.Study) -> dict[str, int]:
    """The order of trials and baselines together in the MLflow view once the study is
    re-evaluated (`rank`, 1 first), the leaderboard's: those with seed means by them, then
    the others by their recorded validation NE, with the study's best (`study_best`) in the
    place of the lowest trial (a tie goes to the cheaper: it is first of the trials). Keyed
    by run (`trial:N`, `baseline:KEY`). (Sorted by seed mean alone, a tie's cheaper best was
    not first, and the best trials not yet re-evaluated came last, newest first.)"""
    table = rows(study)  # the best first, then the trials in their order
    # by seed means first once trials have them; before, the baselines' (best_baseline.seeds)
    # among the trials' recorded runs, as the verdict meets them (not all ahead of the trials)
    grouped = any(r["mean_val_ne"] is not None for r in table)
    keyed = [(grouped and r["mean_val_ne"] is None, estimated_ne(r), 1, f"trial:{r['trial']}")
             for r in table]  # fmt: skip
    if keyed:  # the best takes the lowest trial's place, ahead of it
        group = keyed[0][0]
        lowest = min(k[1] for k in keyed if k[0] == group)
        keyed[0] = (group, lowest, 0, keyed[0][3])
    keyed += [(grouped and b["mean_val_ne"] is None, estimated_ne(b), 1,
               f"baseline:{b['baseline']}") for b in baseline_rows(study)
              if b["state"] == "complete" and b["val_ne"] is not None]  # fmt: skip
    ordered = [subject for *_, subject in sorted(keyed, key=lambda k: k[:3])]
    return {subject: rank for rank, subject in enumerate(ordered, start=1)}


def by_recorded_run(study: optuna.Study) -> list[dict[str, Any]]:
    """Complete trials by the first objective of their recorded runs (an architecture
    proposed again is listed once, as first trained), with their seed means once
    re-evaluated."""
    means = seed_means(study)
    complete = sorted((t for t in study.get_trials(deepcopy=False) if trial_state(t) == "complete"),
                      key=lambda t: t.values[0])  # fmt: skip
    table = []
    for t in complete:
        mean = means.get(str(t.number), {})
        table.append(trial_row(t) | {"mean_val_ne": mean.get("val_ne"),
                                     "mean_test_ne": mean.get("test_ne"),
                                     "seeds": mean.get("seeds"),
                                     "diverged": mean.get("diverged")})  # fmt: skip
    return table


def study_best(study: optuna.Study) -> dict[str, Any] | None:
    """The study's best trial, the one that `status`, the leaderboard's first row, the
    MLflow parent run, `export --trial best` and the model card all name; None without a
    complete trial.

    Once `reevaluate` has retrained finalists: the lowest mean validation NE over their
    fresh seeds, unless a finalist shown equivalent to it (paired by seed, `equivalent`
    within `TIE_MARGIN`: a tie) costs less (`cost_key`: the study's cost objective, else
    MFLOPs); then the cheapest of the tie. Before: the lowest recorded first objective (one
    run each, or a confirmed trial's seeds). `basis` names which; `lowest` is the trial of
    the lowest value, `ties` the finalists equivalent to it."""
    return _choose_best(study, by_recorded_run(study))


# why a study of complete trials names no best
EVERY_FINALIST_DIVERGED = (
    "every re-evaluated trial's seed mean is worse than the base rate (NE >= 1): a failure, "
    "not a model; search on (more trials, or another space)"
)


def _choose_best(study: optuna.Study, complete: list[dict[str, Any]]) -> dict[str, Any] | None:
    finalists = [r for r in complete if r["mean_val_ne"] is not None]
    if finalists and not any(r["mean_val_ne"] < 1 for r in finalists):
        return None  # `EVERY_FINALIST_DIVERGED`: not the recorded runs their seeds belie
    finalists = [r for r in finalists if r["mean_val_ne"] < 1]
    if not finalists:
        if not complete:
            return None
        chosen = complete[0]
        return _best(chosen, "recorded runs", chosen["val_ne"], chosen["test_ne"], chosen, [])
    lowest = min(finalists, key=lambda r: r["mean_val_ne"])
    ties = [r for r in finalists if r is not lowest and _tie(study, lowest, r)]
    key = cost_key(study)
    chosen = min([lowest, *ties], key=lambda r: (_cost(r, key), r["mean_val_ne"]))
    means = seed_means(study)[str(chosen["trial"])]
    # its own seeds (a second `reevaluate --seeds 4` gave it 4: "over 3" was the fewest any
    # finalist had), and the finalists' range where they differ
    basis = f"seed means over {seeds_text(chosen['seeds'])}"
    counts = sorted({r["seeds"] for r in finalists})
    if len(counts) > 1:
        basis += f" (the finalists' {counts[0]} to {counts[-1]})"
    return _best(chosen, basis, means["val_ne"], means["test_ne"], lowest, ties)


def _best(
    chosen: dict[str, Any],
    basis: str,
    val_ne: float,
    test_ne: float | None,
    lowest: dict[str, Any],
    ties: list[dict[str, Any]],
) -> dict[str, Any]:
    value = "mean_val_ne" if basis != "recorded runs" else "val_ne"
    return {"trial": chosen["trial"], "basis": basis, "val_ne": val_ne, "test_ne": test_ne,
            "mflops": chosen["mflops"], "step_ms": chosen.get("step_ms"),
            "digest": chosen["digest"],
            "lowest": {"trial": lowest["trial"], "val_ne": lowest[value],
                       "mflops": lowest["mflops"], "step_ms": lowest.get("step_ms")},
            "ties": [{"trial": r["trial"], "val_ne": r[value], "mflops": r["mflops"],
                      "step_ms": r.get("step_ms")} for r in ties]}  # fmt: skip


def _tie(study: optuna.Study, lowest: dict[str, Any], other: dict[str, Any]) -> bool:
    """Whether a re-evaluated trial is shown equivalent to the lowest seed mean."""
    paired = paired_seeds(study, str(other["trial"]), str(lowest["trial"]))
    return equivalent(paired, TIE_MARGIN * lowest["mean_val_ne"])


def equivalent(paired: dict[str, Any] | None, margin: float, level: float = SIGNIFICANCE) -> bool:
    """Whether paired runs (`paired_seeds`) are shown to differ by less than `margin` NE:
    two one-sided paired t-tests, each at `level` (at `SIGNIFICANCE`, the differences' 90%
    confidence interval inside +-margin; the verdict's lower for the comparisons it made,
    `corrected`). Few or noisy seeds show no equivalence, whatever their p."""
    if paired is None:
        return False
    mean, sd, n = paired["delta_val_ne_mean"], paired["delta_val_ne_sd"], paired["seeds"]
    if sd == 0:
        return abs(mean) < margin
    from scipy.special import stdtr  # Student's t CDF (see `paired_seeds`)

    error = sd / math.sqrt(n)
    above = stdtr(n - 1, -(mean + margin) / error)  # p of "the difference is <= -margin"
    below = stdtr(n - 1, (mean - margin) / error)  # p of "the difference is >= +margin"
    return bool(max(above, below) < level)


def within_seed_noise(paired: dict[str, Any] | None) -> bool:
    """Whether paired runs (`paired_seeds`) differ by no more than their seeds' noise: a
    paired t-test's p >= `SIGNIFICANCE`, or no p at all (no spread to test); False
    without pairs."""
    return paired is not None and (paired["p_value"] is None or paired["p_value"] >= SIGNIFICANCE)


def _cost(row: dict[str, Any], key: str) -> float:
    return row[key] if row.get(key) is not None else math.inf


def describe_best(best: dict[str, Any]) -> str:
    """One line: the best trial, its basis and value, and, in a tie, why it was chosen."""
    line = (f"trial {best['trial']} ({best['basis']}): validation NE {_num(best['val_ne'], 5)}, "
            f"{costs_text(best)}")  # fmt: skip
    if not best["ties"]:
        return line
    lowest = best["lowest"]
    others = [lowest, *best["ties"]]
    tied = ", ".join(f"trial {r['trial']} {_num(r['val_ne'], 5)} at {costs_text(r)}"
                     for r in others if r["trial"] != best["trial"])  # fmt: skip
    line += (f"; a tie, equivalent within {TIE_MARGIN:.1%} NE (paired by seed), with {tied}: "
             "the tie goes to the cheaper")  # fmt: skip
    if lowest["trial"] != best["trial"]:
        line += f" (trial {lowest['trial']} has the lowest mean)"
    return line


def seeds_text(count: int, fresh: bool = True) -> str:
    """`5 fresh seeds`, `1 fresh seed`."""
    return f"{count} {'fresh ' if fresh else ''}seed{'s' if count != 1 else ''}"


def costs_text(row: dict[str, Any]) -> str:
    """MFLOPs, and the predicted step where the study has one (then the tie rule's cost)."""
    text = f"{mflops_text(row['mflops'])} MFLOPs"
    if row.get("step_ms") is None:
        return text
    return f"{text} and {row['step_ms']:.3f} ms a step (predicted)"


def baseline_rows(study: optuna.Study) -> list[dict[str, Any]]:
    """The study's baselines (`nas.baselines`), in the order the config lists them, with
    their seed means where they were retrained (`best_baseline.seeds`, `reevaluate`)."""
    table, means = [], seed_means(study)
    for key, record in recorded(study).items():
        row = {"baseline": key, "state": record.get("status")}
        row |= {c: record.get(c) for c in BASELINE_COLUMNS if c not in row}
        mean = means.get(f"baseline:{key}", {})
        table.append(row | {"mean_val_ne": mean.get("val_ne"), "mean_test_ne": mean.get("test_ne"),
                            "seeds": mean.get("seeds"),
                            "diverged": mean.get("diverged")})  # fmt: skip
    return table


def estimated_ne(row: dict[str, Any]) -> float | None:
    """A trial's or baseline's validation NE as the study knows it best: its seed mean once
    retrained, else its recorded run."""
    return row["mean_val_ne"] if row.get("mean_val_ne") is not None else row["val_ne"]


COST_UNITS = {"mflops": "MFLOPs", "params": "params", "latency_ms": "ms forward",
              "step_ms": "predicted ms a step"}  # fmt: skip


def cost_key(study: optuna.Study) -> str:
    """The cost the study trades NE against: its second objective, else MFLOPs."""
    return traded_cost(study) or "mflops"


def traded_cost(study: optuna.Study) -> str | None:
    """The study's second objective, a cost (`objectives.cost`); None without one."""
    names = study.user_attrs.get(StudyAttr.OBJECTIVES) or []
    return names[1] if len(names) > 1 and names[1] in COST_UNITS else None


def pareto_front(study: optuna.Study) -> list[dict[str, Any]]:
    """Complete trials that no other beats on both validation NE (`estimated_ne`: seed means
    where re-evaluated) and the study's cost."""
    key = cost_key(study)
    points = [r for r in rows(study)  # a seed mean of inf (a run went nan/inf): not a point
              if estimated_ne(r) is not None and math.isfinite(estimated_ne(r))
              and r.get(key) is not None]  # fmt: skip
    front = [p for p in points if not any(_dominates(q, p, key) for q in points)]
    return sorted(front, key=lambda r: r[key])


def front_baseline(study: optuna.Study) -> dict[str, Any] | None:
    """The baseline the Pareto front is measured against: the best complete one (by seed
    means where they are known), None without one or where it has no cost."""
    bases = [b for b in baseline_rows(study) if b["state"] == "complete"]
    meaned = [b for b in bases if b["mean_val_ne"] is not None]
    base = min(meaned or bases, key=estimated_ne, default=None)
    return base if base is not None and base.get(cost_key(study)) is not None else None


def front_below_baseline(study: optuna.Study) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """The Pareto front's trials cheaper than the best baseline (the verdict's: by seed
    means where it has them), split into those at most `FRONT_SLACK` worse in NE (where a
    model as good at a lower cost may be, once their seeds are known: `reevaluate
    --front`) and the others; two empty lists without a baseline that has a cost."""
    key, base = cost_key(study), front_baseline(study)
    if base is None:
        return [], []
    bound = estimated_ne(base) * (1 + FRONT_SLACK)
    cheaper = [r for r in pareto_front(study) if r[key] < base[key]]
    return ([r for r in cheaper if estimated_ne(r) <= bound],
            [r for r in cheaper if estimated_ne(r) > bound])  # fmt: skip


def _dominates(q: dict[str, Any], p: dict[str, Any], key: str = "mflops") -> bool:
    """`q` is no worse than `p` on validation NE (`estimated_ne`) and the cost `key`, and
    better on one."""
    if q.get(key) is None or p.get(key) is None:
        return False
    q_ne, p_ne = estimated_ne(q), estimated_ne(p)
    return q_ne <= p_ne and q[key] <= p[key] and (q_ne, q[key]) != (p_ne, p[key])


def verdict(study: optuna.Study) -> dict[str, Any] | None:
    """The best found architecture against the best baseline (None without both).

    By validation NE of the recorded runs, or of seed means once `reevaluate` has retrained
    the finalists and the baselines with the same fresh seeds: then only the trials and
    baselines that have seed means are compared (`not_compared` lists the other baselines).
    Before that, where the study picked its best baseline by seed means
    (`best_baseline.seeds`), the trials' recorded runs meet those means: the baseline the
    study calls best, at its mean, not one lucky or unlucky run of it. A baseline whose run
    failed or diverged is not compared, nor one whose seed mean is worse than the base
    rate (NE >= 1). Test NE is reported beside it.
    """
    complete = found = [r for r in rows(study) if r["val_ne"] is not None]
    recorded_bases = [r for r in baseline_rows(study) if r["val_ne"] is not None]
    bases = [r for r in recorded_bases if r["state"] == "complete"]  # not a diverged one
    if not found or not bases:
        return None
    means = seed_means(study)
    diverged = [r for r in bases  # on average worse than the base rate
                if means.get(f"baseline:{r['baseline']}", {}).get("val_ne", 0) >= 1]  # fmt: skip
    bases = [r for r in bases if r not in diverged]
    if not bases:
        return None
    failed = [r["baseline"] for r in recorded_bases if r not in bases]
    basis, not_compared, on_means = "recorded runs", [], False
    meaned = [r for r in bases if f"baseline:{r['baseline']}" in means]
    if meaned:
        on_means = any(str(r["trial"]) in means for r in found)  # trials' and baselines'
        if on_means:
            found = [r | means[str(r["trial"])] for r in found if str(r["trial"]) in means]
        not_compared = [r["baseline"] for r in bases if r not in meaned]
        bases = [r | means[f"baseline:{r['baseline']}"] for r in meaned]
        seeds = min(means[f"baseline:{r['baseline']}"]["seeds"] for r in meaned)
        basis = (f"seed means over {seeds_text(seeds)}" if on_means else
                 f"recorded runs against the baselines' seed means over "
                 f"{seeds_text(seeds, fresh=False)}")  # fmt: skip
    dominated = {b["baseline"]: by for b in bases if (by := _dominators(b, found, study))}
    single = [r for r in complete if str(r["trial"]) not in means]  # not retrained
    dominated_once = _dominated_by_single_runs(study, bases, dominated, single) if on_means else {}
    named = study_best(study)  # the best every surface names, ties included; where every
    chosen = named["trial"] if named else min(found, key=lambda r: r["val_ne"])["trial"]
    best = next(r for r in found if r["trial"] == chosen)  # finalist diverged, the lowest
    base = min(bases, key=lambda r: r["val_ne"])
    paired = confirmed = None
    if on_means:
        best, base, shared = _on_shared_seeds(study, best, base)
        if shared is not None:
            basis = f"seed means over the {seeds_text(shared, fresh=False)} both were trained with"
        paired = paired_seeds(study, str(best["trial"]), f"baseline:{base['baseline']}")
        # the side that is lower is the best of its side's candidates, all on these seeds
        chosen_from, among = ((len(found), "re-evaluated trials") if best["val_ne"] < base["val_ne"]
                              else (len(bases), "baselines"))  # fmt: skip
        paired = corrected(paired, chosen_from, among, looks(study))
        confirmed = confirmation(study, best, base)
    selection, chosen_base, chosen_on = paired, base, basis
    if confirmed is not None:  # the pair's test on seeds that chose nothing replaces it
        best, base, paired, count = confirmed
        basis = (f"confirmation: seed means over the {seeds_text(count, fresh=False)} that "
                 f"chose nothing; the pair chosen on {basis}")  # fmt: skip
    delta_test = (None if best["test_ne"] is None or base["test_ne"] is None
                  else best["test_ne"] - base["test_ne"])  # fmt: skip
    # the compared baseline's architecture, or another baseline's (one added, not compared
    # yet, was left out of this check, and the search "won" with the user's own model)
    same_as = next((b["baseline"] for b in [base, *recorded_bases]
                    if best.get("digest") is not None and b.get("digest") == best["digest"]),
                   None)  # fmt: skip
    same = same_as is not None
    fields = {
        "basis": basis,
        "seed_means": on_means,
        "paired": paired,
        "selection_paired": selection,  # the test on the seeds that chose the pair
        "selection_basis": chosen_on,
        "confirmed": confirmed is not None,
        # the pair's confirmation runs the test was made of, {key: {seed: [val, test]}}
        "confirmation_runs": _confirmation_runs(study, best, base) if confirmed else None,
        "confirmation_unused": None if confirmed else _confirmation_unused(study, best, base),
        "best_trial": {k: best.get(k) for k in ("trial", "val_ne", "test_ne", "mflops", "step_ms")},
        "best_baseline": {
            k: base.get(k) for k in ("baseline", "val_ne", "test_ne", "mflops", "step_ms")
        },
        "delta_val_ne": best["val_ne"] - base["val_ne"],
        "equivalent": equivalent(
            paired,
            TIE_MARGIN * min(best["val_ne"], base["val_ne"]),
            SIGNIFICANCE / (paired or {}).get("comparisons", 1),
        ),
        "delta_test_ne": delta_test,
        "flops_ratio": best["mflops"] / base["mflops"] if base["mflops"] else None,
        "step_ratio": best["step_ms"] / base["step_ms"]
        if best.get("step_ms") and base.get("step_ms")
        else None,
        "step_devices": study.user_attrs.get(StudyAttr.STEP_DEVICES),
        "search_lower": best["val_ne"] < base["val_ne"] and not same,
        "same_architecture": same,
        "same_as": same_as,
        "test_agrees": None
        if delta_test is None
        else (delta_test < 0) == (best["val_ne"] < base["val_ne"]),
        "not_compared": not_compared,
        "failed_baselines": failed,
        "baselines_tuned": recorded(study).get(base["baseline"], {}).get("tuned", 0),
        "dominated_baselines": list(dominated),
        "dominated_within_noise": [
            b
            for b, by in dominated.items()
            if on_means and not _any_beyond_noise(study, b, by, len(found))
        ],
        "not_compared_lower": _left_out_lower(recorded_bases, not_compared, best, base),
        "dominated_by_single_runs": dominated_once,
        "cheapest_within_noise": _cheapest_within_noise(study, found, chosen_base)
        if on_means and traded_cost(study)
        else None,
        "cost": cost_key(study),
    }
    return fields | {"outcome": outcome(fields)}


def _on_shared_seeds(
    study: optuna.Study, best: dict[str, Any], base: dict[str, Any]
) -> tuple[dict[str, Any], dict[str, Any], int | None]:
    """`best` and `base` with their seed means over the seeds both were trained with, and
    how many those are (None where they have the same seeds): a baseline chosen by
    `best_baseline.seeds` may have more seeds than a trial `reevaluate --seeds` retrained
    with fewer; its mean over all of them beside the trial's was a comparison of two seed
    sets, labelled with one."""
    record = study.user_attrs.get(StudyAttr.REEVALUATION, {})
    a, b = record.get(str(best["trial"]), {}), record.get(f"baseline:{base['baseline']}", {})
    shared = _shared_seeds(a, b)
    if _shared_seeds(a, a) == _shared_seeds(b, b) or not shared:
        return best, base, None
    return _over_seeds(best, a, shared), _over_seeds(base, b, shared), len(shared)


def _shared_seeds(a: dict[str, list], b: dict[str, list]) -> list[str]:
    """The seeds both runs records (`{seed: [val NE, test NE]}`) have a validation NE for: a
    run that went nan/inf (inf) is its seed's outcome; one that failed (None) is in neither."""
    return sorted(s for s in a.keys() & b.keys() if a[s][0] is not None and b[s][0] is not None)


def _over_seeds(row: dict[str, Any], runs: dict[str, list], seeds: list[str]) -> dict[str, Any]:
    """`row` at its runs' mean validation and test NE over `seeds`."""
    test = [runs[s][1] for s in seeds if runs[s][1] is not None]
    return row | {"val_ne": statistics.fmean(runs[s][0] for s in seeds),
                  "test_ne": statistics.fmean(test) if test else None}  # fmt: skip


def confirmation(
    study: optuna.Study, best: dict[str, Any], base: dict[str, Any]
) -> tuple[dict[str, Any], dict[str, Any], dict[str, Any] | None, int] | None:
    """`best` and `base` at their means over the confirmation seeds both were trained with
    (`ranknas confirm`: seeds that chose neither side), their paired test on those (None
    where a run went nan/inf: its mean is inf, and the verdict's rules for that apply),
    corrected for the confirmation's looks alone (`chosen_from` 1: the pair was chosen on
    other seeds), and how many seeds; None under two such seeds."""
    record = study.user_attrs.get(StudyAttr.CONFIRMATION, {})
    found, key = str(best["trial"]), f"baseline:{base['baseline']}"
    a, b = record.get(found, {}), record.get(key, {})
    shared = _shared_seeds(a, b)
    if len(shared) < 2:
        return None
    paired = corrected(paired_seeds(study, found, key, StudyAttr.CONFIRMATION), 1,
                       "confirmation", len(confirmation_tests(study)))  # fmt: skip
    if paired is not None:
        paired |= {"confirmed": True}
    return _over_seeds(best, a, shared), _over_seeds(base, b, shared), paired, len(shared)


def _confirmation_runs(
    study: optuna.Study, best: dict[str, Any], base: dict[str, Any]
) -> dict[str, dict[str, list]]:
    record = study.user_attrs.get(StudyAttr.CONFIRMATION, {})
    keys = (str(best["trial"]), f"baseline:{base['baseline']}")
    return {key: record.get(key, {}) for key in keys}


def confirmed_pairs(study: optuna.Study) -> list[list[str]]:
    """The [trial, baseline] pairs whose confirmation runs share two seeds or more."""
    record = study.user_attrs.get(StudyAttr.CONFIRMATION, {})
    bases = [k for k in record if k.startswith("baseline:")]
    return [[t, k.removeprefix("baseline:")] for t in record if t not in bases for k in bases
            if len(_shared_seeds(record[t], record[k])) >= 2]  # fmt: skip


def _confirmation_unused(
    study: optuna.Study, best: dict[str, Any], base: dict[str, Any]
) -> dict[str, Any] | None:
    """Why the study's confirmation runs are not the verdict's test, where it has some:
    they are another pair's (`pair`: [trial, baseline], the last tested where that is one),
    or under two seeds (`pair` None)."""
    if not study.user_attrs.get(StudyAttr.CONFIRMATION):
        return None
    others = [p for p in confirmed_pairs(study) if p != [str(best["trial"]), base["baseline"]]]
    last = [test[:2] for test in confirmation_tests(study)[-1:]]
    if not others:
        return {"pair": None}
    return {"pair": last[0] if last and last[0] in others else others[-1]}


def why_no_verdict(study: optuna.Study) -> str:
    """Why `verdict` is None, in one line (a study with baselines that has none)."""
    if not any(r["val_ne"] is not None for r in rows(study)):
        return "no verdict yet: no trial is complete"
    names = ", ".join(b["baseline"] for b in baseline_rows(study))
    return (
        f"no verdict: every baseline failed or diverged, not compared: {names} (the "
        "failure reason column says why)"
    )


OUTCOMES = {
    "search_wins": "the search wins",
    "baseline_wins": "the baseline wins",
    "search_leads": "the search leads",
    "baseline_leads": "the baseline leads",
    "undecided": "undecided: within seed noise, not shown equal",
    "tie": f"a tie: shown within {TIE_MARGIN:.1%} NE of each other by seed",
    "no_win": "no win: the search's best is the baseline's own architecture",
}


def outcome(v: dict[str, Any]) -> str:
    """The verdict as one of `OUTCOMES`' keys (`leaderboard --json`'s `verdict.outcome`).
    Only paired seed means beyond their noise decide a win: on single runs (or means of one
    seed) the trial is the best of many runs, lucky seeds included, so one side leads."""
    if v.get("same_architecture"):
        return "no_win"
    if v.get("seed_means") and not math.isfinite(v["best_trial"]["val_ne"]):
        return "baseline_wins"  # a seed of the trial went nan/inf: the baseline's did not
    if v.get("equivalent"):
        return "tie"
    if within_seed_noise(v.get("paired")):
        return "undecided"
    side = "search" if v["search_lower"] else "baseline"
    decided = v.get("seed_means") and v.get("paired") is not None
    return f"{side}_wins" if decided else f"{side}_leads"


def _cheapest_within_noise(
    study: optuna.Study, found: list[dict[str, Any]], base: dict[str, Any]
) -> dict[str, Any] | None:
    """Of the re-evaluated trials cheaper than `base` (the study's cost objective), the cheapest at
    its NE: a seed mean lower, or at most `TIE_MARGIN` higher and within seed noise (paired
    seeds; a mean 1% worse that five seeds cannot tell apart does not count). What a study
    held to a baseline's cost asks. `trial` is None where there is none; None without the
    baseline's cost."""
    key, name = cost_key(study), f"baseline:{base['baseline']}"
    if base.get(key) is None:
        return None
    cheaper = sorted((r for r in found if _cost(r, key) < base[key]), key=lambda r: r[key])
    for row in cheaper:
        paired = paired_seeds(study, str(row["trial"]), name)
        if paired and _holds_ne(paired, base["val_ne"]):
            tests = (row.get("test_ne"), base.get("test_ne"))
            return {"trial": row["trial"], "val_ne": row["val_ne"], "paired": paired,
                    "delta_val_ne": row["val_ne"] - base["val_ne"],
                    "delta_test_ne": None if None in tests else tests[0] - tests[1],
                    "cost_ratio": row[key] / base[key]}  # fmt: skip
    return {"trial": None, "cheaper": len(cheaper)}


def _holds_ne(paired: dict[str, Any], base_ne: float) -> bool:
    mean = paired["delta_val_ne_mean"]
    return mean < 0 or (mean <= TIE_MARGIN * base_ne and within_seed_noise(paired))


def _left_out_lower(
    recorded_bases: list[dict[str, Any]],
    not_compared: list[str],
    best: dict[str, Any],
    base: dict[str, Any],
) -> dict[str, float]:
    """The baselines left out of the verdict (no seed means) whose one run is below both
    sides' NE: a baseline added after `reevaluate` can be the best model of the study."""
    floor = min(best["val_ne"], base["val_ne"])
    return {r["baseline"]: r["val_ne"] for r in recorded_bases
            if r["baseline"] in not_compared and r["val_ne"] < floor}  # fmt: skip


def _dominators(
    base: dict[str, Any], found: list[dict[str, Any]], study: optuna.Study
) -> list[dict[str, Any]]:
    """The found architectures, other than the baseline's own, that dominate it."""
    key = cost_key(study)
    return [r for r in found if _dominates(r, base, key) and r["digest"] != base["digest"]]


def _dominated_by_single_runs(
    study: optuna.Study,
    bases: list[dict[str, Any]],
    dominated: dict[str, Any],
    single: list[dict[str, Any]],
) -> dict[str, list[int]]:
    """Baselines not dominated on seed means that a trial not yet retrained (`single`)
    dominates by its one run, with those trials: the Pareto plot draws them, the verdict
    does not count them."""
    found = {b["baseline"]: _dominators(b, single, study) for b in bases}
    return {b: [r["trial"] for r in by] for b, by in found.items() if by and b not in dominated}


def _any_beyond_noise(
    study: optuna.Study, baseline: str, rows: list[dict[str, Any]], finalists: int
) -> bool:
    """Whether one of `rows`, drawn from `finalists` re-evaluated trials, has a lower NE than
    `baseline` beyond seed noise (paired seeds, `corrected`; without pairs, nothing is
    shown)."""
    among, look_count = "re-evaluated trials", looks(study)
    pairs = [corrected(paired_seeds(study, str(r["trial"]), f"baseline:{baseline}"), finalists,
                       among, look_count) for r in rows]  # fmt: skip
    return any(p is not None and not within_seed_noise(p) for p in pairs)


def corrected(
    paired: dict[str, Any] | None, chosen_from: int, among: str, look_count: int
) -> dict[str, Any] | None:
    """`paired` (`paired_seeds`) with a p-value that holds for the way it was found
    (Bonferroni, at most 1): its single test's p times the `chosen_from` candidates (of
    `among`: "baselines") the lower side was chosen among (on these same seeds, so the
    luckiest draw of them) and the `look_count` looks at the verdict (`looks`: each
    `reevaluate` round that changed its paired test; stopping at the first p under
    `SIGNIFICANCE` finds one by chance). `p_single` keeps the single test's p,
    `comparisons` the factor."""
    if paired is None:
        return None
    factor, p = max(chosen_from, 1) * max(look_count, 1), paired["p_value"]
    return paired | {"p_value": None if p is None else min(1.0, p * factor),
                     "p_single": p, "comparisons": factor, "chosen_from": chosen_from,
                     "among": among, "looks": look_count}  # fmt: skip


def looks(study: optuna.Study) -> int:
    """How many rounds of re-evaluation runs changed the verdict's paired test: the times it
    was tested on seed means (`reevaluate._count_look`). A study re-evaluated before they
    were counted: 1, and its next round one more whatever it changed (its last test is not
    known)."""
    counted = study.user_attrs.get(StudyAttr.REEVALUATION_LOOKS)
    if counted is not None:
        return counted["count"]
    record = study.user_attrs.get(StudyAttr.REEVALUATION, {})
    return int(any(not key.startswith("baseline:") for key in record))


def confirmation_tests(study: optuna.Study) -> list[list]:
    """The confirmed tests the verdict has shown, [trial, baseline, seeds] each once, oldest
    first (`reevaluate._count_confirmation_look`): how many looks at the confirmation."""
    return (study.user_attrs.get(StudyAttr.CONFIRMATION_LOOKS) or {}).get("shown", [])


def paired_seeds(
    study: optuna.Study, found: str, base: str, attr: str = StudyAttr.REEVALUATION
) -> dict[str, Any] | None:
    """The re-evaluation runs (`attr`: or the confirmation's) of `found` and `base` (keys of
    the record) paired by seed:
    how many seeds, on how many the found architecture has the lower validation NE, the
    per-seed differences' mean and standard deviation and a two-sided paired t-test's
    p-value (None for fewer than two seeds). One run's NE moves with its seed by about as
    much as the search's margins, so a mean difference alone does not say whether it holds."""
    record = study.user_attrs.get(attr, {})
    a, b = record.get(found, {}), record.get(base, {})
    seeds = _shared_seeds(a, b)
    diffs = [a[s][0] - b[s][0] for s in seeds]
    if len(seeds) < 2 or not all(map(math.isfinite, diffs)):  # inf: a run went nan/inf
        return None
    mean, sd = statistics.fmean(diffs), statistics.stdev(diffs)
    if sd > 0:  # by hand: scipy's ttest_rel warns and loses precision on near-equal differences
        from scipy.special import stdtr  # Student's t CDF; scipy.stats takes 1 s to import

        t = mean / (sd / math.sqrt(len(diffs)))
        p_value: float | None = float(2 * stdtr(len(diffs) - 1, -abs(t)))
    else:  # the same difference on every seed
        p_value = 0.0 if mean else None
    return {"seeds": len(seeds), "found_better": sum(d < 0 for d in diffs),
            "delta_val_ne_mean": mean, "delta_val_ne_sd": sd, "p_value": p_value}  # fmt: skip


def seed_means(study: optuna.Study) -> dict[str, dict[str, Any]]:
    """Mean validation and test NE of each re-evaluated trial and baseline, and how many of
    its seeds diverged (NE >= 1: worse than the base rate, yet that seed's outcome, so in
    the mean, which it raises; a run whose loss or predictions went nan/inf is at NE inf,
    and so is the mean)."""
    out = {}
    for key, runs in study.user_attrs.get(StudyAttr.REEVALUATION, {}).items():
        val = [v for v, _ in runs.values() if v is not None]
        test = [t for _, t in runs.values() if t is not None]
        if val:
            out[key] = {"val_ne": statistics.fmean(val), "seeds": len(val),
                        "diverged": diverged(val), "sd_val_ne": spread(val),
                        "test_ne": statistics.fmean(test) if test else None}  # fmt: skip
    return out


def diverged(val_ne: list[float]) -> int:
    """How many of a model's seeds' runs ended worse than the base rate (NE >= 1) or went
    nan/inf (NE inf)."""
    return sum(ne >= 1 for ne in val_ne)


def spread(val_ne: list[float]) -> float:
    """The seeds' standard deviation: 0 for one seed, inf where a run went nan/inf."""
    if not all(map(math.isfinite, val_ne)):
        return math.inf
    return statistics.stdev(val_ne) if len(val_ne) > 1 else 0.0


def reeval_metrics(mean: dict[str, Any]) -> dict[str, float]:
    """One re-evaluated trial's or baseline's seed means (`seed_means`) as its MLflow run's
    metrics. A mean that a nan/inf run made inf is the largest float, as MLflow's database
    stores an inf: leaving it out kept the finite mean of fewer seeds, which MLflow has no
    way to delete, first in the runs sorted by it."""
    metrics = {"reeval_mean_val_ne": mean["val_ne"], "reeval_sd_val_ne": mean["sd_val_ne"],
               "reeval_mean_test_ne": mean["test_ne"], "reeval_seeds": mean["seeds"],
               "reeval_diverged": mean["diverged"]}  # fmt: skip
    return {k: v if math.isfinite(v) else sys.float_info.max
            for k, v in metrics.items() if v is not None and not math.isnan(v)}  # fmt: skip


def format_verdict(v: dict[str, Any]) -> str:
    """Three lines: who wins on validation NE (and whether test NE agrees), at what FLOPs;
    the dominated baselines; on seed means, whether the difference is beyond the seeds'
    noise. On single runs (or means of one seed) nobody wins: the trial is the best of many
    runs, lucky seeds included, so one side only leads until `reevaluate` pairs seeds."""
    found, base = v["best_trial"], v["best_baseline"]
    lower = "the search's" if v["delta_val_ne"] < 0 else "the baseline's"
    kind = v.get("outcome") or outcome(v)
    said = OUTCOMES[kind]
    if kind == "no_win":
        said = (f"no win: the search's best is baseline {v.get('same_as') or base['baseline']}"
                "'s own architecture (the same digest), its NE apart by seed alone")  # fmt: skip
    elif kind in ("tie", "undecided"):
        said += f" ({lower} mean is lower)"
    elif not math.isfinite(found["val_ne"]):
        said += f" (a seed of trial {found['trial']} went nan or inf: its mean is inf)"
    if kind.endswith("_leads"):
        on = "single runs" if not v.get("seed_means") else "too few seeds to test"
        said += f" on {on}, not yet a verdict"
    # within seed noise nobody is ahead on validation for test NE to disagree with
    if v.get("test_agrees") is False and kind not in ("no_win", "tie", "undecided"):
        said += (" (validation only: test NE disagrees)" if kind.endswith("_leads")
                 else " on validation only (test NE disagrees)")  # fmt: skip
    test = ("" if v["delta_test_ne"] is None else
            f"; test NE {_num(found['test_ne'])} vs {_num(base['test_ne'])} "
            f"({v['delta_test_ne']:+.4f})")  # fmt: skip
    ratio = "" if v["flops_ratio"] is None else f", at {_times(v['flops_ratio'])} its FLOPs"
    if v.get("step_ratio") is not None:
        ratio += (
            f" and {_times(v['step_ratio'])} its predicted step time on {v['step_devices']} devices"
        )
    within = v.get("dominated_within_noise") or []
    dominated = ", ".join(b + (" (its NE lower, not beyond seed noise)" if b in within else "")
                          for b in v["dominated_baselines"]) or "none"  # fmt: skip
    if once := v.get("dominated_by_single_runs"):
        dominated += ("; by single runs not yet retrained (the plot draws them): "
                      + ", ".join(f"{b} by trial{'s' * (len(t) > 1)} {', '.join(map(str, t))}"
                                  for b, t in once.items()))  # fmt: skip
    # on seed means, by the re-evaluated trials only: another's single run is a lucky draw
    by = ("the re-evaluated architectures' seed means" if v.get("seed_means")
          else "the found architectures' single runs")  # fmt: skip
    left_out = v.get("not_compared")
    basis = v["basis"] + (f"; without seed means, not compared: {', '.join(left_out)} "
                          "(`ranknas reevaluate` retrains them with the same seeds)"
                          if left_out else "")  # fmt: skip
    if lower := v.get("not_compared_lower"):
        basis += ("; of those, one run below both sides' NE: "
                  + ", ".join(f"{b} {_num(ne)}" for b, ne in lower.items()))  # fmt: skip
    if v.get("failed_baselines"):
        basis += f"; failed or diverged, not compared: {', '.join(v['failed_baselines'])}"
    tuned = v.get("baselines_tuned")
    recipe = (f"each at its best of {tuned} recipes (best_baseline.tune)" if tuned
              else "untuned, at the study's recipe")  # fmt: skip
    return (f"verdict ({basis}): {said}: trial {found['trial']} validation NE "
            f"{_num(found['val_ne'])} vs baseline {base['baseline']} {_num(base['val_ne'])} "
            f"({v['delta_val_ne']:+.4f}){test}{ratio}\n"
            f"baselines Pareto-dominated by {by}: {dominated}; baselines "
            f"{recipe}"
            + _paired_words(v)
            + _cheapest_words(v)
            + ("" if v.get("seed_means") else
               "\nthe trials' single runs: seeds move NE by a few 0.001; `ranknas reevaluate "
               "CONFIG` compares seed means"))  # fmt: skip


def verdict_line(v: dict[str, Any]) -> str:
    """`format_verdict`'s lines as one, for a field already named verdict (an MLflow tag,
    the model card's row): "(basis): outcome ...; baselines ...; by seed ..."."""
    return "; ".join(format_verdict(v).splitlines()).removeprefix("verdict ")


def p_text(p: float) -> str:
    """A p-value in two significant digits, more where those would round it up to
    `SIGNIFICANCE` (0.04994 read as 0.05 beside "beyond seed noise")."""
    return _kept_below(p, SIGNIFICANCE, 2, "g")


def _kept_below(value: float, bound: float, digits: int, kind: str) -> str:
    """`value` formatted with `digits` (`kind`: "f" or "g"), more where those would round a
    value below `bound` up to it (17: the float itself, which is below)."""
    while value < bound <= float(f"{value:.{digits}{kind}}") and digits < 17:
        digits += 1
    return f"{value:.{digits}{kind}}"


def _paired_words(v: dict[str, Any]) -> str:
    """One line: on how many seeds the trial beat the baseline and whether that is beyond
    the seeds' noise (a paired t-test's p < `SIGNIFICANCE`); empty without pairs."""
    paired = v.get("paired")
    if not paired:
        return ""
    p = paired["p_value"]
    noise = "within seed noise" if within_seed_noise(paired) else "beyond seed noise"
    test = "" if p is None else f", paired t-test {_correction_words(paired) or f'p={p_text(p)}'}"
    seeds = seeds_text(paired["seeds"], fresh=False)
    if paired.get("confirmed"):
        seeds = seeds.replace("seed", "confirmation seed")
    line = (f"\nby seed: trial {v['best_trial']['trial']} has the lower validation NE on "
            f"{paired['found_better']} of {seeds} (the differences' sd "
            f"{paired['delta_val_ne_sd']:.4f}{test}): {noise}")  # fmt: skip
    unused = v.get("confirmation_unused")
    if unused and unused["pair"]:
        trial, base = unused["pair"]
        line += (f"\nconfirmation runs: of trial {trial} and baseline {base}, not the verdict's "
                 "pair now; `ranknas confirm CONFIG` retrains this pair on seeds that chose "
                 "nothing")  # fmt: skip
    elif unused:
        line += "\nconfirmation runs: under two seeds both sides have, no test yet"
    elif not paired.get("confirmed") and (paired.get("p_single") or 1) < SIGNIFICANCE <= (p or 0):
        # beyond the noise on the choosing seeds, within it once they are counted
        line += ("\n(`ranknas confirm CONFIG` tests this pair on seeds that chose nothing, "
                 "without the choice's correction)")  # fmt: skip
    return line


def _correction_words(paired: dict[str, Any]) -> str:
    """How `corrected` made the p-value ("p=0.021; times 3, chosen among 3 re-evaluated
    trials by seed mean (Bonferroni, at most 1): p=0.063"), empty where it did nothing."""
    single = paired.get("p_single")
    if paired.get("comparisons", 1) == 1 or not single:
        return ""
    why = []
    if paired["chosen_from"] > 1:
        why.append(f"chosen among {paired['chosen_from']} {paired['among']} by seed mean")
    if paired["looks"] > 1 and paired.get("confirmed"):
        why.append(f"for the {paired['looks']} confirmation tests shown so far")
    elif paired["looks"] > 1:
        why.append(f"tested after {paired['looks']} rounds of seeds")
    return (f"p={p_text(single)}; times {paired['comparisons']}, {' and '.join(why)} "
            f"(Bonferroni, at most 1): p={p_text(paired['p_value'])}")  # fmt: skip


def _cheapest_words(v: dict[str, Any]) -> str:
    """One line: the cheapest re-evaluated trial at the baseline's NE (`cheapest_within_noise`);
    empty without seed means or a cost objective."""
    cheapest, base = v.get("cheapest_within_noise"), v["best_baseline"]["baseline"]
    if not cheapest:
        return ""
    cost = {"step_ms": f"predicted step time on {v.get('step_devices')} devices",
            "latency_ms": "predicted latency"}.get(v["cost"], COST_UNITS[v["cost"]])  # fmt: skip
    if cheapest["trial"] is None and not cheapest["cheaper"]:
        return f"\nat baseline {base}'s NE: no re-evaluated trial is cheaper than it (its {cost})"
    if cheapest["trial"] is None:
        return (f"\nat baseline {base}'s NE: none of the {cheapest['cheaper']} re-evaluated "
                f"trials cheaper than it (its {cost}) has a lower seed mean, or one at most "
                f"{TIE_MARGIN:.1%} higher within seed noise")  # fmt: skip
    paired, p = cheapest["paired"], cheapest["paired"]["p_value"]
    test = "" if p is None else f", single-test p={p_text(p)}"
    return (f"\nat baseline {base}'s NE (a lower seed mean, or at most {TIE_MARGIN:.1%} higher "
            f"within seed noise): cheapest trial "
            f"{cheapest['trial']} at {_times(cheapest['cost_ratio'])} its {cost}, validation NE "
            f"{_num(cheapest['val_ne'])} ({cheapest['delta_val_ne']:+.4f}; lower on "
            f"{paired['found_better']} of {seeds_text(paired['seeds'], fresh=False)}{test})"
            + ("" if cheapest.get("delta_test_ne") is None else
               f", test NE {cheapest['delta_test_ne']:+.4f}"))  # fmt: skip


def best_trial(study: optuna.Study, which: str = "best", force: bool = False) -> FrozenTrial:
    """`best` (`study_best`) or a trial number; a repeat (an architecture proposed again,
    told the earlier trial's result) stands for that earlier trial, whose model it is."""
    trials = study.get_trials(deepcopy=False)
    if which == "best":
        best = study_best(study)
        if best is None:
            raise RanknasError(f"study {study.study_name!r}: {no_best_reason(study)}")
        return trials[best["trial"]]
    if not which.isdigit() or int(which) >= len(trials):
        done = [t.number for t in trials if t.state == TrialState.COMPLETE]
        shown = ", ".join(map(str, done[:12])) + (f", ... ({len(done)})" if len(done) > 12 else "")
        raise RanknasError(f"--trial must be 'best', a complete trial's number ("
                           f"{shown or 'none yet'}: `ranknas leaderboard` lists them) or "
                           "baseline:KEY")  # fmt: skip
    trial = trials[int(which)]
    if trial_state(trial) == "repeat":
        trial = trials[int(trial.user_attrs[TrialAttr.REUSED_FROM])]
        which = str(trial.number)
    state = trial_state(trial)
    reason = failure_reason(trial) or ""
    check_exportable(f"trial {which}", state, "" if state == INTERRUPTED else reason, force)
    return trial


def check_exportable(label: str, state: str, reason: str, force: bool) -> None:
    """Refuse to export a run (`label`: "trial 3", "baseline dlrm") that is not complete,
    or diverged (NE >= 1) unless `force`."""
    if reason.startswith("diverged") and not force:
        raise RanknasError(f"{label} {reason}; pass --force to export it anyway")
    if state != "complete" and not reason.startswith("diverged"):
        why = f" ({reason})" if reason else ""
        raise RanknasError(f"{label} is {state}{why}, not complete: nothing to export")


def no_best_reason(study: optuna.Study) -> str:
    """Why `study_best` is None."""
    if any(trial_state(t) == "complete" for t in study.get_trials(deepcopy=False)):
        return EVERY_FINALIST_DIVERGED
    return "no complete trial yet"


def pending_runs(study: optuna.Study, attr: str = StudyAttr.REEVALUATION_PENDING) -> int:
    """Runs of an interrupted re-evaluation (`attr`: or confirmation), not in any seed mean
    until the command that made them runs again and finishes (reusing them)."""
    return sum(len(runs) for runs in study.user_attrs.get(attr, {}).values())


def status(study: optuna.Study) -> dict[str, Any]:
    trials = study.get_trials(deepcopy=False)
    counts = {s.name.lower(): 0 for s in TrialState} | {"skipped": 0, "repeat": 0, INTERRUPTED: 0}
    for t in trials:
        counts[trial_state(t)] += 1
    best = study_best(study)
    budget, counted = study.user_attrs.get(StudyAttr.BUDGET_TRIALS), counted_trials(trials)
    short = bool(budget) and counted < budget  # a search ended before its budget
    return {
        "study": study.study_name,
        "budget_trials": budget,
        "counted": counted,
        "time_limited": study.user_attrs.get(StudyAttr.TIME_LIMITED),
        "repeats": repeats(trials),
        "exhausted": short and exhausted(trials, budget),
        "searcher": study.user_attrs.get(StudyAttr.SEARCHER),
        "objectives": study.user_attrs.get(StudyAttr.OBJECTIVES),
        "trials": counts,
        "best_trial": best["trial"] if best else None,
        "best_val_ne": best["val_ne"] if best else None,
        "best": best,
        "bayes_ne": study.user_attrs.get(StudyAttr.BAYES_NE),
        "mlflow": study.user_attrs.get(StudyAttr.MLFLOW),
        "ceilings": study.user_attrs.get(StudyAttr.CEILINGS),
        "stopped_on_ceilings": short and stopped_on_ceilings(trials, budget),
        "skipped": skipped(trials),
        "mflops_ceiling": study.user_attrs.get(StudyAttr.MFLOPS_CEILING),
        "step_ms_ceiling": study.user_attrs.get(StudyAttr.STEP_MS_CEILING),
        "around_base": study.user_attrs.get(StudyAttr.AROUND_BASE),
        "feature_importance": study.user_attrs.get(StudyAttr.FEATURE_IMPORTANCE),
        "baselines": baseline_rows(study),
        "verdict": verdict(study),
        "reevaluation_pending": pending_runs(study),
        "confirmation_pending": pending_runs(study, StudyAttr.CONFIRMATION_PENDING),
        "devices": _devices(trials),
        "running": [
            {
                "trial": t.number,
                "device": t.user_attrs.get(TrialAttr.DEVICE),
                "worker_gone": gone_from_here(t.user_attrs.get(TrialAttr.PROCESS)),
            }
            for t in trials
            if t.state == TrialState.RUNNING
        ],
    }


def _devices(trials: list[FrozenTrial]) -> dict[str, int]:
    """Trials trained on each device (workers pinned to GPUs: one entry per GPU); not the
    ones skipped untrained, told a repeat's result, or interrupted (retried)."""
    trained = [t for t in trials if trial_state(t) not in ("skipped", "repeat", INTERRUPTED)]
    devices = [t.user_attrs[TrialAttr.DEVICE] for t in trained if TrialAttr.DEVICE in t.user_attrs]
    return dict(sorted(collections.Counter(devices).items()))


def to_csv(table: list[dict[str, Any]]) -> str:
    """CSV of rows that share their keys (leaderboard rows: `COLUMNS`); a mapping or list
    in a cell (a searched recipe) as JSON."""
    out = io.StringIO()
    writer = csv.DictWriter(out, fieldnames=list(table[0]) if table else list(COLUMNS))
    writer.writeheader()
    for row in table:
        writer.writerow({k: json.dumps(v) if isinstance(v, dict | list | tuple) else v
                         for k, v in row.items()})  # fmt: skip
    return out.getvalue()


def with_baselines(
    table: list[dict[str, Any]], bases: list[dict[str, Any]]
) -> list[dict[str, Any]]:
    """Trial rows, then baseline rows, in one set of columns (for CSV): `baseline`, next to
    `trial` (a viewer that shows the first columns named no baseline), names the baseline
    and is empty for trials."""
    trials = [{"trial": r["trial"], "baseline": None} | r for r in table]
    others = [c for c in COLUMNS if c != "trial"]
    return trials + [{"trial": None, "baseline": b["baseline"]} | {c: b.get(c) for c in others}
                     for b in bases]  # fmt: skip


def _short_recipe(recipe: dict[str, Any] | None) -> str:
    names = {"dense_lr": "lr", "sparse_lr": "sparse lr", "weight_decay": "wd",
             "batch_size": "batch"}  # fmt: skip
    return ", ".join(f"{names[k]} {v:g}" for k, v in (recipe or {}).items()) or "-"


# a study's step times are predicted for its cluster; a sharded trial's also measured
PREDICTED_STEP, MEASURED_STEP = "predicted step ms", "measured step ms"


def format_table(table: list[dict[str, Any]]) -> str:
    """Aligned columns; the seed-mean and latency columns only when some trial has one."""
    header = ["trial", "state", "val NE", "mean val NE", "seeds", "test NE", "mean test NE",
              "val AUC", "test AUC", "MFLOPs", "params", "latency ms", PREDICTED_STEP,
              MEASURED_STEP, "digest"]  # fmt: skip
    lines = [[str(r["trial"]), r["state"], _num(r["val_ne"]), _num(r["mean_val_ne"]),
              seeds_cell(r), _num(r["test_ne"]), _num(r.get("mean_test_ne")), _num(r["val_auc"]),
              _num(r["test_auc"]), mflops_text(r["mflops"]), str(r["params"] or "-"),
              _num(r["latency_ms"], 3), _num(r.get("step_ms"), 3),
              _num(r.get("measured_step_ms"), 3), r["digest"] or "-"] for r in table]  # fmt: skip
    if any(r.get("recipe") for r in table):  # training.search: what each trial trained with
        header.append("recipe")
        for line, r in zip(lines, table, strict=True):
            line.append(_short_recipe(r.get("recipe")))
    if any(r.get("proposed_by") for r in table):  # oneshot/dnas: their candidates, and the
        header.append("proposed by")  # random sampling that fills the budget after them
        for line, r in zip(lines, table, strict=True):
            line.append(r.get("proposed_by") or "-")
    _add_failure_reasons(header, lines, table)  # `--all`: why trials failed or were pruned
    return _without_empty(header, lines, table, {
        "mean_val_ne": ("mean val NE", "seeds"), "mean_test_ne": ("mean test NE",),
        "latency_ms": ("latency ms",), "step_ms": (PREDICTED_STEP,),
        "measured_step_ms": (MEASURED_STEP,)})  # fmt: skip


def best_first(bases: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Baseline rows by validation NE as the study knows it (`estimated_ne`), those without
    one last: the config's order put DLRM above the DCNv2 the verdict meets."""
    return sorted(bases, key=lambda r: (estimated_ne(r) is None, estimated_ne(r) or 0.0))


def format_baselines(table: list[dict[str, Any]]) -> str:
    table = best_first(table)
    header = ["baseline", "state", "val NE", "mean val NE", "seeds", "test NE", "mean test NE",
              "val AUC", "test AUC", "MFLOPs", "params", PREDICTED_STEP, MEASURED_STEP,
              "digest"]  # fmt: skip
    lines = [[r["baseline"], r["state"] or "-", _num(r["val_ne"]), _num(r.get("mean_val_ne")),
              seeds_cell(r), _num(r["test_ne"]), _num(r.get("mean_test_ne")),
              _num(r["val_auc"]), _num(r["test_auc"]), mflops_text(r["mflops"]),
              str(r["params"] or "-"), _num(r.get("step_ms"), 3),
              _num(r.get("measured_step_ms"), 3), r["digest"] or "-"] for r in table]  # fmt: skip
    _add_failure_reasons(header, lines, table)  # what `status` sends the user here for
    return _without_empty(header, lines, table, {
        "mean_val_ne": ("mean val NE", "seeds", "mean test NE"), "step_ms": (PREDICTED_STEP,),
        "measured_step_ms": (MEASURED_STEP,)})  # fmt: skip


def _add_failure_reasons(
    header: list[str], lines: list[list[str]], table: list[dict[str, Any]]
) -> None:
    """A last column of why rows failed or were pruned, where any did."""
    if any(r.get("failure_reason") for r in table):
        header.append("failure reason")
        for line, r in zip(lines, table, strict=True):
            line.append(r.get("failure_reason") or "")


def _without_empty(
    header: list[str], lines: list[list[str]], table: list[dict[str, Any]],
    columns: dict[str, tuple[str, ...]],
) -> str:  # fmt: skip
    """The aligned table less the columns named under each key no row has a value for."""
    for key, names in columns.items():
        if all(r.get(key) is None for r in table):
            keep = [i for i, name in enumerate(header) if name not in names]
            header = [header[i] for i in keep]
            lines = [[line[i] for i in keep] for line in lines]
    return align(header, lines)


def markdown(study: optuna.Study, table: list[dict[str, Any]], top: int = 10) -> str:
    """The leaderboard, the baselines and the verdict as Markdown (the study run's note).
    The tables are aligned text in code blocks: MLflow's UI draws Markdown tables without
    cell padding (`0.94300.9402`)."""

    def block(header: list[str], lines: list[list[str]]) -> str:
        return f"```\n{align(header, lines)}\n```"

    seeds = seed_means(study)  # after `reevaluate`: a column of seed means beside the runs
    mean = ["mean val NE"] if seeds else []

    def mean_of(key: str) -> list[str]:
        return [_num(seeds.get(key, {}).get("val_ne"))] if seeds else []

    # the answer first: the UI shows a note's first lines and folds the rest under "Show
    # more", where the verdict below two tables went unseen
    best, v = study_best(study), verdict(study)
    parts = [f"**Best: {describe_best(best)}**"] if best else []
    if v:
        parts.append(format_verdict(v).replace("\n", "\n\n"))
    which = f"the best {top} of {len(table)} trials" if len(table) > top else (
        f"{len(table)} trial{'s' * (len(table) != 1)}, best first")  # fmt: skip
    parts += [f"## {study.study_name}: {which}", block(
        ["trial", "val NE", *mean, "test NE", "MFLOPs", "digest"],
        [[str(r["trial"]), _num(r["val_ne"]), *mean_of(str(r["trial"])), _num(r["test_ne"]),
          mflops_text(r["mflops"]), r["digest"] or "-"] for r in table[:top]],
    )]  # fmt: skip
    bases = best_first(baseline_rows(study))
    if bases:
        parts += ["## Baselines", block(["baseline", "val NE", *mean, "test NE", "MFLOPs"], [
            [b["baseline"], _num(b["val_ne"]), *mean_of(f"baseline:{b['baseline']}"),
             _num(b["test_ne"]), mflops_text(b["mflops"])] for b in bases])]  # fmt: skip
    return "\n\n".join(parts)


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
    # no run with an NE (every seed failed): "-", as the leaderboard; inf only where one
    # diverged (the README's meaning), though the row ranks last either way
    lines = [[str(r["trial"]), _num(r["recorded_val_ne"]),
              _num(r["mean_val_ne"] if r["seeds"] else None),
              _num(r["sd_val_ne"] if r["seeds"] > 1 else None), _num(r["mean_test_ne"]),
              mflops_text(r["mflops"]), seeds_cell(r)] for r in table]  # fmt: skip
    if any(r.get("step_ms") is not None for r in table):
        header.insert(-1, "step ms")
        for line, r in zip(lines, table, strict=True):
            line.insert(-1, _num(r.get("step_ms"), 3))
    return align(header, lines)


def seeds_said(mean: dict[str, Any]) -> str:
    """`5 seeds`, or `5 seeds, 1 diverged` (`seed_means`' entry)."""
    diverged = f", {mean['diverged']} diverged" if mean.get("diverged") else ""
    return seeds_text(mean["seeds"], fresh=False) + diverged


def seeds_cell(row: dict[str, Any]) -> str:
    """`5`, or `5 (1 diverged)` where seeds' runs ended worse than the base rate."""
    diverged = f" ({row['diverged']} diverged)" if row.get("diverged") else ""
    return f"{row['seeds']}{diverged}" if row.get("seeds") else "-"


def _num(value: float | None, digits: int = 4) -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "-"
    # an NE just under 1 (complete) must not read as 1.0000 (the base rate: diverged)
    return _kept_below(value, 1, digits, "f")


TRIAL_SIZE, BASELINE_SIZE = 14, 110  # the Pareto plot's markers (points squared)
OUTLIER_DECADES = 1.0  # a cost this many decades beyond all others is drawn at the edge
_EDGE_PAD = 0.15  # decades of room either side of the drawn range
# where a label may sit from its point (points), tried in order until one overlaps no other
_LABEL_OFFSETS = ((4, 4), (4, -11), (-4, 4), (-4, -11), (4, 15), (4, -22), (-4, 15), (-4, -22))


def pareto_png(study: optuna.Study) -> bytes:
    """NE vs MFLOPs of every complete trial and baseline, the Pareto front highlighted, as
    PNG bytes (`pareto_figure`)."""
    import matplotlib.pyplot as plt

    figure = pareto_figure(study)
    out = io.BytesIO()
    figure.savefig(out, format="png")
    plt.close(figure)
    return out.getvalue()


def pareto_figure(study: optuna.Study) -> Any:
    """The Pareto plot: the front red and labelled, the other trials grey, the study's best marked,
    baselines as labelled stars, seed means ringed, labels off the other markers. The log
    MFLOPs axis spans the bulk of the points (`cost_range`) and the NE axis stops above them
    (`ne_ceiling`): an outlier is drawn at the edge with its cost or NE in its label. A Bayes
    floor far below the points is named in the legend, not drawn."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    key = cost_key(study)
    points = [r for r in rows(study) if r["val_ne"] is not None and r.get(key)]
    bases = [b for b in baseline_rows(study) if b["val_ne"] is not None and b.get(key)]
    low, high = cost_range([p[key] for p in [*points, *bases]])
    top = ne_ceiling([estimated_ne(p) for p in [*points, *bases]])

    def ne(p: dict[str, Any]) -> float:  # its seed mean where retrained, as the front's
        return min(estimated_ne(p), top)  # a far worse one at the top edge, its NE named

    figure, axes = plt.subplots(figsize=(7, 4.5), dpi=120)
    front = [p for p in pareto_front(study) if p[key]]
    on_front = {p["trial"] for p in front}
    behind = [p for p in points if p["trial"] not in on_front]
    if behind:  # in the legend only when some are drawn
        axes.scatter([_clip(p[key], low, high) for p in behind], [ne(p) for p in behind],
                     s=TRIAL_SIZE, color="0.6", label="other trials")  # fmt: skip
    # a staircase: what it dominates lies above and right of it (a line between two front
    # points crossed models it does not dominate)
    axes.plot([_clip(p[key], low, high) for p in front], [ne(p) for p in front], "o-",
              drawstyle="steps-post", color="tab:red",
              label="Pareto front of the trials")  # fmt: skip
    # the front, the far-off (drawn at the edge) and the re-evaluated (a ring said no number)
    labelled = front + [p for p in points if p["trial"] not in on_front
                        and (estimated_ne(p) > top or _seed_mean(p))]  # fmt: skip
    labels = [(str(p["trial"]), p[key], estimated_ne(p), "0.2") for p in labelled]
    best = study_best(study)
    mark = next((p for p in points if best and p["trial"] == best["trial"]), None)
    if mark:
        axes.scatter([_clip(mark[key], low, high)], [ne(mark)], marker="D", s=60,
                     zorder=4, facecolors="none", edgecolors="black",
                     label=f"best: trial {mark['trial']}")  # fmt: skip
    if bases:
        axes.scatter([_clip(b[key], low, high) for b in bases], [ne(b) for b in bases],
                     marker="*", s=BASELINE_SIZE, color="tab:blue", zorder=3, clip_on=False,
                     label="baselines")  # fmt: skip  # whole at the edge, not cut in half
        labels += [(b["baseline"], b[key], estimated_ne(b), "tab:blue") for b in bases]
    ringed = 2.5  # a seed mean's ring, in its marker's size
    sized = [(p, size * (ringed if _seed_mean(p) else 1))
             for p, size in [*((p, TRIAL_SIZE) for p in points),
                             *((b, BASELINE_SIZE) for b in bases)]]  # fmt: skip
    means = [(p, size) for p, size in sized if _seed_mean(p)]
    if means:  # beside single runs: a single run may lie below a better model's mean
        axes.scatter([_clip(p[key], low, high) for p, _ in means], [ne(p) for p, _ in means],
                     s=[size for _, size in means], facecolors="none", zorder=5, clip_on=False,
                     edgecolors="tab:purple", label="seed means (the others: one run)")  # fmt: skip
    bayes = study.user_attrs.get(StudyAttr.BAYES_NE)
    if bayes:
        nes = [ne(p) for p in [*points, *bases]]
        # far below the points (more than their spread, or 5% of their NE), the line would
        # squeeze them into the top of the plot
        drawn = not nes or bayes >= min(nes) - max(max(nes) - min(nes), 0.05 * min(nes))
        label = f"Bayes-optimal NE {bayes:.3f}" + ("" if drawn else " (below the axis)")
        line = {"color": "tab:green", "linestyle": "--", "label": label}
        if drawn:
            axes.axhline(bayes, **line)
        else:  # named in the legend only
            axes.plot([], [], **line)
    xlabel = "MFLOPs per example" if key == "mflops" else COST_UNITS[key]
    if key == "step_ms":
        devices = study.user_attrs.get(StudyAttr.STEP_DEVICES)
        xlabel = f"predicted ms a training step on {devices} devices"
    axes.set(xlabel=xlabel, ylabel="validation NE", title=study.study_name)
    axes.set_xscale("log")
    axes.set_xlim(low, high)
    _plain_log_labels(axes.xaxis, low, high)
    axes.legend(fontsize=8)
    figure.tight_layout()
    figure.canvas.draw()  # the layout is final: labels are placed in pixels
    _keep_apart(axes.xaxis)
    markers = [((_clip(p[key], low, high), ne(p)), size) for p, size in sized]
    _label(axes, labels, (low, high), top, COST_UNITS[key], markers)
    return figure


def _seed_mean(row: dict[str, Any]) -> bool:
    """Whether a row's NE is a mean over seeds: re-evaluated, or confirmed while searched."""
    return row.get("mean_val_ne") is not None or (row.get("runs") or 1) > 1


def _plain_log_labels(axis: Any, low: float, high: float) -> None:
    """A log axis's ticks labelled as plain numbers ("0.03", "200k", "2M"; not "3×10⁻²",
    whose labels ran into each other): every tick within a decade, those at 2, 3 and 5 over
    up to 2.5 decades, the powers of ten beyond. Call `_keep_apart` once drawn."""
    from matplotlib.ticker import FuncFormatter

    decades = math.log10(high / low) if 0 < low < high else math.inf

    def minor(value: float, _position: int) -> str:
        mantissa = round(value / 10 ** math.floor(math.log10(value) + 1e-9))
        shown = decades <= 1 or (decades <= 2.5 and mantissa in (2, 3, 5))
        return _compact(value) if shown else ""

    axis.set_major_formatter(FuncFormatter(lambda value, _position: _compact(value)))
    axis.set_minor_formatter(FuncFormatter(minor))


def _compact(value: float) -> str:
    for scale, suffix in ((1e9, "G"), (1e6, "M"), (1e3, "k")):
        if value >= scale:
            return f"{value / scale:g}{suffix}"
    return f"{value:g}"


def _keep_apart(axis: Any) -> None:
    """Hide the drawn tick labels of `axis` that would overlap one shown before them, the
    powers of ten first."""
    shown: list[Any] = []
    for label in [*axis.get_ticklabels(), *axis.get_ticklabels(minor=True)]:
        if not label.get_text() or not label.get_visible():
            continue
        box = label.get_window_extent()
        if any(box.overlaps(other) for other in shown):
            label.set_visible(False)
        else:
            shown.append(box)


def ne_ceiling(values: list[float]) -> float:
    """The highest NE the plot spans: the points' own, unless the worst are far off (above
    the next by more than twice the spread of those below: logistic regression beside the
    interaction models, squeezing them into the bottom), which are then drawn at the top
    edge, a little above the rest; so are seed means a nan/inf run made inf."""
    ne = sorted(v for v in values if math.isfinite(v))
    while len(ne) > 2 and ne[-1] - ne[-2] > 2 * (ne[-2] - ne[0]):
        ne.pop()
    if len(ne) == len(values):
        return math.inf
    if not ne:  # every one diverged
        return 1.0
    return ne[-1] + max(0.1 * (ne[-1] - ne[0]), 0.002 * ne[-1])  # visibly above the rest


def cost_range(costs: list[float]) -> tuple[float, float]:
    """The MFLOPs axis range (log scale): the costs' spread, leaving out at either end a
    cost more than `OUTLIER_DECADES` from its nearest neighbour (one point must not stretch
    the axis over decades that nothing else occupies), padded by `_EDGE_PAD` decades."""
    logs = sorted(math.log10(c) for c in costs if c > 0) or [0.0]
    while len(logs) > 2 and logs[1] - logs[0] > OUTLIER_DECADES:
        logs = logs[1:]
    while len(logs) > 2 and logs[-1] - logs[-2] > OUTLIER_DECADES:
        logs = logs[:-1]
    return 10 ** (logs[0] - _EDGE_PAD), 10 ** (logs[-1] + _EDGE_PAD)


def _clip(cost: float, low: float, high: float) -> float:
    """Where a point of `cost` is drawn: an outlier sits on the axis's edge."""
    return min(max(cost, low), high)


def _label(axes: Any, points: list[tuple[str, float, float, str]],
           costs: tuple[float, float], top: float, unit: str = "MFLOPs",
           markers: list[tuple[tuple[float, float], float]] = ()) -> None:  # fmt: skip
    """Label `points` (text, cost, NE, colour), each where it overlaps no label placed
    before and no other point's marker (`_place`); a point drawn at an edge (its cost
    outside `costs`, its NE above `top`) names its real cost or NE."""
    renderer = axes.figure.canvas.get_renderer()
    placed: list[Any] = []
    low, high = costs
    boxes = [(xy, _marker_box(axes, xy, size)) for xy, size in markers]
    for text, cost, ne, color in sorted(points, key=lambda p: (p[1], p[2])):
        beyond = []  # drawn at an edge: its real cost or NE
        if _clip(cost, low, high) != cost:
            beyond.append(f"{cost:.2g} {unit}")
        if ne > top:
            beyond.append(f"NE {ne:.3f}" if math.isfinite(ne) else "diverged")
        shown = f"{text} ({', '.join(beyond)})" if beyond else text
        xy = (_clip(cost, low, high), min(ne, top))
        others = [box for at, box in boxes if at != xy]
        placed.append(_place(axes, renderer, shown, xy, color, placed, others))


def _marker_box(axes: Any, xy: tuple[float, float], size: float) -> Any:
    """The pixels a marker of scatter size `size` (points squared) at data point `xy`
    covers."""
    from matplotlib.transforms import Bbox

    x, y = axes.transData.transform(xy)
    radius = math.sqrt(size) / 2 * axes.figure.dpi / 72
    return Bbox.from_extents(x - radius, y - radius, x + radius, y + radius)


def _place(axes: Any, renderer: Any, text: str, xy: tuple[float, float], color: str,
           placed: list[Any], markers: list[Any] = ()) -> Any:  # fmt: skip
    """Annotate `xy` at the first of `_LABEL_OFFSETS` whose box overlaps none of `placed`
    and none of `markers`; where every offset does, the first that overlaps no label
    (the last one tried where all do); returns the label's box."""
    fallback = None  # the first box clear of labels, where none is clear of markers too
    for dx, dy in _LABEL_OFFSETS:
        note = axes.annotate(text, xy, fontsize=7, color=color, xytext=(dx, dy),
                             ha="left" if dx > 0 else "right",
                             textcoords="offset points")  # fmt: skip
        box = note.get_window_extent(renderer)
        clear = not any(box.overlaps(other) for other in placed)
        if clear and not any(box.overlaps(m) for m in markers):
            if fallback is not None:
                fallback[0].remove()
            return box
        if clear and fallback is None:
            fallback = (note, box)
            continue
        if fallback is None and (dx, dy) == _LABEL_OFFSETS[-1]:
            return box
        note.remove()
    return fallback[1]


def _times(ratio: float) -> str:
    """A cost ratio as `0.64x`; a small one keeps two significant digits (`0.0016x`, not
    `0.00x`)."""
    return f"{ratio:.2f}x" if ratio >= 0.1 else f"{ratio:.2g}x"
