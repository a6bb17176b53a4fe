"""ranknas: cost models, in two parts.

- `cost_models.latency`: what an architecture costs in time on a device (measured, and a
  learned predictor), used by studies as an objective or a constraint.
- `cost_models.sharding`: how a model's embedding tables are placed on devices (table
  workloads, kernel measurements, a learned cost model, sharders from greedy heuristics to
  an RL policy, torchrec `ShardingPlan`s).

Neither imports `nas`; `nas` calls them.
"""

import argparse
import importlib
from collections.abc import Callable


def lazy_handler(module: str, name: str) -> Callable[[argparse.Namespace], int]:
    """A CLI handler that imports `module` (torch, torchrec) only when the command runs."""

    def run(args: argparse.Namespace) -> int:
        return getattr(importlib.import_module(module), name)(args)

    return run
