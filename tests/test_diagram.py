"""The architecture picture: every edge visible (no route passes through a box it does not
join), every block shows its op and settings, and the text is drawn at a legible size."""

import io
import itertools
import random

import pytest

from nas.diagram import FONT_PT, diagram_png, labels_of, layout
from search_space.architecture import Architecture, analyze
from search_space.presets import PRESETS, load_architecture
from search_space.schema import synthetic_schema
from search_space.spaces import load_space

SCHEMA = synthetic_schema(num_dense=8, num_sparse=6)

SKIP = {
    "schema_version": 1,
    "name": "skip",
    "embedding": {"dim": 16},
    "blocks": [
        {"name": "bottom", "op": "mlp", "inputs": ["dense"], "params": {"widths": [64, 16]}},
        {"name": "cross", "op": "cross", "inputs": ["sparse", "bottom"]},
        {"name": "att", "op": "attention", "inputs": ["cross"]},
        {"name": "deep", "op": "mlp", "inputs": ["att", "cross", "dense"],
         "params": {"widths": [128, 64]}},
    ],
    "output": "deep",
}  # fmt: skip


def _crossings(arch: Architecture) -> list[str]:
    """Edges whose drawn route enters a box other than the two it joins."""
    analysis = analyze(arch)
    boxes, routes = layout(arch, analysis, labels_of(arch, analysis))
    found = []
    for source, target, route in routes:
        for (x0, y0), (x1, y1) in itertools.pairwise(route):
            for t in (i / 40 for i in range(41)):
                x, y = x0 + t * (x1 - x0), y0 + t * (y1 - y0)
                for name, ((bx, by), (w, h)) in boxes.items():
                    inside = abs(x - bx) < w / 2 - 1 and abs(y - by) < h / 2 - 1
                    if inside and name not in (source, target):
                        found.append(f"{source}->{target} through {name}")
    return sorted(set(found))


def test_a_skip_edge_goes_around_the_block_it_skips():
    arch = Architecture.from_dict(SKIP).bind(SCHEMA)
    analysis = analyze(arch)
    _boxes, routes = layout(arch, analysis, labels_of(arch, analysis))
    skip = next(r for s, t, r in routes if (s, t) == ("cross", "deep"))
    assert len(skip) == 3, "cross -> deep spans two layers: one routing point between"
    assert _crossings(arch) == []


@pytest.mark.parametrize("name", sorted(PRESETS))
def test_every_preset_is_drawn_without_hidden_edges(name):
    assert _crossings(load_architecture(name, SCHEMA)) == []


@pytest.mark.parametrize("seed", range(6))
def test_sampled_dag_architectures_are_drawn_without_hidden_edges(seed):
    space = load_space("examples/space_dag.yaml", SCHEMA)
    arch = space.decode(space.sample_values(random.Random(seed)))
    assert _crossings(arch) == []


def test_each_block_shows_its_op_and_settings():
    arch = load_architecture("dhen", SCHEMA)
    analysis = analyze(arch)
    labels = labels_of(arch, analysis)
    for name in analysis.order:
        text = " ".join(labels[name])
        assert f"{name}: {arch.block(name).op}" in text
        for key, value in analysis.params[name].items():
            if value is not None:
                assert f"{key}=" in text, (name, key)
    assert "6 tables, dim" in " ".join(labels["sparse"])


def test_the_picture_is_drawn_at_its_text_size():
    """The PNG is sized from its labels (about 12 px per line of 9 pt text at 100 dpi), so
    the MLflow UI shows it at a legible scale instead of shrinking a fixed canvas."""
    from PIL import Image

    arch = Architecture.from_dict(SKIP).bind(SCHEMA)
    image = Image.open(io.BytesIO(diagram_png(arch)))
    analysis = analyze(arch)
    boxes, _ = layout(arch, analysis, labels_of(arch, analysis))
    tallest = max(h for _, (_, h) in boxes.values())
    assert FONT_PT == 9.0
    assert image.height >= 4 * tallest * 100 / 72  # four layers of boxes, at 100 dpi
    assert 300 < image.width < 2000


def test_a_diagram_is_titled_by_the_name_it_is_given(monkeypatch):
    """Every trial's picture in MLflow was titled by its space's name ("around-space: ...")."""
    import nas.diagram

    arch = load_architecture("dlrm", SCHEMA)
    titled = []
    monkeypatch.setattr(nas.diagram, "_title", lambda name, _: titled.append(name) or name)
    diagram_png(arch, "trial 7")
    diagram_png(arch)
    assert titled == ["trial 7", arch.name]
