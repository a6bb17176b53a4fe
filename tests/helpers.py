"""Shared checks: analytic costs against what torch counts on the built module."""

import torch
from torch.utils.flop_counter import FlopCounterMode

from search_space.architecture import Architecture, analyze
from search_space.builder import build_model, example_batch

BATCH = 4


def check_costs_and_training_step(arch: Architecture) -> None:
    """Build, run forward + backward, and compare analytic FLOPs/params to torch's counts.

    No tolerance: FLOPs are integers counted with FlopCounterMode's convention.
    """
    analysis = analyze(arch)
    model = build_model(arch, seed=0)
    dense, sparse = example_batch(arch, BATCH)
    with FlopCounterMode(display=False) as counter:
        logits = model(dense, sparse)
    assert logits.shape == (BATCH,)
    assert torch.isfinite(logits).all()
    logits.sum().backward()
    assert counter.get_total_flops() == analysis.flops * BATCH, arch.to_json()
    dense_params = sum(
        p.numel() for n, p in model.named_parameters() if not n.startswith("embedding_bags")
    )
    embedding_params = sum(
        p.numel() for n, p in model.named_parameters() if n.startswith("embedding_bags")
    )
    assert dense_params == analysis.dense_params, arch.to_json()
    assert embedding_params == analysis.embedding_params


GENRES = [f"g{i}" for i in range(12)]
GENRE_SCHEMA = """label: clicked
dense: [price]
categorical:
  - shop
  - {name: genres, multi_valued: true, pooling: mean, separator: "|"}
time: t
"""


def write_genre_log(directory, rows: int = 3000, seed: int = 0):
    """A CSV log whose clicks depend on each row's list of 1-4 genres (the mean of their
    effects) and a schema that reads the list as a multi-valued column; (csv, schema)."""
    import numpy as np

    rng = np.random.default_rng(seed)
    effect = rng.normal(0.0, 2.0, len(GENRES))
    lines = ["clicked,price,genres,shop,t"]
    for t in range(rows):
        chosen = rng.choice(len(GENRES), rng.integers(1, 5), replace=False)
        clicked = int(rng.random() < 1 / (1 + np.exp(-2 * effect[chosen].mean())))
        genres = "|".join(GENRES[g] for g in chosen)
        lines.append(f"{clicked},{rng.normal():.3f},{genres},s{rng.integers(5)},{t}")
    (directory / "genres.csv").write_text("\n".join(lines) + "\n")
    (directory / "genres.yaml").write_text(GENRE_SCHEMA)
    return directory / "genres.csv", directory / "genres.yaml"
