"""One-shot supernet and DNAS: exact extraction, expected FLOPs, the FLOPs penalty, and both
searchers through the study runner."""

from __future__ import annotations

import random
from dataclasses import replace

import optuna
import pytest
import torch

from nas.config import parse_config
from nas.oneshot.dnas import ArchitectureDistribution, expected_flops, train_dnas
from nas.oneshot.search import Scorer, evolution_search, reinforce_search
from nas.oneshot.supernet import Supernet, sample_arch, train_supernet, warmup_probability
from nas.runner import run_study
from search_space.architecture import analyze
from search_space.builder import build_model
from search_space.errors import RanknasError
from search_space.space_configs import DagConfig
from search_space.spaces import make_space
from search_space.spaces.dag import NONE
from study_helpers import tiny_config
from trainers.data.synthetic import SyntheticConfig, generate_synthetic


@pytest.fixture(autouse=True)
def _one_thread():
    """Tiny models on a shared 2-core machine: one intra-op thread is far faster."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture(scope="module")
def data():
    full = generate_synthetic(SyntheticConfig(rows=3000, seed=0))
    train, valid, _ = full.split((0.7, 0.2, 0.1), seed=0)
    return train, valid


def _space(schema, **overrides):
    settings = {"num_blocks": 3, "widths": [8, 16], "counts": [2, 4], "embedding_dims": [4, 8]}
    return make_space(DagConfig(**(settings | overrides)), schema)


def _dotted(data):
    """`data` with its columns named as logs name them (`c.0`, `c/1`): module names escape
    them (a '.' once crashed the extraction of a feature of its own dim)."""
    schema = data.schema
    names = [f"c.{i}" if i % 2 else f"c/{i}" for i in range(len(schema.categorical))]
    features = tuple(replace(f, name=n) for f, n in zip(schema.categorical, names, strict=True))
    return replace(data, schema=replace(schema, categorical=features))


@pytest.mark.parametrize(
    ("overrides", "sliced", "dotted"),
    [({}, True, False), ({"max_inputs": 3, "feature_dims": [4, 8], "num_blocks": 4}, True, False),
     ({}, False, False), ({"feature_dims": [4, 8]}, True, True)],
    ids=["default", "three-inputs-feature-dims", "per-shape-modules", "dotted-names"],
)  # fmt: skip
def test_extracted_architecture_matches_standalone_exactly(data, overrides, sliced, dotted):
    train, _ = data
    train = _dotted(train) if dotted else train
    space = _space(train.schema, **overrides)
    supernet = Supernet(space, seed=0, share_across_shapes=sliced)
    train_supernet(supernet, train, steps=30, batch_size=64, seed=0)
    batch = next(iter(train.loader(64)))
    rng = random.Random(1)
    supernet.eval()
    for i in range(12):
        _, arch = sample_arch(space, rng, "nasrec" if i % 2 else "spos", full=i % 3 == 0)
        model = build_model(arch, seed=123)
        model.load_state_dict(supernet.extract(arch), strict=True)
        model.eval()
        with torch.no_grad():
            expected = model(batch.dense, batch.sparse)
            got = supernet(arch, batch.dense, batch.sparse)
        assert torch.equal(got, expected), f"architecture {i} differs"


def test_paths_share_modules_and_training_changes_them(data):
    train, _ = data
    space = _space(train.schema)
    supernet = Supernet(space)
    rng = random.Random(0)
    values, _ = sample_arch(space, rng, "spos")
    values |= {"b0.op": "mlp", "b0.width": 8, "b0.in1": "dense", "b0.in2": NONE}
    a = space.decode(values)
    b = space.decode(values | {"b2.op": "fm", "b2.in1": "sparse", "b2.in2": "b0"})
    pa, pb = supernet.path(a), supernet.path(b)
    assert pa.slots["blocks.b0"] == pb.slots["blocks.b0"]
    before = supernet.extract(a)["blocks.b0.layers.0.weight"]
    train_supernet(supernet, train, steps=5, batch_size=64, seed=0, sampling="spos")
    supernet.path(a)
    optimizer_step_changed = not torch.equal(
        before, supernet.extract(a)["blocks.b0.layers.0.weight"]
    )
    assert optimizer_step_changed or len(supernet.blocks) > 1


def _two_widths(space):
    """Two architectures whose block b1 runs the same mlp on inputs of widths 8 and 16."""
    values, _ = sample_arch(space, random.Random(0), "spos")
    values |= {"b0.op": "mlp", "b0.width": 16, "b0.in1": "dense", "b0.in2": NONE}
    values |= {"b1.op": "mlp", "b1.width": 8, "b1.in2": NONE}
    values |= {"b2.op": "mlp", "b2.in1": "b1", "b2.in2": NONE}
    return space.decode(values | {"b1.in1": "dense"}), space.decode(values | {"b1.in1": "b0"})


def test_block_weights_are_shared_across_input_shapes(data):
    train, _ = data
    space = _space(train.schema)
    narrow, wide = _two_widths(space)
    supernet = Supernet(space, seed=0)
    assert (
        supernet.path(narrow).slots["blocks.b1"][:2] == supernet.path(wide).slots["blocks.b1"][:2]
    )
    shared = supernet.extract(wide)["blocks.b1.layers.0.weight"]
    assert shared.shape == (8, 16)
    assert torch.equal(supernet.extract(narrow)["blocks.b1.layers.0.weight"], shared[:, :8])
    per_shape = Supernet(space, seed=0, share_across_shapes=False)
    assert per_shape.path(narrow).slots["blocks.b1"] != per_shape.path(wide).slots["blocks.b1"]


def test_optimizer_follows_a_parameter_that_grows(data):
    from nas.oneshot.supernet import SupernetOptimizer

    train, _ = data
    space = _space(train.schema)
    narrow, wide = _two_widths(space)
    supernet = Supernet(space, seed=0)
    optimizer = SupernetOptimizer(supernet, dense_lr=0.01, sparse_lr=0.05, max_grad_norm=1.0)
    batch = next(iter(train.loader(64)))
    for arch in (narrow, wide, narrow):
        path = supernet.path(arch)
        optimizer.refresh()
        before = supernet.extract(narrow)["blocks.b1.layers.0.weight"]
        loss = torch.nn.functional.binary_cross_entropy_with_logits(
            supernet(path, batch.dense, batch.sparse), batch.labels
        )
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        assert not torch.equal(before, supernet.extract(narrow)["blocks.b1.layers.0.weight"])
    held = {id(p) for g in optimizer.dense.param_groups for p in g["params"]}
    dense = [p for n, p in supernet.named_parameters() if not n.startswith("embeddings.")]
    assert held == {id(p) for p in dense}
    for p in dense:
        assert optimizer.dense.state[p]["exp_avg"].shape == p.shape


def test_cosine_lr_decays_to_zero():
    from nas.oneshot.supernet import lr_factor

    assert lr_factor(0, 100, "cosine") == 1.0
    assert lr_factor(50, 100, "cosine") == pytest.approx(0.5)
    assert lr_factor(100, 100, "cosine") == pytest.approx(0.0)
    assert lr_factor(70, 100, "constant") == 1.0


def test_warmup_probability_decays_to_zero():
    probs = [warmup_probability(s, 100, 0.2) for s in range(0, 100, 10)]
    assert probs[0] == 1.0 and probs[1] == pytest.approx(0.5) and probs[2:] == [0.0] * 8
    assert warmup_probability(0, 100, 0.0) == 0.0


def test_full_sampling_connects_every_slot(data):
    space = _space(data[0].schema, max_inputs=2)
    values, _ = sample_arch(space, random.Random(3), "nasrec", full=True)
    assert all(values[f"b{i}.in2"] != NONE for i in range(3))


@pytest.mark.parametrize("overrides", [{}, {"max_inputs": 3, "feature_dims": [4, 8]}])
def test_dnas_expected_flops_equals_analytic_when_one_hot(data, overrides):
    space = _space(data[0].schema, num_blocks=4, **overrides)
    params = space.parameters()
    rng = random.Random(0)
    dist = ArchitectureDistribution(space)  # its FLOPs tables are cached across draws
    for _ in range(5):
        values, arch = sample_arch(space, rng, "spos")
        probs = {
            name: torch.tensor([float(c == values[name]) for c in p.choices], dtype=torch.float64)
            for name, p in params.items()
        }
        assert float(expected_flops(space, probs)) == analyze(arch).flops
        # and through the logits: a very peaked softmax is one-hot in float64
        with torch.no_grad():
            for name, logits in dist.logits.items():
                logits.copy_(probs[name] * 1e4)
            assert float(dist.expected_flops()) == analyze(arch).flops
        assert analyze(dist.derive()).flops == analyze(arch).flops


def test_dnas_flops_penalty_moves_architecture_toward_budget(data):
    train, valid = data
    space = _space(train.schema, widths=[8, 64], counts=[2, 16], embedding_dims=[4, 16])
    derived = {}
    for weight in (0.0, 20.0):
        dist = ArchitectureDistribution(space)
        log = train_dnas(
            dist,
            Supernet(space, seed=0),
            train,
            valid,
            steps=50,
            batch_size=128,
            warmup_fraction=0.2,
            arch_lr=0.05,
            target_mflops=0.001,
            cost_weight=weight,
            seed=0,
        )
        assert log and all(entry["tau"] <= 5.0 for entry in log)
        assert log[-1]["tau"] == pytest.approx(0.5)
        derived[weight] = (analyze(dist.derive()).flops, log[-1]["expected_mflops"])
    assert derived[20.0][0] < derived[0.0][0]
    assert derived[20.0][1] < derived[0.0][1]


def _small_scorer(data) -> Scorer:
    """A scorer over a 2-block supernet trained 20 steps (2 fine-tune steps of 128)."""
    train, valid = data
    supernet = Supernet(_space(train.schema, num_blocks=2))
    train_supernet(supernet, train, steps=20, batch_size=128)
    return Scorer(
        supernet, valid, finetune_data=train, finetune_steps=2, batch_size=128, score_rows=400
    )


@pytest.mark.parametrize("method", ["evolution", "reinforce"])
def test_oneshot_search_scores_with_inherited_weights(data, method):
    scorer = _small_scorer(data)
    space = scorer.supernet.space
    if method == "evolution":
        ranked = evolution_search(scorer, candidates=8, population=4, sample_size=2)
    else:
        ranked = reinforce_search(scorer, candidates=8)
    assert len(ranked) >= 8
    assert [c.fitness for c in ranked] == sorted(c.fitness for c in ranked)
    assert len({c.digest for c in ranked}) == len(ranked)
    assert scorer.examples == 2 * 128 * len(scorer.cache)
    best = ranked[0]
    assert 0 < best.ne < 2 and best.mflops == analyze(space.decode(best.values)).flops / 1e6


def test_refine_rescores_the_best_after_a_longer_fine_tune(data):
    scorer = _small_scorer(data)
    space = scorer.supernet.space
    ranked = evolution_search(scorer, candidates=8, population=4, sample_size=2)
    before = scorer.examples
    refined = scorer.refine(ranked, count=3, steps=12)
    assert scorer.examples == before + 3 * 12 * 128
    head, tail = refined[:3], refined[3:]
    assert {c.digest for c in head} == {c.digest for c in ranked[:3]}
    assert [c.fitness for c in head] == sorted(c.fitness for c in head)
    assert tail == ranked[3:]
    coarse = {c.digest: c.ne for c in ranked[:3]}
    for c in head:
        assert c.coarse_ne == coarse[c.digest]
        arch = space.decode(c.values)
        assert c.ne == pytest.approx(scorer.inherited_ne(arch, 12))  # deterministic rescoring
    assert any(c.ne != c.coarse_ne for c in head)


def test_cost_aware_fitness():
    from nas.oneshot.search import fitness

    assert fitness(0.8, 2.0, None, 1.0) == 0.8
    assert fitness(0.8, 2.0, 1.0, 0.5) == pytest.approx(1.3)
    assert fitness(0.8, 0.5, 1.0, 0.5) == pytest.approx(1.05)
    # as a ceiling: no reward for costing less than the target
    assert fitness(0.8, 0.5, 1.0, 0.5, "above") == 0.8
    assert fitness(0.8, 2.0, 1.0, 0.5, "above") == pytest.approx(1.3)


def test_dnas_ceiling_penalty_is_zero_below_the_target(data):
    from nas.oneshot.dnas import _penalty

    dist = ArchitectureDistribution(_space(data[0].schema))
    with torch.no_grad():
        mflops = float(dist.expected_flops()) / 1e6
        assert float(_penalty(dist, 2 * mflops, 1.0, "above")) == 0.0
        assert float(_penalty(dist, 2 * mflops, 1.0, "absolute")) == pytest.approx(0.5)
        assert float(_penalty(dist, mflops / 2, 1.0, "above")) == pytest.approx(1.0)


def test_config_validation(tmp_path):
    base = tiny_config(tmp_path, "v")
    parse_config(base | {"searcher": {"type": "oneshot"}})
    with pytest.raises(RanknasError, match="target_mflops"):
        parse_config(base | {"searcher": {"type": "dnas", "cost_weight": 1.0}})
    wukong = base | {"searcher": {"type": "oneshot"}, "search_space": {"type": "wukong"}}
    with pytest.raises(RanknasError, match="dag"):
        parse_config(wukong)


@pytest.mark.parametrize("kind", ["oneshot", "dnas"])
def test_study_runs_phase_once_and_trains_candidates_as_trials(tmp_path, kind):
    searcher = {
        "type": kind,
        "top_k": 2,
        "supernet_steps": 30,
        "search_candidates": 6,
        "population": 4,
        "sample_size": 2,
        "finetune_steps": 2,
        "finetune_batch_size": 32,
        "score_rows": 300,
        "oneshot_search": "reinforce" if kind == "oneshot" else "evolution",
        "target_mflops": 0.01,
        "cost_weight": 0.1,
    }
    config = parse_config(tiny_config(tmp_path, f"t-{kind}", searcher=searcher))
    lines: list[str] = []
    study = run_study(config, progress=lines.append)
    trials = study.get_trials(deepcopy=False)
    assert [t.state for t in trials] == [optuna.trial.TrialState.COMPLETE] * 3
    proposed = [t for t in trials if t.user_attrs["proposed_by"].startswith(kind)]
    assert [t.user_attrs["proposal_rank"] for t in proposed] == [0, 1]
    assert [t.number for t in proposed] == [0, 1]
    # the third trial of the budget: random sampling, said so (it looked like a candidate)
    assert [t.user_attrs["proposed_by"] for t in trials] == [f"{kind} #1", f"{kind} #2", "random"]
    from nas.leaderboard import format_table, rows

    assert format_table(rows(study)).splitlines()[0].split()[-2:] == ["proposed", "by"]
    phase = study.user_attrs[f"{kind}_phase"]
    assert [c["digest"] for c in phase["candidates"]] == [t.user_attrs["digest"] for t in proposed]
    if kind == "oneshot":  # supernet batches, then 2 fine-tune batches of 32 per candidate
        assert phase["examples"] == 30 * 128 + 2 * 32 * phase["scored"]
    else:  # weight batches, then validation batches after the 25% warm-up
        assert phase["examples"] == (30 + 30 - int(0.25 * 30)) * 128
    assert any(
        line.startswith(f"{kind}: enqueued 2")
        and line.endswith("; the other 1 trials of the budget sample the space at random")
        for line in lines
    )
    assert any(f"{kind}: " in line and "step" in line for line in lines)
    # resuming a finished study runs neither the phase nor any trial
    config.budget.trials = 3
    again: list[str] = []
    study = run_study(config, progress=again.append)
    assert len(study.get_trials(deepcopy=False)) == 3
    assert [line for line in again if not line.startswith("data: ")] == []


def test_dnas_rescore_scores_the_most_probable_with_inherited_weights(tmp_path):
    searcher = {
        "type": "dnas",
        "top_k": 2,
        "supernet_steps": 30,
        "dnas_rescore": 4,
        "finetune_steps": 2,
        "finetune_batch_size": 32,
        "score_rows": 300,
        "refine_candidates": 8,  # more than were scored: the 4 are rescored
        "refine_steps": 3,
    }
    config = parse_config(tiny_config(tmp_path, "t-rescore", searcher=searcher))
    lines: list[str] = []
    study = run_study(config, progress=lines.append)
    phase = study.user_attrs["dnas_phase"]
    dnas_batches = (30 + 30 - int(0.25 * 30)) * 128
    assert phase["examples"] == dnas_batches + 4 * 2 * 32 + 4 * 3 * 32
    candidates = phase["candidates"]
    assert len(candidates) == 2
    assert all(0 < c["inherited_ne"] < 3 and "coarse_ne" in c for c in candidates)
    assert candidates[0]["fitness"] <= candidates[1]["fitness"]
    assert any(line.startswith("dnas: scored the 4 most probable") for line in lines)
    assert any(line.startswith("dnas: rescoring the best 4 after 3") for line in lines)
    assert any(line.startswith("dnas: best after rescoring") for line in lines)


def test_a_trial_is_named_by_the_candidate_it_trains_not_by_its_queue_slot(tmp_path):
    """A retry of candidate #1 takes the oldest queued trial, candidate #2's, whose own
    attributes named #2: the label is looked up by the architecture's digest."""
    from nas.oneshot.phase import phase_attr, proposed_by

    study = optuna.create_study(storage=f"sqlite:///{tmp_path / 's.db'}", study_name="p")
    study.set_user_attr(phase_attr("dnas"), {"candidates": [{"digest": "a"}, {"digest": "b"}]})
    assert [proposed_by(study, "dnas", d) for d in ("b", "a", "z")] == ["dnas #2", "dnas #1",
                                                                         "random"]  # fmt: skip


@pytest.mark.parametrize("kind", ["oneshot", "dnas"])
def test_the_phase_enqueues_only_candidates_within_the_studys_constraints(tmp_path, kind):
    """With objectives.max_mflops the phase enqueued its best candidates whatever they
    cost: those over the ceiling were skipped untrained, and random points took their
    places in the budget."""
    searcher = {"type": kind, "top_k": 2, "supernet_steps": 20, "search_candidates": 8,
                "population": 4, "sample_size": 2, "finetune_steps": 1,
                "finetune_batch_size": 32, "score_rows": 300}  # fmt: skip
    free = run_study(parse_config(tiny_config(tmp_path, f"free-{kind}", searcher=searcher)),
                     progress=lambda line: None)  # fmt: skip
    costs = [c["mflops"] for c in free.user_attrs[f"{kind}_phase"]["candidates"]]
    ceiling = max(costs) * 0.999  # the unconstrained phase's costliest pick is over it
    config = tiny_config(tmp_path, f"held-{kind}", searcher=searcher,
                         objectives={"max_mflops": ceiling})  # fmt: skip
    lines: list[str] = []
    study = run_study(parse_config(config), progress=lines.append)
    candidates = study.user_attrs[f"{kind}_phase"]["candidates"]
    assert len(candidates) == 2 and all(c["mflops"] <= ceiling for c in candidates)
    assert any(line.startswith(f"{kind}: passed over ") for line in lines), lines
    proposed = [t for t in study.trials if t.user_attrs["proposed_by"].startswith(kind)]
    assert [t.state for t in proposed] == [optuna.trial.TrialState.COMPLETE] * 2
