"""Retrain a study's best trials with fresh seeds: how much of each trial's NE was its seed.

A trial is one training run, and one run's NE moves with its seed (on the synthetic data by
about 0.004, one standard deviation), so the best of many trials is partly the luckiest
draw. `reevaluate_study` retrains the leaderboard's top trials exactly as the study trained
them (same data, budget and training settings; seeds `REEVAL_SEED + k`), and ranks them by
their mean validation NE; test NE is reported beside it and never used to rank. Every run is
recorded in the study (`study.user_attrs["reevaluation"]`) as soon as it ends, so an
interrupted command loses nothing and a rerun (or one with more seeds) trains only what is
missing. A run whose loss or predictions went nan/inf is recorded at NE inf: the same seed
does so again, so it is never retried, and its model's mean is inf (diverged, ranked last).
A run that failed otherwise (out of memory) has no NE, is left out of the mean and is
retried by a rerun.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import optuna
import torch

from nas import leaderboard
from nas.baselines import recorded
from nas.config import StudyConfig
from nas.leaderboard import baseline_rows, by_recorded_run, front_below_baseline, seeds_text
from nas.protocol import StudyData, check_protocol, prepare_data, train_architecture
from nas.protocol_diff import check_settings
from nas.storage import load_study
from nas.trial_record import StudyAttr, TrialAttr, read_architecture
from search_space.errors import RanknasError
from trainers import progress as bars

REEVAL_SEED = 10_000  # far from every trial's seed (study seed + trial number)
CONFIRM_SEED = 20_000  # nor any re-evaluation's: seeds that choose nothing


@dataclass(frozen=True)
class Rounds:
    """Where one kind of round keeps its runs (published and pending), from which seed, and
    what its progress bar says."""

    attr: str
    pending: str
    first_seed: int
    label: str


# the seeds that choose the verdict's pair (finalists, best baseline) and test it
SELECTION = Rounds(StudyAttr.REEVALUATION, StudyAttr.REEVALUATION_PENDING, REEVAL_SEED,
                   "reevaluate")  # fmt: skip
# `ranknas confirm`: the chosen pair again on seeds that chose nothing, the verdict's test
CONFIRMATION = Rounds(StudyAttr.CONFIRMATION, StudyAttr.CONFIRMATION_PENDING, CONFIRM_SEED,
                      "confirm")  # fmt: skip


def reevaluate_study(
    config: StudyConfig,
    top: int,
    seeds: int,
    progress: Callable[[str], None] = print,
    baselines: int | None = None,
    front: bool = False,
) -> list[dict[str, Any]]:
    """Retrain the `top` complete trials with the best recorded runs (with `front`, also
    `front_below_baseline`'s near ones: the Pareto front's trials cheaper than the best
    baseline) and the `baselines`
    best complete baselines (None: all) of `config`'s study with the same `seeds` fresh
    seeds each; returns one row per trial or baseline (`trial` is then `baseline:<key>`),
    best mean validation NE first."""
    if top < 1 or seeds < 1 or (baselines is not None and baselines < 0):
        raise RanknasError(f"--top and --seeds must be at least 1, --baselines at least 0 "
                           f"(got {top}, {seeds} and {baselines})")  # fmt: skip
    study = load_study(config.name, config.storage)
    check_settings(study.user_attrs, config)  # before the data, which can take minutes
    if front and leaderboard.traded_cost(study) is None:
        raise RanknasError(f"--front retrains the Pareto front's trials cheaper than the best "
                           f"baseline: study {config.name!r} trades NE against no cost; set "
                           "objectives.cost (mflops, params, latency_ms, step_ms) in a new "
                           "study, or drop --front")  # fmt: skip
    if front and leaderboard.front_baseline(study) is None:
        unit = leaderboard.COST_UNITS[leaderboard.cost_key(study)]
        raise RanknasError(f"--front retrains the Pareto front's trials cheaper than the best "
                           f"baseline: study {config.name!r} has no complete baseline with its "
                           f"cost ({unit}); add your model with `ranknas baseline add CONFIG "
                           "PRESET_OR_FILE`, or drop --front")  # fmt: skip
    torch.set_num_threads(config.training.threads)
    # the best recorded runs, as the search ranked them: the leaderboard lists the trials
    # re-evaluated before first, and a strong trial a resumed search found was left out
    ranked = by_recorded_run(study)
    chosen = ranked[:top]
    if chosen:
        progress(f"re-evaluating the {len(chosen)} trial{'s' * (len(chosen) != 1)} with the "
                 f"best recorded runs: {', '.join(str(r['trial']) for r in chosen)}")  # fmt: skip
    if (best := _best_left_out(study, chosen)) is not None:
        # `--top 1 --seeds 5` after a first round: the verdict's trial gains the seeds, not
        # only the best single run, which the seed means may have left behind
        chosen.append(next(r for r in ranked if r["trial"] == best["trial"]))
        progress(f"and the study's best, trial {best['trial']} ({best['basis']}), which the "
                 "verdict compares: its recorded run is not among them")  # fmt: skip
    if front:
        near, far = front_below_baseline(study)
        top_trials = {r["trial"] for r in chosen}
        chosen += [r for r in near if r["trial"] not in top_trials]
        progress(_front_line(near, far))
    if not chosen:
        raise RanknasError(f"study {config.name!r} has no complete trial to re-evaluate")
    trials = {t.number: t for t in study.get_trials(deepcopy=False)}
    archs = {str(r["trial"]): trials[r["trial"]].user_attrs[TrialAttr.DIR] for r in chosen}
    recipes = {str(r["trial"]): trials[r["trial"]].user_attrs.get(TrialAttr.RECIPE) for r in chosen}
    bases = _best_baselines(study, baselines)
    archs |= {f"baseline:{b['baseline']}": b["dir"] for b in bases}
    recipes |= _baseline_recipes(study, [b["baseline"] for b in bases])
    record = retrain(study, config, archs, seeds, progress, recipes=recipes)
    table = [*chosen, *({"trial": f"baseline:{b['baseline']}"} | b for b in bases)]
    return sorted((_summary(row, record[str(row["trial"])], seeds) for row in table),
                  key=lambda r: r["mean_val_ne"])  # fmt: skip


def confirm_study(
    config: StudyConfig, seeds: int, progress: Callable[[str], None] = print
) -> list[dict[str, Any]]:
    """Retrain the verdict's pair (the study's best trial and the best baseline, both chosen
    on the re-evaluation's seeds) with the first `seeds` seeds of `CONFIRMATION`, which
    choose nothing: the verdict then tests the pair on these alone, so its p-value needs no
    correction for the choice (`leaderboard.confirmation`), only for the confirmation's own
    looks. Returns the two rows (`reevaluate_study`'s), best mean validation NE first."""
    if seeds < 2:
        raise RanknasError(f"--seeds must be at least 2: a paired test of one seed has no "
                           f"spread (got {seeds})")  # fmt: skip
    study = load_study(config.name, config.storage)
    check_settings(study.user_attrs, config)
    v = leaderboard.verdict(study)
    if v is None or not v["seed_means"]:
        raise RanknasError(f"study {config.name!r} has no verdict on seed means to confirm: "
                           "`ranknas reevaluate CONFIG` first retrains the finalists and the "
                           "baselines with the same seeds, which choose the pair")  # fmt: skip
    if v["same_architecture"]:
        raise RanknasError(f"nothing to confirm: the study's best is baseline "
                           f"{v['same_as']}'s own architecture (the same digest)")  # fmt: skip
    trial, base = v["best_trial"]["trial"], v["best_baseline"]["baseline"]
    progress(f"confirming the verdict's pair, trial {trial} and baseline {base} (chosen on "
             f"{v['selection_basis']}), on {seeds_text(seeds, fresh=False)} that choose "
             "nothing")  # fmt: skip
    torch.set_num_threads(config.training.threads)
    trials = {t.number: t for t in study.get_trials(deepcopy=False)}
    found, key = str(trial), f"baseline:{base}"
    archs = {found: trials[trial].user_attrs[TrialAttr.DIR], key: recorded(study)[base]["dir"]}
    recipes = {found: trials[trial].user_attrs.get(TrialAttr.RECIPE)}
    recipes |= _baseline_recipes(study, [base])
    record = retrain(study, config, archs, seeds, progress, recipes=recipes, rounds=CONFIRMATION)
    table = [
        next(r for r in by_recorded_run(study) if r["trial"] == trial),
        next({"trial": key} | b for b in baseline_rows(study) if b["baseline"] == base),
    ]
    # an earlier round's more seeds: the table is over all of them, as the verdict
    seeds = max(seeds, len(record[found].keys() & record[key].keys()))
    rows = (_summary(row, record[str(row["trial"])], seeds, CONFIRM_SEED) for row in table)
    return sorted(rows, key=lambda r: r["mean_val_ne"])


def _best_left_out(study: optuna.Study, chosen: list[dict[str, Any]]) -> dict[str, Any] | None:
    """The study's best by seed means (`leaderboard.study_best`) where `chosen` leaves it out."""
    best = leaderboard.study_best(study)
    if best is None or best["basis"] == "recorded runs":
        return None
    return None if any(r["trial"] == best["trial"] for r in chosen) else best


def _front_line(near: list[dict[str, Any]], far: list[dict[str, Any]]) -> str:
    """`--front` in words: which of the front's cheaper trials it retrains, which not."""

    def trials(rows: list[dict[str, Any]]) -> str:  # "trial 3", "trials 0, 2"
        return f"trial{'s' * (len(rows) > 1)} {', '.join(str(r['trial']) for r in rows)}"

    slack = f"{leaderboard.FRONT_SLACK:.0%}"
    cheaper = len(near) + len(far)
    line = (f"front: {cheaper} of the Pareto front's trials {'is' if cheaper == 1 else 'are'} "
            f"cheaper than the best baseline; retraining {len(near)} within {slack} of its NE"
            + (f" ({trials(near)})" if near else ""))  # fmt: skip
    if far:
        # as the study knows each NE (`leaderboard.estimated_ne`): a second `--front` meets
        # the seed means of the first's retrains, not the recorded runs (it said so)
        line += (f"; not {trials(far)}, more than {slack} worse (seed means where retrained, else "
                 "recorded runs)")  # fmt: skip
    return line


def retrain(
    study: optuna.Study,
    config: StudyConfig,
    archs: dict[str, str],
    seeds: int,
    progress: Callable[[str], None] = print,
    data: StudyData | None = None,
    recipes: dict[str, dict[str, Any] | None] | None = None,
    rounds: Rounds = SELECTION,
) -> dict[str, dict[str, list[float]]]:
    """Train each architecture of `archs` (key: `<trial>` or `baseline:<key>`, value: its
    directory) with the first `seeds` seeds of `rounds` that the study has not recorded,
    each with its searched recipe in `recipes` (none: the study's); each run is recorded as
    it ends, as pending (`rounds.pending`: reused by a rerun), and this round's runs are
    published once every one has ended: an interrupted round's seed means would rank one
    finalist over one seed against the others' single runs. Returns the study's record of
    every run of `rounds`, pending ones included."""
    recipes = recipes or {}
    _check_apart(study, config, rounds, seeds)
    pending = dict(study.user_attrs.get(rounds.pending, {}))
    record = _merged(study.user_attrs.get(rounds.attr, {}), pending)
    wanted = [str(seed) for seed in range(rounds.first_seed, rounds.first_seed + seeds)]
    todo = sum(not _has_ne(record.get(key, {}), seed) for key in archs for seed in wanted)
    total = len(archs) * len(wanted)
    if todo < total:
        progress(f"{total - todo} of {total} runs already recorded, reused: "
                 + (f"training {todo}" if todo else "nothing to train"))  # fmt: skip
    done = 0
    # off a terminal the line after each run is the periodic line
    with bars.bar(todo, rounds.label, "runs", lines=False) as bar:
        for key, directory in archs.items():
            runs = dict(record.get(key, {}))
            missing = [seed for seed in wanted if not _has_ne(runs, seed)]  # failed: again
            if missing and data is None:
                data = prepare_data(config)
                check_protocol(study, config, data)
            if missing:
                arch = read_architecture(directory, _recorded_digest(study, key), _label(key))
            for seed in missing:
                label = f"{_label(key)} seed {seed}"
                result, _ = train_architecture(arch, data, config, int(seed), label=label,
                                               recipe=recipes.get(key))  # fmt: skip
                runs[seed] = _recorded(result)
                record[key] = runs
                pending[key] = pending.get(key, {}) | {seed: runs[seed]}
                study.set_user_attr(rounds.pending, pending)
                done += 1
                progress(f"[{done}/{todo}] {label}: {_outcome(result)}")
                bar.update()
    if finished := {key: record[key] for key in archs if key in pending}:
        # this round's runs only: another, interrupted, round's stay pending until it ends
        looks_before = leaderboard.looks(study)
        study.set_user_attr(rounds.attr, dict(study.user_attrs.get(rounds.attr, {})) | finished)
        study.set_user_attr(rounds.pending, {k: v for k, v in pending.items() if k not in archs})
        v = leaderboard.verdict(study) or {}
        if rounds is SELECTION:
            _count_look(study, v, looks_before)
        # either kind may show a confirmed test not seen before: a selection round that
        # pairs one confirmation's trial with another's baseline too
        _count_confirmation_look(study, v)
    return record


def _check_apart(study: optuna.Study, config: StudyConfig, rounds: Rounds, seeds: int) -> None:
    """Refuse seeds of `rounds` that a trial or baseline was trained with (`config.seed` and
    the study seed plus each trial's number): such a retrain repeats the run that chose it."""
    first, last = rounds.first_seed, rounds.first_seed + seeds - 1
    low, high = config.seed, config.seed + len(study.trials)
    if low <= last and first <= high:
        raise RanknasError(f"seed: {config.seed} gives the study's runs seeds {low}-{high}, and "
                           f"`{rounds.label}` trains with seeds {first}-{last}: a retrain would "
                           f"repeat the run that chose it; give the study a seed below "
                           f"{REEVAL_SEED - len(study.trials) - 1} in a new study "
                           "(`name:`)")  # fmt: skip


def _count_look(study: optuna.Study, v: dict[str, Any], looks_before: int) -> None:
    """One more look at the verdict `v` where this round changed its paired test on the
    choosing seeds (another pair, or more seeds both sides share): the p a user reads now,
    who may stop at it or go on (`leaderboard.corrected`). A round whose seeds the test does
    not use is none."""
    paired = v.get("selection_paired") or {}
    last = study.user_attrs.get(StudyAttr.REEVALUATION_LOOKS) or {}
    tested = last.get("tested")
    if paired.get("p_single") is not None:  # else no test: under two shared seeds, no spread
        tested = [str(v["best_trial"]["trial"]), v["best_baseline"]["baseline"], paired["seeds"]]
    # written every round: a study without it is one re-evaluated before looks were counted
    count = looks_before + (tested != last.get("tested"))
    study.set_user_attr(StudyAttr.REEVALUATION_LOOKS, {"count": count, "tested": tested})


def _count_confirmation_look(study: optuna.Study, v: dict[str, Any]) -> None:
    """The verdict `v`'s confirmed test, where it is one not shown before, counted as a look
    at the confirmation: each distinct [trial, baseline, seeds] once (a pair confirmed, left
    and chosen again shows the test already counted)."""
    paired = v.get("paired") or {}
    if not paired.get("confirmed") or paired.get("p_single") is None:
        return
    test = [str(v["best_trial"]["trial"]), v["best_baseline"]["baseline"], paired["seeds"]]
    if test not in (shown := leaderboard.confirmation_tests(study)):
        study.set_user_attr(StudyAttr.CONFIRMATION_LOOKS, {"shown": [*shown, test]})


def _merged(
    record: dict[str, dict[str, list[float]]], pending: dict[str, dict[str, list[float]]]
) -> dict[str, dict[str, list[float]]]:
    """The published runs with the pending ones over them, key by key."""
    return {key: record.get(key, {}) | pending.get(key, {}) for key in record | pending}


def _baseline_recipes(study: optuna.Study, keys: list[str]) -> dict[str, dict | None]:
    """The recipes the baselines `keys` were recorded with (tuned ones: their best)."""
    found = recorded(study)
    return {f"baseline:{key}": found.get(key, {}).get("recipe") for key in keys}


def best_baseline_by_seed_means(
    study: optuna.Study,
    config: StudyConfig,
    data: StudyData,
    progress: Callable[[str], None] = print,
) -> str | None:
    """The key of the baseline of best mean validation NE over `config.best_baseline.seeds`
    fresh seeds, among the `config.best_baseline.top` best single runs (None: all): the runs
    `reevaluate` would make (and later reuses). None when the single runs decide (seeds 0,
    or fewer than two complete baselines)."""
    choice = config.best_baseline
    bases = {b["baseline"]: b["dir"] for b in _best_baselines(study, choice.top)}
    if choice.seeds == 0 or len(bases) < 2:
        if choice.seeds and bases:  # said: README promises the baselines their seeds
            progress(f"best baseline: {', '.join(bases)}, the only complete one, is not "
                     "retrained with seeds: there is no other to choose from")  # fmt: skip
        return None
    which = "every baseline" if choice.top is None else "the best single runs"
    progress(f"best baseline: {which} ({', '.join(bases)}) retrained with "
             f"{seeds_text(choice.seeds)}")  # fmt: skip
    archs = {f"baseline:{key}": directory for key, directory in bases.items()}
    recipes = _baseline_recipes(study, list(bases))
    record = retrain(study, config, archs, choice.seeds, progress, data, recipes)
    means = {key: _mean_val_ne(record[f"baseline:{key}"], choice.seeds) for key in bases}
    ranked = sorted(means, key=means.__getitem__)
    if not math.isfinite(means[ranked[0]]):
        progress(
            "best baseline: each baseline has a retrain that went nan/inf, or none "
            "that finished; the single runs decide"
        )
        return None
    progress("best baseline by mean validation NE: "
             + ", ".join(f"{key} {means[key]:.4f}" for key in ranked))  # fmt: skip
    return ranked[0]


def _best_baselines(study: optuna.Study, top: int | None) -> list[dict[str, Any]]:
    """The `top` (None: all) complete baselines of the best single-run validation NE, with
    their dirs."""
    found = recorded(study)
    bases = sorted((b for b in baseline_rows(study) if b["state"] == "complete"),
                   key=lambda b: b["val_ne"])[:top]  # fmt: skip
    return [b | {"dir": found[b["baseline"]]["dir"]} for b in bases]


def _recorded_digest(study: optuna.Study, key: str) -> str | None:
    """The digest the study recorded for `key` (`<trial>` or `baseline:<key>`)."""
    if key.startswith("baseline:"):
        return recorded(study).get(key.removeprefix("baseline:"), {}).get("digest")
    return study.trials[int(key)].user_attrs.get(TrialAttr.DIGEST)


def _label(key: str) -> str:
    return key.replace("baseline:", "baseline ") if key.startswith("baseline:") else f"trial {key}"


def _summary(
    row: dict[str, Any], runs: dict[str, list[float]], seeds: int, first_seed: int = REEVAL_SEED
) -> dict[str, Any]:
    """One row of the re-evaluation: a run that failed has no NE and is not in the means
    (`seeds` counts the runs that have one; a run that went nan/inf has NE inf); with none,
    the row ranks last."""
    val = _known(runs, seeds, 0, first_seed)
    test = _known(runs, seeds, 1, first_seed)
    return {
        "trial": row["trial"],
        "recorded_val_ne": row["val_ne"],
        "mean_val_ne": _mean_val_ne(runs, seeds, first_seed),
        "sd_val_ne": leaderboard.spread(val),
        "mean_test_ne": statistics.fmean(test) if test else None,
        "mflops": row["mflops"],
        "step_ms": row.get("step_ms"),
        "seeds": len(val),
        "diverged": leaderboard.diverged(val),
    }


def _known(
    runs: dict[str, list[float | None]], seeds: int, split: int, first_seed: int = REEVAL_SEED
) -> list[float]:
    """The NEs (`split` 0: validation, 1: test) of the first `seeds` seeds' runs (from
    `first_seed`) that have one (a failed run has none)."""
    values = (runs[str(first_seed + k)][split] for k in range(seeds))
    return [v for v in values if v is not None]


def _mean_val_ne(
    runs: dict[str, list[float | None]], seeds: int, first_seed: int = REEVAL_SEED
) -> float:
    """Mean validation NE of the runs that have one (inf: none)."""
    val = _known(runs, seeds, 0, first_seed)
    return statistics.fmean(val) if val else math.inf


def _has_ne(runs: dict[str, list[float | None]], seed: str) -> bool:
    """Whether the run of `seed` is recorded with a validation NE (a failed one is not)."""
    return seed in runs and runs[seed][0] is not None


def _recorded(result: Any) -> list[float | None]:
    """A run's [validation NE, test NE] as the record keeps them: inf where its loss or
    predictions went nan/inf, None where it failed otherwise (or has no test rows)."""
    if result.non_finite:
        return [math.inf, math.inf]
    return [_finite(result.validation.get("ne")), _finite(result.test.get("ne"))]


def _finite(value: float | None) -> float | None:
    return value if value is not None and math.isfinite(value) else None


def _outcome(result: Any) -> str:
    """A re-evaluation run in words: its NE, and whether it failed or diverged."""
    ne = _finite(result.validation.get("ne"))
    if result.non_finite:
        return (f"diverged ({result.failure_reason}): recorded at NE inf, so its model's "
                "mean is inf; the same seed would do so again, so it is not retried")  # fmt: skip
    if ne is None:
        return f"failed ({result.failure_reason}); left out of the mean, retried by a rerun"
    if ne >= 1:
        return f"validation NE {ne:.4f}, worse than the base rate (diverged)"
    return f"validation NE {ne:.4f}"
