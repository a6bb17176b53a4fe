"""AutoShard's dim-greedy baseline: balance the sum of embedding dims."""

from cost_models.sharding.sharders.base import GreedySharder
from cost_models.sharding.tables import TableSpec


class DimGreedy(GreedySharder):
    name = "dim_greedy"

    @staticmethod
    def weight(table: TableSpec) -> float:
        return table.embedding_dim
