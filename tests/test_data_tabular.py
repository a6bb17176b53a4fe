"""Your own logs: CSV/Parquet plus a YAML schema."""

import itertools
import json
from pathlib import Path

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
        "label not 0/1, true/false or yes/no (clicked)": [8],
        "dense value not a finite number (price)": [7, 10],
        "id not an integer in [0, 4) (slot: a larger cardinality, or min_count: 1 to read its "
        "values through a vocabulary, reads them)": [9],
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


def test_schema_file_errors(tmp_path, files, monkeypatch):
    schema = tmp_path / "s.yaml"
    schema.write_text("label: clicked\ncategorical: [{name: slot, cardinality: 0}]\n")
    with pytest.raises(RanknasError, match=r"categorical\[0\].*cardinality"):
        read_tabular_schema(schema)
    schema.write_text("label: clicked\ndense: [price]\ncolour: red\n")
    with pytest.raises(RanknasError, match="colour"):
        read_tabular_schema(schema)
    with pytest.raises(RanknasError, match="cannot read"):
        read_tabular_schema(tmp_path / "none.yaml")
    with pytest.raises(RanknasError, match=r"pass --schema FILE \(data.schema in a study\)"):
        load_dataset(str(files[0]))
    with pytest.raises(RanknasError, match="no such file"):
        load_tabular(tmp_path / "none.csv", files[1])
    # a relative path is read from the current directory, not the config's: the error says
    monkeypatch.chdir(tmp_path)
    with pytest.raises(RanknasError, match=f"looked for at {tmp_path / 'none.yaml'}"):
        read_tabular_schema(Path("none.yaml"))
    with pytest.raises(RanknasError, match=f"looked for at {tmp_path / 'none.csv'}"):
        load_tabular(Path("none.csv"), files[1])
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


def _day_log(tmp_path, days):
    """A log whose time column holds each row's day (in the given order)."""
    lines = ["y,price,shop,day"] + [
        f"{i % 2},{i}.5,s{i % 7},{np.datetime64('2026-01-01') + int(d)}" for i, d in enumerate(days)
    ]
    (tmp_path / "log.csv").write_text("\n".join(lines) + "\n")
    (tmp_path / "schema.yaml").write_text(
        "label: y\ndense: [price]\ncategorical: [shop]\ntime: day\n"
    )
    return load_tabular(tmp_path / "log.csv", tmp_path / "schema.yaml")


def test_a_time_split_never_puts_rows_of_one_time_on_both_sides(tmp_path):
    """With a column of days, 46 validation rows shared training's last day: each boundary
    moves to the nearest change of day (the earlier one where two are as near), unless a part
    would then be empty."""
    rng = np.random.default_rng(0)
    counts = [23, 31, 27, 35, 29, 33, 26, 30, 32, 34]  # rows per day: 300 in all
    data = _day_log(tmp_path, rng.permutation(np.repeat(np.arange(10), counts)))
    train, valid, test = data.split(method="time")
    assert train.time.max() < valid.time.min() and valid.time.max() < test.time.min()
    assert [len(p) for p in (train, valid, test)] == [234, 32, 34]  # 240 and 270 moved
    train, valid, test = data.split(fractions=(0.73, 0.27, 0.0), method="time")
    assert [len(p) for p in (train, valid, test)] == [204, 96, 0]  # 219: as near to 234
    # two days of 150 rows: both boundaries would move to 150, emptying validation
    data = _day_log(tmp_path, np.repeat([0, 1], 150))
    assert [len(p) for p in data.split(method="time")] == [240, 30, 30]


def test_one_odd_cell_in_a_time_column_is_that_line_s_fault_only(tmp_path):
    """A column of numbers (hours as 14102100) with one date in it, and a column of dates
    with one cell that is neither: the odd line is reported, the others keep their times."""
    (tmp_path / "schema.yaml").write_text(
        "label: y\ndense: [price]\ncategorical: [shop]\ntime: t\n"
    )
    columns = [([f"141021{h:02d}" for h in range(20)], "2014-10-21"),
               ([f"2026-01-{d:02d}" for d in range(1, 21)], "1e99x")]  # fmt: skip
    for times, odd in columns:
        times[7] = odd
        lines = ["y,price,shop,t"] + [f"{i % 2},{i},s{i % 3},{t}" for i, t in enumerate(times)]
        (tmp_path / "log.csv").write_text("\n".join(lines) + "\n")
        data = load_tabular(tmp_path / "log.csv", tmp_path / "schema.yaml", max_bad_fraction=None)
        assert data.bad_rows.examples == {"time not a number or a date (t)": [9]}
        assert len(data) == 19 and np.all(np.diff(data.time) > 0)


def test_day_first_dates_are_read_day_first_throughout(tmp_path):
    """`01/11/2023` was read month first (11 January), and `13/11/2023` refused: most lines
    bad, and the rest out of time order."""
    (tmp_path / "schema.yaml").write_text("label: y\ndense: [price]\ncategorical: [shop]\n"
                                          "time: t\n")  # fmt: skip
    days = np.datetime64("2023-11-01") + np.arange(40)
    stamps = [f"{str(d)[8:10]}/{str(d)[5:7]}/{str(d)[:4]} 10:00" for d in days]  # 01/11/2023
    lines = ["y,price,shop,t"] + [f"{i % 2},{i},s{i % 3},{t}" for i, t in enumerate(stamps)]
    (tmp_path / "log.csv").write_text("\n".join(lines) + "\n")
    data = load_tabular(tmp_path / "log.csv", tmp_path / "schema.yaml")
    steps = np.diff(data.time)
    assert len(data) == 40 and steps.min() > 0 and np.all(steps == steps[0])  # a day each


def test_a_study_s_split_may_be_given_as_the_cli_s_word_or_as_fractions(tmp_path):
    from nas.config import parse_config

    config = {"name": "s", "data": {"source": "log.csv", "schema": "schema.yaml"},
              "search_space": {"type": "around", "base": "dlrm"}}  # fmt: skip
    for split, expected in [("time", ("time", (0.8, 0.1, 0.1))),
                            ([0.7, 0.2, 0.1], ("auto", (0.7, 0.2, 0.1))),
                            ({"method": "ordered"}, ("ordered", (0.8, 0.1, 0.1)))]:  # fmt: skip
        parsed = parse_config(config | {"data": config["data"] | {"split": split}}).data.split
        assert (parsed.method, parsed.fractions) == expected
    with pytest.raises(RanknasError, match=r"data\.split\.method: Input should be 'auto'"):
        parse_config(config | {"data": config["data"] | {"split": "later"}})


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
        run = json.loads(capsys.readouterr().out)
        assert run["split"] == "random (data seed 0)"
        splits.append(run["val_examples"])
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
    assert schema["categorical"] == [{"name": "slot", "cardinality": 6, "min_count": 1},
                                     {"name": "user", "cardinality": 11,
                                      "min_count": 1}]  # fmt: skip
    assert main(["arch", "show", "dlrm", "--schema", str(tmp_path / "schema.yaml")]) == 0
    capsys.readouterr()
    train = ["train", "--data", str(tmp_path / "log.csv"), "--schema",
             str(tmp_path / "schema.yaml"), "--arch", "dlrm", "--epochs", "1",
             "--batch-size", "64", "--json"]  # fmt: skip
    assert main(train) == 0  # text ids ("u3") go through the training split's vocabulary
    assert json.loads(capsys.readouterr().out)["val_examples"] > 0
    (tmp_path / "short.yaml").write_text("label: clicked\ndense: [price]\ncategorical: [user]\n")
    assert main(["arch", "show", "dlrm", "--schema", str(tmp_path / "short.yaml")]) == 2
    assert "'user' has no cardinality" in capsys.readouterr().err
    (tmp_path / "typo.yaml").write_text(
        "label: clicked\ndense: [price]\ncategorical: [{name: user, cardinalty: 11}]\n"
    )  # the misspelt field was hidden behind "has no cardinality"
    assert main(["arch", "show", "dlrm", "--schema", str(tmp_path / "typo.yaml")]) == 2
    assert "unknown field(s) ['cardinalty']" in capsys.readouterr().err


def test_data_schema_of_a_study_is_its_trials_schema_and_a_data_file_needs_its_label(
    tmp_path, capsys
):
    from nas.cli import main
    from search_space.schema import DatasetSchema

    study = {
        "name": "sized",
        "search_space": {"type": "around", "base": "dlrm"},
        "data": {"source": "synthetic", "rows": 2_000, "cardinalities": [50, 7, 3000, *[100] * 9]},
    }
    (tmp_path / "study.yaml").write_text(yaml.safe_dump(study))
    assert main(["data", "schema", str(tmp_path / "study.yaml")]) == 0
    said = capsys.readouterr().out
    # it was passed to `train --data FILE --schema` and read the raw file as ids
    assert "it does not read the raw file (for that: `ranknas data schema FILE" in said
    (tmp_path / "schema.yaml").write_text(said)
    schema = DatasetSchema.from_yaml(tmp_path / "schema.yaml")
    assert [f.cardinality for f in schema.categorical][:3] == [50, 7, 3000]
    assert main(["arch", "show", "dlrm", "--schema", str(tmp_path / "schema.yaml")]) == 0
    capsys.readouterr()
    assert main(["data", "schema", str(tmp_path / "study.yaml"), "--label", "clicked"]) == 2
    assert "--label and --time are for data files" in capsys.readouterr().err
    (tmp_path / "log.csv").write_text("clicked,price\n1,0.5\n0,0.2\n")
    assert main(["data", "schema", str(tmp_path / "log.csv")]) == 2
    assert "give --label COLUMN" in capsys.readouterr().err


def test_a_label_that_is_not_0_1_is_refused_by_name_when_inferring_and_loading(
    tmp_path, capsys, caplog
):
    from nas.cli import main

    rows = [f"{'click' if i % 3 else 'skip'},{i * 0.37:.2f},u{i % 9}" for i in range(50)]
    (tmp_path / "events.csv").write_text("clicked,price,user\n" + "\n".join(rows) + "\n")
    assert main(["data", "schema", str(tmp_path / "events.csv"), "--label", "clicked"]) == 2
    err = capsys.readouterr().err
    assert "events.csv: the label column 'clicked' holds 'skip', 'click', not 0/1" in err
    (tmp_path / "schema.yaml").write_text("label: clicked\ndense: [price]\ncategorical: [user]\n")
    with pytest.raises(RanknasError, match=r"all 50 lines are malformed .*label not 0/1"):
        load_tabular(tmp_path / "events.csv", tmp_path / "schema.yaml")
    # a few rows of another label: inferred, and said (it exited 0 without a word)
    rows = [f"{2 if i == 7 else i % 2},{i * 0.37:.2f},u{i % 9}" for i in range(500)]
    (tmp_path / "events.csv").write_text("clicked,price,user\n" + "\n".join(rows) + "\n")
    assert main(["data", "schema", str(tmp_path / "events.csv"), "--label", "clicked"]) == 0
    assert "the label column 'clicked' holds '2', not 0/1, in 1 of 500 rows: training" in (
        caplog.text
    )
    # blank labels too: inferred without a word, then the study refused the file
    for every, expected in ((10, "refused"), (100, "said")):
        rows = [f"{'' if i % every == 3 else i % 2},{i * 0.37:.2f},u{i % 9}" for i in range(500)]
        (tmp_path / "events.csv").write_text("clicked,price,user\n" + "\n".join(rows) + "\n")
        caplog.clear()
        code = main(["data", "schema", str(tmp_path / "events.csv"), "--label", "clicked"])
        err = capsys.readouterr().err
        if expected == "refused":
            missing = "holds missing values (blank or NaN), not 0/1"
            assert code == 2 and f"'clicked' {missing}" in err, err
            assert "in 50 of 500 rows" in err and "in every row" in err
        else:
            said = "holds missing values (blank or NaN), not 0/1, in 5 of 500 rows"
            assert code == 0 and said in caplog.text
    # under 1% but over a load's 1,000 rows: said, naming the limit a study would stop at
    import pandas as pd

    from trainers.data.tabular import _check_label

    labels = pd.Series(["1", "0"] * 100_000, name="clicked")
    labels[:1_500] = ""
    caplog.clear()
    _check_label(tmp_path / "events.csv", labels)
    assert "in 1500 of 200000 rows: a study skips those as malformed with data.max_bad_rows " \
        "above 1500 (it stops at 1000)" in caplog.text  # fmt: skip


def test_labels_as_words_and_missing_numbers_as_exports_write_them(files, tmp_path):
    """yes/no and true/false labels (any case) are 1/0; N/A, NaN, null... in a dense column
    are missing values (filled like blanks), while "NA" in a categorical column is a value."""
    from trainers.data.tabular import infer_schema

    words = {"1": " Yes", "0": "false"}
    lines = CSV.splitlines()
    rows = [",".join([words[r.split(",")[0]], *r.split(",")[1:]]) for r in lines[1:]]
    rows[1] = rows[1].replace("2.5,,de", "2.5,N/A,NA")  # age missing, country Namibia
    (tmp_path / "words.csv").write_text("\n".join([lines[0], *rows]) + "\n")
    data = load_tabular(tmp_path / "words.csv", files[1])
    np.testing.assert_array_equal(data.labels, [1, 0, 0, 1, 0])
    assert np.isnan(data.dense[1, 1]) and data.bad_rows.bad == 0
    country = data.raw_values["country"]
    assert country.values[country.codes.values[1]] == "NA"
    ages = ["null", "nan", "NULL", "n/a", "None"] + [str(20 + i) for i in range(60)]
    (tmp_path / "ages.csv").write_text(
        "y,age\n" + "\n".join(f"{'TRUE' if i % 2 else 'False'},{a}" for i, a in enumerate(ages))
    )
    assert infer_schema(tmp_path / "ages.csv", "y") == {
        "name": "ages", "label": "y", "dense": ["age"], "categorical": []}  # fmt: skip


@pytest.mark.parametrize("name", ["log.csv.gz", "log.tsv.bz2", "log.csv.xz", "log.tsv"])
def test_compressed_and_tab_separated_files_read_as_the_plain_csv(files, tmp_path, name):
    import bz2
    import gzip
    import lzma

    from trainers.data.tabular import infer_schema

    text = CSV if ".csv" in name else CSV.replace(",", "\t")
    text += "0,1,1,us,1,x,extra\n" if ".csv" in name else "0\t1\t1\tus\t1\tx\textra\n"
    opener = {".gz": gzip.open, ".bz2": bz2.open, ".xz": lzma.open}.get(Path(name).suffix, open)
    with opener(tmp_path / name, "wt") as out:
        out.write(text)
    data = load_tabular(tmp_path / name, files[1], max_bad_fraction=None)
    check_shop(data)  # the line of 7 fields is found in the decompressed text, by its number
    assert data.bad_rows.examples == {"wrong number of fields (the header has 6)": [7]}
    assert infer_schema(tmp_path / name, "clicked")["dense"] == ["price"]
    assert load_dataset(str(tmp_path / name), files[1], max_bad_fraction=None).bad_rows.bad == 1
    if name.endswith((".gz", ".bz2", ".xz")):  # a download cut short: one line, no traceback
        cut = tmp_path / f"cut-{name}"
        cut.write_bytes((tmp_path / name).read_bytes()[:-12])
        with pytest.raises(RanknasError, match=r"cut-log.* cut short or damaged .* download"):
            load_tabular(cut, files[1])


def test_a_file_separated_by_another_character_is_refused_saying_which(files, tmp_path, capsys):
    from nas.cli import main

    (tmp_path / "excel.csv").write_text(CSV.replace(",", ";").replace("1.5", "1,5"))
    assert main(["data", "schema", str(tmp_path / "excel.csv"), "--label", "clicked"]) == 2
    err = capsys.readouterr().err
    assert "excel.csv: its header 'clicked;price;age;country;slot;unused' is one column " in err
    assert "separated by ';', not ','; write it with commas" in err
    (tmp_path / "log.tsv").write_text(CSV)
    tabs = r"log\.tsv: .* separated by ',', not '\\t'; name it \.csv"
    with pytest.raises(RanknasError, match=tabs):
        load_tabular(tmp_path / "log.tsv", files[1])


def test_a_file_that_is_not_utf8_is_refused_saying_what_to_do(files, tmp_path):
    bad = CSV.replace("de", "d\xe9").encode("latin-1")
    (tmp_path / "latin.csv").write_bytes(bad)
    at, lines = bad.index(b"\xe9"), bad[: bad.index(b"\xe9")].splitlines()
    where = rf"line {len(lines)}, byte {at} \(0xe9\)"  # the é is on the last line begun
    with pytest.raises(RanknasError, match=rf"latin\.csv: not UTF-8 text: {where}; save it as"):
        load_tabular(tmp_path / "latin.csv", files[1])


def test_a_directory_given_as_the_file_to_infer_a_schema_of_is_named_as_such(tmp_path):
    """`ranknas data schema DIR` said "unknown file type", of a folder. A directory is read
    as its Parquet files: one without any says so."""
    from trainers.data.tabular import infer_schema

    (tmp_path / "logs.csv").mkdir()
    (tmp_path / "logs.csv" / "part-0.csv").write_text("clicked,x\n1,2\n")
    with pytest.raises(RanknasError, match=r"logs\.csv: no \.parquet files in this directory"):
        infer_schema(tmp_path / "logs.csv", "clicked")


def test_a_repeated_header_line_is_not_counted_as_values(tmp_path, caplog):
    """Two logs joined with `cat`: the second header's names were counted as values, so a
    constant column became a categorical feature of two values."""
    from trainers.data.tabular import infer_schema

    lines = [f"{i % 3 == 0:d},{i / 7:.3f},7.0,s{i % 20}" for i in range(600)]
    header = "clicked,price,const,shop"
    (tmp_path / "joined.csv").write_text("\n".join([header, *lines[:300], header, *lines[300:]]))
    schema = infer_schema(tmp_path / "joined.csv", "clicked")
    assert schema["dense"] == ["price"]
    assert schema["categorical"] == [{"name": "shop", "cardinality": 22, "min_count": 1}]
    assert "inferred without 1 repeats of the header line" in caplog.text
    assert "left out const: the same value on every row" in caplog.text


def test_values_are_counted_as_training_reads_them_without_surrounding_spaces(tmp_path, caplog):
    """`data schema` counted " s1" and "s1" as two values (training strips both to one): a
    cardinality too large, and a column of one value padded two ways kept as a feature."""
    from trainers.data.tabular import infer_schema

    lines = [
        f"{i % 3 == 0:d},{i / 7:.3f},{' ' * (i % 2)}x,{' ' * (i % 2)}s{i % 20}" for i in range(600)
    ]
    (tmp_path / "padded.csv").write_text("\n".join(["clicked,price,const,shop", *lines]))
    schema = infer_schema(tmp_path / "padded.csv", "clicked")
    assert schema["categorical"] == [{"name": "shop", "cardinality": 22, "min_count": 1}]
    assert "left out const: the same value on every row" in caplog.text


def test_the_first_byte_that_is_not_utf8_is_found_past_a_read_s_buffer(tmp_path):
    """The error said "can't decode byte 0xff in position 0" of a byte on line 51: a
    position inside pandas' buffer. A character split across two reads is UTF-8."""
    from trainers.data.tabular import _first_non_utf8

    good = "é".encode()
    head = b"x" * ((1 << 20) - 1) + good + b"\n" * 3  # the é across the first read's end
    (tmp_path / "deep.csv").write_bytes(head + b"ab\xffc\n")
    assert _first_non_utf8(tmp_path / "deep.csv") == f": line 4, byte {len(head) + 2} (0xff)"
    (tmp_path / "fine.csv").write_bytes(head)
    assert _first_non_utf8(tmp_path / "fine.csv") == ""
    (tmp_path / "cut.csv").write_bytes(b"a,b\n1,\xe2\x82")  # cut inside a character
    assert _first_non_utf8(tmp_path / "cut.csv") == (
        ": line 2, its last 2 byte(s) begin a character it never ends"
    )
    import gzip

    (tmp_path / "deep.csv.gz").write_bytes(gzip.compress(head + b"ab\xffc\n"))
    assert _first_non_utf8(tmp_path / "deep.csv.gz") == (
        f": line 4, byte {len(head) + 2} of its decompressed text (0xff)"
    )


def test_a_compressed_parquet_file_is_refused_saying_what_to_do(files, tmp_path):
    import gzip

    pytest.importorskip("pyarrow")
    from trainers.data.tabular import write_tabular

    write_tabular(load_tabular(*files), tmp_path / "log.parquet")
    (tmp_path / "log.parquet.gz").write_bytes(
        gzip.compress((tmp_path / "log.parquet").read_bytes())
    )
    with pytest.raises(
        RanknasError, match=r"log\.parquet\.gz: a compressed Parquet file.*decompress"
    ):
        load_tabular(tmp_path / "log.parquet.gz", files[1])
    with pytest.raises(
        RanknasError, match=r"log\.json: unknown file type; use one of \.csv, \.tsv"
    ):
        load_tabular(tmp_path / "log.json", files[1])


# ---------------------------------------------------------------- vocabularies and lists


def _shop_log(tmp_path, shops, schema_entry):
    """A CSV with one categorical column `shop` (the given values, in time order)."""
    rows = [f"{i % 2},{i}.5,{shop},{i}" for i, shop in enumerate(shops)]
    (tmp_path / "log.csv").write_text("y,price,shop,t\n" + "\n".join(rows) + "\n")
    (tmp_path / "schema.yaml").write_text(
        f"label: y\ndense: [price]\ncategorical: [{schema_entry}]\ntime: t\n"
    )
    return load_tabular(tmp_path / "log.csv", tmp_path / "schema.yaml")


def test_a_categorical_column_blank_in_every_row_is_named_in_a_warning(tmp_path, caplog):
    """`data schema` leaves such a column out; one a schema names trained silently as a
    feature that tells nothing."""
    data = _shop_log(tmp_path, [""] * 20, "shop")
    assert set(data.categorical[:, 0]) == {0}  # the missing id
    assert "categorical column(s) ['shop'] hold no value in any row" in caplog.text
    caplog.clear()
    _shop_log(tmp_path, [""] * 19 + ["a"], "shop")
    assert "hold no value" not in caplog.text


def test_a_dense_column_with_one_value_is_named_in_a_warning(tmp_path, caplog):
    """`data schema` leaves such a column out; one a schema names trained silently, scaled
    to 0 in every row."""
    from trainers.data.preprocess import fit_preprocessing

    data = _shop_log(tmp_path, ["a", "b"] * 10, "shop")
    fit_preprocessing(data)
    assert "dense column" not in caplog.text
    data.dense[:, 0] = 4.5
    fit_preprocessing(data)
    said = "log.csv: dense column(s) ['price'] hold one value (or none) in every training row"
    assert said in caplog.text


def test_min_count_is_counted_on_the_training_split(tmp_path):
    from trainers.data.preprocess import apply_preprocessing, fit_preprocessing

    # "pop": 2 of the 80 training rows, 10 of the 20 later ones; "old": 38 training rows
    shops = ["pop" if i in (3, 7) else "old" if i % 2 else f"u{i}" for i in range(80)]
    data = _shop_log(tmp_path, shops + ["pop"] * 10 + ["new"] * 10, "{name: shop, min_count: 3}")
    assert data.categorical[-11, 0] == 3  # over the whole file pop (12 rows) is frequent
    train, valid, test = data.split(fractions=(0.8, 0.1, 0.1), method="time")
    fitted = fit_preprocessing(train)
    assert fitted["vocabulary"] == {"shop": ["old"]} and fitted["min_count"] == {"shop": 3}
    train, valid, test = (apply_preprocessing(p, fitted) for p in (train, valid, test))
    assert train.schema.categorical[0].cardinality == 3  # missing, out of vocabulary, old
    assert set(train.categorical[:, 0]) == {1, 2} and train.categorical[3, 0] == 1  # rare pop
    assert set(valid.categorical[:, 0]) == {1} and set(test.categorical[:, 0]) == {1}  # unseen


def test_hashed_ids_are_stable_across_processes_and_equal_in_the_export(tmp_path):
    import subprocess
    import sys

    from nas.export import standalone_template
    from search_space.preprocessing import hash_bucket
    from trainers.data.preprocess import apply_preprocessing, fit_preprocessing

    shops = [f"shop-{i % 37}" for i in range(200)] + [""]
    data = _shop_log(tmp_path, shops, "{name: shop, hash_size: 64}")
    train, _, test = data.split(method="time")
    fitted = fit_preprocessing(train)
    assert fitted["hashing"] == {"shop": 64} and fitted["vocabulary"] == {}
    test = apply_preprocessing(test, fitted)
    assert test.schema.categorical[0].cardinality == 64
    raw = [shops[i] for i in data.split_indices(method="time")[2]]
    ids = test.categorical[:, 0].tolist()
    assert ids[-1] == 0 and all(1 <= i < 64 for i in ids[:-1])  # blank: missing
    assert ids[:-1] == [hash_bucket(s, 64) for s in raw[:-1]]
    code = "from search_space.preprocessing import hash_bucket; import sys; " \
           "print([hash_bucket(s, 64) for s in sys.argv[1:]])"  # fmt: skip
    for seed in ("1", "2"):  # Python's own str hash differs between these processes
        env = {"PYTHONHASHSEED": seed, "PATH": "/usr/bin:/bin"}
        out = subprocess.run([sys.executable, "-c", code, *raw[:-1]], env=env, text=True,
                             capture_output=True, check=True, cwd=Path.cwd()).stdout  # fmt: skip
        assert json.loads(out) == ids[:-1]
    (tmp_path / "preprocessing.json").write_text(json.dumps(fitted))
    served = standalone_template.encode_ids([raw], ["shop"], tmp_path)
    assert served[:, 0].tolist() == ids


def test_ids_written_with_leading_zeros_are_found_when_served_as_numbers(tmp_path):
    """Zip codes "00425" served from `pandas.read_csv` (which reads them as 425) were out of
    vocabulary, silently: NE 0.91 where the test NE was 0.83. A text "425" is still as given."""
    import pandas as pd

    from nas.export import standalone_template
    from trainers.data.preprocess import apply_preprocessing, fit_preprocessing

    zips = [f"{(i % 40) * 97:05d}" for i in range(400)]
    data = _shop_log(tmp_path, zips, "shop")
    fitted = fit_preprocessing(data)
    trained = apply_preprocessing(data, fitted).categorical[:, 0].tolist()
    (tmp_path / "preprocessing.json").write_text(json.dumps(fitted))
    frame = pd.read_csv(tmp_path / "log.csv")
    assert frame["shop"].dtype == "int64"  # the zeros are gone
    served = standalone_template.encode_ids([frame["shop"].tolist()], ["shop"], tmp_path)
    assert served[:, 0].tolist() == trained
    texts = [str(int(z)) for z in zips[:3]]  # "0", "97", "194": other texts than the file's
    assert standalone_template.encode_ids([texts], ["shop"], tmp_path)[1:, 0].tolist() == [1, 1]
    # "97.0": a float column written back to text (ids with blanks, through pandas)
    floats = [f"{int(z)}.0" for z in zips[:3]]
    assert (
        standalone_template.encode_ids([floats], ["shop"], tmp_path)[:, 0].tolist() == (trained[:3])
    )
    # pandas' own missing value, from a nullable column, is missing (it raised TypeError)
    assert standalone_template.encode_ids([[pd.NA]], ["shop"], tmp_path)[:, 0].tolist() == [0]
    dense = standalone_template.prepare_dense([[pd.NA]], tmp_path)  # the mean: 0 once scaled
    assert dense.tolist() == [[0.0]]


def test_a_hashed_column_of_numbers_serves_them_as_its_file_wrote_them(tmp_path):
    """A hashed value is its text's hash: pandas reads a CSV column of ids with blanks as
    floats, and a served 118.0 went to another bucket than the file's 118 (the registered
    model's scores moved by up to 0.35, without a word). A Parquet column of floats wrote
    118.0: a served 118 is hashed as that."""
    import pandas as pd

    from nas.export import standalone_template
    from search_space.preprocessing import as_written
    from trainers.data.preprocess import apply_preprocessing, fit_preprocessing
    from trainers.data.stream import StreamOptions, open_stream

    ids = [str(i % 300) for i in range(400)] + [""]
    data = _shop_log(tmp_path, ids, "{name: shop, hash_size: 64}")
    fitted = fit_preprocessing(data)
    assert fitted["whole_numbers"] == {"shop": "int"}
    trained = apply_preprocessing(data, fitted).categorical[:, 0].tolist()
    (tmp_path / "preprocessing.json").write_text(json.dumps(fitted))
    frame = pd.read_csv(tmp_path / "log.csv")
    assert frame["shop"].dtype == float  # 118.0: the blank made it a float column
    for served in (frame["shop"].tolist(), ids, [int(i) if i else None for i in ids]):
        assert standalone_template.encode_ids([served], ["shop"], tmp_path)[:, 0].tolist() == (
            trained)  # fmt: skip
    # written as floats (a Parquet column of them): a served 118 is its 118.0
    frame.to_parquet(tmp_path / "log.parquet")
    floats = load_tabular(tmp_path / "log.parquet", tmp_path / "schema.yaml")
    fitted = fit_preprocessing(floats)
    assert fitted["whole_numbers"] == {"shop": "float"}
    trained = apply_preprocessing(floats, fitted).categorical[:, 0].tolist()
    (tmp_path / "preprocessing.json").write_text(json.dumps(fitted))
    assert standalone_template.encode_ids([ids], ["shop"], tmp_path)[:, 0].tolist() == trained
    streamed = open_stream(str(tmp_path / "log.parquet"), str(tmp_path / "schema.yaml"),
                           options=StreamOptions(chunk_rows=100, cache=False))  # fmt: skip
    assert streamed.fitted["whole_numbers"] == {"shop": "float"}
    # a column written both ways, or as as_written could not rebuild (118.00): as given
    for texts in (["7", "7.0", "a"] * 5, ["118.00", "7.00"] * 5):
        hashed = _shop_log(tmp_path, texts, "{name: shop, hash_size: 64}")
        assert fit_preprocessing(hashed)["whole_numbers"] == {}, texts
    # ids past 2**53 lost digits as floats: left as given, not made another id
    assert as_written("9007199254740992.0", "int") == "9007199254740992.0"
    assert as_written("-12.0", "int") == "-12" and as_written("-12", "float") == "-12.0"
    # streamed: a first chunk without a value does not hide the column's form
    blanks = [""] * 200 + [str(i % 50) for i in range(200)]
    (tmp_path / "late.csv").write_text("y,price,shop,t\n" + "\n".join(
        f"{i % 2},{i}.5,{shop},{i}" for i, shop in enumerate(blanks)) + "\n")  # fmt: skip
    pd.read_csv(tmp_path / "late.csv", dtype={"shop": str}).to_parquet(tmp_path / "late.parquet")
    streamed = open_stream(str(tmp_path / "late.parquet"), str(tmp_path / "schema.yaml"),
                           options=StreamOptions(chunk_rows=100, cache=False))  # fmt: skip
    assert streamed.fitted["whole_numbers"] == {"shop": "int"}


def test_encoding_settings_in_the_schema_are_checked(tmp_path):
    schema = tmp_path / "s.yaml"
    cases = {
        "{name: slot, cardinality: 4, hash_size: 8}": "cardinality is its hash_size",
        "{name: shop, min_count: 2, hash_size: 10}": "not both",
        "{name: shop, hash_size: 1}": "hash_size must be an integer >= 2",
        "{name: shop, separator: ';'}": "'separator' needs 'multi_valued: true'",
        "{name: shop, pooling: mean}": "'pooling' needs 'multi_valued: true'",
        "{name: shop, multi_valued: true, pooling: max}": "'pooling' must be one of sum, mean",
        "{name: shop, colour: red}": r"unknown field\(s\) \['colour'\]",
    }
    for entry, message in cases.items():
        schema.write_text(f"label: y\ncategorical: [{entry}]\n")
        with pytest.raises(RanknasError, match=message):
            read_tabular_schema(schema)


def test_a_list_column_becomes_multi_hot_ids(tmp_path):
    from helpers import write_genre_log

    csv, schema = write_genre_log(tmp_path, rows=40)
    lines = csv.read_text().splitlines()
    fields = lines[1].split(",")
    lines[1] = ",".join([fields[0], fields[1], "", *fields[3:]])  # a blank list: missing
    lines[2] = ",".join([*lines[2].split(",")[:2], " g1 | g2 |g1", *lines[2].split(",")[3:]])
    csv.write_text("\n".join(lines) + "\n")
    data = load_tabular(csv, schema)
    genres = data.schema.categorical[1]
    assert genres.multi_valued and genres.pooling == "mean"
    assert (data.categorical[:, 1] == -1).all()  # never read as one id per row
    lists = data.multi_hot["genres"]
    rows = [lists.values[a:b].tolist() for a, b in itertools.pairwise(lists.offsets)]
    assert rows[0] == [0]
    vocabulary = data.raw_values["genres"].values
    g1, g2 = (vocabulary.index(g) for g in ("g1", "g2"))
    assert rows[1][0] == rows[1][2] != rows[1][1] and all(i >= 2 for i in rows[1])
    assert {g1, g2} <= set(range(len(vocabulary)))
    batch = next(iter(data.loader(8, shuffle=True, seed=3)))
    assert batch.sparse.keys() == ["shop", "genres"]
    assert (batch.sparse["shop"].lengths() == 1).all()
    assert batch.sparse["genres"].lengths().max() > 1
    order = np.random.default_rng([3, 0]).permutation(len(data))[:8]
    expected = [rows[i] for i in order]
    got = batch.sparse["genres"].to_dense()
    assert [g.tolist() for g in got] == expected
    from trainers.distributed import one_hot_ids

    with pytest.raises(RanknasError, match="multi-valued"):  # it would slice wrong rows
        one_hot_ids(batch.sparse, 2)


def test_a_bad_list_cell_names_the_column_and_the_line(tmp_path):
    from helpers import write_genre_log

    csv, schema = write_genre_log(tmp_path, rows=40)
    lines = csv.read_text().splitlines()
    fields = lines[5].split(",")
    lines[5] = ",".join([*fields[:2], "g1||g2", *fields[3:]])
    csv.write_text("\n".join(lines) + "\n")
    with pytest.raises(RanknasError) as error:
        load_tabular(csv, schema, max_bad_rows=0)
    assert "bad list cell (genres): an empty item (separator '|'): 1 (line 6)" in str(error.value)
    data = load_tabular(csv, schema, max_bad_fraction=None)
    assert len(data) == 39 and data.bad_rows.bad == 1


def test_a_separator_that_splits_no_cell_is_said(tmp_path, caplog):
    """A schema naming `;` for a column of `a|b` cells trained on each whole text as one
    item, without a word (2,776 \"tags\" where 30 were meant)."""
    from helpers import write_genre_log

    csv, schema = write_genre_log(tmp_path, rows=40)
    load_tabular(csv, schema)
    assert "holds its separator" not in caplog.text  # the right one: nothing to say
    schema.write_text(schema.read_text().replace('separator: "|"', "separator: ';'"))
    data = load_tabular(csv, schema)
    assert data.multi_hot["genres"].values.size == len(data)  # one item a row: as it was said
    assert "no cell of the multi-valued column 'genres' holds its separator ';'" in caplog.text
    assert "set `separator: '|'` in the schema" in caplog.text


def test_a_parquet_list_column_reads_as_its_csv_form(tmp_path):
    pd = pytest.importorskip("pandas")
    pytest.importorskip("pyarrow", reason="Parquet needs pyarrow")
    from helpers import write_genre_log

    csv, schema = write_genre_log(tmp_path, rows=60)
    frame = pd.read_csv(csv, keep_default_na=False)
    # a null element (Spark and pandas write them) is no item: it was a malformed row
    frame["genres"] = [cell.split("|") + [None] * (i % 3 == 0) for i, cell in
                       enumerate(frame["genres"])]  # fmt: skip
    frame.to_parquet(tmp_path / "genres.parquet")
    from_csv = load_tabular(csv, schema)
    from_parquet = load_tabular(tmp_path / "genres.parquet", schema)
    for name in ("offsets", "values"):
        np.testing.assert_array_equal(
            getattr(from_csv.multi_hot["genres"], name),
            getattr(from_parquet.multi_hot["genres"], name),
        )
    from trainers.data.tabular import infer_schema

    inferred = infer_schema(tmp_path / "genres.parquet", "clicked")
    assert {"name": "genres", "cardinality": 14, "multi_valued": True, "pooling": "mean"} in (
        inferred["categorical"]
    )


def test_data_schema_finds_a_list_column_and_training_learns_from_it(tmp_path, capsys):
    from helpers import write_genre_log
    from nas.cli import main

    csv, _ = write_genre_log(tmp_path)
    assert main(["data", "schema", str(csv), "--label", "clicked", "--time", "t"]) == 0
    text = capsys.readouterr().out
    schema = yaml.safe_load(text)
    assert {"name": "genres", "cardinality": 14, "multi_valued": True, "pooling": "mean",
            "separator": "|"} in schema["categorical"]  # fmt: skip
    assert schema["dense"] == ["price"]
    (tmp_path / "inferred.yaml").write_text(text)
    assert main(["arch", "show", "dlrm", "--schema", str(tmp_path / "inferred.yaml")]) == 0
    capsys.readouterr()
    args = ["train", "--arch", "dlrm", "--data", str(csv), "--schema",
            str(tmp_path / "genres.yaml"), "--epochs", "3", "--batch-size", "128",
            "--json"]  # fmt: skip
    assert main(args) == 0
    out, err = capsys.readouterr()
    assert "training-split vocabularies (shop 5, genres 12" in err
    assert json.loads(out)["val_ne"] < 0.9  # the lists carry the signal


def test_a_line_with_too_many_or_too_few_fields_is_skipped_by_line(tmp_path, files, caplog):
    """pandas keeps such a line as a row whose values sit in the wrong columns (the last
    field dropped, or blanks): each is reported by its line, and `data schema` reads the
    file instead of stopping at the first one, and says which lines it left out."""
    from trainers.data.tabular import infer_schema

    path = tmp_path / "shifted.csv"
    path.write_text(CSV + "0,2.5,30,us,1,x,extra\n1,2.5,30,us\n")  # lines 7 and 8
    data = load_tabular(path, files[1], max_bad_fraction=None)
    assert len(data) == 5 and data.bad_rows.bad == 2
    assert data.bad_rows.examples["wrong number of fields (the header has 6)"] == [7, 8]
    # a short line is that reason's alone (it was also "label not 0/1"): no blank "filled"
    short = tmp_path / "short.csv"
    short.write_text(CSV.replace("0,2.5,,de,0,x", "0,2.5,40,de,0,x") + "1,2.5\n")  # line 7
    caplog.clear()
    data = load_tabular(short, files[1], max_bad_fraction=None)
    assert data.bad_rows.reasons == {"wrong number of fields (the header has 6)": 1}
    assert "filled with the training mean" not in caplog.text
    caplog.clear()
    assert infer_schema(path, "clicked")["dense"] == ["price"]
    assert "inferred without 2 malformed lines" in caplog.text and "7, 8" in caplog.text


def test_a_cell_longer_than_python_csv_s_default_limit_is_read(tmp_path, files):
    """A 200,000-character cell (a pasted document) was a `_csv.Error: field larger than
    field limit (131072)` traceback from the field-count check; pandas reads it."""
    from trainers.data.tabular import infer_schema

    path = tmp_path / "long.csv"
    lines = CSV.splitlines()
    lines[2] = lines[2].replace("de", "d" * 200_000)
    path.write_text("\n".join(lines) + "\n")
    assert len(load_tabular(path, files[1])) == len(lines) - 1
    assert infer_schema(path, "clicked")["label"] == "clicked"


def test_a_bad_row_after_a_field_of_two_lines_or_a_blank_line_is_named_by_its_line(tmp_path, files):
    """The line numbers counted records: after a quoted field holding a line break, a bad
    label on line 8 was told as line 7, where the user found a valid row."""
    path = tmp_path / "quoted.csv"
    lines = CSV.splitlines()
    lines[2] = lines[2].replace("de", '"d\ne"')  # line 3 spans lines 3 and 4
    path.write_text("\n".join([*lines, "", "x,1,30,us,1,x", "0,1,2,us,1,x,9"]) + "\n")
    data = load_tabular(path, files[1], max_bad_fraction=None)
    assert data.bad_rows.examples == {
        "label not 0/1, true/false or yes/no (clicked)": [9],
        "wrong number of fields (the header has 6)": [10],
    }


def test_data_schema_takes_a_column_of_dates_as_the_time(tmp_path, capsys):
    from nas.cli import main

    rows = [f"{i % 2},2026-03-{1 + i % 28:02d}T10:{i % 60:02d}:00,{i * 0.37:.2f},U-{i % 9:06d}"
            for i in range(120)]  # fmt: skip
    (tmp_path / "log.csv").write_text("clicked,event_time,price,user\n" + "\n".join(rows))
    assert main(["data", "schema", str(tmp_path / "log.csv"), "--label", "clicked"]) == 0
    text = capsys.readouterr().out
    assert "# time: event_time holds dates" in text
    schema = yaml.safe_load(text)
    assert schema["time"] == "event_time" and schema["dense"] == ["price"]
    assert [c["name"] for c in schema["categorical"]] == ["user"]  # ids like U-000003: no date


def test_dates_written_several_ways_are_said_not_taken_silently(tmp_path, capsys, caplog):
    """`2024-01-01`, `01/01/2024` and `20240101` in one column: no time column, the rows split
    in file order, without a word. Month names alone (a cycle, not a
    time) were taken as the time column: no dates."""
    from nas.cli import main

    ways = ("2024-01-{:02d}", "01/{:02d}/2024", "202401{:02d}")
    months = ("jan", "feb", "mar", "apr")
    rows = [f"{i % 2},{ways[i % 3].format(1 + i // 8)},{months[i % 4]},{i * 0.37:.2f}"
            for i in range(120)]  # fmt: skip
    (tmp_path / "log.csv").write_text("clicked,day,month,price\n" + "\n".join(rows))
    assert main(["data", "schema", str(tmp_path / "log.csv"), "--label", "clicked"]) == 0
    warned = [r.getMessage() for r in caplog.records if "more than one way" in r.getMessage()]
    ways = "day holds dates written in more than one way (2024-01-01, 01/01/2024, 20240101)"
    assert len(warned) == 1 and ways in warned[0] and "pass --time day" in warned[0], warned
    assert "time" not in yaml.safe_load(capsys.readouterr().out)  # not `month` either


def test_data_schema_refuses_a_time_column_of_words(tmp_path, capsys):
    """`--time city` (a column of words) was written as the time: training then found all
    its lines malformed ("time not a number or a date (city)")."""
    from nas.cli import main

    rows = [f"{i % 2},{('Paris', 'Lyon', 'Nice')[i % 3]},{i * 0.37:.2f},{i}" for i in range(200)]
    (tmp_path / "v.csv").write_text("clicked,city,price,t\n" + "\n".join(rows) + "\n")
    args = ["data", "schema", str(tmp_path / "v.csv"), "--label", "clicked", "--time"]
    assert main([*args, "city"]) == 2
    out, err = capsys.readouterr()
    assert not out and err.count("\n") == 1
    assert "v.csv: the time column 'city' holds 'Paris', 'Lyon', 'Nice', not numbers or " in err
    assert "a time column holds numbers (epoch seconds) or dates" in err
    assert main([*args, "t"]) == 0 and yaml.safe_load(capsys.readouterr().out)["time"] == "t"


def test_schema_inference_says_a_column_has_thousands_separators(tmp_path, caplog):
    """A price written "1,234.56" (quoted in the CSV) is no number to pandas, nor to training:
    the column was left out as a row key, with advice to add it under categorical."""
    from trainers.data.tabular import infer_schema

    rng = np.random.default_rng(0)
    prices = [f'"{p:,.2f}"' for p in rng.uniform(10, 5000, 300)]  # some under 1,000
    rows = [f"{i % 2},{p},{i * 0.37:.2f}" for i, p in enumerate(prices)]
    (tmp_path / "log.csv").write_text("clicked,price,x\n" + "\n".join(rows) + "\n")
    with caplog.at_level("WARNING"):
        schema = infer_schema(tmp_path / "log.csv", "clicked")
    assert schema["dense"] == ["x"] and schema["categorical"] == []
    first = next(p.strip('"') for p in prices if "," in p)
    said = f"left out price: it holds numbers written with thousands separators ({first!r}); "
    assert said + "write them without the separators to use it as a dense feature" in caplog.text
    assert "names the row" not in caplog.text


def test_one_number_with_a_separator_leaves_its_dense_column_dense(tmp_path):
    """One stray "1,234" among 300 plain numbers is a bad row of a dense column (skipped
    under the bad-row limits), not a column written with separators."""
    from trainers.data.tabular import infer_schema

    prices = [f"{10 + i * 1.5:.2f}" for i in range(300)]
    prices[7] = '"1,234.50"'
    rows = [f"{i % 2},{p}" for i, p in enumerate(prices)]
    (tmp_path / "log.csv").write_text("clicked,price\n" + "\n".join(rows) + "\n")
    assert infer_schema(tmp_path / "log.csv", "clicked")["dense"] == ["price"]


def test_schema_inference_suggests_an_epoch_column_named_as_a_time(tmp_path, caplog):
    """Epoch seconds in `ts` (and milliseconds in `event_time`, `ts_ms`, `created_at`) were
    listed under dense; they are left out with the `--time` to pass (with --time given, the
    other times are left out too: they were dense). Large numbers under another name
    (`bytes`) and small numbers in `ts` stay dense."""
    from trainers.data.tabular import infer_schema

    start = 1_772_323_200  # 2026-03-01 00:00 UTC
    columns = {
        "clicked": [i % 2 for i in range(200)],
        "ts": [start + 97 * i for i in range(200)],
        "event_time": [(start + 86_400 + 13 * i) * 1000 for i in range(200)],
        "ts_ms": [(start + 5 * i) * 1000 for i in range(200)],
        "created_at": [start - 600 + 7 * i for i in range(200)],
        "bytes": [start + 31 * i for i in range(200)],
        "step": [3 * i for i in range(200)],  # (0, 1, 2, ... would number the rows)
    }
    path = tmp_path / "log.csv"
    path.write_text(",".join(columns) + "\n" + "\n".join(
        ",".join(str(values[i]) for values in columns.values()) for i in range(200)))  # fmt: skip
    with caplog.at_level("WARNING"):
        schema = infer_schema(path, "clicked")
    assert "time" not in schema and schema["dense"] == ["bytes", "step"]
    assert ("left out ts: it looks like a time column (epoch seconds, 2026-03-01 to 2026-03-01); "
            "pass --time ts to split in time order") in caplog.text  # fmt: skip
    assert "left out event_time: it looks like a time column (epoch milliseconds, 2026-03-02" in (
        caplog.text
    )
    assert "left out ts_ms" in caplog.text and "left out created_at" in caplog.text
    caplog.clear()
    with caplog.at_level("WARNING"):
        assert infer_schema(path, "clicked", time="ts")["dense"] == ["bytes", "step"]
    assert "left out event_time: it looks like a time column (epoch milliseconds" in caplog.text
    assert "the split's time is ts" in caplog.text
    small = [f"{i % 2},{2 * i}" for i in range(200)]
    (tmp_path / "small.csv").write_text("clicked,ts\n" + "\n".join(small))
    assert infer_schema(tmp_path / "small.csv", "clicked")["dense"] == ["ts"]


def test_schema_inference_suggests_dates_written_as_digits_as_the_time(tmp_path, caplog):
    """Avazu's `hour` (14102100: YYMMDDHH) was a dense feature and the split fell back to
    file order; so was a partition's `ds` (20241005). An hour of the day stays a feature."""
    from trainers.data.tabular import infer_schema

    rows = [f"{i % 2},{14102100 + (i // 50) % 24},{20241001 + i // 100},{i % 24},{i % 7}.5"
            for i in range(300)]  # fmt: skip
    path = tmp_path / "avazu.csv"
    path.write_text("click,hour,ds,hour_of_day,price\n" + "\n".join(rows))
    with caplog.at_level("WARNING"):
        schema = infer_schema(path, "click")
    assert "time" not in schema and schema["dense"] == ["price"]
    assert [c["name"] for c in schema["categorical"]] == ["hour_of_day"]
    assert ("left out hour: it looks like a time column (YYMMDDHH, 2014-10-21 to 2014-10-21); "
            "pass --time hour to split in time order") in caplog.text  # fmt: skip
    assert "left out ds: it looks like a time column (YYYYMMDD, 2024-10-01 to 2024-10-03)" in (
        caplog.text
    )
    timed = infer_schema(path, "click", time="hour")
    assert timed["time"] == "hour" and timed["dense"] == ["price"]


def test_schema_inference_leaves_out_a_second_date_column_as_dates(tmp_path, caplog):
    """A signup date beside the impression time (ISO 8601 with offsets) was left out as "a
    different value on every row names the row"; a few distinct days became a categorical
    whose later days a time split never saw in training."""
    from trainers.data.tabular import infer_schema

    rows = [f"{i % 2},2024-10-01T00:{i // 60 % 60:02d}:{i % 60:02d}-07:00,"
            f"2023-{1 + i % 12:02d}-{1 + i % 28:02d}T08:{i % 60:02d}:00-07:00,"
            f"2024-09-{1 + i % 3:02d},{i % 7}.5" for i in range(300)]  # fmt: skip
    path = tmp_path / "log.csv"
    path.write_text("click,ts,signup,campaign_day,price\n" + "\n".join(rows))
    with caplog.at_level("WARNING"):
        schema = infer_schema(path, "click")
    assert schema["time"] == "ts" and schema["dense"] == ["price"] and not schema["categorical"]
    assert ("left out signup: it holds dates (e.g. '2023-01-01T08:00:00-07:00'), not a feature "
            "new rows share; the split's time is ts") in caplog.text  # fmt: skip
    assert "left out campaign_day: it holds dates" in caplog.text
    assert "names the row" not in caplog.text


def test_schema_inference_warns_of_infinite_values_and_decimal_commas(tmp_path, caplog):
    """`inf` and 1e400 in a dense column passed `data schema` without a word (training then
    refused the file's rows), and prices written "22,09" became a categorical of 300
    values."""
    from trainers.data.tabular import infer_schema

    rows = [f"{i % 2},{'inf' if i == 7 else '1e400' if i == 9 else i * 0.37:},"
            f"\"{i % 97 + 1},{i * 7 % 100:02d}\"" for i in range(300)]  # fmt: skip
    path = tmp_path / "log.csv"
    path.write_text("click,price,amount\n" + "\n".join(rows))
    with caplog.at_level("WARNING"):
        schema = infer_schema(path, "click")
    assert schema["dense"] == ["price"] and not schema["categorical"] and "time" not in schema
    assert ("price holds 2 values that are no finite number (e.g. 'inf'): training skips "
            "their rows") in caplog.text  # fmt: skip
    assert "more than one way" not in caplog.text  # not dates either
    assert ("left out amount: it holds numbers written with a decimal comma ('1,00'); write "
            "them with a decimal point") in caplog.text  # fmt: skip
    caplog.clear()  # in a column of ids, "inf" is a value like any other: no rows skipped
    ids = [f"{i % 2},{'inf' if i == 3 else i % 5}" for i in range(200)]
    (tmp_path / "ids.csv").write_text("click,shop_id\n" + "\n".join(ids))
    with caplog.at_level("WARNING"):
        assert infer_schema(tmp_path / "ids.csv", "click")["categorical"][0]["name"] == "shop_id"
    assert "no finite number" not in caplog.text


def test_schema_inference_refuses_a_file_of_no_features_and_warns_of_one_label(tmp_path, caplog):
    """A file of the label alone got a schema of `dense: []`, `categorical: []` (training
    refused it later); a label of 1 in every row passed without a word."""
    from trainers.data.tabular import infer_schema

    (tmp_path / "label.csv").write_text("y\n1\n0\n1\n")
    with pytest.raises(RanknasError, match=r"label\.csv: no feature column besides the label"):
        infer_schema(tmp_path / "label.csv", "y")
    rows = [f"1,{i * 0.1:.1f}" for i in range(50)]
    (tmp_path / "clicks.csv").write_text("y,a\n" + "\n".join(rows))
    with caplog.at_level("WARNING"):
        assert infer_schema(tmp_path / "clicks.csv", "y")["dense"] == ["a"]
    assert "the label column 'y' is 1 in every row: a model needs clicks and non-clicks" in (
        caplog.text
    )


def test_schema_inference_takes_id_named_numbers_as_ids_and_leaves_out_row_keys(tmp_path, caplog):
    """A whole-number column named as ids is categorical however many values it has (a
    400-valued `city_id` was inferred dense); a column with a different id on every row (a
    request id, numeric or text) names rows and is left out, with a warning; a quantity with
    as many values (`paid`: "id" inside a word) stays dense."""
    from trainers.data.tabular import infer_schema

    rng = np.random.default_rng(0)
    n = 600
    columns = {
        "clicked": rng.integers(0, 2, n),
        "request_id": np.arange(n) * 7 + 1000,
        "session": [f"s-{i:06x}" for i in range(n)],
        "city_id": rng.integers(0, 400, n),
        "userId": rng.integers(0, 300, n),
        "paid": rng.integers(0, 3000, n),
        "slot": rng.integers(1, 6, n),
        "Item": rng.zipf(1.4, n) % 3000,  # named as what logs key by: ids
        "users_per_day": rng.integers(0, 3000, n),  # a count of them: a quantity
        "segment": ["all"] * n,  # one value everywhere (an export's constant): left out
        "ctr_7d": [0.0] * n,
        "coupon": [""] * n,  # blank everywhere
        "promo": [""] * (n - 1) + ["x"],  # one value, once: kept
    }
    path = tmp_path / "log.csv"
    path.write_text(",".join(columns) + "\n" + "\n".join(
        ",".join(str(values[i]) for values in columns.values()) for i in range(n)))  # fmt: skip
    caplog.clear()
    schema = infer_schema(path, "clicked")
    assert schema["dense"] == ["paid", "users_per_day"]
    assert [c["name"] for c in schema["categorical"]] == [
        "city_id", "userId", "slot", "Item", "promo"]  # fmt: skip
    assert "left out request_id, session: a different value" in caplog.text
    assert "left out segment, ctr_7d, coupon: the same value on every row" in caplog.text


def test_a_file_with_only_its_header_is_refused_naming_it(files, capsys):
    """It used to pass the load and fail later, in training, as "the training split has 0
    rows", after the vocabulary line; now the load names the file and why."""
    from nas.cli import main

    path, schema = files
    path.write_text(CSV.splitlines()[0] + "\n")
    with pytest.raises(RanknasError, match=r"log\.csv: nothing to train on: it holds no rows"):
        load_tabular(path, schema)
    assert main(["train", "--arch", "dlrm", "--data", str(path), "--schema", str(schema)]) == 2
    assert "log.csv: nothing to train on" in capsys.readouterr().err


def test_the_synthetic_true_probability_is_never_a_feature(tmp_path, capsys):
    """`data schema` on `data synth --format csv` listed true_prob as a dense feature: a model
    trained with it read the answer."""
    from nas.cli import main

    assert main(["data", "synth", "--out", str(tmp_path), "--rows", "600", "--format", "csv"]) == 0
    assert "true_prob" in (tmp_path / "data.csv").read_text().splitlines()[0]
    capsys.readouterr()
    assert main(["data", "schema", str(tmp_path / "data.csv"), "--label", "label"]) == 0
    schema = yaml.safe_load(capsys.readouterr().out)
    features = [*schema["dense"], *(c["name"] for c in schema["categorical"])]
    assert features and "true_prob" not in features

    schema["dense"].append("true_prob")  # by hand: refused by name
    (tmp_path / "leak.yaml").write_text(yaml.safe_dump(schema))
    train = ["train", "--arch", "dlrm", "--data", str(tmp_path / "data.csv"),
             "--schema", str(tmp_path / "leak.yaml")]  # fmt: skip
    assert main(train) == 2
    err = capsys.readouterr().err
    assert err.startswith("error:") and "leak.yaml: true_prob is the synthetic data's" in err


def test_schema_inference_of_a_few_bad_cells_a_count_and_no_rows(tmp_path, caplog):
    """3 cells "abc" in 600 prices made `price` categorical with 500 ids, silently; a
    whole-number count with few values is categorical, now said; a file of a header alone
    gave an empty schema and exit 0."""
    from trainers.data.tabular import infer_schema

    rng = np.random.default_rng(0)
    prices = [f"{p:.2f}" for p in rng.gamma(2.0, 30.0, 600)]
    prices[5] = prices[77] = prices[300] = "abc"
    user_ids = [str(i) for i in rng.integers(0, 400, 600)]
    user_ids[9] = "unknown"  # named as ids: stays categorical, a word among them or not
    pairs = enumerate(zip(prices, user_ids, strict=True))
    lines = [f"{i % 2},{p},{u},{i % 7}" for i, (p, u) in pairs]
    (tmp_path / "log.csv").write_text("clicked,price,user_id,views\n" + "\n".join(lines))
    with caplog.at_level("WARNING"):
        schema = infer_schema(tmp_path / "log.csv", "clicked")
    assert schema["dense"] == ["price"]
    assert [c["name"] for c in schema["categorical"]] == ["user_id", "views"]
    assert "price taken as dense: 3 of 600 values are not numbers (e.g. 'abc')" in caplog.text
    assert "whole numbers with few values: views (7 values)" in caplog.text
    (tmp_path / "header.csv").write_text("clicked,price,user_id\n")
    with pytest.raises(RanknasError, match=r"header\.csv: no schema to infer: it holds no rows"):
        infer_schema(tmp_path / "header.csv", "clicked")


def test_a_validation_split_too_small_to_rank_models_is_said(tmp_path, caplog, capsys):
    """30 rows trained and scored 3 validation rows without a word: `ranknas train` and a
    study (each way it splits its data) say so."""
    from nas.cli import main
    from nas.config import parse_config
    from nas.protocol import prepare_data

    main(["train", "--arch", "logistic_regression", "--rows", "400", "--examples", "64",
          "--batch-size", "32"])  # said before it trains, however its run ends  # fmt: skip
    said = "the validation split holds 40 rows"
    assert said in caplog.text and "at least (more rows, or a larger validation" in caplog.text
    caplog.clear()
    config = {"name": "small", "storage": f"sqlite:///{tmp_path / 's.db'}",
              "search_space": {"type": "dag"},
              "data": {"source": "synthetic", "rows": 1000}}  # fmt: skip
    prepare_data(parse_config(config))
    assert "the validation split holds 100 rows" in caplog.text
    caplog.clear()
    prepare_data(parse_config(config | {"data": {"source": "synthetic", "rows": 40_000}}))
    assert "validation split" not in caplog.text


def test_data_schema_says_what_a_new_user_s_odd_columns_are(tmp_path, capsys, caplog):
    """A new user's files, each taken silently for something it was not: dates written
    another way from a late row on became the time column (every later line then failed
    to load), pandas' index (`to_csv`'s default) became a dense feature, a file without a
    header (`--label 0` matched its first row) trained on its first row as names, ids of a
    merchant became a quantity, a time column of one value "split in time order", and a
    Parquet file named .csv was "not UTF-8 text"."""
    from nas.cli import main

    def schema(name: str, text: str, *args: str) -> int:
        (tmp_path / name).write_text(text)
        caplog.clear()
        return main(["data", "schema", str(tmp_path / name), "--label", "clicked", *args])

    iso, us = "2024-01-{:02d}", "01/{:02d}/2024"  # the second way from row 1,500 on
    late = [f"{i % 2},{(iso if i < 1500 else us).format(1 + i // 300)},{i * 0.37:.2f}"
            for i in range(2000)]  # fmt: skip
    assert schema("late.csv", "clicked,day,price\n" + "\n".join(late)) == 0
    assert "time" not in yaml.safe_load(capsys.readouterr().out)
    assert any("day holds dates written in more than one way" in r.getMessage()
               for r in caplog.records)  # fmt: skip
    assert schema("late.csv", "clicked,day,price\n" + "\n".join(late), "--time", "day") == 2
    assert "holds dates written in more than one way" in capsys.readouterr().err

    rng = np.random.default_rng(0)
    rows = [f"{i},{i % 2},{rng.normal():.3f},{rng.integers(0, 3000)}" for i in range(2000)]
    assert schema("indexed.csv", ",clicked,score,merchant\n" + "\n".join(rows)) == 0
    inferred = yaml.safe_load(capsys.readouterr().out)
    assert inferred["dense"] == ["score", "merchant"]
    said = " ".join(r.getMessage() for r in caplog.records)
    assert "left out Unnamed: 0: it numbers the rows" in said
    assert "taken as dense, whole numbers with many values: merchant" in said

    bare = "\n".join(f"{1700000000 + i},{i % 7 + 3},{rng.normal():.2f},{i % 2}" for i in range(300))
    (tmp_path / "bare.csv").write_text(bare)
    assert main(["data", "schema", str(tmp_path / "bare.csv"), "--label", "0"]) == 2
    assert "its first line holds numbers where names belong" in capsys.readouterr().err
    # training from it with a schema said the schema's names were wrong ("Fix the names")
    (tmp_path / "bare.yaml").write_text("label: clicked\ndense: [visits, price]\n")
    train = ["train", "--data", str(tmp_path / "bare.csv"), "--schema", str(tmp_path / "bare.yaml")]
    assert main([*train, "--arch", "logistic_regression"]) == 2
    assert "bare.csv: its first line holds numbers where names belong" in capsys.readouterr().err

    # not refused: pandas' default names for a matrix's columns, and dates written without
    # zero padding (1/5/2024 beside 12/15/2024: one way, however wide)
    numbered = "\n".join(f"{rng.normal():.3f},{rng.normal():.3f},{i % 2}" for i in range(300))
    assert schema("numbered.csv", "0,1,clicked\n" + numbered) == 0
    assert yaml.safe_load(capsys.readouterr().out)["dense"] == ["0", "1"]
    excel = "\n".join(f"{i % 2},{1 + i % 12}/{1 + i % 28}/2024,{rng.normal():.2f}"
                      for i in range(300))  # fmt: skip
    assert schema("excel.csv", "clicked,day,score\n" + excel, "--time", "day") == 0
    assert yaml.safe_load(capsys.readouterr().out)["time"] == "day"

    same = "\n".join(f"{i % 2},1700000000,{rng.normal():.2f}" for i in range(300))
    assert schema("same.csv", "clicked,ts,score\n" + same, "--time", "ts") == 2
    assert "the time column 'ts' holds one value on every row" in capsys.readouterr().err

    pd = pytest.importorskip("pandas")
    pd.DataFrame({"clicked": [0, 1] * 50, "score": np.arange(100.0)}).to_parquet(
        tmp_path / "p.parquet")  # fmt: skip
    (tmp_path / "p.csv").write_bytes((tmp_path / "p.parquet").read_bytes())
    assert main(["data", "schema", str(tmp_path / "p.csv"), "--label", "clicked"]) == 2
    assert "a Parquet file under a text file's name; rename it to p.parquet" in (
        capsys.readouterr().err
    )


def test_a_random_split_of_rows_that_have_a_time_is_told(tmp_path, caplog):
    """`--split random` on a log with a time column mixed later rows into training without a
    word: its validation and test NE read better than the model does on later rows."""
    from nas.protocol import split_method

    data = _shop_log(tmp_path, [f"s{i % 9}" for i in range(200)], "shop")
    with caplog.at_level("WARNING"):
        assert split_method("random", data, "log.csv") == "random"
    assert "log.csv: a random split of rows that have a time (t)" in caplog.text
    caplog.clear()
    with caplog.at_level("WARNING"):
        assert split_method("auto", data, "log.csv") == "time"
    assert not caplog.text


def test_a_header_name_in_brackets_is_no_json_line(tmp_path):
    """`[click]` (as SQL exports write names) was refused as a first line of JSON."""
    from trainers.data.tabular import infer_schema

    path = tmp_path / "clicks.csv"
    path.write_text(
        "[click],price,shop\n" + "".join(f"{i % 2},{i}.5,s{i % 3}\n" for i in range(40))
    )
    assert infer_schema(path, "[click]")["dense"] == ["price"]
