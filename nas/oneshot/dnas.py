"""DNAS over the DAG space: architecture logits for every choice, Gumbel-softmax relaxation
with temperature annealing, an expected-FLOPs penalty, derive the argmax architecture.

Architecture logits: one vector per parameter of the space (op, width, count and every input
slot of each block, the embedding dim). Each step draws a hard Gumbel-softmax sample per
parameter (GDAS-style straight-through: the forward pass runs the one sampled path of the
`Supernet`, and each chosen op, size, input and embedding dim scales its tensor by the
straight-through weight, 1 in value, so the loss has a gradient for the logits).
Weight updates use the training split, architecture updates the validation split; the
first `warmup_fraction` of the steps update the weights only.

Expected FLOPs (`expected_flops`): per block, the sum over the block's own choices (op,
size, input slots) of their probability times the exact FLOPs of that choice from the
blocks' `flops` classmethods (merge projections and, for the output block, the head
included), with the input shapes of earlier blocks taken from the argmax architecture;
each block's term is weighted by the probability that it is live (reached from the
output), computed from the input-slot probabilities. With a one-hot distribution this is
exactly `analyze(arch).flops`. The penalty is `cost_weight * |E[FLOPs] / target - 1|`, or
`cost_weight * max(0, E[FLOPs] / target - 1)` when the target is a ceiling.
"""

from __future__ import annotations

import functools
import itertools
import math
import random
from collections.abc import Callable
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F

from nas.oneshot.search import CostPenalty
from nas.oneshot.supernet import PathGates, Supernet, SupernetOptimizer, batches, sample_arch
from search_space.architecture import Architecture, BlockSpec, analyze, digest
from search_space.blocks import OPS
from search_space.errors import SpecError
from search_space.params import validate_params
from search_space.shapes import Dense, Sparse
from search_space.spaces.base import interaction_op
from search_space.spaces.dag import NONE, DagSpace, block_name, input_param, param_name
from trainers import progress as bars

WIDTH_OPS = ("mlp", "sum", "cross")
COUNT_OPS = ("efc",)
# Called with (step, metrics of the step).
DnasCallback = Callable[[int, dict[str, float]], None]


class ArchitectureDistribution:
    """Independent categorical logits over every parameter of a DAG space."""

    def __init__(self, space: DagSpace) -> None:
        self.space = space
        self.choices = {name: p.choices for name, p in space.parameters().items()}
        self.logits = {
            name: torch.zeros(len(c), dtype=torch.float64, requires_grad=True)
            for name, c in self.choices.items()
        }
        self._tables: dict[Any, np.ndarray] = {}

    def probabilities(self) -> dict[str, torch.Tensor]:
        return {name: F.softmax(v, dim=0) for name, v in self.logits.items()}

    def argmax_values(self) -> dict[str, Any]:
        return {n: self.choices[n][int(v.detach().argmax())] for n, v in self.logits.items()}

    def derive(self) -> Architecture:
        """The argmax architecture (the most likely valid one if the argmax is invalid)."""
        return self.space.decode(self.top_values(1)[0])

    def top_values(self, k: int, samples: int = 512, seed: int = 0) -> list[dict[str, Any]]:
        """Up to `k` distinct valid architectures, most probable first: the argmax, then
        the most probable of `samples` draws from the distribution."""
        generator = torch.Generator().manual_seed(seed)
        probs = {n: p.detach() for n, p in self.probabilities().items()}
        pool = [self.argmax_values()]
        for _ in range(samples):
            pool.append(
                {
                    n: self.choices[n][int(torch.multinomial(p, 1, generator=generator))]
                    for n, p in probs.items()
                }
            )
        scored, seen = [], set()
        for index, values in enumerate(pool):
            try:
                arch = self.space.decode(values)
                analyze(arch)
            except SpecError:
                continue
            key = digest(arch)
            if key in seen:
                continue
            seen.add(key)
            log_p = sum(
                math.log(float(probs[n][self.choices[n].index(values[n])]) + 1e-300)
                for n in self.space.active(values)
            )
            # the argmax (index 0) first where it is valid, then by probability
            scored.append((index != 0, -log_p, index, values))
        scored.sort(key=lambda t: t[:3])
        return [t[3] for t in scored[:k]]

    def expected_flops(self, probs: dict[str, torch.Tensor] | None = None) -> torch.Tensor:
        return expected_flops(self.space, probs or self.probabilities(), tables=self._tables)


def expected_flops(
    space: DagSpace,
    probs: dict[str, torch.Tensor],
    reference: dict[str, Any] | None = None,
    tables: dict[Any, np.ndarray] | None = None,
) -> torch.Tensor:
    """Expected per-example FLOPs of the distribution `probs` (see the module docstring);
    differentiable in `probs`. `reference`: the values whose shapes feed later blocks
    (default: the argmax of `probs`); `tables`: a cache of per-block FLOPs tables."""
    params = space.parameters()
    ref = reference or {n: params[n].choices[int(p.detach().argmax())] for n, p in probs.items()}
    tables = tables if tables is not None else {}
    c, schema = space.config, space.schema
    dim, k_max, n = ref["embedding_dim"], c.max_inputs, c.num_blocks
    total = torch.zeros((), dtype=torch.float64)
    for f in schema.categorical if c.feature_dims else ():
        fdim = ref[f"dim.{f.name}"]
        if fdim != dim:
            total = total + 2 * fdim * dim
    shapes: dict[str, Any] = {
        "dense": Dense(schema.num_dense),
        "sparse": Sparse(schema.num_sparse, dim),
    }
    counts = {"dense": 0, "sparse": schema.num_sparse}
    block_terms, earlier = [], []
    for i in range(n):
        slots = [params[input_param(i, k)].choices for k in range(1, k_max + 1)]
        ops, widths, sizes = (params[param_name(i, x)].choices for x in ("op", "width", "count"))
        sources = slots[0]
        key = (i, dim, tuple((s, shapes[s], counts[s]) for s in sources))
        # the output block also reads the raw inputs its own choice and the earlier blocks
        # (the argmax's connections) do not reach, as `decode` does
        extra = functools.partial(space.unreached, list(earlier)) if i == n - 1 else None
        key += tuple(b.inputs for b in earlier) if extra else ()
        table = tables.get(key)
        if table is None:
            table = _flops_table(ops, widths, sizes, slots, shapes, counts, dim, extra)
            tables[key] = table
        term = torch.from_numpy(table)
        names = [param_name(i, "op"), param_name(i, "width"), param_name(i, "count")] + [
            input_param(i, k) for k in range(1, k_max + 1)
        ]
        for name in names:
            term = torch.tensordot(probs[name].to(torch.float64), term, dims=([0], [0]))
        block_terms.append(term)
        chosen = tuple(
            dict.fromkeys(
                ref[input_param(i, k)]
                for k in range(1, k_max + 1)
                if ref[input_param(i, k)] != NONE
            )
        )
        earlier.append(BlockSpec(block_name(i), ref[param_name(i, "op")], chosen, {}))
        _, shapes[block_name(i)], counts[block_name(i)] = _block_cost(
            ref[param_name(i, "op")],
            ref[param_name(i, "width")],
            ref[param_name(i, "count")],
            chosen,
            shapes,
            counts,
            dim,
        )
    alive: list[torch.Tensor] = [torch.ones((), dtype=torch.float64)] * n
    for i in range(n - 2, -1, -1):
        not_read = torch.ones((), dtype=torch.float64)
        for j in range(i + 1, n):
            misses = torch.ones((), dtype=torch.float64)
            for k in range(1, k_max + 1):
                choices = params[input_param(j, k)].choices
                misses = misses * (1 - probs[input_param(j, k)][choices.index(block_name(i))])
            not_read = not_read * (1 - alive[j] * (1 - misses))
        alive[i] = 1 - not_read
    for live, term in zip(alive, block_terms, strict=True):
        total = total + live * term
    return total


def _block_cost(
    op: str,
    width: int,
    count: int,
    sources: tuple[str, ...],
    shapes: dict[str, Any],
    counts: dict[str, int],
    dim: int,
) -> tuple[int, Any, int]:
    """(FLOPs incl. merge projections, output shape, output embedding count) of one block."""
    in_count = sum(counts[s] or 1 for s in sources)
    op = interaction_op(op, in_count)  # as `DagSpace` decodes it
    cls = OPS[op]
    full, _ = validate_params(cls.PARAMS, DagSpace._params(op, width, count, in_count), op)
    projections = 0
    if cls.input_kind == "dense":
        merged_widths = tuple(Dense(shapes[s].numel) for s in sources)
        merged = merged_widths if cls.takes_list else Dense(sum(w.width for w in merged_widths))
    else:
        embeddings = 0
        for s in sources:
            shape = shapes[s]
            if isinstance(shape, Sparse):
                embeddings += shape.count
            else:
                embeddings += 1
                if shape.width != dim:
                    projections += 2 * shape.width * dim
        merged = Sparse(embeddings, dim)
    try:
        out = cls.output_shape(merged, full)
        flops = cls.flops(merged, full) + projections
    except Exception:  # a choice no valid architecture makes: it costs nothing here
        return 0, Dense(1), 0
    return flops, out, (out.count if isinstance(out, Sparse) else 0)


def _flops_table(ops, widths, sizes, slots, shapes, counts, dim, unreached) -> np.ndarray:
    """FLOPs of every (op, width, count, in1, ..., inK) choice of one block; `unreached`
    (the output block's only): the raw inputs the block adds to the ones it chose."""
    table = np.zeros((len(ops), len(widths), len(sizes), *(len(s) for s in slots)))
    memo: dict[Any, float] = {}
    for o, op in enumerate(ops):
        for w, width in enumerate(widths):
            for z, size in enumerate(sizes):
                if (w and op not in WIDTH_OPS) or (z and op not in COUNT_OPS):
                    table[o, w, z] = table[o, 0 if op not in WIDTH_OPS else w,
                                           0 if op not in COUNT_OPS else z]  # fmt: skip
                    continue
                for index in itertools.product(*(range(len(s)) for s in slots)):
                    picked = [slots[k][j] for k, j in enumerate(index)]
                    chosen = tuple(dict.fromkeys(s for s in picked if s != NONE))
                    if unreached:
                        chosen += unreached(chosen)
                    key = (op, width, size, chosen)
                    if key not in memo:
                        flops, out, _ = _block_cost(op, width, size, chosen, shapes, counts, dim)
                        memo[key] = flops + (2 * out.numel if unreached else 0)
                    table[(o, w, z, *index)] = memo[key]
    return table


# ---------------------------------------------------------------------- training


def _gates(
    space: DagSpace, arch: Architecture, values: dict[str, Any], y: dict[str, torch.Tensor]
) -> PathGates:
    choices = {n: p.choices for n, p in space.parameters().items()}

    def weight(name: str) -> torch.Tensor:
        return y[name][choices[name].index(values[name])].float()

    outputs, inputs = {}, {}
    for i in range(space.config.num_blocks):
        b = block_name(i)
        op = values[f"{b}.op"]
        gate = weight(f"{b}.op")
        if op in WIDTH_OPS:
            gate = gate * weight(f"{b}.width")
        if op in COUNT_OPS:
            gate = gate * weight(f"{b}.count")
        outputs[b] = gate
        for k in range(1, space.config.max_inputs + 1):
            source = values[f"{b}.in{k}"]
            if source != NONE:
                g = weight(f"{b}.in{k}")
                inputs[(b, source)] = inputs[(b, source)] * g if (b, source) in inputs else g
    sparse = weight("embedding_dim") if arch.embedding.features else None
    return PathGates(sparse=sparse, inputs=inputs, outputs=outputs)


def _sample(dist: ArchitectureDistribution, tau: float, rng: random.Random, hard_grad: bool):
    """A hard Gumbel-softmax sample of every parameter and its valid architecture."""
    for _ in range(20):
        y = {n: F.gumbel_softmax(v, tau=tau, hard=True) for n, v in dist.logits.items()}
        if not hard_grad:
            y = {n: t.detach() for n, t in y.items()}
        values = {n: dist.choices[n][int(t.detach().argmax())] for n, t in y.items()}
        try:
            arch = dist.space.decode(values)
            analyze(arch)
        except SpecError:
            continue
        return y, values, arch
    values, arch = sample_arch(dist.space, rng, "spos")
    return None, values, arch


def train_dnas(
    dist: ArchitectureDistribution,
    supernet: Supernet,
    train_data: Any,
    valid_data: Any,
    *,
    steps: int,
    batch_size: int = 256,
    warmup_fraction: float = 0.25,
    tau: tuple[float, float] = (5.0, 0.5),
    arch_lr: float = 0.01,
    dense_lr: float = 2e-3,
    sparse_lr: float = 0.05,
    target_mflops: float | None = None,
    cost_weight: float = 0.0,
    cost_penalty: CostPenalty = "absolute",
    seed: int = 0,
    log_every: int = 20,
    on_progress: DnasCallback | None = None,
) -> list[dict[str, float]]:
    """Alternate weight updates (training split) and architecture updates (validation
    split); returns the logged metrics (loss, expected MFLOPs, tau) every `log_every` steps."""
    rng = random.Random(seed)
    weights = SupernetOptimizer(supernet, dense_lr, sparse_lr)
    arch_opt = torch.optim.Adam(list(dist.logits.values()), lr=arch_lr)
    train_stream = batches(train_data, batch_size, seed)
    valid_stream = batches(valid_data, batch_size, seed + 1)
    warmup = int(warmup_fraction * steps)
    log: list[dict[str, float]] = []
    train_sum, val_sum, arch_steps = 0.0, 0.0, 0
    supernet.train()
    # off a terminal `on_progress`'s lines are the periodic lines
    shown = bars.bar(steps, "dnas", "steps", lines=False)
    with torch.random.fork_rng(devices=[]), shown:
        torch.manual_seed(seed)
        for step in range(1, steps + 1):
            t = tau[0] * (tau[1] / tau[0]) ** ((step - 1) / max(1, steps - 1))
            # weights, on the training split
            _, _, arch = _sample(dist, t, rng, hard_grad=False)
            dense, sparse, labels = next(train_stream)
            path = supernet.path(arch)
            weights.refresh()
            loss = F.binary_cross_entropy_with_logits(supernet(path, dense, sparse), labels)
            weights.zero_grad()
            loss.backward()
            weights.step()
            train_sum += loss.item()
            shown.update()
            # architecture, on the validation split
            if step > warmup:
                y, values, arch = _sample(dist, t, rng, hard_grad=True)
                dense, sparse, labels = next(valid_stream)
                gates = _gates(dist.space, arch, values, y) if y is not None else None
                logits = supernet(arch, dense, sparse, gates)
                val_loss = F.binary_cross_entropy_with_logits(logits, labels)
                total = val_loss + _penalty(dist, target_mflops, cost_weight, cost_penalty)
                arch_opt.zero_grad()
                weights.zero_grad()
                total.backward()
                arch_opt.step()
                weights.zero_grad()
                val_sum, arch_steps = val_sum + val_loss.item(), arch_steps + 1
            if step % log_every == 0 or step == steps:
                with torch.no_grad():
                    mflops = float(dist.expected_flops()) / 1e6
                metrics = {
                    "train_loss": train_sum / log_every,
                    "tau": t,
                    "expected_mflops": mflops,
                }
                if arch_steps:
                    metrics["val_loss"] = val_sum / arch_steps
                log.append({"step": step, **metrics})
                shown.show("loss", metrics["train_loss"])
                shown.show("expected MFLOPs", mflops)
                if on_progress is not None:
                    on_progress(step, metrics)
                train_sum, val_sum, arch_steps = 0.0, 0.0, 0
    return log


def _penalty(
    dist: ArchitectureDistribution,
    target_mflops: float | None,
    cost_weight: float,
    penalty: CostPenalty = "absolute",
) -> torch.Tensor:
    if target_mflops is None or cost_weight == 0:
        return torch.zeros(())
    excess = dist.expected_flops() / 1e6 / target_mflops - 1
    excess = excess.abs() if penalty == "absolute" else excess.clamp(min=0)
    return (cost_weight * excess).float()
