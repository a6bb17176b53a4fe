"""The Criteo TSV reader: parsing, id mapping, bad lines, and the cache."""

import numpy as np
import pytest
import torch

from search_space.errors import RanknasError
from search_space.preprocessing import transform_dense
from trainers.data import criteo, load_criteo, load_dataset

EMPTY_INTS = [""] * 13
EMPTY_CATS = [""] * 26


def line(label="0", ints=EMPTY_INTS, cats=EMPTY_CATS) -> str:
    return "\t".join([label, *ints, *cats]) + "\n"


def cats_with(first: str, second: str = "") -> list[str]:
    return [first, second, *[""] * 24]


def write(path, lines):
    path.write_text("".join(lines))
    return path


@pytest.fixture
def cache_dir(tmp_path):
    return tmp_path / "cache"


def test_parses_labels_dense_and_missing_values(tmp_path, cache_dir):
    ints = ["0", "1", "-3", "", "1000", *["7"] * 8]
    path = write(tmp_path / "day.tsv", [line("1", ints, cats_with("68fd1e64")), line("0")])
    data = load_criteo(path, min_count=1, cache_dir=cache_dir)
    np.testing.assert_array_equal(data.labels, [1.0, 0.0])
    np.testing.assert_array_equal(data.dense[0], [0, 1, -3, np.nan, 1000, *[7] * 8])
    assert np.isnan(data.dense[1]).all()  # counts as read, blanks missing
    # and the transform every Criteo model takes: log(1 + max(x, 0)), a blank 0, unclipped
    inputs = transform_dense(torch.from_numpy(data.dense), criteo.dense_transforms()).numpy()
    expected = np.log1p([0, 1, 0, 0, 1000, *[7] * 8]).astype(np.float32)
    np.testing.assert_allclose(inputs[0], expected, rtol=1e-6)
    np.testing.assert_array_equal(inputs[1], np.zeros(13))
    assert data.schema.dense == tuple(f"I{i}" for i in range(1, 14))
    assert data.schema.feature_names == [f"C{i}" for i in range(1, 27)]
    assert data.categorical[0, 0] == 2 and data.categorical[1, 0] == 0  # value, missing
    assert data.bad_rows.rows == 2 and data.bad_rows.bad == 0


def test_a_gzipped_day_file_reads_as_the_plain_file(tmp_path, cache_dir):
    import gzip

    lines = [
        line(str(i % 2), ["1", str(i), *[""] * 11], cats_with(f"{i % 3:08x}")) for i in range(9)
    ]
    plain = write(tmp_path / "day.tsv", [*lines, "1\tbad\n"])
    (tmp_path / "day_0.gz").write_bytes(gzip.compress(plain.read_bytes()))
    expected = load_criteo(plain, min_count=1, use_cache=False, max_bad_fraction=None)
    data = load_criteo(tmp_path / "day_0.gz", min_count=1, cache_dir=cache_dir,
                       max_bad_fraction=None)  # fmt: skip
    np.testing.assert_array_equal(data.labels, expected.labels)
    np.testing.assert_array_equal(data.dense, expected.dense)
    np.testing.assert_array_equal(data.categorical, expected.categorical)
    assert data.bad_rows.describe() == expected.bad_rows.describe().replace("day.tsv", "day_0.gz")
    (tmp_path / "cut.gz").write_bytes((tmp_path / "day_0.gz").read_bytes()[:-12])
    with pytest.raises(RanknasError, match=r"cut\.gz: the compressed file is cut short"):
        load_criteo(tmp_path / "cut.gz", cache_dir=cache_dir)


def test_frequency_mapping_with_min_count(tmp_path, cache_dir):
    column = ["0000000a"] * 3 + ["0000000b"] * 2 + ["0000000c", ""]
    path = write(tmp_path / "f.tsv", [line(cats=cats_with(v)) for v in column])
    data = load_criteo(path, min_count=2, cache_dir=cache_dir)
    # 0 = missing, 1 = rare, then by decreasing frequency
    np.testing.assert_array_equal(data.categorical[:, 0], [2, 2, 2, 3, 3, 1, 0])
    assert data.schema.categorical[0].cardinality == 4
    assert data.schema.categorical[1].cardinality == 2  # only missing values
    loose = load_criteo(path, min_count=1, cache_dir=cache_dir)
    np.testing.assert_array_equal(loose.categorical[:, 0], [2, 2, 2, 3, 3, 4, 0])


def test_hashing_option(tmp_path, cache_dir):
    values = ["68fd1e64", "FFFFFFFF", "a", ""]
    path = write(tmp_path / "h.tsv", [line(cats=cats_with(v)) for v in values])
    data = load_criteo(path, hash_size=1000, cache_dir=cache_dir)
    expected = [1 + int(v, 16) % 999 for v in values[:3]] + [0]
    np.testing.assert_array_equal(data.categorical[:, 0], expected)
    assert {f.cardinality for f in data.schema.categorical} == {1000}


def _mixed_file(tmp_path):
    good = line("1", ["5"] * 13, cats_with("abc"))
    lines = [
        good,  # 1
        "1\t2\t3\n",  # 2: wrong column count
        line("1", ["x", *["1"] * 12]),  # 3: non-numeric integer
        line("2"),  # 4: bad label
        good,  # 5
        line("0", ["1.5", *[""] * 12]),  # 6: not an integer
        line("0", cats=cats_with("xyz")),  # 7: categorical not hex
        line("0", cats=cats_with("123456789")),  # 8: too long for 8 hex digits
        "\n",  # 9: empty line
        line("0", ["", "-1", *[""] * 11], cats_with("", "ff")),  # 10: fine
        line("0", ["99999999999999999999", *[""] * 12]),  # 11: beyond int64 (a traceback)
    ]
    return write(tmp_path / "mixed.tsv", lines)


def test_bad_lines_are_skipped_and_reported(tmp_path, cache_dir):
    data = load_criteo(
        _mixed_file(tmp_path), min_count=1, max_bad_fraction=None, cache_dir=cache_dir
    )
    assert len(data) == 3
    np.testing.assert_array_equal(data.labels, [1, 1, 0])
    report = data.bad_rows
    assert (report.rows, report.bad, report.unit) == (11, 8, "line")
    assert report.examples == {
        "wrong column count": [2, 9],
        "label not 0/1": [4],
        "integer field not an integer": [3, 6, 11],
        "categorical field not hex": [7, 8],
    }
    assert report.reasons["wrong column count"] == 2
    assert "lines 3, 6, 11" in report.describe()


def test_bad_lines_are_numbered_across_chunks(tmp_path, cache_dir, monkeypatch):
    monkeypatch.setattr(criteo, "CHUNK_LINES", 3)
    data = load_criteo(_mixed_file(tmp_path), max_bad_fraction=None, cache_dir=cache_dir)
    assert data.bad_rows.examples["categorical field not hex"] == [7, 8]
    assert data.bad_rows.examples["wrong column count"] == [2, 9]
    assert len(data) == 3


def test_too_many_bad_lines_stop_the_load(tmp_path, cache_dir):
    path = _mixed_file(tmp_path)
    with pytest.raises(RanknasError) as error:
        load_criteo(path, max_bad_rows=3, max_bad_fraction=None, cache_dir=cache_dir)
    message = str(error.value)
    assert str(path) in message and "max_bad_rows" in message
    assert "lines 2, 9" in message
    with pytest.raises(RanknasError, match=r"8 malformed lines of 11 lines"):
        load_criteo(path, max_bad_rows=None, max_bad_fraction=0.5, cache_dir=cache_dir)
    # the default (1% of lines) applies to a cached load too
    load_criteo(path, max_bad_fraction=None, cache_dir=cache_dir)
    with pytest.raises(RanknasError, match="max_bad_fraction"):
        load_criteo(path, cache_dir=cache_dir)


def test_second_load_reads_the_cache(tmp_path, cache_dir, monkeypatch):
    path = write(tmp_path / "c.tsv", [line("1", ["3"] * 13, cats_with("aa", "bb")), line("0")])
    first = load_criteo(path, min_count=1, cache_dir=cache_dir)

    def no_parsing(*args, **kwargs):
        raise AssertionError("parsed the file again instead of reading the cache")

    monkeypatch.setattr(criteo, "_parse_file", no_parsing)
    second = load_criteo(path, min_count=1, cache_dir=cache_dir)
    assert second.schema == first.schema
    for name in ("dense", "categorical", "labels"):
        np.testing.assert_array_equal(getattr(second, name), getattr(first, name))
    assert second.bad_rows == first.bad_rows
    assert second.raw_values["C1"].values == first.raw_values["C1"].values == ("000000aa",)
    np.testing.assert_array_equal(second.raw_values["C2"].codes.values, [0, -1])
    with pytest.raises(AssertionError, match="again"):  # other settings, other cache
        load_criteo(path, min_count=2, cache_dir=cache_dir)


def test_cache_is_invalidated_when_the_file_changes(tmp_path, cache_dir, monkeypatch):
    path = write(tmp_path / "c.tsv", [line("1"), line("0")])
    calls = []
    parse = criteo._parse_file
    monkeypatch.setattr(criteo, "_parse_file", lambda *a: calls.append(a) or parse(*a))
    assert len(load_criteo(path, cache_dir=cache_dir)) == 2
    assert len(load_criteo(path, cache_dir=cache_dir)) == 2
    assert len(calls) == 1
    write(path, [line("1"), line("0"), line("1")])
    assert len(load_criteo(path, cache_dir=cache_dir)) == 3
    assert len(calls) == 2
    assert len(load_criteo(path, cache_dir=cache_dir, use_cache=False)) == 3
    assert len(calls) == 3


def test_max_rows_reads_only_the_first_lines(tmp_path, cache_dir):
    path = write(tmp_path / "m.tsv", [line(str(i % 2)) for i in range(10)])
    data = load_criteo(path, max_rows=4, cache_dir=cache_dir)
    np.testing.assert_array_equal(data.labels, [0, 1, 0, 1])


def test_missing_or_empty_file_is_a_user_error(tmp_path, cache_dir):
    missing = tmp_path / "nope.tsv"
    with pytest.raises(RanknasError, match=r"nope\.tsv"):
        load_criteo(missing, cache_dir=cache_dir)
    with pytest.raises(RanknasError, match=r"nope\.tsv"):
        load_dataset(f"criteo:{missing}", cache_dir=cache_dir)
    with pytest.raises(RanknasError, match="empty"):
        load_criteo(write(tmp_path / "empty.tsv", []), cache_dir=cache_dir)


def test_bad_options_are_user_errors(tmp_path, cache_dir):
    path = write(tmp_path / "o.tsv", [line("1")])
    with pytest.raises(RanknasError, match="min_count"):
        load_criteo(path, min_count=0, cache_dir=cache_dir)
    with pytest.raises(RanknasError, match="hash_size"):
        load_criteo(path, hash_size=1, cache_dir=cache_dir)
    with pytest.raises(RanknasError, match="unknown option"):
        load_dataset(f"criteo:{path}", min_cnt=3)


def test_a_study_fits_the_vocabulary_on_the_training_rows_only(tmp_path, cache_dir):
    """The reader mapped ids by frequency over the whole file: a value of the test rows
    alone had an id of its own in training. A study's fit (on the training split) now makes
    it out of vocabulary, and the vocabulary holds the file's hex values (exported)."""
    from trainers.data.preprocess import apply_preprocessing, fit_preprocessing

    lines = [line(str(i % 2), cats=cats_with("aa" if i % 3 else "bb")) for i in range(80)]
    lines += [line(str(i % 2), cats=cats_with("cc")) for i in range(20)]  # the last 20 rows
    data = load_criteo(write(tmp_path / "c.tsv", lines), min_count=2, cache_dir=cache_dir)
    assert data.schema.categorical[0].cardinality == 5  # the whole file: aa, bb, cc
    train, _, test = data.split((0.8, 0.1, 0.1), method="ordered")
    fitted = fit_preprocessing(train, dense=False)
    assert fitted["vocabulary"]["C1"] == ["000000aa", "000000bb"]
    assert set(apply_preprocessing(test, fitted).categorical[:, 0]) == {1}  # out of vocabulary


def test_data_schema_reads_a_criteo_file_and_sends_one_read_as_a_csv_there(
    tmp_path, cache_dir, monkeypatch, capsys
):
    """`data schema criteo:PATH` asked for --label, then looked for a file named
    "criteo:PATH"; the file given plainly was refused for "the header names '0', '1', ...
    more than once" (it has no header). The first prints the reader's schema; the second
    says to give it as criteo:PATH."""
    import yaml

    from nas.cli import main

    monkeypatch.setenv("XDG_CACHE_HOME", str(cache_dir))
    lines = [line(str(i % 2), ["3"] * 13, cats_with("aa" if i % 3 else "bb")) for i in range(40)]
    path = write(tmp_path / "day.tsv", lines)
    assert main(["data", "schema", f"criteo:{path}"]) == 0
    schema = yaml.safe_load(capsys.readouterr().out)
    assert schema["label"] == "label" and len(schema["dense"]) == 13
    assert len(schema["categorical"]) == 26
    assert main(["data", "schema", str(path), "--label", "0"]) == 2
    assert "(a Criteo file? give it as criteo:PATH)" in capsys.readouterr().err
