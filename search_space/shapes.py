"""Per-example tensor shapes that flow between blocks.

A dense tensor is `[B, width]`; a sparse tensor is `[B, count, dim]` (one `dim`-wide
embedding per feature or derived feature). The batch axis is never part of a shape.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

Kind = Literal["dense", "sparse"]


@dataclass(frozen=True)
class Dense:
    width: int
    kind: Kind = "dense"

    @property
    def numel(self) -> int:
        return self.width

    def __str__(self) -> str:
        return f"dense[{self.width}]"


@dataclass(frozen=True)
class Sparse:
    count: int
    dim: int
    kind: Kind = "sparse"

    @property
    def numel(self) -> int:
        return self.count * self.dim

    def __str__(self) -> str:
        return f"sparse[{self.count}x{self.dim}]"


Shape = Dense | Sparse
