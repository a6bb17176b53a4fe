"""Export a trained architecture as a directory that runs without ranknas.

`export_model` writes:

- `architecture.json`: the bound spec;
- `model.safetensors`: the weights (the state dict of `search_space.builder.RankingModel`);
- `ranknas_model.py`: a standalone module that needs only torch, torchrec and safetensors. It
  holds a copy of the block library (`search_space/shapes.py`, `params.py`, `blocks.py`, with
  their ranknas imports removed) and of `nas/standalone_template.py`, then a generated
  `RankingModel` whose constructor writes every shape and setting out and whose `forward` is
  straight-line code, one statement per block. Submodule names match ranknas's
  `RankingModel`, so the state dict loads as is, and every tensor operation is the one
  ranknas's model runs, so outputs are bit-identical for the same weights and inputs (inputs
  laid out alike: CPU kernels round differently for unaligned or column-major tensors);
- `model_card.md`: blocks, costs, metrics, inputs, how to load.

With `register=NAME` the directory is also logged to MLflow as a pyfunc model "from code" (no
pickle: MLflow stores the entry-point source and the files above) and registered as a new
version of NAME, which then gets the alias (`champion` by default).
"""

from __future__ import annotations

import ast
import http.client
import importlib.metadata
import importlib.util
import inspect
import json
import keyword
import math
import os
import re
import sys
import tempfile
import textwrap
import urllib.request
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from types import ModuleType
from typing import Any

import torch
from safetensors.torch import save_file
from torch import nn

from nas import standalone_template
from search_space import blocks, params, shapes
from search_space.architecture import Analysis, Architecture, analyze, digest
from search_space.blocks import OPS
from search_space.builder import RankingModel
from search_space.errors import RanknasError
from search_space.schema import DatasetSchema
from search_space.shapes import Dense, Shape, Sparse

ARCHITECTURE_FILE = "architecture.json"
WEIGHTS_FILE = "model.safetensors"
MODULE_FILE = "ranknas_model.py"
CARD_FILE = "model_card.md"
EXPERIMENT = "ranknas-export"  # the MLflow experiment of the runs that log exported models

_LINE = 100  # line length of the generated code (the project's ruff setting)
_COPIED: tuple[ModuleType, ...] = (shapes, params, blocks, standalone_template)
_NOT_IMPORTED = {"__future__", "search_space", "nas", "ranknas"}  # the copies are local
_MODEL_IMPORTS = """
from pathlib import Path
import torch
from torch import nn
from torchrec.sparse.jagged_tensor import KeyedJaggedTensor
"""


@dataclass(frozen=True)
class ExportResult:
    """What `export_model` wrote, and where the model was registered (if it was)."""

    out_dir: Path
    architecture: Path
    weights: Path
    module: Path
    model_card: Path
    digest: str
    model_name: str | None = None
    model_version: str | None = None
    alias: str | None = None
    model_uri: str | None = None  # models:/NAME@alias


@dataclass(frozen=True)
class _Columns:
    """The input columns, in the order the model reads them."""

    dense: tuple[str, ...]
    features: tuple[str, ...]
    dataset: str | None = None  # the schema's name, when one was given

    @classmethod
    def of(cls, arch: Architecture, schema: DatasetSchema | None) -> _Columns:
        dense = schema.dense if schema else tuple(f"dense_{i}" for i in range(arch.num_dense or 0))
        features = tuple(f.name for f in arch.embedding.features)
        columns = cls(tuple(dense), features, schema.name if schema else None)
        if len(set(columns.dense + columns.features)) != len(columns.dense + columns.features):
            raise RanknasError(
                "a categorical feature is named like a dense column (dense_0, ...): pass the "
                "dataset schema so that the dense columns get their own names"
            )
        return columns


def export_model(
    arch: Architecture,
    state_dict: Mapping[str, torch.Tensor],
    metrics: Mapping[str, Any],
    out_dir: str | Path,
    *,
    schema: DatasetSchema | None = None,
    register: str | None = None,
    tracking_uri: str | None = None,
    alias: str = "champion",
) -> ExportResult:
    """Write the export directory (see the module docstring); register it if `register`.

    `schema` names the dense columns and checks that `arch` fits the data (without it the
    dense columns are called dense_0, dense_1, ...). `metrics` is a flat mapping (name ->
    number or text) shown in the model card and logged with the registered model.
    `tracking_uri` defaults to $MLFLOW_TRACKING_URI.
    """
    if schema is not None:
        arch = arch.bind(schema)
    analysis = analyze(arch)
    columns = _Columns.of(arch, schema)
    tensors = _checked_weights(analysis, state_dict)
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    arch_digest = digest(arch)
    result = ExportResult(
        out_dir=out,
        architecture=out / ARCHITECTURE_FILE,
        weights=out / WEIGHTS_FILE,
        module=out / MODULE_FILE,
        model_card=out / CARD_FILE,
        digest=arch_digest,
    )
    result.architecture.write_text(arch.to_json() + "\n")
    save_file(tensors, str(result.weights), metadata={"ranknas_digest": arch_digest})
    result.module.write_text(_standalone_module(analysis, columns, arch_digest))
    card = _model_card(analysis, metrics, columns, arch_digest, register, alias)
    result.model_card.write_text(card)
    if register is None:
        return result
    return _register(result, analysis, metrics, columns, register, tracking_uri, alias)


def load_exported(out_dir: str | Path, device: str = "cpu") -> nn.Module:
    """The model of an export directory, rebuilt by its own `ranknas_model.py`, in eval mode."""
    directory = Path(out_dir)
    return _import_file(directory / MODULE_FILE).load(directory, device)


def _import_file(path: Path) -> ModuleType:
    name = f"ranknas_model_{abs(hash(str(path.resolve())))}"
    spec = importlib.util.spec_from_file_location(name, path)
    if spec is None or spec.loader is None:
        raise RanknasError(f"{path}: not a Python module")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # dataclasses look their module up while it executes
    spec.loader.exec_module(module)
    return module


# ---------------------------------------------------------------------- weights


def _checked_weights(
    analysis: Analysis, state_dict: Mapping[str, torch.Tensor]
) -> dict[str, torch.Tensor]:
    """The weights as safetensors stores them, once checked against the architecture."""
    expected = RankingModel(analysis, device="meta").state_dict()
    missing = sorted(expected.keys() - state_dict.keys())
    unexpected = sorted(state_dict.keys() - expected.keys())
    reshaped = sorted(
        f"{key} {list(state_dict[key].shape)} (expected {list(expected[key].shape)})"
        for key in expected.keys() & state_dict.keys()
        if state_dict[key].shape != expected[key].shape
    )
    problems = [
        f"{what}: {', '.join(keys[:5])}{' ...' if len(keys) > 5 else ''}"
        for what, keys in (("missing", missing), ("unexpected", unexpected), ("shape", reshaped))
        if keys
    ]
    if problems:
        raise RanknasError(
            f"the weights do not fit {analysis.arch.name or digest(analysis.arch)!r}"
            f" ({'; '.join(problems)}): export the state dict of the model built from it"
        )
    return _storable(state_dict)


def _storable(state_dict: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Detached CPU tensors, each contiguous and with memory of its own: safetensors refuses
    non-contiguous tensors and tensors that share storage."""
    seen: set[int] = set()
    tensors = {}
    for key, value in state_dict.items():
        tensor = value.detach().cpu()
        storage = tensor.untyped_storage().data_ptr()
        if not tensor.is_contiguous() or storage in seen:
            tensor = tensor.clone(memory_format=torch.contiguous_format)
        else:
            seen.add(storage)
        tensors[key] = tensor
    return tensors


# ---------------------------------------------------------------------- the standalone module


def _standalone_module(analysis: Analysis, columns: _Columns, arch_digest: str) -> str:
    """The source of `ranknas_model.py` for a validated architecture."""
    imports, bodies = _copied_sources()
    header = [
        _module_docstring(analysis.arch, columns, arch_digest),
        "from __future__ import annotations",
        _import_block([*imports, *ast.parse(_MODEL_IMPORTS).body]),
    ]
    code = [
        *bodies,
        _section("This architecture"),
        _constants(analysis, columns, arch_digest),
        _model_class(analysis),
        _LOAD_FUNCTION,
    ]
    # isort wants one blank line between the imports and the banner comment below them
    body = "\n\n\n".join(part.strip("\n") for part in code)
    return "\n\n".join([*header, body]) + "\n"


def _copied_sources() -> tuple[list[ast.stmt], list[str]]:
    """The imports and, below a banner, the code (docstring and imports removed) of the
    modules copied into the standalone file."""
    imports: list[ast.stmt] = []
    bodies = []
    for module in _COPIED:
        source = inspect.getsource(module)
        tree = ast.parse(source)
        dropped: set[int] = set()
        for node in tree.body:
            is_docstring = isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant)
            if isinstance(node, ast.Import | ast.ImportFrom):
                imports.append(node)
            elif not is_docstring:
                continue
            dropped.update(range(node.lineno, (node.end_lineno or node.lineno) + 1))
        kept = [line for i, line in enumerate(source.splitlines(), 1) if i not in dropped]
        body = "\n".join(kept).strip("\n")
        while "\n\n\n\n" in body:
            body = body.replace("\n\n\n\n", "\n\n\n")
        bodies.append(f"{_section(f'Copied from ranknas: {module.__name__}')}\n\n\n{body}")
    return imports, bodies


def _section(title: str) -> str:
    return f"# {'-' * (_LINE - 2)}\n# {title}"


def _import_block(nodes: Sequence[ast.stmt]) -> str:
    """One sorted import block (isort order: stdlib, then third party; `import x` before
    `from x import y`), without `__future__` and the project's own imports."""
    plain: set[str] = set()
    names: dict[str, set[str]] = {}
    for node in nodes:
        if isinstance(node, ast.Import):
            plain.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module:
            names.setdefault(node.module, set()).update(a.name for a in node.names)
    sections = []
    for stdlib in (True, False):
        lines = [f"import {name}" for name in _modules(plain, stdlib)]
        lines += [_from_import(module, names[module]) for module in _modules(names, stdlib)]
        sections.append("\n".join(lines))
    return "\n\n".join(section for section in sections if section)


def _modules(modules: Iterable[str], stdlib: bool) -> list[str]:
    """The standard library's (or the others') modules to import, sorted."""
    return sorted(
        (m for m in modules if m.split(".")[0] not in _NOT_IMPORTED and _is_stdlib(m) == stdlib),
        key=str.lower,
    )


def _is_stdlib(module: str) -> bool:
    return module.split(".")[0] in sys.stdlib_module_names


def _from_import(module: str, names: set[str]) -> str:
    def order(name: str) -> tuple[int, str]:  # isort's order-by-type: CONSTANT, Class, other
        kind = 0 if name.isupper() and len(name) > 1 else 1 if name[0].isupper() else 2
        return kind, name

    ordered = sorted(names, key=order)
    line = f"from {module} import {', '.join(ordered)}"
    if len(line) <= _LINE:
        return line
    return f"from {module} import (\n" + "".join(f"    {n},\n" for n in ordered) + ")"


def _module_docstring(arch: Architecture, columns: _Columns, arch_digest: str) -> str:
    name = _doc_name(arch.name) if arch.name else "A ranking model"
    title = f"{name}, exported by ranknas (architecture {arch_digest})."
    features = ", ".join(map(_doc_name, columns.features)) or "(none)"
    dense = ", ".join(map(_doc_name, columns.dense)) or "(none)"
    inputs = (
        f"Inputs: `dense`, float32 [B, {len(columns.dense)}], columns {dense}; `sparse`, a "
        f"KeyedJaggedTensor with one id per example for each feature: {features}."
    )
    text = f'''
        """{title}

        Standalone: this module needs torch, torchrec and safetensors, not ranknas. It rebuilds
        the network of `{ARCHITECTURE_FILE}` and loads the weights of `{WEIGHTS_FILE}`:

            import torch
            import ranknas_model as m

            model = m.load("path/to/the/export/directory")
            dense = torch.zeros(8, len(m.DENSE_COLUMNS))  # float, DENSE_COLUMNS order
            ids = torch.zeros(8, len(m.FEATURES), dtype=torch.long)  # FEATURES order
            with torch.no_grad():
                probabilities = torch.sigmoid(model(dense, m.ids_to_kjt(ids, m.FEATURES)))

        {{inputs}}

        Below: ranknas's block library (search_space shapes, params and blocks) and its export
        helpers, copied unchanged, then `RankingModel`: this architecture, with every shape and
        setting written out and a forward pass of one statement per block.
        """
    '''
    wrapped = textwrap.fill(inputs, _LINE - 4, break_on_hyphens=False)
    text = textwrap.dedent(text).strip().replace("{inputs}", wrapped)
    return text.replace("\\", "\\\\")


def _doc_name(name: str) -> str:
    """A user's name as the docstring shows it: as is when plain, else quoted and escaped,
    so that no name can end the docstring or put raw control characters in the file."""
    if re.fullmatch(r"[\w .:/-]+", name):
        return name
    return _str_literal(name).replace('"', '\\"')  # no three quotes in a row, ever


def _constants(analysis: Analysis, columns: _Columns, arch_digest: str) -> str:
    emb = analysis.arch.embedding
    values = [
        ("DIGEST", arch_digest, "ranknas's hash of the architecture"),
        ("DENSE_COLUMNS", columns.dense, "the columns of `dense`, in order"),
        ("FEATURES", columns.features, "the keys of `sparse`, the columns of an id matrix"),
        ("NUM_EMBEDDINGS", tuple(f.num_embeddings for f in emb.features), "rows of each table"),
        ("FEATURE_DIMS", tuple(emb.feature_dim(f) for f in emb.features), "dim of each table"),
        ("EMBEDDING_DIM", emb.dim, "the dim of the embeddings that the blocks see"),
        ("WEIGHTS_FILE", WEIGHTS_FILE, "the weights, next to this file"),
    ]
    return "\n".join(
        f"# {comment}\n{_statement(name, _literal(value), 0)}" for name, value, comment in values
    )


# ---------------------------------------------------------------------- the generated model


def _model_class(analysis: Analysis) -> str:
    """`RankingModel`: methods at their final indentation, so that line lengths are right."""
    arch = analysis.arch
    head_width = analysis.shapes[arch.output_block].numel
    init = [
        "    def __init__(self) -> None:",
        "        super().__init__()",
        _statement("self.embedding_bags", _EMBEDDING_BAGS, 8),
        _statement("self.feature_projections", _feature_projections(arch), 8),
        _statement("self.merge_projections", _merge_projections(analysis), 8),
        _statement("self.blocks", _blocks(analysis), 8),
        _statement("self.head", _call("nn.Linear", [str(head_width), "1"]), 8),
    ]
    methods = ["\n".join(init)]
    if _reads_sparse(analysis):
        methods.append(_embed_method(arch))
    methods.append(_forward_method(analysis))
    doc = '    """`forward(dense, sparse)` -> logits [B]; `torch.sigmoid` gives probabilities."""'
    return "\n\n".join(["class RankingModel(nn.Module):\n" + doc, *methods])


def _reads_sparse(analysis: Analysis) -> bool:
    return any("sparse" in analysis.arch.block(name).inputs for name in analysis.order)


_EMBEDDING_BAGS = "embedding_bag_collection(FEATURES, NUM_EMBEDDINGS, FEATURE_DIMS)"
_LOAD_FUNCTION = '''
def load(directory: str | Path = ".", device: str = "cpu") -> RankingModel:
    """The model with its trained weights (`model.safetensors` in `directory`), in eval mode."""
    return load_weights(RankingModel(), Path(directory) / WEIGHTS_FILE, device)
'''


def _feature_projections(arch: Architecture) -> _Expr:
    emb = arch.embedding
    entries = {
        f.name: _call("nn.Linear", [str(emb.feature_dim(f)), str(emb.dim), "bias=False"])
        for f in emb.features
        if emb.feature_dim(f) != emb.dim
    }
    return _module_dict(entries)


def _merge_projections(analysis: Analysis) -> _Expr:
    dim = analysis.arch.embedding.dim
    entries = {
        f"{p.block}__{p.source}": _call("nn.Linear", [str(p.width), str(dim)])
        for p in analysis.projections
    }
    return _module_dict(entries)


def _blocks(analysis: Analysis) -> _Expr:
    entries = {}
    for name in analysis.order:
        cls = OPS[analysis.arch.block(name).op]
        settings = [f"{key}={_flat(_literal(v))}" for key, v in analysis.params[name].items()]
        entries[name] = _call(cls.__name__, [_shape(analysis.input_shapes[name]), *settings])
    return _module_dict(entries)


def _shape(shape: Shape | tuple[Dense, ...]) -> _Expr:
    if isinstance(shape, tuple):
        return _Call("", tuple(_shape(s) for s in shape), "()")
    if isinstance(shape, Sparse):
        return f"Sparse({shape.count}, {shape.dim})"
    return f"Dense({shape.width})"


def _module_dict(entries: Mapping[str, _Expr]) -> _Expr:
    if not entries:
        return "nn.ModuleDict()"
    items = tuple(_keyed(_str_literal(key) + ": ", value) for key, value in entries.items())
    return _call("nn.ModuleDict", [_Call("", items, "{}")])


def _embed_method(arch: Architecture) -> str:
    emb = arch.embedding
    lines = [
        "    def embed(self, sparse: KeyedJaggedTensor) -> torch.Tensor:",
        f'        """Pooled embeddings [B, {len(emb.features)}, {emb.dim}], in FEATURES order."""',
    ]
    if all(emb.feature_dim(f) == emb.dim for f in emb.features):
        lines += [
            "        values = self.embedding_bags(sparse).values()",
            f"        return values.view(values.shape[0], -1, {emb.dim})",
        ]
        return "\n".join(lines)
    columns = []
    for f in emb.features:
        pooled = f"pooled[{_str_literal(f.name)}]"
        projected = emb.feature_dim(f) != emb.dim
        columns.append(
            f"self.feature_projections[{_str_literal(f.name)}]({pooled})" if projected else pooled
        )
    stack = _call("torch.stack", [_Call("", tuple(columns), "[]"), "dim=1"])
    lines += ["        pooled = self.embedding_bags(sparse).to_dict()", _line("return ", stack, 8)]
    return "\n".join(lines)


def _forward_method(analysis: Analysis) -> str:
    arch = analysis.arch
    variables = _variable_names(analysis.order)
    lines = [
        "    def forward(self, dense: torch.Tensor, sparse: KeyedJaggedTensor) -> torch.Tensor:",
        '        """Logits [B] from `dense` [B, len(DENSE_COLUMNS)] and `sparse` (FEATURES)."""',
    ]
    if _reads_sparse(analysis):
        lines.append("        embedded = self.embed(sparse)")
    for name in analysis.order:
        block = arch.block(name)
        shape = analysis.input_shapes[name]
        inputs = ", ".join(str(s) for s in shape) if isinstance(shape, tuple) else str(shape)
        lines.append(f"        # {name}: {block.op}, {inputs} -> {analysis.shapes[name]}")
        merged = _merged_input(analysis, name, variables)
        call = _call(f"self.blocks[{_str_literal(name)}]", [merged])
        lines.append(_statement(variables[name], call, 8))
    out = variables[arch.output_block]
    flat = ".flatten(1)" if isinstance(analysis.shapes[arch.output_block], Sparse) else ""
    lines.append(f"        return self.head({out}{flat}).squeeze(1)")
    return "\n".join(lines)


def _merged_input(analysis: Analysis, name: str, variables: Mapping[str, str]) -> _Expr:
    """The expression a block reads: its inputs merged as ranknas's `RankingModel` does."""
    cls = OPS[analysis.arch.block(name).op]
    projected = {p.source for p in analysis.projections if p.block == name}
    parts = []
    for source in analysis.arch.block(name).inputs:
        var, is_sparse = variables[source], isinstance(analysis.shapes[source], Sparse)
        if cls.input_kind == "dense":
            parts.append(f"{var}.flatten(1)" if is_sparse else var)
        elif is_sparse:
            parts.append(var)
        elif source in projected:
            key = _str_literal(f"{name}__{source}")
            parts.append(f"self.merge_projections[{key}]({var}).unsqueeze(1)")
        else:
            parts.append(f"{var}.unsqueeze(1)")
    if cls.takes_list:
        return _Call("", tuple(parts), "[]")
    if len(parts) == 1:
        return parts[0]
    return _call("torch.cat", [_Call("", tuple(parts), "[]"), "dim=1"])


def _variable_names(order: Sequence[str]) -> dict[str, str]:
    """A local variable per block: its name, with underscores added where that is a keyword
    or a name `forward` uses otherwise."""
    taken = {"self", "dense", "sparse", "embedded", "torch", *order}
    variables = {"dense": "dense", "sparse": "embedded"}
    for name in order:
        var = name
        if keyword.iskeyword(name) or name in {"self", "embedded", "torch"}:
            while var in taken or keyword.iskeyword(var):
                var += "_"
            taken.add(var)
        variables[name] = var
    return variables


# ---------------------------------------------------------------------- code layout


@dataclass(frozen=True)
class _Call:
    """A bracketed expression: a call (`func(...)`), or a literal (`func` empty)."""

    func: str
    args: tuple[_Expr, ...]
    brackets: str = "()"


_Expr = str | _Call


def _call(func: str, args: Sequence[_Expr]) -> _Call:
    return _Call(func, tuple(args))


def _keyed(prefix: str, value: _Expr) -> _Expr:
    """A dict entry `key: value` (the key joins the value's first line)."""
    return prefix + value if isinstance(value, str) else replace(value, func=prefix + value.func)


def _flat(expr: _Expr) -> str:
    if isinstance(expr, str):
        return expr
    inner = ", ".join(_flat(a) for a in expr.args)
    if expr.brackets == "()" and not expr.func and len(expr.args) == 1:
        inner += ","  # a one-element tuple
    return f"{expr.func}{expr.brackets[0]}{inner}{expr.brackets[1]}"


def _render(expr: _Expr, indent: int, column: int, tail: int) -> str:
    """`expr` laid out as ruff format does: on one line if it fits (from `column`, with `tail`
    characters after it), else its brackets broken: the arguments on one line if they fit,
    else one per line with a trailing comma."""
    text = _flat(expr)
    if isinstance(expr, str) or column + len(text) + tail <= _LINE:
        return text
    inner = indent + 4
    pad = " " * inner
    joined = ", ".join(_flat(a) for a in expr.args)
    if inner + len(joined) <= _LINE:
        body = pad + joined
    elif len(expr.args) == 1:
        body = pad + _render(expr.args[0], inner, inner, 0)
    else:
        body = "\n".join(pad + _render(a, inner, inner, 1) + "," for a in expr.args)
    return f"{expr.func}{expr.brackets[0]}\n{body}\n{' ' * indent}{expr.brackets[1]}"


def _statement(target: str, expr: _Expr, indent: int) -> str:
    return _line(f"{target} = ", expr, indent)


def _line(prefix: str, expr: _Expr, indent: int) -> str:
    """`prefix` then `expr`, indented by `indent`."""
    start = " " * indent + prefix
    return start + _render(expr, indent, len(start), 0)


def _literal(value: Any) -> _Expr:
    if isinstance(value, str):
        return _str_literal(value)
    if isinstance(value, tuple | list):
        return _Call("", tuple(_literal(v) for v in value), "()")
    return repr(value)  # int, bool, None


def _str_literal(text: str) -> str:
    # json.dumps of printable ASCII only escapes " and \, as Python does
    return json.dumps(text) if text.isascii() and text.isprintable() else repr(text)


# ---------------------------------------------------------------------- model card


def _model_card(
    analysis: Analysis,
    metrics: Mapping[str, Any],
    columns: _Columns,
    arch_digest: str,
    register: str | None = None,
    alias: str = "champion",
) -> str:
    """The Markdown model card of an export."""
    arch = analysis.arch
    sections = [
        f"# {arch.name or 'ranknas model'}\n\n"
        f"Exported by ranknas. Architecture digest `{arch_digest}`; "
        f"{analysis.flops:,} FLOPs per example; {analysis.params_total:,} parameters "
        f"({analysis.dense_params:,} dense, {analysis.embedding_params:,} in embeddings).",
        "## Metrics\n\n" + _metrics_table(metrics),
        "## Inputs\n\n" + _inputs_section(arch, columns),
        "## Architecture\n\n" + _blocks_table(analysis),
        "## Files and loading\n\n" + _loading_section(register, alias),
    ]
    return "\n\n".join(sections) + "\n"


def _table(header: Sequence[str], rows: Sequence[Sequence[Any]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(str(cell) for cell in row) + " |" for row in rows]
    return "\n".join(lines)


def _metrics_table(metrics: Mapping[str, Any]) -> str:
    if not metrics:
        return "No metrics were given."
    return _table(["metric", "value"], [(name, _format(value)) for name, value in metrics.items()])


def _format(value: Any) -> str:
    if isinstance(value, float):
        return f"{value:.6g}"
    if isinstance(value, int) and not isinstance(value, bool):
        return f"{value:,}"
    return "—" if value is None else str(value)


def _inputs_section(arch: Architecture, columns: _Columns) -> str:
    emb = arch.embedding
    dense = ", ".join(f"`{c}`" for c in columns.dense) or "none"
    rows = [(f"`{f.name}`", f"{f.num_embeddings:,}", emb.feature_dim(f)) for f in emb.features]
    dataset = f"Dataset `{columns.dataset}`. " if columns.dataset else ""
    return (
        f"{dataset}Dense: {len(columns.dense)} float columns, in this order: {dense}.\n\n"
        f"Categorical: {len(rows)} features, one id per example each, in "
        "[0, num_embeddings), in this order (the columns of the id matrix):\n\n"
        + _table(["feature", "num_embeddings", "embedding dim"], rows)
        + f"\n\nThe blocks see every embedding at dim {emb.dim}; a feature of another dim is "
        "projected to it by a linear layer."
    )


def _blocks_table(analysis: Analysis) -> str:
    arch = analysis.arch
    rows = []
    for name in analysis.order:
        block = arch.block(name)
        settings = ", ".join(
            f"{key}={json.dumps(list(v) if isinstance(v, tuple) else v)}"
            for key, v in analysis.params[name].items()
            if v is not None
        )
        rows.append(
            (
                f"`{name}`",
                block.op,
                ", ".join(block.inputs),
                settings or "—",
                analysis.shapes[name],
                f"{analysis.block_flops[name]:,}",
                f"{analysis.block_params[name]:,}",
            )
        )
    other_flops = analysis.flops - sum(analysis.block_flops.values())
    other_params = analysis.dense_params - sum(analysis.block_params.values())
    rows.append(
        ("projections + head", "linear", "", "", "logit", f"{other_flops:,}", f"{other_params:,}")
    )
    rows.append(("embeddings", "", "", "", "", "0", f"{analysis.embedding_params:,}"))
    rows.append(("**total**", "", "", "", "", f"{analysis.flops:,}", f"{analysis.params_total:,}"))
    header = ["block", "op", "inputs", "settings", "output", "FLOPs", "params"]
    return (
        f"Blocks in execution order; the head is a linear layer from `{arch.output_block}` to "
        "one logit. FLOPs are per example (2 per multiply-add).\n\n" + _table(header, rows)
    )


def _loading_section(register: str | None, alias: str) -> str:
    text = f"""
        - `{ARCHITECTURE_FILE}`: the architecture spec (`Architecture.load` in ranknas).
        - `{WEIGHTS_FILE}`: the weights, a state dict in safetensors format.
        - `{MODULE_FILE}`: a standalone module that rebuilds the model with torch and torchrec
          only (no ranknas needed) and loads the weights without pickle.

        ```python
        import sys
        import torch

        sys.path.insert(0, "path/to/this/directory")
        import ranknas_model as m

        model = m.load("path/to/this/directory")
        with torch.no_grad():
            logits = model(dense, m.ids_to_kjt(ids, m.FEATURES))  # dense [B, D], ids [B, F]
        probabilities = torch.sigmoid(logits)
        ```

        In ranknas: `nas.export.load_exported("path/to/this/directory")`.
    """
    text = textwrap.dedent(text).strip()
    if register:
        text += (
            f"\n\nRegistered in the MLflow Model Registry as `{register}` with the alias "
            f'`{alias}`: `mlflow.pyfunc.load_model("models:/{register}@{alias}").predict(df)` '
            "takes a DataFrame with the dense and categorical columns above and returns click "
            "probabilities."
        )
    return text


# ---------------------------------------------------------------------- MLflow registry


_PYFUNC_CODE = '''
"""MLflow entry point ("models from code") of a model exported by ranknas.

The artifact "export" is the export directory: `ranknas_model.py` rebuilds the network with
torch and torchrec and loads `model.safetensors`. Nothing is unpickled.
"""

import importlib.util
import sys
from pathlib import Path

import mlflow
import numpy as np
import pandas as pd
import torch


class ExportedRankingModel(mlflow.pyfunc.PythonModel):
    """predict(DataFrame with the dense and categorical id columns) -> click probabilities."""

    def load_context(self, context) -> None:
        directory = Path(context.artifacts["export"])
        name = f"ranknas_model_{abs(hash(str(directory)))}"
        spec = importlib.util.spec_from_file_location(name, directory / "ranknas_model.py")
        self.module = importlib.util.module_from_spec(spec)
        sys.modules[name] = self.module
        spec.loader.exec_module(self.module)
        self.model = self.module.load(directory)

    def predict(self, context, model_input: pd.DataFrame, params=None) -> np.ndarray:
        m = self.module
        dense = _matrix(model_input, m.DENSE_COLUMNS, np.float32)
        ids = _matrix(model_input, m.FEATURES, np.int64)
        with torch.no_grad():
            logits = self.model(dense, m.ids_to_kjt(ids, m.FEATURES))
        return torch.sigmoid(logits).numpy()


def _matrix(frame: pd.DataFrame, columns: tuple[str, ...], dtype: type) -> torch.Tensor:
    """The columns as a row-major tensor in torch's own (aligned) memory: a column-major or
    unaligned input would make vectorized kernels round differently in the last bit."""
    return torch.tensor(np.ascontiguousarray(frame[list(columns)].to_numpy(dtype)))


mlflow.models.set_model(ExportedRankingModel())
'''


def _register(
    result: ExportResult,
    analysis: Analysis,
    metrics: Mapping[str, Any],
    columns: _Columns,
    name: str,
    tracking_uri: str | None,
    alias: str,
) -> ExportResult:
    """Log the export directory as a pyfunc model from code, register it, set the alias."""
    import mlflow
    from mlflow.exceptions import MlflowException

    uri = tracking_uri or os.environ.get("MLFLOW_TRACKING_URI")
    if not uri:
        raise RanknasError("registering a model needs an MLflow tracking URI")
    _check_reachable(uri)
    try:
        version = _log_model_version(result, analysis.flops, metrics, columns, name, uri)
        client = mlflow.MlflowClient(uri)
        client.set_model_version_tag(name, version, "ranknas_digest", result.digest)
        client.set_registered_model_alias(name, alias, version)
    except MlflowException as exc:
        raise RanknasError(f"registering {name!r} at {uri} failed: {exc.message}") from exc
    return replace(
        result,
        model_name=name,
        model_version=version,
        alias=alias,
        model_uri=f"models:/{name}@{alias}",
    )


def _log_model_version(
    result: ExportResult,
    flops: int,
    metrics: Mapping[str, Any],
    columns: _Columns,
    name: str,
    uri: str,
) -> str:
    """Log the model in a run of the EXPERIMENT experiment; the new version of `name`."""
    import mlflow

    # log_model and start_run read the global tracking URI: set it for this call only
    from mlflow.tracking._tracking_service.utils import _use_tracking_uri

    client = mlflow.MlflowClient(uri)
    experiment = client.get_experiment_by_name(EXPERIMENT)
    experiment_id = experiment.experiment_id if experiment else client.create_experiment(EXPERIMENT)
    with (
        tempfile.TemporaryDirectory() as tmp,
        _use_tracking_uri(uri),
        mlflow.start_run(experiment_id=experiment_id, run_name=f"export {name}"),
    ):
        entry_point = Path(tmp) / "ranknas_pyfunc.py"
        entry_point.write_text(_PYFUNC_CODE.lstrip())
        mlflow.log_params({"digest": result.digest, "flops": flops})
        mlflow.log_metrics(_numeric(metrics))
        info = mlflow.pyfunc.log_model(
            name="model",
            python_model=str(entry_point),
            artifacts={"export": str(result.out_dir)},
            signature=_signature(columns),
            input_example=_input_example(columns),
            pip_requirements=_requirements(),
            registered_model_name=name,
        )
    return str(info.registered_model_version)


def _check_reachable(uri: str) -> None:
    if not uri.startswith(("http://", "https://")):
        return
    try:
        with urllib.request.urlopen(uri.rstrip("/") + "/health", timeout=10):
            pass
    except (OSError, http.client.HTTPException) as exc:
        raise RanknasError(
            f"cannot reach the MLflow server at {uri} ({exc}): start it with `ranknas mlflow up` "
            "or pass the right tracking URI"
        ) from None


def _numeric(metrics: Mapping[str, Any]) -> dict[str, float]:
    return {
        name: float(value)
        for name, value in metrics.items()
        if isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)
    }


def _signature(columns: _Columns) -> Any:
    """Input: the dense columns (double) and the id columns (long); output: probabilities."""
    import numpy as np
    from mlflow.models import ModelSignature
    from mlflow.types import ColSpec, Schema, TensorSpec

    inputs = [ColSpec("double", c) for c in columns.dense]
    inputs += [ColSpec("long", f) for f in columns.features]
    outputs = Schema([TensorSpec(np.dtype(np.float32), (-1,), "probability")])
    return ModelSignature(inputs=Schema(inputs), outputs=outputs)


def _input_example(columns: _Columns) -> Any:
    """One example of zeros (stored as JSON; MLflow also predicts it to check the model)."""
    import pandas as pd

    return pd.DataFrame({c: [0.0] for c in columns.dense} | {f: [0] for f in columns.features})


def _requirements() -> list[str]:
    """Pinned versions of what the pyfunc needs, as installed here."""
    wanted = ("torch", "torchrec", "fbgemm-gpu-cpu", "fbgemm-gpu", "safetensors", "numpy", "pandas")
    pins = []
    for package in wanted:
        try:
            pins.append(f"{package}=={importlib.metadata.version(package)}")
        except importlib.metadata.PackageNotFoundError:
            continue
    return pins
