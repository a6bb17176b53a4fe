"""`ranknas search CONFIG --workers N`: N worker processes on one study, one command.

Each worker is `ranknas search CONFIG` in a process of its own (the multi-worker protocol
of `nas.runner` shares the budget through the study's storage), forked from one process
that imported the trainer's libraries once (`_starter`), placed round-robin on the
visible GPUs and pinned to its GPU through CUDA_VISIBLE_DEVICES, or, without a GPU, given
an equal share of the CPU cores as torch threads. Workers write to their own log files
(`<study dir>/workers/worker-K.log`); this process shows one progress display read from
the storage. Ctrl-C or SIGTERM stops every worker as it stops one (their trials are
retried on resume) and exits 130 (143 after a SIGTERM); a worker that dies has its trial
failed by heartbeats and retried, as with `ranknas worker`.
"""

from __future__ import annotations

import collections
import contextlib
import logging
import multiprocessing
import multiprocessing.connection
import os
import re
import signal
import sys
import threading
import time
from dataclasses import dataclass
from multiprocessing.context import BaseContext
from multiprocessing.process import BaseProcess
from pathlib import Path
from shlex import quote
from typing import TextIO

from nas.config import StudyConfig
from nas.trial_record import INTERRUPTED, TIME_LIMIT_SAID, counted_trials
from search_space.errors import RanknasError
from trainers import progress as bars
from trainers.config import cpu_label

POLL_SECONDS = 1.0
NVML_CHECK = "PYTORCH_NVML_BASED_CUDA_CHECK"  # torch asks NVML, not CUDA, if CUDA is there
MAX_SHOWN = 5  # trial numbers named in a line of repeats
STOP_SECONDS = 60  # a stopped worker's time to record its trial as interrupted


@dataclass(frozen=True)
class Placement:
    """Where one worker runs: the GPU it sees (None: as configured) and its torch threads."""

    gpu: str | None
    threads: int

    @property
    def label(self) -> str:
        return f"cuda:{self.gpu}" if self.gpu is not None else cpu_label(self.threads)


def visible_gpus() -> list[str]:
    """The GPUs this process may use, as CUDA_VISIBLE_DEVICES names them (indices or UUIDs)."""
    import torch  # the count comes from NVML: no CUDA context is made here

    count = torch.cuda.device_count()
    listed = [g.strip() for g in os.environ.get("CUDA_VISIBLE_DEVICES", "").split(",") if g.strip()]
    return listed[:count] if listed else [str(i) for i in range(count)]


def worker_count(config: StudyConfig, requested: int | None, gpus: int) -> int:
    """`--workers`, else `workers.count`, else `workers.per_device` on each GPU, else 1;
    refused when it puts more than `workers.per_device` on one GPU."""
    per_device = config.workers.per_device
    count = requested or config.workers.count or (per_device * max(gpus, 1) if per_device else 1)
    if per_device and gpus and count > per_device * gpus:
        raise RanknasError(
            f"{count} workers on {gpus} GPU(s) puts more than workers.per_device={per_device} "
            f"on one; ask for at most {per_device * gpus} workers or raise per_device"
        )
    return count


def placements(count: int, device: str, gpus: list[str], cores: int) -> list[Placement]:
    """Round-robin over `gpus` when `device` (training.device) lets a worker take any GPU;
    the cores split evenly (a GPU worker's threads feed its GPU)."""
    threads = max(1, cores // count)
    spread = device in ("auto", "cuda") and gpus
    return [Placement(gpus[i % len(gpus)] if spread else None, threads) for i in range(count)]


def launch(
    config_path: str, config: StudyConfig, count: int, gpus: list[str], extra_args: list[str]
) -> list[int]:
    """Run `count` workers on the study of `config`, over `gpus` (`visible_gpus`), until
    they all end; their exit statuses (130, 143: interrupted by SIGINT, SIGTERM; below 0:
    killed by that signal)."""
    from nas.cli import INTERRUPTED_EXITS

    places = placements(count, config.training.device, gpus, os.cpu_count() or 1)
    logs = config.study_dir / "workers"
    try:
        logs.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise RanknasError(f"output_dir: cannot create {logs} ({exc.strerror}); "
                           "choose a writable directory") from None  # fmt: skip
    where = ", ".join(f"worker {i} on {p.label}" for i, p in enumerate(places))
    print(f"{count} workers: {where}; their logs in {logs}", flush=True)
    (context, unset_nvml_check), workers = _starter(gpus), []
    relay = _Relay(_headed_logs(logs, count, config_path))
    display = _Display(config, relay, _finished_earlier(config, config_path))
    try:  # a signal while they start stops those already started; so does any failure here
        for i, place in enumerate(places):
            log = logs / f"worker-{i}.log"
            workers.append(_start(context, config_path, place, log, extra_args, unset_nvml_check))
        _watch(config, workers, display)
    except BaseException:
        _stop(workers)
        # what they said and recorded since the last look, as they stopped; a failing last
        # look does not replace why the launch stopped
        with contextlib.suppress(Exception):
            display.show()
        raise
    for worker in workers:
        worker.join()
    _say_time_limit(config)
    codes = [w.exitcode for w in workers]
    for i, code in enumerate(codes):
        if code is not None and code < 0:  # its last line is not why
            print(f"worker {i} was killed by signal {-code}", file=sys.stderr)
        # an error the display relayed already is not said again, nor an interrupt (the
        # caller says it once: each worker's "interrupted: run the same command" repeated it)
        elif (
            code not in (0, *INTERRUPTED_EXITS)
            and (last := _last_line(logs / f"worker-{i}.log")) not in relay.said
        ):
            print(f"worker {i} exited with status {code}: {last}", file=sys.stderr)
    return codes


def _start(
    context: BaseContext,
    config_path: str,
    place: Placement,
    log: Path,
    extra_args: list[str],
    unset_nvml_check: bool,
) -> BaseProcess:
    argv = ["search", config_path, "--one-worker", "--threads", str(place.threads), *extra_args]
    worker = context.Process(target=_worker, args=(argv, place.gpu, str(log), unset_nvml_check),
                             name=log.stem)  # fmt: skip
    try:
        worker.start()
    except (EOFError, OSError) as exc:  # the server died importing the trainer, or could not start
        raise RanknasError(
            f"could not start worker {log.stem} ({type(exc).__name__}: {exc}); check that "
            "`python -c 'import nas.runner'` works, or set RANKNAS_WORKER_START=spawn to start "
            "each worker in a fresh interpreter"
        ) from None
    return worker


def _starter(gpus: list[str]) -> tuple[BaseContext, bool]:
    """How workers start: forked from a server process that imported the trainer (torch,
    torchrec, fbgemm: seconds of CPU a process) once (`nas.worker_preload`), instead of
    each importing it; each in a fresh interpreter with RANKNAS_WORKER_START=spawn, or where
    the server could not be kept from making a CUDA context, which a forked child cannot
    use: torch counts GPUs without one only through NVML, which does not see MIG instances.
    Also whether NVML_CHECK was set here for the server, so that the workers unset it."""
    if os.environ.get("RANKNAS_WORKER_START", "forkserver") == "spawn" or not _forkable(gpus):
        return multiprocessing.get_context("spawn"), False
    context = multiprocessing.get_context("forkserver")
    context.set_forkserver_preload(["nas.worker_preload"])
    return context, _set_nvml_check()


def _forkable(gpus: list[str]) -> bool:
    if not gpus:
        return True
    if any(gpu.startswith("MIG-") for gpu in gpus):
        return False
    import torch

    return getattr(torch.cuda, "_device_count_nvml", lambda: -1)() >= 0


def _set_nvml_check() -> bool:
    """Set NVML_CHECK for the server (it must not make a CUDA context when fbgemm asks
    whether CUDA is there); whether it was set here, so that the workers unset it."""
    if NVML_CHECK in os.environ:
        return False
    os.environ[NVML_CHECK] = "1"
    return True


def _worker(argv: list[str], gpu: str | None, log: str, unset_nvml_check: bool) -> None:
    """One worker, in its own process: pinned to its GPU, writing to its log, stopping
    when the launcher is gone."""
    signal.signal(signal.SIGINT, signal.default_int_handler)  # the server ignores them
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    if unset_nvml_check:
        os.environ.pop(NVML_CHECK, None)
    if gpu is not None:  # before anything makes a CUDA context
        os.environ["CUDA_VISIBLE_DEVICES"] = gpu
    with open(log, "a") as out:  # after the runs before (`_headed_logs`)
        os.dup2(out.fileno(), sys.stdout.fileno())
        os.dup2(out.fileno(), sys.stderr.fileno())
    launcher = multiprocessing.parent_process()
    if launcher is not None:
        if not launcher.is_alive():  # it stopped while this worker was being forked
            sys.exit(130)
        threading.Thread(target=_stop_without, args=(launcher.sentinel,), daemon=True).start()
    # an import's stray `logging.info` (fbgemm's) configured the root logger in the server;
    # the CLI configures its own format only where none is
    logging.root.handlers.clear()
    from nas.cli import main

    sys.exit(main(argv))


def _stop_without(launcher_sentinel: int) -> None:
    """Stop this worker as a SIGTERM does (its trial recorded as interrupted) once the
    launcher has exited, however it exited."""
    multiprocessing.connection.wait([launcher_sentinel])
    os.kill(os.getpid(), signal.SIGTERM)


LOG_HEADER = "=== launched"  # a launch's first line in each worker's log


def _headed_logs(logs: Path, count: int, config_path: str) -> list[Path]:
    """The workers' logs, each with a line that starts this launch's part: a launch on the
    same study appends to them (it wrote over the runs before)."""
    paths = [logs / f"worker-{i}.log" for i in range(count)]
    started = time.strftime("%Y-%m-%d %H:%M:%S")
    for i, path in enumerate(paths):
        with path.open("a") as log:
            log.write(f"{LOG_HEADER} {started}: ranknas search {config_path}, worker {i} of "
                      f"{count}\n")  # fmt: skip
    return paths


class _Relay:
    """What the workers print besides their trials (the data summary, warnings, baselines),
    each line once: every worker loads the same data and says so."""

    def __init__(self, logs: list[Path]) -> None:
        # bytes of each log relayed or skipped so far: what the runs before wrote is not news
        self.read = {log: log.stat().st_size if log.exists() else 0 for log in logs}
        self.said: set[str] = set()

    def lines(self) -> list[str]:
        new = []
        for log, done in self.read.items():
            try:
                with log.open("rb") as read:  # from where the last poll stopped, not whole
                    read.seek(done)
                    text = read.read()
            except OSError:  # not yet created by its worker
                continue
            whole = text[: text.rfind(b"\n") + 1]  # a line still being written waits
            self.read[log] = done + len(whole)
            for line in whole.decode(errors="replace").splitlines():
                if line.strip() and line not in self.said and not _LAUNCHER_SAYS.match(line):
                    self.said.add(line)
                    new.append(line)
        return new


# a worker's own trial lines (not the seed runs choosing the best baseline: `[1/6] baseline
# dcnv2 seed 1000: ...`), its banner, its MLflow address, its "interrupted" and its time
# limit: the launcher prints those, once for all workers
_LAUNCHER_SAYS = re.compile(
    r"\[\d+/\d+\] (?!baseline \S+ seed )|trial \d+: \d+%|study '[^']*': |MLflow: "
    r"|compare them in MLflow|interrupted: "
    f"|{re.escape(TIME_LIMIT_SAID)}"
)


# a worker's warnings and errors, which one process writes on stderr (`cli.library_logs`)
_DIAGNOSTIC = re.compile(r"(WARNING|ERROR|error): ")


def relayed_to(line: str) -> TextIO:
    """Where the launcher prints a worker's line: where one process would have."""
    return sys.stderr if _DIAGNOSTIC.match(line) else sys.stdout


# finished trials that the budget does not count, as a resumed launch says them
_NOT_COUNTED = {
    "fail": "failed",
    "repeat": "repeated",
    "skipped": "skipped",
    INTERRUPTED: "interrupted",
}


def _finished_earlier(config: StudyConfig, config_path: str) -> set[int]:
    """The trials of a resumed study finished before this launch, said in one line (each
    was a line of the display: hundreds on a long study, before a refusal of its config)."""
    from nas.leaderboard import trial_state
    from nas.storage import existing_study

    study = existing_study(config.name, config.storage)
    if study is None:
        return set()
    trials = study.get_trials(deepcopy=False)
    finished = [t for t in trials if t.state.is_finished()]
    if finished:
        # the rest by kind: "0 of 5 done" alone hid 3 earlier failures
        kinds = collections.Counter(trial_state(t) for t in finished)
        rest = "".join(f", {n} {said}" for kind, said in _NOT_COUNTED.items() if (n := kinds[kind]))
        done = f"{counted_trials(trials)} of {config.budget.trials} trials done earlier{rest}"
        listed = f"`ranknas leaderboard {quote(str(config_path))}` lists them"
        print(f"resuming: {done} ({listed})", flush=True)
    return {t.number for t in finished}


class _Display:
    """One progress display for all workers, from the storage: a line per trial finished
    since the launch (`earlier`: those before it), and the workers' other lines (`_Relay`)."""

    def __init__(self, config: StudyConfig, relay: _Relay, earlier: set[int]) -> None:
        self.config, self.relay, self.seen = config, relay, set(earlier)
        self.study = None  # opened once the first worker has created it

    def show(self) -> list:
        """What is new since the last look; the study's trials."""
        from nas.storage import existing_study

        self.study = self.study or existing_study(self.config.name, self.config.storage)
        for line in self.relay.lines():
            bars.write(line, relayed_to(line))
        trials = self.study.get_trials(deepcopy=False) if self.study is not None else []
        finished = [t for t in trials if t.number not in self.seen and t.state.is_finished()]
        self.seen.update(t.number for t in finished)
        for line in _lines(finished):
            bars.write(line)
        return trials


def _watch(config: StudyConfig, workers: list[BaseProcess], display: _Display) -> None:
    """`display` until the workers end, with a bar of the trials counted."""
    from nas.trial_record import counted_trials

    with bars.bar(config.budget.trials, f"study {config.name}", "trials", lines=False) as bar:
        while True:
            running = any(w.is_alive() for w in workers)
            done = counted_trials(display.show())
            bar.update(max(0, done - bar.n))
            if not running:
                return
            time.sleep(POLL_SECONDS)


def _say_time_limit(config: StudyConfig) -> None:
    """The workers' search stopped by its time limit, said once (each worker would)."""
    from nas.storage import existing_study
    from nas.trial_record import StudyAttr, time_limit_line

    study = existing_study(config.name, config.storage)
    limited = study.user_attrs.get(StudyAttr.TIME_LIMITED) if study is not None else None
    if limited:
        print(time_limit_line(limited, config.budget.trials), flush=True)


def _lines(trials: list) -> list[str]:
    """A line per finished trial; a run of repeats (not trained, not counted) as one line (a
    small space's searcher drew the same architectures dozens of times, each a line)."""
    from nas.leaderboard import trial_state

    lines: list[str] = []
    repeats: list = []
    for trial in [*trials, None]:
        if trial is not None and trial_state(trial) == "repeat":
            repeats.append(trial)
            continue
        if len(repeats) == 1:
            lines.append(_line(repeats[0]))
        elif repeats:
            numbers = [str(t.number) for t in repeats]
            more = f" and {len(numbers) - MAX_SHOWN} more" if len(numbers) > MAX_SHOWN else ""
            lines.append(f"trials {', '.join(numbers[:MAX_SHOWN])}{more}: repeats of earlier "
                         "architectures (not trained again, not counted)")  # fmt: skip
        repeats = []
        if trial is not None:
            lines.append(_line(trial))
    return lines


def _line(trial) -> str:
    from nas.leaderboard import trial_state
    from nas.trial_record import INTERRUPTED, TrialAttr, failure_reason

    attrs, state = trial.user_attrs, trial_state(trial)
    if state == "skipped":  # told as pruned, never trained
        return f"trial {trial.number} skipped untrained: {attrs.get(TrialAttr.FAILURE_REASON)}"
    device = attrs.get(TrialAttr.DEVICE, "")
    if state == INTERRUPTED:  # not a failure: retried on resume
        return f"trial {trial.number} interrupted on {device or '-'} (retried on resume)"
    value = f" val NE {attrs['val_ne']:.4f}" if isinstance(attrs.get("val_ne"), float) else ""
    note = " (a repeat)" if state == "repeat" else ""
    reason = failure_reason(trial)
    why = f": {reason}" if reason and trial.state.name == "FAIL" else ""
    return f"trial {trial.number} {trial.state.name.lower()}{value} on {device or '-'}{note}{why}"


def _stop(workers: list[BaseProcess]) -> None:
    """SIGINT to each worker still running (a terminal's Ctrl-C reached them already), then
    wait for them to record their trials; kill what is left."""
    for worker in workers:
        if worker.is_alive():
            with contextlib.suppress(ProcessLookupError):  # it ended since
                os.kill(worker.pid, signal.SIGINT)
    deadline = time.monotonic() + STOP_SECONDS
    for worker in workers:
        worker.join(timeout=max(0.0, deadline - time.monotonic()))
        if worker.is_alive():
            worker.kill()
            worker.join()


def _last_line(log: Path) -> str:
    lines = [line for line in log.read_text(errors="replace").splitlines() if line.strip()]
    return lines[-1] if lines else "(no output)"
