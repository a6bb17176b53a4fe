"""Dense preprocessing: fitted on the training split only, applied alike in training and in
the exported model, and what keeps raw columns such as a year from wrecking a model."""

import json
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from torchrec.sparse.jagged_tensor import KeyedJaggedTensor

from nas.cli import main
from nas.export import export_model, load_exported
from search_space.builder import build_model
from search_space.presets import preset
from trainers.data import load_tabular
from trainers.data.preprocess import apply_dense, fit_dense

README = Path(__file__).resolve().parents[1] / "README.md"


@pytest.fixture
def log(tmp_path):
    """Clicks that depend on a year (about 2000) and a heavy-tailed count, in time order."""
    rng = np.random.default_rng(0)
    n = 4000
    year = rng.integers(1990, 2021, n)
    views = rng.zipf(1.6, n).clip(0, 10**6)
    shop = rng.integers(0, 20, n)
    logit = 0.15 * (year - 2005) + 0.5 * np.log1p(views) - 2 + 0.1 * (shop % 3)
    clicks = (rng.random(n) < 1 / (1 + np.exp(-logit))).astype(int)
    columns = zip(clicks, year, views, shop, strict=True)
    rows = [f"{c},{y},{v},s{s},{t}" for t, (c, y, v, s) in enumerate(columns)]
    (tmp_path / "log.csv").write_text("clicked,year,views,shop,t\n" + "\n".join(rows) + "\n")
    schema = "label: clicked\ndense: [year, views]\ncategorical: [shop]\ntime: t\n"
    (tmp_path / "schema.yaml").write_text(schema)
    return tmp_path


def test_transforms_are_fitted_on_the_training_split_only(log):
    data = load_tabular(log / "log.csv", log / "schema.yaml")
    train, valid, _ = data.split(method="time")
    transforms = fit_dense(train)
    year, views = transforms
    assert not year["log1p"] and views["log1p"]  # a count gets log1p, a year does not
    assert year["mean"] == pytest.approx(train.dense[:, 0].astype(np.float64).mean())
    assert year["mean"] != pytest.approx(data.dense[:, 0].astype(np.float64).mean(), abs=1e-9)
    moved = apply_dense(valid, transforms).dense
    assert np.abs(moved).max() <= 5.0 and abs(moved[:, 0].mean()) < 0.5


def test_a_heavy_tailed_amount_gets_log1p_like_a_count(tmp_path):
    """Prices in cents-precision (lognormal) are squeezed like counts; a rating is not."""
    rng = np.random.default_rng(1)
    price = np.round(np.exp(rng.normal(1.5, 1.2, 3000)), 2)
    rating = np.round(rng.normal(3.5, 0.8, 3000).clip(0, 5), 1)
    rows = [f"{i % 2},{p},{r}" for i, (p, r) in enumerate(zip(price, rating, strict=True))]
    (tmp_path / "log.csv").write_text("clicked,price,rating\n" + "\n".join(rows) + "\n")
    (tmp_path / "s.yaml").write_text("label: clicked\ndense: [price, rating]\ncategorical: []\n")
    price_fit, rating_fit = fit_dense(load_tabular(tmp_path / "log.csv", tmp_path / "s.yaml"))
    assert price_fit["log1p"] and not rating_fit["log1p"]
    assert price_fit["mean"] == pytest.approx(np.log1p(price).mean())


def test_a_few_sentinel_values_do_not_flatten_a_signed_column(tmp_path, caplog):
    """Five rows of 1e15 ("unknown") in a signed score of 20,000 took its standard
    deviation to 1e13: every other value became one point, and the study's every run sat
    at NE 1.0 without a word. They are left out of the scaling, said, and clipped; a
    heavy-tailed column (Student's t, 3 degrees of freedom) is scaled as before, as is the
    same scan of rows read as a stream."""
    from trainers.data.preprocess import scaled_without_far_values
    from trainers.data.stream import DenseStats

    rng = np.random.default_rng(5)
    score, heavy = rng.normal(0, 1, 20_000), rng.standard_t(3, 20_000)
    sentinel = [100, 5000, 9000, 12000, 15000]
    score[sentinel] = 1e15
    rows = [f"{i % 2},{a:.6g},{b:.6g}" for i, (a, b) in enumerate(zip(score, heavy, strict=True))]
    (tmp_path / "log.csv").write_text("clicked,score,heavy\n" + "\n".join(rows) + "\n")
    (tmp_path / "s.yaml").write_text("label: clicked\ndense: [score, heavy]\ncategorical: []\n")
    with caplog.at_level("WARNING"):
        fitted, heavy_fit = fit_dense(load_tabular(tmp_path / "log.csv", tmp_path / "s.yaml"))
    normal = np.delete(score, sentinel)
    assert fitted["mean"] == pytest.approx(normal.mean(), abs=1e-3)
    assert fitted["std"] == pytest.approx(normal.std(), rel=1e-3)
    assert heavy_fit["std"] == pytest.approx(heavy.std(), rel=1e-3)  # untouched
    said = [r.getMessage() for r in caplog.records if "far from all others" in r.getMessage()]
    assert (
        len(said) == 1 and "dense column 'score': values far from all others (1e+15)" in (said[0])
    ), said
    assert "leave those cells blank" in said[0]
    # a part of the column, not a code: untouched; a code in a mostly-zero column: left out
    zeros = rng.normal(0, 1000, 20_000)
    zeros[:10_000] = 0
    clusters = np.concatenate([rng.normal(0, 1, 16_000), rng.normal(100, 1, 4_000)])
    for column in (zeros, clusters, rng.normal(0, 1, 20_000)):
        assert not len(scaled_without_far_values(column, column.mean(), column.std())[2])
    zeros[:5] = 1e15
    assert len(scaled_without_far_values(zeros, zeros.mean(), zeros.std())[2]) == 5
    streamed = DenseStats("score", seed=0)
    for piece in np.array_split(score, 7):
        streamed.update(piece)
    assert streamed.transform()["std"] == pytest.approx(normal.std(), rel=0.02)
    assert len(streamed.far) > 0


def test_blank_dense_values_become_the_training_mean(log, caplog):
    lines = (log / "log.csv").read_text().splitlines()
    for i in (1, 2, 3000):  # blank years: two in training, one in validation
        fields = lines[i].split(",")
        lines[i] = ",".join([fields[0], "", *fields[2:]])
    (log / "log.csv").write_text("\n".join(lines) + "\n")
    data = load_tabular(log / "log.csv", log / "schema.yaml")
    assert "3 blank value(s) in dense column 'year'" in caplog.text
    train = data.split(method="time")[0]
    transforms = fit_dense(train)
    present = train.dense[:, 0][~np.isnan(train.dense[:, 0])].astype(np.float64)
    assert transforms[0]["mean"] == pytest.approx(present.mean())
    moved = apply_dense(data, transforms).dense
    assert not np.isnan(moved).any()
    assert moved[0, 0] == 0.0 and moved[2999, 0] == 0.0  # standardized mean
    assert (apply_dense(data, []).dense[:2, 0] == 0.0).all()  # preprocessing off: 0


def test_raw_columns_train_with_preprocessing_and_not_without(log, capsys):
    args = ["train", "--arch", "logistic_regression", "--data", str(log / "log.csv"),
            "--schema", str(log / "schema.yaml"), "--epochs", "3", "--batch-size", "128",
            "--json"]  # fmt: skip
    assert main(args) == 0
    out, err = capsys.readouterr()
    assert "log1p on views" in err and "in time order (t)" in err
    assert json.loads(out)["val_ne"] < 1.0
    main([*args, "--preprocessing", "none"])
    raw = json.loads(capsys.readouterr().out)
    assert raw["val_ne"] > json.loads(out)["val_ne"]


def test_the_exported_model_applies_the_same_transforms_to_raw_rows(log, tmp_path):
    data = load_tabular(log / "log.csv", log / "schema.yaml")
    train, valid, _ = data.split(method="time")
    transforms = fit_dense(train)
    arch = preset("dlrm", data.schema)
    model = build_model(arch, seed=0).eval()
    result = export_model(arch, model.state_dict(), {}, tmp_path / "export",
                          schema=data.schema, preprocessing={"dense": transforms})  # fmt: skip
    exported = load_exported(result.out_dir)
    module = sys.modules[type(exported).__module__]
    served = module.prepare_dense(torch.from_numpy(valid.dense), result.out_dir)
    trained = torch.from_numpy(apply_dense(valid, transforms).dense)
    assert torch.equal(served, trained)
    ids = torch.from_numpy(valid.categorical)
    with torch.no_grad():
        lengths = torch.ones(ids.numel(), dtype=torch.int32)
        sparse = KeyedJaggedTensor(list(module.FEATURES), ids.t().reshape(-1), lengths=lengths)
        assert torch.equal(exported(served, ids), model(trained, sparse))


def test_a_study_on_a_file_records_its_transforms_and_the_export_carries_them(log, capsys):
    from study_helpers import tiny_config, write_config

    config = tiny_config(log, "file", data={"source": str(log / "log.csv"),
                                            "schema": str(log / "schema.yaml")},
                         budget={"trials": 1, "epochs_per_trial": 2})  # fmt: skip
    del config["data"]["rows"], config["data"]["seed"]
    assert main(["search", str(write_config(log, config)), "--no-mlflow"]) == 0
    assert "split in time order (t); dense columns: log1p on views" in capsys.readouterr().out
    out = log / "export"
    assert main(["export", "file", "--storage", config["storage"], "--out", str(out)]) == 0
    written = json.loads((out / "preprocessing.json").read_text())["dense"]
    assert [t["column"] for t in written] == ["year", "views"]
    # its runs saw `views` scaled otherwise (as an older ranknas fitted it): refused on resume
    from nas.storage import load_study
    from nas.trial_record import StudyAttr

    study = load_study("file", config["storage"])
    fitted = study.user_attrs[StudyAttr.PREPROCESSING]
    fitted["dense"][1]["std"] *= 2
    study.set_user_attr(StudyAttr.PREPROCESSING, fitted)
    more = config | {"budget": {"trials": 2, "epochs_per_trial": 2}}
    capsys.readouterr()
    assert main(["search", str(write_config(log, more)), "--no-mlflow"]) == 2
    err = capsys.readouterr().err
    assert "was run with its dense columns scaled otherwise (views: mean " in err, err
    assert len(load_study("file", config["storage"]).trials) == 1


def test_the_vocabulary_comes_from_training_rows_and_new_values_are_out_of_vocabulary(tmp_path):
    from trainers.data.preprocess import apply_vocabulary, fit_vocabulary

    rows = [f"{i % 2},{i}.5,{'old' if i < 80 else 'new'}{i % 3},{i}" for i in range(100)]
    rows[5] = "1,5.5,,5"  # a blank shop: missing
    (tmp_path / "log.csv").write_text("y,price,shop,t\n" + "\n".join(rows) + "\n")
    (tmp_path / "schema.yaml").write_text("label: y\ndense: [price]\ncategorical: [shop]\n"
                                          "time: t\n")  # fmt: skip
    data = load_tabular(tmp_path / "log.csv", tmp_path / "schema.yaml")
    train, _, test = data.split(method="time")
    vocabulary = fit_vocabulary(train)
    assert sorted(vocabulary["shop"]) == ["old0", "old1", "old2"]  # not the test's new*
    train, test = apply_vocabulary(train, vocabulary), apply_vocabulary(test, vocabulary)
    assert train.schema.categorical[0].cardinality == 5  # missing, out of vocabulary, 3 values
    assert set(test.categorical[:, 0]) == {1}  # every test shop is new
    assert train.categorical[5, 0] == 0  # the blank one
    exported_ids = _encode_like_an_export(tmp_path, vocabulary, ["old1", "new2", "", None])
    assert exported_ids.tolist() == [[vocabulary["shop"].index("old1") + 2], [1], [0], [0]]


def test_a_served_number_finds_the_value_its_training_file_wrote_otherwise(tmp_path):
    # A column of whole numbers written as floats ("3.0") served as ints, and the reverse.
    vocabulary = {"shop": ["3.0", "7", "0.25", "007"]}
    served = [3, 3.0, "3", 7.0, np.int64(7), 0.25, 8, "007", "x"]
    ids = _encode_like_an_export(tmp_path, vocabulary, served)
    assert ids[:, 0].tolist() == [2, 2, 2, 3, 3, 4, 1, 5, 1]


def _encode_like_an_export(directory, vocabulary, values):
    from nas.export import standalone_template

    (directory / "preprocessing.json").write_text(json.dumps({"vocabulary": vocabulary}))
    return standalone_template.encode_ids([values], ["shop"], directory)


def test_a_study_on_three_files_uses_them_as_split(log, capsys):
    from study_helpers import tiny_config, write_config

    lines = (log / "log.csv").read_text().splitlines()
    header, rows = lines[0], lines[1:]
    for name, part in (("train", rows[:3000]), ("valid", rows[3000:3500]),
                       ("test", rows[3500:])):  # fmt: skip
        (log / f"{name}.csv").write_text("\n".join([header, *part]) + "\n")
    data = {"train": str(log / "train.csv"), "valid": str(log / "valid.csv"),
            "test": str(log / "test.csv"), "schema": str(log / "schema.yaml")}  # fmt: skip
    config = tiny_config(log, "files", budget={"trials": 1, "epochs_per_trial": 2})
    config["data"] = data
    assert main(["search", str(write_config(log, config)), "--no-mlflow"]) == 0
    out = capsys.readouterr().out
    assert "data: 3,000 training, 500 validation, 500 test rows, split from files" in out
    del config["data"]["test"]
    assert main(["search", str(write_config(log, config)), "--no-mlflow"]) == 2
    assert "data.train, data.valid and data.test go together" in capsys.readouterr().err


def test_a_test_file_of_values_training_never_saw_is_said(log, caplog):
    """A test file whose every shop was unseen in training (out of vocabulary) raised test
    NE from 0.93 to 0.97 without a word; validation's shops were the training ones."""
    from trainers.data.preprocess import apply_preprocessing, fit_preprocessing, warn_unseen_in_test

    lines = (log / "log.csv").read_text().splitlines()
    header, rows = lines[0], lines[1:]
    other = [row.replace(",s", ",z") for row in rows[3500:]]  # shop s3 -> z3: unseen
    for name, part in (("train", rows[:3000]), ("valid", rows[3000:3500]), ("test", other)):
        (log / f"{name}.csv").write_text("\n".join([header, *part]) + "\n")
    parts = [
        load_tabular(log / f"{n}.csv", log / "schema.yaml") for n in ("train", "valid", "test")
    ]
    fitted = fit_preprocessing(parts[0])
    _, valid, test = (apply_preprocessing(p, fitted) for p in parts)
    with caplog.at_level("WARNING"):
        warn_unseen_in_test(valid, test, fitted)
        warn_unseen_in_test(valid, valid, fitted)  # the same rows: nothing to say
    said = [r.getMessage() for r in caplog.records if "unseen in training" in r.getMessage()]
    assert said == [f"{log / 'test.csv'}: 100% of the test rows' shop values are unseen in "
                    "training (validation: 0%): the test measures rows unlike those the models "
                    "were chosen on; check that the files belong together"], said  # fmt: skip


def test_a_study_on_a_list_column_exports_a_model_that_serves_lists(tmp_path, capsys):
    import optuna

    from helpers import write_genre_log
    from study_helpers import tiny_config, write_config
    from trainers.metrics import ranking_metrics

    csv, schema = write_genre_log(tmp_path, rows=2000)
    config = tiny_config(tmp_path, "lists", data={"source": str(csv), "schema": str(schema)},
                         budget={"trials": 1, "epochs_per_trial": 2})  # fmt: skip
    del config["data"]["rows"], config["data"]["seed"]
    assert main(["search", str(write_config(tmp_path, config)), "--no-mlflow"]) == 0
    assert "training-split vocabularies (shop 5, genres 12" in capsys.readouterr().out
    out = tmp_path / "export"
    assert main(["export", "lists", "--storage", config["storage"], "--out", str(out)]) == 0
    written = json.loads((out / "preprocessing.json").read_text())
    assert written["multi_valued"] == {"genres": {"separator": "|"}}
    exported = load_exported(out)
    module = sys.modules[type(exported).__module__]
    lines_all = csv.read_text().splitlines()
    lines = lines_all[1:]
    test_rows = [line.split(",") for line in lines[1800:]]  # the time split's last 10%
    dense = module.prepare_dense(torch.tensor([[float(r[1])] for r in test_rows]), out)
    raw = {"shop": [r[3] for r in test_rows], "genres": [r[2] for r in test_rows]}
    ids = module.encode_ids([raw[f] for f in module.FEATURES], module.FEATURES, out)
    with torch.no_grad():
        probabilities = torch.sigmoid(exported(dense, ids)).numpy()
    labels = np.array([float(r[0]) for r in test_rows])
    trial = optuna.load_study(study_name="lists", storage=config["storage"]).trials[0]
    served = ranking_metrics(probabilities, labels)["ne"]
    assert served == pytest.approx(trial.user_attrs["test_ne"], abs=1e-6)
    # the README's standalone example, as written, on these rows
    snippet = re.search(r"```python\n(import csv\n.*?)```", README.read_text(), re.DOTALL)
    assert snippet, "README.md has no standalone example reading new_rows.csv"
    (tmp_path / "new_rows.csv").write_text("\n".join([lines_all[0], *lines[1800:]]) + "\n")
    (tmp_path / "example.py").write_text(snippet.group(1).replace('"winner"', repr(str(out))))
    run = subprocess.run([sys.executable, "example.py"], cwd=tmp_path, capture_output=True,
                         text=True, timeout=300)  # fmt: skip
    assert run.returncode == 0, run.stderr
    assert np.allclose(json.loads(run.stdout), probabilities, atol=1e-6)


def test_the_examples_read_a_quoted_line_break_as_training_kept_it(tmp_path, monkeypatch):
    """Training keeps a quoted field's line break as written ("a\r\nb"); the examples'
    plain open() made it "a\nb", out of vocabulary when served."""
    import csv as csv_module

    from nas.export.model_card import CSV_ROWS

    (tmp_path / "new_rows.csv").write_bytes(b'y,note\r\n1,"a\r\nb"\r\n')
    monkeypatch.chdir(tmp_path)
    readme = re.search(r"^rows = list\(csv\.DictReader\(.*$", README.read_text(), re.MULTILINE)
    for example in (CSV_ROWS, readme.group(0)):
        scope: dict = {"csv": csv_module}
        exec(example, scope)
        assert scope["rows"] == [{"y": "1", "note": "a\r\nb"}], example


def test_describe_groups_hashed_columns_by_their_buckets():
    from trainers.data.preprocess import describe

    fitted = {"dense": [], "vocabulary": {}, "hashing": {"C1": 1000, "C2": 1000, "query": 50}}
    assert describe(fitted) == "hashed: C1, C2 into 1,000 buckets; query into 50 buckets"


def test_a_lists_null_element_is_no_item_and_a_blank_one_is_an_empty_item():
    """Spark and pandas write null elements in Parquet lists: they were a malformed row. A
    blank text in a list stays an empty item, as "a|" is in a CSV cell."""
    from search_space.preprocessing import split_cell

    assert split_cell(["a", None, float("nan")], "|") == ["a"]
    assert split_cell([None], "|") == []
    for blank in (["a", ""], ["a", "  "], "a|"):
        with pytest.raises(ValueError, match="an empty item"):
            split_cell(blank, "|")
