"""Export: the standalone module rebuilds the model where ranknas cannot be imported and
reproduces its predictions; the weights are plain safetensors; the MLflow registry round trip."""

from __future__ import annotations

import ast
import logging
import os
import re
import shutil
import subprocess
import sys
import sysconfig
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import torch
from safetensors import safe_open
from safetensors.torch import load_file, save_file
from torchrec.sparse.jagged_tensor import KeyedJaggedTensor

from mlflow_server import ServerInfo
from nas.export import _PYFUNC_CODE, ExportResult, export_model, load_exported
from search_space.architecture import Architecture, analyze, digest
from search_space.builder import RankingModel, build_model, example_batch
from search_space.errors import RanknasError
from search_space.presets import PRESETS, preset
from search_space.schema import CategoricalFeature, DatasetSchema
from search_space.spaces import make_space

SCHEMA = DatasetSchema(
    dense=("d0", "d1", "d2", "d3"),
    categorical=tuple(CategoricalFeature(f"c{i}", 20 + 7 * i) for i in range(6)),
    name="small",
)
BATCH = 16
METRICS = {"val_ne": 0.8123, "test_auc": 0.7345, "throughput": 12345.6, "steps": 300,
           "params": 4321}  # fmt: skip
ALL_OPS = ["mlp", "cross", "gating", "sum", "dot", "fm", "efc", "attention", "wukong", "dhen"]


def _mixed() -> Architecture:
    """Per-feature dims, dense inputs of sparse blocks with and without a merge projection,
    list-taking blocks fed a sparse input, keyword block names, a sparse output to the head."""
    dims = {"c1": 4, "c4": 16}
    features = [
        {"name": f.name, "num_embeddings": f.cardinality}
        | ({"dim": dims[f.name]} if f.name in dims else {})
        for f in SCHEMA.categorical
    ]
    mix = {"modules": ["conv", "dcn", "linear"], "aggregation": "concat", "num_out": 4}
    blocks = [
        ("bottom", "mlp", ["dense"], {"widths": [24]}),  # 24 != dim: projected
        ("narrow", "mlp", ["dense"], {"widths": [8]}),  # == dim: joins as is
        ("inter", "attention", ["sparse", "bottom", "narrow"], {"num_heads": 2}),
        ("crossed", "cross", ["bottom", "inter"], {"low_rank": 4, "num_experts": 2}),
        ("gate", "gating", ["crossed", "inter"], {}),
        ("total", "sum", ["gate", "inter", "dense"], {"width": 16}),
        ("fm", "fm", ["sparse"], {"reduce": False}),
        ("lambda", "efc", ["inter", "total", "fm"], {"num_out": 3}),
        ("class", "dhen", ["lambda"], mix),
        ("torch", "wukong", ["class", "narrow"], {"num_fm": 2, "num_lc": 3, "rank": 4}),
    ]
    spec = {
        "name": "mixed",
        "embedding": {"dim": 8, "features": features},
        "blocks": [
            {"name": n, "op": op, "inputs": inputs, "params": p} for n, op, inputs, p in blocks
        ],
    }
    return Architecture.from_dict(spec).bind(SCHEMA)


def _architectures() -> dict[str, Architecture]:
    archs = {name: preset(name, SCHEMA) for name in PRESETS}
    dag = {"type": "dag", "ops": ALL_OPS, "feature_dims": [4, 8, 16]}
    for seed in range(3):
        archs[f"dag{seed}"] = make_space(dag, SCHEMA).sample(seed)
    archs["wukong-space"] = make_space({"type": "wukong", "feature_dims": [4, 8]}, SCHEMA).sample(1)
    archs["dhen-space"] = make_space({"type": "dhen"}, SCHEMA).sample(2)
    archs["mixed"] = _mixed()
    around = make_space({"type": "around", "base": "dlrm", "feature_dims": [0, 4, 8]}, SCHEMA)
    names = [f.name for f in SCHEMA.categorical]
    left_out = {f"dim.{n}": 0 for n in names[1::3]} | {f"dim.{names[2]}": 4}
    archs["around-left-out"] = around.decode(around.base_values() | left_out)
    return archs


ARCHITECTURES = _architectures()


@dataclass
class Case:
    arch: Architecture
    model: RankingModel
    result: ExportResult
    dense: torch.Tensor
    sparse: KeyedJaggedTensor
    ids: torch.Tensor  # [B, F], the ids of `sparse`
    expected: torch.Tensor  # the logits of `model`


def id_matrix(sparse: KeyedJaggedTensor, arch: Architecture) -> torch.Tensor:
    """The `[B, F]` id matrix of a one-id-per-feature KeyedJaggedTensor."""
    return sparse.values().view(len(arch.embedding.used), -1).t().contiguous()


def to_kjt(ids: torch.Tensor, features) -> KeyedJaggedTensor:
    """ranknas's model input from an id matrix: one id per example and feature."""
    lengths = torch.ones(ids.numel(), dtype=torch.int32)
    return KeyedJaggedTensor(keys=list(features), values=ids.t().reshape(-1), lengths=lengths)


def _perturbed(arch: Architecture) -> RankingModel:
    """A model whose weights no fresh build has (so a load that did nothing shows)."""
    model = build_model(arch, seed=0)
    generator = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.1 * torch.randn(p.shape, generator=generator))
    return model.eval()


def _case(arch: Architecture, out_dir: Path) -> Case:
    model = _perturbed(arch)
    result = export_model(arch, model.state_dict(), METRICS, out_dir, schema=SCHEMA)
    dense, sparse = example_batch(arch, BATCH, seed=3)
    ids = id_matrix(sparse, arch)
    with torch.no_grad():
        expected = model(dense, sparse)
    return Case(arch, model, result, dense, sparse, ids, expected)


@pytest.fixture(scope="module")
def cases(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Case]:
    root = tmp_path_factory.mktemp("exports")
    return {name: _case(arch, root / name) for name, arch in ARCHITECTURES.items()}


# Runs with `python -S`: no site-packages .pth files, so not ranknas's editable finder either.
_OUTSIDE_RANKNAS = """
import importlib.util
import sys
from pathlib import Path

for name in ("search_space", "nas", "ranknas"):
    try:
        __import__(name)
    except ImportError:
        continue
    raise SystemExit(f"{name} can be imported: the check would prove nothing")

import torch
from safetensors.torch import load_file, save_file

inputs, outputs = Path(sys.argv[1]), Path(sys.argv[2])
for directory in map(Path, sys.argv[3:]):
    spec = importlib.util.spec_from_file_location("ranknas_model", directory / "ranknas_model.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules["ranknas_model"] = module
    spec.loader.exec_module(module)
    model = module.load(directory)
    # clone: tensors fresh from load_file may be unaligned, and vectorized kernels then
    # round differently in the last bit (so would ranknas's own model)
    batch = load_file(inputs / f"{directory.name}.safetensors")
    batch = {key: tensor.clone() for key, tensor in batch.items()}
    with torch.no_grad():
        logits = model(batch["dense"], batch["ids"])
    save_file({"logits": logits}, outputs / f"{directory.name}.safetensors")
"""


@pytest.fixture(scope="module")
def outside_logits(
    cases: dict[str, Case], tmp_path_factory: pytest.TempPathFactory
) -> dict[str, torch.Tensor]:
    """The logits each exported module computes in a Python that cannot import ranknas."""
    work = tmp_path_factory.mktemp("outside")
    inputs, outputs = work / "inputs", work / "outputs"
    inputs.mkdir()
    outputs.mkdir()
    for name, case in cases.items():
        save_file({"dense": case.dense, "ids": case.ids}, inputs / f"{name}.safetensors")
    site = dict.fromkeys(sysconfig.get_paths()[key] for key in ("purelib", "platlib"))
    dirs = [str(case.result.out_dir) for case in cases.values()]
    proc = subprocess.run(
        [sys.executable, "-S", "-c", _OUTSIDE_RANKNAS, str(inputs), str(outputs), *dirs],
        cwd=work,
        env={**os.environ, "PYTHONPATH": os.pathsep.join(site)},
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    return {name: load_file(outputs / f"{name}.safetensors")["logits"] for name in cases}


@pytest.mark.parametrize("name", ARCHITECTURES)
def test_standalone_module_reproduces_the_model_without_ranknas(
    name: str, cases: dict[str, Case], outside_logits: dict[str, torch.Tensor]
) -> None:
    assert torch.equal(outside_logits[name], cases[name].expected)


@pytest.mark.parametrize("name", ARCHITECTURES)
def test_loaded_export_is_bit_identical(name: str, cases: dict[str, Case]) -> None:
    case = cases[name]
    with torch.no_grad():
        logits = load_exported(case.result.out_dir)(case.dense, case.ids)
        fresh = build_model(case.arch, seed=0)(case.dense, case.sparse)
    assert torch.equal(logits, case.expected)
    assert not torch.equal(fresh, case.expected)


def test_the_exported_model_checks_the_id_matrix(cases: dict[str, Case]) -> None:
    case = cases["dlrm"]
    model = load_exported(case.result.out_dir)
    with torch.no_grad():
        assert torch.equal(model(case.dense, case.ids), case.expected)
        with pytest.raises(ValueError, match=r"expected ids of shape \[B, 6\], got \[16, 5\]"):
            model(case.dense, case.ids[:, :5])


def test_raw_input_mistakes_name_the_feature_row_and_fix(cases: dict[str, Case]) -> None:
    case = cases["dlrm"]  # trained on ids as they are: no vocabulary, no dense transforms
    directory = case.result.out_dir
    model = load_exported(directory)
    module = sys.modules[type(model).__module__]
    features = list(module.FEATURES)
    with pytest.raises(ValueError, match=f"feature '{features[1]}', row 1: 'shop-3' is not an id"):
        module.encode_ids([[1, 2]] + [[1, "shop-3"]] * (len(features) - 1), features, directory)
    for bad in (7.5, True):  # the served model refuses these too
        with pytest.raises(ValueError, match=f"feature '{features[1]}', row 1: {bad!r} is not"):
            module.encode_ids([[1, 2]] + [[1, bad]] * (len(features) - 1), features, directory)
    given = module.encode_ids([[1, 2]] + [["3", 4.0]] * (len(features) - 1), features, directory)
    assert given[:, 1].tolist() == [3, 4]  # a whole number as a text or a float is its id
    with torch.no_grad(), pytest.raises(ValueError, match=r"expected dense of shape \[B, "):
        model(case.dense[:, 1:], case.ids)
    ids = case.ids.clone()
    ids[3, 2] = 10**9
    with torch.no_grad(), pytest.raises(ValueError, match=rf"feature '{features[2]}': id "
                                        r"1000000000 \(at 3\) is outside its table"):  # fmt: skip
        model(case.dense, ids)
    names = module.DENSE_COLUMNS  # the errors name a column by its index and its name
    dense = case.dense.clone()
    dense[2, 1] = dense[4, 0] = float("nan")
    with pytest.raises(ValueError, match=r"dense value missing \(NaN\) in row 2, column 1 "
                       rf"\({names[1]}\) \(and 1 more such cells\)"):  # fmt: skip
        module.prepare_dense(dense, directory)
    for huge in ("inf", "1e39"):  # the served model refused them; this scored NaN
        rows = [[str(float(v)) for v in row] for row in case.dense.tolist()]
        rows[1][1] = huge
        with pytest.raises(ValueError, match=rf"row 1, column 1 \({names[1]}\) is not a finite"):
            module.prepare_dense(rows, directory)
    # rows as a CSV reader gives them: texts are numbers, a blank or None is missing
    rows = [[str(float(v)) for v in row] for row in case.dense.tolist()]
    assert torch.equal(
        module.prepare_dense(rows, directory), module.prepare_dense(case.dense, directory)
    )
    rows[1][0] = ""
    with pytest.raises(ValueError, match=r"dense value missing \(NaN\) in row 1, column 0"):
        module.prepare_dense(rows, directory)  # nothing fitted fills one in this model
    rows[1][0], rows[0][0] = rows[0][0], ""  # first: torch reads a blank as an empty list
    with pytest.raises(ValueError, match=r"dense value missing \(NaN\) in row 0, column 0"):
        module.prepare_dense(rows, directory)
    rows[0][0] = rows[1][0]
    for bad in ("abc", True):
        rows[1][0] = bad
        with pytest.raises(ValueError, match=f"dense value {bad!r} in row 1, column 0 "
                                             rf"\({names[0]}\) is not a number"):  # fmt: skip
            module.prepare_dense(rows, directory)
    rows[2][1] = rows[3][0] = "n/a?"
    with pytest.raises(ValueError, match=r"dense value True in row 1, column 0 \(\w+\) \(and 2 "
                       r"more such cells\) is not a number"):  # fmt: skip
        module.prepare_dense(rows, directory)
    numbers = case.dense.tolist()  # numbers but for one flag: torch read it as 1.0
    numbers[1][0] = True
    with pytest.raises(ValueError, match=r"dense value True in row 1, column 0 .* not a number"):
        module.prepare_dense(numbers, directory)
    for flags in (case.dense.numpy() > 0, case.dense > 0):  # numpy's and torch's
        with pytest.raises(ValueError, match=r"dense values are booleans \(a bool array\)"):
            module.prepare_dense(flags, directory)
    numbers[1][0] = (case.dense.numpy() > 0)[1, 0]  # numpy's True, in a list
    with pytest.raises(ValueError, match=r"dense value .* in row 1, column 0 .* not a number"):
        module.prepare_dense(numbers, directory)


def test_weights_are_plain_safetensors(cases: dict[str, Case]) -> None:
    case = cases["mixed"]
    weights = load_file(case.result.weights)
    state = case.model.state_dict()
    assert weights.keys() == state.keys()
    assert all(torch.equal(weights[key], state[key]) for key in state)
    with safe_open(case.result.weights, framework="pt") as f:
        assert f.metadata() == {"ranknas_digest": case.result.digest}


def test_generated_module_needs_only_torch_and_safetensors(
    cases: dict[str, Case],
) -> None:
    for name, case in cases.items():
        text = case.result.module.read_text()
        tree = ast.parse(text)
        roots = set()
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                roots.update(alias.name.split(".")[0] for alias in node.names)
            elif isinstance(node, ast.ImportFrom):
                roots.add((node.module or "").split(".")[0])
        third_party = roots - set(sys.stdlib_module_names)
        assert third_party == {"torch", "safetensors"}, name
        assert "torch.load" not in text and "pickle" not in text
        assert ast.get_docstring(tree).startswith(f"{case.arch.name}, exported by ranknas")
        defined = [
            node.name if hasattr(node, "name") else ast.unparse(node.targets[0])
            for node in tree.body
            if isinstance(node, ast.FunctionDef | ast.ClassDef | ast.Assign)
        ]
        assert len(defined) == len(set(defined)), f"{name}: a copied name is defined twice"


def test_generated_module_is_ruff_clean(cases: dict[str, Case], tmp_path: Path) -> None:
    ruff = shutil.which("ruff", path=str(Path(sys.executable).parent)) or shutil.which("ruff")
    if ruff is None:
        pytest.skip("ruff is not installed")
    config = Path(__file__).parents[1] / "pyproject.toml"
    files = [tmp_path / "pyfunc_entry_point.py"]
    files[0].write_text(_PYFUNC_CODE.lstrip())  # what MLflow stores as the model's code
    for name, case in cases.items():
        files.append(tmp_path / f"{name.replace('-', '_')}.py")
        shutil.copy(case.result.module, files[-1])
    for check in (["check"], ["format", "--check"]):
        proc = subprocess.run(
            [ruff, *check, "--config", str(config), *map(str, files)],
            capture_output=True,
            text=True,
        )
        assert proc.returncode == 0, proc.stdout + proc.stderr


def test_forward_is_one_statement_per_block(cases: dict[str, Case]) -> None:
    text = cases["dlrm"].result.module.read_text()
    assert 'bottom = self.blocks["bottom"](dense)\n' in text
    assert 'top = self.blocks["top"](torch.cat([bottom, interaction], dim=1))\n' in text
    mixed = cases["mixed"].result.module.read_text()
    assert 'lambda_ = self.blocks["lambda"](' in mixed  # a keyword gets a trailing underscore
    assert 'torch_ = self.blocks["torch"](torch.cat([class_, narrow.unsqueeze(1)], dim=1))' in mixed
    assert 'self.merge_projections["inter__bottom"](bottom).unsqueeze(1)' in mixed


def test_architecture_json_and_model_card(cases: dict[str, Case]) -> None:
    case = cases["mixed"]
    assert Architecture.load(case.result.architecture).to_dict() == case.arch.to_dict()
    assert case.result.digest == digest(case.arch)
    mode = case.result.model_card.stat().st_mode & 0o777  # safetensors alone wrote 0600
    assert case.result.weights.stat().st_mode & 0o777 == mode
    card = case.result.model_card.read_text()
    analysis = analyze(case.arch)
    for text in (case.result.digest, f"{analysis.flops:,}", f"{analysis.params_total:,}"):
        assert text in card
    assert "| val_ne | 0.8123 |" in card and "| steps | 300 |" in card
    assert "| dense params | 4,321 |" in card  # the header gives dense and embedding params
    assert "| `c1` | one id | 27 | 4 |" in card  # feature, ids per row, num_embeddings, dim
    assert all(f"| `{name}` | " in card for name in analysis.order)
    assert "`d0`, `d1`, `d2`, `d3`" in card
    assert "![architecture](architecture.png)" in card
    assert (case.result.out_dir / "architecture.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_weights_of_another_architecture_are_refused(tmp_path: Path) -> None:
    state = build_model(preset("dlrm", SCHEMA), seed=0).state_dict()
    with pytest.raises(RanknasError, match=r"do not fit 'dcnv2' .*missing: .*unexpected: "):
        export_model(preset("dcnv2", SCHEMA), state, {}, tmp_path)
    state["head.weight"] = torch.zeros(1, 63)
    with pytest.raises(RanknasError, match=r"shape: head.weight \[1, 63\] \(expected \[1, 64\]\)"):
        export_model(preset("dlrm", SCHEMA), state, {}, tmp_path)


def test_shared_and_non_contiguous_tensors_are_stored(tmp_path: Path) -> None:
    arch = preset("dlrm", SCHEMA)
    model = _perturbed(arch)
    state = model.state_dict()
    first, second = "blocks.top.layers.0.weight", "blocks.top.layers.2.weight"
    storage = torch.cat([state[first].flatten(), state[second].flatten()])
    state[first] = storage[: state[first].numel()].view(state[first].shape)
    state[second] = storage[state[first].numel() :].view(state[second].shape)
    bottom = "blocks.bottom.layers.0.weight"
    state[bottom] = state[bottom].t().contiguous().t()  # same values, column-major
    assert not state[bottom].is_contiguous()
    result = export_model(arch, state, {}, tmp_path)
    dense, sparse = example_batch(arch, BATCH)
    with torch.no_grad():
        exported = load_exported(result.out_dir)(dense, id_matrix(sparse, arch))
        assert torch.equal(exported, model(dense, sparse))


def test_without_a_schema_dense_columns_are_numbered(tmp_path: Path) -> None:
    arch = preset("deepfm", SCHEMA)
    result = export_model(arch, build_model(arch, seed=0).state_dict(), {}, tmp_path)
    assert 'DENSE_COLUMNS = ("dense_0", "dense_1", "dense_2", "dense_3")' in (
        result.module.read_text()
    )


def test_registering_without_a_server_fails_fast(tmp_path: Path) -> None:
    arch = preset("dlrm", SCHEMA)
    state = build_model(arch, seed=0).state_dict()
    with pytest.raises(RanknasError, match="cannot reach the MLflow server"):
        export_model(arch, state, {}, tmp_path, register="m", tracking_uri="http://127.0.0.1:9")


# ---------------------------------------------------------------------- MLflow registry


def test_registered_model_reproduces_predictions(
    server: ServerInfo, cases: dict[str, Case], tmp_path: Path, capfd: pytest.CaptureFixture
) -> None:
    import mlflow

    case = cases["mixed"]
    state = case.model.state_dict()
    mlflow_logs = logging.getLogger("mlflow")
    level = mlflow_logs.level
    mlflow_logs.setLevel(logging.WARNING)  # as `ranknas` sets it without -v
    try:
        result = export_model(
            case.arch, state, METRICS, tmp_path / "export", schema=SCHEMA,
            register="ranknas-mixed", tracking_uri=server.uri,
        )  # fmt: skip
    finally:
        mlflow_logs.setLevel(level)
    printed = capfd.readouterr().err
    assert "Created version" not in printed, printed  # MLflow's own print: only with -v
    assert (result.model_name, result.alias) == ("ranknas-mixed", "champion")
    assert result.model_uri == "models:/ranknas-mixed@champion"
    client = mlflow.MlflowClient(server.uri)
    version = client.get_model_version_by_alias("ranknas-mixed", "champion")
    assert version.version == result.model_version
    assert version.tags["ranknas_digest"] == case.result.digest

    frame = pd.DataFrame(case.dense.double().numpy(), columns=list(SCHEMA.dense))
    for j, feature in enumerate(SCHEMA.feature_names):
        frame[feature] = case.ids[:, j].numpy()
    mlflow.set_tracking_uri(server.uri)
    try:  # MLflow 3.17 refuses to unpickle models by default: loading proves there is none
        loaded = mlflow.pyfunc.load_model(result.model_uri)
    finally:
        mlflow.set_tracking_uri(None)
    assert "model_code_path" in loaded.metadata.flavors["python_function"]
    probabilities = loaded.predict(frame)
    np.testing.assert_array_equal(probabilities, torch.sigmoid(case.expected).numpy())

    again = export_model(
        case.arch, state, METRICS, tmp_path / "again", schema=SCHEMA,
        register="ranknas-mixed", tracking_uri=server.uri,
    )  # fmt: skip
    assert again.model_version == result.model_version and again.reused_version  # same model
    assert "0.8123" in version.description
    # the same model with the study's figures of now (after `reevaluate`): the version's
    # description follows the card (it kept the old verdict)
    export_model(case.arch, state, METRICS | {"val_ne": 0.7999}, tmp_path / "later",
                 schema=SCHEMA, register="ranknas-mixed", tracking_uri=server.uri)  # fmt: skip
    latest = client.get_model_version("ranknas-mixed", result.model_version).description
    assert "0.7999" in latest and "0.8123" not in latest
    assert "## Provenance" not in version.description
    assert "## Metrics of its recorded training run (one seed)" in version.description
    assert "](architecture.png)" not in version.description  # a broken image in the registry
    assert "The diagram is `architecture.png`" in version.description
    other = {k: v + 1 if v.is_floating_point() else v for k, v in state.items()}
    changed = export_model(case.arch, other, METRICS, tmp_path / "changed", schema=SCHEMA,
                           register="ranknas-mixed", tracking_uri=server.uri)  # fmt: skip
    assert int(changed.model_version) == int(result.model_version) + 1
    moved = client.get_model_version_by_alias("ranknas-mixed", "champion")
    assert moved.version == changed.model_version
    third = {k: v + 2 if v.is_floating_point() else v for k, v in state.items()}
    unaliased = export_model(case.arch, third, METRICS, tmp_path / "third", schema=SCHEMA,
                             register="ranknas-mixed", tracking_uri=server.uri,
                             alias=None)  # fmt: skip
    assert unaliased.model_uri == f"models:/ranknas-mixed/{unaliased.model_version}"
    kept = client.get_model_version_by_alias("ranknas-mixed", "champion")
    assert kept.version == changed.model_version  # not the study's best: no alias moved
    assert "without an alias" in (tmp_path / "third" / "model_card.md").read_text()


def test_hostile_column_and_feature_names_cannot_break_the_generated_module(
    tmp_path: Path,
) -> None:
    hostile = DatasetSchema(
        dense=('a"""; import os; os.system("x") #', "b\\n'c", "line\nbreak"),
        categorical=(
            CategoricalFeature('ü"""\'', 11),
            CategoricalFeature("tab\there", 13),
            # torch refuses '.' in a module's name; '/' names a table's shards
            *(CategoricalFeature(n, 5) for n in ("user.id", "a", "a/cw0", "50.", "50%2E")),
        ),
        name='evil"""',
    )
    arch = replace(preset("dlrm", hostile), name='x"""\n raise SystemExit #')
    emb = arch.embedding  # a feature of its own dim: projected, a module named by its column
    own_dims = tuple(replace(f, dim=4) if f.name in ("user.id", "a/cw0") else f
                     for f in emb.features)  # fmt: skip
    arch = replace(arch, embedding=replace(emb, features=own_dims))
    model = _perturbed(arch)
    result = export_model(arch, model.state_dict(), {}, tmp_path, schema=hostile)
    source = result.module.read_text()
    ast.parse(source)  # still valid Python
    assert "\t" not in source  # control characters only as escapes
    doc = ast.get_docstring(ast.parse(source))
    assert "'ü\"\"\"\\''" in doc.replace('\\"', '"')  # the name as Python writes it
    assert repr("tab\there") in doc and repr("b\\n'c") in doc  # escaped once, not twice
    dense, sparse = example_batch(arch, BATCH)
    with torch.no_grad():
        exported = load_exported(result.out_dir)(dense, id_matrix(sparse, arch))
        assert torch.equal(exported, model(dense, sparse))
    module = sys.modules[type(load_exported(result.out_dir)).__module__]
    assert hostile.dense == module.DENSE_COLUMNS
    assert tuple(f.name for f in hostile.categorical) == module.FEATURES


def test_weights_recorded_before_names_were_escaped_load_under_todays(tmp_path: Path) -> None:
    """A column's '/' and '%' stood as they are in module names until they were escaped:
    such a study's recorded weights still load, for the export and the feature screen."""
    from safetensors.torch import save_file

    from nas.trial_record import read_weights

    schema = DatasetSchema(
        dense=("d",), categorical=tuple(CategoricalFeature(n, 5) for n in ("a/b", "disc%", "c"))
    )
    arch = preset("dlrm", schema)
    emb = arch.embedding
    features = tuple(replace(f, dim=4) if f.name == "a/b" else f for f in emb.features)
    state = build_model(replace(arch, embedding=replace(emb, features=features))).state_dict()
    old_names = {"t_a%2Fb": "t_a/b", "t_disc%25": "t_disc%", "feature_projections.a%2Fb":
                 "feature_projections.a/b"}  # fmt: skip
    recorded = {}
    for key, value in state.items():
        for new, old in old_names.items():
            key = key.replace(f"{new}.", f"{old}.")
        recorded[key] = value.contiguous()
    assert set(recorded) != set(state)
    save_file(recorded, str(tmp_path / "model.safetensors"))
    loaded = read_weights(tmp_path / "model.safetensors")
    assert set(loaded) == set(state) and all(torch.equal(loaded[k], state[k]) for k in state)


def test_the_registered_model_serves_raw_rows(server: ServerInfo, tmp_path: Path) -> None:
    import mlflow

    from search_space.preprocessing import transform_dense

    arch = preset("dlrm", SCHEMA)
    model = _perturbed(arch)
    shops = [f"{7000 + k}" for k in range(18)]  # c0's training vocabulary: ids 2..19
    dense_fit = [{"column": c, "log1p": k == 1, "mean": 1.0, "std": 2.0}
                 for k, c in enumerate(SCHEMA.dense)]  # fmt: skip
    fitted = {"dense": dense_fit, "vocabulary": {"c0": shops}}
    result = export_model(arch, model.state_dict(), {}, tmp_path / "raw", schema=SCHEMA,
                          register="ranknas-raw", tracking_uri=server.uri,
                          preprocessing=fitted)  # fmt: skip
    raw_dense = torch.rand(BATCH, 4, dtype=torch.float64) * 100
    ids = torch.stack([torch.randint(2, 20, (BATCH,))] + [torch.randint(0, 20, (BATCH,))
                                                         for _ in range(5)], dim=1)  # fmt: skip
    frame = pd.DataFrame(raw_dense.numpy(), columns=list(SCHEMA.dense))
    frame["c0"] = [shops[i - 2] for i in ids[:, 0].tolist()]
    for j, feature in enumerate(SCHEMA.feature_names[1:], start=1):
        frame[feature] = ids[:, j].numpy()
    with torch.no_grad():
        inputs = transform_dense(raw_dense.float(), dense_fit)
        expected = torch.sigmoid(model(inputs, to_kjt(ids, SCHEMA.feature_names)))
    mlflow.set_tracking_uri(server.uri)
    try:
        loaded = mlflow.pyfunc.load_model(result.model_uri)
    finally:
        mlflow.set_tracking_uri(None)
    np.testing.assert_allclose(loaded.predict(frame), expected.numpy(), rtol=1e-6)
    # Rows as a user's file holds them: whole numbers in int64 columns, ids as numbers (the
    # signature's typed columns refused both), scored as the same values in texts/floats.
    whole = frame.assign(**{c: frame[c].round() for c in SCHEMA.dense})
    as_read = whole.astype({c: "int64" for c in SCHEMA.dense}).assign(c0=frame["c0"].astype(int))
    assert as_read["c0"].dtype == np.int64
    np.testing.assert_allclose(loaded.predict(as_read), loaded.predict(whole), rtol=1e-6)
    # Texts as a CSV read with dtype=str holds them: numbers, and "N/A"/"null" as missing
    # values (filled as training filled them: the mean, 0 once standardized)
    texts = whole.astype({c: str for c in SCHEMA.dense})
    texts.loc[0, SCHEMA.dense[0]], texts.loc[1, SCHEMA.dense[2]] = "N/A", " null"
    blanks = whole.astype({c: float for c in SCHEMA.dense})
    blanks.loc[0, SCHEMA.dense[0]] = blanks.loc[1, SCHEMA.dense[2]] = np.nan
    np.testing.assert_allclose(loaded.predict(texts), loaded.predict(blanks), rtol=1e-6)
    # pandas' nullable columns (`convert_dtypes`, `dtype_backend=`): pd.NA is missing too (a
    # dense one was "<NA> is not a number", a categorical one crashed the standalone module)
    nullable = blanks.convert_dtypes()
    nullable.loc[3, "c0"], blanks.loc[3, "c0"] = pd.NA, None
    assert nullable[SCHEMA.dense[0]].isna()[0] and nullable["c0"].isna()[3]
    np.testing.assert_allclose(loaded.predict(nullable), loaded.predict(blanks), rtol=1e-6)
    texts.loc[2, SCHEMA.dense[1]] = "cheap"
    with pytest.raises(Exception, match=rf"dense column '{SCHEMA.dense[1]}', row 2: 'cheap'"):
        loaded.predict(texts)
    with pytest.raises(Exception, match="c0"):
        loaded.predict(frame.drop(columns=["c0"]))


@pytest.mark.slow
def test_the_registered_model_serves_from_a_fresh_venv(server: ServerInfo, tmp_path: Path) -> None:
    """What a serving host does: a new venv from the model's own requirements (the package
    index only, no ranknas, no torchrec), `mlflow models serve`, raw rows over HTTP."""
    import json
    import socket
    import subprocess
    import time
    import urllib.request

    import mlflow

    arch = preset("dcnv2", SCHEMA)  # the cross block, written in plain torch
    model = _perturbed(arch)
    shops = [f"shop-{k}" for k in range(18)]
    result = export_model(arch, model.state_dict(), {}, tmp_path / "export", schema=SCHEMA,
                          register="ranknas-venv", tracking_uri=server.uri,
                          preprocessing={"vocabulary": {"c0": shops}})  # fmt: skip
    mlflow.set_tracking_uri(server.uri)
    try:
        served_dir = tmp_path / "served"
        served_dir.mkdir()
        local = Path(mlflow.artifacts.download_artifacts(result.model_uri, dst_path=served_dir))
        expected = mlflow.pyfunc.load_model(str(local))
    finally:
        mlflow.set_tracking_uri(None)
    requirements = (local / "requirements.txt").read_text()
    assert "torchrec" not in requirements and "fbgemm" not in requirements
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    pip = [
        str(venv / "bin" / "python"),
        "-m",
        "pip",
        "install",
        "-q",
        "--disable-pip-version-check",
    ]
    subprocess.run([*pip, "-r", str(local / "requirements.txt")], check=True, timeout=1200)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    serve = subprocess.Popen(
        [
            str(venv / "bin" / "mlflow"),
            "models",
            "serve",
            "-m",
            str(local),
            "--env-manager",
            "local",
            "-h",
            "127.0.0.1",
            "-p",
            str(port),
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        env=os.environ | {"PATH": f"{venv / 'bin'}{os.pathsep}{os.environ['PATH']}"},
    )  # fmt: skip  (as with the venv activated: the server starts its own uvicorn)
    try:
        for _ in range(180):
            try:
                urllib.request.urlopen(f"http://127.0.0.1:{port}/ping", timeout=2)
                break
            except OSError:
                assert serve.poll() is None, serve.stderr.read().decode()[-3000:]
                time.sleep(1)
        frame = pd.DataFrame(np.random.default_rng(0).random((8, 4)) * 100,
                             columns=list(SCHEMA.dense))  # fmt: skip
        frame["c0"] = ["shop-3", "shop-0", "never-seen", "", "shop-17", "shop-3", "x", "shop-1"]
        for feature in SCHEMA.feature_names[1:]:
            frame[feature] = np.arange(8) % 4
        body = json.dumps({"dataframe_split": frame.to_dict(orient="split")}).encode()
        request = urllib.request.Request(f"http://127.0.0.1:{port}/invocations", body,
                                         {"Content-Type": "application/json"})  # fmt: skip
        with urllib.request.urlopen(request, timeout=60) as response:
            served = np.asarray(json.loads(response.read())["predictions"], dtype=np.float64)
    finally:
        serve.terminate()
        serve.wait(timeout=30)
    np.testing.assert_allclose(served, expected.predict(frame), rtol=1e-5)


def test_the_export_on_raw_rows_with_lists_reproduces_the_recorded_test_ne(
    server: ServerInfo, tmp_path: Path
) -> None:
    """A model trained on a multi-valued (mean-pooled) column and a one-hot column, exported:
    the standalone module and the registered model turn the raw test rows (lists as the
    file's texts and as Python lists) into the same predictions, and so the same test NE,
    as training recorded."""
    import sys

    import mlflow

    from helpers import write_genre_log
    from trainers.data import load_tabular
    from trainers.data.preprocess import apply_preprocessing, fit_preprocessing
    from trainers.metrics import ranking_metrics
    from trainers.trainer import TrainConfig, train

    csv, schema_file = write_genre_log(tmp_path, rows=2000)
    data = load_tabular(csv, schema_file)
    parts = data.split(method="time")
    fitted = fit_preprocessing(parts[0])
    train_part, valid, test = (apply_preprocessing(p, fitted) for p in parts)
    arch = preset("dcnv2", train_part.schema)
    assert {f.name: f.pooling for f in arch.embedding.features} == {"shop": "sum",
                                                                    "genres": "mean"}  # fmt: skip
    model = build_model(arch, seed=0)
    config = TrainConfig(batch_size=128, max_epochs=2, seed=0, device="cpu")
    result = train(model, train_part, valid, test, config)
    assert result.status == "complete" and result.test["ne"] < 0.95
    registered = export_model(arch, model.state_dict(), result.summary(), tmp_path / "export",
                              schema=train_part.schema, preprocessing=fitted,
                              register="ranknas-lists", tracking_uri=server.uri)  # fmt: skip
    out = registered.out_dir
    exported = load_exported(out)
    module = sys.modules[type(exported).__module__]
    assert module.POOLINGS == ("sum", "mean")
    card = registered.model_card.read_text()
    assert "| `genres` | a list (mean of its embeddings) |" in card
    assert "| `shop` | one value |" in card and "m.encode_ids(" in card
    frame = pd.read_csv(csv, keep_default_na=False).iloc[data.split_indices(method="time")[2]]
    raw_dense = torch.tensor(frame[list(module.DENSE_COLUMNS)].to_numpy(np.float32))
    dense = module.prepare_dense(raw_dense, out)
    for genres in (frame["genres"].tolist(), [g.split("|") for g in frame["genres"]]):
        raw = {"shop": frame["shop"].tolist(), "genres": genres}
        ids = module.encode_ids([raw[f] for f in module.FEATURES], module.FEATURES, out)
        with torch.no_grad():
            probabilities = torch.sigmoid(exported(dense, ids)).numpy()
        served = ranking_metrics(probabilities, frame["clicked"].to_numpy())
        assert served["ne"] == pytest.approx(result.test["ne"], abs=1e-6)
    batch = next(iter(test.loader(len(test))))
    with torch.no_grad():
        assert torch.equal(exported(dense, ids), model.eval()(batch.dense, batch.sparse))
    mlflow.set_tracking_uri(server.uri)
    try:
        loaded = mlflow.pyfunc.load_model(registered.model_uri)
    finally:
        mlflow.set_tracking_uri(None)
    as_lists = frame[["price", "shop"]].assign(genres=[g.split("|") for g in frame["genres"]])
    np.testing.assert_allclose(loaded.predict(as_lists), probabilities, rtol=1e-6)
    with_nulls = as_lists.assign(genres=[[*g, None] for g in as_lists["genres"]])  # no items
    np.testing.assert_allclose(loaded.predict(with_nulls), probabilities, rtol=1e-6)
    as_in_the_file = pd.read_csv(csv).iloc[data.split_indices(method="time")[2]]  # "g1|g2"
    np.testing.assert_allclose(loaded.predict(as_in_the_file), probabilities, rtol=1e-6)
    with pytest.raises(ValueError, match="feature 'genres', row 1: an empty item"):
        module.encode_ids([["s1", "s2"], ["g1", "g2||g3"]], module.FEATURES, out)
    # a list for a single-valued feature was scored as one unseen value
    with pytest.raises(ValueError, match=r"feature 'shop', row 1: \['s1', 's2'\] is a collection"):
        module.encode_ids([["s1", ["s1", "s2"]], ["g1", "g2"]], module.FEATURES, out)
    # every bad cell of a request is told, a malformed list beside a bad number included
    bad = as_in_the_file.head(2).assign(price=["abc", 0.5], genres=["g1", "g2||g3"],
                                        shop=["s1", {"id": "s2"}])  # fmt: skip
    from mlflow.exceptions import MlflowException

    with pytest.raises(MlflowException) as raised:
        loaded.predict(bad)
    assert raised.value.message.splitlines() == [
        "dense column 'price', row 0: 'abc' is not a number; give a number (blank, N/A or "
        "null for missing)",
        "categorical column 'shop', row 1: {'id': 's2'} is a collection, not one value; this "
        "column takes one value a row",
        "categorical column 'genres', row 1: 'g2||g3' holds an empty item (separator '|'): "
        "give its items",
    ]
    many = pd.concat([bad.head(1)] * 60, ignore_index=True)  # 60 bad prices: 50 told, a count
    with pytest.raises(MlflowException) as raised:
        loaded.predict(many)
    told = raised.value.message.splitlines()
    assert len(told) == 51 and told[49].startswith("dense column 'price', row 49: 'abc'")
    assert told[50] == (
        "... and 10 more like these (60 in all): fix those above, then send the request again"
    )


def test_an_export_without_its_left_out_features_reads_only_the_used_ones(cases):
    """Features an around search left out (dim 0) have no table: the module's id matrix and
    the served columns are the used features only; the card names the others."""
    case = cases["around-left-out"]
    used = [f.name for f in case.arch.embedding.used]
    left_out = [f.name for f in case.arch.embedding.features if f.name not in used]
    assert left_out and len(used) + len(left_out) == len(SCHEMA.categorical)
    model = load_exported(case.result.out_dir)
    module = sys.modules[type(model).__module__]
    assert list(module.FEATURES) == used
    with torch.no_grad():
        torch.testing.assert_close(model(case.dense, case.ids), case.expected)
    card = (case.result.out_dir / "model_card.md").read_text()
    assert (
        "Left out by the search (dim 0: no table, the model never reads them): "
        + ", ".join(f"`{n}`" for n in left_out)
        in card
    )
    # what the module needs elsewhere, pinned (a clean venv without numpy warned each run)
    pins = re.search(r"`pip install (torch==\S+ safetensors==\S+ numpy==\S+)`", card)
    assert pins and "pandas" not in pins.group(1), card
