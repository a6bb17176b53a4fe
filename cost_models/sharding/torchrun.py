"""A module run on local processes by torchrun, on a free port (sharded training, the link
measurements, the step-prediction benchmark), and the process group each of its ranks runs
in (`process_group`)."""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
from collections.abc import Iterator, Sequence
from contextlib import contextmanager

import torch
import torch.distributed as dist


def torchrun(
    processes: int, module: str, args: Sequence[str], threads: int = 1
) -> subprocess.CompletedProcess:
    """`python -m torch.distributed.run --nproc_per_node N -m module args...`, each process
    with `threads` OpenMP threads; output captured as text, the exit status not checked."""
    command = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node",
               str(processes), "--master_port", str(free_port()), "-m", module, *args]  # fmt: skip
    env = os.environ | {"OMP_NUM_THREADS": str(threads)}
    if sys.platform.startswith("linux"):  # SIGTERM to torchrun when this process dies
        # unwarned (`kill -9`: its ranks trained on), set by a wrapper that then becomes it
        command = [sys.executable, "-c", DIE_WITH_PARENT, str(os.getpid()), *command[1:]]
    # a session of its own: a Ctrl-C or kill of this process stops its ranks here, where a
    # signal to this process alone (a `kill PID`, a scheduler) left them running on
    process = subprocess.Popen(command, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                               text=True, start_new_session=True)  # fmt: skip
    try:
        out, err = process.communicate()
    except BaseException:
        _stop_group(process)
        raise
    return subprocess.CompletedProcess(command, process.returncode, out, err)


STOP_SECONDS = 10.0  # for torchrun to stop its ranks on SIGTERM, before they are killed
# argv: the parent's pid, then the arguments of `python` it becomes: Linux's
# prctl(PR_SET_PDEATHSIG, SIGTERM) survives the exec (a preexec_fn would do it in the forked
# copy of a large, threaded trainer, and rule out vfork)
DIE_WITH_PARENT = """import ctypes, os, signal, sys
ctypes.CDLL(None).prctl(1, signal.SIGTERM)
if os.getppid() != int(sys.argv[1]):
    sys.exit(143)
os.execv(sys.executable, [sys.executable, *sys.argv[2:]])
"""


def _stop_group(process: subprocess.Popen) -> None:
    """SIGTERM to torchrun and its ranks (torchrun passes it on and waits for them), then
    SIGKILL to whatever of the group is left."""
    with contextlib.suppress(ProcessLookupError):
        os.killpg(process.pid, signal.SIGTERM)
    with contextlib.suppress(subprocess.TimeoutExpired):
        process.wait(timeout=STOP_SECONDS)
    with contextlib.suppress(ProcessLookupError):
        os.killpg(process.pid, signal.SIGKILL)
    process.wait()


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@contextmanager
def process_group(backend: str | None = None) -> Iterator[None]:
    """One rank's process group (nccl where there is a GPU, gloo otherwise) around its work;
    when the work ends well every rank waits for the others, and the process then exits 0
    at once. Its results are written by then, and the interpreter's own teardown is where
    gloo's threads, still held by torchrec's and DDP's objects, now and then abort the
    process ("terminate called without an active exception", SIGABRT, after `atexit`:
    about 1 run in 20 with the cores busy), failing a run that had finished."""
    dist.init_process_group(backend or ("nccl" if torch.cuda.is_available() else "gloo"))
    try:
        yield
        dist.barrier()
    finally:
        dist.destroy_process_group()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)
