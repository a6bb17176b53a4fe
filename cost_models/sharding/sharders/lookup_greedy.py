"""AutoShard's lookup-greedy baseline: balance dim x pooling factor (values read per example)."""

from cost_models.sharding.sharders.base import GreedySharder
from cost_models.sharding.tables import TableSpec


class LookupGreedy(GreedySharder):
    name = "lookup_greedy"

    @staticmethod
    def weight(table: TableSpec) -> float:
        return table.embedding_dim * table.pooling_factor
