"""The command line as a person uses it: help, presets, arch show, clear errors."""

import argparse
import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from unittest import mock

import pytest

from nas.cli import build_parser, main
from search_space.presets import PRESETS
from study_helpers import recorded_study


def run(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "nas.cli", *args], capture_output=True, text=True, timeout=120
    )


def test_help_lists_the_commands():
    result = run("--help")
    assert result.returncode == 0
    for command in ("presets", "arch", "space"):
        assert command in result.stdout


def test_output_into_a_pipe_that_closes_early_is_no_error():
    """`ranknas leaderboard STUDY | head -1` ended in a BrokenPipeError traceback, exit 1."""
    piped = f"{sys.executable} -m nas.cli presets | true; echo rc=${{PIPESTATUS[0]}}"
    result = subprocess.run(["bash", "-c", piped], capture_output=True, text=True, timeout=120)
    assert "Traceback" not in result.stderr and "Error" not in result.stderr, result.stderr
    assert result.stdout.strip() == "rc=0"


def test_a_study_piped_into_head_finishes_its_work(tmp_path):
    """`ranknas search ... | head -2` stopped the study at its next line of progress, exit 0
    and not a word (a reevaluate announced 3 runs and recorded 1)."""
    from nas.storage import load_study
    from study_helpers import counted, tiny_config, write_config

    for name, pipe in (("piped", "|"), ("both", "2>&1 |")):  # progress lines: on stderr
        config = tiny_config(tmp_path, name, budget={"trials": 3})
        command = (f"RANKNAS_PROGRESS_SECONDS=0 {sys.executable} -m nas.cli search "
                   f"{write_config(tmp_path, config)} --no-mlflow {pipe} head -2; "
                   "echo rc=${PIPESTATUS[0]}")  # fmt: skip
        result = subprocess.run(["bash", "-c", command], capture_output=True, text=True,
                                timeout=300)  # fmt: skip
        assert result.stdout.splitlines()[-1] == "rc=0", result.stdout + result.stderr
        assert "Traceback" not in result.stderr and "Error" not in result.stderr, result.stderr
        study = load_study(name, config["storage"])
        reasons = [str(t.user_attrs.get("failure_reason")) for t in study.trials]
        assert len(counted(study)) == 3 and not [r for r in reasons if "pipe" in r.lower()]
    closed = f"{sys.executable} -m nas.cli presets >&-; echo rc=$?"
    result = subprocess.run(["bash", "-c", closed], capture_output=True, text=True, timeout=120)
    assert "Traceback" not in result.stderr, result.stderr


def every_parser(
    parser: argparse.ArgumentParser, path: str = "ranknas"
) -> Iterator[tuple[str, argparse.ArgumentParser]]:
    """The root parser and every command's, as (command line, parser)."""
    yield path, parser
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                yield from every_parser(sub, f"{path} {name}")


def test_every_command_s_help_opens_with_what_it_does():
    """`ranknas shard plan --help`, `latency fit --help` and the command groups' began with
    their usage alone: the line their parent lists is atop their own help too."""
    bare = [path for path, parser in every_parser(build_parser())
            if path != "ranknas" and not (parser.description or "").strip()]  # fmt: skip
    assert not bare, bare


def test_every_option_positional_and_command_has_a_help():
    undocumented = []
    for path, parser in every_parser(build_parser()):
        for action in parser._actions:
            if isinstance(action, argparse._SubParsersAction):  # the commands it lists, too
                undocumented += [f"{path} {c.dest}" for c in action._choices_actions
                                 if not (c.help or "").strip()]  # fmt: skip
            if not isinstance(action, argparse._HelpAction) and not (action.help or "").strip():
                undocumented.append(f"{path} {action.option_strings or action.dest}")
    assert undocumented == []


def without_spaces(text: str) -> str:
    """Help text as argparse wraps it, or not: line breaks may fall at spaces and hyphens."""
    return "".join(text.split())


def test_every_command_help_shows_the_defaults():
    checked, missing = 0, []
    for path, parser in every_parser(build_parser()):
        shown = without_spaces(parser.format_help())
        for action in parser._actions:
            if action.default is None or action.default is argparse.SUPPRESS:
                continue
            with_default = without_spaces(f"{action.help} (default: {action.default})")
            if action.default is False:  # a flag: off unless given, nothing to show
                assert with_default not in shown
                continue
            checked += 1
            if with_default not in shown:
                missing.append(f"{path} {action.option_strings or action.dest}")
    assert missing == [] and checked > 40


def test_building_the_parser_imports_no_heavy_library():
    """`--help` stays quick: the handlers import torch, torchrec, MLflow, Optuna when they run."""
    code = (
        "import json, sys; from nas.cli import build_parser; build_parser(); "
        "print(json.dumps(sorted(sys.modules)))"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
    assert {"torch", "torchrec", "mlflow", "optuna"}.isdisjoint(json.loads(result.stdout))


def test_presets_json_lists_every_preset_with_costs(capsys):
    assert main(["presets", "--json"]) == 0
    records = json.loads(capsys.readouterr().out)
    assert [r["name"] for r in records] == list(PRESETS)
    assert all(r["flops"] > 0 and r["dense_params"] > 0 for r in records)


def test_arch_show_prints_blocks_and_totals(capsys):
    assert main(["arch", "show", "dlrm"]) == 0
    out = capsys.readouterr().out
    assert "digest" in out and "interaction" in out and "FLOPs/example" in out


def test_arch_show_reads_a_file_and_a_schema(tmp_path, capsys):
    schema = tmp_path / "schema.yaml"
    schema.write_text(
        "label: y\ndense: [a, b]\ncategorical:\n  - {name: u, cardinality: 10}\n"
        "  - {name: v, cardinality: 5}\n"
    )
    assert main(["arch", "show", "deepfm", "--schema", str(schema), "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    spec = tmp_path / "model.json"
    spec.write_text(json.dumps(report["architecture"]))
    assert main(["arch", "show", str(spec), "--schema", str(schema), "--json"]) == 0
    again = json.loads(capsys.readouterr().out)
    assert again["digest"] == report["digest"] and again["flops"] == report["flops"]


@pytest.mark.parametrize(
    ("args", "content", "expected"),
    [
        (["arch", "show", "no-such-thing"], None, "neither a preset"),
        (
            ["arch", "show", "{file}"],
            '{"blocks": [{"name": "a", "op": "mlpp", "inputs": '
            '["dense"]}], "embedding": {"dim": 4}}',
            "block 'a': unknown op 'mlpp'",
        ),
        (["arch", "show", "{file}"], "{not json", "not valid JSON (Expecting property name"),
        (
            ["arch", "show", "{file}"],
            '{"blocks": [{"name": "a", "op": "mlp", "inputs": ["dense"]}, {"name": "b", '
            '"op": "mlp", "inputs": [0]}], "embedding": {"dim": 4}}',
            "blocks[1] 'b': inputs[0]: 0 is not a name (give an earlier block's name",
        ),
        (  # no "output": the last block's, and the others fed nothing
            ["arch", "show", "{file}"],
            '{"blocks": [{"name": "a", "op": "mlp", "inputs": ["dense"], "params": {"widths": '
            '[4]}}, {"name": "b", "op": "dot", "inputs": ["sparse"]}], "embedding": {"dim": 4}}',
            "blocks ['a'] do not feed the last block 'b', the output as the spec names no",
        ),
        (
            ["space", "sample", "{file}"],
            "search_space:\n  type: dag\n  widths: [0]\n",
            "search_space.widths",
        ),
        (
            ["presets", "--schema", "{file}"],
            "dense: [a]\ncategorical:\n  - {name: b}\n",
            "categorical[0]",
        ),
    ],
)
def test_user_mistakes_exit_2_with_one_clear_message(tmp_path, capsys, args, content, expected):
    path = tmp_path / "input.txt"
    if content is not None:
        path.write_text(content)
    assert main([a.replace("{file}", str(path)) for a in args]) == 2
    assert expected in capsys.readouterr().err


def test_a_user_mistake_prints_no_traceback(tmp_path):
    result = run("arch", "show", str(tmp_path / "missing.json"))
    assert result.returncode == 2
    assert result.stderr.startswith("error: ") and "Traceback" not in result.stderr


def test_a_warning_prints_as_one_line_for_a_person(tmp_path):
    """Not Python's default `WARNING:trainers.data.tabular:...`, which an import's stray
    `logging.info` (fbgemm_gpu's) would otherwise set up."""
    rows = [f"{i % 2},{i}.5,c{i % 7}" for i in range(60)]
    (tmp_path / "log.csv").write_text("label,price,city\n1,2,3,4\n" + "\n".join(rows))
    result = run("data", "schema", str(tmp_path / "log.csv"), "--label", "label")
    assert result.returncode == 0, result.stderr
    assert f"WARNING: {tmp_path / 'log.csv'}: inferred without 1 malformed lines" in result.stderr
    assert "trainers.data" not in result.stderr


def test_arch_show_draws_a_diagram(tmp_path, capsys):
    from nas.cli import main

    path = tmp_path / "dlrm.png"
    assert main(["arch", "show", "dlrm", "--diagram", str(path)]) == 0
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and path.stat().st_size > 5000


def test_space_sample_prints_the_arch_show_table_or_json(tmp_path, capsys):
    from nas.cli import main

    path = tmp_path / "around.yaml"
    path.write_text("search_space: {type: around, base: dlrm}\n")
    assert main(["space", "sample", str(path), "--seed", "3"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("architecture around-space") and "total:" in out
    assert len(out.splitlines()) < 12
    assert main(["space", "sample", str(path), "--seed", "3", "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["values"]["embedding_dim"] in (8, 16, 32) and report["architecture"]["blocks"]


def test_counts_and_budgets_below_one_are_refused_before_any_work(capsys):
    for argv in (["train", "--arch", "dlrm", "--examples", "-10"],
                 ["train", "--arch", "dlrm", "--epochs", "0"],
                 ["data", "synth", "--out", "x", "--rows", "many"]):  # fmt: skip
        with pytest.raises(SystemExit) as stopped:
            main(argv)
        assert stopped.value.code == 2
    err = capsys.readouterr().err
    assert "argument --examples: must be above 0, got -10" in err
    assert "argument --epochs: must be above 0, got 0" in err
    assert "argument --rows: expected a number, got 'many'" in err


@pytest.mark.parametrize("command", ["status", "leaderboard", "leaderboard --json", "export"])
def test_reading_a_study_back_imports_neither_torch_nor_torchrec(command, tmp_path):
    """`status` and `leaderboard` print rows from the storage, and `export` reads the study
    before it loads weights (here there are none): torch and torchrec, seconds of CPU to
    import, are not loaded for that."""
    url = f"sqlite:///{tmp_path / 'studies.db'}"
    study = recorded_study(url, [(0.86, 0.6), (0.85, 1.0)], baselines={"dlrm": (0.855, 0.5)})
    screened = {"baseline": "dlrm", "margin": 0.001, "features": {"c0": {"mean": 0.0, "sd": 0.0}}}
    study.set_user_attr("feature_importance", screened)  # `status` describes it
    argv = [*command.split(), "recorded", "--storage", url]
    if command == "export":
        argv += ["--out", str(tmp_path / "out")]
    script = ("import sys; from nas.cli import main; code = main(sys.argv[1:]); "
              "print(code, 'torch' in sys.modules, 'torchrec' in sys.modules)")  # fmt: skip
    result = subprocess.run([sys.executable, "-c", script, *argv], capture_output=True,
                            text=True, timeout=120)  # fmt: skip
    code, torch_loaded, torchrec_loaded = result.stdout.split("\n")[-2].split()
    assert code == ("2" if command == "export" else "0"), result.stderr
    assert (torch_loaded, torchrec_loaded) == ("False", "False"), command


@pytest.mark.parametrize("command", ["status", "leaderboard"])
def test_reading_a_study_back_by_its_yaml_imports_neither_torch_nor_mlflow(command, tmp_path):
    """README's `ranknas status study.yaml`: the config's search space is validated without
    the block library, and MLflow's client (seconds to import, as torch) is loaded only once
    the config's server answers."""
    import yaml

    url = f"sqlite:///{tmp_path / 'studies.db'}"
    recorded_study(url, [(0.86, 0.6)], baselines={"dcnv2": (0.855, 0.5)}, name="quickstart")
    config = yaml.safe_load(Path("examples/quickstart.yaml").read_text())
    config |= {"storage": url, "mlflow": {"tracking_uri": "http://127.0.0.1:9"}}  # nobody
    (tmp_path / "study.yaml").write_text(yaml.safe_dump(config))
    script = ("import sys; from nas.cli import main; code = main(sys.argv[1:]); "
              "print(code, 'torch' in sys.modules, 'mlflow' in sys.modules)")  # fmt: skip
    argv = [command, str(tmp_path / "study.yaml")]
    result = subprocess.run([sys.executable, "-c", script, *argv], capture_output=True,
                            text=True, timeout=120)  # fmt: skip
    assert result.stdout.split("\n")[-2].split() == ["0", "False", "False"], result.stderr
    assert "study quickstart: 1 complete" in result.stdout or command == "leaderboard"


def test_a_storage_that_fails_mid_run_is_one_error_line(monkeypatch, tmp_path, capsys):
    """A full disk or a database gone mid-run (Optuna's StorageInternalError, three chained
    exceptions deep) says what to do in one line, exit 2."""
    import optuna

    from nas import leaderboard
    from study_helpers import recorded_study

    storage = f"sqlite:///{tmp_path / 'studies.db'}"
    recorded_study(storage, [(0.9, 1.0)], name="full")
    failure = optuna.exceptions.StorageInternalError("An exception is raised during the commit.")
    monkeypatch.setattr(leaderboard, "status", mock.Mock(side_effect=failure))
    assert main(["status", "full", "--storage", storage]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "is its disk full" in err and "Traceback" not in err


def test_presets_say_how_their_tables_are_sized(capsys):
    """`presets --schema` showed 58.21K embedding params and the exported card 41,488 for
    the same data: the schema's cardinalities against the training split's vocabulary."""
    assert main(["presets"]) == 0
    assert "emb.params: tables sized by the schema's cardinalities" in capsys.readouterr().out


def test_presets_on_data_without_categorical_columns_list_those_that_read_it(tmp_path, capsys):
    """The first preset that cannot read the data (DLRM: no embeddings to dot) stopped the
    listing with exit 2, and the four that read it went unseen."""
    schema = tmp_path / "dense_only.yaml"
    schema.write_text("label: y\ndense: [a, b]\ncategorical: []\n")
    assert main(["presets", "--schema", str(schema), "--json"]) == 0
    out, err = capsys.readouterr()
    assert [r["name"] for r in json.loads(out)] == [
        "logistic_regression", "dcnv2", "deepfm", "wukong"]  # fmt: skip
    assert "not on this data: dlrm: preset dlrm on data with no categorical column" in err
    assert "not on this data: dhen:" in err


def test_train_checks_an_architecture_file_before_it_reads_the_data(tmp_path, capsys):
    """It loaded and split the data first: minutes on a large file, then the spec's error."""
    spec = tmp_path / "model.json"
    spec.write_text(
        '{"blocks": [{"name": "a", "op": "mlpp", "inputs": ["dense"]}], "embedding": {"dim": 4}}'
    )
    assert main(["train", "--arch", str(spec), "--data", "synthetic", "--rows", "2000"]) == 2
    err = capsys.readouterr().err
    assert f"{spec}: block 'a': unknown op 'mlpp'" in err and "split" not in err


def test_fewer_training_rows_than_a_batch_says_what_to_change(capsys):
    assert main(["train", "--arch", "dlrm", "--data", "synthetic", "--rows", "600"]) == 2
    err = capsys.readouterr().err
    assert "480 rows, fewer than one batch of 512: give more rows, or a smaller batch" in err
