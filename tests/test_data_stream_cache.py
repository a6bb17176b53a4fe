"""The row cache of streamed data: the same batches and training as parsing the files, never
a partial or stale cache, reused by later runs."""

import os

import numpy as np
import pytest
import torch

from nas.cli import main
from search_space.builder import build_model
from search_space.presets import load_architecture
from trainers.data.stream import StreamOptions, StreamSplit, open_stream
from trainers.data.stream_cache import CACHE_DIR_NAME, RowCacheWriter
from trainers.data.synthetic import write_synthetic_criteo
from trainers.trainer import TrainConfig, train

pa = pytest.importorskip("pyarrow")
pq = pytest.importorskip("pyarrow.parquet")

SCHEMA = """name: shop
label: clicked
dense: [visits, price]
categorical: [country, {name: slot, cardinality: 5}]
"""
# several windows and chunks per split; validation and test streamed as well
SMALL = {"chunk_rows": 300, "shuffle_rows": 512, "memory_rows": 0}


@pytest.fixture(params=["criteo", "parquet"])
def source(request, tmp_path):
    """`open_stream`'s arguments for 3000 rows of a Criteo TSV or of a Parquet file."""
    if request.param == "criteo":
        return (f"criteo:{write_synthetic_criteo(tmp_path / 'day.tsv', 3000, piece_rows=700)}",)
    rng = np.random.default_rng(0)
    slot = rng.integers(0, 5, 3000)
    clicked = rng.random(3000) < np.where(slot == 2, 0.8, 0.2)
    table = pa.table({
        "clicked": clicked.astype(np.int8),
        "visits": rng.zipf(1.6, 3000).clip(max=10**6),
        "price": rng.normal(10, 3, 3000),
        "country": [f"c{k}" for k in rng.zipf(1.3, 3000).clip(max=50)],
        "slot": slot,
    })  # fmt: skip
    pq.write_table(table, tmp_path / "shop.parquet", row_group_size=400)
    (tmp_path / "schema.yaml").write_text(SCHEMA)
    return str(tmp_path / "shop.parquet"), str(tmp_path / "schema.yaml")


def opened(source, cache=True, **options):
    options = {"cache": cache, "min_count": 2, **SMALL, **options}
    return open_stream(*source, options=StreamOptions(**options))


def cache_dirs(tmp_path):
    return sorted(p.name for p in (tmp_path / CACHE_DIR_NAME).iterdir())


def assert_same_batches(ours, theirs, **options):
    ours, theirs = list(ours.loader(128, **options)), list(theirs.loader(128, **options))
    assert len(ours) == len(theirs) > 0
    for a, b in zip(ours, theirs, strict=True):
        assert torch.equal(a.dense, b.dense)
        assert torch.equal(a.sparse.values(), b.sparse.values())
        assert a.sparse.keys() == b.sparse.keys()
        assert torch.equal(a.labels, b.labels)


def test_the_cache_yields_the_batches_of_the_files(source, tmp_path):
    parsed = opened(source, cache=False)
    assert parsed.cache_note == "" and not (tmp_path / CACHE_DIR_NAME).exists()
    written, reused = opened(source), opened(source)
    assert written.cache_note.startswith("wrote the encoded rows to")
    assert reused.cache_note.startswith("read the encoded rows cached in")
    assert len(cache_dirs(tmp_path)) == 1
    for cached in (written, reused):
        assert cached.fitted == parsed.fitted
        assert cached.train.label_mean == parsed.train.label_mean
        splits = zip((cached.train, cached.valid, cached.test),
                     (parsed.train, parsed.valid, parsed.test), strict=True)  # fmt: skip
        for ours, theirs in splits:
            assert isinstance(ours, StreamSplit) and len(ours) == len(theirs)
            assert ours.schema == theirs.schema
            assert_same_batches(ours, theirs)
        assert_same_batches(cached.train, parsed.train, shuffle=True, seed=4, drop_last=True)
        np.testing.assert_array_equal(cached.train.head(700).dense, parsed.train.head(700).dense)
    in_memory = opened(source, memory_rows=10_000)  # validation and test read whole
    np.testing.assert_array_equal(in_memory.valid.categorical, parsed.valid.head(300).categorical)


def test_short_training_has_the_same_ne_with_and_without_the_cache(source):
    results = []
    for cache in (False, True):
        data = opened(source, cache=cache)
        model = build_model(load_architecture("dlrm", data.train.schema), seed=0)
        config = TrainConfig(batch_size=128, max_steps=25, evals=2)
        results.append(train(model, data.train, data.valid, data.test, config))
    assert results[0].status == results[1].status == "complete", results[0].failure_reason
    assert results[0].validation["ne"] == results[1].validation["ne"]
    assert results[0].test == results[1].test


def test_a_cache_cut_off_mid_write_is_never_read(source, tmp_path, monkeypatch):
    def killed(self, data):
        raise KeyboardInterrupt

    with monkeypatch.context() as patch:
        patch.setattr(RowCacheWriter, "append", killed)
        with pytest.raises(KeyboardInterrupt):
            opened(source)
    assert cache_dirs(tmp_path) == []  # the partial rows went with the interrupted run
    written = opened(source)
    (name,) = cache_dirs(tmp_path)
    cache = tmp_path / CACHE_DIR_NAME / name
    abandoned = cache.with_name(f"{name}.tmp-999999999")  # a writer that was killed
    abandoned.mkdir()
    (abandoned / "dense.f32").write_bytes(b"\0" * 64)
    with (cache / "ids.bin").open("r+b") as ids:  # damaged after it was written
        ids.truncate(1000)
    again = opened(source)
    assert again.cache_note.startswith("wrote the encoded rows to")  # not read: rewritten
    assert cache_dirs(tmp_path) == [name]
    assert_same_batches(again.train, written.train)


def test_a_changed_file_or_setting_gets_a_new_cache(source, tmp_path):
    first = opened(source)
    file = source[0].removeprefix("criteo:")
    assert opened(source).cache_note.startswith("read")
    assert opened(source, hash_size=64).cache_note.startswith("wrote")
    stat = os.stat(file)
    os.utime(file, ns=(stat.st_atime_ns, stat.st_mtime_ns + 10**9))  # rewritten
    changed = opened(source)
    assert changed.cache_note.startswith("wrote") and len(cache_dirs(tmp_path)) == 3
    assert_same_batches(changed.train, first.train)  # same bytes, so the same rows


def test_each_split_counts_its_positive_labels_with_or_without_the_cache(source):
    """A study records them: a file rewritten with as many rows shows in its labels."""

    def counted(data):
        splits = (data.train, data.valid, data.test)
        return [sum(int(np.count_nonzero(w.labels)) for w in s.windows(512)) for s in splits]

    written, read, uncached = opened(source), opened(source), opened(source, cache=False)
    assert read.cache_note.startswith("read")
    for data in (written, read, uncached):
        assert [s.positives for s in (data.train, data.valid, data.test)] == counted(written)
    assert 0 < written.train.positives < len(written.train)


def test_a_categorical_column_blank_in_every_training_row_is_named(tmp_path, caplog):
    rng = np.random.default_rng(0)
    table = pa.table({
        "clicked": (rng.random(600) < 0.3).astype(np.int8), "visits": rng.integers(0, 9, 600),
        "price": rng.normal(10, 3, 600), "country": pa.nulls(600, pa.string()),
        "slot": rng.integers(0, 5, 600),
    })  # fmt: skip
    pq.write_table(table, tmp_path / "blank.parquet")
    (tmp_path / "schema.yaml").write_text(SCHEMA)
    source = (str(tmp_path / "blank.parquet"), str(tmp_path / "schema.yaml"))
    for hashed in (None, 64):  # a vocabulary, or hashed ids
        caplog.clear()
        opened(source, cache=False, hash_size=hashed)
        assert "categorical column(s) ['country'] hold no value in any training row" in caplog.text
    assert "dense column" not in caplog.text
    table = table.set_column(2, "price", pa.array(np.full(600, 7.0)))  # one value: a hand schema's
    pq.write_table(table, tmp_path / "blank.parquet")
    opened(source, cache=False)
    assert "dense column(s) ['price'] hold one value (or none) in every training row" in caplog.text


def test_train_stream_says_when_it_writes_and_reads_the_cache(tmp_path, capsys):
    path = write_synthetic_criteo(tmp_path / "day.tsv", 2000)
    args = ["train", "--stream", "--data", f"criteo:{path}", "--arch", "logistic_regression",
            "--examples", "512", "--hash-size", "1000",
            "--cache-dir", str(tmp_path / "c")]  # fmt: skip
    main(args)
    assert "wrote the encoded rows to" in capsys.readouterr().err
    main(args)
    assert "read the encoded rows cached in" in capsys.readouterr().err
    main([*args, "--no-cache"])
    assert "encoded rows" not in capsys.readouterr().err
    assert len(list((tmp_path / "c").iterdir())) == 1


def test_an_unwritable_cache_dir_falls_back_to_the_files(source, tmp_path, caplog):
    blocked = tmp_path / "blocked"
    blocked.write_text("a file where the cache directory would go")
    data = opened(source, cache_dir=str(blocked / "cache"))
    assert data.cache_note == "" and "cannot write the row cache" in caplog.text
    assert_same_batches(data.train, opened(source, cache=False).train)
