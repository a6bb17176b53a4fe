"""Row cuts on hosts of devices: the hierarchical communication estimate at work.

    .venv/bin/python bench/bench_shard_hosts.py [--families one_dominant,many_heavy]

ANALYTIC communication only: nothing here is timed. Each device's cost is the cost
model's predicted compute (forward + backward, the model `bench_sharding.py` trains into
--model) plus the analytic communication of `cost_models.sharding.topology`
(bytes / bandwidth + latency; intra-host and inter-host links, DESIGN.md "Sharding").
Pools: `tables.pool_family` (seed --seed); 16 devices, each with a share of the balanced
memory (after the family's name) too small for the largest tables: they are cut by rows. The RL
sharder places them three ways: `host` (table-row-wise over one host's 8 devices, the
partial sums reduced inside the host), `world` (row-wise over all 16 devices: every
partial sum crosses hosts) and `auto` (its default: whichever its estimate rates lower),
and places the other tables around them. Topologies: 2 hosts x 8 devices with torchrec's
link constants (600 GB/s inside a host, 12.5 GB/s across), with a slow link across
hosts (1 GB/s, inside 50 GB/s: about how these CPU timings relate to a GPU's compute
and network), with the same 50 GB/s both ways, and one host of 16 devices. Prints the
plan's max-device cost (ms per step; compute + comm of the costliest device) and the
largest communication of any device.
"""

from __future__ import annotations

import argparse
from dataclasses import replace
from pathlib import Path

from bench_sharding import load_or_train, markdown

from cost_models.sharding.measure import Measurer
from cost_models.sharding.sharders import RLSharder
from cost_models.sharding.tables import pool_family
from cost_models.sharding.topology import Topology
from search_space.errors import RanknasError

GB_PER_S = 1e9 / 1000  # bytes per ms
DEVICES = 16
MODES = ("host", "world", "auto")


def topologies(memory: int) -> dict[str, Topology]:
    hosts = Topology(DEVICES, memory_bytes=memory, local_world_size=8)
    return {
        "2 hosts x 8, torchrec links": hosts,
        "2 hosts x 8, slow link across": replace(
            hosts, intra_host_bw=50 * GB_PER_S, inter_host_bw=1 * GB_PER_S
        ),
        "2 hosts x 8, same links": replace(
            hosts, intra_host_bw=50 * GB_PER_S, inter_host_bw=50 * GB_PER_S
        ),
        "1 host x 16": Topology(DEVICES, memory_bytes=memory, local_world_size=DEVICES),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--model", type=Path, default=Path("runs/sharding/model"))
    parser.add_argument("--cache", type=Path, default=Path("runs/sharding/measurements"))
    parser.add_argument(
        "--families", default="one_dominant:2.0", help="FAMILY:MEMORY_SHARE (x balanced),..."
    )
    parser.add_argument("--tables", type=int, default=120)
    parser.add_argument("--seed", type=int, default=100)
    args = parser.parse_args()
    trained, _ = load_or_train(args.model, Measurer(cache_dir=args.cache))
    net = trained.cost_net
    sharders = {m: RLSharder(trained.policy, net, row_mode=m) for m in MODES}
    rows = []
    for entry in args.families.split(","):
        family, share = entry.split(":")
        tables = pool_family(family, args.tables, args.seed)
        memory = int(float(share) * sum(t.size_bytes for t in tables) / DEVICES)
        for name, topology in topologies(memory).items():
            cells, chose = [], "no plan"
            for mode in MODES:
                try:
                    plan = sharders[mode].plan(tables, topology)
                except RanknasError:  # what is left of each device after the row shards
                    cells.append("no plan")
                    continue
                costs = net.plan_costs(tables, plan, topology)
                cells.append(f"{costs.sum(1).max():.3f} ({costs[:, 2].max():.3f})")
                hosts = sum(len(r) < DEVICES for r in plan.row_wise.values())
                chose = f"{hosts} of {len(plan.row_wise)} in a host"
            rows.append([f"{family} ({share}x memory)", name, *cells, chose])
    header = ["pool", "topology", *(f"rl, {m}: max (max comm)" for m in MODES), "auto chose"]
    print(markdown(header, rows))


if __name__ == "__main__":
    main()
