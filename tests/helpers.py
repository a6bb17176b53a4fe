"""Shared checks: analytic costs against what torch counts on the built module."""

import pytest
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
    with torch.no_grad():  # a request of no rows, as a served model gets: no scores, no error
        empty = model.interact(dense[:0], model.embed(sparse)[:0] if model.feature_names else None)
    assert empty.shape == (0,), arch.to_json()


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


def check_tables_step_like_torch(reference, replacement, optimizer: str, features) -> None:
    """Three steps of `replacement` (tables that update themselves in backward, built from
    `reference` with `optimizer` at lr 0.1) pool and learn exactly what `reference` does
    under the trainer's torch optimizer: outputs, then the weights after the steps."""
    from trainers.trainer import TrainConfig, make_optimizers

    model = torch.nn.Module()
    model.embedding_bags, model.head = reference, torch.nn.Linear(1, 1)
    torch_step = make_optimizers(model, TrainConfig(sparse_optimizer=optimizer, sparse_lr=0.1))[1]
    mix = None
    for _ in range(3):  # repeated steps: the optimizers' state must agree too
        expected, got = reference(features), replacement(features)
        assert got.keys() == expected.keys()
        torch.testing.assert_close(got.values(), expected.values())
        mix = torch.randn(expected.values().shape) if mix is None else mix
        torch_step.zero_grad()
        (expected.values() * mix).sum().backward()
        torch_step.step()
        (got.values() * mix).sum().backward()  # the replacement's update happens here
    for name, bag in reference.embedding_bags.items():
        torch.testing.assert_close(replacement.embedding_bags[name].weight, bag.weight)


def check_training_ends_alike(make_model, data, train_both) -> None:
    """`train_both(model, train, valid, config)` trains a dcnv2 twice (the two ways under
    test, in that order): both complete at the same NE (1e-4) with the same weights
    (float sums in another order over 40 steps), the collection put back."""
    from torchrec.modules.embedding_modules import EmbeddingBagCollection

    from trainers.trainer import TrainConfig

    train_part, valid, _ = data.split()
    config = TrainConfig(batch_size=256, max_steps=40, evals=2, seed=3)
    results, weights = [], []
    for way in (0, 1):
        model = make_model()
        results.append(train_both(way, model, train_part, valid, config))
        assert type(model.embedding_bags) is EmbeddingBagCollection  # put back after training
        weights.append(model.state_dict())
    assert [r.status for r in results] == ["complete", "complete"]
    assert results[0].validation["ne"] == pytest.approx(results[1].validation["ne"], abs=1e-4)
    assert weights[0].keys() == weights[1].keys()
    for key, value in weights[0].items():
        assert (value - weights[1][key]).norm() <= 1e-3 * weights[1][key].norm() + 1e-6, key
