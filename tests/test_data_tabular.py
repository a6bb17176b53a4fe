"""Your own logs: CSV/Parquet plus a YAML schema."""

import json

import numpy as np
import pytest
import yaml

from search_space.errors import RanknasError
from trainers.data import load_dataset, load_tabular, read_tabular_schema

CSV = """clicked,price,age,country,slot,unused
1,1.5,30,us,3,x
0,2.5,,de,0,x
0,0.5,41,us,1,x
1,-1,22,,2,x
0,3,35,us,3,x
"""

SCHEMA = """name: shop
label: clicked
dense: [price, age]
categorical:
  - country
  - {name: slot, cardinality: 4}
"""


@pytest.fixture
def files(tmp_path):
    (tmp_path / "log.csv").write_text(CSV)
    (tmp_path / "schema.yaml").write_text(SCHEMA)
    return tmp_path / "log.csv", tmp_path / "schema.yaml"


def check_shop(data):
    np.testing.assert_array_equal(data.labels, [1, 0, 0, 1, 0])
    # a blank age stays NaN until the preprocessing fitted on training fills it
    np.testing.assert_allclose(data.dense, [[1.5, 30], [2.5, np.nan], [0.5, 41], [-1, 22], [3, 35]])
    # country by frequency: us (3) -> 2, de (1) -> 3, blank -> 0 (missing)
    np.testing.assert_array_equal(data.categorical[:, 0], [2, 3, 2, 0, 2])
    np.testing.assert_array_equal(data.categorical[:, 1], [3, 0, 1, 2, 3])  # ids as given
    assert data.schema.name == "shop" and data.schema.label == "clicked"
    assert data.schema.dense == ("price", "age")
    assert [(f.name, f.cardinality) for f in data.schema.categorical] == [
        ("country", 4),
        ("slot", 4),
    ]


def test_csv_with_yaml_schema(files):
    data = load_tabular(*files)
    check_shop(data)
    assert data.bad_rows.rows == 5 and data.bad_rows.bad == 0


def test_parquet_with_yaml_schema(files, tmp_path):
    pd = pytest.importorskip("pandas")
    pytest.importorskip("pyarrow", reason="Parquet needs pyarrow")
    frame = pd.read_csv(files[0], keep_default_na=False)
    frame["age"] = pd.to_numeric(frame["age"]).astype("float64")
    frame["country"] = frame["country"].replace("", None)
    frame.to_parquet(tmp_path / "log.parquet")
    check_shop(load_dataset(str(tmp_path / "log.parquet"), schema_path=files[1]))


def test_schema_naming_absent_columns(files, tmp_path):
    schema = tmp_path / "bad.yaml"
    schema.write_text("label: clicked\ndense: [price, height]\ncategorical: [city]\n")
    with pytest.raises(RanknasError) as error:
        load_tabular(files[0], schema)
    message = str(error.value)
    assert str(schema) in message
    assert "['height', 'city']" in message
    assert "'country'" in message and "'unused'" in message  # what the file has


def test_bad_values_are_reported_with_line_numbers(tmp_path, files):
    path = tmp_path / "bad.csv"
    path.write_text(CSV + "1,cheap,20,us,1,x\n2,1,1,us,1,x\n0,1,1,us,9,x\n0,inf,1,us,1,x\n")
    data = load_tabular(path, files[1], max_bad_fraction=None)
    assert len(data) == 5
    report = data.bad_rows
    assert (report.rows, report.bad, report.unit) == (9, 4, "line")
    assert report.examples == {
        "label not 0/1 (clicked)": [8],
        "dense value not a number (price)": [7, 10],
        "id not an integer in [0, 4) (slot)": [9],
    }
    with pytest.raises(RanknasError, match=r"bad\.csv: 4 malformed lines of 9 lines"):
        load_tabular(path, files[1])
    with pytest.raises(RanknasError, match="max_bad_rows"):
        load_tabular(path, files[1], max_bad_rows=3, max_bad_fraction=None)


def test_hashing_and_min_count(files):
    hashed = load_tabular(*files, hash_size=50)
    assert hashed.schema.categorical[0].cardinality == 50
    ids = hashed.categorical[:, 0]
    assert ids[3] == 0 and ids[0] == ids[2] == ids[4] != 0 and 1 <= ids[1] < 50
    rare = load_tabular(*files, min_count=2)
    np.testing.assert_array_equal(rare.categorical[:, 0], [2, 1, 2, 0, 2])


def test_schema_file_errors(tmp_path, files):
    schema = tmp_path / "s.yaml"
    schema.write_text("label: clicked\ncategorical: [{name: slot, cardinality: 0}]\n")
    with pytest.raises(RanknasError, match=r"categorical\[0\].*cardinality"):
        read_tabular_schema(schema)
    schema.write_text("label: clicked\ndense: [price]\ncolour: red\n")
    with pytest.raises(RanknasError, match="colour"):
        read_tabular_schema(schema)
    with pytest.raises(RanknasError, match="cannot read"):
        read_tabular_schema(tmp_path / "none.yaml")
    with pytest.raises(RanknasError, match="schema_path"):
        load_dataset(str(files[0]))
    with pytest.raises(RanknasError, match="no such file"):
        load_tabular(tmp_path / "none.csv", files[1])
    with pytest.raises(RanknasError, match="unknown kind"):
        load_dataset("data.json")


def test_a_time_split_puts_validation_and_test_after_training(tmp_path):
    from nas.protocol import describe_split, split_method

    rng = np.random.default_rng(0)
    days = rng.permutation(300)  # rows out of time order in the file
    lines = ["y,price,shop,day"] + [
        f"{i % 2},{i}.5,s{i % 7},{np.datetime64('2026-01-01') + int(d)}" for i, d in enumerate(days)
    ]
    (tmp_path / "log.csv").write_text("\n".join(lines) + "\n")
    (tmp_path / "schema.yaml").write_text(
        "label: y\ndense: [price]\ncategorical: [shop]\ntime: day\n"
    )
    data = load_tabular(tmp_path / "log.csv", tmp_path / "schema.yaml")
    method = split_method("auto", data, str(tmp_path / "log.csv"))
    assert method == "time" and describe_split(method, data, 0) == "in time order (day)"
    train, valid, test = data.split(method=method)
    assert train.time.max() < valid.time.min() and valid.time.max() < test.time.min()
    assert [len(p) for p in (train, valid, test)] == [240, 30, 30]
    ordered = data.split(method="ordered")[2]  # the file's last 30 rows
    assert np.array_equal(ordered.dense[:, 0], data.dense[-30:, 0])
    random = [p.dense[:, 0].tolist() for p in data.split(seed=1, method="random")]
    assert random == [p.dense[:, 0].tolist() for p in data.split(seed=1, method="random")]
    with pytest.raises(RanknasError, match="split method 'later'"):
        data.split(method="later")


def test_cli_train_says_how_it_split_and_its_seed_does_not_move_the_split(tmp_path, capsys):
    from nas.cli import main

    lines = ["y,price,shop,when"] + [f"{i % 2},{i % 17}.5,s{i % 7},{1000 - i}" for i in range(400)]
    (tmp_path / "log.csv").write_text("\n".join(lines) + "\n")
    (tmp_path / "schema.yaml").write_text("label: y\ndense: [price]\ncategorical: [shop]\n")
    args = ["train", "--arch", "dlrm", "--data", str(tmp_path / "log.csv"), "--schema",
            str(tmp_path / "schema.yaml"), "--epochs", "1", "--batch-size", "64",
            "--json"]  # fmt: skip
    main([*args, "--split", "time:when"])
    assert "split in time order (when): 320 training, 40 validation, 40 test rows" in (
        capsys.readouterr().err
    )
    main(args)
    assert "split in file order" in capsys.readouterr().err
    splits = []
    for seed in ("1", "2"):
        main([*args, "--split", "random", "--seed", seed])
        splits.append(json.loads(capsys.readouterr().out)["val_examples"])
    assert splits[0] == splits[1] == 40


def test_data_schema_infers_a_schema_that_every_command_takes(tmp_path, capsys):
    from nas.cli import main

    rows = [f"{i % 2},{i * 0.37:.2f},{i % 4},u{i % 9},{i}" for i in range(200)]
    (tmp_path / "log.csv").write_text("clicked,price,slot,user,ts\n" + "\n".join(rows) + "\n")
    assert main(["data", "schema", str(tmp_path / "log.csv"), "--label", "clicked",
                 "--time", "ts"]) == 0  # fmt: skip
    text = capsys.readouterr().out
    (tmp_path / "schema.yaml").write_text(text)
    schema = yaml.safe_load(text)
    assert schema["dense"] == ["price"] and schema["time"] == "ts"
    assert schema["categorical"] == [{"name": "slot", "cardinality": 6},
                                     {"name": "user", "cardinality": 11}]  # fmt: skip
    assert main(["arch", "show", "dlrm", "--schema", str(tmp_path / "schema.yaml")]) == 0
    (tmp_path / "short.yaml").write_text("label: clicked\ndense: [price]\ncategorical: [user]\n")
    assert main(["arch", "show", "dlrm", "--schema", str(tmp_path / "short.yaml")]) == 2
    assert "'user' has no cardinality" in capsys.readouterr().err
