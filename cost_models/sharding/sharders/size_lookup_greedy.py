"""DreamShard's size-lookup-greedy baseline: balance dim x pooling factor x log10(rows)."""

import math

from cost_models.sharding.sharders.base import GreedySharder
from cost_models.sharding.tables import TableSpec


class SizeLookupGreedy(GreedySharder):
    name = "size_lookup_greedy"

    @staticmethod
    def weight(table: TableSpec) -> float:
        # log10(1) = 0 would make a one-row table free; count it as one decade at least.
        rows_term = max(math.log10(table.num_embeddings), 1.0)
        return table.embedding_dim * table.pooling_factor * rows_term
