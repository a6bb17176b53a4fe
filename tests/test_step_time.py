"""Step time as a cost (issue 41): a candidate's training step on the study's cluster,
predicted before it trains, as a constraint and an objective, and shipped with the export."""

import json
import re
from pathlib import Path

import optuna
import pytest
from optuna.trial import TrialState

from cost_models.latency.model import LatencyPredictor
from cost_models.sharding.step import predict_step, topology
from cost_models.sharding.topology import Topology
from nas.cli import main
from nas.config import parse_config
from nas.leaderboard import format_table, rows
from nas.protocol import architecture_costs
from nas.runner import _check_links, run_study
from nas.trial_record import STEP_FILE, TrialAttr
from search_space.architecture import Architecture
from search_space.errors import RanknasError
from search_space.presets import load_architecture
from search_space.schema import synthetic_schema
from study_helpers import tiny_config, write_config

SCHEMA = synthetic_schema()


def test_the_dense_all_reduce_crosses_the_slowest_link():
    one_host, two_hosts = Topology(8), topology(16, hosts=2)
    assert Topology(1).allreduce_ms(100.0) == 0.0
    assert two_hosts.hosts == 2 and two_hosts.host_size == 8
    assert two_hosts.allreduce_ms(100.0) > one_host.allreduce_ms(100.0) > 0
    assert one_host.allreduce_ms(200.0) > one_host.allreduce_ms(100.0)


def _with_dim(arch: Architecture, dim: int) -> Architecture:
    data = arch.to_dict()
    data["embedding"]["dim"] = dim
    return Architecture.from_dict(data).bind(SCHEMA)


def test_the_step_adds_its_parts_and_wider_embeddings_cost_more():
    """Lookups of one small table per device cost about the same from dim 4 to 64 (the cost
    model's kernels are launch-bound there); at 128 they cost more, as their traffic does
    at every width."""
    arch = load_architecture("dlrm", SCHEMA)
    cluster = topology(16, hosts=2)

    def step(a: Architecture) -> dict:
        return predict_step(a, cluster, "size_lookup_greedy", "no-model-here", 512,
                            dense_ms=1.0, dense_params=10_000)  # fmt: skip

    narrow, wide = step(_with_dim(arch, 8)), step(_with_dim(arch, 128))
    for s in (narrow, wide):
        parts = s["dense_ms"] + s["allreduce_ms"] + s["embedding_ms"] + s["all_to_all_ms"]
        assert s["step_ms"] == pytest.approx(parts)
        assert s["devices"] == 16 and s["hosts"] == 2 and 0 <= s["busiest_device"] < 16
        assert "shipped with ranknas" in s["cost_model"]
        assert set(s["plan"]["assignment"]) == {f"t_{f.name}" for f in arch.embedding.features}
    assert wide["embedding_ms"] > narrow["embedding_ms"]
    assert wide["all_to_all_ms"] > narrow["all_to_all_ms"]


# variants no bigger than the base: a base timed again can land just above its own ceiling
# on a busy machine
AROUND_DLRM = {"type": "around", "base": "dlrm", "insert_ops": [], "embedding_dims": [8, 16],
               "width_multipliers": [0.5, 1.0], "swap_ops": False}  # fmt: skip


def _held_to_dlrm(tmp_path: Path, name: str, trials: int) -> dict:
    """A study around DLRM for NE and step time on 16 devices, held to DLRM's step."""
    config = tiny_config(tmp_path, name, objectives={"cost": "step_ms", "max_step_ms": "base"},
                         searcher={"type": "nsga2"}, sharding={"devices": 16, "hosts": 2},
                         budget={"trials": trials, "epochs_per_trial": 2})  # fmt: skip
    # two epochs: at one, 2 of 10 sampled models stayed at the base rate (NE >= 1) and
    # failed, and which ones a study samples moves with the timings its ceiling depends on
    return config | {"search_space": AROUND_DLRM}


def test_a_step_time_study_resumed_on_another_cluster_is_refused(tmp_path):
    """A study of 4 devices resumed with 64 held its trials to the 4 devices' ceiling,
    labelled "on 64 devices", and put the steps of both clusters on one Pareto front."""
    from nas.protocol_diff import check_settings, step_cluster
    from nas.trial_record import StudyAttr

    config = _held_to_dlrm(tmp_path, "cluster", trials=1)
    recorded = {StudyAttr.STEP_CLUSTER: step_cluster(parse_config(config))}
    check_settings(recorded, parse_config(config))  # the same cluster
    unsaid = config | {"sharding": {"devices": 16}}  # 8 devices a host: 2 hosts, as given
    check_settings(recorded, parse_config(unsaid))
    moved = parse_config(config | {"sharding": {"devices": 64, "hosts": 8, "method": "rl"}})
    changes = ('sharding.devices: 16 -> 64; sharding.hosts: 2 -> 8; sharding.method: '
               '"size_lookup_greedy" -> "rl"')  # fmt: skip
    with pytest.raises(RanknasError, match=re.escape(f"other settings ({changes})")):
        check_settings(recorded, moved)
    with pytest.raises(RanknasError, match=r"\(sharding\.devices: 16 -> 64\)"):  # recorded
        check_settings({StudyAttr.STEP_DEVICES: 16}, moved)  # before the rest of the cluster
    check_settings(recorded, parse_config(config | {"objectives": {"cost": "mflops"}}))
    # measured links (another machine's, or measured again): their content, not their path
    links = tmp_path / "links.json"
    links.write_text('{"measured": 1}')
    measured = config | {"sharding": {"devices": 16, "hosts": 2, "links": str(links)}}
    recorded = {StudyAttr.STEP_CLUSTER: step_cluster(parse_config(measured))}
    moved = tmp_path / "elsewhere" / "links.json"
    moved.parent.mkdir()
    moved.write_text('{"measured": 1}')
    elsewhere = {"sharding": {"devices": 16, "hosts": 2, "links": str(moved)}}
    check_settings(recorded, parse_config(measured | elsewhere))
    links.write_text('{"measured": 2}')
    with pytest.raises(RanknasError, match=r"other settings \(sharding\.links_content: "):
        check_settings(recorded, parse_config(measured))


def test_a_study_held_to_its_base_step_time_and_its_export_ships_the_plan(tmp_path, capsys):
    config = _held_to_dlrm(tmp_path, "steps", trials=3)
    study = run_study(parse_config(config), progress=lambda line: None)
    ceiling = study.user_attrs["step_ms_ceiling"]
    assert ceiling["of"] == "base dlrm" and ceiling["step_ms"] > 0
    assert study.user_attrs["step_cluster"] == {"devices": 16, "hosts": 2, "runtime_ms": None,
                                                "method": "size_lookup_greedy",
                                                "links_content": None,
                                                "dense_model_content": None}  # fmt: skip
    trained = [t for t in study.trials if t.values]
    assert trained, "no trial completed"
    for t in (t for t in study.trials if t.state.is_finished()):
        step_ms = t.user_attrs["step_ms"]
        if t.user_attrs.get(TrialAttr.OVER_CONSTRAINT):
            assert step_ms > ceiling["step_ms"]
            assert "objectives.max_step_ms" in t.user_attrs[TrialAttr.FAILURE_REASON]
        elif t.state == TrialState.COMPLETE:
            assert step_ms <= ceiling["step_ms"] and t.values[1] == step_ms
            step = json.loads((tmp_path / "steps/trials" / str(t.number) / STEP_FILE).read_text())
            assert step["step_ms"] == step_ms and step["devices"] == 16
    assert "predicted step ms" in format_table(rows(study)).splitlines()[0]

    storage = config["storage"]
    assert main(["leaderboard", "steps", "--storage", storage]) == 0
    assert "Pareto front (validation NE vs predicted ms a step):" in capsys.readouterr().out
    assert main(["status", "steps", "--storage", storage]) == 0
    assert "step time ceiling:" in capsys.readouterr().out
    out = tmp_path / "winner"
    assert main(["export", "steps", "--storage", storage, "--out", str(out)]) == 0
    shipped = json.loads((out / "sharding_plan.json").read_text())
    tables = shipped["torchrec_sharding_plan"]["embedding_bags"]
    features = load_architecture("dlrm", SCHEMA).embedding.features
    assert set(tables) == {f"t_{f.name}" for f in features}
    assert all(0 <= r < 16 for t in tables.values() for r in t["ranks"])
    card = (out / "model_card.md").read_text()
    assert "## Training step on the study's cluster" in card
    assert f"{shipped['predicted_step']['step_ms']:.3f} ms a step on 16 devices" in card


def test_a_base_trained_as_a_baseline_is_held_to_its_recorded_step(tmp_path):
    """Around DLRM held to `max_step_ms: base` with DLRM a baseline: the ceiling priced the
    base again (its dense part timed anew), 7.394 ms beside the baseline's recorded 7.269,
    and a trial slower than DLRM's recorded step passed under it."""
    from nas.baselines import recorded

    config = _held_to_dlrm(tmp_path, "based", trials=1) | {"baselines": ["dlrm"]}
    study = run_study(parse_config(config | {"best_baseline": {"seeds": 0}}),
                      progress=lambda line: None)  # fmt: skip
    ceiling = study.user_attrs["step_ms_ceiling"]
    assert ceiling["of"] == "base dlrm"
    assert ceiling["step_ms"] == recorded(study)["dlrm"]["step_ms"]


def test_an_unsharded_export_has_no_plan(tmp_path):
    """Not even one that `--force` wrote over an export that had one: that plan stayed,
    another model's, and SHA256SUMS did not list it."""
    config = tiny_config(tmp_path, "plain", budget={"trials": 1, "epochs_per_trial": 1})
    run_study(parse_config(config), progress=lambda line: None)
    out = tmp_path / "winner"
    out.mkdir()
    (out / "sharding_plan.json").write_text("{}")  # an earlier export's
    args = ["export", str(write_config(tmp_path, config)), "--out", str(out), "--force"]
    assert main(args) == 0
    assert not (out / "sharding_plan.json").exists()
    assert "Training step" not in (out / "model_card.md").read_text()


@pytest.mark.parametrize("out", ["", "a-file/links.json"])
def test_links_refuses_an_unwritable_out_before_measuring(tmp_path, capsys, out):
    (tmp_path / "a-file").write_text("")
    assert main(["shard", "links", "--processes", "2", "--out", str(tmp_path / out)]) == 2
    error = capsys.readouterr().err
    assert error.startswith("error: --out ") and "Traceback" not in error
    if out:
        assert f"{tmp_path / 'a-file'} is a file, not a folder" in error


def test_links_refuses_more_processes_than_cores(tmp_path, capsys):
    """64 processes on 2 cores timed their sharing of the cores, and took the machine."""
    import os

    cores = os.cpu_count() or 1
    argv = ["shard", "links", "--processes", str(cores + 1), "--out", str(tmp_path / "l.json")]
    assert main(argv) == 2
    assert f"give at most {cores}" in capsys.readouterr().err


@pytest.mark.slow  # 27 s (two gloo processes timed); `make test-all` runs it
def test_measured_links_and_the_runtime_cost_enter_the_prediction(tmp_path):
    """`ranknas shard links` measures this machine's collectives and the sharded runtime's
    own cost a step (a probe model trained as a sharded trial trains); a study's
    `sharding.links` then predicts a step as this machine runs it. `--out`'s folder need
    not exist."""
    links = tmp_path / "not-yet" / "links.json"
    assert main(["shard", "links", "--processes", "2", "--out", str(links)]) == 0
    measured = json.loads(links.read_text())
    assert measured["all_to_all_latency_ms"] > 0 and measured["all_to_all_bytes_per_ms"] > 0
    # gloo's sharded step carries milliseconds of its own on CPU (4-7 ms on the 2-core VM)
    small, large, wide = measured["probes"]
    assert [p["runs"] for p in measured["probes"]] == [2, 2, 2]  # mirrored, then averaged
    assert set(small) == {"probe", "runs", "measured_step_ms", "predicted_step_ms",
                          "dense_alone_ms", "pooled_mb", "left_out_ms"}  # fmt: skip
    assert small["measured_step_ms"] > small["predicted_step_ms"]
    assert large["dense_alone_ms"] > small["dense_alone_ms"]
    assert wide["pooled_mb"] == pytest.approx(64 * small["pooled_mb"]) and wide["pooled_mb"] > 1
    slowdown, per_mb = measured["dense_factor"] - 1, measured["ms_per_pooled_mb"]
    assert per_mb >= 0
    assert measured["runtime_ms"] == pytest.approx(max(0.0, small["left_out_ms"] - slowdown
                                                       * small["dense_alone_ms"] - per_mb
                                                       * small["pooled_mb"]))  # fmt: skip
    cluster = topology(2, links=str(links))
    assert cluster.intra_host_latency_ms == measured["all_to_all_latency_ms"]
    arch = load_architecture("dlrm", SCHEMA)

    def step(cluster, runtime_ms=0.0, ms_per_pooled_mb=0.0) -> dict:
        return predict_step(arch, cluster, "size_lookup_greedy", "none", 512, dense_ms=1.0,
                            dense_params=10_000, runtime_ms=runtime_ms,
                            ms_per_pooled_mb=ms_per_pooled_mb)  # fmt: skip

    with_constants, with_links = step(topology(2)), step(cluster, 7.5, ms_per_pooled_mb=2.0)
    assert with_links["all_to_all_ms"] > with_constants["all_to_all_ms"]  # loopback is slower
    assert with_links["allreduce_ms"] > with_constants["allreduce_ms"]
    parts = ("dense_ms", "allreduce_ms", "embedding_ms", "all_to_all_ms", "runtime_ms",
             "pooled_ms")  # fmt: skip
    assert with_links["runtime_ms"] == 7.5
    # each device takes 512 rows of every feature's pooled vector (dlrm: dim 16, fp32)
    pooled = 512 * 16 * 4 * len(SCHEMA.categorical) / 1e6
    assert with_links["pooled_ms"] == pytest.approx(2.0 * pooled)
    assert with_links["step_ms"] == pytest.approx(sum(with_links[k] for k in parts))
    for text in ("{}", "[1, 2]", json.dumps({"all_to_all_latency_ms": 0.2})):
        (tmp_path / "bad.json").write_text(text)
        with pytest.raises(RanknasError, match=r"not a file of `ranknas shard links` \(no "
                                               r".*all_to_all_bytes_per_ms"):  # fmt: skip
            topology(2, links=str(tmp_path / "bad.json"))
    # values no measurement gives, a string or a boolean that looks like a number among them
    for key, value, bound in [("ms_per_pooled_mb", -3, "0 or more"),
                              ("all_to_all_bytes_per_ms", 0, "above 0"),
                              ("runtime_ms", float("nan"), "0 or more"),
                              ("dense_factor", "4.0", "above 0"),
                              ("all_to_all_latency_ms", True, "0 or more"),
                              ("ms_per_pooled_mb", None, "0 or more")]:  # fmt: skip
        (tmp_path / "bad.json").write_text(json.dumps(measured | {key: value}))
        with pytest.raises(
            RanknasError,
            match=re.escape(f"{key} is {json.dumps(value)}; a measured one is a number {bound}"),
        ):
            topology(2, links=str(tmp_path / "bad.json"))


def test_a_noisy_latency_does_not_make_a_bandwidth_up():
    """Where the tiny buffer's median came out as slow as the 4 MB one's, the bandwidth is
    the large buffer's at half its time, not bytes over a difference of about nothing."""
    from cost_models.sharding.links import _transfer_ms

    assert _transfer_ms(0.2, 1.8) == pytest.approx(1.6)
    assert _transfer_ms(2.0, 1.9) == pytest.approx(0.95)
    assert _transfer_ms(1.0, 1.0) == pytest.approx(0.5)


def test_a_study_adds_the_runtime_cost_its_links_file_measured(tmp_path):
    """`sharding.runtime_ms` defaults to the links file's; a number in the config wins, and
    a file measured before the runtime was (no `runtime_ms`) adds none; the file's
    `dense_factor` scales the dense part. A sharded study's devices each take its batch
    split over the processes."""
    links = {"all_to_all_latency_ms": 0.2, "all_to_all_bytes_per_ms": 1e6}
    (tmp_path / "old.json").write_text(json.dumps(links))
    (tmp_path / "new.json").write_text(json.dumps(links | {"runtime_ms": 6.5}))
    (tmp_path / "slow.json").write_text(json.dumps(links | {"dense_factor": 2.0}))
    (tmp_path / "wide.json").write_text(json.dumps(links | {"ms_per_pooled_mb": 3.0}))
    arch = load_architecture("dlrm", SCHEMA)

    def step(links: str, **sharding) -> dict:
        config = tiny_config(tmp_path, "x", objectives={"cost": "step_ms"},
                             sharding={"devices": 2, "links": str(tmp_path / links), **sharding},
                             training={"batch_size": 256, "processes": 2})  # fmt: skip
        return architecture_costs(arch, parse_config(config)).step

    assert step("new.json")["runtime_ms"] == 6.5 and step("new.json")["dense_factor"] == 1.0
    assert step("new.json", runtime_ms=1.0)["runtime_ms"] == 1.0
    (tmp_path / "negative.json").write_text(json.dumps(links | {"ms_per_pooled_mb": -1}))
    config = tiny_config(
        tmp_path,
        "refused",
        objectives={"cost": "step_ms"},
        sharding={"devices": 2, "links": str(tmp_path / "negative.json")},
    )
    with pytest.raises(RanknasError, match="ms_per_pooled_mb is -1; a measured one"):
        run_study(parse_config(config), progress=lambda line: None)
    assert "refused" not in optuna.get_all_study_names(config["storage"])  # before it exists
    told = []
    _check_links(str(tmp_path / "old.json"), None, told.append)
    assert len(told) == 1 and "has no runtime_ms, dense_factor, ms_per_pooled_mb" in told[0]
    _check_links(str(tmp_path / "old.json"), 1.0, told.append)  # runtime_ms given: not missed
    assert "has no dense_factor, ms_per_pooled_mb" in told[1]
    complete = json.loads((tmp_path / "new.json").read_text()) | {
        "dense_factor": 1.5,
        "ms_per_pooled_mb": 2.0,
    }
    (tmp_path / "complete.json").write_text(json.dumps(complete))
    _check_links(str(tmp_path / "complete.json"), None, told.append)
    assert len(told) == 2
    assert step("old.json")["runtime_ms"] == 0.0 == step("old.json")["pooled_ms"]
    pooled_mb = 128 * 16 * 4 * len(SCHEMA.categorical) / 1e6  # a device's rows, dim 16, fp32
    assert step("wide.json")["pooled_ms"] == pytest.approx(3.0 * pooled_mb)
    slow = step("slow.json")
    assert slow["dense_ms"] == pytest.approx(2 * slow["dense_alone_ms"])
    assert step("new.json")["batch_per_device"] == 128


def test_a_study_plans_with_rl_as_shard_plan_does_and_refuses_a_missing_model(
    tmp_path, monkeypatch
):
    """`sharding.method: rl` failed on a fresh clone ("no readable sharding policy" in the
    default folder) where `ranknas shard plan` used the model shipped with ranknas; a
    mistyped `model_dir` planned silently with the shipped model."""
    monkeypatch.chdir(tmp_path)  # no runs/sharding/model here
    arch = load_architecture("dlrm", SCHEMA)
    config = tiny_config(tmp_path, "x", objectives={"cost": "step_ms"},
                         sharding={"devices": 4, "method": "rl"})  # fmt: skip
    step = architecture_costs(arch, parse_config(config)).step
    assert step["step_ms"] > 0 and step["plan"]["method"] == "rl"
    assert step["cost_model"].startswith("the sharding cost model shipped")  # not its path
    config["sharding"]["model_dir"] = str(tmp_path / "mistyped")
    with pytest.raises(RanknasError, match=r"sharding: model_dir: .*mistyped is not a folder"):
        parse_config(config)


def test_a_predicted_dense_part_makes_the_step_the_same_in_every_study(tmp_path, capsys):
    """`sharding.dense_model` (`ranknas latency fit --target dense_step_ms`) predicts a
    step's dense part: a model's step is then the same number in every study, not a timing
    that moves with the machine's load; a predictor of another target is refused before
    the study exists."""
    space_file = write_config(tmp_path, {"name": "space", "search_space": AROUND_DLRM})
    model = tmp_path / "dense.json"
    fit = ["latency", "fit", str(space_file), "--archs", "6", "--batch-size", "128",
           "--repeats", "1", "--out", str(model)]  # fmt: skip
    assert main([*fit, "--target", "dense_step_ms"]) == 0
    assert "the dense part's training step, held out 2 of 6" in capsys.readouterr().out
    assert json.loads(model.read_text())["target"] == "dense_step_ms"

    def study(name: str, dense_model: Path) -> dict:
        config = _held_to_dlrm(tmp_path, name, trials=2)
        return config | {"sharding": config["sharding"] | {"dense_model": str(dense_model)}}

    first = run_study(parse_config(study("first", model)), progress=lambda line: None)
    second = run_study(parse_config(study("second", model)), progress=lambda line: None)
    assert first.user_attrs["step_ms_ceiling"] == second.user_attrs["step_ms_ceiling"]
    predictor = LatencyPredictor.load(model)
    for t in (t for t in first.trials if t.state == TrialState.COMPLETE):
        directory = tmp_path / "first/trials" / str(t.number)
        step = json.loads((directory / STEP_FILE).read_text())
        arch = Architecture.load(directory / "architecture.json")
        assert step["dense_ms"] == pytest.approx(float(predictor.predict([arch])[0]))
        assert step["dense_source"].startswith(f"predicted by {model}")

    forward = tmp_path / "forward.json"
    assert main([*fit, "--out", str(forward)]) == 0
    config_file = write_config(tmp_path, study("wrong", forward))
    assert main(["search", str(config_file)]) == 2
    err = capsys.readouterr().err
    assert "sharding.dense_model" in err and "predicts forward_ms" in err
    assert "--target dense_step_ms" in err and "Traceback" not in err
    with pytest.raises(RanknasError, match=r"sharding.dense_model .* needs objectives.cost"):
        parse_config(tiny_config(tmp_path, "x", sharding={"devices": 2, "dense_model": str(model)}))


def test_a_candidate_s_dense_part_is_timed_in_turn_with_the_ceiling_s_model(tmp_path):
    """With `max_step_ms: base` (or best_baseline) the ceiling's model is timed again beside
    each candidate, and the candidate's dense part is the ceiling's time scaled by their
    ratio: the load of the machine between the two timings no longer moves the comparison."""
    config = _held_to_dlrm(tmp_path, "paired", trials=3)
    lines = []
    study = run_study(parse_config(config), progress=lines.append)
    trained = [line for line in lines if line.startswith("[") and "complete" in line]
    assert trained and all(
        re.search(r"MFLOPs and \d+\.\d{3} ms a step \(predicted\)", t) for t in trained
    )
    ceiling = study.user_attrs["step_ms_ceiling"]
    base = load_architecture("dlrm", SCHEMA)
    assert ceiling["of"] == "base dlrm" and ceiling["dense_ms"] > 0
    assert Architecture.from_dict(ceiling["architecture"]).to_dict() == base.to_dict()
    finished = [t for t in study.trials if TrialAttr.DIR in t.user_attrs]
    assert finished
    for t in finished:
        step = json.loads((Path(t.user_attrs[TrialAttr.DIR]) / STEP_FILE).read_text())
        arch = Architecture.load(Path(t.user_attrs[TrialAttr.DIR]) / "architecture.json")
        source = step["dense_source"]
        if arch.to_dict() == base.to_dict():
            assert step["dense_ms"] == ceiling["dense_ms"] and "the same model" in source
            continue
        assert source.startswith("timed in turn with base dlrm")
        ratio = float(source.split(": ")[1].split("x")[0])
        assert step["dense_ms"] == pytest.approx(ceiling["dense_ms"] * ratio, rel=1e-3)


def test_a_step_ceiling_keeps_its_model_s_dense_part_alone():
    """A links file's dense_factor slows a candidate's dense part once: the ceiling keeps
    its model's time alone, not the slowed one (else every candidate paid it twice)."""
    from nas.runner import _dense_part

    arch = load_architecture("dlrm", SCHEMA)
    step = {"dense_ms": 3.8, "dense_alone_ms": 2.0, "dense_factor": 1.9}
    assert _dense_part(arch, step)["dense_ms"] == 2.0
    assert _dense_part(arch, {"dense_ms": 2.5})["dense_ms"] == 2.5  # a step recorded before


def test_a_baseline_s_line_names_its_predicted_step():
    from nas.baselines import _line

    attrs = {"status": "complete", "val_ne": 0.9, "mflops": 0.068}
    assert _line("dlrm", attrs).endswith("validation NE 0.9000, 0.068 MFLOPs")
    stepped = _line("dlrm", attrs | {"step_ms": 7.28})
    assert stepped.endswith("0.068 MFLOPs and 7.280 ms a step (predicted)")


def test_the_card_sets_a_sharded_run_s_measured_step_beside_the_prediction():
    from nas.export.model_card import _step_section

    step = {"dense_ms": 4.0, "allreduce_ms": 0.5, "busiest_device": 1, "embedding_ms": 0.2,
            "all_to_all_ms": 1.0, "runtime_ms": 8.0, "pooled_ms": 1.3, "step_ms": 15.0,
            "devices": 2, "hosts": 1, "batch_per_device": 256, "sharder": "rl",
            "cost_model": "packaged"}  # fmt: skip
    assert "Measured in" not in _step_section(step, {"val_ne": 0.9})
    measured = {"measured_step_ms": 18.0, "rank0_step_ms": 17.0, "rank1_step_ms": 18.0}
    assert ("18.000 ms a step, the slowest of 2 processes on the machine that trained it "
            "(1.20x the prediction above)") in _step_section(step, measured)  # fmt: skip
    elsewhere = _step_section(step | {"devices": 16, "hosts": 2}, measured)
    assert "(the prediction above is for 16 devices)" in elsewhere


def test_the_parent_run_s_metrics_hold_the_best_trial_s_predicted_step():
    from optuna.distributions import FloatDistribution
    from optuna.trial import create_trial

    from nas.commands import best_fields

    study = optuna.create_study()
    attrs = {"val_ne": 0.9, "test_ne": 0.91, "mflops": 0.5, "digest": "d", "step_ms": 7.5}
    study.add_trial(create_trial(values=[0.9], params={"x": 0.1}, user_attrs=attrs,
                                 distributions={"x": FloatDistribution(0, 1)}))  # fmt: skip
    metrics, _ = best_fields(study)
    assert metrics["best_step_ms"] == 7.5 and metrics["best_mflops"] == 0.5
