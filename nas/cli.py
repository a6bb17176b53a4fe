"""The `ranknas` command line.

Every user mistake raises `RanknasError`; `main` prints its message and exits 2, so a
person sees what to fix, never a traceback. Anything else is a bug and keeps its traceback.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import signal
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from search_space.errors import RanknasError
from trainers import progress

Handler = Callable[[argparse.Namespace], int]


def _human(n: float) -> str:
    for unit, scale in (("G", 1e9), ("M", 1e6), ("K", 1e3)):
        if abs(n) >= scale:
            return f"{n / scale:.2f}{unit}"
    return str(int(n))


def cmd_presets(args: argparse.Namespace) -> int:
    from nas.leaderboard import align
    from search_space.architecture import analyze
    from search_space.presets import PRESETS, preset
    from search_space.schema import load_schema

    schema = load_schema(args.schema)
    rows, records = [], []
    for name, factory in PRESETS.items():
        analysis = analyze(preset(name, schema))
        summary = (factory.__doc__ or "").strip().splitlines()[0]
        records.append(
            {
                "name": name,
                "description": summary,
                "flops": analysis.flops,
                "dense_params": analysis.dense_params,
                "embedding_params": analysis.embedding_params,
            }
        )
        rows.append(
            [
                name,
                _human(analysis.flops),
                _human(analysis.dense_params),
                _human(analysis.embedding_params),
                summary,
            ]
        )
    if args.json:
        print(json.dumps(records, indent=2))
    else:
        print(f"presets on dataset {schema.name!r} (FLOPs and params per example):")
        header = ["name", "FLOPs", "params", "emb.params", "description"]
        print(align(header, [[str(c) for c in r] for r in rows]))
    return 0


def arch_report(arch) -> dict[str, Any]:
    """The spec with its costs, as `ranknas arch show --json` prints it."""
    from search_space.architecture import analyze, digest

    analysis = analyze(arch)
    return {
        "architecture": arch.to_dict(),
        "digest": digest(arch),
        "flops": analysis.flops,
        "dense_params": analysis.dense_params,
        "embedding_params": analysis.embedding_params,
        "blocks": [
            {
                "name": name,
                "op": arch.block(name).op,
                "inputs": list(arch.block(name).inputs),
                "output": str(analysis.shapes[name]),
                "flops": analysis.block_flops[name],
                "params": analysis.block_params[name],
            }
            for name in analysis.order
        ],
    }


def cmd_arch_show(args: argparse.Namespace) -> int:
    from search_space.presets import load_architecture
    from search_space.schema import load_schema

    arch = load_architecture(args.arch, load_schema(args.schema))
    report = arch_report(arch)
    if args.diagram:
        from nas.diagram import diagram_png

        Path(args.diagram).write_bytes(diagram_png(arch))
        print(f"diagram: {args.diagram}", file=sys.stderr)
    print(json.dumps(report, indent=2) if args.json else _arch_table(arch, report, args.arch))
    return 0


def _arch_table(arch, report: dict[str, Any], name: str) -> str:
    """The `arch show` text: inputs, one row per live block, the totals."""
    from nas.leaderboard import align

    emb = arch.embedding
    rows = [[b["name"], b["op"], ",".join(b["inputs"]), str(b["output"]), _human(b["flops"]),
             _human(b["params"])] for b in report["blocks"]]  # fmt: skip
    header = ["block", "op", "inputs", "output", "FLOPs", "params"]
    return "\n".join([
        f"architecture {arch.name or name}  digest {report['digest']}",
        f"inputs: dense[{arch.num_dense}], {len(emb.features)} features x dim {emb.dim}",
        align(header, rows),
        f"total: {_human(report['flops'])} FLOPs/example, {_human(report['dense_params'])} "
        f"dense params, {_human(report['embedding_params'])} embedding params "
        f"(head: {arch.output_block} -> logit)",
    ])  # fmt: skip


def cmd_space_sample(args: argparse.Namespace) -> int:
    import random

    from search_space.schema import load_schema
    from search_space.spaces import load_space

    space = load_space(args.config, load_schema(args.schema))
    values = space.sample_values(random.Random(args.seed))
    arch = space.decode(values)
    report = arch_report(arch) | {"values": values}
    print(json.dumps(report, indent=2) if args.json else _arch_table(arch, report, "sampled"))
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="ranknas",
        description="Neural-architecture search for ranking and recommendation models.",
    )
    parser.add_argument("-v", "--verbose", action="store_true",
                        help="also show the libraries' info messages (Optuna, MLflow)")  # fmt: skip
    commands = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)

    def command(name: str, handler: Handler, help: str, parent=commands):
        sub = parent.add_parser(name, help=help, description=help)
        sub.set_defaults(handler=handler)
        return sub

    def schema_option(sub: argparse.ArgumentParser) -> None:
        sub.add_argument(
            "--schema", metavar="FILE", help="dataset schema YAML (default: the synthetic data)"
        )

    presets = command("presets", cmd_presets, "list the engineer presets with their costs")
    schema_option(presets)
    presets.add_argument("--json", action="store_true", help="print JSON")

    arch = commands.add_parser("arch", help="inspect architectures")
    arch_commands = arch.add_subparsers(dest="arch_command", metavar="COMMAND", required=True)
    show = command("show", cmd_arch_show, "print a spec with its FLOPs and params", arch_commands)
    show.add_argument("arch", metavar="NAME_OR_FILE", help="a preset name or a spec JSON file")
    schema_option(show)
    show.add_argument("--json", action="store_true", help="print JSON")
    show.add_argument("--diagram", metavar="FILE", help="also draw it to a PNG file")

    space = commands.add_parser("space", help="work with search spaces")
    space_commands = space.add_subparsers(dest="space_command", metavar="COMMAND", required=True)
    sample = command(
        "sample", cmd_space_sample, "sample one architecture from a space config", space_commands
    )
    sample.add_argument("config", metavar="CONFIG", help="YAML file with a search_space section")
    sample.add_argument("--seed", type=int, default=0)
    schema_option(sample)
    sample.add_argument("--json", action="store_true",
                        help="JSON: spec, costs, parameter values (default: a table)")  # fmt: skip
    _study_commands(command, commands)
    _tool_commands(command, commands)
    from cost_models.latency.cli import register as register_latency_commands
    from cost_models.sharding.cli import register as register_shard_commands

    register_shard_commands(commands)
    register_latency_commands(commands)
    return parser


def _study_commands(command, commands) -> None:
    from nas import commands as handlers
    from nas.defaults import DEFAULT_STORAGE

    for name, handler, text in (
        ("search", handlers.cmd_search, "run a search study (resumes if it exists)"),
        ("worker", handlers.cmd_worker, "join a running study as one more worker"),
    ):
        sub = command(name, handler, text)
        sub.add_argument("config", metavar="CONFIG", help="study YAML (see examples/)")
        sub.add_argument("--trials", type=positive(int), help="override budget.trials")
        sub.add_argument("--no-mlflow", action="store_true", help="do not log to MLflow")

    def study_args(sub: argparse.ArgumentParser) -> None:
        sub.add_argument(
            "study", metavar="STUDY_OR_CONFIG", help="a study name, or the study's YAML"
        )
        sub.add_argument(
            "--storage", default=DEFAULT_STORAGE, help=f"for a name (default {DEFAULT_STORAGE})"
        )

    status = command("status", handlers.cmd_status, "trials done / running / failed, best so far")
    study_args(status)
    status.add_argument("--json", action="store_true")
    board = command("leaderboard", handlers.cmd_leaderboard, "best trials and the Pareto front")
    study_args(board)
    board.add_argument("--top", type=int, default=20)
    board.add_argument("--all", action="store_true", help="also failed, pruned, running trials")
    board.add_argument("--csv", action="store_true")
    board.add_argument("--json", action="store_true")
    again = command(
        "reevaluate",
        handlers.cmd_reevaluate,
        "retrain the best trials with fresh seeds; rank them by mean validation NE",
    )
    again.add_argument("config", metavar="CONFIG", help="the study's YAML")
    again.add_argument("--top", type=positive(int), default=3, help="leaderboard trials to retrain")
    again.add_argument("--seeds", type=positive(int), default=3, help="fresh seeds per trial")
    again.add_argument("--no-mlflow", action="store_true", help="do not log to MLflow")
    board = command(
        "dashboard",
        handlers.cmd_dashboard,
        "optuna-dashboard on the study storage: history, importances, parallel coordinates",
    )
    board.add_argument("config", metavar="CONFIG_OR_STORAGE", nargs="?",
                       help="a study YAML (its storage) or a storage URL "
                       f"(default: {DEFAULT_STORAGE})")  # fmt: skip
    board.add_argument("--host", default="127.0.0.1", help="bind address (loopback default)")
    board.add_argument("--port", type=int, default=8080)
    baseline = commands.add_parser("baseline", help="baselines: your own models in a study")
    baseline_commands = baseline.add_subparsers(
        dest="baseline_command", metavar="COMMAND", required=True
    )
    add = command(
        "add",
        handlers.cmd_baseline_add,
        "train a preset or architecture file as the study trains a trial and add it as a "
        "baseline (the study may be running or finished)",
        baseline_commands,
    )
    add.add_argument("config", metavar="CONFIG", help="the study's YAML")
    add.add_argument("baselines", metavar="PRESET_OR_FILE", nargs="+",
                     help="preset names (ranknas presets) or architecture JSON files")  # fmt: skip
    add.add_argument("--no-mlflow", action="store_true", help="do not log to MLflow")
    export = command("export", handlers.cmd_export, "export a trial: spec, weights, module")
    study_args(export)
    export.add_argument("--trial", default="best", help="'best' or a trial number")
    export.add_argument("--out", required=True, help="output directory")
    export.add_argument("--register", metavar="NAME", help="register in the MLflow registry")
    export.add_argument("--tracking-uri", default="http://127.0.0.1:5000")
    export.add_argument("--force", action="store_true",
                        help="export a diverged trial (validation NE >= 1) anyway")  # fmt: skip


def _tool_commands(command, commands) -> None:
    from nas import commands as handlers
    from trainers.config import TrainConfig

    mlflow = command("mlflow", handlers.cmd_mlflow, "start, check or stop the MLflow server")
    mlflow.add_argument("action", choices=["up", "status", "down"])
    mlflow.add_argument("--data-dir", default="ranknas-data/mlflow")
    mlflow.add_argument("--host", default="127.0.0.1", help="bind address (loopback default)")
    mlflow.add_argument("--port", type=int, default=5000)
    mlflow.add_argument("--backend-store-uri", help="default: sqlite under --data-dir")
    mlflow.add_argument("--auth", action="store_true", help="MLflow's basic-auth app")
    mlflow.add_argument("--insecure", action="store_true",
                        help="allow a non-loopback --host without --auth")  # fmt: skip

    train = command("train", handlers.cmd_train, "train one architecture and print its metrics")
    train.add_argument("--arch", required=True, metavar="PRESET_OR_FILE")
    train.add_argument("--data", default="synthetic", help="synthetic | criteo:PATH | PATH")
    train.add_argument("--schema", help="schema YAML for CSV/Parquet data")
    train.add_argument("--rows", type=positive(int), default=200_000, help="synthetic rows")
    train.add_argument("--examples", type=positive(int), help="budget: training examples")
    train.add_argument("--epochs", type=positive(float),
                       help="budget: passes over the training split")  # fmt: skip
    train.add_argument("--seconds", type=positive(float), help="budget: training seconds")
    defaults = TrainConfig()  # the defaults studies train with, too
    train.add_argument("--batch-size", type=positive(int), default=defaults.batch_size)
    train.add_argument("--dense-lr", type=float, default=defaults.dense_lr, help="Adam lr")
    train.add_argument("--sparse-lr", type=float, default=defaults.sparse_lr, help="Adagrad lr")
    train.add_argument("--evals", type=positive(int), default=defaults.evals,
                       help="validation evaluations over the budget")  # fmt: skip
    train.add_argument("--patience", type=int, default=defaults.early_stopping_patience,
                       help="early stopping: evaluations without improvement (0: off); the "
                       "run ends with the best evaluation's weights")  # fmt: skip
    train.add_argument("--device", default="auto")
    train.add_argument("--threads", type=positive(int), default=1, help="CPU threads (1 is fastest "
                       "for small models; more processes use more cores)")  # fmt: skip
    train.add_argument("--seed", type=int, default=0, help="training seed (initialization, "
                       "batch order); the data does not move with it")  # fmt: skip
    train.add_argument("--preprocessing", choices=["auto", "none"], default="auto",
                       help="auto: a file's dense columns log1p'd where count-like, "
                       "standardized and clipped with training statistics")  # fmt: skip
    train.add_argument("--data-seed", type=int, default=0,
                       help="synthetic rows and the random split")  # fmt: skip
    train.add_argument("--split", default="auto", metavar="auto|random|ordered|time[:COL]",
                       help="how rows become train/validation/test (80/10/10): auto is random "
                       "for synthetic data, time if the schema names a time column, else the "
                       "file's order")  # fmt: skip
    train.add_argument("--stream", action="store_true",
                       help="data bigger than memory: read --data (a Parquet directory or file, "
                       "or criteo:PATH) in chunks; split in file order")  # fmt: skip
    train.add_argument("--min-count", type=int, default=1,
                       help="--stream: values seen fewer times are out of vocabulary")  # fmt: skip
    train.add_argument("--hash-size", type=int,
                       help="--stream: hash ids into this many buckets (huge "
                       "vocabularies)")  # fmt: skip
    train.add_argument("--json", action="store_true", help="print one JSON object")

    data = commands.add_parser("data", help="data sets")
    data_commands = data.add_subparsers(dest="data_command", metavar="COMMAND", required=True)
    infer = command(
        "schema", handlers.cmd_data_schema, "print a schema YAML for a data file", data_commands
    )
    infer.add_argument("file", metavar="FILE", help="a .csv or .parquet file")
    infer.add_argument("--label", required=True, help="the click (0/1) column")
    infer.add_argument("--time", help="the event-time column, for time-ordered splits")
    synth = command("synth", handlers.cmd_data_synth, "write a synthetic data set", data_commands)
    synth.add_argument("--out", required=True)
    synth.add_argument("--rows", type=positive(int), default=200_000)
    synth.add_argument("--seed", type=int, default=0)
    synth.add_argument("--format", choices=["parquet", "csv", "criteo"], default="parquet",
                       help="criteo: data.tsv in Criteo's format (13 counts, 26 hex ids), "
                       "written piece by piece (any size)")  # fmt: skip


def positive(kind: type) -> Callable[[str], Any]:
    """An argparse type: a number of `kind` above 0 (argparse names the option and exits 2)."""

    def parse(text: str) -> Any:
        try:
            value = kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected a number, got {text!r}") from None
        if not value > 0:
            raise argparse.ArgumentTypeError(f"must be above 0, got {text}")
        return value

    parse.__name__ = kind.__name__  # argparse's message names the type
    return parse


def _interrupt(signum: int, frame: object) -> None:
    raise KeyboardInterrupt


def main(argv: Sequence[str] | None = None) -> int:
    # torchrec 1.8 calls a torch.fx helper that torch 2.13 warns about; it is not actionable.
    logging.getLogger("torch.fx._symbolic_trace").setLevel(logging.ERROR)
    args = build_parser().parse_args(argv)
    library_logs(args.verbose)
    signal.signal(signal.SIGTERM, _interrupt)  # a `kill` stops as cleanly as Ctrl-C
    try:
        progress.configure(enabled=True)  # bars on a terminal, periodic lines elsewhere
        return args.handler(args)
    except RanknasError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("\ninterrupted: run the same command again to resume", file=sys.stderr)
        return 130
    except BrokenPipeError:  # output piped into `head` and the like
        sys.stderr.close()
        return 0
    finally:
        progress.configure(enabled=False)  # for callers that go on (tests)


def library_logs(verbose: bool) -> None:
    """The libraries' info lines and bars (Optuna's, MLflow's) only with -v; their
    warnings always."""
    import optuna  # its logger resets its own level when first used: set it through it

    optuna.logging.set_verbosity(optuna.logging.INFO if verbose else optuna.logging.WARNING)
    level = logging.INFO if verbose else logging.WARNING
    for name in ("mlflow", "alembic"):
        logging.getLogger(name).setLevel(level)
    if not verbose:
        # MLflow sets its logger's level from this variable when it is imported, later
        os.environ.setdefault("MLFLOW_LOGGING_LEVEL", "WARNING")
        os.environ.setdefault("MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR", "false")
        os.environ.setdefault("MLFLOW_SUPPRESS_PRINTING_URL_TO_STDOUT", "true")  # "View run"


if __name__ == "__main__":
    sys.exit(main())
