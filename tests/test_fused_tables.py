"""Tables trained by fbgemm's fused kernel compute and learn what torch's tables do."""

import pytest
import torch
from torchrec.modules.embedding_configs import EmbeddingBagConfig, PoolingType
from torchrec.modules.embedding_modules import EmbeddingBagCollection
from torchrec.sparse.jagged_tensor import KeyedJaggedTensor

from search_space.builder import build_model
from search_space.presets import preset
from trainers.data import SyntheticConfig, generate_synthetic
from trainers.fused_tables import FusedTables
from trainers.trainer import TrainConfig, make_optimizers, train


def _collection() -> EmbeddingBagCollection:
    torch.manual_seed(0)
    pooling = [PoolingType.SUM, PoolingType.MEAN, PoolingType.SUM]
    return EmbeddingBagCollection(
        tables=[
            EmbeddingBagConfig(
                name=f"t_f{i}",
                embedding_dim=4 * (i + 1),
                num_embeddings=10 + i,
                feature_names=[f"f{i}"],
                pooling=p,
            )
            for i, p in enumerate(pooling)
        ]
    )


def _features() -> KeyedJaggedTensor:
    """Another key order than the tables', one key no table reads, lists with repeats and
    an empty bag."""
    lengths = {"f2": [1, 1, 1], "extra": [1, 1, 1], "f0": [2, 0, 1], "f1": [3, 1, 2]}
    values = {"f2": [11, 0, 11], "extra": [5, 5, 5], "f0": [3, 3, 9], "f1": [1, 1, 4, 7, 0, 10]}
    keys = list(lengths)
    return KeyedJaggedTensor(
        keys=keys,
        values=torch.tensor([v for k in keys for v in values[k]]),
        lengths=torch.tensor([n for k in keys for n in lengths[k]]),
    )


@pytest.mark.parametrize("optimizer", ["sgd", "adagrad", "rowwise_adagrad"])
def test_a_step_pools_and_updates_as_torch_tables_do(optimizer):
    reference, features = _collection(), _features()
    fused = FusedTables(reference, optimizer, lr=0.1)
    model = torch.nn.Module()
    model.embedding_bags, model.head = reference, torch.nn.Linear(1, 1)
    torch_step = make_optimizers(model, TrainConfig(sparse_optimizer=optimizer, sparse_lr=0.1))[1]
    mix = torch.randn(3, 24)
    for _ in range(3):  # repeated steps: the optimizers' state must agree too
        expected, got = reference(features), fused(features)
        assert got.keys() == expected.keys()
        torch.testing.assert_close(got.values(), expected.values())
        torch_step.zero_grad()
        (expected.values() * mix).sum().backward()
        torch_step.step()
        (got.values() * mix).sum().backward()  # fused: the update happens here
    for name, bag in reference.embedding_bags.items():
        torch.testing.assert_close(fused.embedding_bags[name].weight, bag.weight)
    assert not torch.equal(
        reference.embedding_bags["t_f0"].weight, _collection().embedding_bags["t_f0"].weight
    )


def test_training_on_fused_tables_ends_where_torch_tables_do(monkeypatch):
    data = generate_synthetic(SyntheticConfig(rows=12_000, seed=1))
    train_part, valid, _ = data.split()
    config = TrainConfig(batch_size=256, max_steps=40, evals=2, seed=3)
    results, weights = [], []
    for fuse in (True, False):
        monkeypatch.setattr(FusedTables, "fits", staticmethod(lambda ebc, fuse=fuse: fuse))
        model = build_model(preset("dcnv2", data.schema), seed=0)
        results.append(train(model, train_part, valid, config=config))
        assert type(model.embedding_bags) is EmbeddingBagCollection  # put back after training
        weights.append(model.state_dict())
    assert [r.status for r in results] == ["complete", "complete"]
    assert results[0].validation["ne"] == pytest.approx(results[1].validation["ne"], abs=1e-4)
    assert weights[0].keys() == weights[1].keys()
    for key, value in weights[0].items():  # float sums in another order, over 40 steps
        assert (value - weights[1][key]).norm() <= 1e-3 * weights[1][key].norm() + 1e-6, key


def test_tables_the_kernel_cannot_take_train_as_torch_tables():
    data = generate_synthetic(SyntheticConfig(rows=20_000, seed=2))
    model = build_model(preset("logistic_regression", data.schema), seed=0)  # 1-wide tables
    assert not FusedTables.fits(model.embedding_bags)
    assert FusedTables.fits(build_model(preset("dlrm", data.schema), seed=0).embedding_bags)
    train_part, valid, _ = data.split()
    result = train(model, train_part, valid, config=TrainConfig(batch_size=256, max_steps=50))
    assert result.status == "complete", result.failure_reason
