"""`ranknas latency measure|fit|predict`: the parser only; the handlers (`commands`) import
torch when a command runs, so that `--help` is quick."""

from __future__ import annotations

import argparse
from collections.abc import Callable

from cost_models import lazy_handler
from search_space import arguments


def _handler(name: str) -> Callable[[argparse.Namespace], int]:
    return lazy_handler("cost_models.latency.commands", name)


def register(commands: argparse._SubParsersAction) -> None:
    """Add `latency measure|fit|predict` to a subparsers object."""
    latency = commands.add_parser(
        "latency", **arguments.said("architecture latency: measure, fit, predict")
    )
    sub = latency.add_subparsers(
        dest="latency_command", metavar="COMMAND", required=True, help="what to do"
    )

    measure = sub.add_parser(
        "measure", **arguments.said("time an architecture's forward and training step")
    )
    _arch_options(measure)
    _measure_options(measure)
    measure.add_argument("--json", action="store_true", help="print JSON instead of a line")
    measure.set_defaults(handler=_handler("cmd_measure"))

    fit = sub.add_parser(
        "fit", **arguments.said("measure sampled architectures and fit a predictor")
    )
    fit.add_argument("space", metavar="SPACE", help="YAML file with a search_space section")
    fit.add_argument(
        "--archs",
        type=int,
        default=100,
        metavar="N",
        help="architectures to sample and measure (at least 4)",
    )
    fit.add_argument(
        "--out",
        type=arguments.output_file,
        required=True,
        metavar="FILE",
        help="predictor JSON file to write",
    )
    fit.add_argument(
        "--holdout",
        type=float,
        default=0.25,
        metavar="SHARE",
        help="share of the architectures held out to report the predictor's "
        "error, between 0 and 1 (the saved predictor is then fitted on all)",
    )
    fit.add_argument(
        "--seed",
        type=arguments.seed,
        default=0,
        help="seed of the architecture sample and the held-out split",
    )
    _schema_option(fit)
    fit.add_argument(
        "--target",
        choices=["forward_ms", "train_step_ms", "dense_step_ms"],
        default="forward_ms",
        help="what to predict: the forward pass (objectives.latency_model), the training "
        "step, or the dense part's training step (sharding.dense_model)",
    )
    _measure_options(fit)
    fit.set_defaults(handler=_handler("cmd_fit"))

    predict = sub.add_parser("predict", **arguments.said("predict an architecture's latency"))
    predict.add_argument(
        "predictor", metavar="FILE", help="predictor JSON written by `ranknas latency fit`"
    )
    _arch_options(predict, default="the schema the predictor was fitted on")
    predict.add_argument("--json", action="store_true", help="print JSON instead of a line")
    predict.set_defaults(handler=_handler("cmd_predict"))


def _arch_options(parser: argparse.ArgumentParser, default: str = "") -> None:
    parser.add_argument(
        "arch",
        metavar="NAME_OR_FILE",
        help="a preset name (`ranknas presets`) or an architecture JSON file",
    )
    _schema_option(parser, default)


def _schema_option(parser: argparse.ArgumentParser, default: str = "") -> None:
    builtin = "the built-in synthetic data's schema"
    parser.add_argument(
        "--schema",
        metavar="FILE",
        help="dataset schema YAML: its features size the model (default: "
        f"{f'{default}, else {builtin}' if default else builtin})",
    )


def _measure_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--batch-size", type=int, default=512, help="examples per timed batch")
    parser.add_argument(
        "--device",
        type=arguments.device,
        default="cpu",
        metavar="cpu|cuda|cuda:N",
        help="device to time on",
    )
    parser.add_argument("--threads", type=int, default=1, help="CPU threads torch may use")
    parser.add_argument(
        "--repeats",
        type=int,
        default=15,
        metavar="N",
        help="timed runs per measurement; the median is kept",
    )
