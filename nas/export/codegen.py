"""The generated `ranknas_model.py`: the copied block library, a model class with every
shape written out, and the pretty-printer that lays the code out."""

from __future__ import annotations

import ast
import inspect
import json
import keyword
import re
import sys
import textwrap
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from types import ModuleType
from typing import Any

from nas.export import standalone_template
from nas.export.layout import (
    ARCHITECTURE_FILE,
    WEIGHTS_FILE,
    _Columns,
)
from search_space import blocks, names, params, preprocessing, shapes
from search_space.architecture import Analysis, Architecture
from search_space.blocks import OPS
from search_space.names import module_key
from search_space.shapes import Dense, Shape, Sparse

_LINE = 100  # line length of the generated code (the project's ruff setting)
_COPIED: tuple[ModuleType, ...] = (
    shapes,
    params,
    blocks,
    names,
    preprocessing,
    standalone_template,
)
_NOT_IMPORTED = {"__future__", "search_space", "nas", "ranknas"}  # the copies are local
_MODEL_IMPORTS = """
from pathlib import Path
import torch
from torch import nn
"""

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
        f"Inputs: `dense`, float32 [B, {len(columns.dense)}], columns {dense}; `ids`, int64 "
        f"[B, {len(columns.features)}], one id per example for each feature: {features}."
    )
    if columns.list_features:
        lists = ", ".join(map(_doc_name, sorted(columns.list_features)))
        inputs += (
            f" Multi-valued features ({lists}) take a list of ids per example: `ids` is then a "
            "list with one entry per feature, `[B]` ids or a `(values, offsets)` tuple, as "
            "`encode_ids` makes from raw values."
        )
    text = f'''
        r"""{title}

        Standalone: this module needs torch and safetensors, not ranknas or torchrec. It rebuilds
        the network of `{ARCHITECTURE_FILE}` and loads the weights of `{WEIGHTS_FILE}`:

            import torch
            import ranknas_model as m

            model = m.load("path/to/the/export/directory")
            dense = torch.zeros(8, len(m.DENSE_COLUMNS))  # float, DENSE_COLUMNS order
            ids = torch.zeros(8, len(m.FEATURES), dtype=torch.long)  # FEATURES order
            with torch.no_grad():
                probabilities = torch.sigmoid(model(dense, ids))

        {{inputs}}

        Below: ranknas's block library (search_space shapes, params and blocks) and its export
        helpers, copied unchanged, then `RankingModel`: this architecture, with every shape and
        setting written out and a forward pass of one statement per block.
        """
    '''
    wrapped = textwrap.fill(inputs, _LINE - 4, break_on_hyphens=False)
    return textwrap.dedent(text).strip().replace("{inputs}", wrapped)


def _doc_name(name: str) -> str:
    """A user's name as the (raw) docstring shows it: as is when plain, else as Python
    writes the string (quoted, control characters escaped); a quote is escaped only where
    three in a row would end the docstring."""
    if re.fullmatch(r"[\w .:/-]+", name):
        return name
    shown = repr(name)
    if '"""' in shown:
        shown = shown.replace('"', '\\"')
    return shown


def _constants(analysis: Analysis, columns: _Columns, arch_digest: str) -> str:
    emb = analysis.arch.embedding
    values = [
        ("DIGEST", arch_digest, "ranknas's hash of the architecture"),
        ("DENSE_COLUMNS", columns.dense, "the columns of `dense`, in order"),
        ("FEATURES", columns.features, "the columns of `ids`, the id matrix"),
        ("NUM_EMBEDDINGS", tuple(f.num_embeddings for f in emb.used), "rows of each table"),
        ("FEATURE_DIMS", tuple(emb.feature_dim(f) for f in emb.used), "dim of each table"),
        ("POOLINGS", tuple(f.pooling for f in emb.used), "of each table's ids per row"),
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
    doc = '    """`forward(dense, ids)` -> logits [B]; `torch.sigmoid` gives probabilities."""'
    return "\n\n".join(["class RankingModel(nn.Module):\n" + doc, *methods])


def _reads_sparse(analysis: Analysis) -> bool:
    return any("sparse" in analysis.arch.block(name).inputs for name in analysis.order)


_EMBEDDING_BAGS = "EmbeddingBags(FEATURES, NUM_EMBEDDINGS, FEATURE_DIMS, POOLINGS)"
_LOAD_FUNCTION = '''
def load(directory: str | Path = ".", device: str = "cpu") -> RankingModel:
    """The model with its trained weights (`model.safetensors` in `directory`), in eval mode."""
    return load_weights(RankingModel(), Path(directory) / WEIGHTS_FILE, device)
'''


def _feature_projections(arch: Architecture) -> _Expr:
    emb = arch.embedding
    entries = {
        module_key(f.name): _call(
            "nn.Linear", [str(emb.feature_dim(f)), str(emb.dim), "bias=False"]
        )
        for f in emb.used
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
        "    def embed(self, ids: torch.Tensor) -> torch.Tensor:",
        f'        """Pooled embeddings [B, {len(emb.used)}, {emb.dim}], in FEATURES order."""',
        "        pooled = self.embedding_bags(ids)",
    ]
    columns = []
    for f in emb.used:
        column = f"pooled[{_str_literal(f.name)}]"
        projected = emb.feature_dim(f) != emb.dim
        columns.append(
            f"self.feature_projections[{_str_literal(module_key(f.name))}]({column})"
            if projected
            else column
        )
    stack = _call("torch.stack", [_Call("", tuple(columns), "[]"), "dim=1"])
    lines.append(_line("return ", stack, 8))
    return "\n".join(lines)


def _forward_method(analysis: Analysis) -> str:
    arch = analysis.arch
    variables = _variable_names(analysis.order)
    lines = [
        "    def forward(self, dense: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:",
        '        """Logits [B] from `dense` [B, len(DENSE_COLUMNS)], `ids` [B, len(FEATURES)]."""',
        "        if dense.dim() != 2 or dense.shape[1] != len(DENSE_COLUMNS):",
        "            raise ValueError(",
        '                f"expected dense of shape [B, {len(DENSE_COLUMNS)}] (DENSE_COLUMNS: "',
        "                f\"{', '.join(DENSE_COLUMNS)}), got {list(dense.shape)}\"",
        "            )",
    ]
    if _reads_sparse(analysis):
        lines.append("        embedded = self.embed(ids)")
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
    taken = {"self", "dense", "sparse", "ids", "pooled", "embedded", "torch", *order}
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
