"""Which process did something, told apart from every other: a study's trials and a
sharded run's job folders name their process so that what a killed one left can be
recognised as its own and cleaned up."""

from __future__ import annotations

import functools
import os
from pathlib import Path


def process_identity() -> str | None:
    """This process as no other reads it: the boot, the PID namespace and the pid (a
    hostname is not unique: containers sharing the host's network, cloned VMs); None where
    /proc does not say."""
    here = _boot_and_namespace()
    return None if here is None else f"{here}:{os.getpid()}"


@functools.cache
def _boot_and_namespace() -> str | None:
    """This machine's boot and this process's PID namespace (a forked worker shares both):
    read once, not at every ask."""
    try:
        boot = Path("/proc/sys/kernel/random/boot_id").read_text().strip()
        namespace = os.stat("/proc/self/ns/pid").st_ino
    except OSError:
        return None
    return f"{boot}:{namespace}"


def gone_from_here(identity: str | None) -> bool:
    """Whether `identity` (`process_identity()` of another process) was a process of this
    boot and PID namespace that no longer runs. (A reused pid reads as alive.)"""
    here = _boot_and_namespace()
    if not identity or not here or identity.rsplit(":", 1)[0] != here:
        return False
    try:
        os.kill(int(identity.rsplit(":", 1)[1]), 0)  # no signal: whether it exists
    except ProcessLookupError:
        return True
    except (PermissionError, ValueError):  # another user's process of that pid: alive
        pass
    return False
