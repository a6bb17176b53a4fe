"""`ranknas shard plan|compare|train|links`: the parser only; the handlers (`commands`) import
torch and torchrec when a command runs, so that `--help` is quick."""

from __future__ import annotations

import argparse
from collections.abc import Callable
from pathlib import Path

from cost_models import lazy_handler
from cost_models.sharding.methods import DEFAULT_MODEL, FALLBACK, MAX_DEVICES, METHODS
from search_space import arguments

# where `shard train --quick` saves without --out: a tiny trial run that `shard plan` must not
# pick up by default in place of the shipped model
QUICK_MODEL = Path("runs/sharding/quick-model")
DEFAULT_CACHE = Path("runs/sharding/measurements")


def _handler(name: str) -> Callable[[argparse.Namespace], int]:
    return lazy_handler("cost_models.sharding.commands", name)


def register(commands: argparse._SubParsersAction) -> None:
    """Add `shard plan|train|compare|links` to a subparsers object."""
    shard = commands.add_parser(
        "shard", **arguments.said("embedding sharding: plan, train, compare")
    )
    sub = shard.add_subparsers(
        dest="shard_command", metavar="COMMAND", required=True, help="what to do"
    )

    plan = sub.add_parser("plan", **arguments.said("place tables on devices and print the plan"))
    _workload_options(plan)
    plan.add_argument(
        "--method",
        choices=METHODS,
        default="rl",
        metavar="METHOD",
        help=f"sharder: {', '.join(METHODS)} (rl without a trained policy in --model: {FALLBACK})",
    )
    plan.add_argument(
        "--measure",
        action="store_true",
        help="rl only: choose among the candidate plans by timing them on this machine's "
        "kernel, then improve the best by timed moves (seconds to minutes, not under one)",
    )
    plan.set_defaults(handler=_handler("cmd_plan"))

    compare = sub.add_parser(
        "compare", **arguments.said("measure every sharder's plan on the real kernel")
    )
    _workload_options(compare)
    compare.add_argument(
        "--cache",
        type=Path,
        default=DEFAULT_CACHE,
        metavar="DIR",
        help="directory of cached kernel measurements (reused, extended)",
    )
    compare.set_defaults(handler=_handler("cmd_compare"))

    train = sub.add_parser(
        "train", **arguments.said("measure, train the cost model and the RL policy")
    )
    train.add_argument(
        "--out",
        type=lambda text: Path(arguments.output_dir(text)),
        default=None,
        metavar="DIR",
        help=f"directory to save the cost model and the policy to (default: {DEFAULT_MODEL}, "
        f"which `shard plan` uses; with --quick, {QUICK_MODEL}, which it does not)",
    )
    train.add_argument(
        "--cache",
        type=Path,
        default=DEFAULT_CACHE,
        metavar="DIR",
        help="directory of cached kernel measurements (reused, extended)",
    )
    train.add_argument(
        "--rounds",
        type=arguments.positive(int),
        metavar="N",
        help="measure / refit / train-policy rounds (default: 4; 1 with --quick)",
    )
    train.add_argument(
        "--iterations",
        type=arguments.positive(int),
        metavar="N",
        help="policy training iterations per round (default: 250; 5 with --quick)",
    )
    train.add_argument(
        "--seed", type=arguments.seed, default=0, help="seed of the table pools, tasks and training"
    )
    train.add_argument("--quick", action="store_true", help="a tiny run (seconds), to try it out")
    train.set_defaults(handler=_handler("cmd_train"))

    links = sub.add_parser(
        "links",
        **arguments.said("measure this machine's collectives for a study's step prediction"),
    )
    links.add_argument("--processes", type=int, default=2, metavar="N",
                       help="local processes to measure between (torchrun)")  # fmt: skip
    links.add_argument("--batch-size", type=arguments.positive(int), default=512, metavar="N",
                       help="rows a process takes a step when the runtime's cost is measured "
                       "(a study's training.batch_size / training.processes)")  # fmt: skip
    links.add_argument("--out", type=Path, required=True, metavar="FILE",
                       help="JSON for `sharding: {links: FILE}` in a study")  # fmt: skip
    links.set_defaults(handler=_handler("cmd_links"))


def _workload_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "tables",
        metavar="TABLES",
        help="YAML/JSON file with `tables: [...]`, or a preset name or architecture JSON "
        "(its embedding tables, named t_<feature>)",
    )
    parser.add_argument(
        "--schema",
        metavar="FILE",
        help="dataset schema YAML, when TABLES is a preset or an architecture "
        "(default: the built-in synthetic data's schema)",
    )
    parser.add_argument(
        "--devices",
        type=arguments.number(int, minimum=1, maximum=MAX_DEVICES),
        required=True,
        metavar="N",
        help=f"number of devices to place the tables on (at most {MAX_DEVICES:,}: 2,048 hosts "
        "of 8)",
    )
    parser.add_argument(
        "--hosts",
        type=arguments.positive(int),
        metavar="N",
        help="hosts the devices are spread over, evenly (default: 8 devices a host); a "
        "table cut row-wise within a host is cut over a host's devices",
    )
    parser.add_argument(
        "--memory-gb",
        type=arguments.positive(float),
        metavar="GIB",
        help="memory per device in GiB (default: torchrec's HBM_CAP, 32 GiB)",
    )
    parser.add_argument(
        "--model",
        type=Path,
        default=DEFAULT_MODEL,
        metavar="DIR",
        help="directory of the trained cost model and RL policy (`ranknas shard train --out`)",
    )
    parser.add_argument("--json", action="store_true", help="print JSON instead of a table")
