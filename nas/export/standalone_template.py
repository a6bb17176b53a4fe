"""Helpers that `nas.export` copies verbatim into every exported `ranknas_model.py`.

This module must import only the standard library, torch and safetensors: the exported
file has to run where neither ranknas nor torchrec is installed (torchrec's wheel pulls a
CUDA build of fbgemm-gpu that does not load on a CPU machine). Its docstring and its imports are
not copied (the export merges the imports of everything it copies into one block).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path

import torch
from safetensors.torch import load_file
from torch import nn

from search_space.preprocessing import transform_dense


class EmbeddingBags(nn.Module):
    """The model's embedding tables, one sum-pooled table `t_<feature>` per feature, with the
    state-dict layout of torchrec's `EmbeddingBagCollection` (`embedding_bags.<table>.weight`)
    so that ranknas's weights load as they are. Serving reads one id per example and
    feature, which needs plain `nn.EmbeddingBag`s, not torchrec."""

    def __init__(
        self, features: Sequence[str], num_embeddings: Sequence[int], dims: Sequence[int]
    ) -> None:
        super().__init__()
        self.features = list(features)
        self.embedding_bags = nn.ModuleDict(
            {f"t_{f}": nn.EmbeddingBag(rows, dim, mode="sum")
             for f, rows, dim in zip(features, num_embeddings, dims, strict=True)}
        )  # fmt: skip

    def forward(self, ids: torch.Tensor) -> dict[str, torch.Tensor]:
        """The id matrix `[B, F]` (column i: ids of `features[i]`) -> feature -> `[B, dim]`."""
        ids = torch.as_tensor(ids, dtype=torch.long)
        if ids.dim() != 2 or ids.shape[1] != len(self.features):
            raise ValueError(
                f"expected ids of shape [B, {len(self.features)}], got {list(ids.shape)}"
            )
        return {
            f: self.embedding_bags[f"t_{f}"](ids[:, i : i + 1]) for i, f in enumerate(self.features)
        }


def load_weights(model: nn.Module, path: str | Path, device: str = "cpu") -> nn.Module:
    """Load a safetensors state dict into `model` (every key must match) and set eval mode."""
    model.load_state_dict(load_file(str(path)))
    return model.to(device).eval()


def prepare_dense(dense: torch.Tensor, directory: str | Path = ".") -> torch.Tensor:
    """Raw dense values `[B, len(DENSE_COLUMNS)]` -> the model's dense input: the transforms
    fitted on the training data (`preprocessing.json` in `directory`; none: as they are)."""
    transforms = _preprocessing(directory).get("dense", [])
    return transform_dense(torch.as_tensor(dense, dtype=torch.float32), transforms)


def encode_ids(
    columns: Sequence[Sequence[object]], features: Sequence[str], directory: str | Path = "."
) -> torch.Tensor:
    """Raw categorical values, one sequence per feature (in `features` order) -> the id
    matrix `[B, F]`. A feature with a training vocabulary maps its values through it (id 0:
    missing, 1: never seen in training); the others must already be ids."""
    vocabulary = _preprocessing(directory).get("vocabulary", {})
    encoded = []
    for feature, values in zip(features, columns, strict=True):
        known = vocabulary.get(feature)
        if known is None:
            encoded.append(torch.as_tensor([int(v) for v in values], dtype=torch.long))
            continue
        index = {v: i + 2 for i, v in enumerate(known)}
        ids = [0 if _missing(v) else index.get(str(v).strip(), 1) for v in values]
        encoded.append(torch.as_tensor(ids, dtype=torch.long))
    return torch.stack(encoded, dim=1)


def _missing(value: object) -> bool:
    return value is None or value != value or str(value).strip() == ""  # None, NaN, blank


def _preprocessing(directory: str | Path) -> dict:
    path = Path(directory) / "preprocessing.json"
    return json.loads(path.read_text()) if path.exists() else {}
