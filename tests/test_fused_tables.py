"""Tables trained by fbgemm's fused kernel compute and learn what torch's tables do."""

import pytest
import torch
from torchrec.modules.embedding_configs import EmbeddingBagConfig, PoolingType
from torchrec.modules.embedding_modules import EmbeddingBagCollection
from torchrec.sparse.jagged_tensor import KeyedJaggedTensor

from helpers import check_tables_step_like_torch, check_training_ends_alike
from search_space.builder import build_model
from search_space.presets import preset
from trainers.data import SyntheticConfig, generate_synthetic
from trainers.fused_tables import FusedTables
from trainers.trainer import TrainConfig, train


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
    reference = _collection()
    check_tables_step_like_torch(reference, FusedTables(reference, optimizer, lr=0.1),
                                 optimizer, _features())  # fmt: skip
    assert not torch.equal(
        reference.embedding_bags["t_f0"].weight, _collection().embedding_bags["t_f0"].weight
    )


def test_training_on_fused_tables_ends_where_torch_tables_do(monkeypatch):
    data = generate_synthetic(SyntheticConfig(rows=12_000, seed=1))

    def train_both(way, model, train_part, valid, config):
        fuse = way == 0
        monkeypatch.setattr(FusedTables, "fits", staticmethod(lambda ebc: fuse))
        return train(model, train_part, valid, config=config)

    check_training_ends_alike(lambda: build_model(preset("dcnv2", data.schema), seed=0), data,
                              train_both)  # fmt: skip


def test_tables_the_kernel_cannot_take_train_as_torch_tables():
    data = generate_synthetic(SyntheticConfig(rows=20_000, seed=2))
    model = build_model(preset("logistic_regression", data.schema), seed=0)  # 1-wide tables
    assert not FusedTables.fits(model.embedding_bags)
    assert FusedTables.fits(build_model(preset("dlrm", data.schema), seed=0).embedding_bags)
    train_part, valid, _ = data.split()
    result = train(model, train_part, valid, config=TrainConfig(batch_size=256, max_steps=50))
    assert result.status == "complete", result.failure_reason
