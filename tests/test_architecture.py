"""The Architecture spec: JSON round trip, canonical form and digest, validation messages,
and the builder (embedding dims per feature, dense-to-sparse merges)."""

import json
import re

import pytest

from helpers import check_costs_and_training_step
from search_space.architecture import Architecture, analyze, canonical, digest
from search_space.builder import build_model, example_batch
from search_space.errors import SpecError
from search_space.presets import PRESETS, load_architecture, preset


def spec(blocks, output=None, **embedding):
    data = {"embedding": {"dim": 4, **embedding}, "blocks": blocks}
    if output:
        data["output"] = output
    return data


DLRM_LIKE = [
    {"name": "bottom", "op": "mlp", "inputs": ["dense"], "params": {"widths": [8, 4]}},
    {"name": "inter", "op": "dot", "inputs": ["sparse", "bottom"]},
    {"name": "top", "op": "mlp", "inputs": ["bottom", "inter"], "params": {"widths": [8]}},
]


def bound(data, schema):
    return Architecture.from_dict(data).bind(schema)


@pytest.mark.parametrize("name", list(PRESETS))
def test_presets_round_trip_through_json(name, small_schema):
    arch = preset(name, small_schema)
    again = Architecture.from_json(arch.to_json())
    assert again.to_dict() == arch.to_dict()
    assert digest(again) == digest(arch)
    check_costs_and_training_step(arch)


def test_digest_ignores_names_order_defaults_and_dead_blocks(small_schema):
    base = bound(spec(DLRM_LIKE), small_schema)
    renamed = json.loads(json.dumps(spec(DLRM_LIKE)).replace("bottom", "bot").replace("inter", "x"))
    reordered = spec([DLRM_LIKE[1], DLRM_LIKE[0], DLRM_LIKE[2]], output="top")
    explicit = json.loads(json.dumps(spec(DLRM_LIKE)))
    explicit["blocks"][1]["params"] = {"self_interaction": False}
    explicit["blocks"][2]["inputs"] = ["inter", "bottom"]  # concatenation order
    dead = spec([*DLRM_LIKE, {"name": "unused", "op": "fm", "inputs": ["sparse"]}], output="top")
    labelled = spec(DLRM_LIKE) | {"name": "my-model"}
    for variant in (renamed, reordered, explicit, dead, labelled):
        assert digest(bound(variant, small_schema)) == digest(base)
    assert canonical(bound(dead, small_schema)).to_dict() == canonical(base).to_dict()


def test_digest_changes_with_the_network(small_schema):
    base = digest(bound(spec(DLRM_LIKE), small_schema))
    wider = json.loads(json.dumps(spec(DLRM_LIKE)))
    wider["blocks"][2]["params"]["widths"] = [16]
    assert digest(bound(wider, small_schema)) != base
    assert digest(bound(spec(DLRM_LIKE) | {"embedding": {"dim": 8}}, small_schema)) != base


def test_gating_input_order_matters_for_the_digest(small_schema):
    def gate(order):
        return spec(
            [
                {"name": "a", "op": "mlp", "inputs": ["dense"], "params": {"widths": [3]}},
                {"name": "b", "op": "mlp", "inputs": ["dense"], "params": {"widths": [5]}},
                {"name": "g", "op": "gating", "inputs": order},
            ]
        )

    assert digest(bound(gate(["a", "b"]), small_schema)) != digest(
        bound(gate(["b", "a"]), small_schema)
    )


def _error(data, schema) -> str:
    with pytest.raises(SpecError) as info:
        analyze(bound(data, schema))
    return str(info.value)


@pytest.mark.parametrize(
    ("blocks", "expected"),
    [
        ([{"name": "a", "op": "mlpp", "inputs": ["dense"]}], "block 'a': unknown op 'mlpp'"),
        (
            [{"name": "a", "op": "mlp", "inputs": ["nowhere"], "params": {"widths": [2]}}],
            "block 'a': inputs names 'nowhere', which is neither a block nor a raw input",
        ),
        (
            [
                {"name": "a", "op": "mlp", "inputs": ["b"], "params": {"widths": [2]}},
                {"name": "b", "op": "mlp", "inputs": ["a"], "params": {"widths": [2]}},
            ],
            "blocks form a cycle: a -> b -> a",
        ),
        (
            [
                {"name": "a", "op": "mlp", "inputs": ["dense"], "params": {"widths": [2]}},
                {"name": "b", "op": "sum", "inputs": ["a", "dense"]},
            ],
            "block 'b' (op sum): shape mismatch: inputs have widths [2, 4]; set params.width",
        ),
        (
            [{"name": "a", "op": "mlp", "inputs": ["dense"], "params": {"widths": [8, 0]}}],
            "block 'a' (op mlp): params.widths item 1: 0 is out of range: must be in [1, 65536]",
        ),
        (
            [{"name": "a", "op": "mlp", "inputs": ["dense"]}],
            "block 'a' (op mlp): params.widths is required",
        ),
        (
            [{"name": "a", "op": "cross", "inputs": ["dense"], "params": {"layers": 2}}],
            "block 'a' (op cross): unknown parameter params.layers; allowed: num_layers",
        ),
        (
            [{"name": "a", "op": "efc", "inputs": ["sparse"], "params": {"num_out": "4"}}],
            "block 'a' (op efc): params.num_out must be an integer, got '4'",
        ),
        (
            [{"name": "a", "op": "dhen", "inputs": ["sparse"], "params": {"modules": ["mlp"]}}],
            "params.modules 'mlp' is not one of dot | attention | dcn | conv | linear",
        ),
        (
            [{"name": "a", "op": "dot", "inputs": ["dense"]}],
            "block 'a' (op dot): shape mismatch: needs at least 2 embeddings",
        ),
        (
            [{"name": "a", "op": "cross", "inputs": ["dense"], "params": {"num_experts": 2}}],
            "params.num_experts > 1 needs params.low_rank >= 1",
        ),
    ],
)
def test_invalid_specs_get_their_documented_message(blocks, expected, small_schema):
    assert expected in _error(spec(blocks), small_schema)


def test_every_problem_is_reported_at_once(small_schema):
    message = _error(
        spec(
            [
                {"name": "a", "op": "nope", "inputs": ["dense"]},
                {"name": "b", "op": "mlp", "inputs": ["ghost"], "params": {"widths": [2, -3]}},
            ]
        ),
        small_schema,
    )
    assert "unknown op 'nope'" in message and "'ghost'" in message
    # a known op's params too (the -3 was told only once the inputs were right)
    assert "block 'b' (op mlp): params.widths item 1: -3 is out of range" in message


@pytest.mark.parametrize(
    ("data", "expected"),
    [
        ({"blocks": []}, "'blocks' must be a non-empty list"),
        ({"schema_version": 9, "blocks": [], "embedding": {"dim": 4}}, "schema_version 9"),
        (spec(DLRM_LIKE) | {"extra": 1}, "unknown field(s) ['extra']"),
        (spec([{"name": "dense", "op": "mlp", "inputs": ["dense"]}]), "name 'dense' must be"),
        ({"embedding": {"dim": 0}, "blocks": DLRM_LIKE}, "embedding.dim: 0 is out of range"),
        (spec(DLRM_LIKE, output="nothing"), "output names 'nothing', which is not a block"),
        (
            {
                "embedding": {"dim": 4, "features": [{"name": "c0", "cardinality": 20}]},
                "blocks": DLRM_LIKE,
            },
            "embedding.features[0] (c0): unknown field(s) ['cardinality']; allowed: dim, name, "
            "num_embeddings, pooling",
        ),
        (  # a feature's own dim, its rows left to the schema: say how that is written
            {"embedding": {"dim": 4, "features": [{"name": "c0", "dim": 16}]}, "blocks": DLRM_LIKE},
            "num_embeddings must be an integer >= 1 (its table's rows: the schema's cardinality)"
            "; or leave 'features' out",
        ),
    ],
)
def test_malformed_documents_name_the_field(data, expected, small_schema):
    with pytest.raises(SpecError) as info:
        analyze(Architecture.from_dict(data, source="model.json").bind(small_schema))
    assert expected in str(info.value)


def test_a_hand_written_model_gives_own_dims_by_name_and_may_be_yaml(small_schema, tmp_path):
    """A feature's own dim needed every feature listed with its table's rows (which a study's
    vocabulary decides); a YAML file was "not valid JSON"; a block without a name was told
    "name None must be an identifier"."""
    import yaml

    own = spec(DLRM_LIKE, dims={"c1": 16, "c2": 0})
    arch = bound(own, small_schema)
    dims = {f.name: f.dim for f in arch.embedding.features}
    assert dims == {"c0": None, "c1": 16, "c2": 0, "c3": None, "c4": None, "c5": None}
    listed = bound(spec(DLRM_LIKE, features=[f.__dict__ for f in arch.embedding.features]),
                   small_schema)  # fmt: skip
    assert digest(arch) == digest(listed)
    from nas.cli import _own_dims  # `arch show` said "5 features x dim 4" alone

    assert _own_dims(arch.embedding) == " (c1 at 16; left out: c2)"
    with pytest.raises(SpecError, match=r"embedding.dims: \['c9'\] not categorical columns"):
        bound(spec(DLRM_LIKE, dims={"c9": 8}), small_schema)
    with pytest.raises(SpecError, match=r"embedding.dims.c1: -1 must be an integer in \[0"):
        bound(spec(DLRM_LIKE, dims={"c1": -1}), small_schema)
    with pytest.raises(SpecError, match=r"embedding.dims: 2 is no feature name; quote it"):
        bound(spec(DLRM_LIKE, dims={"c1": 8, 2: 4}), small_schema)
    (tmp_path / "team.yaml").write_text(yaml.safe_dump(own))
    assert digest(load_architecture(str(tmp_path / "team.yaml"), small_schema)) == digest(arch)
    (tmp_path / "tabbed.yaml").write_text("embedding:\n\tdim: 4\n")
    with pytest.raises(SpecError, match=r"tabbed.yaml: not valid YAML .*indent with spaces"):
        load_architecture(str(tmp_path / "tabbed.yaml"), small_schema)
    unnamed = [{"op": "mlp", "inputs": ["dense"], "params": {"widths": [4]}}]
    with pytest.raises(SpecError, match=r"blocks\[0\]: missing 'name'"):
        Architecture.from_dict(spec(unnamed))


def test_not_json_names_the_file_and_line():
    with pytest.raises(SpecError, match=r"model.json: not valid JSON \(Expecting value: line 2"):
        Architecture.from_json('{\n"blocks": [,]}', source="model.json")


def test_bind_checks_the_dataset(small_schema):
    arch = preset("dlrm", small_schema)
    other = small_schema.__class__(dense=("x",), categorical=small_schema.categorical)
    with pytest.raises(SpecError, match="num_dense is 4 but the dataset") as raised:
        arch.bind(other)
    assert "(for a study's model: `ranknas data schema STUDY.yaml`)" in str(raised.value)
    fewer = small_schema.__class__(
        dense=small_schema.dense, categorical=small_schema.categorical[:3]
    )
    with pytest.raises(SpecError, match=r"not in the dataset \['c3', 'c4', 'c5'\]"):
        arch.bind(fewer)


def test_a_file_that_does_not_fit_the_data_is_named(small_schema, tmp_path):
    path = tmp_path / "mine.json"
    path.write_text(preset("dlrm", small_schema).to_json())
    fewer = small_schema.__class__(
        dense=small_schema.dense, categorical=small_schema.categorical[:3]
    )
    with pytest.raises(SpecError, match=rf"^{re.escape(str(path))}: embedding.features do not"):
        load_architecture(str(path), fewer)


def test_per_feature_dims_are_projected_to_the_shared_dim(small_schema):
    data = bound(spec(DLRM_LIKE), small_schema).to_dict()
    data["embedding"]["features"][0]["dim"] = 2
    data["embedding"]["features"][3]["dim"] = 7
    arch = Architecture.from_dict(data)
    model = build_model(arch, seed=0)
    assert set(model.feature_projections) == {"c0", "c3"}
    assert model.embed(example_batch(arch, 3)[1]).shape == (3, 6, 4)
    check_costs_and_training_step(arch)


def test_dense_inputs_of_sparse_blocks_are_projected_unless_they_fit(small_schema):
    fits = bound(spec(DLRM_LIKE), small_schema)
    assert analyze(fits).projections == ()
    wide = spec(
        [
            {"name": "bottom", "op": "mlp", "inputs": ["dense"], "params": {"widths": [9]}},
            {"name": "att", "op": "attention", "inputs": ["sparse", "bottom"]},
        ]
    )
    arch = bound(wide, small_schema)
    (projection,) = analyze(arch).projections
    assert (projection.block, projection.source, projection.width) == ("att", "bottom", 9)
    check_costs_and_training_step(arch)


def test_build_is_deterministic_given_a_seed(small_schema):
    arch = preset("wukong", small_schema)
    dense, sparse = example_batch(arch, 5)
    first = build_model(arch, seed=3)(dense, sparse)
    second = build_model(arch, seed=3)(dense, sparse)
    assert first.equal(second)
    assert not first.equal(build_model(arch, seed=4)(dense, sparse))


def test_embedding_bag_collection_is_fed_by_a_keyed_jagged_tensor(small_schema):
    from torchrec.modules.embedding_modules import EmbeddingBagCollection
    from torchrec.sparse.jagged_tensor import KeyedJaggedTensor

    arch = preset("dlrm", small_schema)
    model = build_model(arch, seed=0)
    assert isinstance(model.embedding_bags, EmbeddingBagCollection)
    _, sparse = example_batch(arch, 2)
    assert isinstance(sparse, KeyedJaggedTensor)
    table = model.embedding_bags.embedding_bags["t_c1"].weight
    assert model.embed(sparse)[:, 1].equal(table[sparse["c1"].values()])


def test_a_feature_of_dim_0_is_left_out_and_a_model_needs_one_it_reads(small_schema):
    spec = preset("dlrm", small_schema).to_dict()
    for feature in spec["embedding"]["features"][:2]:
        feature["dim"] = 0
    arch = Architecture.from_dict(spec)
    assert Architecture.from_json(arch.to_json()) == arch  # the 0 is written, not dropped
    assert len(arch.embedding.used) == len(small_schema.categorical) - 2
    assert analyze(arch).shapes["sparse"].count == len(arch.embedding.used)
    check_costs_and_training_step(arch)
    for feature in spec["embedding"]["features"]:
        feature["dim"] = 0
    with pytest.raises(SpecError, match=r"reads 'sparse' but the model uses none \(every dim 0\)"):
        analyze(Architecture.from_dict(spec))
    spec["embedding"]["features"][0]["dim"] = -1
    with pytest.raises(SpecError, match=r"dim must be an integer in \[0, 4096\] \(0: the model"):
        Architecture.from_dict(spec)


def test_the_output_of_arch_show_json_as_a_spec_is_told_which_field_to_keep(tmp_path):
    import json

    from search_space.architecture import Architecture
    from search_space.errors import SpecError
    from search_space.presets import preset
    from search_space.schema import synthetic_schema

    shown = {"architecture": preset("dlrm", synthetic_schema()).to_dict(), "flops": 1}
    path = tmp_path / "dlrm.json"
    path.write_text(json.dumps(shown))
    with pytest.raises(SpecError, match="puts the spec under 'architecture': save it alone"):
        Architecture.load(path)


def test_a_spec_that_names_num_dense_gets_its_features_from_the_schema(small_schema, tmp_path):
    """A hand-written spec with `"num_dense"` (Criteo's right 13) and no features was refused
    before binding: "block 'attn': reads 'sparse' but the model has none of the categorical
    features". Its features come from the schema, as without num_dense; a wrong count is
    refused naming both."""
    spec = preset("dlrm", small_schema).to_dict()
    del spec["embedding"]["features"]
    path = tmp_path / "prod.json"
    path.write_text(json.dumps(spec))
    arch = load_architecture(str(path), small_schema)
    assert len(arch.embedding.features) == len(small_schema.categorical)
    path.write_text(json.dumps(spec | {"num_dense": small_schema.num_dense + 1}))
    with pytest.raises(SpecError, match=r"num_dense is \d+ but the dataset"):
        load_architecture(str(path), small_schema)
