"""One-shot search over a trained supernet: regularized evolution or a REINFORCE controller.

Each candidate is scored with inherited weights: `build_model(arch)` loaded with
`supernet.extract(arch)`, fine-tuned a few steps (on the training split when the scorer is
given it, else on the validation split), then evaluated (validation NE on `score_rows`
rows). The fitness a searcher minimizes is cost-aware,
TuNAS-style: `ne + cost_weight * |mflops / target_mflops - 1|` (no cost term without a
target); with `cost_penalty="above"` the target is a ceiling: `max(0, mflops / target - 1)`.
"""

from __future__ import annotations

import math
import random
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any, Literal

import numpy as np
import torch
import torch.nn.functional as F

from nas.oneshot.supernet import Supernet, batches, sample_arch
from search_space.architecture import Architecture, analyze, digest
from search_space.builder import build_model
from search_space.errors import SpecError
from trainers import progress as bars
from trainers.data.dataset import TabularData
from trainers.trainer import TrainConfig, evaluate, make_optimizers

# Called with (candidates scored so far, the best candidate so far).
SearchCallback = Callable[[int, "Candidate"], None]


@dataclass
class Candidate:
    values: dict[str, Any]
    digest: str
    ne: float
    mflops: float
    fitness: float
    coarse_ne: float | None = None  # the short fine-tune's score, once `refine`d

    def to_dict(self) -> dict[str, Any]:
        out = {"digest": self.digest, "ne": self.ne, "mflops": self.mflops}
        out["fitness"] = self.fitness
        return out | ({"coarse_ne": self.coarse_ne} if self.coarse_ne is not None else {})


CostPenalty = Literal["absolute", "above"]


def cost_excess(ratio: float, penalty: CostPenalty) -> float:
    """The cost term of `ratio` = cost / target: |ratio - 1| (TuNAS: a target to meet), or
    max(0, ratio - 1) (a ceiling: no reward for costing less)."""
    return abs(ratio - 1.0) if penalty == "absolute" else max(0.0, ratio - 1.0)


def fitness(
    ne: float,
    mflops: float,
    target_mflops: float | None,
    cost_weight: float,
    penalty: CostPenalty = "absolute",
) -> float:
    """NE plus the cost penalty (lower is better)."""
    if not math.isfinite(ne):
        return math.inf
    if target_mflops is None or cost_weight == 0:
        return ne
    return ne + cost_weight * cost_excess(mflops / target_mflops, penalty)


class Scorer:
    """Scores architectures with inherited weights after a short fine-tune (cached)."""

    def __init__(
        self,
        supernet: Supernet,
        valid: TabularData,
        *,
        finetune_data: TabularData | None = None,
        finetune_steps: int = 20,
        batch_size: int = 256,
        score_rows: int | None = 5000,
        dense_lr: float = 2e-3,
        sparse_lr: float = 0.05,
        target_mflops: float | None = None,
        cost_weight: float = 0.0,
        cost_penalty: CostPenalty = "absolute",
        seed: int = 0,
    ) -> None:
        self.supernet, self.valid = supernet, valid
        self.finetune_data = finetune_data if finetune_data is not None else valid
        self.finetune_steps, self.batch_size, self.score_rows = (
            finetune_steps,
            batch_size,
            score_rows,
        )
        self.train_config = TrainConfig(
            batch_size=batch_size, dense_lr=dense_lr, sparse_lr=sparse_lr
        )
        self.target_mflops, self.cost_weight, self.seed = target_mflops, cost_weight, seed
        self.cost_penalty = cost_penalty
        self.cache: dict[str, Candidate] = {}
        self.examples = 0  # training examples consumed by fine-tunes

    def inherited_ne(self, arch: Architecture, steps: int | None = None) -> float:
        """Validation NE of `arch` with inherited weights after a fine-tune of `steps`
        (default: `finetune_steps`)."""
        steps = self.finetune_steps if steps is None else steps
        model = build_model(arch)
        model.load_state_dict(self.supernet.extract(arch), strict=True)
        if steps:
            model.train()
            optimizers = [o for o in make_optimizers(model, self.train_config) if o is not None]
            stream = batches(self.finetune_data, self.batch_size, self.seed)
            for _ in range(steps):
                dense, sparse, labels = next(stream)
                self.examples += len(labels)
                loss = F.binary_cross_entropy_with_logits(model(dense, sparse), labels)
                for optimizer in optimizers:
                    optimizer.zero_grad(set_to_none=True)
                loss.backward()
                for optimizer in optimizers:
                    optimizer.step()
        return float(evaluate(model, self.valid, self.score_rows)["ne"])

    def __call__(self, values: dict[str, Any]) -> Candidate | None:
        """The scored candidate, or None where the values decode to no valid network."""
        space = self.supernet.space
        try:
            arch = space.decode(values)
            analysis = analyze(arch)
        except SpecError:
            return None
        key = digest(arch)
        if key in self.cache:
            return self.cache[key]
        ne = self.inherited_ne(arch)
        mflops = analysis.flops / 1e6
        found = Candidate(
            values=dict(values),
            digest=key,
            ne=ne,
            mflops=mflops,
            fitness=fitness(ne, mflops, self.target_mflops, self.cost_weight, self.cost_penalty),
        )
        self.cache[key] = found
        return found

    def top(self, k: int) -> list[Candidate]:
        ranked = sorted(self.cache.values(), key=lambda c: c.fitness)
        return [c for c in ranked if math.isfinite(c.fitness)][:k]

    def refine(self, ranked: list[Candidate], count: int, steps: int) -> list[Candidate]:
        """Successive halving's second rung: rescore the best `count` of `ranked` after a
        longer fine-tune of `steps` from their inherited weights, and rank them by that
        score ahead of the rest. The short fine-tune finds the promising region cheaply but
        barely ranks the architectures inside it; the longer one ranks them better."""
        head, tail = ranked[:count], ranked[count:]
        refined = []
        with bars.bar(len(head), "rescoring", "candidates", lines=False) as bar:
            for c in head:
                ne = self.inherited_ne(self.supernet.space.decode(c.values), steps)
                score = fitness(
                    ne, c.mflops, self.target_mflops, self.cost_weight, self.cost_penalty
                )
                refined.append(replace(c, ne=ne, fitness=score, coarse_ne=c.ne))
                bar.update()
        return sorted(refined, key=lambda c: c.fitness) + tail


def evolution_search(
    scorer: Scorer,
    *,
    candidates: int,
    population: int = 16,
    sample_size: int = 4,
    seed: int = 0,
    on_progress: SearchCallback | None = None,
) -> list[Candidate]:
    """Regularized evolution (aging): tournament of `sample_size`, mutate the best, drop the
    oldest. Returns every scored candidate, best first."""
    space = scorer.supernet.space
    rng = random.Random(seed)
    population = max(1, min(population, candidates))
    sample_size = max(1, min(sample_size, population))
    queue: list[Candidate] = []
    scored, attempts = 0, 0
    while scored < candidates and attempts < 10 * candidates:
        attempts += 1
        if len(queue) < population:
            values, _ = sample_arch(space, rng, "spos")
        else:
            parent = min(rng.sample(queue, sample_size), key=lambda c: c.fitness)
            child = space.mutate(space.decode(parent.values), rng)
            values = space.encode(child)
        before = len(scorer.cache)
        found = scorer(values)
        if found is None:
            continue
        queue.append(found)
        if len(queue) > population:
            queue.pop(0)
        if len(scorer.cache) > before:
            scored += 1
            if on_progress is not None:
                on_progress(scored, scorer.top(1)[0] if scorer.top(1) else found)
    return scorer.top(len(scorer.cache))


def reinforce_search(
    scorer: Scorer,
    *,
    candidates: int,
    lr: float = 0.1,
    baseline_decay: float = 0.9,
    seed: int = 0,
    on_progress: SearchCallback | None = None,
) -> list[Candidate]:
    """A REINFORCE controller (TuNAS-style): independent categorical logits per parameter,
    reward = -fitness (NE plus the absolute-value cost penalty), a moving-average baseline,
    gradient only through the parameters the sampled architecture uses."""
    space = scorer.supernet.space
    params = space.parameters()
    generator = torch.Generator().manual_seed(seed)
    logits = {name: torch.zeros(len(p.choices), requires_grad=True) for name, p in params.items()}
    optimizer = torch.optim.Adam(list(logits.values()), lr=lr)
    baseline: float | None = None
    scored, attempts = 0, 0
    while scored < candidates and attempts < 10 * candidates:
        attempts += 1
        picks = {
            name: int(torch.multinomial(F.softmax(v.detach(), 0), 1, generator=generator))
            for name, v in logits.items()
        }
        values = {name: params[name].choices[i] for name, i in picks.items()}
        before = len(scorer.cache)
        found = scorer(values)
        reward = -found.fitness if found is not None and math.isfinite(found.fitness) else None
        if reward is None:
            reward = baseline - 1.0 if baseline is not None else -2.0  # invalid: below average
        baseline = (
            reward
            if baseline is None
            else baseline_decay * baseline + (1 - baseline_decay) * reward
        )
        active = space.active(values)
        log_prob = sum(F.log_softmax(logits[n], 0)[picks[n]] for n in active)
        loss = -(reward - baseline) * log_prob
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        if found is not None and len(scorer.cache) > before:
            scored += 1
            if on_progress is not None:
                on_progress(scored, scorer.top(1)[0])
    return scorer.top(len(scorer.cache))


def search(
    scorer: Scorer,
    method: Literal["evolution", "reinforce"],
    *,
    candidates: int,
    population: int = 16,
    sample_size: int = 4,
    seed: int = 0,
    on_progress: SearchCallback | None = None,
) -> list[Candidate]:
    if method == "reinforce":
        return reinforce_search(scorer, candidates=candidates, seed=seed, on_progress=on_progress)
    return evolution_search(
        scorer,
        candidates=candidates,
        population=population,
        sample_size=sample_size,
        seed=seed,
        on_progress=on_progress,
    )


def kendall_tau(a: list[float], b: list[float]) -> float:
    from scipy.stats import kendalltau

    return float(kendalltau(np.asarray(a), np.asarray(b)).statistic)
