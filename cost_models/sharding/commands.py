"""`ranknas shard ...`: plan, train and compare embedding sharding.

`register(commands)` adds the `shard` command to the CLI's subparsers; each handler takes
the parsed arguments, prints, and returns an exit code. User mistakes raise RanknasError.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np

from cost_models.sharding.cli import QUICK_MODEL
from cost_models.sharding.cost_net import CostNet, load_cost_net
from cost_models.sharding.evaluate import measure_plans
from cost_models.sharding.measure import Measurer
from cost_models.sharding.measured import measured_plan_ms
from cost_models.sharding.methods import DEFAULT_MODEL, FALLBACK, model_to_use
from cost_models.sharding.plan import Plan
from cost_models.sharding.sharders import METHODS, make_sharder
from cost_models.sharding.sharders.base import check_capacity, counted
from cost_models.sharding.step import topology as step_topology
from cost_models.sharding.tables import TableSpec, load_tables, tables_from_architecture
from cost_models.sharding.topology import GIB, Topology
from cost_models.sharding.training import ShardTrainConfig, quick_config, train_sharder
from search_space.errors import RanknasError
from search_space.files import read_data_file
from search_space.names import shown
from search_space.preset_names import ARCHITECTURE_SUFFIXES


def _workload(args: argparse.Namespace) -> tuple[list[TableSpec], Topology]:
    memory_gb = args.memory_gb or Topology(1).memory_bytes / GIB  # torchrec's HBM_CAP
    if args.hosts is not None and args.devices % args.hosts:
        raise RanknasError(f"--hosts {args.hosts} must divide --devices {args.devices} evenly "
                           "(the devices each host holds, times the hosts)")  # fmt: skip
    topology = replace(step_topology(args.devices, args.hosts), memory_bytes=int(memory_gb * GIB))
    return _tables(args.tables, args.schema), topology


def _tables(source: str, schema: str | None) -> list[TableSpec]:
    """A table file, or the embedding tables of a preset / architecture file."""
    from search_space.files import looked_for
    from search_space.presets import PRESETS, load_architecture
    from search_space.schema import load_schema

    path = Path(source)
    if source not in PRESETS and not path.exists():
        table_file = path.suffix in (".yaml", ".yml", ".json")
        kind = "no such file" if table_file else "neither a preset nor a file"
        raise RanknasError(f"{source}: {kind}{looked_for(path)}; give a table file (YAML/JSON "
                           f"`tables: [...]`) or a preset ({', '.join(PRESETS)})")  # fmt: skip
    if _is_architecture(source):
        return tables_from_architecture(load_architecture(source, load_schema(schema)))
    return load_tables(path)


def _is_architecture(source: str) -> bool:
    from search_space.presets import PRESETS

    path = Path(source)
    return source in PRESETS or (path.suffix.lower() in ARCHITECTURE_SUFFIXES and _has_blocks(path))


def _labeller(source: str) -> Callable[[str], str]:
    """How a table is named to a person: an architecture's tables by their columns' names
    (`t_user.id`, not the escaped module name); a table file's as the file names them."""
    return shown if _is_architecture(source) else str


def _has_blocks(path: Path) -> bool:
    try:
        data = read_data_file(path, "the architecture")
    except RanknasError:
        return False  # load_tables reports what is wrong with it
    return isinstance(data, dict) and "blocks" in data


def _cost_net(model: Path) -> CostNet | None:
    """The trained cost model, if `shard train` saved one there."""
    return load_cost_net(model) if (model / "cost_net.json").exists() else None


# ---------------------------------------------------------------------- plan


def _use_packaged_model(
    args: argparse.Namespace, tables: Sequence[TableSpec] | None = None
) -> None:
    """`args.model` as `model_to_use` resolves it, said where it is the shipped one; with
    `tables`, what its predictions for them are worth (`model_caveats`)."""
    args.model, note = model_to_use(args.model, "--model")
    if note:
        print(note, file=sys.stderr)
    for caveat in model_caveats(Path(args.model), tables or []):
        print(f"warning: {caveat}", file=sys.stderr)


def model_caveats(folder: Path, tables: Sequence[TableSpec]) -> list[str]:
    """What the cost model in `folder` (its `report.json`) cannot be trusted with: ranking
    held-out plans no better than chance (a `--quick` model), or `tables` outside the rows
    and dims it was trained on (200 tables of 10-209 rows at dim 4 measured 9x their
    prediction)."""
    path = folder / "report.json"
    if not path.exists():
        return []
    report, said = json.loads(path.read_text()), []
    tau = report.get("errors", {}).get("cost_model", {}).get("kendall_tau")
    if tau is not None and tau <= 0:
        said.append(f"the cost model in {folder} ranks held-out plans no better than chance "
                    f"(Kendall tau {tau:.2f}): its predictions, and the rl plans made with them, "
                    "are no better than a guess; train it longer (without --quick)")  # fmt: skip
    pool = report.get("config", {}).get("pool")
    if pool:
        rows, dims = (pool["min_rows"], pool["max_rows"]), (min(pool["dims"]), max(pool["dims"]))
        # a few rows fewer than its smallest tables cost the same (in cache either way)
        outside = [t for t in tables if not rows[0] / 10 <= t.num_embeddings <= rows[1]
                   or not dims[0] <= t.embedding_dim <= dims[1]]  # fmt: skip
        if outside:
            e = outside[0]
            lie = "lies" if len(outside) == 1 else "lie"
            said.append(f"{counted(len(outside), 'table')} of {len(tables)} {lie} outside what the "
                        f"cost model was trained on (rows {rows[0]:,}-{rows[1]:,}, dims "
                        f"{dims[0]}-{dims[1]}), e.g. {e.name} ({e.num_embeddings:,} rows, dim "
                        f"{e.embedding_dim}): its predictions for them are extrapolations; "
                        "`ranknas shard compare` measures the plans")  # fmt: skip
    return said


def cmd_plan(args: argparse.Namespace) -> int:
    tables, topology = _workload(args)
    _use_packaged_model(args, tables)
    method = args.method
    if args.measure and method != "rl":
        raise RanknasError(f"--measure times the rl sharder's candidate plans: drop it or use "
                           f"--method rl (not {method})")  # fmt: skip
    if method == "rl" and not (Path(args.model) / "policy.json").exists():
        print(f"no trained RL policy in {args.model}: planned with {FALLBACK} instead (`ranknas "
              f"shard train --out {args.model}` trains one)", file=sys.stderr)  # fmt: skip
        method = FALLBACK
    sharder = make_sharder(method, model_dir=args.model)
    measurer = Measurer() if args.measure and method == "rl" else None
    if measurer is not None:
        sharder.measurer = measurer
    start = time.perf_counter()
    plan = sharder.plan(tables, topology)
    seconds = time.perf_counter() - start
    net = _cost_net(args.model)
    predicted = net.plan_costs(tables, plan, topology) if net is not None else None
    measured = None
    if measurer is not None:  # the timings the plan was chosen by (cached: no new runs)
        measured = measured_plan_ms(plan, tables, topology, measurer)
    if args.json:
        record = _plan_record(plan, predicted, seconds)
        if measured is not None:
            record |= {"measured_ms": measured, "measured_max_ms": max(measured)}
        print(json.dumps(record, indent=2))
        return 0
    label = _labeller(args.tables)
    print(f"{plan.method}: {counted(len(tables), 'table')} on "
          f"{counted(plan.num_devices, 'device')} in {seconds:.3f} s")  # fmt: skip
    if plan.splits:
        cuts = [f"{label(name)} into {parts}" for name, parts in plan.splits.items()]
        more = f" and {len(cuts) - 10} more (--json lists them)" if len(cuts) > 10 else ""
        print(f"column-wise cuts (shards named <table>/cw<j>): {', '.join(cuts[:10])}{more}")
    cut_over: dict[tuple[int, ...], list[str]] = {}  # tables by the ranks they are cut over
    for name, ranks in plan.row_wise.items():
        cut_over.setdefault(tuple(ranks), []).append(label(name))
    for ranks, names in cut_over.items():
        kind = "row-wise" if len(ranks) == plan.num_devices else "table-row-wise"
        more = f" and {len(names) - 10} more" if len(names) > 10 else ""
        print(f"{kind}: {', '.join(names[:10])}{more} cut by rows over ranks "
              f"{_spans(ranks)} (<table>/rw<j>)")  # fmt: skip
    if predicted is None:
        print(f"predicted cost: no cost model in {args.model} (run `ranknas shard train`)")
    else:
        print(f"predicted max-device cost: {predicted.sum(1).max():.3f} ms per step")
    if measured is not None:
        print(f"measured max-device cost on this machine ({measurer.device}): "
              f"{max(measured):.3f} ms per step (kernel + analytic communication)")  # fmt: skip
    _print_devices(plan, tables, topology, predicted, label)
    _warn_full(plan, topology)
    return 0


def _spans(ranks: Sequence[int]) -> str:
    """Ranks as runs: "0-7, 16-23" (128 of them were listed one by one)."""
    runs: list[list[int]] = []
    for rank in sorted(ranks):
        if runs and rank == runs[-1][1] + 1:
            runs[-1][1] = rank
        else:
            runs.append([rank, rank])
    return ", ".join(str(a) if a == b else f"{a}-{b}" for a, b in runs)


FULL = 0.9  # of a device's memory: a GPU also needs room for buffers and optimizer state


def _warn_full(plan: Plan, topology: Topology) -> None:
    """Name the devices a plan fills past `FULL` (torchrec's planner keeps 15% back for
    what the tables' weights do not count; the other sharders fill devices to 100%)."""
    full = [r for r, used in enumerate(plan.memory_bytes) if used > FULL * topology.memory_bytes]
    if full:
        ranks = ", ".join(map(str, full[:8])) + (" ..." if len(full) > 8 else "")
        print(f"warning: rank(s) {ranks} above {FULL:.0%} of {topology.memory_bytes / GIB:.2f} "
              "GiB: a GPU also needs room for the optimizer's state, buffers and activations; "
              "give --memory-gb as what a device has free for the tables",
              file=sys.stderr)  # fmt: skip


def _plan_record(plan: Plan, predicted: np.ndarray | None, seconds: float) -> dict[str, Any]:
    record = plan.to_dict() | {"planning_s": round(seconds, 4)}
    if predicted is not None:
        record["predicted_ms"] = [
            dict(zip(("forward", "backward", "comm"), map(float, row), strict=True))
            for row in predicted
        ]
        record["predicted_max_ms"] = float(predicted.sum(1).max())
    return record


def _print_devices(
    plan: Plan,
    tables: Sequence[TableSpec],
    topology: Topology,
    predicted: np.ndarray | None,
    label: Callable[[str], str],
) -> None:
    header = ["rank", "tables", "memory GiB", "of cap", "predicted ms (fwd+bwd+comm)", "names"]
    rows = []
    for rank, device_tables in enumerate(plan.device_tables(tables)):
        memory = plan.memory_bytes[rank]
        cost = (
            "-"
            if predicted is None
            else "{:.3f} ({:.3f}+{:.3f}+{:.3f})".format(predicted[rank].sum(), *predicted[rank])
        )
        names = ", ".join(label(t.name) for t in device_tables[:6])
        names += f" +{len(device_tables) - 6}" if len(device_tables) > 6 else ""
        share = f"{memory / topology.memory_bytes:.0%}"
        rows.append([str(rank), str(len(device_tables)), f"{memory / GIB:.3f}", share, cost, names])
    _print_table(header, rows)


def _print_table(header: list[str], rows: list[list[str]]) -> None:
    widths = [max(len(r[i]) for r in [header, *rows]) for i in range(len(header))]
    for row in [header, *rows]:
        print("  ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=True)).rstrip())


# ---------------------------------------------------------------------- compare


def cmd_compare(args: argparse.Namespace) -> int:
    tables, topology = _workload(args)
    # in all: a table larger than a device is a sharder's own "no plan" (rl cuts it by rows)
    check_capacity(tables, topology, cut=True)
    _use_packaged_model(args, tables)
    net = _cost_net(args.model)
    measurer = Measurer(cache_dir=_cache_folder(args.cache))
    plans, records = {}, {}
    for method in (m for m in METHODS if m != "rl" or net is not None):
        start = time.perf_counter()
        try:
            plans[method] = make_sharder(method, model_dir=args.model).plan(tables, topology)
        except RanknasError as exc:  # e.g. torchrec's planner keeps more memory back
            records[method] = {"method": method, "error": f"no plan: {exc}"}
            continue
        records[method] = _plan_record(plans[method], None, time.perf_counter() - start)
    if not plans:  # nothing to compare: the first sharder's reason (they mostly share it)
        first = next(iter(records.values()))
        raise RanknasError(f"no sharder could place these tables; {first['method']}: "
                           f"{first['error'].removeprefix('no plan: ')}")  # fmt: skip
    for method, costs in measure_plans(plans, tables, measurer, topology).items():
        measured = costs.sum(1)
        predicted = None if net is None else net.plan_costs(tables, plans[method], topology)
        records[method] |= {
            "measured_ms": measured.tolist(),
            "measured_max_ms": float(measured.max()),
            "measured_mean_ms": float(measured.mean()),
            "predicted_max_ms": None if predicted is None else float(predicted.sum(1).max()),
        }
    if args.json:
        output = {"kernel": measurer.kernel, "device": measurer.device}
        print(json.dumps(output | {"plans": list(records.values())}))
        return 0
    print(f"{counted(len(tables), 'table')} on {counted(topology.num_devices, 'device')}; "
          f"kernel: {measurer.kernel}")  # fmt: skip
    if net is None:
        print(f"(no trained model in {args.model}: rl left out; run `ranknas shard train`)")
    # every timing from the cache: the same numbers as last time, to the last digit
    replayed = args.cache if measurer.timed == 0 else None
    _print_comparison(list(records.values()), replayed)
    return 0


def _print_comparison(records: list[dict[str, Any]], replayed: Path | None = None) -> None:
    header = ["method", "measured max ms", "mean ms", "predicted max ms", "plan s", "max GiB"]
    rows, errors = [], {}
    for r in records:
        if "error" in r:  # below the table (a sentence in a column widened every row), once
            rows.append([r["method"], "no plan (below)", "", "", "", ""])
            errors.setdefault(r["error"], []).append(r["method"])
            continue
        predicted = r["predicted_max_ms"]
        rows.append(
            [
                r["method"],
                f"{r['measured_max_ms']:.3f}",
                f"{r['measured_mean_ms']:.3f}",
                "-" if predicted is None else f"{predicted:.3f}",
                f"{r['planning_s']:.3f}",
                f"{max(r['memory_bytes']) / GIB:.3f}",
            ]
        )
    _print_table(header, rows)
    for error, methods in errors.items():
        print(f"{', '.join(methods)}: {error}")
    if line := _compared(records, replayed):
        print(line)


def _compared(records: list[dict[str, Any]], replayed: Path | None = None) -> str | None:
    """Which plan measured lowest, and rl against the best of the others: the table alone
    said neither. `replayed`: the cache every timing came from."""
    timed = {r["method"]: r["measured_max_ms"] for r in records if "error" not in r}
    if len(timed) < 2:
        return None
    best = min(timed, key=timed.get)
    line = f"lowest measured max: {best} ({timed[best]:.3f} ms)"
    others = {m: ms for m, ms in timed.items() if m != "rl"}
    if "rl" in timed and others:
        rival = min(others, key=others.get)
        gap = timed["rl"] / others[rival] - 1
        line += (f"; rl {abs(gap):.1%} {'below' if gap < 0 else 'above'} the best other "
                 f"({rival})")  # fmt: skip
    if replayed is not None:
        return line + (f"; every timing replayed from the cache ({replayed}), as last "
                       "measured: delete it to time them again")  # fmt: skip
    return line + ("; timings move by a few percent from run to run" if "rl" in timed else "")


# ---------------------------------------------------------------------- train


def cmd_train(args: argparse.Namespace) -> int:
    config = quick_config(args.seed) if args.quick else ShardTrainConfig(seed=args.seed)
    if args.rounds is not None or args.iterations is not None:
        config = _override(config, args.rounds, args.iterations)
    out = Path(args.out or (QUICK_MODEL if args.quick else DEFAULT_MODEL))
    made = not out.exists()
    replaced = _check_model_folder(out)  # before minutes of measuring and training
    try:
        measurer = Measurer(config.measure, cache_dir=_cache_folder(args.cache))
        print(f"training on {measurer.device} with {measurer.kernel}")
        trained = train_sharder(config, measurer)
    except BaseException:  # an empty folder would be planned with as a model-less one
        if made:
            out.rmdir()
        raise
    trained.save(out)
    if replaced:
        print(f"replaced the model {out} held before")
    errors = trained.report["errors"]
    for name in ("cost_model", "torchrec", "torchrec_calibrated"):
        e = errors[name]
        print(f"held-out {name}: MAPE {e['mape']:.1f}%, Kendall tau {e['kendall_tau']:.3f}")
    use = "" if out == DEFAULT_MODEL else f"; plan with it: ranknas shard plan ... --model {out}"
    print(f"saved the cost model and policy in {out} ({trained.report['seconds']} s){use}")
    if (tau := errors["cost_model"]["kendall_tau"]) <= 0:
        print(f"warning: its cost model ranks held-out plans no better than chance (Kendall "
              f"tau {tau:.2f}): its plans are no better than a guess; train it longer "
              "(without --quick, or with more --rounds) before planning with it",
              file=sys.stderr)  # fmt: skip
    return 0


def _override(
    config: ShardTrainConfig, rounds: int | None, iterations: int | None
) -> ShardTrainConfig:
    rl = replace(config.rl, iterations=iterations or config.rl.iterations)
    return replace(config, rounds=rounds or config.rounds, rl=rl)


MODEL_FILES = frozenset(
    {"cost_net.json", "cost_net.safetensors", "policy.json", "policy.safetensors", "report.json"}
)  # what `shard train` saves


def _check_model_folder(out: Path) -> bool:
    """`shard train --out`'s folder, made where missing, checked before any work (a path
    it could not write failed after minutes of training): empty, or an earlier model's,
    which it replaces (True); a folder of other files is refused (they were written over)."""
    _check_folder(out, "--out")
    held = {p.name for p in out.iterdir() if not p.name.startswith(".")}  # .gitkeep: fine
    weights = {"cost_net.safetensors", "policy.safetensors"}  # a model's, saved in part or whole
    if held and (held - MODEL_FILES or not held & weights):
        raise RanknasError(f"--out {out}: holds files that are not a sharding model's "
                           f"({', '.join(sorted(held - MODEL_FILES or held)[:5])}); give a new "
                           "or empty folder")  # fmt: skip
    return bool(held)


def _cache_folder(cache: Path) -> Path:
    """`--cache`, made where missing; a file there or an unwritable path said at once."""
    _check_folder(Path(cache), "--cache")
    return cache


def _check_folder(folder: Path, flag: str) -> None:
    """`folder` made where missing, and writable; a clear error otherwise."""
    blocking = next((p for p in (folder, *folder.parents) if p.exists() and not p.is_dir()), None)
    if blocking is not None:
        raise RanknasError(f"{flag} {folder}: {blocking} is a file, not a folder; choose "
                           "another path")  # fmt: skip
    try:
        folder.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryFile(dir=folder):
            pass
    except OSError as exc:
        raise RanknasError(f"{flag} {folder}: cannot write there ({exc.strerror}); choose a "
                           "writable path") from None  # fmt: skip


def _check_writable(out: Path) -> None:
    """`--out`'s folder made where missing; a clear error where the file cannot be written."""
    if out.is_dir():
        raise RanknasError(f"--out {out}: a directory; give a file name, e.g. {out / 'links.json'}")
    _check_folder(out.parent, "--out")


def cmd_links(args: argparse.Namespace) -> int:
    from cost_models.sharding.links import measure_links, measured_topology
    from trainers.sharded import measure_runtime_ms

    if args.processes < 2:
        raise RanknasError(
            f"--processes: at least 2 to measure links between, got {args.processes}"
        )
    cores = os.cpu_count() or 1  # as `ranknas search --workers` splits them
    if args.processes > cores:  # 64 on 2 cores measured the machine's load, and took it
        raise RanknasError(f"--processes {args.processes}: this machine runs {cores} at once "
                           "(its cores); more would time their sharing of the cores, not "
                           f"the links: give at most {cores}")  # fmt: skip
    _check_writable(args.out)  # before a minute of measuring, not after
    links = measure_links(args.processes)
    links |= measure_runtime_ms(measured_topology(links), args.batch_size)
    args.out.write_text(json.dumps(links, indent=2) + "\n")
    print(f"{args.out}: all-to-all {links['all_to_all_latency_ms']:.3f} ms latency, "
          f"{links['all_to_all_bytes_per_ms'] / 1e6:.2f} GB/s; all-reduce "
          f"{links['all_reduce_latency_ms']:.3f} ms, {links['all_reduce_bytes_per_ms'] / 1e6:.2f} "
          f"GB/s, between {args.processes} processes; the sharded runtime's own cost "
          f"{links['runtime_ms']:.2f} ms a step at {args.batch_size} rows a process, the "
          f"dense part x{links['dense_factor']:.2f} beside it, "
          f"{links['ms_per_pooled_mb']:.2f} ms per MB of pooled embeddings")  # fmt: skip
    return 0
