"""Progress display: tqdm bars on a terminal, periodic plain lines elsewhere, the lines that
tests and logs parse unchanged, and the libraries' own log lines only with `-v`."""

import io
import json
import re
import subprocess
import sys

import pytest

from nas.cli import main
from study_helpers import tiny_config, write_config
from trainers import progress
from trainers.data import SyntheticConfig, generate_synthetic

ESCAPES = re.compile(r"[\r\x1b]")  # a carriage return or an ANSI escape code


@pytest.fixture(autouse=True)
def display_off_afterwards():
    yield
    progress.configure(enabled=False)


def test_cli_train_off_a_terminal_prints_periodic_lines_and_its_json(capsys, monkeypatch):
    monkeypatch.setenv("RANKNAS_PROGRESS_SECONDS", "0")  # a line at every update
    code = main(["train", "--arch", "dlrm", "--rows", "4000", "--epochs", "2",
                 "--batch-size", "128", "--json"])  # fmt: skip
    assert code == 0
    captured = capsys.readouterr()
    assert json.loads(captured.out)["status"] == "complete"  # stdout: the JSON alone
    lines = [x for x in captured.err.splitlines() if x.startswith("train dlrm: ")]
    assert len(lines) >= 10 and not ESCAPES.search(captured.err)
    assert re.fullmatch(r"train dlrm: \d+% \([\d,]+/[\d,]+ examples\), .*s elapsed.*", lines[-1])
    assert any("loss 0." in x for x in lines) and any("val NE 0." in x for x in lines)


def test_search_off_a_terminal_keeps_its_trial_lines_and_adds_the_trials_lines(
    tmp_path, capsys, monkeypatch
):
    monkeypatch.setenv("RANKNAS_PROGRESS_SECONDS", "0")
    config = tiny_config(tmp_path, "shown", budget={"trials": 2, "epochs_per_trial": 2})
    assert main(["search", str(write_config(tmp_path, config))]) == 0
    captured = capsys.readouterr()
    out = captured.out.splitlines()
    assert [x.split()[0] for x in out if x.startswith("[")] == ["[1/2]", "[2/2]"]
    assert any(x.startswith("trial 0: ") for x in captured.err.splitlines())
    assert any(x.startswith("trial 1: ") for x in captured.err.splitlines())
    assert not ESCAPES.search(captured.out + captured.err)
    assert "study shown" not in captured.err  # the trials bar: silent off a terminal


def test_a_bar_is_lines_off_a_terminal_tqdm_on_one_and_nothing_when_off():
    stream = io.StringIO()
    progress.configure(stream=stream, line_seconds=0)
    with progress.bar(1000, "run", "examples") as bar:
        for _ in range(4):
            bar.update(250)
            bar.show("loss", 0.5)
    assert (
        stream.getvalue()
        .splitlines()[-1]
        .startswith("run: 100% (1,000/1,000 examples), loss 0.5000, 0s elapsed")
    )
    assert "\r" not in stream.getvalue()
    stream = io.StringIO()
    progress.configure(stream=stream, line_seconds=0)
    with progress.bar(3, "study", "trials", lines=False) as bar:  # its caller prints lines
        bar.update(3)
    assert stream.getvalue() == ""

    stream = io.StringIO()
    progress.configure(stream=stream, terminal=True)  # as on a terminal: tqdm
    with progress.bar(3, "study", "trials", initial=1) as bar:
        bar.show("best ne", 0.8765)
        bar.update(1)
        assert isinstance(bar, progress._TerminalBar)
    drawn = stream.getvalue()
    assert "\r" in drawn and "study:" in drawn and "1/3 trials" in drawn

    stream = io.StringIO()
    progress.configure(enabled=False, stream=stream)
    with progress.bar(10, "quiet") as bar:
        bar.update(10)
    assert stream.getvalue() == "" and bar.n == 10


def test_a_line_written_under_a_bar_goes_above_it_and_the_bar_is_redrawn_current(capsys):
    progress.configure(stream=sys.stderr, terminal=True)
    with progress.bar(3, "study", "trials") as bar:
        bar.update(2)  # too soon after the first draw to be drawn
        progress.write("[2/3] complete")
    out, err = capsys.readouterr()
    assert out == "[2/3] complete\n"
    assert "0/3 trials" in err and "2/3 trials" in err


def test_the_line_interval_comes_from_the_environment(monkeypatch, capsys):
    monkeypatch.setenv("RANKNAS_PROGRESS_SECONDS", "soon")
    assert main(["presets", "--json"]) == 2
    assert "RANKNAS_PROGRESS_SECONDS='soon'" in capsys.readouterr().err


def test_a_real_training_updates_its_bar_every_step():
    from search_space.builder import build_model
    from search_space.presets import preset
    from trainers.trainer import TrainConfig, train

    train_part, valid, _ = generate_synthetic(SyntheticConfig(rows=3000, seed=2)).split()
    stream = io.StringIO()
    progress.configure(stream=stream, line_seconds=0)
    model = build_model(preset("dlrm", train_part.schema), seed=0)
    config = TrainConfig(batch_size=100, max_steps=12, log_every=4, early_stopping_patience=0)
    result = train(model, train_part, valid, config=config, label="t")
    lines = stream.getvalue().splitlines()
    assert len(lines) == result.steps == 12
    assert lines[-1].startswith("t: 100% (1,200/1,200 examples), ")
    assert "loss 0." in lines[-1] and "val NE " in lines[-1]  # the last of each


LIBRARY_LINES = """
import logging, sys
from nas.cli import library_logs
library_logs(verbose=sys.argv[1] == "-v")
import mlflow, optuna  # imported after, as the commands do
logging.getLogger("mlflow.tracking").info("mlflow-info")
logging.getLogger("mlflow.tracking").warning("mlflow-warning")
optuna.logging.get_logger("optuna.study").info("optuna-info")
"""


def test_the_libraries_info_lines_only_with_verbose(monkeypatch):
    monkeypatch.delenv("MLFLOW_LOGGING_LEVEL", raising=False)
    command = [sys.executable, "-c", LIBRARY_LINES]
    runs = {
        f: subprocess.Popen([*command, f], stderr=subprocess.PIPE, text=True) for f in ("-v", "")
    }
    err = {flag: run.communicate(timeout=120)[1] for flag, run in runs.items()}
    assert "mlflow-info" in err["-v"] and "optuna-info" in err["-v"]
    assert "mlflow-info" not in err[""] and "optuna-info" not in err[""]
    assert "mlflow-warning" in err[""]
