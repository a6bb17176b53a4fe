"""Search studies: platform overhead per trial, ask latency at 1,000 trials, searchers vs random.

    .venv/bin/python bench/bench_study.py --quick      # about 20 min on 2 shared CPU cores
    .venv/bin/python bench/bench_study.py              # bigger settings (see --help)

Targets (issue: Search studies):

1. Platform overhead per trial (everything but the training itself) under 2% of a 30 s
   trial. Real trials run through `nas.runner.run_study` on a tiny synthetic data set with a
   real SQLite storage in a temp dir, without MLflow and logging to a real `mlflow server`
   (`mlflow_server.up(ServerConfig(port=0))`) through `StudyLogger`; for comparison also
   with SQLite's default rollback journal + synchronous=FULL (what ranknas did before it
   opened SQLite in WAL mode) and on tmpfs (no fsync at all). The columns are interleaved
   round by round. The runner's parts are timed by wrapping them in this process only
   (exclusive times: a part nested in another is subtracted from it), and Optuna's write
   transactions are counted. Overhead = trial wall time - training time, where the training
   time is `trainers.trainer.train` minus the Optuna `report` and `should_prune` calls it
   makes (those are platform work). A trial's wall time runs from one call of the runner's
   ask step to the next, so everything the loop does is in it.
2. `ask` latency with 1,000 finished trials in storage, per sampling searcher: under 100 ms.
   The history is made without training: each searcher's own sampler asks, a cheap synthetic
   objective (a function of the decoded architecture's FLOPs plus noise) is told, in memory;
   the trials are then written to a temp SQLite study with the user attrs and intermediate
   values a real trial has, and the study is opened again as a worker would. Timed: the
   runner's ask step (`nas.runner._next_trial`: stale-trial check, lock, budget count,
   `study.ask`), the sampler's share of it, and the same with the rollback journal. Ax fits
   a model at every ask, so it is measured at growing sizes (its history is random): the
   first ask of a fresh sampler (which builds its client from every finished trial) and the
   asks after it, stopping after a size whose ask passes --ax-limit-s and not trying a size
   whose extrapolated ask passes 3x that (the extrapolation is printed instead).
3. Each searcher vs random on the synthetic data at an equal trial budget: best validation
   NE after N trials per seed, the median over seeds, and the difference to random.

torch runs with --threads (1 by default, see --help). Prints Markdown (progress lines of
part 3 as HTML comments). Timings are medians; the machine and its load are printed.
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import logging
import math
import os
import platform
import shutil
import sqlite3
import statistics
import sys
import tempfile
import time
import warnings
from collections import defaultdict
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any
from unittest import mock

import numpy as np
import optuna
import torch
from optuna.storages import InMemoryStorage, RDBStorage
from optuna.trial import FrozenTrial, Trial, TrialState
from sqlalchemy import event
from sqlalchemy.engine import Engine

import nas.protocol as protocol
import nas.runner as runner
import nas.storage
from nas.config import StudyConfig, parse_config
from nas.searchers.base import distributions
from nas.storage import open_storage
from search_space.architecture import analyze, digest
from search_space.schema import synthetic_schema
from search_space.spaces import SearchSpace, make_space

SEARCHERS = ("random", "evolution", "tpe", "nsga2", "ax")
TRIAL_SECONDS = 30.0  # the trial length the overhead target is stated for
AX_SKIP_FACTOR = 3.0  # an Ax size predicted over this x --ax-limit-s is not tried at all
QUICK = {
    "overhead_trials": 20,
    "history": 1000,
    "asks": 20,
    "ax_sizes": "50,100,200,1000",
    "ax_asks": 3,
    "rows": 30_000,
    "examples": 20_000,
    "trials": 20,
    "seeds": 5,
    "num_blocks": 3,
}
FULL = QUICK | {
    "overhead_trials": 40,
    "ax_asks": 5,
    "rows": 100_000,
    "examples": 100_000,
    "trials": 40,
    "seeds": 5,
    "num_blocks": 5,
}


# --------------------------------------------------------------------------- timing


class Profiler:
    """Exclusive wall time of wrapped callables, and Optuna storage write transactions,
    attributed to the trial being run."""

    def __init__(self) -> None:
        self.trial = -1  # -1: study setup, before the first ask
        self.entries: list[float] = []  # when each ask step began
        self.parts: dict[int, dict[str, float]] = defaultdict(lambda: defaultdict(float))
        self.writes: dict[int, int] = defaultdict(int)
        self.setup_ms = math.nan  # from `run_study` to its first ask step
        self._stack: list[float] = []

    def wrap(self, name: str, fn: Callable, *, starts_trial: bool = False) -> Callable:
        @functools.wraps(fn)
        def timed(*args: Any, **kwargs: Any) -> Any:
            start = time.perf_counter()
            if starts_trial:
                self.trial += 1
                self.entries.append(start)
            self._stack.append(0.0)
            try:
                return fn(*args, **kwargs)
            finally:
                elapsed = time.perf_counter() - start
                nested = self._stack.pop()
                self.parts[self.trial][name] += elapsed - nested
                if self._stack:
                    self._stack[-1] += elapsed

        return timed

    @contextlib.contextmanager
    def counting_writes(self) -> Iterator[None]:
        """Count SQLAlchemy transactions that wrote (each one SQLite commit, an fsync)."""

        def before(conn, cursor, statement, *args: Any) -> None:
            if statement.lstrip()[:6].upper() in ("INSERT", "UPDATE", "DELETE"):
                conn.info["ranknas_bench_wrote"] = True

        def commit(conn) -> None:
            if conn.info.pop("ranknas_bench_wrote", False):
                self.writes[self.trial] += 1

        event.listen(Engine, "before_cursor_execute", before)
        event.listen(Engine, "commit", commit)
        try:
            yield
        finally:
            event.remove(Engine, "before_cursor_execute", before)
            event.remove(Engine, "commit", commit)


PARTS = {  # label of each wrapped part, in the order a trial meets them
    "next_trial": "ask: stale-trial check, lock, budget count",
    "ask": "ask: `study.ask` (sampler + storage)",
    "heartbeat": "heartbeat thread start (+ first beat)",
    "decode": "decode parameters -> Architecture",
    "analyze": "analyze + digest (validate, FLOPs, params)",
    "user_attrs": "trial user attrs (`set_user_attr`, `set_user_attrs`)",
    "build": "build model",
    "report": "`trial.report` + `should_prune` (inside training)",
    "save": "save weights (safetensors)",
    "tell": "`study.tell`",
    "run_trial": "rest of `run_trial` (mkdir, JSON files, state_dict copy)",
    "mlflow": "MLflow `log_trial` (outbox insert; the courier thread delivers)",
    "progress": "progress line",
}


@contextlib.contextmanager
def instrumented(prof: Profiler) -> Iterator[None]:
    """Wrap the runner's parts for the duration of one `run_study`."""

    def make_space_timed(*args: Any, **kwargs: Any) -> SearchSpace:
        space = make_space(*args, **kwargs)
        space.decode = prof.wrap("decode", space.decode)  # the sampler shares this object
        return space

    targets = [
        (runner, "_next_trial", prof.wrap("next_trial", runner._next_trial, starts_trial=True)),
        (optuna.Study, "ask", prof.wrap("ask", optuna.Study.ask)),
        (optuna.Study, "tell", prof.wrap("tell", optuna.Study.tell)),
        (Trial, "set_user_attr", prof.wrap("user_attrs", Trial.set_user_attr)),
        # an older checkout, run side by side, lacks it
        *(
            [(runner, "set_user_attrs", prof.wrap("user_attrs", runner.set_user_attrs))]
            if hasattr(runner, "set_user_attrs")
            else []
        ),
        (Trial, "report", prof.wrap("report", Trial.report)),
        (Trial, "should_prune", prof.wrap("report", Trial.should_prune)),
        (runner, "_heartbeat", prof.wrap("heartbeat", runner._heartbeat)),
        (runner, "make_space", make_space_timed),
        (protocol, "analyze", prof.wrap("analyze", protocol.analyze)),
        (runner, "digest", prof.wrap("analyze", runner.digest)),
        (protocol, "build_model", prof.wrap("build", protocol.build_model)),
        (protocol, "train", prof.wrap("train", protocol.train)),
        (protocol, "write_weights", prof.wrap("save", protocol.write_weights)),
        (runner, "run_trial", prof.wrap("run_trial", runner.run_trial)),
        (runner, "_progress_line", prof.wrap("progress", runner._progress_line)),
    ]
    with contextlib.ExitStack() as stack:
        for owner, name, replacement in targets:
            stack.enter_context(mock.patch.object(owner, name, replacement))
        stack.enter_context(prof.counting_writes())
        yield


def pragma_storage(url: str, heartbeat_seconds: int | None, pragmas: list[str]) -> RDBStorage:
    """`open_storage` with SQLite pragmas run on every new connection."""
    storage = open_storage(url, heartbeat_seconds)

    def on_connect(dbapi_connection, record) -> None:
        cursor = dbapi_connection.cursor()
        for pragma in pragmas:
            cursor.execute(f"PRAGMA {pragma}")
        cursor.close()

    event.listen(storage.engine, "connect", on_connect)
    storage.engine.dispose()  # pooled connections were opened without the pragmas
    return storage


def rollback_storage(url: str, heartbeat_seconds: int | None = None) -> RDBStorage:
    """Before (not what ranknas does now): SQLite's default rollback journal with
    synchronous=FULL, an fsync'd journal per commit. An existing file is switched back from
    WAL first, on a connection of its own."""
    path = Path(url.removeprefix("sqlite:///"))
    if path.exists():
        with contextlib.closing(sqlite3.connect(path)) as connection:
            connection.execute("PRAGMA journal_mode=DELETE")
    with mock.patch.object(nas.storage, "_write_ahead_log", lambda engine: None):
        return open_storage(url, heartbeat_seconds)


def bulk_storage(url: str) -> RDBStorage:
    """For writing the synthetic history only: no fsync (per connection, not persistent)."""
    return pragma_storage(url, None, ["synchronous=OFF"])


def med(values: list[float]) -> float:
    return statistics.median(values) if values else math.nan


def p90(values: list[float]) -> float:
    if len(values) < 2:
        return values[0] if values else math.nan
    return statistics.quantiles(values, n=10, method="inclusive")[8]


# --------------------------------------------------------------------------- 1. overhead

VARIANTS = {  # name: (column title, storage, MLflow)
    "disk": ("SQLite on disk (WAL), no MLflow (as shipped)", "disk", False),
    "mlflow": ("SQLite on disk (WAL) + MLflow server (as shipped)", "disk", True),
    "rollback": ("before: SQLite rollback journal, no MLflow", "rollback", False),
    "tmpfs": ("reference: SQLite on tmpfs (no fsync), no MLflow", "tmpfs", False),
}


def overhead_config(
    tmp: Path, storage_dir: Path, name: str, trials: int, tracking_uri: str | None
) -> StudyConfig:
    """Real trials with the smallest sensible training: the part we subtract."""
    return parse_config(
        {
            "name": name,
            "data": {"source": "synthetic", "rows": 4000, "seed": 0},
            "search_space": {"type": "dag", "num_blocks": 3},
            "searcher": {"type": "tpe"},
            "budget": {"trials": trials, "examples_per_trial": 8192, "max_failures": 1000},
            "training": {"batch_size": 512, "evals": 4},
            "storage": f"sqlite:///{storage_dir / 'studies.db'}",
            "output_dir": str(tmp / name),
            "mlflow": {"tracking_uri": tracking_uri},
        }
    )


def profiled_study(
    config: StudyConfig, logger: Any = None, rollback: bool = False
) -> tuple[Profiler, float]:
    prof = Profiler()
    if logger is not None:
        logger.log_trial = prof.wrap("mlflow", logger.log_trial)
        logger.start_study = prof.wrap("mlflow", logger.start_study)
    start = time.perf_counter()
    with contextlib.ExitStack() as stack:
        stack.enter_context(instrumented(prof))
        if rollback:
            stack.enter_context(mock.patch.object(runner, "open_storage", rollback_storage))
        runner.run_study(config, progress=lambda line: None, logger=logger)
    end = time.perf_counter()
    prof.entries.append(end)  # the last entry is the ask step that found the budget spent
    prof.setup_ms = (prof.entries[0] - start) * 1e3
    return prof, end - start


def trial_rows(prof: Profiler) -> list[dict[str, float]]:
    """Per trial: each part's ms, the training ms, the wall ms and the rest."""
    rows = []
    for i in range(len(prof.entries) - 2):  # the last ask step returned None
        parts = dict(prof.parts[i])
        wall = (prof.entries[i + 1] - prof.entries[i]) * 1e3
        row = {k: v * 1e3 for k, v in parts.items()}
        row["wall"] = wall
        row["train"] = row.pop("train", 0.0)
        row["unaccounted"] = wall - sum(v * 1e3 for v in parts.values())
        row["overhead"] = wall - row["train"]
        row["writes"] = prof.writes[i]
        rows.append(row)
    return rows


def bench_overhead(args: argparse.Namespace) -> str:
    from mlflow_server import ServerConfig, StudyLogger, down, up

    variants = list(VARIANTS)
    shm = Path("/dev/shm")
    if not (shm.is_dir() and os.access(shm, os.W_OK)):
        variants.remove("tmpfs")
    rows: dict[str, list[dict[str, float]]] = defaultdict(list)
    setup: dict[str, list[float]] = defaultdict(list)
    per_round = max(2, args.overhead_trials // args.rounds)
    with contextlib.ExitStack() as stack:
        tmp = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="ranknas-bench-")))
        fast = tmp
        if "tmpfs" in variants:
            fast = Path(stack.enter_context(tempfile.TemporaryDirectory(dir=shm)))
        # imports and first-call costs
        profiled_study(overhead_config(tmp, tmp, "warmup", 2, None))
        server_config = ServerConfig(data_dir=tmp / "mlflow", port=0)
        stack.callback(down, server_config)  # first: an interrupt inside `up` stops it too
        started = time.perf_counter()
        server = up(server_config)
        server_s = time.perf_counter() - started
        flush_s, pending = [], 0
        for r in range(args.rounds):  # the variants interleaved, so load changes hit all alike
            for variant in variants:
                _, storage, logged = VARIANTS[variant]
                storage_dir = {"tmpfs": fast, "rollback": tmp / "rollback"}.get(storage, tmp)
                uri = server.uri if logged else None
                config = overhead_config(tmp, storage_dir, f"{variant}-{r}", per_round, uri)
                logger = StudyLogger(uri, config.study_dir / "mlflow-outbox") if uri else None
                prof, _ = profiled_study(config, logger, rollback=storage == "rollback")
                rows[variant] += trial_rows(prof)
                setup[variant].append(prof.setup_ms)
                if logger is not None:
                    started = time.perf_counter()
                    pending += logger.flush(timeout_s=60)
                    flush_s.append(time.perf_counter() - started)

    def cells(key: str, fn: Callable = med, fmt: str = "{:.1f}") -> str:
        return " | ".join(fmt.format(fn([r.get(key, 0.0) for r in rows[v]])) for v in variants)

    out = ["## 1. Platform overhead per trial\n"]
    out.append(
        f"{args.rounds} rounds x {per_round} real trials per column (the columns interleaved "
        "round by round) through `nas.runner.run_study`: TPE over the DAG space (3 blocks, "
        "default ops/widths/dims), synthetic data (4,000 rows), 8,192 examples per trial "
        "(16 steps of 512, 4 evals; failures allowed: some tiny models end above NE 1), "
        "default heartbeat (10 s), weights and JSON files in a temp dir on disk. Median ms "
        "per trial of each part (exclusive times; the median of a sum is not the sum of the "
        "medians). A warm-up study of 2 trials ran first.\n"
    )
    out.append("| part | " + " | ".join(VARIANTS[v][0] for v in variants) + " |")
    out.append("|---" * (len(variants) + 1) + "|")
    for key, label in PARTS.items():
        if key == "mlflow" and "mlflow" not in variants:
            continue
        out.append(f"| {label} | {cells(key, fmt='{:.2f}')} |")
    out.append(f"| unaccounted (loop glue) | {cells('unaccounted', fmt='{:.2f}')} |")
    out.append(f"| Optuna storage write transactions per trial | {cells('writes', fmt='{:.0f}')} |")
    out.append(f"| *training: `train` minus report/should_prune (excluded)* | {cells('train')} |")
    out.append(f"| trial wall time | {cells('wall')} |")
    out.append(f"| **overhead = wall - training, median** | {cells('overhead')} |")
    out.append(f"| overhead, p90 | {cells('overhead', p90)} |")
    share = " | ".join(
        f"**{med([r['overhead'] for r in rows[v]]) / (TRIAL_SECONDS * 1e3):.2%}**" for v in variants
    )
    out.append(f"| **median overhead / {TRIAL_SECONDS:.0f} s trial** | {share} |")
    out.append("")
    out.append("One-time costs (not per trial):\n")
    out.append("| what | ms |")
    out.append("|---|---|")
    for v in variants:
        out.append(f"| study setup (data, space, storage, open_study), {v} | {med(setup[v]):.0f} |")
    out.append(f"| `mlflow server` start (`up`, port 0) | {server_s * 1e3:.0f} |")
    out.append(
        f"| `StudyLogger.flush` at the end of a study ({pending} left pending) | "
        f"{med(flush_s) * 1e3:.0f} |"
    )
    out.append("")
    target = 0.02 * TRIAL_SECONDS * 1e3
    shipped = {v: med([r["overhead"] for r in rows[v]]) for v in ("disk", "mlflow")}
    verdicts = [
        f"{label}: {'met' if shipped[v] < target else 'NOT met'} ({shipped[v]:.0f} ms, "
        f"{shipped[v] / (TRIAL_SECONDS * 1e3):.2%})"
        for v, label in (("disk", "without MLflow"), ("mlflow", "with MLflow"))
    ]
    out.append(
        f"Target: overhead under 2% of a 30 s trial ({target:.0f} ms), as shipped — "
        f"{'; '.join(verdicts)}. "
        "Short trials do not show the heartbeat thread's beats (one SQLite write every 10 s, "
        "in the background, about 3 per 30 s trial).\n"
    )
    return "\n".join(out)


# --------------------------------------------------------------------------- 2. ask latency


def ask_config(tmp: Path, searcher: str, db: str = "") -> StudyConfig:
    return parse_config(
        {
            "name": f"ask-{searcher}",
            "search_space": {"type": "dag"},
            "searcher": {"type": searcher},
            "objectives": {"cost": "mflops" if searcher == "nsga2" else "none"},
            "budget": {"trials": 10**6},
            "storage": f"sqlite:///{tmp / f'{db or searcher}.db'}",
            "output_dir": str(tmp / searcher),
            "mlflow": {"tracking_uri": None},
        }
    )


def synthetic_values(space: SearchSpace, params: dict[str, Any], number: int, multi: bool):
    """A cheap stand-in for training: NE falls with FLOPs, plus noise."""
    mflops = analyze(space.decode(params)).flops / 1e6
    noise = np.random.default_rng(number).normal(0.0, 0.003)
    ne = 0.78 + 0.04 * math.exp(-mflops / 0.5) + noise
    return [ne, mflops] if multi else [ne]


def realistic(trial: FrozenTrial, space: SearchSpace, multi: bool) -> FrozenTrial:
    """The finished trial as the runner stores it: user attrs and intermediate values."""
    arch = space.decode(trial.params)
    ne, mflops = trial.values[0], analyze(arch).flops / 1e6
    attrs = {
        "digest": digest(arch),
        "mflops": mflops,
        "params": 12345,
        "worker": "bench:1",
        "trial_dir": f"/tmp/ranknas-bench/trials/{trial.number}",
        "val_ne": ne,
        "val_logloss": 0.45,
        "val_auc": 0.75,
        "test_ne": ne,
        "test_auc": 0.75,
        "throughput": 50000.0,
    }
    steps = {} if multi else {10 * k: ne + 0.01 * (3 - k) for k in range(1, 4)}
    return optuna.trial.create_trial(
        state=TrialState.COMPLETE,
        values=trial.values,
        params=trial.params,
        distributions=trial.distributions,
        user_attrs=attrs,
        system_attrs=trial.system_attrs,
        intermediate_values=steps,
    )


def make_history(config: StudyConfig, space: SearchSpace, count: int, sampler=None):
    """`count` finished trials asked by the searcher's sampler (or `sampler`), in memory."""
    study = runner.open_study(config, space, InMemoryStorage())
    if sampler is not None:
        study.sampler = sampler
    multi = config.multi_objective
    dists = distributions(space)
    for _ in range(count):
        trial = study.ask(dists)
        study.tell(trial, synthetic_values(space, trial.params, trial.number, multi))
    return [realistic(t, space, multi) for t in study.get_trials(deepcopy=False)]


def timed_asks(
    study: optuna.Study,
    storage: RDBStorage,
    config: StudyConfig,
    space: SearchSpace,
    count: int,
    limit_s: float = math.inf,
) -> dict[str, list[float]]:
    """Ask through the runner's ask step `count` times (each told at once); seconds."""
    from nas.searchers.ax_bo import AxSampler

    times: dict[str, list[float]] = defaultdict(list)
    sampler = study.sampler
    hooks = ("before_trial", "infer_relative_search_space", "sample_relative", "sample_independent")
    for _ in range(count):
        prof = Profiler()
        with contextlib.ExitStack() as stack:
            for name in hooks:
                fn = prof.wrap("sampler", getattr(sampler, name))
                stack.enter_context(mock.patch.object(sampler, name, fn))
            fn = prof.wrap("ax_client", AxSampler._updated_client)
            stack.enter_context(mock.patch.object(AxSampler, "_updated_client", fn))
            stack.enter_context(prof.counting_writes())
            start = time.perf_counter()
            trial = runner._next_trial(study, storage, config, space)
            elapsed = time.perf_counter() - start
        values = synthetic_values(space, trial.params, trial.number, config.multi_objective)
        start = time.perf_counter()
        study.tell(trial, values)
        times["tell"].append(time.perf_counter() - start)
        times["next_trial"].append(elapsed)
        times["sampler"].append(prof.parts[-1].get("sampler", 0.0))
        times["ax_client"].append(prof.parts[-1].get("ax_client", 0.0))
        times["writes"].append(prof.writes[-1])
        if sum(times["next_trial"]) > limit_s:
            break
    return times


def journal_mode(storage: RDBStorage) -> str:
    with storage.engine.connect() as connection:
        return str(connection.exec_driver_sql("PRAGMA journal_mode").scalar())


def bench_ask(args: argparse.Namespace) -> str:
    out = ["## 2. `ask` latency with 1,000 finished trials\n"]
    space = make_space({"type": "dag"}, synthetic_schema())
    out.append(
        f"Default DAG space ({len(space.parameters())} parameters), synthetic schema. "
        f"{args.history} finished trials asked by each searcher's own sampler (in memory, "
        "told a synthetic NE) and written to a temp SQLite study on disk with the 11 user "
        "attrs and 3 intermediate values of a real trial; a copy of the file is switched to "
        "the rollback journal + synchronous=FULL for the 'before' columns (ranknas uses WAL). "
        "Each study is then opened again (a fresh Optuna cache, as a joining or resuming "
        f"worker: 'first ask'), and {args.asks} asks go through the runner's ask step "
        "(`nas.runner._next_trial`: stale-trial check, lock, budget count, `study.ask`), each "
        "told at once, round-robin over searchers and storages so that load changes hit all "
        "alike. 'sampler' is the time inside the sampler's hooks; the rest is Optuna storage: "
        "`study.ask` writes the new trial and then each parameter in its own transaction. "
        "nsga2 has the second objective (MFLOPs); the others one. Times in ms.\n"
    )
    searchers = [s for s in args.searchers if s != "ax"]
    history_s: dict[str, float] = {}
    first: dict[tuple[str, str], float] = {}
    times: dict[tuple[str, str], dict[str, list[float]]] = defaultdict(lambda: defaultdict(list))
    modes: dict[str, str] = {}
    with tempfile.TemporaryDirectory(prefix="ranknas-bench-") as tmp_name:
        tmp = Path(tmp_name)
        opened: dict[tuple[str, str], tuple[optuna.Study, RDBStorage, StudyConfig]] = {}
        for searcher in searchers:
            config = ask_config(tmp, searcher)
            started = time.perf_counter()
            history = make_history(config, space, args.history)
            history_s[searcher] = time.perf_counter() - started
            bulk = bulk_storage(config.storage)
            runner.open_study(config, space, bulk).add_trials(history)
            bulk.engine.dispose()
            before_config = ask_config(tmp, searcher, db=f"{searcher}-rollback")
            shutil.copyfile(config.storage.removeprefix("sqlite:///"),
                            before_config.storage.removeprefix("sqlite:///"))  # fmt: skip
            before = rollback_storage(before_config.storage, 10)
            modes[searcher] = journal_mode(before)
            storages = {
                "disk": (open_storage(config.storage, 10), config),
                "rollback": (before, before_config),
            }
            for kind, (storage, c) in storages.items():
                study = runner.open_study(c, space, storage)
                first[searcher, kind] = timed_asks(study, storage, c, space, 1)["next_trial"][0]
                opened[searcher, kind] = study, storage, c
        for _ in range(args.asks):
            for (searcher, kind), (study, storage, c) in opened.items():
                for key, values in timed_asks(study, storage, c, space, 1).items():
                    times[searcher, kind][key] += values
    out.append(
        "| searcher | history (s) | first ask | runner ask median | p90 | of which sampler, "
        "median | write transactions per ask | `tell` median | before (rollback): first ask | "
        "runner ask median | p90 | target < 100 ms (median, as shipped) |"
    )
    out.append("|---" * 12 + "|")
    for searcher in searchers:
        d = {k: [v * 1e3 for v in values] for k, values in times[searcher, "disk"].items()}
        w = [v * 1e3 for v in times[searcher, "rollback"]["next_trial"]]
        ok = "met" if med(d["next_trial"]) < 100 else "NOT met"
        out.append(
            f"| {searcher} | {history_s[searcher]:.1f} | {first[searcher, 'disk'] * 1e3:.0f} | "
            f"{med(d['next_trial']):.1f} | {p90(d['next_trial']):.1f} | {med(d['sampler']):.1f} "
            f"| {med(times[searcher, 'disk']['writes']):.0f} | {med(d['tell']):.1f} | "
            f"{first[searcher, 'rollback'] * 1e3:.0f} | {med(w):.1f} ({modes[searcher]}) | "
            f"{p90(w):.1f} | {ok} |"
        )
    out.append("")
    if "ax" in args.searchers:
        out.append(bench_ax(args, space))
    return "\n".join(out)


def bench_ax(args: argparse.Namespace, space: SearchSpace) -> str:
    sizes = [int(s) for s in args.ax_sizes.split(",")]
    out = [
        "### Ax at growing history\n",
        "The history is random (Ax's own sampler would cost the sum of all its asks to build). "
        "At each size a fresh sampler asks first (a joining or resuming worker: it builds its "
        "client from every finished trial), then keeps asking (its client is only told what "
        f"finished since). One objective. Up to {args.ax_asks} asks per size, fewer once their sum "
        f"passes {args.ax_limit_s:.0f} s (at least one); the sizes stop after one whose ask "
        f"passes {args.ax_limit_s:.0f} s, and a size is not tried when the power-law trend "
        f"of the two sizes before it predicts over {AX_SKIP_FACTOR * args.ax_limit_s:.0f} s."
        "\n",
        "| complete trials | first ask, fresh sampler (s) | of which: build the client (s) | "
        "asks | runner ask median (s) | of which: tell the client (s) | sampler in all "
        "(tell + model fit + acquisition) (s) |",
        "|---|---|---|---|---|---|---|",
    ]
    measured: list[tuple[int, float]] = []
    with tempfile.TemporaryDirectory(prefix="ranknas-bench-") as tmp_name:
        config = ask_config(Path(tmp_name), "ax")
        history = make_history(
            config, space, max(sizes), sampler=optuna.samplers.RandomSampler(seed=config.seed)
        )
        bulk = runner.open_study(config, space, bulk_storage(config.storage))
        storage = open_storage(config.storage, 10)
        for size in sizes:
            predicted = extrapolate(measured, size)
            if predicted > AX_SKIP_FACTOR * args.ax_limit_s:  # too long to try even once
                out.append(
                    f"| {size} | 0 (skipped) | ~{predicted:.0f} (extrapolated from the trend) | | |"
                )
                continue
            have = len(bulk.get_trials(deepcopy=False, states=(TrialState.COMPLETE,)))
            if size > have:  # renumbered on insertion, so taking the next slice is fine
                bulk.add_trials(history[have:size])
            study = runner.open_study(config, space, storage)  # a fresh sampler
            first = timed_asks(study, storage, config, space, 1)
            t = timed_asks(study, storage, config, space, args.ax_asks, limit_s=args.ax_limit_s)
            ask, client = med(t["next_trial"]), med(t["ax_client"])
            measured.append((size, ask))
            out.append(
                f"| {size} | {first['next_trial'][0]:.2f} | {first['ax_client'][0]:.2f} | "
                f"{len(t['next_trial'])} | {ask:.2f} | {client:.3f} | {med(t['sampler']):.2f} |"
            )
            if ask > args.ax_limit_s:
                break
    if len(measured) >= 2 and measured[-1][0] < 1000:
        (n0, t0), (n1, t1) = measured[-2], measured[-1]
        slope = math.log(t1 / t0) / math.log(n1 / n0)
        out.append(
            f"\nTrend between {n0} and {n1} trials: ask time ~ n^{slope:.2f}; "
            f"extrapolated to 1,000 trials: {extrapolate(measured, 1000):.0f} s per ask."
        )
    out.append("")
    return "\n".join(out)


def extrapolate(measured: list[tuple[int, float]], size: int) -> float:
    """Power law through the last two measured sizes (0 when fewer than two)."""
    if len(measured) < 2:
        return 0.0
    (n0, t0), (n1, t1) = measured[-2], measured[-1]
    slope = math.log(t1 / t0) / math.log(n1 / n0)
    return t1 * (size / n1) ** slope


# --------------------------------------------------------------------------- 3. quality


def quality_config(tmp: Path, searcher: str, seed: int, args: argparse.Namespace) -> StudyConfig:
    population = max(2, args.startup)
    return parse_config(
        {
            "name": f"q-{searcher}-{seed}",
            "data": {"source": "synthetic", "rows": args.rows, "seed": 0},
            "search_space": {"type": "dag", "num_blocks": args.num_blocks},
            "searcher": {
                "type": searcher,
                "startup_trials": args.startup,
                "population": population,
                "sample_size": max(2, population // 2),
            },
            "objectives": {"cost": "mflops" if searcher == "nsga2" else "none"},
            "budget": {"trials": args.trials, "examples_per_trial": args.examples},
            "storage": f"sqlite:///{tmp / 'studies.db'}",
            "output_dir": str(tmp / f"{searcher}-{seed}"),
            "mlflow": {"tracking_uri": None},
            "seed": seed,
        }
    )


def bench_quality(args: argparse.Namespace) -> str:
    searchers = list(dict.fromkeys(["random", *args.searchers]))
    seeds = [i * args.seed_step for i in range(args.seeds)]
    k = args.startup
    best: dict[str, dict[int, float]] = defaultdict(dict)
    early: dict[str, dict[int, float]] = defaultdict(dict)  # best of the first k trials
    digests: dict[str, dict[int, list[str]]] = defaultdict(dict)  # of every trial
    wall: dict[str, list[float]] = defaultdict(list)
    bayes = math.nan
    with tempfile.TemporaryDirectory(prefix="ranknas-bench-") as tmp_name:
        for seed in seeds:  # interleaved, so load changes hit every searcher alike
            for searcher in searchers:
                config = quality_config(Path(tmp_name), searcher, seed, args)
                started = time.perf_counter()
                study = runner.run_study(config, progress=lambda line: None)
                wall[searcher].append(time.perf_counter() - started)
                trials = sorted(study.trials, key=lambda t: t.number)
                complete = [t for t in trials if t.state == TrialState.COMPLETE]
                best[searcher][seed] = min((t.values[0] for t in complete), default=math.nan)
                early[searcher][seed] = min(
                    (t.values[0] for t in complete if t.number < k), default=math.nan
                )
                digests[searcher][seed] = [t.user_attrs.get("digest", "") for t in trials]
                bayes = study.user_attrs.get("bayes_ne", math.nan)
                print(
                    f"<!-- {searcher} seed {seed}: best NE {best[searcher][seed]:.4f}, "
                    f"{len(complete)}/{args.trials} complete, {wall[searcher][-1]:.0f} s -->",
                    flush=True,
                )
    out = ["## 3. Searchers vs random at an equal trial budget\n"]
    population = max(2, k)
    out.append(
        f"Synthetic data ({args.rows:,} rows, data seed 0), DAG space with {args.num_blocks} "
        f"blocks, {args.trials} trials per study, {args.examples:,} examples per trial, batch "
        f"512, torch threads {torch.get_num_threads()}; seeds {seeds} (the searcher's seed; "
        f"trial k trains with seed + k). tpe/nsga2 start with {k} random trials; evolution's "
        f"population is {population} (tournament {max(2, population // 2)}); Ax uses its "
        "defaults (center + Sobol for 5 trials, then BoTorch), one objective. nsga2 optimizes "
        "NE and MFLOPs (the Pareto front), so its best NE is a side effect. Best validation NE "
        f"after {args.trials} trials (lower is better); Bayes-optimal validation NE: "
        f"{bayes:.4f}. 'first {k}': how many of the first {k} architectures are the same as "
        f"random's with that seed (median), and the best NE among them (median): random, "
        "evolution, tpe and nsga2 all start from Optuna's RandomSampler(seed). 'distinct "
        "architectures': distinct digests over every trial of every seed (seeds that explore "
        "the same architectures are not independent samples).\n"
    )
    head = " | ".join(f"seed {s}" for s in seeds)
    out.append(
        f"| searcher | {head} | median | better / same / worse than random (seeds) | median "
        "of (best − random's best) | excess over Bayes vs random's (ratio of medians) | "
        f"first {k}: same as random's | first {k}: best NE | distinct architectures / trials, "
        "all seeds | study wall time, median (s) |"
    )
    out.append("|---" * (len(seeds) + 9) + "|")
    base = best["random"]
    base_excess = med([base[s] - bayes for s in seeds])
    for searcher in searchers:
        values = [best[searcher][s] for s in seeds]
        diffs = [best[searcher][s] - base[s] for s in seeds]
        tally = (
            f"{sum(d < -1e-9 for d in diffs)} / {sum(abs(d) <= 1e-9 for d in diffs)} / "
            f"{sum(d > 1e-9 for d in diffs)}"
        )
        pairs = [
            zip(digests[searcher][s][:k], digests["random"][s][:k], strict=True) for s in seeds
        ]
        shared = med([sum(a == b for a, b in pair) for pair in pairs])
        every = [d for s in seeds for d in digests[searcher][s]]
        ratio = med([v - bayes for v in values]) / base_excess if base_excess else math.nan
        cells = " | ".join(f"{v:.4f}" for v in values)
        out.append(
            f"| {searcher} | {cells} | {med(values):.4f} | {tally} | {med(diffs):+.4f} | "
            f"{ratio:.2f} | {shared:.0f} | {med([early[searcher][s] for s in seeds]):.4f} | "
            f"{len(set(every))} / {len(every)} | {med(wall[searcher]):.0f} |"
        )
    out.append("")
    return "\n".join(out)


# --------------------------------------------------------------------------- main


def cpu_model() -> str:
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    return platform.processor() or platform.machine()


def machine() -> str:
    load = os.getloadavg()
    return (
        f"{cpu_model()} ({platform.machine()}), {os.cpu_count()} CPUs, "
        f"torch {torch.__version__} ({torch.get_num_threads()} threads), optuna "
        f"{optuna.__version__}, Python {platform.python_version()}; load average "
        f"{load[0]:.2f} / {load[1]:.2f} / {load[2]:.2f}"
    )


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--quick", action="store_true", help="the small settings (~15-20 min on 2 shared cores)"
    )
    parser.add_argument("--parts", default="1,2,3", help="which sections to run, e.g. 1,2")
    parser.add_argument("--searchers", default=",".join(SEARCHERS))
    parser.add_argument("--overhead-trials", type=int, help="1: trials per column")
    parser.add_argument("--rounds", type=int, default=2, help="1: studies per column")
    parser.add_argument("--history", type=int, help="2: finished trials in storage")
    parser.add_argument("--asks", type=int, help="2: timed asks per searcher")
    parser.add_argument("--ax-sizes", help="2: history sizes for Ax, comma-separated")
    parser.add_argument("--ax-asks", type=int, help="2: asks per Ax size")
    parser.add_argument("--ax-limit-s", type=float, default=60.0, help="2: skip Ax beyond this")
    parser.add_argument("--rows", type=int, help="3: synthetic rows")
    parser.add_argument("--examples", type=int, help="3: examples per trial")
    parser.add_argument("--trials", type=int, help="3: trials per study")
    parser.add_argument("--seeds", type=int, help="3: seeds per searcher")
    parser.add_argument("--num-blocks", type=int, help="3: DAG blocks")
    parser.add_argument("--startup", type=int, default=5, help="3: random trials first")
    parser.add_argument(
        "--seed-step", type=int, default=1, help="3: study seeds are 0, step, 2*step, ..."
    )
    parser.add_argument(
        "--threads",
        type=int,
        default=1,
        help="torch threads (0: torch's default). 1 by default: on a shared 2-core machine, "
        "2 OpenMP threads make training 10-30x slower (barrier waits under load)",
    )
    args = parser.parse_args()
    for key, value in (QUICK if args.quick else FULL).items():
        if getattr(args, key) is None:
            setattr(args, key, value)
    args.searchers = [s.strip() for s in args.searchers.split(",") if s.strip()]
    parts = {p.strip() for p in args.parts.split(",")}

    warnings.filterwarnings("ignore")
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    for name in ("ax", "torch.fx._symbolic_trace", "mlflow"):
        logging.getLogger(name).setLevel(logging.ERROR)

    if args.threads:
        torch.set_num_threads(args.threads)

    started = time.perf_counter()
    print("# Search studies benchmark\n")
    print(f"Command: `.venv/bin/python bench/bench_study.py {' '.join(sys.argv[1:])}`\n")
    print(f"Machine at start: {machine()}\n", flush=True)
    for part, fn in (("1", bench_overhead), ("2", bench_ask), ("3", bench_quality)):
        if part in parts:
            section = time.perf_counter()
            text = fn(args)
            print(text)
            print(f"_Section {part}: {time.perf_counter() - section:.0f} s._\n", flush=True)
    print(f"Machine at end: {machine()}\n")
    print(f"Total wall time: {time.perf_counter() - started:.0f} s")


if __name__ == "__main__":
    main()
