"""A picture of an architecture: the raw inputs at the top, each live block a box with its
op, settings, output shape and FLOPs, and an arrow per input. grandalf's layered (Sugiyama)
layout places the boxes and routes an edge that skips layers around the boxes in between,
so a skip connection reads as one; matplotlib draws it at the size the MLflow UI shows.
Each trial's and baseline's MLflow run, each export and `ranknas arch show NAME --diagram
FILE` get one."""

from __future__ import annotations

import io
import textwrap
from typing import Any

from search_space.architecture import RAW_INPUTS, Analysis, Architecture, analyze

FONT_PT = 9.0
_CHAR_W, _LINE_H, _PAD = 0.6 * FONT_PT, 1.35 * FONT_PT, 8.0  # points
_WRAP = 34  # characters of settings per line
_DPI = 100


def diagram_png(arch: Architecture, name: str | None = None) -> bytes:
    """The architecture's diagram as PNG bytes, titled `name` (default: the architecture's
    own, which a searched one shares with every point of its space)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    analysis = analyze(arch)
    title = _title(name or arch.name or "architecture", analysis)
    labels = labels_of(arch, analysis)
    boxes, paths = layout(arch, analysis, labels)
    xs = [x + s * w / 2 for (x, _), (w, _) in boxes.values() for s in (-1, 1)]
    ys = [y + s * h / 2 for (_, y), (_, h) in boxes.values() for s in (-1, 1)]
    xs += [x for *_, path in paths for x, _ in path]  # routes that pass beside the boxes
    title_h = 2.5 * FONT_PT
    width, height = max(xs) - min(xs) + 2 * _PAD, max(ys) - min(ys) + 2 * _PAD + title_h
    width = max(width, 0.7 * (FONT_PT + 1) * len(title) + 2 * _PAD)
    figure = plt.figure(figsize=(width / 72, height / 72), dpi=_DPI)
    axes = figure.add_axes((0, 0, 1, 1))
    x_mid = (max(xs) + min(xs)) / 2
    axes.set_xlim(x_mid - width / 2, x_mid + width / 2)
    axes.set_ylim(max(ys) + _PAD, min(ys) - _PAD - title_h)  # y grows downwards
    axes.axis("off")
    for source, target, path in paths:
        _draw_edge(axes, path, boxes[source][1][1], boxes[target][1][1])
    for node, ((x, y), (w, h)) in boxes.items():
        _draw_box(axes, node, x, y, w, h, labels[node], arch)
    axes.text(x_mid, min(ys) - _PAD - title_h / 2, title, ha="center",
              va="center", fontsize=FONT_PT + 1, fontweight="bold")  # fmt: skip
    out = io.BytesIO()
    figure.savefig(out, format="png", dpi=_DPI)
    plt.close(figure)
    return out.getvalue()


def _title(name: str, analysis: Analysis) -> str:
    return (f"{name}: {analysis.flops / 1e6:.3f} MFLOPs/example, "
            f"{analysis.dense_params:,} dense params")  # fmt: skip


def labels_of(arch: Architecture, analysis: Analysis) -> dict[str, list[str]]:
    """Each drawn node's lines of text: name and op, settings, output shape, FLOPs."""
    used = {s for n in analysis.order for s in arch.block(n).inputs}
    labels = {name: [name, _shape(analysis.shapes[name])] for name in RAW_INPUTS if name in used}
    if "sparse" in labels:
        tables = f"{len(arch.embedding.used)} tables, dim {arch.embedding.dim}"
        labels["sparse"].insert(1, tables)
    for name in analysis.order:
        params = analysis.params[name].items()
        settings = ", ".join(f"{k}={_value(v)}" for k, v in params if v is not None)
        flops = f"{analysis.block_flops[name] / 1e3:,.1f} kFLOPs"
        lines = [f"{name}: {arch.block(name).op}"]
        lines += textwrap.wrap(settings, _WRAP) if settings else []
        lines.append(f"{_shape(analysis.shapes[name])}, {flops}")
        labels[name] = lines
    return labels


def _value(value: Any) -> str:
    if isinstance(value, (list, tuple)):
        return "[" + ",".join(_value(v) for v in value) + "]"
    if isinstance(value, float):
        return f"{value:g}"
    return str(value)


def _shape(shape: Any) -> str:
    return "x".join(map(str, shape)) if isinstance(shape, (list, tuple)) else str(shape)


def layout(arch: Architecture, analysis: Analysis, labels: dict[str, list[str]]):
    """Each node's box, `{name: ((x, y), (w, h))}` in points with y growing downwards, and
    each edge's route, `[(source, target, [(x, y), ...])]` from centre to centre, from
    grandalf's layered layout."""
    from grandalf.graphs import Edge, Graph, Vertex
    from grandalf.layouts import SugiyamaLayout

    class View:
        def __init__(self, w: float, h: float) -> None:
            self.w, self.h, self.xy = w, h, (0.0, 0.0)

    class EdgeView:
        def setpath(self, path: list) -> None:
            self.path = path

    vertices = {}
    for name, lines in labels.items():
        vertex = Vertex(name)
        vertex.view = View(max(map(len, lines)) * _CHAR_W + 2 * _PAD, len(lines) * _LINE_H + _PAD)
        vertices[name] = vertex
    edges = []
    for name in analysis.order:
        for source in arch.block(name).inputs:
            edge = Edge(vertices[source], vertices[name])
            edge.view = EdgeView()
            edges.append((source, name, edge))
    graph = Graph(list(vertices.values()), [edge for *_, edge in edges])
    for component in graph.C:  # one graph here: every block feeds the output
        layout = SugiyamaLayout(component)
        layout.xspace, layout.yspace = 3 * _PAD, 4 * _PAD
        roots = [vertices[r] for r in RAW_INPUTS if r in vertices and vertices[r] in component.sV]
        layout.init_all(roots=roots or None, optimize=True)
        layout.draw(3)
    boxes = {name: (v.view.xy, (v.view.w, v.view.h)) for name, v in vertices.items()}
    return boxes, [(source, name, edge.view.path) for source, name, edge in edges]


def _draw_box(axes, name: str, x: float, y: float, w: float, h: float, lines, arch) -> None:
    from matplotlib.patches import FancyBboxPatch

    color = "#e8eef8" if name in RAW_INPUTS else "#fdf1dc"
    if name == arch.output_block:
        color = "#dff3e4"
    style = "round,pad=0,rounding_size=4"
    axes.add_patch(FancyBboxPatch((x - w / 2, y - h / 2), w, h, boxstyle=style, facecolor=color,
                                  edgecolor="0.25", linewidth=1.0, zorder=2))  # fmt: skip
    top = y - (len(lines) - 1) * _LINE_H / 2
    for i, line in enumerate(lines):
        axes.text(x, top + i * _LINE_H, line, ha="center", va="center", fontsize=FONT_PT,
                  fontweight="bold" if i == 0 else "normal", zorder=3)  # fmt: skip


def _draw_edge(axes, path: list, source_h: float, target_h: float) -> None:
    """A polyline through the layout's routing points, from the bottom of the source box to
    an arrowhead on the top of the target box."""
    (x0, y0), (x1, y1) = path[0], path[-1]
    points = [(x0, y0 + source_h / 2), *path[1:-1], (x1, y1 - target_h / 2)]
    xs, ys = zip(*points[:-1], strict=True)
    axes.plot(xs, ys, color="0.35", linewidth=1.1, zorder=1)
    axes.annotate("", points[-1], points[-2], zorder=1,
                  arrowprops={"arrowstyle": "-|>", "color": "0.35", "linewidth": 1.1,
                              "shrinkA": 0, "shrinkB": 0})  # fmt: skip
