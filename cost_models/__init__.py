"""ranknas: cost models, in two parts.

- `cost_models.latency`: what an architecture costs in time on a device (measured, and a
  learned predictor), used by studies as an objective or a constraint.
- `cost_models.sharding`: how a model's embedding tables are placed on devices (table
  workloads, kernel measurements, a learned cost model, sharders from greedy heuristics to
  an RL policy, torchrec `ShardingPlan`s).

Neither imports `nas`; `nas` calls them.
"""
