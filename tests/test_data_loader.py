"""TabularData splits and the batch loader (KeyedJaggedTensor layout pinned)."""

import numpy as np
import pytest
import torch

from search_space.errors import RanknasError
from search_space.schema import CategoricalFeature, DatasetSchema
from trainers.data import TabularData

ROWS = 103


@pytest.fixture
def data():
    """Ids encode (row, feature) so a mix-up of the layout shows: id = 10 * row + feature."""
    schema = DatasetSchema(
        dense=("a", "b"),
        categorical=tuple(CategoricalFeature(f"f{k}", 10 * ROWS) for k in range(3)),
    )
    rows = np.arange(ROWS)
    categorical = 10 * rows[:, None] + np.arange(3)[None, :]
    dense = np.stack([rows, -rows], axis=1).astype(np.float32)
    return TabularData(dense, categorical, rows % 2, schema)


def rows_of(batch):
    return batch.dense[:, 0].long()


def test_kjt_layout_one_id_per_feature_per_row(data):
    batch = next(iter(data.loader(8)))
    kjt = batch.sparse
    assert kjt.keys() == ["f0", "f1", "f2"]
    assert kjt.stride() == 8
    assert torch.equal(kjt.lengths(), torch.ones(24, dtype=kjt.lengths().dtype))
    # values are grouped by key, then by batch row
    expected = torch.tensor([10 * b + k for k in range(3) for b in range(8)])
    assert torch.equal(kjt.values(), expected)
    for k, key in enumerate(kjt.keys()):
        assert torch.equal(kjt[key].values(), torch.arange(8) * 10 + k)
        assert torch.equal(kjt.to_dict()[key].values(), torch.arange(8) * 10 + k)
        assert torch.equal(kjt[key].lengths(), torch.ones(8, dtype=kjt[key].lengths().dtype))


def test_shapes_dtypes_and_last_batch(data):
    batches = list(data.loader(32))
    assert len(batches) == len(data.loader(32)) == 4
    assert [b.labels.shape[0] for b in batches] == [32, 32, 32, 7]
    last = batches[-1]
    assert last.dense.shape == (7, 2) and last.dense.dtype == torch.float32
    assert last.labels.dtype == torch.float32
    assert last.sparse.stride() == 7 and last.sparse.values().dtype == torch.int64
    assert torch.equal(last.sparse["f2"].values(), rows_of(last) * 10 + 2)
    assert len(data.loader(32, drop_last=True)) == 3
    assert [b.labels.shape[0] for b in data.loader(32, drop_last=True)] == [32] * 3


def test_shuffled_batches_keep_rows_together(data):
    for batch in data.loader(16, shuffle=True, seed=4):
        rows = rows_of(batch)
        assert torch.equal(batch.dense[:, 1], -batch.dense[:, 0])
        assert torch.equal(batch.labels, (rows % 2).float())
        for k in range(3):
            assert torch.equal(batch.sparse[f"f{k}"].values(), rows * 10 + k)


def epoch_order(loader):
    return torch.cat([rows_of(b) for b in loader]).tolist()


def test_shuffling_is_deterministic_per_seed_and_epoch(data):
    loader = data.loader(10, shuffle=True, seed=1)
    first, second = epoch_order(loader), epoch_order(loader)
    assert sorted(first) == sorted(second) == list(range(ROWS))
    assert first != second  # a new permutation each epoch
    assert first != list(range(ROWS))
    again = data.loader(10, shuffle=True, seed=1)
    assert epoch_order(again) == first and epoch_order(again) == second
    again.set_epoch(0)
    assert epoch_order(again) == first
    assert epoch_order(data.loader(10, shuffle=True, seed=2)) != first
    assert epoch_order(data.loader(10)) == list(range(ROWS))


def test_splits_are_deterministic_disjoint_and_covering(data):
    parts = data.split_indices((0.7, 0.2, 0.1), seed=3)
    assert [len(p) for p in parts] == [72, 21, 10]
    joined = np.concatenate(parts)
    assert sorted(joined.tolist()) == list(range(ROWS))
    again = data.split_indices((0.7, 0.2, 0.1), seed=3)
    assert all(np.array_equal(a, b) for a, b in zip(parts, again, strict=True))
    other = data.split_indices((0.7, 0.2, 0.1), seed=4)
    assert not np.array_equal(parts[0], other[0])
    train, _, test = data.split((0.7, 0.2, 0.1), seed=3)
    np.testing.assert_array_equal(train.dense[:, 0], parts[0])
    np.testing.assert_array_equal(test.categorical[:, 1], parts[2] * 10 + 1)
    assert train.schema == data.schema


def test_an_ordered_split_is_contiguous(data):
    train, valid, test = data.split_indices(method="ordered")
    assert train.tolist() == list(range(82)) and test[-1] == ROWS - 1
    assert len(valid) == 11


@pytest.mark.parametrize("fractions", [(0.5, 0.5), (0.8, 0.3, 0.1), (1.2, -0.1, -0.1)])
def test_bad_split_fractions(data, fractions):
    with pytest.raises(RanknasError, match="fractions"):
        data.split(fractions)


def test_tabular_data_checks_shapes_and_id_ranges(data):
    with pytest.raises(ValueError, match="cardinality"):
        TabularData(data.dense, data.categorical + 10 * ROWS, data.labels, data.schema)
    with pytest.raises(ValueError, match="dense"):
        TabularData(data.dense[:, :1], data.categorical, data.labels, data.schema)
    with pytest.raises(RanknasError, match="batch_size"):
        data.loader(0)
