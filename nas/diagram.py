"""A picture of an architecture: its live blocks as boxes (op, output shape, FLOPs) in
columns by depth, the raw inputs on the left, an arrow per input, drawn with matplotlib.
Each trial's MLflow run, each export and `ranknas arch show NAME --diagram FILE` get one."""

from __future__ import annotations

import io

from search_space.architecture import RAW_INPUTS, Architecture, analyze


def diagram_png(arch: Architecture) -> bytes:
    """The architecture's diagram as PNG bytes."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.patches import FancyBboxPatch

    analysis = analyze(arch)
    depth = {name: 0 for name in RAW_INPUTS}
    for name in analysis.order:
        depth[name] = 1 + max(depth[s] for s in arch.block(name).inputs)
    used = {s for n in analysis.order for s in arch.block(n).inputs} & set(RAW_INPUTS)
    columns: dict[int, list[str]] = {}
    for name in [*(r for r in RAW_INPUTS if r in used), *analysis.order]:
        columns.setdefault(depth[name], []).append(name)
    place = {name: (3.2 * d, -1.6 * row) for d, names in columns.items()
             for row, name in enumerate(names)}  # fmt: skip
    width, height = max(6.0, 3.2 * len(columns)), max(3.0, 1.6 * max(map(len, columns.values())))
    figure, axes = plt.subplots(figsize=(width, height), dpi=110)
    for name, (x, y) in place.items():
        label = _label(name, analysis)
        color = "#e8eef8" if name in RAW_INPUTS else "#fdf1dc"
        if name == arch.output_block:
            color = "#dff3e4"
        axes.add_patch(FancyBboxPatch((x - 1.2, y - 0.5), 2.4, 1.0, boxstyle="round,pad=0.05",
                                      facecolor=color, edgecolor="0.3"))  # fmt: skip
        axes.text(x, y, label, ha="center", va="center", fontsize=7.5)
    for name in analysis.order:
        for source in arch.block(name).inputs:
            (x0, y0), (x1, y1) = place[source], place[name]
            axes.annotate("", (x1 - 1.25, y1), (x0 + 1.25, y0),
                          arrowprops={"arrowstyle": "->", "color": "0.4"})  # fmt: skip
    xs, ys = [p[0] for p in place.values()], [p[1] for p in place.values()]
    axes.set_xlim(min(xs) - 1.5, max(xs) + 1.5)
    axes.set_ylim(min(ys) - 0.9, max(ys) + 0.9)
    axes.set_title(f"{arch.name or 'architecture'}: {analysis.flops / 1e6:.3f} MFLOPs/example, "
                   f"{analysis.dense_params:,} dense params", fontsize=9)  # fmt: skip
    axes.axis("off")
    figure.tight_layout()
    out = io.BytesIO()
    figure.savefig(out, format="png")
    plt.close(figure)
    return out.getvalue()


def _label(name: str, analysis) -> str:
    if name in RAW_INPUTS:
        return f"{name}\n{analysis.shapes[name]}"
    op = analysis.arch.block(name).op
    return f"{name} ({op})\n{analysis.shapes[name]}\n{analysis.block_flops[name] / 1e3:.1f} kFLOPs"
