"""Multi-process training: torchrec DistributedModelParallel on 2 CPU processes (gloo) with a
table-wise plan takes the same steps as one process training on the whole batch."""

import json
import socket
import subprocess
import sys

import pytest


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _torchrun(processes: int, out, *args: str) -> list[float]:
    command = [
        sys.executable, "-m", "torch.distributed.run", f"--nproc_per_node={processes}",
        "--master_addr=127.0.0.1", f"--master_port={_free_port()}",
        "-m", "trainers.distributed", "--rows=6000", "--steps=15", f"--out={out}", *args,
    ]  # fmt: skip
    result = subprocess.run(command, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    return json.loads(out.read_text())


@pytest.mark.parametrize("arch", ["dlrm", "wukong"])
def test_two_process_table_wise_training_matches_one_process(tmp_path, arch):
    plan = json.dumps({f"c{i}": (0 if i < 5 else 1) for i in range(16)})  # uneven on purpose
    single = _torchrun(1, tmp_path / "one.json", f"--arch={arch}")
    double = _torchrun(2, tmp_path / "two.json", f"--arch={arch}", f"--plan={plan}")
    assert double["world_size"] == 2 and set(double["plan"].values()) == {0, 1}
    assert single["losses"] == pytest.approx(double["losses"], abs=1e-4)
    assert double["losses"][-1] < double["losses"][0]
