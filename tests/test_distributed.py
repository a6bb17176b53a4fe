"""Multi-process training: torchrec DistributedModelParallel on 2 CPU processes (gloo) with a
plan (table-wise, with a column-wise split, with a row-wise split) takes the same steps as
one process training on the whole batch."""

import json
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from cost_models.sharding.plan import make_plan
from cost_models.sharding.tables import shard_name, tables_from_architecture
from search_space.errors import RanknasError
from search_space.presets import preset
from search_space.schema import synthetic_schema
from trainers.distributed import load_plan


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _torchrun(processes: int, out, *args: str) -> dict:
    command = [
        sys.executable, "-m", "torch.distributed.run", f"--nproc_per_node={processes}",
        "--master_addr=127.0.0.1", f"--master_port={_free_port()}",
        "-m", "trainers.distributed", "--rows=6000", "--steps=15", f"--out={out}", *args,
    ]  # fmt: skip
    result = subprocess.run(command, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    return json.loads(out.read_text())


def _plan_file(path, arch: str, split: str | None) -> str:
    """Tables 0-4 on rank 0, the rest on rank 1 (uneven on purpose); table 0 cut into two
    column shards (`split="column"`) or two row shards (`"row"`), one per rank."""
    tables = tables_from_architecture(preset(arch, synthetic_schema(seed=0)))
    splits = {tables[0].name: 2} if split == "column" else {}
    row_wise = {tables[0].name: (0, 1)} if split == "row" else {}
    assignment = {t.name: (0 if i < 5 else 1) for i, t in enumerate(tables)}
    if split:
        del assignment[tables[0].name]
    if split == "column":
        assignment |= {shard_name(tables[0].name, j): j for j in range(2)}
    plan = make_plan(assignment, tables, 2, "test", splits, row_wise)
    path.write_text(json.dumps(plan.to_dict()))
    return str(path)


@pytest.mark.parametrize(
    ("arch", "split", "optimizer"),
    [
        # table-wise DLRM is also the row case's placement of every table but the first
        pytest.param("dlrm", None, "rowwise_adagrad", marks=pytest.mark.slow),
        # 19 s and 15 s: `make test-all` runs them; the row case stays in `make test`
        pytest.param("wukong", None, "rowwise_adagrad", marks=pytest.mark.slow),
        pytest.param("dlrm", "column", "sgd", marks=pytest.mark.slow),
        ("dlrm", "row", "rowwise_adagrad"),
    ],
)
def test_two_process_training_matches_one_process(tmp_path, arch, split, optimizer):
    plan = _plan_file(tmp_path / "plan.json", arch, split)
    common = (f"--arch={arch}", f"--sparse-optimizer={optimizer}")
    single = _torchrun(1, tmp_path / "one.json", *common)
    double = _torchrun(2, tmp_path / "two.json", *common, f"--plan={plan}")
    assert double["world_size"] == 2
    assert {r for ranks in double["plan"].values() for r in ranks} == {0, 1}
    assert (double["plan"]["t_c0"] == [0, 1]) == bool(split)
    assert single["losses"] == pytest.approx(double["losses"], abs=1e-4)
    assert double["losses"][-1] < double["losses"][0]


def test_a_plan_for_other_tables_or_devices_is_refused(tmp_path):
    plan = Path(_plan_file(tmp_path / "plan.json", "dlrm", None))  # dlrm's tables, 2 devices
    dlrm = tables_from_architecture(preset("dlrm", synthetic_schema(seed=0)))
    other = dlrm[:-1]
    assert load_plan(plan, dlrm, 2).num_devices == 2
    with pytest.raises(RanknasError, match=r"plan\.json: the plan is for 2 devices and this "
                       r"run has 1 process: plan again with --devices 1"):  # fmt: skip
        load_plan(plan, dlrm, 1)
    with pytest.raises(RanknasError, match=r"plan\.json: the plan is for other tables than this "
                       r"model's \(not planned: \[\]; not the model's: \['t_"):  # fmt: skip
        load_plan(plan, other, 2)


@pytest.mark.parametrize(
    ("content", "said"),
    [(None, "no such file or directory; make one with `ranknas shard plan"),
     ("{not json", "not a sharding plan (JSONDecodeError"),
     ('{"tables": []}', "not a sharding plan (KeyError: 'assignment')")],
)  # fmt: skip
def test_a_plan_file_that_is_missing_or_not_a_plan_is_one_error(tmp_path, capsys, content, said):
    """It was a traceback from every rank and torchrun's own: said before the process group
    starts, as one `error:` line, exit 2."""
    from trainers.distributed import main

    plan = tmp_path / "plan.json"
    if content is not None:
        plan.write_text(content)
    assert main(["--plan", str(plan)]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"error: --plan {plan}: {said}") and "Traceback" not in err, err


def test_outside_torchrun_it_says_how_to_run_it():
    """`python -m trainers.distributed` printed nothing and exited 0."""
    import os

    env = {k: v for k, v in os.environ.items() if k != "RANK"}
    run = subprocess.run([sys.executable, "-m", "trainers.distributed", "--arch", "dlrm"],
                         capture_output=True, text=True, env=env, timeout=120)  # fmt: skip
    assert run.returncode == 2 and "error: run it under torchrun" in run.stderr


@pytest.mark.skipif(torch.cuda.is_available(), reason="a machine with a CUDA GPU runs --cuda")
def test_cuda_on_a_machine_without_a_gpu_is_one_error(capsys):
    """Every rank printed "RuntimeError: Distributed package doesn't have NCCL built in"."""
    from trainers.distributed import main

    assert main(["--cuda"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: --cuda trains on GPUs with nccl: this machine has no CUDA GPU")
