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
