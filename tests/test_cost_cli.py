"""`shard plan|train|compare` through `register`, as nas/cli.py wires it."""

import argparse
import json
import re
from pathlib import Path

import pytest

from cost_models.sharding.cli import register
from cost_models.sharding.tables import TableSpec, generate_tables, save_tables
from cost_models.sharding.training import ShardTrainConfig, quick_config
from search_space.errors import RanknasError


def run(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="ranknas")
    register(parser.add_subparsers(dest="command", required=True))
    args = parser.parse_args(argv)
    return args.handler(args)


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    directory = tmp_path_factory.mktemp("model")
    cache = tmp_path_factory.mktemp("cache")
    assert run(["shard", "train", "--quick", "--out", str(directory), "--cache", str(cache)]) == 0
    return directory


def test_a_quick_training_is_not_planned_with_by_default(tmp_path, monkeypatch, capsys):
    """`--quick` (a few seconds, a poor model) saved where `shard plan` looks by default."""
    monkeypatch.chdir(tmp_path)
    assert run(["shard", "train", "--quick", "--cache", str(tmp_path / "cache")]) == 0
    out, err = capsys.readouterr()
    assert "saved the cost model and policy in runs/sharding/quick-model" in out
    # a cost model that ranks plans no better than chance (tau -0.39) was said to plan with
    tau = float(re.search(r"held-out cost_model: .* Kendall tau (-?[\d.]+)", out).group(1))
    assert ("no better than chance" in err) == (tau <= 0), (tau, err)
    assert "ranknas shard plan ... --model runs/sharding/quick-model" in out
    assert (tmp_path / "runs/sharding/quick-model").is_dir()
    assert not (tmp_path / "runs/sharding/model").exists()


def test_shard_train_checks_its_folders_before_any_work(tmp_path, monkeypatch):
    """It wrote over a person's own report.json, and a path it could not write failed with
    a traceback after minutes of measuring and training."""

    def no_training(*args, **kwargs):
        raise AssertionError("trained before the folders were checked")

    monkeypatch.setattr("cost_models.sharding.commands.train_sharder", no_training)
    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "report.json").write_text('{"mine": true}')
    train = ["shard", "train", "--quick", "--cache", str(tmp_path / "cache"), "--out"]
    with pytest.raises(RanknasError, match=r"mine: holds files that are not a sharding model"):
        run([*train, str(mine)])
    assert (mine / "report.json").read_text() == '{"mine": true}'
    (tmp_path / "afile").write_text("x")
    with pytest.raises(RanknasError, match=r"--cache .*afile is a file, not a folder"):
        run(["shard", "train", "--quick", "--out", str(tmp_path / "new"), "--cache",
             str(tmp_path / "afile")])  # fmt: skip
    assert not (tmp_path / "new").exists()  # not left empty: planned with as a model-less one


def test_a_plan_that_fills_a_device_says_so(tmp_path, capsys):
    """The heuristics fill a device to 100% (torchrec keeps 15% back): on a GPU, the
    optimizer's state and buffers then do not fit."""
    path = tmp_path / "full.yaml"
    save_tables([TableSpec("big", 1_000_000, 128), TableSpec("small", 100, 16)], path)
    plan = ["shard", "plan", str(path), "--devices", "2", "--method", "size_greedy"]
    assert run([*plan, "--memory-gb", "0.5"]) == 0
    assert "warning: rank(s) 0 above 90% of 0.50 GiB" in capsys.readouterr().err
    assert run([*plan, "--memory-gb", "1"]) == 0
    assert "above 90%" not in capsys.readouterr().err


@pytest.fixture
def table_file(tmp_path):
    path = tmp_path / "tables.yaml"
    save_tables(generate_tables(12, seed=5), path)
    return path


def test_plan_prints_devices_memory_and_cost(model, table_file, capsys):
    assert run(["shard", "plan", str(table_file), "--devices", "3", "--model", str(model)]) == 0
    out = capsys.readouterr().out
    assert "rl: 12 tables on 3 devices" in out and "predicted max-device cost" in out
    assert "memory GiB" in out and len(out.splitlines()) == 2 + 1 + 3


def test_plan_on_hosts_prices_the_links_between_them(model, table_file, capsys):
    """Every plan assumed 8 devices a host: 4 devices on 2 hosts were priced as one host's
    links, and a study's `sharding.hosts` had no counterpart here."""
    argv = ["shard", "plan", str(table_file), "--devices", "4", "--method", "size_greedy",
            "--model", str(model), "--json"]  # fmt: skip
    costs = {}
    for hosts in ([], ["--hosts", "2"]):
        assert run([*argv, *hosts]) == 0
        costs[len(hosts)] = json.loads(capsys.readouterr().out)["predicted_max_ms"]
    assert costs[2] > costs[0]  # the all-to-alls cross hosts
    with pytest.raises(RanknasError, match="--hosts 3 must divide --devices 4 evenly"):
        run([*argv, "--hosts", "3"])


def test_plan_json(model, table_file, capsys):
    argv = ["shard", "plan", str(table_file), "--devices", "4", "--json"]
    assert run([*argv, "--method", "size_greedy", "--model", str(model)]) == 0
    record = json.loads(capsys.readouterr().out)
    assert record["method"] == "size_greedy" and len(record["assignment"]) == 12
    assert len(record["memory_bytes"]) == 4 == len(record["predicted_ms"])
    assert record["predicted_max_ms"] > 0


def test_plan_takes_a_preset_s_tables(model, capsys):
    assert run(["shard", "plan", "dlrm", "--devices", "2", "--model", str(model), "--json"]) == 0
    record = json.loads(capsys.readouterr().out)
    assert sorted(record["assignment"]) == sorted(f"t_c{i}" for i in range(16))
    assert 0 < record["predicted_max_ms"] < 100  # tiny tables: no extrapolated nonsense


def test_plan_names_an_architecture_s_tables_by_their_columns(tmp_path, capsys):
    """A column `user.id` is the module `t_user%2Eid`; a person reads `t_user.id`."""
    from search_space.schema import CategoricalFeature, DatasetSchema
    from trainers.data.tabular import write_schema

    features = (CategoricalFeature("user.id", 50), CategoricalFeature("ad/cat", 40))
    schema = write_schema(DatasetSchema(("price",), features), tmp_path / "schema.yaml")
    argv = ["shard", "plan", "dlrm", "--schema", str(schema), "--devices", "2"]
    assert run([*argv, "--method", "size_greedy", "--model", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert "t_user.id" in out and "t_ad/cat" in out and "%2" not in out
    assert run([*argv, "--method", "size_greedy", "--model", str(tmp_path), "--json"]) == 0
    assert "t_user%2Eid" in json.loads(capsys.readouterr().out)["assignment"]  # the module's


def test_plan_and_a_study_take_an_architecture_written_in_yaml(tmp_path, capsys):
    """A YAML architecture file was read by `shard plan` as a table file, and keyed as a
    baseline by its whole path (`models/team.yaml`: a nested folder of that name)."""
    import yaml

    from nas.config import baseline_key
    from search_space.presets import PRESETS

    blocks = PRESETS["dlrm"]().to_dict()["blocks"]
    (tmp_path / "team.yaml").write_text(yaml.safe_dump({"embedding": {"dim": 8}, "blocks": blocks}))
    argv = ["shard", "plan", str(tmp_path / "team.yaml"), "--devices", "2"]
    assert run([*argv, "--method", "size_greedy", "--model", str(tmp_path)]) == 0
    assert "t_c0" in capsys.readouterr().out  # the synthetic schema's tables, by their columns
    assert baseline_key(str(tmp_path / "models" / "team.yaml")) == "team"


def test_plan_keeps_a_table_file_s_names_as_written(tmp_path, capsys):
    save_tables([TableSpec("a%2Eb", 100, 8), TableSpec("c", 100, 8)], tmp_path / "t.yaml")
    argv = ["shard", "plan", str(tmp_path / "t.yaml"), "--devices", "2"]
    assert run([*argv, "--method", "size_greedy", "--model", str(tmp_path)]) == 0
    assert "a%2Eb" in capsys.readouterr().out


def test_plan_measure_times_the_rl_plan_and_refuses_other_methods(model, table_file, capsys):
    argv = ["shard", "plan", str(table_file), "--devices", "3", "--model", str(model)]
    assert run([*argv, "--measure", "--json"]) == 0
    record = json.loads(capsys.readouterr().out)
    assert len(record["measured_ms"]) == 3 and record["measured_max_ms"] > 0
    assert record["measured_max_ms"] == max(record["measured_ms"])
    with pytest.raises(RanknasError, match=r"--measure times the rl sharder.*--method rl"):
        run([*argv, "--measure", "--method", "size_greedy"])


def test_compare_measures_every_method(model, table_file, tmp_path, capsys):
    argv = ["shard", "compare", str(table_file), "--devices", "2", "--json"]
    assert run([*argv, "--model", str(model), "--cache", str(tmp_path / "c")]) == 0
    result = json.loads(capsys.readouterr().out)
    methods = [p["method"] for p in result["plans"]]
    assert methods == [
        "random", "dim_greedy", "size_greedy", "lookup_greedy", "size_lookup_greedy",
        "torchrec", "torchrec_cw", "rl",
    ]  # fmt: skip
    for record in result["plans"]:
        assert record["measured_max_ms"] >= record["measured_mean_ms"] > 0


def test_without_a_trained_policy_plan_falls_back_and_says_so(table_file, tmp_path, capsys):
    assert run(["shard", "plan", str(table_file), "--devices", "2", "--model", str(tmp_path)]) == 0
    out, err = capsys.readouterr()
    assert "no trained RL policy" in err and out.startswith("size_lookup_greedy:")


def test_a_fresh_clone_plans_with_the_shipped_model_and_says_so(table_file, tmp_path, capsys,
                                                                monkeypatch):  # fmt: skip
    monkeypatch.chdir(tmp_path)  # no runs/sharding/model here
    assert run(["shard", "plan", str(table_file), "--devices", "2"]) == 0
    out, err = capsys.readouterr()
    assert "using the default shipped with ranknas" in err
    assert out.startswith("rl:") and "predicted max-device cost" in out


def test_train_help_states_the_training_defaults(capsys):
    """The parser cannot import the training config (torch), so its help spells them out."""
    with pytest.raises(SystemExit):
        run(["shard", "train", "--help"])
    shown = "".join(capsys.readouterr().out.split())
    full, quick = ShardTrainConfig(), quick_config()
    assert f"(default:{full.rounds};{quick.rounds}with--quick)" in shown
    assert f"(default:{full.rl.iterations};{quick.rl.iterations}with--quick)" in shown


def test_user_mistakes(model, table_file, tmp_path):
    too_big = tmp_path / "big.json"
    save_tables([TableSpec("huge", 2_000_000, 128)], too_big)
    told = r"huge \(0.954 GiB\).*short by 0.454 GiB\): raise --memory-gb to at least 0.954,"
    with pytest.raises(RanknasError, match=told):
        run(["shard", "plan", str(too_big), "--devices", "2", "--memory-gb", "0.5",
             "--method", "size_greedy"])  # fmt: skip
    # rl cuts it by rows: it met no other table to place and failed in numpy
    assert run(["shard", "plan", str(too_big), "--devices", "2", "--memory-gb", "0.5"]) == 0
    # compare without rl (no trained model in --model): no sharder places it, an error
    with pytest.raises(RanknasError, match=r"no sharder could place these tables; random: .*huge"):
        run(["shard", "compare", str(too_big), "--devices", "2", "--memory-gb", "0.5",
             "--model", str(tmp_path)])  # fmt: skip
    broken = tmp_path / "broken.yaml"
    broken.write_text("tables:\n- {name: a, num_embeddings: many, embedding_dim: 4}\n")
    with pytest.raises(RanknasError, match=r"tables\[0\] \(a\): 'num_embeddings'"):
        run(["shard", "plan", str(broken), "--devices", "2", "--method", "random"])


def test_a_table_larger_than_a_device_is_each_sharders_no_plan_and_rl_cuts_it(
    model, tmp_path, capsys
):
    """`shard compare` refused the whole comparison ("split these tables") where `rl` plans
    it, cutting the table by rows; the sharders that cannot place it say so, once, below."""
    path = tmp_path / "big.yaml"
    save_tables([TableSpec("huge", 3_000_000, 32, 1.0), TableSpec("small", 1_000, 8, 1.0)], path)
    argv = ["shard", "compare", str(path), "--devices", "2", "--memory-gb", "0.25"]
    assert run([*argv, "--model", str(model), "--cache", str(tmp_path / "c")]) == 0
    out = capsys.readouterr().out
    rows = {line.split()[0]: line for line in out.splitlines()[2:10]}
    assert "no plan (below)" in rows["size_greedy"] and "no plan" not in rows["rl"]
    # once for the sharders that use all of a device, once for torchrec, which keeps 15% back
    assert out.count("do not fit on one device") == 2 and "--method rl, which cuts" in out
    assert "(this method keeps 15% of each device back and counts each table" in out


def test_compare_says_which_plan_measured_lowest_and_where_rl_stands():
    from cost_models.sharding.commands import _compared

    records = [{"method": "size_greedy", "measured_max_ms": 0.5},
               {"method": "torchrec", "measured_max_ms": 0.4},
               {"method": "random", "error": "no plan: ..."},
               {"method": "rl", "measured_max_ms": 0.3}]  # fmt: skip
    assert _compared(records) == ("lowest measured max: rl (0.300 ms); rl 25.0% below the best "
                                  "other (torchrec); timings move by a few percent from run "
                                  "to run")  # fmt: skip
    assert _compared(records[:2]) == "lowest measured max: torchrec (0.400 ms)"
    # a second `compare` read every timing from its cache and said they move
    assert _compared(records, Path("runs/cache")).endswith(
        "(torchrec); every timing replayed from the cache (runs/cache), as last measured: "
        "delete it to time them again")  # fmt: skip
    assert _compared(records[3:]) is None  # one plan: nothing compared


def test_tables_too_large_to_time_here_are_refused_before_any_is_built(
    table_file, tmp_path, monkeypatch
):
    """A 50M-row table (24 GiB) was allocated whole to be timed: a traceback from the
    allocator, or the machine's memory taken. Refused first, naming what it needs."""
    from cost_models.sharding.measure import Measurer

    timed = []
    time_tables = Measurer._time
    monkeypatch.setattr(
        Measurer, "_time", lambda self, *a: timed.append(a) or time_tables(self, *a)
    )
    monkeypatch.setattr("cost_models.sharding.measure._available_memory_bytes", lambda: 2**20)
    argv = ["shard", "compare", str(table_file), "--devices", "2", "--cache", str(tmp_path / "c")]
    with pytest.raises(RanknasError, match=r"more than the 80% of the 0.00 GiB available here"):
        run(argv)
    assert timed == []  # refused before the first device's tables were timed


def test_a_model_folder_that_is_not_there_is_refused(table_file, tmp_path):
    """A mistyped `--model` planned silently with a greedy heuristic."""
    argv = ["shard", "plan", str(table_file), "--devices", "2", "--model", str(tmp_path / "nope")]
    with pytest.raises(RanknasError, match=r"--model: .*nope is not a folder"):
        run(argv)


def test_the_torchrec_planner_keeps_its_share_back_on_the_cpu_topology(tmp_path):
    """Its docstring said 15% of each device was kept back; torchrec's reservation takes it
    off a GPU's HBM only, and these CPU topologies kept nothing back (95% full plans)."""
    from cost_models.sharding.methods import RESERVED_SHARE
    from cost_models.sharding.sharders.torchrec_planner import TorchrecPlanner
    from cost_models.sharding.topology import Topology

    tables = [TableSpec(name, 1_000_000, 64) for name in "abcd"]  # 0.24 GiB each
    tight = Topology(num_devices=4, memory_bytes=int(tables[0].size_bytes / 0.95))
    with pytest.raises(RanknasError, match="keeps 15% of each device back"):
        TorchrecPlanner().plan(tables, tight)
    # two tables a device fit in 2.1 tables' memory only without the 15% kept back
    two_a_device = Topology(num_devices=2, memory_bytes=int(tables[0].size_bytes * 2.1))
    with pytest.raises(RanknasError, match=r"hold 0\.851 GiB \(this method keeps 15% of each"):
        TorchrecPlanner().plan(tables, two_a_device)  # said before its planner is asked
    roomy = Topology(num_devices=2, memory_bytes=int(tables[0].size_bytes * 2 / 0.8))
    plan = TorchrecPlanner().plan(tables, roomy)
    assert max(plan.memory_bytes) <= (1 - RESERVED_SHARE) * roomy.memory_bytes


def test_ranks_are_printed_as_runs():
    """A table cut over 128 ranks printed every rank: two lines of 0, 1, 2, ... 127."""
    from cost_models.sharding.commands import _spans

    assert _spans(range(128)) == "0-127"
    assert _spans([9, 0, 1, 2, 3, 5, 8, 10, 11]) == "0-3, 5, 8-11"


def test_a_plan_says_when_its_cost_model_is_out_of_its_depth(tmp_path, capsys):
    """200 tables of 10-209 rows at dim 4 measured 9x their prediction, and a `--quick`
    model that ranks plans no better than chance planned without a word."""
    import json

    from cost_models.sharding.commands import model_caveats
    from cost_models.sharding.methods import PACKAGED_MODEL

    tiny = tmp_path / "tiny.yaml"
    save_tables([TableSpec(f"t{i}", 10 + i, 4, 1.0) for i in range(200)], tiny)
    assert run(["shard", "plan", str(tiny), "--devices", "8"]) == 0
    said = ("warning: 200 tables of 200 lie outside what the cost model was trained on (rows "
            "100-500,000, dims 8-128), e.g. t0 (10 rows, dim 4)")  # fmt: skip
    assert said in capsys.readouterr().err
    shipped = json.loads((PACKAGED_MODEL / "report.json").read_text())
    quick = tmp_path / "quick"
    quick.mkdir()
    shipped["errors"]["cost_model"]["kendall_tau"] = -0.12
    (quick / "report.json").write_text(json.dumps(shipped))
    inside = [TableSpec("a", 50_000, 16, 1.0)]
    (said,) = model_caveats(quick, inside)
    assert said.startswith(f"the cost model in {quick} ranks held-out plans no better than chance")
    assert model_caveats(PACKAGED_MODEL, inside) == []
