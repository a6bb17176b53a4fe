"""AutoShard's size-greedy baseline: balance the bytes each device holds."""

from cost_models.sharding.sharders.base import GreedySharder
from cost_models.sharding.tables import TableSpec


class SizeGreedy(GreedySharder):
    name = "size_greedy"

    @staticmethod
    def weight(table: TableSpec) -> float:
        return table.size_bytes
