"""Dense-column transforms as training and serving apply them.

A transform per dense column, fitted on the training split only (`trainers.data.preprocess`):
`log1p` for count-like columns (as Criteo models do), then standardization with the
training mean and standard deviation, then clipping to +-`CLIP`; a missing value (NaN)
becomes the training mean (0 after standardization). The same function runs in
training and in the exported model (the export copies this file into `ranknas_model.py`),
so a served raw row is transformed exactly as the model's training rows were.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import torch

CLIP = 5.0  # standard deviations: a stray 1e9 cannot dominate a batch


def transform_dense(dense: torch.Tensor, transforms: Sequence[Mapping[str, Any]]) -> torch.Tensor:
    """`[B, D]` raw dense values -> the model's inputs; `transforms[k]` is column k's
    (`log1p`, `mean`, `std`); an empty sequence leaves the values as they are."""
    if not transforms:
        return dense
    if dense.shape[1] != len(transforms):
        raise ValueError(f"expected {len(transforms)} dense columns, got {dense.shape[1]}")
    columns = []
    for k, t in enumerate(transforms):
        x = dense[:, k].double()
        if t["log1p"]:
            x = torch.log1p(torch.clamp(x, min=0))
        standardized = torch.clamp((x - t["mean"]) / t["std"], -CLIP, CLIP)
        columns.append(torch.nan_to_num(standardized, nan=0.0))
    return torch.stack(columns, dim=1).to(dense.dtype)
