"""`ranknas latency measure|fit|predict`: the parser only; the handlers (`commands`) import
torch when a command runs, so that `--help` is quick."""

from __future__ import annotations

import argparse
from collections.abc import Callable

from cost_models import lazy_handler


def _handler(name: str) -> Callable[[argparse.Namespace], int]:
    return lazy_handler("cost_models.latency.commands", name)


def register(commands: argparse._SubParsersAction) -> None:
    """Add `latency measure|fit|predict` to a subparsers object."""
    latency = commands.add_parser("latency", help="architecture latency: measure, fit, predict")
    sub = latency.add_subparsers(dest="latency_command", metavar="COMMAND", required=True)

    measure = sub.add_parser("measure", help="time an architecture's forward and training step")
    _arch_options(measure)
    _measure_options(measure)
    measure.add_argument("--json", action="store_true", help="print JSON")
    measure.set_defaults(handler=_handler("cmd_measure"))

    fit = sub.add_parser("fit", help="measure sampled architectures and fit a predictor")
    fit.add_argument("space", metavar="SPACE", help="YAML file with a search_space section")
    fit.add_argument("--archs", type=int, default=100, help="architectures to measure")
    fit.add_argument("--out", required=True, help="predictor JSON file to write")
    fit.add_argument("--holdout", type=float, default=0.25, help="share held out to evaluate")
    fit.add_argument("--seed", type=int, default=0)
    fit.add_argument("--schema", help="dataset schema YAML (default: the synthetic data)")
    _measure_options(fit)
    fit.set_defaults(handler=_handler("cmd_fit"))

    predict = sub.add_parser("predict", help="predict an architecture's forward latency")
    predict.add_argument("predictor", metavar="FILE", help="predictor JSON (`latency fit`)")
    _arch_options(predict)
    predict.add_argument("--json", action="store_true", help="print JSON")
    predict.set_defaults(handler=_handler("cmd_predict"))


def _arch_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("arch", metavar="NAME_OR_FILE", help="a preset name or a spec JSON file")
    parser.add_argument("--schema", help="dataset schema YAML (default: the synthetic data)")


def _measure_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--batch-size", type=int, default=512)
    parser.add_argument("--device", default="cpu", help="cpu | cuda | cuda:N")
    parser.add_argument("--threads", type=int, default=1, help="CPU threads")
    parser.add_argument("--repeats", type=int, default=15, help="timed runs (median)")
