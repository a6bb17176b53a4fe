"""Trainer and data loader throughput, side by side with a minimal loop and an outside reference.

    .venv/bin/python bench/bench_trainer.py --quick     # ~6 min on 2 shared cores
    .venv/bin/python bench/bench_trainer.py             # longer runs, more repeats

Issue "Trainers and data". Everything runs in one process (deepctr-torch in a subprocess),
on the synthetic data set (`generate_synthetic(SyntheticConfig(rows=...))`, split 80/10/10):

1. `trainers.trainer.train` vs a minimal hand-written loop (forward, BCE-with-logits,
   zero_grad, backward, step) on the same model (`build_model(preset(name, schema), seed=0)`),
   the same batches (`train.loader(batch, shuffle=True, seed=0, drop_last=True)`), the same
   optimizers (Adam on dense parameters; Adagrad fused into fbgemm's table-batched kernel
   on the embedding tables, `FusedTables`, as the trainer does on CPU) and the same number
   of steps. Each repeat
   runs the trainer, the minimal loop and the minimal loop again (an A/A control that shows
   the noise floor), in an order rotated every repeat so each takes every position equally;
   ratios are taken within a repeat and their median reported. Trainer throughput is
   `TrainResult.throughput` (evaluation time excluded); `evals=2` gives one intermediate
   evaluation per run; `train()`'s wall time with its evaluations is reported separately.
   Then the trainer's fixed cost per step, measured the same way on a trivial model (one
   linear layer over the dense features, no embeddings) where it is not drowned by compute,
   as a share of each preset's step time. Target: trainer overhead under 5%.
2. The loader alone (batches/s, examples/s; batch 512 and 4096, shuffled or not), and its
   time per batch over the training step time (minimal loop, loading included).
3. deepctr-torch's `DeepFM.fit` as an outside reference on the same rows, features, batch
   size and epochs, run with `--deepctr-python` (default /tmp/deepctr-venv/bin/python; make it
   with `python3 -m venv /tmp/deepctr-venv && /tmp/deepctr-venv/bin/pip install torch==2.13.0
   deepctr-torch`), next to ranknas' `deepfm` preset trained by the trainer. Skipped, with the
   reason printed, when that interpreter is missing or the run fails.

One torch thread by default (`--threads 0`: torch's default, one per core). On a shared
machine a multi-threaded step stalls at every parallel region whenever one of its threads
is descheduled: at load ≈ 5 on 2 cores, dcnv2's trainer runs spread 1,900–24,800 examples/s
with 2 threads but ±10% with 1. The trainer's overhead is per-step Python work, the same
whatever the thread count.

Prints Markdown. Timings are medians of repeats; "±" is half the spread (max − min).
"""

from __future__ import annotations

import argparse
import functools
import io
import json
import logging
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import textwrap
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

import trainers.trainer as trainer_module
from search_space.builder import build_model
from search_space.presets import preset
from trainers import progress
from trainers.data import SyntheticConfig, TabularData, bayes_metrics, generate_synthetic
from trainers.fused_tables import FusedTables
from trainers.metrics import ranking_metrics
from trainers.trainer import TrainConfig, train

PRESET_NAMES = ("dlrm", "dcnv2", "wukong", "deepfm")
DEEPCTR_PYTHON = "/tmp/deepctr-venv/bin/python"
TARGET = 0.05

QUICK = {
    "rows": 200_000,
    "steps": 150,
    "repeats": 9,
    "fixed_steps": 1500,
    "loader_repeats": 3,
    "step_steps_small": 30,
    "step_steps_large": 6,
    "epochs": 1,
    "ref_repeats": 2,
}
FULL = {
    "rows": 200_000,
    "steps": 300,
    "repeats": 15,
    "fixed_steps": 4000,
    "loader_repeats": 5,
    "step_steps_small": 80,
    "step_steps_large": 16,
    "epochs": 2,
    "ref_repeats": 3,
}


def median_spread(values: list[float]) -> tuple[float, float]:
    return statistics.median(values), (max(values) - min(values)) / 2


def fmt(values: list[float], digits: int = 0) -> str:
    mid, half = median_spread(values)
    return f"{mid:,.{digits}f} (±{half:,.{digits}f})"


def fmt_ratio(values: list[float]) -> str:
    return f"{statistics.median(values):.3f} ({min(values):.3f}–{max(values):.3f})"


class EvalClock:
    """Wraps `trainers.trainer.evaluate` (the name `train` calls) to count and time the
    trainer's evaluations. Costs two clock reads per evaluation and nothing per step."""

    def __init__(self) -> None:
        self.calls = 0
        self.wall = 0.0
        self._inner = trainer_module.evaluate

    def __call__(self, *args, **kwargs):
        start = time.perf_counter()
        try:
            return self._inner(*args, **kwargs)
        finally:
            self.calls += 1
            self.wall += time.perf_counter() - start

    def reset(self) -> None:
        self.calls, self.wall = 0, 0.0


@dataclass
class Run:
    throughput: float  # training examples/s, evaluation excluded
    wall: float  # whole call, evaluations included (trainer) / the loop (minimal)
    model: nn.Module
    intermediate_evals: int = 0
    eval_wall: float = 0.0


class DenseOnly(nn.Module):
    """A trivial model (one linear layer over the dense features): its step costs so little
    that the trainer's fixed per-step cost shows."""

    def __init__(self, num_dense: int) -> None:
        super().__init__()
        self.linear = nn.Linear(num_dense, 1)

    def forward(self, dense: torch.Tensor, sparse) -> torch.Tensor:
        return self.linear(dense).squeeze(1)


def run_trainer(make_model, train_data, valid_data, batch_size, steps, clock: EvalClock) -> Run:
    model = make_model()
    config = TrainConfig(batch_size=batch_size, max_steps=steps, evals=2, device="cpu", seed=0)
    clock.reset()
    start = time.perf_counter()
    result = train(model, train_data, valid_data, config=config)
    wall = time.perf_counter() - start
    if result.status != "complete":
        raise RuntimeError(f"trainer run {result.status}: {result.failure_reason}")
    return Run(
        throughput=result.throughput,
        wall=wall,
        model=model,
        intermediate_evals=clock.calls - 1,  # the last one is the final evaluation
        eval_wall=clock.wall,
    )


def minimal_loop(make_model, train_data: TabularData, batch_size: int, steps: int) -> Run:
    """Plain PyTorch: the trainer's optimizers and batches, nothing else."""
    model = make_model()
    defaults = TrainConfig()
    torch.manual_seed(0)
    model.train()
    named = list(model.named_parameters())
    sparse = [p for n, p in named if n.startswith("embedding_bags.")]
    dense = [p for n, p in named if not n.startswith("embedding_bags.")]
    optimizers = [torch.optim.Adam(dense, lr=defaults.dense_lr, fused=True)]  # as the trainer
    if sparse and FusedTables.fits(model.embedding_bags):  # as the trainer does on CPU
        model.embedding_bags = FusedTables(model.embedding_bags, "adagrad", defaults.sparse_lr)
    elif sparse:
        for bag in model.embedding_bags.embedding_bags.values():
            bag.sparse = True
        torch.sparse.check_sparse_tensor_invariants.disable()
        optimizers.append(torch.optim.Adagrad(sparse, lr=defaults.sparse_lr))
    loader = train_data.loader(batch_size, shuffle=True, seed=0, drop_last=True)
    step = 0
    start = time.perf_counter()
    while step < steps:
        for dense_x, sparse_x, labels in loader:
            loss = F.binary_cross_entropy_with_logits(model(dense_x, sparse_x), labels)
            for optimizer in optimizers:
                optimizer.zero_grad(set_to_none=True)
            loss.backward()
            for optimizer in optimizers:
                optimizer.step()
            step += 1
            if step == steps:
                break
    wall = time.perf_counter() - start
    return Run(throughput=steps * batch_size / wall, wall=wall, model=model)


def same_weights(a: nn.Module, b: nn.Module) -> bool:
    sa, sb = a.state_dict(), b.state_dict()
    return sa.keys() == sb.keys() and all(torch.equal(sa[k], sb[k]) for k in sa)


def interleaved(make_model, splits, batch_size, steps, repeats, clock):
    """`repeats` rounds of (trainer, minimal, minimal again), the order rotated each round."""
    train_data, valid_data, _ = splits
    variants = {
        "trainer": lambda: run_trainer(
            make_model, train_data, valid_data, batch_size, steps, clock
        ),
        "minimal": lambda: minimal_loop(make_model, train_data, batch_size, steps),
        "control": lambda: minimal_loop(make_model, train_data, batch_size, steps),
    }
    variants["trainer"]()  # warm-up: lazy initialisation (allocator, kernels, first calls)
    variants["minimal"]()
    runs: dict[str, list[Run]] = {name: [] for name in variants}
    identical = True
    order = list(variants)
    for i in range(repeats):
        for name in order[i % 3 :] + order[: i % 3]:
            runs[name].append(variants[name]())
        identical = identical and same_weights(runs["trainer"][-1].model, runs["minimal"][-1].model)
        for run_list in runs.values():
            run_list[-1].model = None  # free it
    return runs, identical


def ratios(runs: dict[str, list[Run]], a: str, b: str) -> list[float]:
    return [x.throughput / y.throughput for x, y in zip(runs[a], runs[b], strict=True)]


def bench_trainer_vs_minimal(data, splits, names, args, clock: EvalClock) -> None:
    valid_data = splits[1]
    bs, steps = args.batch_size, args.steps
    print(
        f"\n## 1. Trainer vs minimal loop ({steps} steps × batch {bs}, {args.repeats} rounds of "
        f"trainer / minimal / minimal again, order rotated; {torch.get_num_threads()} torch "
        "threads)\n"
    )
    print(
        "| preset | trainer (ex/s) | minimal (ex/s) | trainer / minimal (median, range) "
        "| overhead | A/A control: minimal / minimal again | `train()` wall incl. evals (s) "
        "| of which evals (s) | minimal loop wall (s) | same weights |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|")
    overheads, noise, step_ms, evals = {}, {}, {}, set()
    for name in names:
        arch = preset(name, data.schema)
        runs, identical = interleaved(
            lambda a=arch: build_model(a, seed=0), splits, bs, steps, args.repeats, clock
        )
        trainer_ratio, control_ratio = (
            ratios(runs, "trainer", "minimal"),
            ratios(runs, "control", "minimal"),
        )
        overheads[name] = 1 / statistics.median(trainer_ratio) - 1
        noise[name] = abs(1 / statistics.median(control_ratio) - 1)
        step_ms[name] = statistics.median(
            [r.wall / steps * 1e3 for r in runs["minimal"] + runs["control"]]
        )
        evals |= {t.intermediate_evals for t in runs["trainer"]}
        print(
            f"| {name} | {fmt([t.throughput for t in runs['trainer']])} "
            f"| {fmt([m.throughput for m in runs['minimal']])} "
            f"| {fmt_ratio(trainer_ratio)} | {overheads[name]:+.1%} "
            f"| {fmt_ratio(control_ratio)} "
            f"| {fmt([t.wall for t in runs['trainer']], 2)} "
            f"| {fmt([t.eval_wall for t in runs['trainer']], 2)} "
            f"| {fmt([m.wall for m in runs['minimal']], 2)} "
            f"| {'yes' if identical else 'no'} |",
            flush=True,
        )
    print(
        f"\nIntermediate evaluations per trainer run: {sorted(evals)} (evals=2), plus the final "
        f"one on the {len(valid_data):,} validation rows; both are excluded from the trainer's "
        "throughput and included in its wall time. Overhead = minimal / trainer − 1 in time per "
        "example (median over rounds). The A/A control runs the minimal loop twice per round: "
        "its ratio would be 1.000 on a quiet machine, so its distance from 1 is the noise floor "
        'of these wall-time ratios. "same weights": in every round the trainer\'s and the '
        "minimal loop's models end bit-identical (both did the same computation)."
    )

    fixed_steps = args.fixed_steps
    num_dense = data.schema.num_dense
    runs, _ = interleaved(
        lambda: DenseOnly(num_dense), splits, bs, fixed_steps, args.repeats, clock
    )
    us = {name: [r.wall / fixed_steps * 1e6 for r in rs] for name, rs in runs.items()}
    fixed = [t - m for t, m in zip(us["trainer"], us["minimal"], strict=True)]
    control = [c - m for c, m in zip(us["control"], us["minimal"], strict=True)]
    fixed_us, control_us = statistics.median(fixed), statistics.median(control)
    print(
        f"\nFixed cost per step, on a trivial model (one linear layer over the {num_dense} "
        f"dense features; {fixed_steps} steps × batch {bs}, {args.repeats} rotated rounds; "
        "loader, autograd and Adam included in both):\n"
    )
    print("| loop | µs / step | minus minimal (µs / step, median of rounds) |")
    print("|---|---|---|")
    print(
        f"| trainer | {fmt(us['trainer'], 1)} "
        f"| {fixed_us:+.1f} ({min(fixed):+.1f}–{max(fixed):+.1f}) |"
    )
    print(f"| minimal | {fmt(us['minimal'], 1)} | |")
    print(
        f"| minimal again (A/A) | {fmt(us['control'], 1)} "
        f"| {control_us:+.1f} ({min(control):+.1f}–{max(control):+.1f}) |"
    )
    print(
        f"\nThe trainer's fixed cost ({max(fixed_us, 0.0):.1f} µs per step) as a share of each "
        "preset's step (minimal loop, median of the runs above):\n"
    )
    print("| preset | step (ms) | fixed cost / step | end-to-end overhead (noise floor) |")
    print("|---|---|---|---|")
    shares = {}
    for name in names:
        shares[name] = max(fixed_us, 0.0) / (step_ms[name] * 1e3)
        print(
            f"| {name} | {step_ms[name]:.2f} | {shares[name]:.2%} "
            f"| {overheads[name]:+.1%} (±{noise[name]:.1%}) |"
        )
    under = [n for n in names if overheads[n] < TARGET]
    over = [n for n in names if overheads[n] >= TARGET]
    beyond = [n for n in over if overheads[n] - noise[n] >= TARGET]
    verdict = "met" if max(shares.values()) < TARGET else "NOT met"
    summary = (
        f"\nTarget trainer overhead < {TARGET:.0%}: {verdict} by the fixed-cost measurement "
        f"(largest share {max(shares.values()):.2%} of a step). End to end (wall time, "
        f"median of rounds): {len(under)} of {len(names)} presets under {TARGET:.0%}"
    )
    if over:
        summary += f"; {', '.join(f'{n} {overheads[n]:+.1%}' for n in over)} above, " + (
            f"{', '.join(beyond)} by more than its A/A noise floor"
            if beyond
            else "each within its A/A noise floor"
        )
    print(summary + ".")


def time_loader(train_data: TabularData, batch_size: int, shuffle: bool, max_batches: int):
    loader = train_data.loader(batch_size, shuffle=shuffle, seed=0, drop_last=True)
    n = 0
    start = time.perf_counter()
    for _ in loader:
        n += 1
        if n == max_batches:
            break
    return (time.perf_counter() - start) / n


def bench_loader(data, splits, names, args) -> None:
    train_data = splits[0]
    sizes = (512, 4096)
    print(
        f"\n## 2. Loader alone ({len(train_data):,} training rows, {args.loader_repeats} repeats)\n"
    )
    loader_ms: dict[tuple[int, bool], list[float]] = {}
    step_ms: dict[tuple[str, int], list[float]] = {}
    archs = {name: preset(name, data.schema) for name in names}
    step_counts = {512: args.step_steps_small, 4096: args.step_steps_large}
    for name in names:  # warm-up
        minimal_loop(functools.partial(build_model, archs[name], seed=0), train_data, 512, 3)
    for bs in sizes:
        for shuffle in (True, False):
            time_loader(train_data, bs, shuffle, 20)
    for _ in range(args.loader_repeats):
        for bs in sizes:
            for shuffle in (True, False):
                batches = len(train_data) // bs  # one epoch
                loader_ms.setdefault((bs, shuffle), []).append(
                    time_loader(train_data, bs, shuffle, batches) * 1e3
                )
            for name in names:
                steps = step_counts[bs]
                make = functools.partial(build_model, archs[name], seed=0)
                run = minimal_loop(make, train_data, bs, steps)
                step_ms.setdefault((name, bs), []).append(run.wall / steps * 1e3)
    print("| batch | shuffled | ms / batch | batches/s | examples/s |")
    print("|---|---|---|---|---|")
    for (bs, shuffle), values in loader_ms.items():
        ms = statistics.median(values)
        print(
            f"| {bs} | {'yes' if shuffle else 'no'} | {fmt(values, 3)} | {1e3 / ms:,.0f} "
            f"| {bs * 1e3 / ms:,.0f} |"
        )
    print(
        "\nTraining step (minimal loop, shuffled loading included; "
        f"{step_counts[512]} steps at 512, {step_counts[4096]} at 4096) next to the shuffled "
        "loader's time per batch:\n"
    )
    print("| preset | batch | step (ms) | loader (ms / batch) | loader / step |")
    print("|---|---|---|---|---|")
    worst = 0.0
    for name in names:
        for bs in sizes:
            step = statistics.median(step_ms[(name, bs)])
            load = statistics.median(loader_ms[(bs, True)])
            worst = max(worst, load / step)
            print(
                f"| {name} | {bs} | {fmt(step_ms[(name, bs)], 1)} | {load:.3f} "
                f"| {load / step:.1%} |"
            )
    print(f"\nLargest loader share of a step: {worst:.1%}.")


DEEPCTR_RUNNER = textwrap.dedent(
    '''
    """Train deepctr-torch DeepFM on the arrays in argv[1]; write timings and predictions."""
    import json, sys, time, types

    # deepctr_torch/__init__ starts a thread that asks PyPI for a newer version with
    # `requests` (which the wheel does not declare). Stub it: no network from a benchmark.
    stub = types.ModuleType("requests")
    def _offline(*args, **kwargs):
        raise RuntimeError("offline")
    stub.get = _offline
    sys.modules.setdefault("requests", stub)

    import numpy as np
    import torch
    import deepctr_torch
    from deepctr_torch.inputs import DenseFeat, SparseFeat
    from deepctr_torch.models import DeepFM

    arrays, out, spec = sys.argv[1], sys.argv[2], json.loads(sys.argv[3])
    torch.set_num_threads(spec["threads"])
    torch.manual_seed(0)
    d = np.load(arrays)
    columns = [
        SparseFeat(f"c{k}", vocabulary_size=card, embedding_dim=spec["dim"])
        for k, card in enumerate(spec["cardinalities"])
    ] + [DenseFeat(f"d{j}", 1) for j in range(d["train_dense"].shape[1])]

    def inputs(prefix):
        x = {f"c{k}": d[prefix + "_cat"][:, k] for k in range(d[prefix + "_cat"].shape[1])}
        x |= {f"d{j}": d[prefix + "_dense"][:, j] for j in range(d[prefix + "_dense"].shape[1])}
        return x

    model = DeepFM(
        columns, columns, dnn_hidden_units=tuple(spec["hidden"]), l2_reg_linear=0.0,
        l2_reg_embedding=0.0, seed=0, task="binary", device="cpu",
    )
    model.compile("adam", "binary_crossentropy")
    x_train, y_train = inputs("train"), d["train_labels"]
    start = time.perf_counter()
    model.fit(x_train, y_train, batch_size=spec["batch_size"], epochs=spec["epochs"], verbose=0,
              shuffle=True)
    fit_seconds = time.perf_counter() - start
    start = time.perf_counter()
    pred = model.predict(inputs("valid"), batch_size=8192).reshape(-1)
    predict_seconds = time.perf_counter() - start
    np.save(out + ".npy", pred)
    with open(out, "w") as f:
        json.dump({
            "fit_seconds": fit_seconds, "predict_seconds": predict_seconds,
            "examples": int(len(y_train) * spec["epochs"]),
            "steps": -(-len(y_train) // spec["batch_size"]) * spec["epochs"],
            "version": deepctr_torch.__version__, "torch": torch.__version__,
        }, f)
    '''
)


def run_deepctr(python: str, workdir: Path, spec: dict, index: int) -> dict:
    script = workdir / "deepctr_runner.py"
    out = workdir / f"deepctr_{index}.json"
    proc = subprocess.run(
        [python, str(script), str(workdir / "data.npz"), str(out), json.dumps(spec)],
        capture_output=True,
        text=True,
        cwd=workdir,
    )
    if proc.returncode != 0:
        tail = " / ".join((proc.stderr or proc.stdout).strip().splitlines()[-3:])
        raise RuntimeError(f"{python} exited with {proc.returncode}: {tail}")
    result = json.loads(out.read_text())
    result["pred"] = np.load(str(out) + ".npy")
    return result


def bench_reference(data, splits, args) -> None:
    train_data, valid_data, _ = splits
    bs, epochs = args.batch_size, args.epochs
    arch = preset("deepfm", data.schema)
    hidden = next(b.params["widths"] for b in arch.blocks if b.name == "deep")
    print(
        f"\n## 3. Outside reference: deepctr-torch DeepFM `fit` vs ranknas `deepfm` "
        f"({len(train_data):,} training rows, batch {bs}, {epochs} epoch(s), "
        f"{args.ref_repeats} interleaved repeats)\n"
    )
    skip = None
    python = args.deepctr_python
    if args.skip_deepctr:
        skip = "--skip-deepctr given"
    elif not Path(python).exists():
        skip = (
            f"{python} not found (create it: python3 -m venv /tmp/deepctr-venv && "
            "/tmp/deepctr-venv/bin/pip install torch==2.13.0 deepctr-torch)"
        )
    steps_per_epoch = len(train_data) // bs
    spec = {
        "threads": torch.get_num_threads(),
        "dim": arch.embedding.dim,
        "cardinalities": [f.cardinality for f in data.schema.categorical],
        "hidden": list(hidden),
        "batch_size": bs,
        "epochs": epochs,
    }
    ranknas_runs, deepctr_runs = [], []
    with tempfile.TemporaryDirectory(prefix="bench_trainer_") as tmp:
        workdir = Path(tmp)
        if skip is None:
            (workdir / "deepctr_runner.py").write_text(DEEPCTR_RUNNER)
            np.savez(
                workdir / "data.npz",
                train_dense=train_data.dense,
                train_cat=train_data.categorical,
                train_labels=train_data.labels,
                valid_dense=valid_data.dense,
                valid_cat=valid_data.categorical,
            )
        config = TrainConfig(
            batch_size=bs, max_steps=steps_per_epoch * epochs, evals=1, device="cpu", seed=0
        )
        for i in range(args.ref_repeats):
            if skip is None:
                try:
                    deepctr_runs.append(run_deepctr(python, workdir, spec, i))
                except Exception as exc:  # report why and go on without the row
                    skip, deepctr_runs = f"{type(exc).__name__}: {exc}", []
            wall = time.perf_counter()
            result = train(build_model(arch, seed=0), train_data, valid_data, config=config)
            wall = time.perf_counter() - wall
            if result.status != "complete":
                raise RuntimeError(f"ranknas deepfm {result.status}: {result.failure_reason}")
            ranknas_runs.append((result, wall))
    bayes = bayes_metrics(valid_data)
    truth = ranking_metrics(valid_data.true_prob, valid_data.labels)
    print(
        "| implementation | optimizers | steps | examples/s | train wall (s) | val logloss "
        "| val NE | val AUC |"
    )
    print("|---|---|---|---|---|---|---|---|")
    last = ranknas_runs[-1][0]
    print(
        f"| ranknas `deepfm`, `train()` | Adam 1e-3 dense, sparse Adagrad 0.05 tables "
        f"| {last.steps} | {fmt([r.throughput for r, _ in ranknas_runs])} "
        f"| {fmt([r.train_seconds for r, _ in ranknas_runs], 2)} "
        f"| {last.validation['logloss']:.4f} | {last.validation['ne']:.4f} "
        f"| {last.validation['auc']:.4f} |"
    )
    if deepctr_runs:
        metrics = ranking_metrics(deepctr_runs[-1]["pred"], valid_data.labels)
        print(
            f"| deepctr-torch {deepctr_runs[-1]['version']} `DeepFM.fit` | Adam 1e-3 all "
            f"(dense embedding grads) | {deepctr_runs[-1]['steps']} "
            f"| {fmt([r['examples'] / r['fit_seconds'] for r in deepctr_runs])} "
            f"| {fmt([r['fit_seconds'] for r in deepctr_runs], 2)} "
            f"| {metrics['logloss']:.4f} | {metrics['ne']:.4f} | {metrics['auc']:.4f} |"
        )
    else:
        print(f"| deepctr-torch `DeepFM.fit` | skipped: {skip} | | | | | | |")
    print(
        f"| true click probability (Bayes floor) | | | | | {bayes.logloss:.4f} | {bayes.ne:.4f} "
        f"| {truth['auc']:.4f} |"
    )
    if deepctr_runs:
        ratio = statistics.median(
            [
                r.throughput / (d["examples"] / d["fit_seconds"])
                for (r, _), d in zip(ranknas_runs, deepctr_runs, strict=True)
            ]
        )
        print(
            f"\nranknas / deepctr-torch examples/s: {ratio:.2f}× (median of interleaved pairs). "
            f"Same {len(train_data):,} rows, features, embedding dim {arch.embedding.dim}, MLP "
            f"{tuple(hidden)}, batch {bs}, {epochs} epoch(s), {spec['threads']} torch threads. "
            "deepctr-torch as its README trains it (`compile('adam', 'binary_crossentropy')`), "
            "with its L2 terms set to 0 as ranknas has none; `fit` keeps the last partial "
            "batch, ranknas drops it. deepctr time = `fit` (no validation data, verbose=0); "
            "ranknas = `TrainResult.train_seconds`. Metrics of the last repeat on the "
            f"{len(valid_data):,} validation rows, both scored by `trainers.metrics`."
        )


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--quick", action="store_true", help="shorter runs (~10 min, 2 cores)")
    parser.add_argument("--rows", type=int, help="synthetic rows (split 80/10/10)")
    parser.add_argument("--batch-size", type=int, default=512)
    parser.add_argument("--steps", type=int, help="steps per run in part 1")
    parser.add_argument("--repeats", type=int, help="interleaved pairs in part 1")
    parser.add_argument("--fixed-steps", type=int, help="steps per run on the trivial model")
    parser.add_argument("--presets", default=",".join(PRESET_NAMES))
    parser.add_argument("--loader-repeats", type=int)
    parser.add_argument("--step-steps-small", type=int, help="part 2 steps at batch 512")
    parser.add_argument("--step-steps-large", type=int, help="part 2 steps at batch 4096")
    parser.add_argument("--epochs", type=int, help="part 3 epochs")
    parser.add_argument("--ref-repeats", type=int, help="part 3 interleaved repeats")
    parser.add_argument("--deepctr-python", default=DEEPCTR_PYTHON)
    parser.add_argument("--skip-deepctr", action="store_true")
    parser.add_argument("--threads", type=int, default=1, help="torch threads; 0 = default")
    parser.add_argument("--parts", default="1,2,3", help="which parts to run, e.g. 1,3")
    parser.add_argument("--progress", choices=["off", "lines", "terminal"], default="off",
                        help="the trainer's progress display during its runs: off (a library "
                        "call), lines (plain lines, as in a log), terminal (a tqdm bar, drawn "
                        "into memory)")  # fmt: skip
    args = parser.parse_args()
    for key, value in (QUICK if args.quick else FULL).items():
        if getattr(args, key) is None:
            setattr(args, key, value)
    names = [n for n in args.presets.split(",") if n]
    parts = set(args.parts.split(","))
    logging.getLogger("torch.fx._symbolic_trace").setLevel(logging.ERROR)

    if args.threads > 0:
        torch.set_num_threads(args.threads)
    if args.progress != "off":
        progress.configure(stream=io.StringIO(), terminal=args.progress == "terminal")
    started, load_before = time.perf_counter(), os.getloadavg()
    data = generate_synthetic(SyntheticConfig(rows=args.rows))
    splits = data.split()
    print("# Trainer benchmark\n")
    print(f"Command: `{' '.join([Path(sys.executable).name, *sys.argv])}`\n")
    print(
        f"Machine: {platform.processor() or platform.machine()}, {os.cpu_count()} CPUs, "
        f"{torch.get_num_threads()} torch threads, torch {torch.__version__}, CPU only. "
        f"Load average before: {load_before[0]:.2f} / {load_before[1]:.2f} / "
        f"{load_before[2]:.2f} (1 / 5 / 15 min)."
    )
    print(
        f"Data: synthetic, {args.rows:,} rows ({data.schema.num_dense} dense, "
        f"{data.schema.num_sparse} categorical features), split "
        f"{' / '.join(f'{len(s):,}' for s in splits)}."
    )
    clock = EvalClock()
    trainer_module.evaluate = clock
    try:
        if "1" in parts:
            bench_trainer_vs_minimal(data, splits, names, args, clock)
        if "2" in parts:
            bench_loader(data, splits, names, args)
        if "3" in parts:
            bench_reference(data, splits, args)
    finally:
        trainer_module.evaluate = clock._inner
    load_after = os.getloadavg()
    print(
        f"\nWall time {time.perf_counter() - started:.0f} s. Load average after: "
        f"{load_after[0]:.2f} / {load_after[1]:.2f} / {load_after[2]:.2f}."
    )


if __name__ == "__main__":
    main()
