"""A module run on local processes by torchrun, on a free port (sharded training, the link
measurements, the step-prediction benchmark)."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from collections.abc import Sequence


def torchrun(
    processes: int, module: str, args: Sequence[str], threads: int = 1
) -> subprocess.CompletedProcess:
    """`python -m torch.distributed.run --nproc_per_node N -m module args...`, each process
    with `threads` OpenMP threads; output captured as text, the exit status not checked."""
    command = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node",
               str(processes), "--master_port", str(free_port()), "-m", module, *args]  # fmt: skip
    env = os.environ | {"OMP_NUM_THREADS": str(threads)}
    return subprocess.run(command, env=env, capture_output=True, text=True)


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]
