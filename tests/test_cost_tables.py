"""Table workloads: files, architectures, schemas, generated pools, features."""

import json
import re

import numpy as np
import pytest

from cost_models.sharding.tables import (
    HISTOGRAM_BINS,
    NUM_FEATURES,
    TableSpec,
    generate_tables,
    load_tables,
    save_tables,
    table_features,
    tables_from_architecture,
    tables_from_schema,
    train_eval_pools,
)
from search_space.errors import RanknasError
from search_space.presets import preset
from search_space.schema import CategoricalFeature, DatasetSchema


def test_yaml_round_trip(tmp_path):
    tables = generate_tables(5, seed=1)
    save_tables(tables, tmp_path / "t.yaml")
    save_tables(tables, tmp_path / "t.json")
    assert load_tables(tmp_path / "t.yaml") == tables
    assert load_tables(tmp_path / "t.json") == tables


@pytest.mark.parametrize(
    ("entry", "expected"),
    [
        ({"name": "a", "embedding_dim": 8}, "tables[1] (a): 'num_embeddings' is missing"),
        (  # YAML 1.1 reads 1.5e6 as a text
            {"name": "a", "num_embeddings": "1.5e6", "embedding_dim": 8},
            "got '1.5e6' (a text to YAML, which reads 1e6 so: write 1500000)",
        ),
        ({"name": "a", "num_embeddings": 10, "embedding_dim": 0}, "(a): 'embedding_dim'"),
        (  # fbgemm's AssertionError in `shard compare` and `shard plan --measure`
            {"name": "a", "num_embeddings": 10, "embedding_dim": 3},
            "(a): 'embedding_dim' is 3; fbgemm's embedding kernels need a multiple of 4: use 4",
        ),
        ({"name": "a", "num_embeddings": 10, "embedding_dim": 8, "pooling_factor": -1}, "'pooling"),
        ({"name": "a", "num_embeddings": 10, "embedding_dim": 8, "dtype": "int4"}, "'dtype'"),
        ({"name": "a", "num_embeddings": 10, "embedding_dim": 8, "rows": 3}, "unknown field(s)"),
        ({"name": "a", "num_embeddings": 10, "embedding_dim": 8, "reuse_histogram": [1]}, "17"),
        ({"num_embeddings": 10, "embedding_dim": 8}, "tables[1]: 'name'"),
        ("a", "tables[1]: expected a mapping"),
    ],
)
def test_malformed_entry_names_entry_and_field(tmp_path, entry, expected):
    good = {"name": "ok", "num_embeddings": 10, "embedding_dim": 8}
    path = tmp_path / "tables.json"
    path.write_text(json.dumps({"tables": [good, entry]}))
    with pytest.raises(RanknasError) as info:
        load_tables(path)
    assert str(path) in str(info.value)
    assert expected in str(info.value)


def test_malformed_files(tmp_path):
    bad_yaml = tmp_path / "bad.yaml"
    bad_yaml.write_text("tables: [\n")
    with pytest.raises(RanknasError, match="not valid YAML"):
        load_tables(bad_yaml)
    no_list = tmp_path / "no_list.yaml"
    no_list.write_text("tables: 3\n")
    with pytest.raises(RanknasError, match=re.escape("'tables: [...]'")):
        load_tables(no_list)
    other = tmp_path / "other.yaml"  # `devices: 8` planned on --devices' count unsaid
    other.write_text("devices: 8\ntables:\n- {name: a, num_embeddings: 2, embedding_dim: 4}\n")
    with pytest.raises(RanknasError, match=r"unknown key\(s\) \['devices'\]; a table file"):
        load_tables(other)
    other.write_text("table:\n- {name: a, num_embeddings: 2, embedding_dim: 4}\n")
    with pytest.raises(RanknasError, match=re.escape("'tables: [...]'; found ['table']")):
        load_tables(other)
    twice = tmp_path / "twice.yaml"
    twice.write_text("tables:\n" + "- {name: a, num_embeddings: 2, embedding_dim: 4}\n" * 2)
    with pytest.raises(RanknasError, match="more than once"):
        load_tables(twice)
    with pytest.raises(RanknasError, match="cannot read"):
        load_tables(tmp_path / "missing.yaml")


def test_from_architecture_and_schema(small_schema):
    arch = preset("dlrm", small_schema)
    tables = tables_from_architecture(arch, pooling_factors={"c0": 3.0})
    assert [t.name for t in tables] == [f"t_{f.name}" for f in small_schema.categorical]
    assert tables[0].pooling_factor == 3.0 and tables[1].pooling_factor == 1.0
    assert tables[0].embedding_dim == arch.embedding.dim
    from_schema = tables_from_schema(small_schema, embedding_dim=16)
    assert [t.num_embeddings for t in from_schema] == [
        f.cardinality for f in small_schema.categorical
    ]


def test_column_names_give_distinct_tables_that_a_plan_file_accepts(tmp_path):
    names = ("a", "a/cw0", "user.id", "50.", "50%2E")
    schema = DatasetSchema(dense=("d",), categorical=tuple(CategoricalFeature(n, 5) for n in names))
    tables = tables_from_schema(schema, embedding_dim=8)
    assert len({t.name for t in tables}) == len(names)
    assert not any("/" in t.name or "." in t.name for t in tables)
    save_tables(tables, tmp_path / "t.yaml")
    assert load_tables(tmp_path / "t.yaml") == tables


def test_generated_pools_are_power_law_and_disjoint():
    train, held_out = train_eval_pools(300, 200, seed=0)
    assert len(train) == 300 and len(held_out) == 200
    assert not {t.name for t in train} & {t.name for t in held_out}
    rows = np.array([t.num_embeddings for t in train + held_out])
    assert np.median(rows) < rows.mean() / 3  # heavy tail
    assert generate_tables(10, seed=4) == generate_tables(10, seed=4)


def test_features_and_reuse_histogram():
    skewed = TableSpec("s", 100_000, 16, zipf_alpha=1.3)
    flat = TableSpec("f", 100_000, 16, zipf_alpha=0.2)
    features = table_features([skewed, flat])
    assert features.shape == (2, NUM_FEATURES) == (2, 4 + HISTOGRAM_BINS)
    hist_skewed, hist_flat = features[:, 4:]
    assert hist_skewed.sum() == pytest.approx(1.0) and hist_flat.sum() == pytest.approx(1.0)
    bins = np.arange(HISTOGRAM_BINS)
    assert (hist_skewed * bins).sum() > (hist_flat * bins).sum() + 2  # more reuse
    given = TableSpec("g", 10, 4, reuse_histogram=(1.0,) + (0.0,) * 16)
    assert table_features([given])[0, 4] == 1.0


def test_id_counts_are_numpys_unique_counts():
    from cost_models.sharding.tables import REUSE_SAMPLES, id_counts, zipf_indices

    rng = np.random.default_rng(0)
    for rows in (1, 7, 1000, 8 * REUSE_SAMPLES, 8 * REUSE_SAMPLES + 1, 10**8, 3 * 10**9):
        for alpha in (0.0, 1.0, 1.3):
            ids = zipf_indices(rows, alpha, REUSE_SAMPLES, rng)
            assert np.array_equal(id_counts(ids, rows), np.unique(ids, return_counts=True)[1])
