"""Trial training on a GPU: throughput, GPU memory and model FLOP utilization (MFU).

    .venv/bin/python bench/bench_gpu.py --device cpu --threads 2     # this machine's CPU
    python3 bench/bench_gpu.py --device cuda                         # a GPU, if there is one
    python3 bench/bench_gpu.py --suite study --out $OUT/study.json   # the lent GPU's window

On a lent machine whose image lacks torchrec, optuna and pydantic, `bench/gpu_wheels.sh`
(run here) writes the wheels to carry in `.whl/`; the script's header says how to install
them there.

`--suite study` is the prepared device script of issue 37 (about 7 minutes on an H100):
the eager step (one table per feature, host batches) against the CUDA-graph step (joint
tables, resident batches, the step replayed) side by side for dlrm, dcnv2 and wukong at
batch 512 and 4,096 and for the MLPerf shape at 16,384 (MFU); validation NE of both paths
over two seeds on the quickstart presets; and the quickstart study's search phase (20
trials around DCNv2, no baselines) run by `ranknas search --workers N` for N = 1, 8 and 4
on the one GPU: trials per hour and GPU busy time (nvidia-smi sampled every 200 ms).
Results are written to `--out` after every row, so a run cut short keeps what it measured.

What a study's trial costs on each device: `trainers.trainer.train` (the loop every trial,
baseline and `ranknas train` run, bf16 autocast on CUDA) on the synthetic data set, for
each preset at the shapes the studies use, plus one production-scale model (MLPerf's
DLRM-DCNv2 widths: embedding dim 128, bottom MLP 512-256-128, a 3-layer low-rank cross
network, top MLP 1024-1024-512-256) on Criteo's shape (13 dense, 26 categorical). Every
run is `--steps` steps at one batch size after an untimed warm-up run; the figure is the
median of `--repeats` runs. MFU = 3 x forward FLOPs per example (exact, from `analyze`)
x examples/s over the device's dense bf16 peak (`--peak-tflops`, 989 for an H100 SXM).
A few hundred steps leave most models short of the base rate: their NE is not the point
here and is not checked.
Prints Markdown and writes JSON to `--out`.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time
from pathlib import Path

import numpy as np
import torch

from search_space import builder
from search_space.architecture import Architecture, BlockSpec, EmbeddingConfig, analyze
from search_space.builder import build_model
from search_space.presets import preset
from trainers.data import SyntheticConfig, generate_synthetic
from trainers.trainer import TrainConfig, train

PRESETS = ("logistic_regression", "dlrm", "dcnv2", "deepfm", "dhen", "wukong")


def mlperf_dlrm_dcnv2() -> Architecture:
    """MLPerf's DLRM-DCNv2 widths (embedding dim 128) in ranknas's block spec."""
    blocks = (
        BlockSpec("bottom", "mlp", ("dense",), {"widths": [512, 256, 128]}),
        BlockSpec("cross", "cross", ("sparse", "bottom"), {"num_layers": 3, "low_rank": 512}),
        BlockSpec("top", "mlp", ("cross",), {"widths": [1024, 1024, 512, 256]}),
    )
    return Architecture(blocks=blocks, embedding=EmbeddingConfig(128), name="mlperf_dlrm_dcnv2")


def run_once(
    arch: Architecture,
    data,
    batch: int,
    steps: int,
    device: str,
    cuda_graph: bool = True,
    compiled: bool = False,
) -> dict:
    model = build_model(arch, seed=0)
    config = TrainConfig(
        batch_size=batch, max_steps=steps, evals=1, early_stopping_patience=0,
        restore_best=False, device=device, seed=0, cuda_graph=cuda_graph, compile=compiled,
    )  # fmt: skip
    if device.startswith("cuda"):
        torch.cuda.reset_peak_memory_stats()
    result = train(model, data, data.take(np.arange(2048)), config=config)
    if result.status != "complete" and not result.failure_reason.startswith("diverged"):
        raise RuntimeError(f"{arch.name} batch {batch}: {result.failure_reason}")
    return {"throughput": result.throughput, "peak_memory_bytes": result.peak_memory_bytes}


def measure(
    arch, data, batch, steps, repeats, device, peak_tflops, cuda_graph=True, compiled=False,
    cast_inputs=True,
) -> dict:  # fmt: skip
    """The median of `repeats` runs after a warm-up run (which also compiles, if
    `compiled`: later models of the same shape reuse the compiled code). `cast_inputs`
    False: the network's inputs stay fp32 under autocast, as before
    `builder.AUTOCAST_INPUTS`."""
    builder.AUTOCAST_INPUTS = cast_inputs
    try:
        run_once(arch, data, batch, max(5, steps // 10), device, cuda_graph, compiled)
        runs = [run_once(arch, data, batch, steps, device, cuda_graph, compiled)
                for _ in range(repeats)]  # fmt: skip
    finally:
        builder.AUTOCAST_INPUTS = True
    speeds = [r["throughput"] for r in runs]
    throughput = statistics.median(speeds)
    flops = analyze(arch).flops
    achieved = 3 * flops * throughput / 1e12
    return {
        "model": arch.name,
        "step": ("graph" if cuda_graph else "eager")
        + ("+compile" if compiled else "")
        + ("" if cast_inputs else "+fp32in"),
        "batch": batch,
        "examples_per_s": round(throughput),
        "spread": round((max(speeds) - min(speeds)) / 2),
        "mflops_per_example": round(flops / 1e6, 3),
        "train_tflops": round(achieved, 4),
        "mfu": round(achieved / peak_tflops, 5) if peak_tflops else None,
        "peak_memory_mib": round(max(r["peak_memory_bytes"] for r in runs) / 2**20, 1),
    }


STUDY_MODELS = ("dlrm", "dcnv2", "wukong")
# (CUDA graph, compiled, inputs cast to bf16); "-fp32in": the inputs left in fp32
WAYS = {"eager": (False, False, True), "graph": (True, False, True), "compile": (True, True, True),
        "graph-fp32in": (True, False, False), "compile-fp32in": (True, True, False)}  # fmt: skip


def step_rows(args, results: dict, save, small, criteo) -> None:
    """The step's ways (`--ways`: eager, graph, compile = graph with the dense part
    compiled) side by side: the presets at `args.batches`, then MLPerf's shape at its
    batch."""
    peak = args.peak_tflops if args.device.startswith("cuda") else 0.0
    models = [m for m in args.step_models.split(",") if m]  # "": the MLPerf shape alone
    cases = [(m, b) for b in map(int, args.batches.split(",")) for m in models]
    if args.mlperf_batch:
        cases.insert(len(models), ("mlperf_dlrm_dcnv2", args.mlperf_batch))
    for model, batch in cases:
        data = criteo if model == "mlperf_dlrm_dcnv2" else small
        arch = (mlperf_dlrm_dcnv2() if data is criteo else preset(model)).bind(data.schema)
        steps = args.steps if batch <= 512 else max(50, args.steps // 2)
        for way in args.ways.split(","):
            graph, compiled, cast = WAYS[way]
            row = measure(arch, data, batch, steps, args.repeats, args.device, peak, graph,
                          compiled, cast)  # fmt: skip
            results["steps"].append(row)
            save()
            mfu = f"{row['mfu']:.2%}" if row["mfu"] is not None else "-"
            print(f"| {model} | {batch} | {row['step']} | {row['examples_per_s']:,} "
                  f"(±{row['spread']:,}) | {mfu} | {row['peak_memory_mib']} |",
                  flush=True)  # fmt: skip


def ne_rows(args, results: dict, save) -> None:
    """Validation NE of the eager and the graph step on the quickstart data and recipe."""
    from nas.config import load_config
    from nas.protocol import trial_train_config

    study = load_config("examples/quickstart.yaml")
    train_part, valid, _ = generate_synthetic(SyntheticConfig(rows=study.data.rows)).split()
    for model in STUDY_MODELS:
        for seed in range(args.ne_seeds):
            row = {"model": model, "seed": seed}
            for graph in (False, True):
                config = trial_train_config(study, seed)
                config.device, config.cuda_graph = args.device, graph
                arch = preset(model).bind(train_part.schema)
                result = train(build_model(arch, seed=seed), train_part, valid, config=config)
                row["graph" if graph else "eager"] = {
                    "status": result.status, "val_ne": result.validation.get("ne"),
                    "examples_per_s": round(result.throughput), "steps": result.steps,
                }  # fmt: skip
            results["ne"].append(row)
            save()
            print(f"NE {model} seed {seed}: eager {row['eager']['val_ne']:.5f}, graph "
                  f"{row['graph']['val_ne']:.5f}", flush=True)  # fmt: skip


def forked_worker(device: str) -> str:
    """Whether a process forked the way `ranknas search --workers` forks its workers
    (`nas.launch._starter`) can compute on `device`: "ok", else its exit status."""
    from nas.launch import _starter, visible_gpus

    context, _ = _starter(visible_gpus() if device.startswith("cuda") else [])
    if context.get_start_method() != "forkserver":
        return "not forked (RANKNAS_WORKER_START=spawn, or MIG or no NVML count)"
    child = context.Process(target=_compute_on, args=(device,))
    child.start()
    child.join(120)
    if child.is_alive():
        child.kill()
        child.join()
    return "ok" if child.exitcode == 0 else f"failed (exit {child.exitcode})"


def _compute_on(device: str) -> None:
    import torch

    assert torch.ones(4, device=device).sum().item() == 4


def study_rows(args, results: dict, save) -> None:
    """The quickstart study's search phase with N workers on this machine's GPU(s)."""
    import subprocess
    import sys
    import tempfile

    import yaml

    base = yaml.safe_load(Path("examples/quickstart.yaml").read_text())
    results["forked_worker"] = forked_worker(args.device)
    print(f"a worker forked as the launcher forks them: {results['forked_worker']}", flush=True)
    if results["forked_worker"] != "ok" and args.device.startswith("cuda"):
        os.environ["RANKNAS_WORKER_START"] = "spawn"  # each worker starts afresh instead
    if args.mps:  # a failed start shows in the rows: their figures then match the runs without
        subprocess.run(["nvidia-cuda-mps-control", "-d"], check=False)
    for workers in map(int, args.workers.split(",")):
        scratch = Path(tempfile.mkdtemp(prefix=f"study{workers}-"))
        config = base | {
            "name": f"gpu-study-{workers}", "baselines": [], "best_baseline": {"seeds": 1},
            "search_space": {"type": "around", "base": "dcnv2"},
            "budget": base["budget"] | {"trials": args.study_trials},
            "storage": f"sqlite:///{scratch / 'studies.db'}", "output_dir": str(scratch / "out"),
            "mlflow": {"tracking_uri": None},
            "training": {k: v for k, v in base["training"].items() if k != "search"}
            | {"device": args.device},  # one recipe: the trials' speed, not their recipes
        }  # fmt: skip
        path = scratch / "study.yaml"
        path.write_text(yaml.safe_dump(config))
        sampler = _gpu_sampler(scratch / "smi.csv") if args.device.startswith("cuda") else None
        started, cpu_before = time.perf_counter(), _cpu_times()
        command = [sys.executable, "-m", "nas.cli", "search", str(path), "--workers",
                   str(workers)]  # fmt: skip
        env = dict(os.environ)
        if args.profile:  # every process of the study writes its cProfile here
            env["RANKNAS_PROFILE"] = str(scratch / "profiles")
        done = subprocess.run(command, capture_output=True, text=True, env=env)
        wall, cpu_after = time.perf_counter() - started, _cpu_times()
        if sampler is not None:
            sampler.terminate()
            sampler.wait()
        busy = (cpu_after[0] - cpu_before[0]) / max(cpu_after[1] - cpu_before[1], 1)
        row = {"workers": workers, "mps": args.mps, "exit": done.returncode,
               "start": os.environ.get("RANKNAS_WORKER_START", "forkserver"),
               "wall_s": round(wall, 1), "cpu_busy_pct": round(100 * busy, 1)}  # fmt: skip
        row |= _study_figures(config, scratch)
        if done.returncode != 0:
            row["output_tail"] = done.stdout[-2000:] + done.stderr[-2000:]
        results["study"].append(row)
        save()
        if args.logs_out and workers > 1:  # the workers' logs: when each started, what it did
            import shutil

            shutil.make_archive(str(args.logs_out / f"workers-{workers}"), "gztar",
                                scratch / "out" / "workers")  # fmt: skip
        shown = {k: v for k, v in row.items() if k != "output_tail"}
        print(f"study, {workers} workers: {json.dumps(shown)}", flush=True)
        if done.returncode != 0:
            print(row["output_tail"], flush=True)
        if args.profile:
            _print_profile(scratch / "profiles", f"{workers} workers")
    if args.mps:
        subprocess.run(["nvidia-cuda-mps-control"], input="quit\n", text=True, check=False)


def concurrent_rows(args, results: dict, save) -> None:
    """N processes each training dcnv2 at batch 512 side by side, with no study around them
    (`--workers` gives the Ns; MPS as `--mps`): their summed examples/s against one alone.
    Where it scales about N-fold and a study of N workers does not, the study's host work is
    what bounds it; where it does not, the GPU's sharing of small kernels is."""
    import subprocess

    if args.mps:
        subprocess.run(["nvidia-cuda-mps-control", "-d"], check=False)
    try:
        _side_by_side(args, results, save)
    finally:
        if args.mps:
            subprocess.run(["nvidia-cuda-mps-control"], input="quit\n", text=True, check=False)


def _side_by_side(args, results: dict, save) -> None:
    import multiprocessing

    context = multiprocessing.get_context("spawn")  # CUDA in the parent: no fork
    cuda = args.device.startswith("cuda")
    counts = sorted({1, *map(int, args.workers.split(","))})  # one alone: the ratios' base
    alone = None
    for count in counts:
        barrier, queue = context.Barrier(count + 1), context.Queue()
        threads = max(1, (os.cpu_count() or 1) // count)  # as the launcher splits the cores
        children = [context.Process(target=_train_beside, args=(args.device, args.rows,
                    args.steps, threads, barrier, queue)) for _ in range(count)]  # fmt: skip
        for child in children:
            child.start()
        sampler = _gpu_sampler(args.out.parent / f"smi-concurrent-{count}.csv") if cuda else None
        barrier.wait(timeout=180)  # every child built its model and warmed up: timed from here
        started = time.perf_counter()
        speeds = [queue.get(timeout=300) for _ in children]
        wall = time.perf_counter() - started
        for child in children:
            child.join()
        if sampler is not None:
            sampler.terminate()
            sampler.wait()
        total = count * args.steps * 512 / wall
        alone = alone or total  # the first count is 1
        row = {"processes": count, "mps": args.mps, "wall_s": round(wall, 2),
               "examples_per_s_each": round(statistics.median(speeds)),
               "examples_per_s_total": round(total),
               "vs_one_alone": round(total / alone, 2)}  # fmt: skip
        smi = args.out.parent / f"smi-concurrent-{count}.csv"
        samples = [float(x) for x in smi.read_text().split() if x.replace(".", "").isdigit()] \
            if smi.exists() else []  # fmt: skip
        if samples:
            row["gpu_busy_pct"] = round(statistics.mean(samples), 1)
        results.setdefault("concurrent", []).append(row)
        save()
        print(f"concurrent, {count} processes: {json.dumps(row)}", flush=True)


def _train_beside(device: str, rows: int, steps: int, threads: int, barrier, queue) -> None:
    """One of `concurrent_rows`' processes: a warm-up run, the others awaited, a timed run."""
    torch.set_num_threads(threads)
    data = generate_synthetic(SyntheticConfig(rows=rows))
    arch = preset("dcnv2").bind(data.schema)
    run_once(arch, data, 512, max(5, steps // 10), device)
    barrier.wait(timeout=600)
    queue.put(run_once(arch, data, 512, steps, device)["throughput"])


def profile_rows(args, small, criteo) -> None:
    """Where a step's GPU time goes: torch.profiler's kernels over 30 steps replayed as a
    graph, the MLPerf shape at its batch compiled (the step its MFU target is measured on),
    dcnv2 at 512 as it is."""
    from torch.profiler import ProfilerActivity, profile

    for model, batch, compiled in (("mlperf_dlrm_dcnv2", args.mlperf_batch, True),
                                   ("dcnv2", 512, False)):  # fmt: skip
        data = criteo if model == "mlperf_dlrm_dcnv2" else small
        arch = (mlperf_dlrm_dcnv2() if data is criteo else preset(model)).bind(data.schema)
        cuda = args.device.startswith("cuda")
        run_once(arch, data, batch, 10, args.device, compiled=compiled)
        with profile(activities=[ProfilerActivity.CPU, *[ProfilerActivity.CUDA] * cuda]) as prof:
            run_once(arch, data, batch, 30, args.device, compiled=compiled)
        if cuda:
            torch.cuda.synchronize()
        label = ("graph" if cuda else "eager") + (" + compile" if compiled else "")
        print(f"\n### profile: {model} batch {batch}, {label}", flush=True)
        order = "cuda_time_total" if cuda else "cpu_time_total"
        print(prof.key_averages().table(sort_by=order, row_limit=25,
                                        max_name_column_width=60), flush=True)  # fmt: skip


def _cpu_times() -> tuple[int, int]:
    """The machine's busy and total CPU time so far (jiffies, all cores), from /proc/stat."""
    fields = [int(x) for x in Path("/proc/stat").read_text().split("\n")[0].split()[1:]]
    idle = fields[3] + fields[4]  # idle, iowait
    return sum(fields) - idle, sum(fields)


def _print_profile(folder: Path, label: str) -> None:
    """Where a study's workers spent their time: their cProfiles summed."""
    import pstats

    files = sorted(str(p) for p in folder.glob("search-*.prof"))
    if not files:
        print(f"no profiles in {folder}", flush=True)
        return
    stats = pstats.Stats(*files)
    print(f"\n### profile of {label}: {len(files)} processes, summed", flush=True)
    stats.sort_stats("cumulative").print_stats(
        r"(nas|trainers|search_space|optuna|sqlalchemy"
        r"|torch/(autograd|nn/modules/module))",
        45,
    )
    stats.sort_stats("tottime").print_stats(25)


def _gpu_sampler(path: Path):
    import subprocess

    command = ["nvidia-smi", "--query-gpu=utilization.gpu", "--format=csv,noheader,nounits",
               "-lms", "200"]  # fmt: skip
    return subprocess.Popen(command, stdout=path.open("w"), stderr=subprocess.DEVNULL)


def _study_figures(config: dict, scratch: Path) -> dict:
    """Trials done, the span from the first trial's start to the last one's end, trials per
    hour over it, and the GPU's mean utilization over the whole command."""
    from nas.storage import load_study
    from nas.trial_record import counted_trials

    figures: dict = {}
    try:
        trials = load_study(config["name"], config["storage"]).get_trials(deepcopy=False)
    except Exception as exc:  # the study never started: the row says why
        return {"error": f"{type(exc).__name__}: {exc}"}
    finished = [t for t in trials if t.datetime_complete is not None]
    figures["counted_trials"] = counted_trials(trials)
    figures["trials_by_state"] = {s: sum(t.state.name == s for t in trials)
                                  for s in ("COMPLETE", "PRUNED", "FAIL")}  # fmt: skip
    if finished:
        span = (max(t.datetime_complete for t in finished)
                - min(t.datetime_start for t in finished)).total_seconds()  # fmt: skip
        figures["trial_span_s"] = round(span, 1)
        figures["trials_per_hour"] = round(3600 * figures["counted_trials"] / span, 1)
        figures["devices"] = sorted({t.user_attrs.get("device", "?") for t in finished})
        # where a trial's time goes: its training steps against the rest (evaluations,
        # model building, sampling, storage writes)
        trained = [t for t in finished if t.user_attrs.get("throughput")]
        examples = config["budget"]["examples_per_trial"]
        if trained:
            figures["trial_s_mean"] = round(
                statistics.mean(
                    (t.datetime_complete - t.datetime_start).total_seconds() for t in trained
                ),
                3,
            )
            figures["train_s_mean"] = round(statistics.mean(
                examples / t.user_attrs["throughput"] for t in trained), 3)  # fmt: skip
    smi = scratch / "smi.csv"
    if smi.exists():
        samples = [float(x) for x in smi.read_text().split() if x.replace(".", "").isdigit()]
        if samples:
            figures["gpu_busy_pct"] = round(statistics.mean(samples), 1)
            figures["gpu_samples"] = len(samples)
    return figures


def suite_study(args) -> None:
    """The prepared device script: steps, NE, then the study with 1, 8 and 4 workers."""
    name = torch.cuda.get_device_name() if args.device.startswith("cuda") else "cpu"
    print(f"device: {name}, torch {torch.__version__}", flush=True)
    results: dict = {"device": name, "torch": torch.__version__, "steps": [], "ne": [],
                     "study": []}  # fmt: skip
    args.out.parent.mkdir(parents=True, exist_ok=True)

    def save() -> None:
        args.out.write_text(json.dumps(results, indent=1))

    parts = args.parts.split(",")
    small = generate_synthetic(SyntheticConfig(rows=args.rows))
    criteo = generate_synthetic(SyntheticConfig(rows=args.rows, num_dense=13, num_sparse=26))
    print("| model | batch | step | examples/s | MFU | peak MiB |\n|---|---|---|---|---|---|")
    first, rest = args.batches.split(",", 1) if "," in args.batches else (args.batches, "")
    if "steps" in parts:
        step_rows(argparse.Namespace(**vars(args) | {"batches": first}), results, save, small,
                  criteo)  # fmt: skip
    if "ne" in parts:
        ne_rows(args, results, save)
    if "study" in parts:
        study_rows(args, results, save)
    if "concurrent" in parts:
        concurrent_rows(args, results, save)
    if rest and "steps" in parts:
        step_rows(argparse.Namespace(**vars(args) | {"batches": rest, "mlperf_batch": 0}),
                  results, save, small, criteo)  # fmt: skip
    if "profile" in parts:  # last: a run cut short keeps the timed rows
        profile_rows(args, small, criteo)


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--batches", default="512,4096,16384")
    parser.add_argument("--steps", type=int, default=200, help="timed steps per run")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--rows", type=int, default=400_000)
    parser.add_argument("--threads", type=int, default=0, help="torch threads (0: default)")
    parser.add_argument("--models", default=",".join(PRESETS) + ",mlperf_dlrm_dcnv2")
    parser.add_argument("--peak-tflops", type=float, default=989.0)
    parser.add_argument("--out", type=Path, default=Path("runs/bench_gpu.json"))
    parser.add_argument("--suite", choices=("presets", "study"), default="presets",
                        help="presets: every model at every batch; study: issue 37's "
                        "script")  # fmt: skip
    parser.add_argument("--mlperf-batch", type=int, default=16_384, help="study suite")
    parser.add_argument("--ne-seeds", type=int, default=2, help="study suite")
    parser.add_argument("--workers", default="1,8,4", help="study suite: workers per run")
    parser.add_argument("--study-trials", type=int, default=20, help="study suite")
    parser.add_argument(
        "--ways",
        default="eager,graph",
        help="study suite: the steps compared (eager, graph, compile; graph-fp32in and "
        "compile-fp32in: with the network's inputs left in fp32 under autocast)",
    )
    parser.add_argument("--step-models", default=",".join(STUDY_MODELS), help="study suite")
    parser.add_argument(
        "--mps",
        action="store_true",
        help="study suite: the studies run under CUDA MPS (started and "
        "stopped here; the GPU's kernels of several workers then overlap)",
    )
    parser.add_argument(
        "--profile",
        action="store_true",
        help="study suite: each study's processes under cProfile, summed",
    )
    parser.add_argument("--parts", default="steps,ne,study",
                        help="study suite: which of profile, steps, ne, study, concurrent "
                        "to run")  # fmt: skip
    parser.add_argument("--logs-out", type=Path, help="study suite: archive workers' logs here")
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    if args.suite == "study":
        suite_study(args)
        return
    small = generate_synthetic(SyntheticConfig(rows=args.rows))
    criteo = generate_synthetic(SyntheticConfig(rows=args.rows, num_dense=13, num_sparse=26))
    name = torch.cuda.get_device_name() if args.device.startswith("cuda") else "cpu"
    print(f"device: {name}, torch {torch.__version__}, threads {torch.get_num_threads()}")
    print("| model | batch | examples/s | MFLOPs/ex | train TFLOP/s | MFU | peak MiB |")
    print("|---|---|---|---|---|---|---|")
    rows = []
    for model in args.models.split(","):
        scaled = model == "mlperf_dlrm_dcnv2"
        data = criteo if scaled else small
        arch = (mlperf_dlrm_dcnv2() if scaled else preset(model)).bind(data.schema)
        for batch in map(int, args.batches.split(",")):
            started = time.perf_counter()
            row = measure(arch, data, batch, args.steps, args.repeats, args.device,
                          args.peak_tflops if args.device.startswith("cuda") else 0.0)  # fmt: skip
            rows.append(row)
            mfu = f"{row['mfu']:.2%}" if row["mfu"] is not None else "-"
            print(
                f"| {model} | {batch} | {row['examples_per_s']:,} (±{row['spread']:,}) | "
                f"{row['mflops_per_example']} | {row['train_tflops']} | {mfu} | "
                f"{row['peak_memory_mib']} |  ({time.perf_counter() - started:.0f} s)",
                flush=True,
            )
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps({"device": name, "rows": rows}, indent=1))


if __name__ == "__main__":
    main()
