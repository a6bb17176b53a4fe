"""What the process that `ranknas search --workers` forks its workers from imports first
(`nas.launch._starter`): it leaves the terminal's Ctrl-C and a group's SIGTERM to the
workers, which stop cleanly on them (a server killed by them would make the launcher see
every worker gone while they train on), then imports what every worker needs.
Imported only there: it ignores those signals in the process that imports it."""

import signal

signal.signal(signal.SIGINT, signal.SIG_IGN)
signal.signal(signal.SIGTERM, signal.SIG_IGN)

import nas.runner  # noqa: E402,F401  (the point: torch, torchrec, fbgemm imported once)
