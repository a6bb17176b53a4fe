"""The sharders' names (`sharders.make_sharder` builds them), apart so the CLI parser can
list them without importing torchrec."""

HEURISTICS = ("random", "dim_greedy", "size_greedy", "lookup_greedy", "size_lookup_greedy")
METHODS = (*HEURISTICS, "torchrec", "torchrec_cw", "rl")
# what `shard plan --method rl` uses without a trained policy: the best heuristic in
# BENCHMARKS.md
FALLBACK = "size_lookup_greedy"
