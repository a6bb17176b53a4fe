"""The one-shot / DNAS phase of a study: run once, then enqueue the top candidates.

`run_search_phase` is called by `nas.runner.run_study` before its trial loop. For
`searcher.type` `oneshot` it trains a supernet and searches it (evolution or REINFORCE with
inherited-weight scores); for `dnas` it trains architecture logits beside the supernet
weights. Either way it enqueues its `top_k` candidates with `study.enqueue_trial`, so the
runner trains them stand-alone as ordinary trials (leaderboard, export and MLflow treat
them like any other); any further trials are sampled at random.

Idempotent on resume: the phase records `study.user_attrs["<type>_phase"]` (its candidates
and timings) and does not run again once that is set. It runs under the study lock, so
workers that join meanwhile wait for its candidates instead of duplicating it.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any, TypeVar

import optuna

from cost_models.sharding.measure import torch_threads
from nas.config import StudyConfig
from nas.oneshot.dnas import ArchitectureDistribution, train_dnas
from nas.oneshot.search import Candidate, Scorer, search
from nas.oneshot.supernet import Supernet, train_supernet
from nas.protocol import StudyData, architecture_costs, over_constraint
from nas.protocol_diff import CONSTRAINTS
from nas.storage import study_lock
from nas.trial_record import counted_trials
from search_space.errors import RanknasError
from search_space.spaces import SearchSpace
from search_space.spaces.dag import DagSpace
from trainers import progress as bars

T = TypeVar("T")

PHASE_SEARCHERS = ("oneshot", "dnas")
# DNAS without rescoring draws this many times `top_k` of its most probable architectures,
# so that those over a constraint can be passed over
PASSED_OVER_FACTOR = 8
# a trial's attribute: which phase's candidate it trains (`dnas #1`), or `random` for the
# random sampling that fills the budget after the candidates
PROPOSED_BY = "proposed_by"
RANDOM_FILL = "random"


def phase_attr(searcher: str) -> str:
    return f"{searcher}_phase"


def proposed_by(study: optuna.Study, kind: str, arch_digest: str) -> str:
    """Which of the phase's candidates an architecture is (`dnas #1`), by its digest, or
    `random` (the budget past them). (A retry takes the oldest queued trial, whose own
    attributes named another candidate.)"""
    candidates = study.user_attrs.get(phase_attr(kind), {}).get("candidates", [])
    ranks = [rank for rank, c in enumerate(candidates) if c.get("digest") == arch_digest]
    return f"{kind} #{ranks[0] + 1}" if ranks else RANDOM_FILL


def run_search_phase(
    study: optuna.Study,
    config: StudyConfig,
    space: SearchSpace,
    data: StudyData,
    progress: Callable[[str], None] = print,
    logger: Any = None,
) -> list[dict[str, Any]] | None:
    """Run the one-shot/DNAS phase once per study and enqueue its candidates; returns the
    candidates' summaries (None when the searcher has no phase or it already ran)."""
    kind = config.searcher.type
    if kind not in PHASE_SEARCHERS:
        return None
    with study_lock(config.storage, config.name):
        if phase_attr(kind) in study.user_attrs:
            return None
        if not isinstance(space, DagSpace):
            raise RanknasError(f"searcher {kind!r} supports the dag search space only")
        started = time.monotonic()
        with torch_threads(1):  # supernet steps are many tiny ops
            if kind == "oneshot":
                candidates, extra = _oneshot(config, space, data, progress, logger)
            else:
                candidates, extra = _dnas(config, space, data, progress, logger)
        for rank, c in enumerate(candidates):
            study.enqueue_trial(
                c["values"],
                user_attrs={"proposal_rank": rank}
                | {f"{kind}_{k}": v for k, v in c.items() if k not in ("values", "digest")},
            )
        summary = [{k: v for k, v in c.items() if k != "values"} for c in candidates]
        seconds = round(time.monotonic() - started, 1)
        study.set_user_attr(phase_attr(kind), {"candidates": summary, "seconds": seconds} | extra)
    progress(f"{kind}: enqueued {len(candidates)} candidates for stand-alone training ({seconds}s)"
             + _past_the_budget(study, config, len(candidates)))  # fmt: skip
    if logger is not None:
        logger.log_study_summary(
            metrics={f"{kind}_phase_seconds": seconds, f"{kind}_candidates": len(candidates)},
            status=None,
        )
    return summary


def _past_the_budget(study: optuna.Study, config: StudyConfig, candidates: int) -> str:
    """What the line says where the budget trains fewer than the candidates, or more: the
    rest of the budget is random sampling (`proposed by: random` in the leaderboard)."""
    left = config.budget.trials - counted_trials(study.get_trials(deepcopy=False))
    if candidates > left:
        return f"; the budget trains the first {left} (budget.trials)"
    if candidates < left:
        return f"; the other {left - candidates} trials of the budget sample the space at random"
    return ""


def _log(logger: Any, metrics: dict[str, float]) -> None:
    if logger is not None:
        logger.log_study_summary(metrics=metrics, status=None)


def trained_supernet(
    config: StudyConfig,
    space: DagSpace,
    data: StudyData,
    on_loss: Callable[[int, float], None] | None = None,
) -> tuple[Supernet, list[tuple[int, float]]]:
    """The supernet of `searcher.type: oneshot`, trained on the training split as its
    settings say; returns it with its (step, loss) curve."""
    s, t = config.searcher, config.training
    supernet = Supernet(space, seed=config.seed)
    curve = train_supernet(
        supernet,
        data.train,
        steps=s.supernet_steps,
        batch_size=t.batch_size,
        sampling=s.supernet_sampling,
        warmup_fraction=s.warmup_fraction,
        dense_lr=t.dense_lr,
        sparse_lr=t.sparse_lr,
        max_grad_norm=s.supernet_grad_clip,
        lr_schedule=s.supernet_lr_schedule,
        seed=config.seed,
        log_every=max(1, s.supernet_steps // 10),
        on_loss=on_loss,
    )
    return supernet, curve


def _oneshot(config, space, data, progress, logger) -> tuple[list[dict], dict]:
    s, t = config.searcher, config.training

    def on_loss(step: int, loss: float) -> None:
        progress(f"oneshot: supernet step {step}/{s.supernet_steps} train loss {loss:.4f}")
        _log(logger, {"oneshot_supernet_loss": loss})

    supernet, curve = trained_supernet(config, space, data, on_loss)
    scorer = make_scorer(config, supernet, data)
    every = max(1, s.search_candidates // 8)
    # off a terminal the lines below are the periodic lines
    shown = bars.bar(s.search_candidates, f"oneshot {s.oneshot_search}", "candidates", lines=False)

    def on_progress(scored: int, best: Candidate) -> None:
        # the best by fitness: with a cost penalty a later best may have the higher NE
        penalized = best.fitness != best.ne
        shown.update(scored - shown.n)
        shown.show("best fitness" if penalized else "best inherited NE", best.fitness)
        if scored % every == 0 or scored == s.search_candidates:
            fitness = f"fitness {best.fitness:.4f} (NE + cost penalty): " if penalized else ""
            progress(
                f"oneshot: {s.oneshot_search} scored {scored}/{s.search_candidates}, best "
                f"{fitness}inherited NE {best.ne:.4f} ({best.mflops:.3f} MFLOPs)"
            )
            logged = {"oneshot_best_inherited_ne": best.ne, "oneshot_best_fitness": best.fitness}
            _log(logger, logged | {"oneshot_scored": scored})

    with shown:
        ranked = search(
            scorer,
            s.oneshot_search,
            candidates=s.search_candidates,
            population=s.population,
            sample_size=s.sample_size,
            seed=config.seed,
            on_progress=on_progress,
        )
    ranked = _within_constraints(config, space, data, ranked, lambda c: c.values, progress)
    ranked = _refine(config, scorer, ranked, progress, logger)
    candidates = _enqueued(ranked, s.top_k)
    supernet_examples = (curve[-1][0] if curve else 0) * t.batch_size
    extra = {
        "supernet_loss": curve[-1][1] if curve else None,
        "scored": len(scorer.cache),
        "examples": supernet_examples + scorer.examples,
    }
    return candidates, extra


def make_scorer(config: StudyConfig, supernet: Supernet, data: StudyData) -> Scorer:
    """The inherited-weight scorer the searcher's settings describe."""
    s, t = config.searcher, config.training
    return Scorer(
        supernet,
        data.valid,
        finetune_data=data.train,
        finetune_steps=s.finetune_steps,
        batch_size=s.finetune_batch_size or t.batch_size,
        score_rows=s.score_rows,
        dense_lr=t.dense_lr,
        sparse_lr=t.sparse_lr,
        target_mflops=s.target_mflops,
        cost_weight=s.cost_weight,
        cost_penalty=s.cost_penalty,
        seed=config.seed,
    )


def _refine(config, scorer: Scorer, ranked: list[Candidate], progress, logger) -> list[Candidate]:
    """The second rung (`searcher.refine_candidates`), if configured."""
    s, kind = config.searcher, config.searcher.type
    if not s.refine_candidates or not ranked:
        return ranked
    progress(f"{kind}: rescoring the best {min(s.refine_candidates, len(ranked))} after "
             f"{s.refine_steps} fine-tune steps")  # fmt: skip
    ranked = scorer.refine(ranked, s.refine_candidates, s.refine_steps)
    best = ranked[0]
    progress(f"{kind}: best after rescoring: inherited NE {best.ne:.4f} (short fine-tune "
             f"{best.coarse_ne:.4f}, {best.mflops:.3f} MFLOPs)")  # fmt: skip
    _log(logger, {f"{kind}_best_refined_ne": best.ne})
    return ranked


def _within_constraints(
    config: StudyConfig,
    space: DagSpace,
    data: StudyData,
    ranked: list[T],
    values_of: Callable[[T], dict[str, Any]],
    progress: Callable[[str], None],
) -> list[T]:
    """The best of `ranked` within the study's constraints (`objectives.max_mflops` and
    the others), as many as the phase goes on with (`top_k`, `refine_candidates`): one
    over them would be enqueued only to be skipped untrained, its place in the budget going
    to random sampling."""
    s, kept, over = config.searcher, [], 0
    if not any(getattr(config.objectives, name) for name in CONSTRAINTS):
        return ranked
    wanted = max(s.top_k, s.refine_candidates or 0)
    for item in ranked:
        if len(kept) == wanted:
            break
        costs = architecture_costs(space.decode(values_of(item)), config, data.pooling_factors)
        if over_constraint(costs, config):
            over += 1
        else:
            kept.append(item)
    if over:
        progress(f"{s.type}: passed over {over} of its best-ranked candidates, over the "
                 "study's objectives.max_* constraints")  # fmt: skip
    return kept


def _enqueued(ranked: list[Candidate], top_k: int) -> list[dict]:
    """The candidates' records for `enqueue_trial`: values, digest, costs, inherited NE."""
    candidates = []
    for c in ranked[:top_k]:
        record = {"values": c.values, **c.to_dict(), "inherited_ne": c.ne}
        record.pop("ne")
        candidates.append(record)
    return candidates


def _dnas(config, space, data, progress, logger) -> tuple[list[dict], dict]:
    from search_space.architecture import analyze, digest

    s, t = config.searcher, config.training
    supernet = Supernet(space, seed=config.seed)
    dist = ArchitectureDistribution(space)

    def on_progress(step: int, metrics: dict[str, float]) -> None:
        shown = ", ".join(f"{k} {v:.4g}" for k, v in metrics.items())
        progress(f"dnas: step {step}/{s.supernet_steps} {shown}")
        _log(logger, {f"dnas_{k}": v for k, v in metrics.items()})

    log = train_dnas(
        dist,
        supernet,
        data.train,
        data.valid,
        steps=s.supernet_steps,
        batch_size=t.batch_size,
        warmup_fraction=s.warmup_fraction,
        tau=(s.dnas_tau_start, s.dnas_tau_end),
        arch_lr=s.dnas_arch_lr,
        dense_lr=t.dense_lr,
        sparse_lr=t.sparse_lr,
        target_mflops=s.target_mflops,
        cost_weight=s.cost_weight,
        cost_penalty=s.cost_penalty,
        seed=config.seed,
        log_every=max(1, s.supernet_steps // 10),
        on_progress=on_progress,
    )
    scored_examples = 0
    if s.dnas_rescore:
        # score the distribution's most probable architectures with the weights trained
        # beside it, as one-shot scores its candidates, instead of trusting the argmax
        scorer = make_scorer(config, supernet, data)
        found = []
        with bars.bar(s.dnas_rescore, "dnas scoring", "candidates", lines=False) as bar:
            for values in dist.top_values(s.dnas_rescore, seed=config.seed):
                found.append(scorer(values))
                bar.update()
        ranked = sorted((c for c in found if c is not None), key=lambda c: c.fitness)
        progress(f"dnas: scored the {len(ranked)} most probable architectures with inherited "
                 "weights")  # fmt: skip
        ranked = _within_constraints(config, space, data, ranked, lambda c: c.values, progress)
        candidates = _enqueued(_refine(config, scorer, ranked, progress, logger), s.top_k)
        scored_examples = scorer.examples
    else:
        candidates = []  # the most probable first; those over a constraint passed over
        drawn = dist.top_values(s.top_k * PASSED_OVER_FACTOR, seed=config.seed)
        kept = _within_constraints(config, space, data, drawn, lambda v: v, progress)
        for values in kept[: s.top_k]:
            arch = space.decode(values)
            candidates.append(
                {"values": values, "digest": digest(arch), "mflops": analyze(arch).flops / 1e6}
            )
    last = log[-1] if log else {}
    weight_steps = s.supernet_steps
    arch_steps = s.supernet_steps - int(s.warmup_fraction * s.supernet_steps)
    extra = {
        "expected_mflops": last.get("expected_mflops"),
        "train_loss": last.get("train_loss"),
        # validation batches of the architecture steps count too
        "examples": (weight_steps + arch_steps) * t.batch_size + scored_examples,
    }
    return candidates, extra
