"""Measured plan costs, and how well the cost model and torchrec's estimator predict them."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import replace

import numpy as np

from cost_models.sharding.cost_net import CostNet, CostSample, errors, predict_kernel_ms
from cost_models.sharding.measure import Measurer, check_host_memory
from cost_models.sharding.plan import Plan
from cost_models.sharding.tables import TableSpec
from cost_models.sharding.topology import Topology, traffic_megabytes
from cost_models.sharding.torchrec_adapter import analytic_compute_ms


def plan_samples(plan: Plan, tables: Sequence[TableSpec], measurer: Measurer) -> list[CostSample]:
    """One measured sample per non-empty device of `plan`."""
    sets = [tuple(ts) for ts in plan.device_tables(tables) if ts]
    return [CostSample(ts, t) for ts, t in zip(sets, measurer.measure_many(sets), strict=True)]


def analytic_comm_ms(
    plan: Plan, tables: Sequence[TableSpec], topology: Topology, batch_size: int
) -> np.ndarray:
    """Each device's communication ms per step, computed from tensor sizes and the
    topology's links (`topology.traffic_megabytes`, `Topology.comm_ms`); 0 where empty."""
    groups = plan.host_row_groups()
    return np.asarray(
        [
            topology.comm_ms(*traffic_megabytes(ts, groups, batch_size)) if ts else 0.0
            for ts in plan.device_tables(tables)
        ]
    )


def measure_plans(
    plans: Mapping[str, Plan],
    tables: Sequence[TableSpec],
    measurer: Measurer,
    topology: Topology,
    recheck: int = 4,
    samples: int = 3,
    seed: int = 0,
) -> dict[str, np.ndarray]:
    """`[num_devices, 3]` ms per device of each plan: measured forward and backward, and
    communication computed from tensor sizes.

    On a shared machine the load drifts, so plans are not timed one after the other: every
    device set of every plan is timed once in one shuffled pass, then the `recheck` costliest
    devices of each plan again, shuffled, until they have `samples` timings (the median
    counts). A drift then hits all plans alike, and one disturbed timing cannot decide a
    plan's max."""
    rng = np.random.default_rng(seed)
    device_sets = {name: plan.device_tables(tables) for name, plan in plans.items()}
    batch = measurer.config.batch_size
    comm = {name: analytic_comm_ms(plan, tables, topology, batch) for name, plan in plans.items()}
    todo = [ts for sets in device_sets.values() for ts in sets if ts]
    check_host_memory([ts for ts in todo if measurer.missing(ts, samples)])  # before any
    for sample in range(1, samples + 1):
        for i in rng.permutation(len(todo)):
            measurer.measure(todo[i], sample)
        todo = []
        for name, sets in device_sets.items():
            totals = comm[name] + [measurer.measure(ts).total_ms for ts in sets]
            todo += [sets[rank] for rank in np.argsort(totals)[::-1][:recheck]]
    measurer.save()

    def costs(name: str) -> np.ndarray:
        times = [measurer.measure(ts) for ts in device_sets[name]]
        rows = [(t.forward_ms, t.backward_ms, c) for t, c in zip(times, comm[name], strict=True)]
        return np.asarray(rows)

    return {name: costs(name) for name in plans}


def analytic_kernel_ms(samples: Sequence[CostSample], batch_size: int) -> np.ndarray:
    """torchrec's forward + backward compute estimate per device set (sum over its tables)."""
    unique = {t.signature: t for s in samples for t in s.tables}
    named = [replace(t, name=f"u{i}") for i, t in enumerate(unique.values())]
    per_table = analytic_compute_ms(named, batch_size)
    by_signature = {sig: per_table[n.name] for sig, n in zip(unique, named, strict=True)}
    return np.asarray([sum(by_signature[t.signature] for t in s.tables) for s in samples])


def calibration(samples: Sequence[CostSample], batch_size: int) -> tuple[float, float]:
    """(offset ms, scale) mapping torchrec's analytic ms to this machine's per-device ms: a
    line fitted to the measurements, weighted for relative error. The offset stands for the
    per-call overhead that a per-table estimate cannot see."""
    measured = np.asarray([s.time.total_ms for s in samples])
    scale, offset = np.polyfit(analytic_kernel_ms(samples, batch_size), measured, 1, w=1 / measured)
    return float(offset), float(scale)


def compare_estimators(
    net: CostNet,
    held_out: Sequence[CostSample],
    calibrated: tuple[float, float],
    batch_size: int,
) -> dict[str, dict[str, float]]:
    """MAPE and Kendall tau of per-device kernel ms on `held_out`: the cost model, torchrec's
    estimate as is, and torchrec's mapped by `calibrated` (see `calibration`)."""
    measured = [s.time.total_ms for s in held_out]
    analytic = analytic_kernel_ms(held_out, batch_size)
    return {
        "cost_model": errors(predict_kernel_ms(net, [s.tables for s in held_out]), measured),
        "torchrec": errors(analytic, measured),
        "torchrec_calibrated": errors(calibrated[0] + calibrated[1] * analytic, measured),
    }
