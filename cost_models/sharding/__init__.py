"""Embedding sharding, AutoShard / DreamShard style, plugged into torchrec.

- `tables`: `TableSpec` workloads (files, architectures, schemas, generated pools) and
  their 21 features; `topology`: devices, memory, bandwidth, communication cost.
- `measure`: forward + backward timings of a device's tables on the real kernel, cached.
- `cost_net`: the neural cost model; `evaluate`: measured plan costs and estimator errors.
- `sharders`: one interface, `plan(tables, topology) -> Plan`, one file per sharder
  (heuristics, torchrec's planner, the RL sharder); `policy` and `training`: the RL policy
  and DreamShard's measure / fit / train loop (`ShardTrainConfig`).
- `torchrec_adapter`: `ShardingPlan`s, planner inputs, torchrec's analytic estimates;
  `dmp_check`: runs a plan under DistributedModelParallel; `cli`: `ranknas shard ...`.
"""
