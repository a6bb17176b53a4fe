"""Sharders: one interface, `plan(tables, topology) -> Plan`, and one short file each.

Baselines from AutoShard and DreamShard (random, dim-, size-, lookup- and
size-lookup-greedy), torchrec's own planner (table-wise, and with column-wise cuts), and
the learned RL sharder.
"""

from __future__ import annotations

from pathlib import Path

from cost_models.sharding.methods import HEURISTICS, METHODS
from cost_models.sharding.sharders.base import Sharder
from cost_models.sharding.sharders.dim_greedy import DimGreedy
from cost_models.sharding.sharders.lookup_greedy import LookupGreedy
from cost_models.sharding.sharders.random_sharder import RandomSharder
from cost_models.sharding.sharders.rl import RLSharder
from cost_models.sharding.sharders.size_greedy import SizeGreedy
from cost_models.sharding.sharders.size_lookup_greedy import SizeLookupGreedy
from cost_models.sharding.sharders.torchrec_planner import TorchrecPlanner
from search_space.errors import RanknasError


def make_sharder(
    method: str, model_dir: str | Path | None = None, batch_size: int = 512, seed: int = 0
) -> Sharder:
    """The sharder called `method`; "rl" loads its policy and cost model from `model_dir`."""
    simple = {
        "dim_greedy": DimGreedy,
        "size_greedy": SizeGreedy,
        "lookup_greedy": LookupGreedy,
        "size_lookup_greedy": SizeLookupGreedy,
    }
    if method in simple:
        return simple[method]()
    if method == "random":
        return RandomSharder(seed)
    if method in ("torchrec", "torchrec_cw"):
        return TorchrecPlanner(batch_size, column_wise=method == "torchrec_cw")
    if method == "rl":
        if model_dir is None:
            raise RanknasError("method 'rl' needs a trained model: pass --model DIR")
        return RLSharder.load(model_dir)
    raise RanknasError(f"unknown sharding method {method!r}; choose one of {', '.join(METHODS)}")


__all__ = ["HEURISTICS", "METHODS", "Sharder", "make_sharder"]
