"""How long the CLI takes to answer `--help` (the parser alone, nothing trained) and,
given a recorded study, `status` and `leaderboard` (rows read from its storage).

    .venv/bin/python bench/bench_cli.py --repeats 7
    .venv/bin/python bench/bench_cli.py --study quickstart --storage sqlite:///ranknas-data/studies.db
    .venv/bin/python bench/bench_cli.py --config examples/quickstart.yaml   # given its YAML

Prints one Markdown row per command: the median wall time of a fresh process and the
spread, as a user waits for it.
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import time

COMMANDS = ("--help", "search --help", "train --help", "shard plan --help", "latency fit --help")
STUDY_COMMANDS = ("status", "leaderboard")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--study", help="also time `status` and `leaderboard` of this study")
    parser.add_argument("--storage", default="sqlite:///ranknas-data/studies.db",
                        help="the study's storage URL")  # fmt: skip
    parser.add_argument("--config", help="also time them given this study YAML")
    parser.add_argument("--only-study", action="store_true", help="skip the --help commands")
    args = parser.parse_args()
    commands = [] if args.only_study else list(COMMANDS)
    if args.study:
        commands += [f"{c} {args.study} --storage {args.storage}" for c in STUDY_COMMANDS]
    if args.config:
        commands += [f"{c} {args.config}" for c in STUDY_COMMANDS]
    print("| command | median s | spread s |\n|---|---|---|")
    for command in commands:
        times = []
        for _ in range(args.repeats):
            started = time.perf_counter()
            subprocess.run([sys.executable, "-m", "nas.cli", *command.split()], check=True,
                           capture_output=True)  # fmt: skip
            times.append(time.perf_counter() - started)
        spread = (max(times) - min(times)) / 2
        print(f"| `ranknas {command}` | {statistics.median(times):.2f} | ±{spread:.2f} |")


if __name__ == "__main__":
    main()
