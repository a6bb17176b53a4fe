"""Streaming data bigger than memory: same rows, preprocessing and training as in memory,
bounded holdings, clear errors."""

import itertools
import json
import threading
import time

import numpy as np
import pytest
import torch

from nas.cli import main
from nas.config import parse_config
from nas.export import standalone_template
from search_space.builder import build_model
from search_space.errors import RanknasError
from search_space.presets import load_architecture
from trainers.data import criteo, load_criteo, load_tabular, tabular
from trainers.data.preprocess import apply_dense, apply_preprocessing, fit_preprocessing
from trainers.data.stream import StreamOptions, StreamSplit, open_stream, prefetch
from trainers.data.stream_sources import open_source
from trainers.data.synthetic import write_synthetic_criteo
from trainers.trainer import TrainConfig, train

pa = pytest.importorskip("pyarrow")
pq = pytest.importorskip("pyarrow.parquet")

SCHEMA = """name: shop
label: clicked
dense: [row, visits, price]
categorical:
  - country
  - {name: slot, cardinality: 5}
"""
ROWS = 3000


def shop_table(rows: int, seed: int = 0):
    rng = np.random.default_rng(seed)
    countries = np.array([f"c{k}" for k in range(40)] + [""])
    price = rng.normal(10, 3, rows)
    visits = rng.zipf(1.6, rows).clip(max=10**6)
    country = rng.zipf(1.3, rows).clip(max=len(countries)) - 1
    slot = rng.integers(0, 5, rows)
    logit = -2 + np.log1p(visits) + (country % 3 == 0) + (slot == 2) - (price - 10) / 3
    price[rng.random(rows) < 0.05] = np.nan  # blanks: filled with the training mean
    return pa.table({
        "clicked": (rng.random(rows) < 1 / (1 + np.exp(-logit))).astype(np.int8),
        "row": np.arange(rows, dtype=np.float64),  # tells the rows apart
        "visits": visits.astype(np.int64),  # count-like: log1p
        "price": price,
        "country": countries[country],
        "slot": slot,
    })  # fmt: skip


@pytest.fixture
def shop(tmp_path):
    """The same rows as one Parquet file and as a directory of three (row groups of 250)."""
    table = shop_table(ROWS)
    (tmp_path / "schema.yaml").write_text(SCHEMA)
    pq.write_table(table, tmp_path / "all.parquet")
    parts = tmp_path / "parts"
    parts.mkdir()
    for k, lo in enumerate(range(0, ROWS, 1000)):
        pq.write_table(table.slice(lo, 1000), parts / f"part-{k}.parquet", row_group_size=250)
    return tmp_path


def in_memory(shop):
    data = load_tabular(shop / "all.parquet", shop / "schema.yaml")
    parts = data.split(method="ordered")
    fitted = fit_preprocessing(parts[0])
    return fitted, [apply_preprocessing(p, fitted) for p in parts]


def batches(data, **options):
    return list(data.loader(128, **options))


def test_streamed_directory_gives_the_in_memory_rows_preprocessing_and_metrics(shop):
    fitted, (train_mem, valid_mem, test_mem) = in_memory(shop)
    options = StreamOptions(chunk_rows=200, shuffle_rows=ROWS)  # one window: same shuffle
    streamed = open_stream(str(shop / "parts"), str(shop / "schema.yaml"), options=options)
    assert isinstance(streamed.train, StreamSplit)
    assert streamed.fitted["vocabulary"] == fitted["vocabulary"]
    for ours, theirs in zip(streamed.fitted["dense"], fitted["dense"], strict=True):
        assert ours["column"] == theirs["column"] and ours["log1p"] == theirs["log1p"]
        assert ours["mean"] == pytest.approx(theirs["mean"], rel=1e-9)
        assert ours["std"] == pytest.approx(theirs["std"], rel=1e-9)
    assert [t["log1p"] for t in fitted["dense"]] == [False, True, False]
    assert streamed.train.schema == train_mem.schema
    assert len(streamed.train) == len(train_mem) == 2400
    for shuffle in (False, True):
        ours = batches(streamed.train, shuffle=shuffle, seed=3, drop_last=True)
        theirs = batches(train_mem, shuffle=shuffle, seed=3, drop_last=True)
        assert len(ours) == len(theirs) == 2400 // 128
        for a, b in zip(ours, theirs, strict=True):
            np.testing.assert_allclose(a.dense, b.dense, rtol=1e-6, atol=1e-6)
            assert torch.equal(a.sparse.values(), b.sparse.values())
            assert torch.equal(a.labels, b.labels)
    for ours, theirs in ((streamed.valid, valid_mem), (streamed.test, test_mem)):
        np.testing.assert_allclose(ours.dense, theirs.dense, rtol=1e-6, atol=1e-6)
        np.testing.assert_array_equal(ours.categorical, theirs.categorical)
    config = TrainConfig(batch_size=128, max_steps=30, evals=2, eval_examples=200)
    arch = load_architecture("dlrm", train_mem.schema)
    results = [
        train(build_model(arch, seed=0), *split, config=config)
        for split in ((streamed.train, streamed.valid, streamed.test),
                      (train_mem, valid_mem, test_mem))
    ]  # fmt: skip
    assert results[0].status == results[1].status == "complete"
    for key in ("ne", "auc", "logloss"):
        assert results[0].validation[key] == pytest.approx(results[1].validation[key], abs=1e-4)
        assert results[0].test[key] == pytest.approx(results[1].test[key], abs=1e-4)


def test_a_stream_stopped_early_leaves_the_data_warnings_on(shop, caplog, monkeypatch):
    """The stream's reader thread kept its chunks quiet by raising the tabular logger's
    level; two such threads restored each other's level and left it at ERROR, and every
    later warning of the process (blank values, skipped lines) went unsaid."""

    def refuse(level):
        raise AssertionError("the tabular logger's level is the user's, not the reader's")

    monkeypatch.setattr(tabular.logger, "setLevel", refuse)
    options = StreamOptions(chunk_rows=200, shuffle_rows=400)
    streamed = open_stream(str(shop / "parts"), str(shop / "schema.yaml"), options=options)
    for _ in itertools.islice(streamed.train.loader(128), 2):
        pass  # stops early: the reader thread may still be converting a chunk
    caplog.clear()
    load_tabular(shop / "all.parquet", shop / "schema.yaml")
    assert "blank value(s) in dense column 'price'" in caplog.text


@pytest.mark.parametrize(
    "entry", ["{name: country, hash_size: 16}", "{name: country, min_count: 30}"]
)
def test_a_schema_s_hashing_and_min_count_stream_as_in_memory(shop, entry):
    """Per-column settings of the schema, and the ids the exported model computes."""
    (shop / "schema.yaml").write_text(SCHEMA.replace("  - country", f"  - {entry}"))
    fitted, (train_mem, valid_mem, _) = in_memory(shop)
    streamed = open_stream(str(shop / "parts"), str(shop / "schema.yaml"),
                           options=StreamOptions(chunk_rows=200))  # fmt: skip
    assert streamed.fitted["vocabulary"] == fitted["vocabulary"]
    assert streamed.fitted["hashing"] == fitted["hashing"]
    assert streamed.train.schema == train_mem.schema
    np.testing.assert_array_equal(streamed.valid.categorical, valid_mem.categorical)


def test_multi_valued_columns_are_refused_with_a_clear_error(shop):
    (shop / "schema.yaml").write_text(SCHEMA.replace("  - country", "  - {name: country, "
                                                     "multi_valued: true}"))  # fmt: skip
    with pytest.raises(RanknasError, match=r"multi-valued column\(s\) \['country'\]"):
        open_stream(str(shop / "parts"), str(shop / "schema.yaml"))


def test_streamed_evaluation_splits_and_windows(shop):
    options = StreamOptions(chunk_rows=100, shuffle_rows=500, memory_rows=0)
    streamed = open_stream(str(shop / "parts"), str(shop / "schema.yaml"), options=options)
    assert isinstance(streamed.valid, StreamSplit) and len(streamed.valid) == 300
    sizes = [len(w) for w in streamed.train.windows(384)]
    assert sizes == [384] * 6 + [96]  # bounded windows, the rest last
    rows = torch.cat([b.dense[:, 0] for b in batches(streamed.train, shuffle=True, seed=1,
                                                       drop_last=True)])  # fmt: skip
    assert len(rows) == 2304 and len(torch.unique(rows)) == 2304  # each row once, shuffled
    assert not torch.equal(rows, torch.sort(rows).values)
    head = streamed.valid.head(50)
    np.testing.assert_array_equal(head.labels, batches(streamed.valid)[0].labels[:50].numpy())


def test_the_reader_holds_one_row_group_at_a_time(tmp_path):
    (tmp_path / "schema.yaml").write_text(SCHEMA)
    table = shop_table(200_000)
    pq.write_table(table, tmp_path / "big.parquet", row_group_size=4000)
    source = open_source(tmp_path / "big.parquet", tmp_path / "schema.yaml", chunk_rows=4000)
    group_bytes, table_bytes = table.slice(0, 4000).nbytes, table.nbytes
    del table
    baseline, peaks = pa.total_allocated_bytes(), []
    for _ in source.chunks(0, source.rows):
        peaks.append(pa.total_allocated_bytes() - baseline)  # Arrow memory held while reading
    assert len(peaks) == 50
    assert max(peaks) <= max(peaks[:2]) + group_bytes  # does not grow with the rows read
    assert max(peaks) < table_bytes / 5


def test_the_prefetch_queue_is_bounded_and_stops_with_its_consumer():
    made = []

    def items():
        for k in range(1000):
            made.append(k)
            yield k

    stream = prefetch(items(), depth=3)
    assert next(stream) == 0
    time.sleep(0.3)  # time for an unbounded producer to run far ahead
    assert len(made) <= 1 + 3 + 1  # consumed, queued, and one waiting to be queued
    stream.close()
    time.sleep(0.3)
    assert len(made) <= 6
    assert not any(t.name == "ranknas-stream" and t.is_alive() for t in threading.enumerate())


def test_criteo_stream_matches_load_criteo_with_hashing(tmp_path):
    path = write_synthetic_criteo(tmp_path / "day.tsv", 2000, piece_rows=700)
    options = StreamOptions(hash_size=997, memory_rows=10_000)
    streamed = open_stream(f"criteo:{path}", options=options)
    memory = load_criteo(path, hash_size=997, use_cache=False).split(method="ordered")
    assert len(streamed.train) == len(memory[0]) == 1600
    train_rows = torch.cat([b.sparse.values() for b in batches(streamed.train)])
    assert torch.equal(train_rows, torch.cat([b.sparse.values() for b in batches(memory[0])]))
    # the counts as read, and the transform a Criteo model takes, recorded for the export
    assert streamed.fitted["dense"] == criteo.dense_transforms()
    test_rows = apply_dense(memory[2], criteo.dense_transforms())
    np.testing.assert_array_equal(streamed.test.dense, test_rows.dense)
    np.testing.assert_array_equal(streamed.test.categorical, memory[2].categorical)
    # hashed from the hex value as load_criteo does, and so by the export from a raw line
    assert streamed.fitted["hashing"] == fit_preprocessing(memory[0])["hashing"] == {}
    assert streamed.fitted["hex_ids"] == {f"C{k}": 997 for k in range(1, 27)}
    (tmp_path / "preprocessing.json").write_text(json.dumps(streamed.fitted))
    lines = [line.split("\t") for line in path.read_text().splitlines()[-len(memory[2]) :]]
    served = standalone_template.encode_ids(list(zip(*(line[14:] for line in lines),
                                                     strict=True)),
                                            [f"C{k}" for k in range(1, 27)], tmp_path)  # fmt: skip
    np.testing.assert_array_equal(served.numpy(), streamed.test.categorical)


def test_a_gzipped_criteo_file_streams_as_the_plain_file(tmp_path):
    import gzip

    path = write_synthetic_criteo(tmp_path / "day.tsv", 1500)
    (tmp_path / "day.gz").write_bytes(gzip.compress(path.read_bytes()))
    options = StreamOptions(hash_size=997, memory_rows=500)  # splits read in several ranges
    plain, packed = (
        open_stream(f"criteo:{p}", options=options) for p in (path, tmp_path / "day.gz")
    )
    assert len(packed.train) == len(plain.train) == 1200
    assert torch.equal(torch.cat([b.sparse.values() for b in batches(packed.train)]),
                       torch.cat([b.sparse.values() for b in batches(plain.train)]))  # fmt: skip
    np.testing.assert_array_equal(packed.test.categorical, plain.test.categorical)


def test_criteo_vocabulary_comes_from_the_training_rows(tmp_path):
    path = write_synthetic_criteo(tmp_path / "day.tsv", 2000)
    streamed = open_stream(f"criteo:{path}", options=StreamOptions(min_count=3))
    counts = {}
    for line in path.read_text().splitlines()[:1600]:
        value = line.split("\t")[14]
        if value:
            counts[value] = counts.get(value, 0) + 1
    kept = sorted(v for v, c in counts.items() if c >= 3)
    assert sorted(streamed.fitted["vocabulary"]["C1"]) == kept
    assert streamed.train.schema.categorical[0].cardinality == len(kept) + 2


def test_bad_input_names_the_file_and_line(shop, tmp_path):
    schema = str(shop / "schema.yaml")
    with pytest.raises(RanknasError, match="no such file or directory"):
        open_stream(str(tmp_path / "missing"), schema)
    mixed = tmp_path / "mixed"
    mixed.mkdir()
    pq.write_table(shop_table(100), mixed / "a.parquet")
    other = shop_table(100).set_column(5, "slot", pa.array([str(k % 5) for k in range(100)]))
    pq.write_table(other, mixed / "b.parquet")
    with pytest.raises(RanknasError, match=r"b\.parquet: column 'slot' is string here"):
        open_stream(str(mixed), schema)
    (mixed / "b.parquet").write_bytes(b"not parquet at all")
    with pytest.raises(RanknasError, match=r"b\.parquet: cannot read the Parquet file"):
        open_stream(str(mixed), schema)
    tsv = write_synthetic_criteo(tmp_path / "day.tsv", 500)
    lines = tsv.read_text().splitlines(keepends=True)
    lines[2] = "1\tnot-a-number" + lines[2][lines[2].index("\t", 2) :]
    tsv.write_text("".join(lines))
    message = r"day\.tsv: 1 malformed lines.*not an integer: 1 \(line 3\)"
    with pytest.raises(RanknasError, match=message):
        open_stream(f"criteo:{tsv}", options=StreamOptions(max_bad_rows=0))
    assert len(open_stream(f"criteo:{tsv}").train) == 399  # within the limits: skipped


def test_train_stream_from_the_command_line(tmp_path, capsys):
    assert main(["data", "synth", "--format", "criteo", "--rows", "3000", "--out",
                 str(tmp_path)]) == 0  # fmt: skip
    code = main(["train", "--stream", "--data", f"criteo:{tmp_path / 'data.tsv'}", "--arch",
                 "logistic_regression", "--examples", "2048", "--hash-size", "1000",
                 "--json"])  # fmt: skip
    out = capsys.readouterr()
    summary = json.loads(out.out.strip().splitlines()[-1])
    # 4 steps on random-looking hashed ids may not beat the base rate: a diverged run is 1
    assert summary["examples"] == 2048 and summary["steps"] == 4 and summary["val_examples"] == 300
    assert summary["split"].startswith("in file order, streamed from")  # as in memory: said
    assert code == (0 if summary["status"] == "complete" else 1)
    assert "streamed from" in out.err
    assert main(["train", "--stream", "--data", "synthetic", "--arch", "dlrm"]) == 2


def test_study_config_stream_section():
    base = {"name": "s", "search_space": {"type": "around", "base": "dlrm"}}
    config = parse_config(base | {"data": {"source": "criteo:day.tsv", "stream": True}})
    assert config.data.stream.enabled and config.data.stream.min_count == 1
    with pytest.raises(RanknasError, match=r"data\.stream reads one source"):
        parse_config(base | {"data": {"stream": True}})
    with pytest.raises(RanknasError, match="splits in file order"):
        parse_config(base | {"data": {"source": "d/", "stream": {"enabled": True},
                                      "split": {"method": "random"}}})  # fmt: skip
    # settings nothing reads: a study ran with a vocabulary, min count 10, unsaid
    unread = {"source": "criteo:day.tsv", "stream": {"enabled": False, "hash_size": 1000}}
    with pytest.raises(RanknasError, match=r"data\.stream\.hash_size applies to streamed data"):
        parse_config(base | {"data": unread})
    with pytest.raises(RanknasError, match=r"data\.schema: a Criteo file's columns"):
        parse_config(base | {"data": {"source": "criteo:day.tsv", "schema": "s.yaml"}})


def test_a_study_streams_its_source(shop):
    from nas.protocol import prepare_data

    data = {"source": str(shop / "parts"), "schema": str(shop / "schema.yaml"),
            "stream": {"enabled": True, "chunk_rows": 300}}  # fmt: skip
    config = parse_config({"name": "s", "search_space": {"type": "around", "base": "dlrm"},
                           "data": data})  # fmt: skip
    prepared = prepare_data(config)
    assert isinstance(prepared.train, StreamSplit) and len(prepared.train) == 2400
    assert "streamed from" in prepared.split and "training-split vocabularies" in prepared.split
    assert prepared.preprocessing["vocabulary"]["country"][0] == "c0"


def _with_days(shop, days) -> str:
    """The shop's rows with a `day` column (the schema's time) as two Parquet files."""
    table = shop_table(ROWS).append_column("day", pa.array(days))
    (shop / "timed").mkdir()
    for k, lo in enumerate((0, ROWS // 2)):
        pq.write_table(table.slice(lo, ROWS // 2), shop / "timed" / f"part-{k}.parquet")
    (shop / "timed.yaml").write_text(SCHEMA + "time: day\n")
    return str(shop / "timed")


def test_a_streamed_split_in_file_order_is_checked_against_the_time_column(shop, capsys):
    """A streamed log not written in time order was split in file order without a word: the
    model validated and tested on rows older than ones it trained on."""
    shuffled = _with_days(shop, np.random.default_rng(0).permutation(ROWS) // 30)
    schema = str(shop / "timed.yaml")
    with pytest.raises(RanknasError, match="not in time order") as info:
        open_stream(shuffled, schema, time_order="set data.split.method: ordered")
    assert "rows are earlier than the latest training row" in str(info.value)
    assert str(info.value).endswith("split in file order anyway: set data.split.method: ordered")
    assert "file order," in open_stream(shuffled, schema).description  # ordered: as written
    # a row cache written meanwhile is no way around the check
    with pytest.raises(RanknasError, match="not in time order"):
        open_stream(shuffled, schema, time_order="--split ordered")
    train = ["train", "--stream", "--data", shuffled, "--schema", schema, "--arch", "dlrm"]
    assert (
        main(train) == 2
        and "split in file order anyway: --split ordered" in capsys.readouterr().err
    )


def test_a_time_column_in_order_but_for_a_few_rows_is_told_not_refused(shop, caplog):
    days = np.arange(ROWS) // 30
    days[5] = 10**6  # one training row of a wrong date: every later row is "earlier" than it
    days[ROWS - 40 : ROWS - 38] = 0  # 2 test rows logged late
    streamed = open_stream(_with_days(shop, days), str(shop / "timed.yaml"), time_order="x")
    assert "in file order, the order of 'day' but for a few rows" in streamed.description
    warned = [r.getMessage() for r in caplog.records if "out of place" in r.getMessage()]
    assert len(warned) == 2 and "1 of the 2,400 training rows later" in warned[0]
    assert "2 of the 300 test rows are earlier than the latest validation row" in warned[1]


def test_a_study_names_its_time_column_for_the_streamed_split(shop):
    from nas.protocol import prepare_data

    source = _with_days(shop, np.arange(ROWS)[::-1] // 30)  # newest first
    data = {"source": source, "schema": str(shop / "schema.yaml"), "stream": True,
            "split": {"column": "day"}}  # fmt: skip
    config = parse_config({"name": "s", "search_space": {"type": "around", "base": "dlrm"},
                           "data": data})  # fmt: skip
    with pytest.raises(RanknasError, match=r"not in time order.*data\.split\.method: ordered"):
        prepare_data(config)
    data["split"] = {"method": "ordered"}
    config = parse_config({"name": "s", "search_space": {"type": "around", "base": "dlrm"},
                           "data": data})  # fmt: skip
    assert "streamed from" in prepare_data(config).split
    with pytest.raises(RanknasError, match="a Criteo file has no time column"):
        open_stream("criteo:day.tsv", None, time_order="x", time_column="day")


def test_a_categorical_column_of_one_value_in_training_is_named_in_both_paths(shop, caplog):
    """A dense column constant in training was named; a categorical one (an app version that
    changes after the training rows) trained silently as a feature that tells nothing."""
    versions = np.where(np.arange(ROWS) < 2400, "v1", "v2")
    table = shop_table(ROWS).append_column("version", pa.array(versions))
    pq.write_table(table, shop / "versioned.parquet")
    (shop / "versioned.yaml").write_text(SCHEMA + "  - version\n")
    said = "categorical column(s) ['version'] hold one value in every training row"
    data = load_tabular(shop / "versioned.parquet", shop / "versioned.yaml")
    with caplog.at_level("WARNING"):
        fit_preprocessing(data.split(method="ordered")[0])
    assert said in caplog.text  # the list names it alone
    caplog.clear()
    with caplog.at_level("WARNING"):
        open_stream(str(shop / "versioned.parquet"), str(shop / "versioned.yaml"))
    assert said in caplog.text


def test_a_time_column_without_times_claims_no_order(shop):
    """Cells of no time in a split (blank, or text that is no date) gave the check nothing
    to compare, and the split was still said to be "the order of 'day'"."""
    from trainers.data.stream import _bounds, check_time_order

    table = shop_table(ROWS).append_column("day", pa.array(["soon"] * ROWS))
    pq.write_table(table, shop / "untimed.parquet")
    (shop / "untimed.yaml").write_text(SCHEMA + "time: day\n")
    source = open_source(shop / "untimed.parquet", shop / "untimed.yaml")
    assert check_time_order(source, _bounds(source.rows, (0.8, 0.1, 0.1)), "x") == ""


def _hive(shop):
    """The shop rows as Spark writes a log: `ds=<day>/slot=<slot>/part-0.parquet` (the two
    columns in the directory names, not the files), with `_SUCCESS` and `.crc` beside; and
    the same rows, in that order, as one file with both columns."""
    table = shop_table(ROWS)
    days = np.repeat([f"2026-12-0{k + 1}" for k in range(3)], ROWS // 3)
    table = table.append_column("ds", pa.array(days))
    order = np.lexsort((table["slot"].to_numpy(), days))  # by day, then slot: the paths' order
    table = table.take(order)
    hive = shop / "hive"
    for day in np.unique(days):
        for slot in range(5):
            rows = table.filter(pa.compute.and_(pa.compute.equal(table["ds"], day),
                                                pa.compute.equal(table["slot"], slot)))  # fmt: skip
            folder = hive / f"ds={day}" / f"slot={slot}"
            folder.mkdir(parents=True)
            pq.write_table(rows.drop_columns(["ds", "slot"]), folder / "part-0.parquet",
                           row_group_size=100)  # fmt: skip
            (folder / ".part-0.parquet.crc").write_bytes(b"not parquet")
    (hive / "_SUCCESS").write_bytes(b"")
    pq.write_table(table, shop / "flat.parquet")
    (shop / "schema.yaml").write_text(SCHEMA + "time: ds\n")
    return hive


def test_a_hive_partitioned_directory_loads_and_streams_as_one_file(shop):
    """Logs partitioned by day (`ds=2026-12-01/`) were refused in memory ("a directory,
    not a data file") and streamed without the partition columns (the day, the slot)."""
    hive = _hive(shop)
    ours, theirs = (
        load_tabular(path, shop / "schema.yaml") for path in (hive, shop / "flat.parquet")
    )
    assert len(ours.labels) == ROWS
    np.testing.assert_array_equal(ours.labels, theirs.labels)
    np.testing.assert_array_equal(ours.categorical, theirs.categorical)  # slot from its folder
    np.testing.assert_allclose(ours.dense, theirs.dense, equal_nan=True)
    np.testing.assert_array_equal(ours.time, theirs.time)  # the day, from its folder
    options = StreamOptions(chunk_rows=200)
    ours, theirs = (open_stream(str(path), str(shop / "schema.yaml"), options=options)
                    for path in (hive, shop / "flat.parquet"))  # fmt: skip
    assert ours.fitted["vocabulary"] == theirs.fitted["vocabulary"]
    for split in ("valid", "test"):
        np.testing.assert_array_equal(getattr(ours, split).categorical,
                                      getattr(theirs, split).categorical)  # fmt: skip
        np.testing.assert_allclose(getattr(ours, split).dense, getattr(theirs, split).dense)
    assert tabular.infer_schema(hive, "clicked")["time"] == "ds"


def test_a_directory_of_parquet_files_that_do_not_fit_together_is_refused(shop):
    from trainers.data.parquet_parts import parquet_parts, read_frame

    hive = _hive(shop)
    stray = hive / "region=eu" / "part-0.parquet"
    stray.parent.mkdir()
    pq.write_table(shop_table(10), stray)
    said = r"hive: its files lie under different partition columns \(\['ds', 'slot'\] for ds="
    with pytest.raises(RanknasError, match=said):
        parquet_parts(hive)
    stray.unlink()
    lacking = hive / "ds=2026-12-02" / "slot=0" / "part-0.parquet"
    pq.write_table(shop_table(10).drop_columns(["price", "slot"]), lacking)
    said = r"slot=0/part-0\.parquet: no column\(s\) \['price'\]; the files of one data set need"
    with pytest.raises(RanknasError, match=said):
        read_frame(hive, ["clicked", "price", "ds"])
    # a column of another type in one file: concatenated in memory, refused when streamed
    other = shop_table(10).drop_columns(["slot"])
    other = other.set_column(other.schema.get_field_index("visits"), "visits",
                             other["visits"].cast(pa.float64()))  # fmt: skip
    pq.write_table(other, lacking)
    with pytest.raises(RanknasError, match=r"column 'visits' is double here but int64 in "):
        load_tabular(hive, shop / "schema.yaml")
    lacking.unlink()
    # a folder that is no partition (an old copy kept beside them) was read as more rows
    (hive / "old").mkdir()
    pq.write_table(shop_table(10), hive / "old" / "part-0.parquet")
    with pytest.raises(RanknasError, match=r"hive: old/ holds Parquet files but is no partition"):
        parquet_parts(hive)
    clash = shop / "clash" / "slot=1" / "part-0.parquet"
    clash.parent.mkdir(parents=True)
    pq.write_table(shop_table(10), clash)
    with pytest.raises(RanknasError, match=r"column\(s\) \['slot'\] both in the file and in its "
                                           "directory names"):  # fmt: skip
        load_tabular(shop / "clash", shop / "schema.yaml")


@pytest.mark.parametrize("stream", [False, True])
def test_a_first_file_without_a_column_is_blamed_not_the_schema(shop, stream):
    """Streamed, a directory whose first file lacked a column said "Fix the names in the
    schema file"; the other files had it."""
    hive = _hive(shop)
    first = hive / "ds=2026-12-01" / "slot=0" / "part-0.parquet"
    pq.write_table(shop_table(10).drop_columns(["price", "slot"]), first)
    said = r"slot=0/part-0\.parquet: no column\(s\) \['price'\]; the files of one data set need"
    with pytest.raises(RanknasError, match=said):
        if stream:
            open_stream(str(hive), str(shop / "schema.yaml"), options=StreamOptions(chunk_rows=200))
        else:
            load_tabular(hive, shop / "schema.yaml")
    # a column no file has: the schema's name, as before
    (shop / "schema.yaml").write_text(SCHEMA.replace("[row, visits, price]", "[row, visits, prize]")
                                      + "time: ds\n")  # fmt: skip
    with pytest.raises(RanknasError, match=r"column\(s\) \['prize'\] not in .*Fix the names"):
        load_tabular(hive, shop / "schema.yaml")


def test_a_time_split_that_cannot_fall_between_days_says_so(shop, caplog):
    """Three days of logs in folders per country: the boundaries could not fall between
    days, and the test split became one country's rows, unannounced."""
    table = shop_table(ROWS).drop_columns(["slot", "country"])
    for k, country in enumerate(("de", "fr", "us")):
        for d in range(3):
            folder = shop / "days" / f"ds=2026-12-0{d + 1}" / f"country={country}"
            folder.mkdir(parents=True)
            pq.write_table(table.slice((3 * k + d) * 300, 300), folder / "part-0.parquet")
    (shop / "days.yaml").write_text("label: clicked\ndense: [row, visits, price]\n"
                                    "categorical: [country]\ntime: ds\n")  # fmt: skip
    data = load_tabular(shop / "days", shop / "days.yaml")
    caplog.clear()
    data.split(method="time")
    assert "time column ds has 3 distinct values: the split cannot fall between two of them" in (
        caplog.text
    )
