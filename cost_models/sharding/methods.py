"""The sharders' names (`sharders.make_sharder` builds them) and the largest world a plan
is made for, apart so the CLI parser and the study config have them without importing
torchrec."""

HEURISTICS = ("random", "dim_greedy", "size_greedy", "lookup_greedy", "size_lookup_greedy")
METHODS = (*HEURISTICS, "torchrec", "torchrec_cw", "rl")
# what `shard plan --method rl` uses without a trained policy: the best heuristic in
# BENCHMARKS.md
FALLBACK = "size_lookup_greedy"
# 2,048 hosts of 8. A plan holds a cost per device in each of its episodes: the rl sharder
# planned 16 tables on 16,384 devices in 42 s and 1 GB, on 65,536 in 157 s and 2.7 GB, and
# on 1,000,000 ran out of memory.
MAX_DEVICES = 16_384
