"""The sharders' names (`sharders.make_sharder` builds them), the largest world a plan is
made for and where a trained model is saved by default, apart so the CLI parser and the
study config have them without importing torchrec."""

import json
from pathlib import Path

from search_space.errors import RanknasError

HEURISTICS = ("random", "dim_greedy", "size_greedy", "lookup_greedy", "size_lookup_greedy")
METHODS = (*HEURISTICS, "torchrec", "torchrec_cw", "rl")
# what `shard plan --method rl` uses without a trained policy: the best heuristic in
# BENCHMARKS.md
FALLBACK = "size_lookup_greedy"
# 2,048 hosts of 8. A plan holds a cost per device in each of its episodes: the rl sharder
# planned 16 tables on 16,384 devices in 42 s and 1 GB, on 65,536 in 157 s and 2.7 GB, and
# on 1,000,000 ran out of memory.
MAX_DEVICES = 16_384
DEFAULT_MODEL = Path("runs/sharding/model")  # where `ranknas shard train` saves one
# torchrec's planner (`sharders.torchrec_planner`): the share of each device it keeps back,
# and its column shards' least width under torchrec_cw
RESERVED_SHARE = 0.15
CW_MIN_DIM = 32

# A small cost model and policy shipped with ranknas (`ranknas shard train`, default settings;
# its report.json says on what), for a fresh clone.
PACKAGED_MODEL = Path(__file__).parent / "default_model"


def model_to_use(folder: str | Path, given_as: str) -> tuple[Path, str | None]:
    """The cost model and policy to plan with: those in `folder`, or, where it is the
    default folder and holds none, the ones shipped (with a line saying so: their costs
    were measured on another machine). Any other folder must be there (`given_as` names
    where it was given): a mistyped one planned silently with a greedy heuristic, or with
    the shipped model."""
    folder = Path(folder)
    if folder != DEFAULT_MODEL and not folder.is_dir():
        raise RanknasError(f"{given_as}: {folder} is not a folder (one `ranknas shard train "
                           f"--out` wrote); leave {given_as} out for the default")  # fmt: skip
    if folder != DEFAULT_MODEL or (folder / "policy.json").exists():
        return folder, None
    device = json.loads((PACKAGED_MODEL / "report.json").read_text())["device"]
    return PACKAGED_MODEL, (f"no trained model in {DEFAULT_MODEL}: using the default shipped "
                            f"with ranknas, trained on measurements of {device} (`ranknas "
                            "shard train` trains one on this machine's)")  # fmt: skip
