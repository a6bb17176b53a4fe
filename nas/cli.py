"""The `ranknas` command line.

Every user mistake raises `RanknasError`; `main` prints its message and exits 2, so a
person sees what to fix, never a traceback. Anything else is a bug and keeps its traceback.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import os
import signal
import sys
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

from search_space import arguments
from search_space.arguments import positive
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
    rows, records, refused = [], [], []
    for name, factory in PRESETS.items():
        try:
            analysis = analyze(preset(name, schema))
        except RanknasError as exc:  # DLRM on a schema without categorical columns
            refused.append(f"{name}: {exc}")
            continue
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
    for line in refused:  # the rest are listed: one that cannot read the data hid them all
        print(f"not on this data: {line}", file=sys.stderr)
    if args.json:
        print(json.dumps(records, indent=2))
    else:
        print(f"presets on dataset {schema.name!r} (FLOPs and params per example):")
        header = ["name", "FLOPs", "params", "emb.params", "description"]
        print(align(header, [[str(c) for c in r] for r in rows]))
        print("emb.params: tables sized by the schema's cardinalities; a study sizes a "
              "vocabulary column's table by its training split's values (fewer)")  # fmt: skip
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
        f"inputs: dense[{arch.num_dense}], {len(emb.used)} features x dim {emb.dim}"
        + _own_dims(emb),
        align(header, rows),
        f"total: {_human(report['flops'])} FLOPs/example, {_human(report['dense_params'])} "
        f"dense params, {_human(report['embedding_params'])} embedding params "
        f"(head: {arch.output_block} -> logit)",
    ])  # fmt: skip


def _own_dims(emb) -> str:
    """The features of a dim of their own, and those left out: " (c9 at 16; left out: c2)"."""
    own = [f"{f.name} at {f.dim}" for f in emb.features if f.dim not in (None, 0, emb.dim)]
    out = [f.name for f in emb.features if f.dim == 0]
    parts = [", ".join(own)] if own else []
    parts += [f"left out: {', '.join(out)}"] if out else []
    return f" ({'; '.join(parts)})" if parts else ""


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


class HelpFormatter(argparse.ArgumentDefaultsHelpFormatter):
    """Every option's help ends with its default, except where there is none to show (no
    default, or a flag's False)."""

    def _get_help_string(self, action: argparse.Action) -> str | None:
        if action.default is None or action.default is False:
            return action.help
        return super()._get_help_string(action)


class Parser(argparse.ArgumentParser):
    """The `ranknas` parser. Its subparsers are made of the parser's own class (argparse's
    `parser_class` default), so every command's `--help` shows the defaults too."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        kwargs.setdefault("formatter_class", HelpFormatter)
        super().__init__(*args, **kwargs)


def build_parser() -> argparse.ArgumentParser:
    parser = Parser(
        prog="ranknas",
        description="Neural-architecture search for ranking and recommendation models.",
    )
    parser.add_argument("-v", "--verbose", action="store_true",
                        help="also show the libraries' info messages (Optuna, MLflow)")  # fmt: skip
    commands = parser.add_subparsers(dest="command", metavar="COMMAND", required=True,
                                     help="`ranknas COMMAND --help` shows its options")  # fmt: skip

    def command(name: str, handler: Handler, help: str, parent=commands):
        sub = parent.add_parser(name, **arguments.said(help))
        sub.set_defaults(handler=handler)
        return sub

    def schema_option(sub: argparse.ArgumentParser) -> None:
        sub.add_argument(
            "--schema", metavar="FILE",
            help="dataset schema YAML: its dense and categorical features size the model "
            "(default: the built-in synthetic data's schema)",
        )  # fmt: skip

    presets = command("presets", cmd_presets, "list the engineer presets with their costs")
    schema_option(presets)
    presets.add_argument("--json", action="store_true", help="print JSON instead of a table")

    arch = commands.add_parser("arch", **arguments.said("inspect architectures"))
    arch_commands = arch.add_subparsers(dest="arch_command", metavar="COMMAND", required=True,
                                        help="what to do")  # fmt: skip
    show = command("show", cmd_arch_show, "print a spec with its FLOPs and params", arch_commands)
    show.add_argument("arch", metavar="NAME_OR_FILE",
                      help="a preset name (`ranknas presets`) or an architecture "
                      "JSON file")  # fmt: skip
    schema_option(show)
    show.add_argument("--json", action="store_true",
                      help="print JSON (spec, digest, per-block costs) instead of a "
                      "table")  # fmt: skip
    show.add_argument(
        "--diagram",
        type=arguments.output_file,
        metavar="FILE",
        help="also draw the graph to this PNG file",
    )

    space = commands.add_parser("space", **arguments.said("work with search spaces"))
    space_commands = space.add_subparsers(dest="space_command", metavar="COMMAND", required=True,
                                          help="what to do")  # fmt: skip
    sample = command(
        "sample", cmd_space_sample, "sample one architecture from a space config", space_commands
    )
    sample.add_argument("config", metavar="CONFIG", help="YAML file with a search_space section")
    sample.add_argument("--seed", type=arguments.seed, default=0,
                        help="random seed of the draw; the same seed gives the same "
                        "architecture")  # fmt: skip
    schema_option(sample)
    sample.add_argument("--json", action="store_true",
                        help="print JSON (spec, costs, the sampled parameter values) "
                        "instead of a table")  # fmt: skip
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
        (
            "worker",
            handlers.cmd_worker,
            "join a running study with more workers (one, or "
            "--workers N, or the config's workers.count)",
        ),
    ):
        sub = command(name, handler, text)
        sub.set_defaults(resumes=True)
        sub.add_argument("config", metavar="CONFIG", help="the study's YAML (see examples/)")
        sub.add_argument("--trials", type=positive(int), metavar="N",
                         help="trials in all, done ones included (default: the config's "
                         "budget.trials)")  # fmt: skip
        sub.add_argument("--no-mlflow", action="store_true",
                         help="do not log the trials to MLflow")  # fmt: skip
        sub.add_argument("--workers", type=positive(int), metavar="N",
                         help="worker processes to start on the study, spread over the GPUs "
                         "(several per GPU when N is larger) or splitting the CPU cores "
                         "(default: the config's workers.count, else 1)")  # fmt: skip
        sub.add_argument(
            "--threads",
            type=arguments.number(int, minimum=1),
            metavar="T",
            help="torch CPU threads per worker (default: training.threads)",
        )
        sub.add_argument("--one-worker", action="store_true", help=argparse.SUPPRESS)
        if name == "worker":
            sub.add_argument("--wait", type=arguments.number(float, minimum=0), default=0,
                             metavar="SECONDS",
                             help="wait up to SECONDS for `ranknas search` to create the study "
                             "(it does once its data has loaded), for workers started "
                             "together with it (0: refused at once)")  # fmt: skip

    def study_args(sub: argparse.ArgumentParser) -> None:
        sub.add_argument(
            "study", metavar="STUDY_OR_CONFIG",
            help="a study name (looked up in --storage), or the study's YAML (.yaml/.yml: its "
            "name and storage)",
        )  # fmt: skip
        sub.add_argument("--storage", metavar="URL", type=_storage_url,
                         help="Optuna storage URL that holds the study (default: the YAML's, "
                         f"else {DEFAULT_STORAGE})")  # fmt: skip

    status = command("status", handlers.cmd_status, "trials done / running / failed, best so far")
    study_args(status)
    status.add_argument("--json", action="store_true",
                        help="print JSON (trial counts, budget, best trial, verdict)")  # fmt: skip
    board = command("leaderboard", handlers.cmd_leaderboard, "best trials and the Pareto front")
    study_args(board)
    board.add_argument("--top", type=positive(int), default=20, metavar="K",
                       help="trials to list, best first")  # fmt: skip
    board.add_argument("--all", action="store_true",
                       help="also list failed, pruned and running trials")  # fmt: skip
    form = board.add_mutually_exclusive_group()
    form.add_argument("--csv", action="store_true",
                      help="print the leaderboard with the baselines as CSV")  # fmt: skip
    form.add_argument("--json", action="store_true",
                      help="print JSON: leaderboard, Pareto front, baselines, verdict")  # fmt: skip
    again = command(
        "reevaluate",
        handlers.cmd_reevaluate,
        "retrain the best trials with fresh seeds; rank them by mean validation NE",
    )
    again.set_defaults(resumes=True)  # the runs recorded are not made again
    again.add_argument("config", metavar="CONFIG", help="the study's YAML")
    again.add_argument("--top", type=positive(int), default=3, metavar="K",
                       help="trials to retrain: those with the best recorded runs")  # fmt: skip
    again.add_argument("--seeds", type=positive(int), default=3, metavar="N",
                       help="fresh training seeds per trial")  # fmt: skip
    again.add_argument("--baselines", type=arguments.number(int, minimum=0), metavar="K",
                       help="best baselines to retrain (default: all; the verdict compares "
                       "only those with seed means)")  # fmt: skip
    again.add_argument("--front", action="store_true",
                       help="also retrain the Pareto front's trials cheaper than the best "
                       "baseline (its cost, up to 1%% worse NE): the verdict then names the "
                       "cheapest at its NE")  # fmt: skip
    again.add_argument("--no-mlflow", action="store_true",
                       help="do not log the retrains to MLflow")  # fmt: skip
    sure = command(
        "confirm",
        handlers.cmd_confirm,
        "retrain the verdict's pair on seeds that chose nothing; the verdict tests it there",
    )
    sure.set_defaults(resumes=True)
    sure.add_argument("config", metavar="CONFIG", help="the study's YAML")
    sure.add_argument("--seeds", type=arguments.number(int, minimum=2), default=5, metavar="N",
                      help="seeds per side (the first N of the confirmation's; more than "
                      "before trains only the new ones)")  # fmt: skip
    sure.add_argument("--no-mlflow", action="store_true",
                      help="do not log the confirmation to MLflow")  # fmt: skip
    board = command(
        "dashboard",
        handlers.cmd_dashboard,
        "optuna-dashboard on the study storage: history, importances, parallel coordinates",
    )
    board.add_argument("config", metavar="CONFIG_OR_STORAGE", nargs="?",
                       help="a study YAML (its storage) or an Optuna storage URL "
                       f"(default: {DEFAULT_STORAGE})")  # fmt: skip
    board.add_argument("--host", default="127.0.0.1",
                       help="address to serve on (loopback: this machine only)")  # fmt: skip
    board.add_argument("--port", type=arguments.port, default=8080, help="TCP port to serve on")
    baseline = commands.add_parser(
        "baseline", **arguments.said("baselines: your own models in a study")
    )
    baseline_commands = baseline.add_subparsers(
        dest="baseline_command", metavar="COMMAND", required=True, help="what to do"
    )
    add = command(
        "add",
        handlers.cmd_baseline_add,
        "train a preset or architecture file as the study trains a trial and add it as a "
        "baseline (the study may be running or finished)",
        baseline_commands,
    )
    add.set_defaults(resumes=True)  # the baselines recorded are not trained again
    add.add_argument("config", metavar="CONFIG", help="the study's YAML")
    add.add_argument("baselines", metavar="PRESET_OR_FILE", nargs="+",
                     help="preset names (`ranknas presets`) or architecture JSON "
                     "files")  # fmt: skip
    add.add_argument("--no-mlflow", action="store_true",
                     help="do not log the baselines' runs to MLflow")  # fmt: skip
    export = command("export", handlers.cmd_export, "export a trial: spec, weights, module")
    study_args(export)
    export.add_argument("--trial", default="best", metavar="best|N|baseline:KEY",
                        help="which model: 'best' (the one `status` names: the best "
                        "mean validation NE of the re-evaluated trials, or a cheaper one the "
                        "seeds show equal; else the best first objective), a trial "
                        "number, or a baseline's recorded run (baseline:dcnv2: at its tuned "
                        "recipe)")  # fmt: skip
    export.add_argument("--out", type=arguments.output_dir, required=True, metavar="DIR",
                        help="directory to write the spec, weights and module to")  # fmt: skip
    export.add_argument("--register", metavar="NAME",
                        help="also register the model under NAME in the MLflow "
                        "registry")  # fmt: skip
    export.add_argument("--alias", metavar="NAME",
                        help="the registry alias --register points at the version (default: "
                        "champion for the study's best trial, none for another)")  # fmt: skip
    export.add_argument("--tracking-uri", metavar="URI",
                        help="MLflow server for --register (default: the study config's, "
                        "else $MLFLOW_TRACKING_URI, else http://127.0.0.1:5000)")  # fmt: skip
    export.add_argument("--force", action="store_true",
                        help="export a diverged trial (validation NE >= 1) anyway, or into "
                        "a directory that holds other files or another model's export "
                        "(never a study's own)")  # fmt: skip


def _tool_commands(command, commands) -> None:
    from nas import commands as handlers
    from trainers.config import LR_SCHEDULES, TrainConfig

    mlflow = command("mlflow", handlers.cmd_mlflow, "start, check or stop the MLflow server")
    mlflow.add_argument("action", choices=["up", "status", "down"],
                        help="up: start in the background; status: running or not (exit 1 if "
                        "not); down: stop")  # fmt: skip
    mlflow.add_argument("--data-dir", metavar="DIR", default="ranknas-data/mlflow",
                        help="the server's database, artifacts, log and pid file")  # fmt: skip
    mlflow.add_argument("--host", default="127.0.0.1",
                        help="address to serve on (loopback: this machine only)")  # fmt: skip
    mlflow.add_argument("--port", type=arguments.port,
                        help="TCP port to serve on (up: default 5000; status, down: the data "
                        "dir's server's, wherever it runs)")  # fmt: skip
    mlflow.add_argument("--backend-store-uri", metavar="URI",
                        help="tracking database, e.g. postgresql://... (default: "
                        "sqlite:///DATA_DIR/mlflow.db)")  # fmt: skip
    mlflow.add_argument("--auth", action="store_true",
                        help="require a login (MLflow's basic-auth app)")  # fmt: skip
    mlflow.add_argument("--insecure", action="store_true",
                        help="allow a non-loopback --host without --auth")  # fmt: skip

    train = command("train", handlers.cmd_train, "train one architecture and print its metrics")
    train.add_argument("--arch", required=True, metavar="PRESET_OR_FILE",
                       help="a preset name (`ranknas presets`) or an architecture "
                       "JSON file")  # fmt: skip
    train.add_argument("--data", default="synthetic", metavar="synthetic|criteo:PATH|PATH",
                       help="synthetic: built-in generated rows; criteo:PATH: a Criteo TSV; "
                       "PATH: a .csv or .parquet file, or a directory of Parquet files "
                       "(needs --schema)")  # fmt: skip
    train.add_argument("--schema", metavar="FILE",
                       help="schema YAML for CSV/Parquet data (`ranknas data schema` "
                       "infers one)")  # fmt: skip
    train.add_argument("--rows", type=positive(int), default=200_000,
                       help="rows to generate for --data synthetic")  # fmt: skip
    size = train.add_mutually_exclusive_group()  # one run's size, as a study's budget
    size.add_argument("--examples", type=positive(int), metavar="N",
                      help="budget: training examples, in whole batches (rounded down to "
                      "a multiple of the batch size, at least one batch)")  # fmt: skip
    size.add_argument("--epochs", type=positive(float), metavar="E",
                      help="budget: passes over the training split (may be fractional; "
                      "instead of --examples)")  # fmt: skip
    train.add_argument("--seconds", type=positive(float), metavar="S",
                       help="budget: training seconds, evaluations excluded (the first budget "
                       "reached ends the run); with none, epochs until one does not improve "
                       "on the validation NE (at most 10, each with its own cosine lr; one "
                       "epoch with --stream)")  # fmt: skip
    defaults = TrainConfig()  # the defaults studies train with, too
    train.add_argument("--batch-size", type=positive(int), default=defaults.batch_size,
                       help="training examples per step")  # fmt: skip
    train.add_argument("--dense-lr", type=positive(float), default=defaults.dense_lr,
                       help="learning rate of the dense layers (Adam)")  # fmt: skip
    train.add_argument("--lr-schedule", choices=LR_SCHEDULES,
                       help="the dense lr over the run: cosine from --dense-lr to 0 over the "
                       "budget (the default with a budget), cosine_restarts: over each "
                       "evaluation's interval (the default without), or constant")  # fmt: skip
    train.add_argument("--sparse-lr", type=positive(float), default=defaults.sparse_lr,
                       help="learning rate of the embedding tables (Adagrad)")  # fmt: skip
    train.add_argument("--evals", type=positive(int),
                       help=f"validation evaluations over the budget (default: {defaults.evals}; "
                       "without a budget, one per epoch)")  # fmt: skip
    train.add_argument("--patience", type=arguments.number(int, minimum=0),
                       help="early stopping: evaluations without improvement (0: off; default: "
                       f"{defaults.early_stopping_patience}, without a budget 1); the run ends "
                       "with the best evaluation's weights")  # fmt: skip
    train.add_argument("--device", type=arguments.device, default=defaults.device,
                       metavar="auto|cpu|cuda|cuda:N",
                       help="where to train; auto: CUDA if available, else CPU")  # fmt: skip
    train.add_argument("--threads", type=positive(int), default=1, help="CPU threads (1 is fastest "
                       "for small models; more processes use more cores)")  # fmt: skip
    train.add_argument("--seed", type=arguments.seed, default=0,
                       help="training seed (initialization, "
                       "batch order); the data does not move with it")  # fmt: skip
    train.add_argument("--preprocessing", choices=["auto", "none"], default="auto",
                       help="auto: a file's dense columns log1p'd where count-like, "
                       "standardized and clipped with training statistics")  # fmt: skip
    train.add_argument("--data-seed", type=arguments.seed, default=0,
                       help="synthetic rows and the random split")  # fmt: skip
    train.add_argument("--split", default="auto", metavar="auto|random|ordered|time[:COL]",
                       help="how rows become train/validation/test (80/10/10): auto is random "
                       "for synthetic data, time if the schema names a time column, else the "
                       "file's order")  # fmt: skip
    train.add_argument("--max-bad-rows", type=arguments.number(int, minimum=0), default=1000,
                       metavar="N", help="a file's malformed rows the load skips before it "
                       "stops (as data.max_bad_rows)")  # fmt: skip
    train.add_argument("--max-bad-fraction", type=arguments.number(float, minimum=0, maximum=1),
                       default=0.01, metavar="F", help="the share of malformed rows it skips "
                       "(as data.max_bad_fraction)")  # fmt: skip
    train.add_argument("--stream", action="store_true",
                       help="data bigger than memory: read --data (a Parquet directory or file, "
                       "or criteo:PATH) in chunks; split in file order")  # fmt: skip
    train.add_argument("--min-count", type=positive(int), default=1, metavar="N",
                       help="--stream: ids seen fewer than N times in the training split are "
                       "out of vocabulary")  # fmt: skip
    train.add_argument("--hash-size", type=arguments.number(int, minimum=2), metavar="N",
                       help="--stream: hash ids into N buckets instead of a vocabulary (huge "
                       "vocabularies)")  # fmt: skip
    train.add_argument("--cache-dir", metavar="DIR",
                       help="--stream: where the row cache of encoded rows lives (default: "
                       ".ranknas-cache/ beside the data)")  # fmt: skip
    train.add_argument("--no-cache", action="store_true",
                       help="--stream: parse the files on every pass instead of caching the "
                       "encoded rows")  # fmt: skip
    train.add_argument("--json", action="store_true",
                       help="print the metrics as one JSON object instead of lines")  # fmt: skip

    data = commands.add_parser("data", **arguments.said("data sets"))
    data_commands = data.add_subparsers(dest="data_command", metavar="COMMAND", required=True,
                                        help="what to do")  # fmt: skip
    infer = command(
        "schema", handlers.cmd_data_schema,
        "print a schema YAML for a data file, or a study's data", data_commands,
    )  # fmt: skip
    infer.add_argument("file", metavar="FILE",
                       help="a .csv/.tsv (or .csv.gz ...) or .parquet file, a directory of "
                       "Parquet files (Hive partitions: ds=.../); or a study YAML: its "
                       "training data's schema (a synthetic set's too)")  # fmt: skip
    infer.add_argument("--label", metavar="COLUMN",
                       help="the label column (clicks, 0/1) of a data file")  # fmt: skip
    infer.add_argument("--time", metavar="COLUMN",
                       help="the event-time column, for time-ordered splits")  # fmt: skip
    synth = command("synth", handlers.cmd_data_synth, "write a synthetic data set", data_commands)
    synth.add_argument("--out", type=arguments.output_dir, required=True, metavar="DIR",
                       help="directory to write to (parquet, csv: with schema.yaml and "
                       "stats.json)")  # fmt: skip
    synth.add_argument("--rows", type=positive(int), default=200_000, help="rows to generate")
    synth.add_argument("--seed", type=arguments.seed, default=0,
                       help="generator seed; the same seed gives the same rows")  # fmt: skip
    synth.add_argument("--format", choices=["parquet", "csv", "criteo"], default="parquet",
                       help="criteo: data.tsv in Criteo's format (13 counts, 26 hex ids), "
                       "written piece by piece (any size)")  # fmt: skip


class Terminated(KeyboardInterrupt):
    """A SIGTERM (`kill PID`, a scheduler's stop): the command stops as Ctrl-C stops it
    and exits 143 (128 + 15), as a process ended by SIGTERM reports itself (130: Ctrl-C)."""


INTERRUPTED_EXITS = (130, 143)  # Ctrl-C (SIGINT), SIGTERM


def _interrupt(signum: int, frame: object) -> None:
    raise Terminated if signum == signal.SIGTERM else KeyboardInterrupt


def _interrupt_once(signum: int, frame: object) -> None:
    """A launch's worker stops at the first SIGINT or SIGTERM and ignores the rest: a
    terminal's Ctrl-C reaches it and the launcher then sends its own (`launch._stop`), and
    that second one cut the recording of the interrupted trial short (left RUNNING, failed
    later as "died") or landed in the interpreter's exit (a KeyboardInterrupt traceback in
    an atexit callback). The launcher kills a worker that does not end in time."""
    for number in (signal.SIGINT, signal.SIGTERM):
        signal.signal(number, signal.SIG_IGN)
    _interrupt(signum, frame)


def _profiled(handler, args: argparse.Namespace) -> int:
    """The command, under cProfile where RANKNAS_PROFILE names a folder: each process (a
    study's workers too) writes its own `COMMAND-PID.prof` there, for `pstats`."""
    folder = os.environ.get("RANKNAS_PROFILE")
    if not folder:
        return handler(args)
    import cProfile

    profiler = cProfile.Profile()
    try:
        return profiler.runcall(handler, args)
    finally:
        Path(folder).mkdir(parents=True, exist_ok=True)
        profiler.dump_stats(Path(folder) / f"{args.command}-{os.getpid()}.prof")


class _ReaderGone:
    """Standard output or error that, once the reader of its pipe stops reading (`... |
    head`, `2>&1 | head`), goes to /dev/null: the command finishes its work (a study, its
    records) instead of stopping, or failing its trials, at its next line of progress."""

    def __init__(self, stream: Any) -> None:
        self._stream = stream

    def write(self, text: str) -> int:
        try:
            return self._stream.write(text)
        except BrokenPipeError:
            self._gone()
            return len(text)

    def flush(self) -> None:
        try:
            self._stream.flush()
        except BrokenPipeError:
            self._gone()

    def _gone(self) -> None:
        _to_devnull(self._stream.fileno())

    def __getattr__(self, name: str) -> Any:
        return getattr(self._stream, name)


def _to_devnull(fd: int) -> None:
    null = os.open(os.devnull, os.O_WRONLY)
    os.dup2(null, fd)
    os.close(null)


@contextlib.contextmanager
def _readers_may_go() -> Iterator[None]:
    """The process's own standard output and error as `_ReaderGone` while the command runs
    (not a caller's replacement of them: a test's capture, say)."""
    streams = {"stdout": sys.__stdout__, "stderr": sys.__stderr__}
    own = [n for n, s in streams.items() if s is not None and getattr(sys, n) is s]
    for name in own:
        setattr(sys, name, _ReaderGone(streams[name]))
    try:
        yield
    finally:
        for name in own:
            setattr(sys, name, streams[name])


def _storage_url(url: str) -> str:
    from nas.storage import standard_url  # imports the database drivers: only when given

    return standard_url(url)


def main(argv: Sequence[str] | None = None) -> int:
    # torchrec 1.8 calls a torch.fx helper that torch 2.13 warns about; it is not actionable.
    logging.getLogger("torch.fx._symbolic_trace").setLevel(logging.ERROR)
    args = build_parser().parse_args(argv)
    library_logs(args.verbose)
    signal.signal(signal.SIGTERM, _interrupt)  # a `kill` stops as cleanly as Ctrl-C
    if getattr(args, "one_worker", False):
        # the launcher stops its workers with SIGINT, also when it was itself started with
        # SIGINT ignored (a shell's background job, which its children inherit); only the
        # first signal counts (`_interrupt_once`)
        signal.signal(signal.SIGINT, _interrupt_once)
        signal.signal(signal.SIGTERM, _interrupt_once)
    try:
        progress.configure(enabled=True)  # bars on a terminal, periodic lines elsewhere
        with _readers_may_go():
            return _profiled(args.handler, args)
    except RanknasError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    except BrokenPipeError:  # output piped into `head` and the like, which stopped reading
        _to_devnull(sys.stdout.fileno())  # no error at exit
        return 0
    except Exception as exc:
        from nas.commands import storage_failure

        if not storage_failure(exc):
            raise
        cause = " ".join(str(exc.__cause__ or exc).split())[:200]
        print(f"error: the study's storage failed to record ({cause}); is its disk full or "
              "its server down? Free space or restart it, then run the same command again "
              "to resume", file=sys.stderr)  # fmt: skip
        return 2
    except KeyboardInterrupt as exc:
        print(f"\n{interrupted(args)}", file=sys.stderr)
        return INTERRUPTED_EXITS[isinstance(exc, Terminated)]
    finally:
        progress.configure(enabled=False)  # for callers that go on (tests)


def interrupted(args: argparse.Namespace) -> str:
    """What Ctrl-C says: a study's commands (`resumes`) pick up where they stopped; the
    others (`train`) would start over, so resuming is not offered."""
    if getattr(args, "resumes", False):
        return "interrupted: run the same command again to resume"
    return "interrupted"


def library_logs(verbose: bool) -> None:
    """The libraries' info lines and bars (Optuna's, MLflow's) only with -v; their
    warnings always."""
    import optuna  # its logger resets its own level when first used: set it through it

    # before an import's stray `logging.info` (fbgemm_gpu's) configures the root logger with
    # Python's default "WARNING:trainers.data.tabular:..." lines
    logging.basicConfig(format="%(levelname)s: %(message)s")

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
