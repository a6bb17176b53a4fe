"""Joint tables (the GPU's one-kernel lookup, pure torch) compute and learn what torch's
tables do, for one id per row and for lists of ids."""

import pytest
import torch
from torchrec.modules.embedding_configs import EmbeddingBagConfig, PoolingType
from torchrec.modules.embedding_modules import EmbeddingBagCollection
from torchrec.sparse.jagged_tensor import KeyedJaggedTensor

from helpers import check_tables_step_like_torch, check_training_ends_alike
from search_space.builder import build_model
from search_space.presets import preset
from trainers import trainer
from trainers.data import SyntheticConfig, generate_synthetic
from trainers.data.dataset import ResidentBatches
from trainers.fused_tables import FusedTables
from trainers.joint_tables import JointTables

DIMS = (8, 4, 8, 4)  # two widths, interleaved: two joint weights, columns put back in order


def _collection(pooling: tuple[PoolingType, ...]) -> EmbeddingBagCollection:
    torch.manual_seed(0)
    return EmbeddingBagCollection(
        tables=[
            EmbeddingBagConfig(
                name=f"t_f{i}",
                embedding_dim=d,
                num_embeddings=10 + i,
                feature_names=[f"f{i}"],
                pooling=p,
            )
            for i, (d, p) in enumerate(zip(DIMS, pooling, strict=True))
        ]
    )


def _features(lengths: dict[str, list[int]], values: dict[str, list[int]]) -> KeyedJaggedTensor:
    keys = list(lengths)
    return KeyedJaggedTensor(
        keys=keys,
        values=torch.tensor([v for k in keys for v in values[k]]),
        lengths=torch.tensor([n for k in keys for n in lengths[k]], dtype=torch.int32),
    )


def _single_valued() -> KeyedJaggedTensor:
    """Another key order than the tables', a key no table reads, ids repeated in a batch."""
    values = {"f3": [12, 0, 12], "extra": [5, 5, 5], "f1": [3, 3, 9], "f0": [1, 9, 1],
              "f2": [0, 11, 11]}  # fmt: skip
    return _features({k: [1, 1, 1] for k in values}, values)


def _multi_valued() -> KeyedJaggedTensor:
    """Lists with repeats and an empty bag."""
    lengths = {"f0": [2, 0, 1], "f1": [3, 1, 2], "f2": [1, 1, 1], "f3": [1, 2, 1]}
    values = {"f0": [3, 3, 9], "f1": [1, 1, 4, 7, 0, 10], "f2": [11, 0, 11], "f3": [2, 2, 12, 0]}
    return _features(lengths, values)


CASES = {
    "single": (_single_valued, (PoolingType.SUM,) * 4, True),
    "lists": (
        _multi_valued,
        (PoolingType.SUM, PoolingType.MEAN, PoolingType.MEAN, PoolingType.SUM),
        False,
    ),
}


@pytest.mark.parametrize("optimizer", ["sgd", "adagrad", "rowwise_adagrad"])
@pytest.mark.parametrize("case", list(CASES))
def test_a_step_pools_and_updates_as_torch_tables_do(optimizer, case):
    make_features, pooling, single = CASES[case]
    reference, features = _collection(pooling), make_features()
    joint = JointTables(reference, optimizer, lr=0.1, single_valued=single)
    assert joint.state_dict().keys() == reference.state_dict().keys()
    check_tables_step_like_torch(reference, joint, optimizer, features)
    assert not torch.equal(
        reference.embedding_bags["t_f0"].weight, _collection(pooling).embedding_bags["t_f0"].weight
    )
    with torch.no_grad():  # evaluation updates nothing
        before = joint.state_dict()["embedding_bags.t_f1.weight"].clone()
        joint(features)
    torch.testing.assert_close(joint.state_dict()["embedding_bags.t_f1.weight"], before)


def test_loading_a_state_dict_writes_into_the_joint_weights_and_back():
    pooling = (PoolingType.SUM,) * 4
    reference, other = _collection(pooling), _collection(pooling)
    with torch.no_grad():
        for bag in other.embedding_bags.values():
            bag.weight.normal_()
    joint = JointTables(reference, "adagrad", lr=0.1, single_valued=True)
    joint.load_state_dict(other.state_dict())
    torch.testing.assert_close(joint(_single_valued()).values(), other(_single_valued()).values())
    joint.write_back(reference)
    for name, bag in other.embedding_bags.items():
        torch.testing.assert_close(reference.embedding_bags[name].weight, bag.weight)


def test_training_on_joint_tables_ends_where_torch_tables_do(monkeypatch):
    data = generate_synthetic(SyntheticConfig(rows=12_000, seed=1))
    monkeypatch.setattr(FusedTables, "fits", staticmethod(lambda ebc: False))

    def train_both(way, model, train_part, valid, config):  # joint tables, then torch's
        monkeypatch.setattr(trainer, "JOINT_TABLE_DEVICES", ("cpu",) if way == 0 else ())
        return trainer.train(model, train_part, valid, config=config)

    check_training_ends_alike(lambda: build_model(preset("dcnv2", data.schema), seed=0), data,
                              train_both)  # fmt: skip


def test_resident_batches_are_the_loaders_batches():
    data = generate_synthetic(SyntheticConfig(rows=3_000, seed=2))
    resident = ResidentBatches(data, 256, seed=5, device=torch.device("cpu"))
    loader = data.loader(256, shuffle=True, seed=5, drop_last=True)
    assert len(resident) == len(loader) == 3_000 // 256
    for _ in range(2):  # two epochs: each its own permutation
        for ours, theirs in zip(resident, loader, strict=True):
            torch.testing.assert_close(ours.dense, theirs.dense)
            torch.testing.assert_close(ours.labels, theirs.labels)
            assert ours.sparse.keys() == theirs.sparse.keys()
            torch.testing.assert_close(ours.sparse.values(), theirs.sparse.values())
            torch.testing.assert_close(ours.sparse.lengths(), theirs.sparse.lengths())


def test_evaluation_on_held_rows_is_the_host_evaluation(monkeypatch):
    monkeypatch.setattr(trainer, "HELD_EVAL_BATCH", 1_000)  # several batches, the last short
    data = generate_synthetic(SyntheticConfig(rows=3_000, seed=2))
    ordered = ResidentBatches(data, 1_024, seed=0, device=torch.device("cpu"), shuffle=False)
    assert [len(b.labels) for b in ordered] == [1_024, 1_024, 952]  # every row, in order
    model = build_model(preset("dlrm", data.schema), seed=0)
    held = trainer._Local()
    held.hold_on(torch.device("cpu"))
    for rows in (None, 1_000):
        assert held.evaluate(model, data, rows) == trainer.evaluate(model, data, rows)
    assert len(held._held) == 2  # each subset copied once, then reused
    held.evaluate(model, data, 1_000)
    assert len(held._held) == 2
