"""Trials that train sharded (issue 41): torchrun, DistributedModelParallel, the study's
plan, through the one training loop; as good as one process, with each rank's step time."""

import dataclasses
import json
import statistics
import subprocess
from pathlib import Path

import pytest

import trainers.sharded
from cost_models.sharding.plan import make_plan
from cost_models.sharding.tables import tables_from_architecture
from nas.config import parse_config
from nas.runner import run_study
from search_space.builder import build_model
from search_space.presets import load_architecture
from study_helpers import tiny_config
from trainers.config import TrainConfig
from trainers.data.synthetic import SyntheticConfig, generate_synthetic
from trainers.sharded import ShardedJob, _why, train_sharded, train_sharded_in_turn
from trainers.trainer import TrainResult, train


def test_two_processes_reach_the_single_process_ne_within_seed_noise(monkeypatch):
    data = generate_synthetic(SyntheticConfig(rows=20_000, seed=0))
    splits = data.split((0.8, 0.1, 0.1), seed=0)
    arch = load_architecture("dlrm", data.schema)
    tables = tables_from_architecture(arch)
    plan = make_plan({t.name: i % 2 for i, t in enumerate(tables)}, tables, 2, "round_robin")

    def config(seed: int) -> TrainConfig:
        return TrainConfig(batch_size=256, max_examples=40_000, seed=seed, device="cpu")

    one = [train(build_model(arch, seed=s), *splits, config(s)).validation["ne"] for s in range(3)]
    # two runs in turn on one launch (the second: another architecture, another plan)
    dcn = load_architecture("dcnv2", data.schema)
    other = make_plan({t.name: 1 - i % 2 for i, t in enumerate(tables)}, tables, 2, "round_robin")
    jobs = [ShardedJob(arch, splits, config(0), plan), ShardedJob(dcn, splits, config(1), other)]
    launches = []
    launch = trainers.sharded.torchrun
    spy = lambda *args, **kwargs: (launches.append(args), launch(*args, **kwargs))[1]  # noqa: E731
    monkeypatch.setattr(trainers.sharded, "torchrun", spy)
    (result, model), (second, second_model) = train_sharded_in_turn(jobs)
    assert len(launches) == 1 and len(launches[0][2]) == 2  # one launch, two job folders
    assert result.status == second.status == "complete", (result, second)
    noise = statistics.stdev(one)
    assert abs(result.validation["ne"] - one[0]) < 2 * noise, (result.validation["ne"], one)
    # each model comes back whole: evaluated in this process it scores what the ranks did
    from trainers.trainer import evaluate

    assert evaluate(model, splits[1])["ne"] == pytest.approx(result.validation["ne"], abs=1e-5)
    assert evaluate(second_model, splits[1])["ne"] == pytest.approx(second.validation["ne"],
                                                                    abs=1e-5)  # fmt: skip
    assert len(result.device_step_ms) == 2 and result.step_ms == max(result.device_step_ms) > 0


def test_a_launch_that_dies_in_a_job_keeps_the_jobs_before_it(monkeypatch):
    """Rank 0 writes a job's result once every rank has trained it: the jobs before the one
    that failed keep theirs; the one that failed says why; those after say they never ran."""
    data = generate_synthetic(SyntheticConfig(rows=2_000, seed=0))
    splits = data.split((0.8, 0.1, 0.1), seed=0)
    arch = load_architecture("logistic_regression", data.schema)
    tables = tables_from_architecture(arch)
    plan = make_plan({t.name: 0 for t in tables}, tables, 2, "round_robin")
    trained = TrainResult(status="complete", validation={"ne": 0.95}, curves={"ne": [(1, 0.95)]})

    def dies_in_the_second_job(processes, module, folders, threads):
        (Path(folders[0]) / "result.json").write_text(json.dumps(dataclasses.asdict(trained)))
        return subprocess.CompletedProcess([], 1, "", "RuntimeError: out of memory\n")

    monkeypatch.setattr(trainers.sharded, "torchrun", dies_in_the_second_job)
    config = TrainConfig(batch_size=256, max_examples=512, device="cpu")
    results = [r for r, _ in train_sharded_in_turn([ShardedJob(arch, splits, config, plan)] * 3)]
    assert [r.status for r in results] == ["complete", "failed", "failed"]
    assert results[0].validation == {"ne": 0.95} and results[0].plan == plan.to_dict()
    assert results[1].failure_reason == "sharded training failed: RuntimeError: out of memory"
    assert results[2].failure_reason == "not trained: job 2 of 3 on its launch failed first"


def test_a_study_with_two_processes_trains_every_trial_sharded(tmp_path):
    config = tiny_config(tmp_path, "sharded", training={"batch_size": 128, "evals": 2,
                                                        "processes": 2},
                         budget={"trials": 1, "epochs_per_trial": 1})  # fmt: skip
    study = run_study(parse_config(config), progress=lambda line: None)
    (trial,) = [t for t in study.trials if t.state.is_finished()]
    assert trial.values[0] < 1.0
    metrics = json.loads((tmp_path / "sharded/trials/0/metrics.json").read_text())
    assert metrics["measured_step_ms"] == max(metrics["rank0_step_ms"], metrics["rank1_step_ms"])
    # beside the prediction on every surface: it was in MLflow and the model card only
    from nas.leaderboard import format_table, rows

    (row,) = rows(study)
    assert row["measured_step_ms"] == metrics["measured_step_ms"]
    assert "measured step ms" in format_table([row]).splitlines()[0]
    plan = json.loads((tmp_path / "sharded/trials/0/trained_plan.json").read_text())
    assert plan["num_devices"] == 2 and set(plan["assignment"].values()) <= {0, 1}
    # `status`'s "trained on" and the MLflow tag name the ranks, not the driver's CPU
    assert trial.user_attrs["device"].startswith("torchrun: 2 x cpu (")


def test_pruning_uneven_batches_and_compile_are_refused_for_sharded_training():
    base = {"name": "x", "search_space": {"type": "around", "base": "dlrm"}}
    with pytest.raises(Exception, match="cannot report to a pruner"):
        parse_config(base | {"training": {"processes": 2}, "pruning": {"type": "median"}})
    with pytest.raises(Exception, match=r"must split evenly over training\.processes 3"):
        parse_config(base | {"training": {"processes": 3, "batch_size": 512}})
    with pytest.raises(Exception, match=r"training\.compile compiles the one-process step"):
        parse_config(base | {"training": {"processes": 2, "compile": True}})


def test_a_failed_torchrun_is_told_by_its_ranks_own_error():
    """torchrun ends with "ChildFailedError:" and a table; the cause is the rank's line."""
    stderr = ("[rank1]: Traceback (most recent call last):\n"
              "[rank1]: RuntimeError: Connection reset by peer\n"
              "torch.distributed.elastic.multiprocessing.errors.ChildFailedError: \n"
              "=====\ntrainers.sharded FAILED\n")  # fmt: skip
    run = subprocess.CompletedProcess([], 1, "", stderr)
    assert _why(run) == "[rank1]: RuntimeError: Connection reset by peer"
    assert _why(subprocess.CompletedProcess([], 1, "", "killed\n")) == "torchrun exited 1"
    aborted = ("terminate called without an active exception\n"
               "torch.distributed.elastic.multiprocessing.errors.ChildFailedError: \n"
               "Failures:\n  rank      : 0 (local_rank: 0)\n"
               "  traceback : Signal 15 (SIGTERM) received by PID 6528\n"
               "Root Cause (first observed failure):\n  rank      : 1 (local_rank: 1)\n"
               "  traceback : Signal 6 (SIGABRT) received by PID 6529\n")  # fmt: skip
    assert _why(subprocess.CompletedProcess([], 1, "", aborted)) == (
        "a rank died: Signal 6 (SIGABRT) received by PID 6529; "
        "terminate called without an active exception"
    )


def test_a_model_that_leaves_features_out_trains_on_the_whole_log_and_sharded():
    """The batches hold every column of the data; a model an around search left features out
    of (dim 0: no table) reads its own: in one process (fbgemm's fused tables) and under
    torchrun with its plan, which has no table for them."""
    from dataclasses import replace

    data = generate_synthetic(SyntheticConfig(rows=6_000, seed=0))
    splits = data.split((0.8, 0.1, 0.1), seed=0)
    arch = load_architecture("dlrm", data.schema)
    features = tuple(replace(f, dim=0) if i % 3 == 0 else f
                     for i, f in enumerate(arch.embedding.features))  # fmt: skip
    arch = replace(arch, embedding=replace(arch.embedding, features=features))
    tables = tables_from_architecture(arch)
    assert len(tables) == len(arch.embedding.used) < len(features)
    plan = make_plan({t.name: i % 2 for i, t in enumerate(tables)}, tables, 2, "round_robin")
    config = TrainConfig(batch_size=256, max_epochs=1, seed=0, device="cpu")
    alone = train(build_model(arch, seed=0), *splits, config)
    sharded, _ = train_sharded(arch, splits, config, plan)
    assert alone.status == sharded.status == "complete", sharded.failure_reason
    assert alone.validation["ne"] < 1 and sharded.validation["ne"] < 1


SLEEPER = """import os, pathlib, time
pathlib.Path(os.environ["PIDS"], os.environ["RANK"]).write_text(str(os.getpid()))
time.sleep(300)
"""


@pytest.mark.parametrize("stop", ["interrupt", "kill -9"])
def test_an_interrupted_launch_stops_its_ranks(stop, tmp_path):
    """A `kill PID` of a study while a sharded run trained (a SIGTERM to the study's process
    alone, not its group) left torchrun's two ranks running, idle, for good; so did a
    `kill -9` of it (torchrun runs in a session of its own), training to the end."""
    import os
    import signal
    import sys
    import time

    (tmp_path / "sleeper.py").write_text(SLEEPER)
    pids = tmp_path / "pids"
    pids.mkdir()
    repo = Path(__file__).resolve().parents[1]
    env = os.environ | {"PIDS": str(pids), "PYTHONPATH": f"{tmp_path}:{repo}"}
    driver = subprocess.Popen([sys.executable, "-c", "from cost_models.sharding.torchrun import "
                               "torchrun; torchrun(2, 'sleeper', [])"], env=env)  # fmt: skip
    deadline = time.monotonic() + 60
    while len(list(pids.iterdir())) < 2 and time.monotonic() < deadline:
        time.sleep(0.2)
    ranks = [int(p.read_text()) for p in pids.iterdir()]
    assert len(ranks) == 2
    if stop == "interrupt":
        driver.send_signal(signal.SIGINT)  # as the CLI's SIGTERM handler does: KeyboardInterrupt
    else:
        driver.kill()
    driver.wait(timeout=30)

    def alive(pid: int) -> bool:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return False
        return True

    deadline = time.monotonic() + 30  # 15 s ran out once in a whole-suite CI run
    while any(alive(pid) for pid in ranks) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not any(alive(pid) for pid in ranks)


def test_a_killed_runs_job_folder_is_removed_by_the_next_run(tmp_path, monkeypatch):
    """A study killed (`kill -9`) during a sharded run left its job folder, the rows and
    weights, in the temporary folder for good. The next run removes the folders of
    processes of this machine that are gone, and only theirs."""
    import sys
    import tempfile

    from trainers.processes import process_identity

    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    boot, namespace, pid = process_identity().split(":")
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"],
                          capture_output=True, text=True, check=True).stdout.strip()  # fmt: skip
    left = tmp_path / f"ranknas-sharded-{boot}:{namespace}:{dead}-abc123"
    running = tmp_path / f"ranknas-sharded-{boot}:{namespace}:{pid}-def456"
    elsewhere = tmp_path / f"ranknas-sharded-{boot}:{int(namespace) + 1}:{dead}-ghi789"
    for folder in (left, running, elsewhere):
        (folder / "0").mkdir(parents=True)
    with trainers.sharded._job_folder() as job:
        assert Path(job).name.startswith(f"ranknas-sharded-{boot}:{namespace}:{pid}-")
        assert not left.exists() and running.exists() and elsewhere.exists()
    assert not Path(job).exists()
