"""User mistakes end in one `error:` naming the file and field, exit status 2, no traceback."""

import json
import os
from pathlib import Path

import pytest
import torch
import yaml

from nas.cli import main
from study_helpers import tiny_config, write_config

AROUND_TYPO = {"type": "around", "base": "dlrm", "feature_dimz": [4]}


def _study(tmp_path, **overrides) -> str:
    return str(write_config(tmp_path, tiny_config(tmp_path, "bad", **overrides)))


def _csv(tmp_path, rows: list[str]) -> list[str]:
    data, schema = tmp_path / "clicks.csv", tmp_path / "schema.yaml"
    data.write_text("y,price,shop\n" + "\n".join(rows) + "\n")
    schema.write_text("label: y\ndense: [price]\ncategorical: [shop]\n")
    return ["train", "--arch", "dlrm", "--data", str(data), "--schema", str(schema)]


def _schema_of(tmp_path, schema: str) -> list[str]:
    """`_csv`'s file (its `shop` text, its `price` numbers) read with another schema."""
    args = _csv(tmp_path, [f"{i % 2},{i}.5,shop{i % 3}" for i in range(40)])
    (tmp_path / "schema.yaml").write_text(schema)
    return args


def _bad_block(tmp_path) -> list[str]:
    arch = {"name": "broken", "embedding": {"dim": 8}, "output": "top", "blocks": [
        {"name": "bottom", "op": "mlp", "inputs": ["dense"], "params": {"widths": "wide"}},
        {"name": "top", "op": "mlp", "inputs": ["bottom", "sparse"], "params": {"widths": [8]}},
    ]}  # fmt: skip
    path = tmp_path / "broken.json"
    path.write_text(json.dumps(arch))
    return ["arch", "show", str(path)]


def _huge_cardinality(tmp_path) -> list[str]:
    schema = {"label": "y", "dense": ["a"],
              "categorical": [{"name": "user", "cardinality": 10**12}]}  # fmt: skip
    path = tmp_path / "schema.yaml"
    path.write_text(yaml.safe_dump(schema))
    return ["arch", "show", "dlrm", "--schema", str(path)]


def _twice(tmp_path) -> list[str]:
    path = tmp_path / "twice.yaml"
    path.write_text("budget: {trials: 2, examples_per_trial: 2000}\nname: x\nbudget: {trials: 1}\n")
    return ["search", str(path)]


def _named_twice(tmp_path) -> list[str]:
    """pandas reads the second `price` as `price.1`, and the schema then had both."""
    path = tmp_path / "twice.csv"
    path.write_text("y,price,price,shop\n" + "".join(f"{i % 2},{i},{i + 1},s\n" for i in range(60)))
    return ["data", "schema", str(path), "--label", "y"]


def _unknown_op(tmp_path) -> list[str]:
    """The error named the block but not the file (a study may list several)."""
    arch = {"name": "u", "embedding": {"dim": 8}, "output": "a",
            "blocks": [{"name": "a", "op": "mlpp", "inputs": ["dense"], "params": {}}]}  # fmt: skip
    (tmp_path / "unknown.json").write_text(json.dumps(arch))
    return ["search", _study(tmp_path, baselines=["dlrm", str(tmp_path / "unknown.json")])]


def _three_classes(tmp_path) -> list[str]:
    """A schema was written (exit 0) for a file that training then refused."""
    path = tmp_path / "classes.csv"
    path.write_text("y,price,shop\n" + "".join(f"{i % 3},{i}.5,s{i % 4}\n" for i in range(60)))
    return ["data", "schema", str(path), "--label", "y"]


def _binary_study(tmp_path) -> list[str]:
    """A binary file as the study YAML: a UnicodeDecodeError traceback."""
    path = tmp_path / "study.yaml"
    path.write_bytes(b"\x89PNG\r\n\x1a\n\x00\xff\xfe")
    return ["search", str(path)]


def _write(tmp_path, name: str, text: str) -> str:
    path = tmp_path / name
    path.write_text(text)
    return str(path)


def _dead_block(tmp_path) -> list[str]:
    """A block that does not feed the output was not checked at all."""
    arch = {"name": "dead", "embedding": {"dim": 8}, "output": "b1", "blocks": [
        {"name": "b0", "op": "attention", "inputs": ["dense"], "params": {"num_heads": 0}},
        {"name": "b1", "op": "concat", "inputs": ["dense"], "params": {}},
    ]}  # fmt: skip
    return ["arch", "show", _write(tmp_path, "dead.json", json.dumps(arch))]


def _schema(tmp_path, text: str) -> list[str]:
    return ["arch", "show", "dlrm", "--schema", _write(tmp_path, "schema.yaml", text)]


def _tables(tmp_path, entry: str) -> list[str]:
    text = f"tables:\n  - {{name: a, num_embeddings: 10, embedding_dim: 8, {entry}}}\n"
    return ["shard", "plan", _write(tmp_path, "tables.yaml", text), "--devices", "2",
            "--method", "random"]  # fmt: skip


def _empty_data(tmp_path) -> list[str]:
    (tmp_path / "empty.csv").write_text("")
    return ["data", "schema", str(tmp_path / "empty.csv"), "--label", "y"]


def _unclosed_quote(tmp_path) -> list[str]:
    """pandas' own words, with its 0-based count of records: "EOF inside string starting
    at row 41"."""
    lines = [f"{i % 2},{i}.5,s{i % 4}\n" for i in range(60)]
    lines[5] = '0,5.5,"s\n1"\n'  # a quoted field over two lines: one record, two lines
    lines[40] = '1,"3.5,s1\n'  # line 43, the header being line 1
    (tmp_path / "quoted.csv").write_text("y,price,shop\n" + "".join(lines))
    return ["data", "schema", str(tmp_path / "quoted.csv"), "--label", "y"]


def _directory_as_data(tmp_path) -> list[str]:
    (tmp_path / "logs").mkdir()
    return ["train", "--arch", "dlrm", "--data", str(tmp_path / "logs")]


CASES = {
    "a binary file as the study YAML": (_binary_study, "study.yaml: not a text file (byte 0"),
    "an empty data file": (_empty_data, "empty.csv: the file is empty; give a file with a header"),
    "a directory as the data": (_directory_as_data, "logs: no .parquet files in this directory"),
    "a quote never closed": (_unclosed_quote, "quoted.csv: line 43: a quoted field opens there"),
    "a database server that does not answer": (  # said before the data loads
        lambda p: ["search", _study(p, storage="postgresql://postgres@127.0.0.1:9/test")],
        "storage 'postgresql://postgres@127.0.0.1:9/test': cannot open it",
    ),
    "a table file that is not there": (
        lambda p: ["shard", "plan", str(p / "none.yaml"), "--devices", "2"],
        "none.yaml: no such file; give a table file",
    ),
    "true as the number of trials (read as 1)": (
        lambda p: ["search", _study(p, budget={"trials": True})],
        "budget.trials: true is not a number",
    ),
    "bad param in a non-output block": (_bad_block, "block 'bottom'"),
    "search_space as a plain word": (
        lambda p: ["search", _study(p, search_space="dag")],
        "search_space",
    ),
    "storage directory that cannot be made": (
        lambda p: ["search", _study(p, storage="sqlite:////proc/ranknas/studies.db")],
        "cannot create the directory /proc/ranknas",
    ),
    "a SQLite storage URL naming no file": (
        lambda p: ["leaderboard", "any", "--storage", "sqlite:///"],
        "storage 'sqlite:///' names no file",
    ),
    "a step time without a cluster to predict it on": (
        lambda p: ["search", _study(p, objectives={"cost": "step_ms"})],
        "objectives step_ms / max_step_ms predict the step on a cluster: set sharding.devices",
    ),
    "a step time on 0 devices (the default: no plan)": (
        lambda p: ["search", _study(p, objectives={"cost": "step_ms"}, sharding={"devices": 0})],
        "set sharding.devices (and hosts) to the devices it has (0, the default, plans nothing)",
    ),
    "a links file that is not there": (
        lambda p: [
            "search",
            _study(
                p, objectives={"cost": "step_ms"}, sharding={"devices": 2, "links": "missing.json"}
            ),
        ],
        "sharding.links: missing.json: no such file; looked for at",
    ),
    "hosts that do not divide the devices": (
        lambda p: ["search", _study(p, sharding={"devices": 16, "hosts": 3})],
        "sharding: hosts: 3 must divide devices (16) evenly",
    ),
    "hosts given without devices": (  # "hosts: 2 must divide devices (0)": 2 does
        lambda p: [
            "search",
            _study(p, objectives={"cost": "step_ms"}, sharding={"devices": 0, "hosts": 2}),
        ],
        "sharding: hosts: 2 given, but no devices: set devices",
    ),
    "a negative step time ceiling": (
        lambda p: ["search", _study(p, objectives={"max_step_ms": -2}, sharding={"devices": 4})],
        "objectives.max_step_ms: got -2: use a number of ms above 0, best_baseline or base",
    ),
    "a searched recipe with no range": (
        lambda p: ["search", _study(p, training={"search": {"grid": 3}})],
        "training.search",
    ),
    "tracking URI that is not one": (
        lambda p: ["search", _study(p, mlflow={"tracking_uri": "localhost:5000"})],
        "mlflow.tracking_uri",
    ),
    "absurd cardinality": (_huge_cardinality, "needs 58.2 TiB"),
    "a dense column blank in every row": (
        lambda p: _csv(p, [f"{i % 2},,s{i % 3}" for i in range(50)]),
        "dense column 'price' is blank in every row",
    ),
    "labels of one class": (
        lambda p: _csv(p, [f"1,{i}.5,s{i % 3}" for i in range(50)]),
        "every row's label (y) is 1",
    ),
    "a misspelled baseline, before any data is read": (
        lambda p: [
            "search",
            _study(p, baselines=["dlrm", "dcn_v2"], data={"source": str(p / "not-read.csv")}),
        ],
        "baselines: dcn_v2: neither a preset (logistic_regression, dlrm, dcnv2",
    ),
    "a misspelled around base": (
        lambda p: ["search", _study(p, search_space={"type": "around", "base": "dlrmm"})],
        "search_space.base: dlrmm: neither a preset",
    ),
    "a misspelled --arch": (
        lambda p: [*_csv(p, ["1,1.5,a"]), "--arch", "dlrmm"],
        "--arch dlrmm: neither a preset",
    ),
    "a text column listed as dense": (  # was "all 40 lines are malformed; fix the file..."
        lambda p: _schema_of(p, "label: y\ndense: [price, shop]\ncategorical: []\n"),
        "dense column 'shop' holds no number in any row ('shop0' in the first): list it under",
    ),
    "text ids without a vocabulary": (
        lambda p: _schema_of(
            p, "label: y\ndense: [price]\ncategorical: [{name: shop, cardinality: 3}]\n"
        ),
        "categorical column 'shop' holds no id in [0, 3) in any row ('shop0' in the first): "
        "give it min_count: 1",
    ),
    "the label listed as a feature": (  # was "column(s) ['y'] appear more than once"
        lambda p: _schema_of(p, "label: y\ndense: [price, y]\ncategorical: [shop]\n"),
        "the label 'y' is also listed as a feature (or the time): a model would read its own",
    ),
    "a time column for the split that the file lacks": (
        lambda p: [*_csv(p, ["1,1.5,a"]), "--split", "time:when"],
        "time column 'when' (given for the split: a study's data.split.column",
    ),
    "a dense value beyond float32": (
        lambda p: _csv(p, ["1,1e300,a", *(f"{i % 2},{i}.5,s{i % 3}" for i in range(50))]),
        "dense value beyond float32 (price): 1 (line 2)",
    ),
    "a negative seed in a study": (lambda p: ["search", _study(p, seed=-1)], "seed: Input should"),
    "a device torch does not know": (
        lambda p: ["search", _study(p, training={"device": "tpu"})],
        "training.device: 'tpu': use auto, cpu, cuda or cuda:N",
    ),
    "a split that leaves no test rows": (
        lambda p: ["search", _study(p, data={"split": {"fractions": [0.9, 0.1, 0.0]}})],
        "data.split.fractions: need three numbers above 0",
    ),
    "a latency predictor that is not there": (
        lambda p: ["latency", "predict", "no-such-predictor.json", "dlrm"],
        "no-such-predictor.json: cannot read the latency predictor (No such file or directory); "
        "looked for at",
    ),
    "a word for a number": (
        lambda p: ["search", _study(p, budget={"trials": "three"})],
        "budget.trials: Input should be a valid integer, unable to parse string as an integer "
        "(got 'three')",
    ),
    "a split of two fractions": (
        lambda p: ["search", _study(p, data={"split": {"fractions": [0.8, 0.2]}})],
        "data.split.fractions: need three numbers (train, validation, test) summing to 1, not 2",
    ),
    "a key given twice in a study's YAML": (_twice, "'budget' given twice (first on line 1)"),
    "an embedding dim of 0 in a DAG space": (
        lambda p: ["search", _study(p, search_space={"type": "dag", "embedding_dims": [0]})],
        "search_space.embedding_dims: every dim must be in [1, 1024]",
    ),
    "a streaming option without --stream": (
        lambda p: [*_csv(p, ["1,1.5,a"]), "--min-count", "5"],
        "--min-count: for streamed data only",
    ),
    "an output directory that cannot be made": (
        lambda p: ["search", _study(p, output_dir="/proc/ranknas/studies")],
        "output_dir: cannot create /proc/ranknas/studies",
    ),
    "an architecture file whose block is wrong": (_unknown_op, "unknown.json: block 'a'"),
    "an architecture file whose block is wrong, added as a baseline": (  # the data loaded first
        lambda p: ["baseline", "add", *_unknown_op(p)[1:], str(p / "unknown.json")],
        "unknown.json: block 'a'",
    ),
    "classes 0/1/2 as the label, when inferring a schema": (
        _three_classes,
        "the label column 'y' holds '2', not 0/1 (or true/false, yes/no), in 20 of 60 rows",
    ),
    "a column named twice in a CSV header": (_named_twice, "the header names 'price' more than"),
    "a worker for a study never started (a typo would start another)": (
        lambda p: ["worker", _study(p)],
        "bad.yaml: a worker joins a started study (--wait SECONDS waits for it): no study 'bad'",
    ),
    "a data dir for the MLflow server that is a file": (
        lambda p: ["mlflow", "up", "--data-dir", _study(p)],
        "bad.yaml: cannot make it the server's directory (File exists); give a directory",
    ),
    "a negative choice in a Wukong space (trial 0 trained, then the study died)": (
        lambda p: ["search", _study(p, search_space={"type": "wukong", "num_fm": [-4, 8]})],
        "bad.yaml: search_space.num_fm: -4 is out of range: must be in [1, 1024] (wukong num_fm)",
    ),
    "a DHEN hidden width of 0 (found by the fuzzer)": (
        lambda p: ["search", _study(p, search_space={"type": "dhen", "hidden": [1, 0]})],
        "search_space.hidden: 0 is out of range: must be in [1, 65536] (dhen hidden)",
    ),
    "a DAG width that a cross block cannot take as its rank": (
        lambda p: ["search", _study(p, search_space={"type": "dag", "widths": [5000]})],
        "search_space.widths: 5000 is out of range: must be in [0, 4096] (cross low_rank)",
    ),
    "a DAG count beyond an efc block's": (
        lambda p: ["search", _study(p, search_space={"type": "dag", "counts": [5000]})],
        "search_space.counts: 5000 is out of range: must be in [1, 4096] (efc num_out)",
    ),
    "true as a space's number of blocks (read as 1)": (
        lambda p: ["search", _study(p, search_space={"type": "dag", "num_blocks": True})],
        "search_space.num_blocks: true is not a number",
    ),
    "an infinite time per trial": (
        lambda p: ["search", _study(p, budget={"trial_seconds": float("inf")})],
        "budget.trial_seconds: Input should be a finite number",
    ),
    "an unknown space type": (
        lambda p: ["search", _study(p, search_space={"type": "tree"})],
        "search_space: type: use one of dag, wukong, dhen, around",
    ),
    "a study that plans sharding on a million devices": (
        lambda p: ["search", _study(p, sharding={"devices": 1_000_000})],
        "sharding.devices: Input should be less than or equal to 16384",
    ),
    "one hash bucket in a schema (hashing needs two: missing and the rest)": (
        lambda p: _schema(
            p, "label: y\ndense: [a]\ncategorical: [{name: shop, cardinality: 9, hash_size: 1}]\n"
        ),
        "schema.yaml: categorical[0] (shop): hash_size must be an integer >= 2 (got 1)",
    ),
    "a DAG width of 0 that no op of the space reads (found by the fuzzer)": (
        lambda p: [
            "search",
            _study(p, search_space={"type": "dag", "ops": ["efc", "fm"], "widths": [1, 0]}),
        ],
        "search_space.widths: 0 is out of range: must be in [1, 65536] (mlp widths)",
    ),
    "categorical: true in a schema (a TypeError traceback; found by the fuzzer)": (
        lambda p: _schema(p, "label: y\ndense: [a]\ncategorical: true\n"),
        "schema.yaml: 'categorical' must be a list",
    ),
    "a block that does not feed the output, out of range (found by the fuzzer)": (
        _dead_block,
        "dead.json: block 'b0' (op attention): params.num_heads 0 is out of range",
    ),
    "a table named as another's shard (one of the two left the plan; a user trial)": (
        lambda p: _tables(p, "}\n  - {name: a/cw0, num_embeddings: 10, embedding_dim: 8"),
        "tables.yaml: tables[1] (a/cw0): name 'a/cw0' holds '/', which names a table's shards",
    ),
    "a list as a table's dtype (a TypeError traceback; found by the fuzzer)": (
        lambda p: _tables(p, "dtype: [fp32]"),
        "tables.yaml: tables[0] (a): 'dtype' is ['fp32']; use one of fp32, fp16",
    ),
    "a number as an unknown key of a table (a TypeError traceback)": (
        lambda p: _tables(p, "1: 2, zz: 3"),
        "tables.yaml: tables[0] (a): unknown field(s) [1, 'zz']",
    ),
    "a number as an unknown key of a schema (a TypeError traceback)": (
        lambda p: _schema(p, "label: y\ndense: [a]\n1: 2\nzz: 3\n"),
        "schema.yaml: unknown field(s) [1, 'zz']",
    ),
    "a file store as MLflow's tracking URI (MLflow 3 raised it as a traceback; a user trial)": (
        lambda p: ["search", _study(p, mlflow={"tracking_uri": f"file://{p / 'mlruns'}"})],
        "MLflow 3 takes no file store (it refuses one as in maintenance mode); use sqlite:///",
    ),
    "one file as the training, validation and test data (NE on trained rows; a user trial)": (
        lambda p: [
            "search",
            _study(
                p,
                data={
                    "train": "log.csv",
                    "valid": "log.csv",
                    "test": "./log.csv",
                    "schema": "s.yaml",
                },
            ),
        ],
        "data.train and data.valid are one file (log.csv): a model measured on the rows it",
    ),
    "a PostgreSQL storage naming no database (Optuna's tables went to 'postgres')": (
        lambda p: ["search", _study(p, storage="postgresql://postgres@127.0.0.1:5432/")],
        "storage: names no database: give it after the host, postgresql://USER@HOST:PORT/DB",
    ),
    "a storage URL whose driver is not installed (it said to check the URL)": (
        lambda p: ["status", "any", "--storage", "mysql://user@127.0.0.1/studies"],
        "No module named 'MySQLdb'); install the driver MySQLdb in this environment",
    ),
    "the study config itself as its data.schema (its own fields read as unknown)": (
        lambda p: ["arch", "show", "dlrm", "--schema", _study(p)],
        "bad.yaml: a study config, not a dataset schema (its fields: label, dense, categorical",
    ),
    "a misspelt field": (
        lambda p: ["search", _study(p, training={"batch_sise": 64})],
        "training.batch_sise: Extra inputs are not permitted; did you mean 'batch_size'?",
    ),
    "a misspelt section": (
        lambda p: ["search", _study(p, serchr={"type": "tpe"})],
        "serchr: Extra inputs are not permitted; did you mean 'searcher'?",
    ),
    "a misspelt field of a space (inside the tagged union)": (
        lambda p: ["search", _study(p, search_space=AROUND_TYPO)],
        "search_space.feature_dimz: Extra inputs are not permitted; did you mean 'feature_dims'?",
    ),
    "a misspelt field whose name in a config is its alias": (
        lambda p: ["search", _study(p, data={"shema": "schema.yaml"})],
        "data.shema: Extra inputs are not permitted; did you mean 'schema'?",
    ),
    "a field nothing is close to": (
        lambda p: ["search", _study(p, pruning={"zzz": 1})],
        "pruning.zzz: Extra inputs are not permitted; this section takes startup_trials, type",
    ),
    "a log whose validation rows are all negatives (it trained, then said 'diverged')": (
        lambda p: _csv(p, [f"{int(i < 40 and i % 3 == 0)},{i},s{i % 4}" for i in range(50)]),
        "clicks.csv: the validation split (5 of 50 rows, ordered split) holds no positive "
        "labels ('y'): a "
        "model's NE there is undefined",
    ),
    "a CSV renamed .parquet (Parquet's 'magic bytes not found in footer'; a user trial)": (
        lambda p: _written(
            p / "clicks.parquet", b"y,price\n1,2.5\n0,1.5\n", ["data", "schema", "--label", "y"]
        ),
        "clicks.parquet: not a Parquet file (it does not start as one); a CSV or TSV under a",
    ),
    "JSON lines in a .csv (it said: no column(s) ['y']; a user trial)": (
        lambda p: _written(
            p / "clicks.csv",
            b'{"y": 1, "price": 2.5}\n{"y": 0, "price": 1}\n',
            ["data", "schema", "--label", "y"],
        ),
        'clicks.csv: its first line is JSON ({"y": 1...), not a header of column names',
    ),
    "an architecture JSON that is no text (a UnicodeDecodeError traceback; a user trial)": (
        lambda p: _written(p / "binary.json", b"\xff\xfe{}", ["arch", "show"]),
        "binary.json: not a text file (byte 0 is not UTF-8); give the architecture as a YAML",
    ),
    "an architecture JSON with a key given twice (the last one was taken; a user trial)": (
        lambda p: _written(p / "dup.json", b'{"name": "a", "name": "b"}', ["arch", "show"]),
        "dup.json: not valid JSON ('name' given twice in one object): give each key once",
    ),
    "a study that does not exist, in a file that does not": (
        lambda p: ["status", "nope", "--storage", f"sqlite:///{p / 'none.db'}"],
        "no study 'nope': the storage",
    ),
}


def _written(path: Path, content: bytes, command: list[str]) -> list[str]:
    """`command` given the file `path`, written with `content`."""
    path.write_bytes(content)
    return [*command, str(path)]


@pytest.mark.parametrize("case", list(CASES))
def test_a_mistake_is_one_clear_error(case, tmp_path, capsys):
    make_args, expected = CASES[case]
    assert main(make_args(tmp_path)) == 2
    out, err = capsys.readouterr()
    assert err.startswith("error:") and expected in err, err
    assert "Traceback" not in err
    if case.startswith(("a database server", "an architecture file")):
        assert "data:" not in out  # said before the data loads (it came after)

    if case.startswith("a study that does not exist"):
        assert not (tmp_path / "none.db").exists()  # a read-only command creates nothing
    if case.startswith("a worker"):
        assert not (tmp_path / "studies.db").exists()


ARGUMENT_CASES = {
    "a negative seed": (["train", "--arch", "dlrm", "--seed", "-1"], "--seed: must be at least 0"),
    "a device torch does not know": (["train", "--arch", "dlrm", "--device", "tpu"], "'tpu': use"),
    "an infinite budget": (["train", "--arch", "dlrm", "--epochs", "inf"], "a finite number"),
    # refused by the trainer, after the data, as "train config: dense_lr must be > 0"
    "a learning rate of nan": (
        ["train", "--arch", "dlrm", "--dense-lr", "nan"],
        "--dense-lr: expected a finite number, got nan",
    ),
    "a negative learning rate": (
        ["train", "--arch", "dlrm", "--sparse-lr", "-1"],
        "--sparse-lr: must be above 0, got -1",
    ),
    "a port out of range": (["mlflow", "status", "--port", "99999"], "must be at most 65535"),
    "retraining no trials": (["reevaluate", "x.yaml", "--top", "0"], "--top: must be above 0"),
    "--trials -1": (["search", "x.yaml", "--trials", "-1"], "--trials: must be above 0"),
    "--trials 0": (["search", "x.yaml", "--trials", "0"], "--trials: must be above 0"),
    "listing no trials": (["leaderboard", "any", "--top", "0"], "--top: must be above 0"),
    "no workers": (["search", "x.yaml", "--workers", "0"], "--workers: must be above 0"),
    "both CSV and JSON": (["leaderboard", "any", "--csv", "--json"], "--json: not allowed with"),
    "a sharding plan for a million devices (ran out of memory)": (
        ["shard", "plan", "dlrm", "--devices", "1000000", "--method", "size_greedy"],
        "--devices: must be at most 16384, got 1000000",
    ),
    "a plan on no devices": (["shard", "plan", "dlrm", "--devices", "0"], "must be at least 1"),
    "devices with no memory": (
        ["shard", "plan", "dlrm", "--devices", "2", "--memory-gb", "0"],
        "--memory-gb: must be above 0",
    ),
    "no training rounds": (["shard", "train", "--rounds", "0"], "--rounds: must be above 0"),
    "a directory as the latency predictor's file": (
        lambda p: ["latency", "fit", "space.yaml", "--out", str(p)],
        "is a directory: give a file name in it",
    ),
    "a diagram where no directory can be made": (
        ["arch", "show", "dlrm", "--diagram", "/proc/ranknas/graph.png"],
        "--diagram: cannot write /proc/ranknas/graph.png",
    ),
    "a run's size in both examples and epochs (a study refuses both)": (
        ["train", "--arch", "dlrm", "--examples", "2000", "--epochs", "1"],
        "argument --epochs: not allowed with argument --examples",
    ),
    "one hash bucket for streamed data": (
        ["train", "--arch", "dlrm", "--stream", "--hash-size", "1"],
        "argument --hash-size: must be at least 2, got 1",
    ),
    "a file where the export directory goes": (
        lambda p: ["export", "x", "--out", str(p / "x.yaml")],
        "x.yaml is a file, not a directory",
    ),
}


@pytest.mark.parametrize("case", list(ARGUMENT_CASES))
def test_a_wrong_option_is_refused_before_any_work(case, tmp_path, capsys):
    """Options argparse checks: the usage, one error naming the option, exit 2."""
    args, expected = ARGUMENT_CASES[case]
    (tmp_path / "x.yaml").write_text("name: x\n")
    with pytest.raises(SystemExit) as exit_:
        main(args(tmp_path) if callable(args) else args)
    assert exit_.value.code == 2
    err = capsys.readouterr().err
    assert "error: argument" in err and expected in err, err
    assert "Traceback" not in err


@pytest.mark.parametrize(
    ("args", "handler", "resumes"),
    [
        (["train", "--arch", "dlrm"], "cmd_train", False),
        (["search", "x.yaml"], "cmd_search", True),
        (["reevaluate", "x.yaml"], "cmd_reevaluate", True),
    ],
)
def test_ctrl_c_offers_to_resume_only_what_resumes(args, handler, resumes, monkeypatch, capsys):
    """`train` keeps nothing of an interrupted run: it said "run the same command again to
    resume" all the same."""

    def interrupted(_):
        raise KeyboardInterrupt

    monkeypatch.setattr(f"nas.commands.{handler}", interrupted)
    assert main(args) == 130
    err = capsys.readouterr().err
    assert "interrupted" in err
    assert ("run the same command again to resume" in err) == resumes, err


def test_a_study_refused_for_its_data_leaves_no_directory_behind(tmp_path, capsys):
    out = tmp_path / "runs" / "studies" / "bad"
    schema = tmp_path / "schema.yaml"
    schema.write_text("label: y\ndense: [price]\ncategorical: [shop]\n")
    data = {"source": str(tmp_path / "absent.csv"), "schema": str(schema)}
    path = _study(tmp_path, data=data, output_dir=str(out))
    assert main(["search", path]) == 2
    assert "absent.csv: no such file" in capsys.readouterr().err
    assert not (tmp_path / "runs").exists()  # it was made before the data was read


def test_too_many_malformed_rows_name_the_settings_that_raise_the_limit(tmp_path, capsys, caplog):
    """The error said "raise the limits max_bad_rows / max_bad_fraction", which no config
    or option had; they are `data:` settings of a study now."""
    csv, schema = tmp_path / "clicks.csv", tmp_path / "schema.yaml"
    rows = [f"{2 if i % 10 == 0 else int(i % 7 < 3)},{i}.5,s{i % 7}" for i in range(3000)]
    csv.write_text("y,price,shop\n" + "\n".join(rows) + "\n")
    schema.write_text("label: y\ndense: [price]\ncategorical: [shop]\n")
    data = {"source": str(csv), "schema": str(schema), "split": {"method": "random"}}
    budget = {"trials": 1, "epochs_per_trial": 1}
    assert main(["search", _study(tmp_path, data=data, budget=budget)]) == 2
    err = capsys.readouterr().err
    assert "300 malformed lines of 3000 lines" in err and "Traceback" not in err
    assert "data.max_bad_fraction, now 0.01" in err, err
    tolerant = tiny_config(tmp_path, "tolerant", data=data | {"max_bad_fraction": 0.2},
                           budget=budget)  # fmt: skip
    assert main(["search", str(write_config(tmp_path, tolerant)), "--no-mlflow"]) == 0
    assert "skipped 300 malformed lines" in caplog.text


def _read_only_directory(tmp_path: Path) -> Path:
    """A directory this process cannot write in: one made read-only, or, where permissions
    do not hold (root), a read-only part of /proc; skipped where there is none."""
    made = tmp_path / "read-only"
    made.mkdir()
    made.chmod(0o555)
    for directory in (made, Path("/proc/sys")):
        if directory.is_dir() and not os.access(directory, os.W_OK):
            return directory
    pytest.skip("no directory here is read-only to this process")


def test_a_storage_that_cannot_be_written_is_said_before_the_data(tmp_path, capsys):
    """A SQLite storage in a read-only directory was an OSError traceback from its lock
    file, after the data had loaded."""
    read_only = _read_only_directory(tmp_path)
    config = _study(tmp_path, storage=f"sqlite:///{read_only / 'sub' / 'studies.db'}")
    assert main(["search", config]) == 2
    out, err = capsys.readouterr()
    assert f"cannot write in {read_only} (a read-only file system, or not writable" in err, err
    assert "give a storage in a writable directory" in err and "data:" not in out


def test_a_relative_storage_that_is_not_there_says_where_it_was_looked_for(
    tmp_path, monkeypatch, capsys
):
    """Run from another folder, a study YAML's relative storage said only
    "ranknas-data/studies.db does not exist", the very mistake the README warns of."""
    monkeypatch.chdir(tmp_path)
    assert main(["status", "q", "--storage", "sqlite:///ranknas-data/studies.db"]) == 2
    err = capsys.readouterr().err
    assert f"looked for at {tmp_path / 'ranknas-data/studies.db'} (relative paths" in err, err
    # "run `ranknas search CONFIG` first" alone would start an empty study here
    assert "run this from the directory the study ran in, run `ranknas search" in err
    assert not (tmp_path / "ranknas-data").exists()


@pytest.mark.skipif(torch.cuda.is_available(), reason="a machine without a GPU")
def test_a_gpu_asked_for_where_there_is_none_is_said_before_the_data(tmp_path, capsys):
    """It was said after the data loaded, without its field, and left an empty study."""
    assert main(["search", _study(tmp_path, training={"device": "cuda"})]) == 2
    out, err = capsys.readouterr()
    assert err.startswith("error: training.device: device 'cuda' asked for, but CUDA is not "
                          "available here; set it to auto or cpu"), err  # fmt: skip
    assert "data:" not in out and not (tmp_path / "studies.db").exists()


def test_a_broken_base_file_is_said_before_the_data(tmp_path, capsys):
    """A typo in the around space's base file was told once the data had loaded, and left
    an empty study folder."""
    bad = tmp_path / "team.json"
    block = {"name": "top", "op": "mpl", "inputs": ["dense"], "params": {"widths": [4]}}
    bad.write_text(json.dumps({"embedding": {"dim": 4}, "blocks": [block]}))
    config = tiny_config(tmp_path, "bad")
    config["search_space"] = {"type": "around", "base": str(bad)}
    assert main(["search", str(write_config(tmp_path, config))]) == 2
    out, err = capsys.readouterr()
    assert err.startswith(f"error: search_space.base: {bad}: ") and "unknown op 'mpl'" in err, err
    assert "data:" not in out and not (tmp_path / "bad").exists()
