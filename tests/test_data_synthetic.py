"""The synthetic data set: determinism, ranges, and a Bayes floor that beats first-order LR."""

import json

import numpy as np
import pytest
import scipy.sparse as sp
from sklearn.linear_model import LogisticRegression
from sklearn.metrics import log_loss
from sklearn.preprocessing import OneHotEncoder

from search_space.errors import RanknasError
from search_space.schema import synthetic_schema
from trainers.data import (
    SyntheticConfig,
    bayes_metrics,
    generate_synthetic,
    load_dataset,
    load_tabular,
    write_synthetic,
)


def _entropy(q: float) -> float:
    return float(-(q * np.log(q) + (1 - q) * np.log(1 - q)))


@pytest.fixture(scope="module")
def data():
    return generate_synthetic(SyntheticConfig(rows=30_000, seed=0))


def test_same_seed_same_data_other_seed_other_data(data):
    again = generate_synthetic(SyntheticConfig(rows=30_000, seed=0))
    other = generate_synthetic(SyntheticConfig(rows=30_000, seed=1))
    for name in ("dense", "categorical", "labels", "true_prob"):
        np.testing.assert_array_equal(getattr(data, name), getattr(again, name))
    assert not np.array_equal(data.categorical, other.categorical)
    assert not np.allclose(data.true_prob, other.true_prob)


def test_first_rows_do_not_depend_on_the_row_count(data):
    small = generate_synthetic(SyntheticConfig(rows=1000, seed=0))
    np.testing.assert_array_equal(small.categorical, data.categorical[:1000])
    np.testing.assert_array_equal(small.labels, data.labels[:1000])
    np.testing.assert_allclose(small.true_prob, data.true_prob[:1000])


def test_shapes_types_and_id_ranges(data):
    assert data.schema == synthetic_schema(8, 16, 0)
    assert data.dense.shape == (30_000, 8) and data.dense.dtype == np.float32
    assert data.categorical.shape == (30_000, 16) and data.categorical.dtype == np.int64
    cardinalities = np.array([f.cardinality for f in data.schema.categorical])
    assert (data.categorical >= 0).all() and (data.categorical < cardinalities).all()
    assert set(np.unique(data.labels)) == {0.0, 1.0}
    assert ((data.true_prob > 0) & (data.true_prob < 1)).all()


def test_ids_are_zipf_like(data):
    # id 0 is the most frequent; a long tail of rarer ids follows
    for k in range(data.schema.num_sparse):
        counts = np.bincount(data.categorical[:, k])
        assert counts.argmax() == 0
        assert counts[0] > 4 * counts[5]


def test_base_rate_is_calibrated(data):
    assert 0.1 <= data.labels.mean() <= 0.25
    assert abs(data.true_prob.mean() - 0.15) < 0.02


def test_true_probability_achieves_the_reported_bayes_logloss(data):
    metrics = bayes_metrics(data)
    assert metrics.logloss == pytest.approx(log_loss(data.labels, data.true_prob), rel=1e-9)
    assert metrics.ne == pytest.approx(
        metrics.logloss / _entropy(data.labels.mean(dtype=np.float64)), rel=1e-9
    )
    # the realized logloss scatters around its expectation
    assert metrics.logloss == pytest.approx(metrics.expected_logloss, abs=0.01)
    assert metrics.rows == 30_000 and metrics.base_rate == pytest.approx(data.labels.mean())


def test_bayes_floor_is_clearly_below_first_order_logistic_regression(data):
    train, _, test = data.split((0.8, 0.0, 0.2), seed=0)
    encoder = OneHotEncoder(handle_unknown="ignore").fit(train.categorical)

    def features(part):
        return sp.hstack([encoder.transform(part.categorical), part.dense]).tocsr()

    model = LogisticRegression(C=0.03, max_iter=500).fit(features(train), train.labels)
    prob = model.predict_proba(features(test))[:, 1]
    lr_ne = log_loss(test.labels, prob) / _entropy(test.labels.mean())
    bayes_ne = bayes_metrics(test).ne
    assert bayes_ne < 0.9
    assert lr_ne > bayes_ne + 0.08


def test_interaction_orders_carry_signal():
    config = SyntheticConfig(rows=20_000, seed=3)
    full = bayes_metrics(generate_synthetic(config))
    first_order = bayes_metrics(generate_synthetic(SyntheticConfig(rows=20_000, seed=3, orders=())))
    assert full.expected_ne < first_order.expected_ne - 0.05


def test_bayes_metrics_needs_the_true_probability(data):
    with pytest.raises(ValueError, match="true_prob"):
        bayes_metrics(data.__class__(data.dense, data.categorical, data.labels, data.schema))


@pytest.mark.parametrize(
    "field, value",
    [("rows", 0), ("base_ctr", 1.5), ("orders", (2, 40)), ("pairwise_scale", -1.0)],
)
def test_bad_config_names_the_field(field, value):
    with pytest.raises(RanknasError, match=field):
        SyntheticConfig(**{field: value})


def test_load_dataset_synthetic_and_unknown_option():
    data = load_dataset("synthetic", rows=500, seed=2)
    assert len(data) == 500 and data.true_prob is not None
    with pytest.raises(RanknasError, match="unknown option"):
        load_dataset("synthetic", row=500)


@pytest.mark.parametrize("file_format", ["csv", "parquet"])
def test_write_synthetic_reads_back(tmp_path, file_format):
    if file_format == "parquet":
        pytest.importorskip("pyarrow", reason="Parquet needs pyarrow")
    config = SyntheticConfig(rows=2000, seed=5)
    path = write_synthetic(tmp_path, config, file_format=file_format)
    assert path == tmp_path / f"data.{file_format}"
    loaded = load_tabular(path, tmp_path / "schema.yaml")
    original = generate_synthetic(config)
    assert loaded.schema == original.schema
    np.testing.assert_array_equal(loaded.categorical, original.categorical)
    np.testing.assert_array_equal(loaded.labels, original.labels)
    np.testing.assert_allclose(loaded.dense, original.dense, rtol=1e-6)
    stats = json.loads((tmp_path / "stats.json").read_text())
    assert stats["config"]["rows"] == 2000
    assert stats["split"] == {"fractions": [0.8, 0.1, 0.1], "seed": 0}
    test = original.split((0.8, 0.1, 0.1), seed=0)[2]
    assert stats["bayes"]["test"]["logloss"] == pytest.approx(bayes_metrics(test).logloss)
    assert set(stats["bayes"]) == {"all", "train", "valid", "test"}
    assert [len(p) for p in loaded.split()] == [
        s["rows"] for s in list(stats["bayes"].values())[1:]
    ]


def test_a_split_of_one_label_has_no_ne(tmp_path):
    """50 rows leave 5 validation rows with no positive: the Bayes NE there is undefined
    (null in stats.json; it printed 8.5e9), and training on the file says why."""
    path = write_synthetic(tmp_path, SyntheticConfig(rows=50, seed=0))
    stats = json.loads((tmp_path / "stats.json").read_text())["bayes"]
    assert stats["valid"]["base_rate"] == 0.0 and stats["valid"]["ne"] is None
    assert 0 < stats["train"]["ne"] < 1
    with pytest.raises(RanknasError, match=r"the validation split .* holds no positive labels"):
        load_tabular(path, tmp_path / "schema.yaml").split()
