"""Embedding tables trained by fbgemm's table-batched kernel on CPU, the optimizer fused into
its backward pass.

With torch's `nn.EmbeddingBag` tables a training step builds one sparse gradient per table,
coalesces it and steps Adagrad over it: 30-35% of a small model's CPU step. fbgemm's
table-batched embedding (TBE) looks all tables up in one call and applies exact Adagrad,
SGD or row-wise Adagrad to the rows a batch touched during backward, with the same
arithmetic (BENCHMARKS.md, "Fused embedding tables"). `FusedTables` stands in for a model's
`EmbeddingBagCollection` while `trainers.trainer.train` runs: same inputs, outputs and
state-dict keys (its weights are views of the TBE's), then `write_back` returns the weights.
"""

from __future__ import annotations

import torch
from fbgemm_gpu.split_embedding_configs import EmbOptimType
from fbgemm_gpu.split_table_batched_embeddings_ops_common import BoundsCheckMode, PoolingMode
from fbgemm_gpu.split_table_batched_embeddings_ops_training import (
    ComputeDevice,
    EmbeddingLocation,
    SplitTableBatchedEmbeddingBagsCodegen,
)
from torch import nn
from torchrec.modules.embedding_configs import PoolingType
from torchrec.modules.embedding_modules import EmbeddingBagCollection
from torchrec.sparse.jagged_tensor import KeyedJaggedTensor, KeyedTensor

# The trainer's sparse optimizers, as fbgemm's fused ones; eps as torch's and torchrec's.
OPTIMIZERS = {
    "adagrad": EmbOptimType.EXACT_ADAGRAD,
    "sgd": EmbOptimType.EXACT_SGD,
    "rowwise_adagrad": EmbOptimType.EXACT_ROWWISE_ADAGRAD,
}
EPS = 1e-10


class FusedTables(nn.Module):
    """The tables of `ebc` in one TBE that updates them in its backward with `optimizer`
    (a key of `OPTIMIZERS`) at `lr`. Mean-pooled tables are summed by the kernel and divided
    by their bags' lengths here (the gradient then reaches each id divided alike)."""

    def __init__(self, ebc: EmbeddingBagCollection, optimizer: str, lr: float) -> None:
        super().__init__()
        configs = ebc.embedding_bag_configs()
        self.keys = [c.feature_names[0] for c in configs]  # ranknas: one feature per table
        self.dims = [c.embedding_dim for c in configs]
        mean = [c.pooling == PoolingType.MEAN for c in configs]
        dims = torch.tensor(self.dims)
        # Per output column: its feature, and whether that feature is mean-pooled.
        self._column_feature = torch.arange(len(configs)).repeat_interleave(dims)
        self._mean_columns = torch.tensor(mean).repeat_interleave(dims) if any(mean) else None
        # Not a submodule: its flat weights and optimizer state stay out of the state dict.
        self._tbe = [
            SplitTableBatchedEmbeddingBagsCodegen(
                [
                    (c.num_embeddings, c.embedding_dim, EmbeddingLocation.HOST, ComputeDevice.CPU)
                    for c in configs
                ],
                optimizer=OPTIMIZERS[optimizer],
                learning_rate=lr,
                eps=EPS,
                pooling_mode=PoolingMode.SUM,
                bounds_check_mode=BoundsCheckMode.FATAL,  # an id out of range is a bug
            )
        ]
        self.embedding_bags = nn.ModuleDict()
        for config, weight in zip(configs, self._tbe[0].split_embedding_weights(), strict=True):
            with torch.no_grad():
                weight.copy_(ebc.embedding_bags[config.name].weight)
            holder = nn.Module()
            holder.register_parameter("weight", nn.Parameter(weight, requires_grad=False))
            self.embedding_bags[config.name] = holder
        self._order: dict[tuple[str, ...], list[int]] = {}

    @staticmethod
    def fits(ebc: nn.Module) -> bool:
        """Whether `ebc` is a CPU EmbeddingBagCollection of one feature per table, whose
        widths the kernel takes (multiples of 4: not logistic regression's 1)."""
        return isinstance(ebc, EmbeddingBagCollection) and all(
            len(c.feature_names) == 1
            and c.pooling in (PoolingType.SUM, PoolingType.MEAN)
            and c.embedding_dim % 4 == 0
            for c in ebc.embedding_bag_configs()
        ) and all(p.device.type == "cpu" for p in ebc.parameters())  # fmt: skip

    def forward(self, features: KeyedJaggedTensor) -> KeyedTensor:
        keys = tuple(features.keys())
        if list(keys) != self.keys:  # another order, or more features than the model uses
            order = self._order.setdefault(keys, [keys.index(k) for k in self.keys])
            features = features.permute(order)
        pooled = self._tbe[0](features.values(), features.offsets())
        if self._mean_columns is not None:
            lengths = features.lengths().view(len(self.keys), -1).clamp_min(1).to(pooled.dtype)
            pooled = torch.where(
                self._mean_columns, pooled / lengths[self._column_feature].T, pooled
            )
        return KeyedTensor(keys=self.keys, length_per_key=self.dims, values=pooled)

    def write_back(self, ebc: EmbeddingBagCollection) -> None:
        """Copy the trained weights into `ebc`'s tables."""
        with torch.no_grad():
            for name, holder in self.embedding_bags.items():
                ebc.embedding_bags[name].weight.copy_(holder.weight)
