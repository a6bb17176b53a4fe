"""The block library: the operators an architecture is made of.

Every block is an `nn.Module` that also declares, as class-level facts:

- `input_kind` / `output_kind`: "dense" (`[B, width]`) or "sparse" (`[B, count, dim]`);
- `PARAMS`: its typed parameters (see `search_space.params`);
- `output_shape`, `flops` and `num_params` for a given input shape, computed analytically.

FLOPs follow the convention of `torch.utils.flop_counter.FlopCounterMode`: 2·m·n·k for every
matrix product (linear layers, bmm, matmul) and convolution, per example; elementwise work
(activations, norms, softmax, FM's sums, bias adds) is not counted. `tests/test_blocks.py`
checks every formula against FlopCounterMode and `sum(p.numel())`.

Blocks whose `takes_list` is True (sum, gating) receive their inputs as a list of dense
tensors; every other block receives one tensor, already merged by the model (see builder).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from itertools import pairwise
from typing import Any, ClassVar

import torch
from torch import nn

from search_space.params import Param
from search_space.shapes import Dense, Kind, Shape, Sparse

Params = dict[str, Any]


# ----------------------------------------------------------------------------- helpers


def mlp(in_features: int, widths: Sequence[int]) -> nn.Sequential:
    """Linear + ReLU for every width."""
    layers: list[nn.Module] = []
    for width in widths:
        layers += [nn.Linear(in_features, width), nn.ReLU()]
        in_features = width
    return nn.Sequential(*layers)


def mlp_flops(in_features: int, widths: Sequence[int]) -> int:
    return sum(2 * a * b for a, b in pairwise([in_features, *widths]))


def mlp_params(in_features: int, widths: Sequence[int]) -> int:
    return sum(a * b + b for a, b in pairwise([in_features, *widths]))


class AcrossEmbeddings(nn.Module):
    """A linear map along the embedding-count axis: `[B, n_in, d] -> [B, n_out, d]`."""

    def __init__(self, n_in: int, n_out: int, bias: bool = True) -> None:
        super().__init__()
        self.linear = nn.Linear(n_in, n_out, bias=bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.linear(x.transpose(1, 2)).transpose(1, 2)

    @staticmethod
    def flops(n_in: int, n_out: int, dim: int) -> int:
        return 2 * n_in * n_out * dim

    @staticmethod
    def num_params(n_in: int, n_out: int, bias: bool = True) -> int:
        return n_in * n_out + (n_out if bias else 0)


class MultiHeadSelfAttention(nn.Module):
    """Scaled dot-product self-attention over the embeddings of one example."""

    def __init__(self, dim: int, num_heads: int, head_dim: int) -> None:
        super().__init__()
        self.num_heads, self.head_dim = num_heads, head_dim
        self.qkv = nn.Linear(dim, 3 * num_heads * head_dim)
        self.out = nn.Linear(num_heads * head_dim, dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        batch, count, _ = x.shape
        qkv = self.qkv(x).view(batch, count, 3, self.num_heads, self.head_dim)
        q, k, v = qkv.permute(2, 0, 3, 1, 4)  # each [B, heads, count, head_dim]
        scores = torch.matmul(q, k.transpose(-1, -2)) / math.sqrt(self.head_dim)
        context = torch.matmul(scores.softmax(dim=-1), v)
        width = self.num_heads * self.head_dim  # not -1: a batch of no rows has no inferred size
        return self.out(context.transpose(1, 2).reshape(batch, count, width))

    @staticmethod
    def flops(count: int, dim: int, num_heads: int, head_dim: int) -> int:
        inner = num_heads * head_dim
        projections = 2 * count * dim * 3 * inner + 2 * count * inner * dim
        return projections + 2 * 2 * num_heads * count * count * head_dim

    @staticmethod
    def num_params(dim: int, num_heads: int, head_dim: int) -> int:
        inner = num_heads * head_dim
        return dim * 3 * inner + 3 * inner + inner * dim + dim


def upper_pairs(n: int, self_interaction: bool = False) -> torch.Tensor:
    """Flat positions of an n x n matrix's upper triangle (its diagonal with
    `self_interaction`), row by row: what `pairwise_dot` keeps."""
    rows, cols = torch.triu_indices(n, n, offset=0 if self_interaction else 1)
    return rows * n + cols


def pairwise_dot(x: torch.Tensor, pairs: torch.Tensor) -> torch.Tensor:
    """Inner products of the embeddings of each example at `pairs` (`upper_pairs`). One
    index_select of the flattened products: indexing them by rows and columns instead took
    twice the time with its backward (an accumulating index_put) on CPU, half of DLRM's
    dense step."""
    return torch.bmm(x, x.transpose(1, 2)).flatten(1).index_select(1, pairs)


# ----------------------------------------------------------------------------- base


class BlockModule(nn.Module):
    """Base class of every block; see the module docstring for the contract."""

    op: ClassVar[str]
    input_kind: ClassVar[Kind]
    output_kind: ClassVar[Kind]
    takes_list: ClassVar[bool] = False
    PARAMS: ClassVar[dict[str, Param]] = {}
    doc: ClassVar[str] = ""

    @classmethod
    def check(cls, x: Any, p: Params) -> str | None:
        """A problem with this input shape and these parameters, or None."""
        return None

    @classmethod
    def output_shape(cls, x: Any, p: Params) -> Shape:
        raise NotImplementedError

    @classmethod
    def flops(cls, x: Any, p: Params) -> int:
        raise NotImplementedError

    @classmethod
    def num_params(cls, x: Any, p: Params) -> int:
        raise NotImplementedError


# ----------------------------------------------------------------------------- dense blocks


class MLPBlock(BlockModule):
    op = "mlp"
    input_kind = output_kind = "dense"
    PARAMS: ClassVar = {"widths": Param("int_list", low=1, high=65536, doc="layer widths")}
    doc = "fully connected layers with ReLU"

    def __init__(self, x: Dense, widths: Sequence[int]) -> None:
        super().__init__()
        self.layers = mlp(x.width, widths)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.layers(x)

    @classmethod
    def output_shape(cls, x: Dense, p: Params) -> Dense:
        return Dense(p["widths"][-1])

    @classmethod
    def flops(cls, x: Dense, p: Params) -> int:
        return mlp_flops(x.width, p["widths"])

    @classmethod
    def num_params(cls, x: Dense, p: Params) -> int:
        return mlp_params(x.width, p["widths"])


class CrossNet(nn.Module):
    """DCNv2's cross layers on `[B, N]`: x_{l+1} = x_0 * (W_l x_l + b_l) + x_l with a full
    W_l (`low_rank` 0) or W_l = W V of rank r; with `num_experts` > 1, a softmax-gated
    mixture of low-rank experts x_0 * (U relu(C relu(V x_l)) + b_l) (DCN-Mix).

    Parameter names and shapes are those of torchrec's `CrossNet`, `LowRankCrossNet` and
    `LowRankMixtureCrossNet`, so weights move between the two. It lives here, in plain
    torch, because exported models must run without torchrec (whose wheel pulls a CUDA
    fbgemm-gpu that does not load on a CPU machine)."""

    def __init__(self, width: int, num_layers: int, low_rank: int = 0, num_experts: int = 1):
        super().__init__()
        self.num_layers, self.mixture = num_layers, num_experts > 1

        def kernels(*shape: int) -> nn.ParameterList:
            return nn.ParameterList(
                nn.Parameter(nn.init.xavier_normal_(torch.empty(*shape))) for _ in range(num_layers)
            )

        bias_shape = (width,) if low_rank and not self.mixture else (width, 1)
        if self.mixture:
            self.U_kernels = kernels(num_experts, width, low_rank)
            self.V_kernels = kernels(num_experts, low_rank, width)
        elif low_rank:
            self.W_kernels = kernels(width, low_rank)
            self.V_kernels = kernels(low_rank, width)
        else:
            self.kernels = kernels(width, width)
        self.bias = nn.ParameterList(
            nn.Parameter(torch.zeros(bias_shape)) for _ in range(num_layers)
        )
        if self.mixture:
            self.gates = nn.ModuleList(nn.Linear(width, 1, bias=False) for _ in range(num_experts))
            self.C_kernels = kernels(num_experts, low_rank, low_rank)

    def forward(self, x0: torch.Tensor) -> torch.Tensor:
        # the bias goes into the product (`linear`): added after it, an fp32 bias made the
        # layer's elementwise work fp32 under autocast
        x = x0
        for layer in range(self.num_layers):
            bias = self.bias[layer].view(-1)
            if self.mixture:
                gate = torch.softmax(torch.cat([g(x) for g in self.gates], dim=1), dim=1)
                v = torch.relu(torch.einsum("ern,bn->ber", self.V_kernels[layer], x))
                c = torch.relu(torch.einsum("ers,bes->ber", self.C_kernels[layer], v))
                u = torch.einsum("enr,ber->ben", self.U_kernels[layer], c) + bias.to(c.dtype)
                x = torch.einsum("ben,be->bn", x0.unsqueeze(1) * u, gate.to(u.dtype)) + x
            elif hasattr(self, "W_kernels"):
                low = nn.functional.linear(x, self.V_kernels[layer])
                x = x0 * nn.functional.linear(low, self.W_kernels[layer], bias) + x
            else:
                x = x0 * nn.functional.linear(x, self.kernels[layer], bias) + x
        return x


class CrossBlock(BlockModule):
    """DCNv2 cross layers x_{l+1} = x0 * (W x_l + b) + x_l (`CrossNet` above): full rank
    (`low_rank: 0`), low rank, or a mixture of low-rank experts."""

    op = "cross"
    input_kind = output_kind = "dense"
    PARAMS: ClassVar = {
        "num_layers": Param("int", 2, low=1, high=16),
        "low_rank": Param("int", 0, low=0, high=4096, doc="0 = full-rank W"),
        "num_experts": Param("int", 1, low=1, high=16, doc=">1 needs low_rank >= 1"),
    }
    doc = "DCNv2 cross network (full rank, low rank, or a mixture of low-rank experts)"

    def __init__(self, x: Dense, num_layers: int, low_rank: int, num_experts: int) -> None:
        super().__init__()
        self.net = CrossNet(x.width, num_layers, low_rank, num_experts)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x)

    @classmethod
    def check(cls, x: Dense, p: Params) -> str | None:
        if p["num_experts"] > 1 and p["low_rank"] == 0:
            return "params.num_experts > 1 needs params.low_rank >= 1 (experts are low-rank)"
        return None

    @classmethod
    def output_shape(cls, x: Dense, p: Params) -> Dense:
        return x

    @classmethod
    def flops(cls, x: Dense, p: Params) -> int:
        width, rank, experts = x.width, p["low_rank"], p["num_experts"]
        if experts > 1:  # per expert V, C, U products; gates and the mixing product
            per_layer = experts * (4 * width * rank + 2 * rank * rank) + 4 * width * experts
        elif rank > 0:
            per_layer = 4 * width * rank
        else:
            per_layer = 2 * width * width
        return p["num_layers"] * per_layer

    @classmethod
    def num_params(cls, x: Dense, p: Params) -> int:
        width, rank, experts, layers = x.width, p["low_rank"], p["num_experts"], p["num_layers"]
        if experts > 1:
            return layers * (experts * (2 * width * rank + rank * rank) + width) + experts * width
        if rank > 0:
            return layers * (2 * width * rank + width)
        return layers * (width * width + width)


class ConcatBlock(BlockModule):
    """The merged input itself: lets a head or a block read several blocks at once."""

    op = "concat"
    input_kind = output_kind = "dense"
    doc = "concatenation of the inputs (no parameters)"

    def __init__(self, x: Dense) -> None:
        super().__init__()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x

    @classmethod
    def output_shape(cls, x: Dense, p: Params) -> Dense:
        return x

    @classmethod
    def flops(cls, x: Dense, p: Params) -> int:
        return 0

    @classmethod
    def num_params(cls, x: Dense, p: Params) -> int:
        return 0


class GatingBlock(BlockModule):
    """NASRec sigmoid gating: x * sigmoid(W g + b), x the first input, g the others
    concatenated (or x itself when there is one input)."""

    op = "gating"
    input_kind = output_kind = "dense"
    takes_list = True
    doc = "sigmoid gating of the first input by the others"

    def __init__(self, x: tuple[Dense, ...]) -> None:
        super().__init__()
        self.gate = nn.Linear(self._gate_width(x), x[0].width)

    def forward(self, inputs: list[torch.Tensor]) -> torch.Tensor:
        gate_in = torch.cat(inputs[1:], dim=1) if len(inputs) > 1 else inputs[0]
        return inputs[0] * torch.sigmoid(self.gate(gate_in))

    @staticmethod
    def _gate_width(x: tuple[Dense, ...]) -> int:
        return sum(s.width for s in x[1:]) if len(x) > 1 else x[0].width

    @classmethod
    def output_shape(cls, x: tuple[Dense, ...], p: Params) -> Dense:
        return x[0]

    @classmethod
    def flops(cls, x: tuple[Dense, ...], p: Params) -> int:
        return 2 * cls._gate_width(x) * x[0].width

    @classmethod
    def num_params(cls, x: tuple[Dense, ...], p: Params) -> int:
        return cls._gate_width(x) * x[0].width + x[0].width


class SumBlock(BlockModule):
    """Elementwise sum of dense inputs; an input whose width differs from `width` is first
    projected by a linear layer. Without `width` the inputs must already agree."""

    op = "sum"
    input_kind = output_kind = "dense"
    takes_list = True
    PARAMS: ClassVar = {
        "width": Param("int", None, low=1, high=65536, optional=True, doc="output width"),
    }
    doc = "sum of the inputs, projected to one width where needed"

    def __init__(self, x: tuple[Dense, ...], width: int | None) -> None:
        super().__init__()
        width = self._width(x, width)
        self.projections = nn.ModuleList(
            nn.Identity() if s.width == width else nn.Linear(s.width, width) for s in x
        )

    def forward(self, inputs: list[torch.Tensor]) -> torch.Tensor:
        projected = [proj(t) for proj, t in zip(self.projections, inputs, strict=True)]
        return torch.stack(projected).sum(dim=0)

    @staticmethod
    def _width(x: tuple[Dense, ...], width: int | None) -> int:
        return width if width is not None else x[0].width

    @classmethod
    def check(cls, x: tuple[Dense, ...], p: Params) -> str | None:
        widths = [s.width for s in x]
        if p["width"] is None and len(set(widths)) > 1:
            return (
                f"shape mismatch: inputs have widths {widths}; set params.width to project "
                "them to one width"
            )
        return None

    @classmethod
    def output_shape(cls, x: tuple[Dense, ...], p: Params) -> Dense:
        return Dense(cls._width(x, p["width"]))

    @classmethod
    def flops(cls, x: tuple[Dense, ...], p: Params) -> int:
        width = cls._width(x, p["width"])
        return sum(2 * s.width * width for s in x if s.width != width)

    @classmethod
    def num_params(cls, x: tuple[Dense, ...], p: Params) -> int:
        width = cls._width(x, p["width"])
        return sum(s.width * width + width for s in x if s.width != width)


# ----------------------------------------------------------------------------- sparse -> dense


class DotProductBlock(BlockModule):
    """DLRM interaction: pairwise inner products of the embeddings, upper triangle."""

    op = "dot"
    input_kind, output_kind = "sparse", "dense"
    PARAMS: ClassVar = {"self_interaction": Param("bool", False, doc="keep <e_i, e_i>")}
    doc = "pairwise inner products of the embeddings (DLRM)"

    def __init__(self, x: Sparse, self_interaction: bool) -> None:
        super().__init__()
        self.register_buffer("pairs", upper_pairs(x.count, self_interaction), persistent=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return pairwise_dot(x, self.pairs)

    @classmethod
    def check(cls, x: Sparse, p: Params) -> str | None:
        if x.count < 2 and not p["self_interaction"]:
            return f"shape mismatch: needs at least 2 embeddings, got {x}"
        return None

    @classmethod
    def output_shape(cls, x: Sparse, p: Params) -> Dense:
        n = x.count
        return Dense(n * (n + 1) // 2 if p["self_interaction"] else n * (n - 1) // 2)

    @classmethod
    def flops(cls, x: Sparse, p: Params) -> int:
        return 2 * x.count * x.count * x.dim

    @classmethod
    def num_params(cls, x: Sparse, p: Params) -> int:
        return 0


class FMBlock(BlockModule):
    """Factorization machine: 0.5 * ((sum e)^2 - sum e^2), summed over the embedding dim
    (`reduce: true`, one output) or kept per dim."""

    op = "fm"
    input_kind, output_kind = "sparse", "dense"
    PARAMS: ClassVar = {"reduce": Param("bool", True, doc="sum over the embedding dim")}
    doc = "factorization-machine second-order term (DeepFM)"

    def __init__(self, x: Sparse, reduce: bool) -> None:
        super().__init__()
        self.reduce = reduce

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # the sum-of-squares trick cancels: bf16 or fp16 is computed in fp32, rounded once
        y = x.float() if x.element_size() < 4 else x
        total = y.sum(dim=1)
        out = 0.5 * (total * total - (y * y).sum(dim=1))
        return (out.sum(dim=1, keepdim=True) if self.reduce else out).to(x.dtype)

    @classmethod
    def output_shape(cls, x: Sparse, p: Params) -> Dense:
        return Dense(1 if p["reduce"] else x.dim)

    @classmethod
    def flops(cls, x: Sparse, p: Params) -> int:
        return 0

    @classmethod
    def num_params(cls, x: Sparse, p: Params) -> int:
        return 0


# ----------------------------------------------------------------------------- sparse -> sparse


class EFCBlock(BlockModule):
    """NASRec's embedded fully connected layer: a linear map across the embedding axis."""

    op = "efc"
    input_kind = output_kind = "sparse"
    PARAMS: ClassVar = {"num_out": Param("int", low=1, high=4096, doc="embeddings out")}
    doc = "linear map across the embeddings (NASRec EFC)"

    def __init__(self, x: Sparse, num_out: int) -> None:
        super().__init__()
        self.linear = AcrossEmbeddings(x.count, num_out)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.linear(x)

    @classmethod
    def output_shape(cls, x: Sparse, p: Params) -> Sparse:
        return Sparse(p["num_out"], x.dim)

    @classmethod
    def flops(cls, x: Sparse, p: Params) -> int:
        return AcrossEmbeddings.flops(x.count, p["num_out"], x.dim)

    @classmethod
    def num_params(cls, x: Sparse, p: Params) -> int:
        return AcrossEmbeddings.num_params(x.count, p["num_out"])


class AttentionBlock(BlockModule):
    """AutoInt / transformer-style self-attention over the embeddings, with a residual
    connection and LayerNorm: LN(x + MHSA(x))."""

    op = "attention"
    input_kind = output_kind = "sparse"
    PARAMS: ClassVar = {
        "num_heads": Param("int", 2, low=1, high=64),
        "head_dim": Param("int", None, low=1, high=1024, optional=True, doc="default: dim"),
    }
    doc = "multi-head self-attention over the embeddings (AutoInt)"

    def __init__(self, x: Sparse, num_heads: int, head_dim: int | None) -> None:
        super().__init__()
        self.attention = MultiHeadSelfAttention(x.dim, num_heads, head_dim or x.dim)
        self.norm = nn.LayerNorm(x.dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.norm(x + self.attention(x))

    @classmethod
    def output_shape(cls, x: Sparse, p: Params) -> Sparse:
        return x

    @classmethod
    def flops(cls, x: Sparse, p: Params) -> int:
        return MultiHeadSelfAttention.flops(x.count, x.dim, p["num_heads"], p["head_dim"] or x.dim)

    @classmethod
    def num_params(cls, x: Sparse, p: Params) -> int:
        attention = MultiHeadSelfAttention.num_params(x.dim, p["num_heads"], p["head_dim"] or x.dim)
        return attention + 2 * x.dim


class WukongBlock(BlockModule):
    """One Wukong layer (arXiv 2403.02545): X' = LN(concat(FMB(X), LCB(X)) + residual(X)).

    FMB(X) = reshape(MLP(LN(flatten(X (X^T Y))))) gives `num_fm` embeddings, with the
    optimized FM X (X^T Y) and a learnable Y of shape [n, rank]; LCB(X) = W_L X gives
    `num_lc` embeddings; the residual is compressed linearly when the count changes.
    """

    op = "wukong"
    input_kind = output_kind = "sparse"
    PARAMS: ClassVar = {
        "num_fm": Param("int", 8, low=1, high=1024, doc="n_F, embeddings from FMB"),
        "num_lc": Param("int", 8, low=1, high=1024, doc="n_L, embeddings from LCB"),
        "rank": Param("int", 24, low=1, high=1024, doc="k, columns of Y in X (X^T Y)"),
        "fmb_widths": Param("int_list", (64,), low=1, high=65536, doc="FMB MLP hidden widths"),
    }
    doc = "Wukong layer: optimized-FM block + linear-compress block, residual, LayerNorm"

    def __init__(
        self, x: Sparse, num_fm: int, num_lc: int, rank: int, fmb_widths: Sequence[int]
    ) -> None:
        super().__init__()
        n, d = x.count, x.dim
        self.num_fm, self.dim = num_fm, d
        self.fm_projection = nn.Parameter(nn.init.xavier_normal_(torch.empty(n, rank)))
        self.fm_norm = nn.LayerNorm(n * rank)
        self.fm_mlp = nn.Sequential(
            mlp(n * rank, fmb_widths), nn.Linear(fmb_widths[-1], num_fm * d)
        )
        self.linear_compress = AcrossEmbeddings(n, num_lc, bias=False)
        out = num_fm + num_lc
        self.residual = nn.Identity() if out == n else AcrossEmbeddings(n, out, bias=False)
        self.norm = nn.LayerNorm(d)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        batch = x.shape[0]
        xty = torch.matmul(x.transpose(1, 2), self.fm_projection)  # [B, d, rank]
        fm = torch.bmm(x, xty).flatten(1)  # [B, n * rank]
        fmb = self.fm_mlp(self.fm_norm(fm)).view(batch, self.num_fm, self.dim)
        lcb = self.linear_compress(x)
        return self.norm(torch.cat([fmb, lcb], dim=1) + self.residual(x))

    @classmethod
    def output_shape(cls, x: Sparse, p: Params) -> Sparse:
        return Sparse(p["num_fm"] + p["num_lc"], x.dim)

    @classmethod
    def flops(cls, x: Sparse, p: Params) -> int:
        n, d, k = x.count, x.dim, p["rank"]
        out = p["num_fm"] + p["num_lc"]
        fm = 2 * d * n * k + 2 * n * d * k
        fmb_mlp = mlp_flops(n * k, p["fmb_widths"]) + 2 * p["fmb_widths"][-1] * p["num_fm"] * d
        lcb = AcrossEmbeddings.flops(n, p["num_lc"], d)
        residual = 0 if out == n else AcrossEmbeddings.flops(n, out, d)
        return fm + fmb_mlp + lcb + residual

    @classmethod
    def num_params(cls, x: Sparse, p: Params) -> int:
        n, d, k = x.count, x.dim, p["rank"]
        out = p["num_fm"] + p["num_lc"]
        last = p["fmb_widths"][-1]
        fmb = n * k + 2 * n * k + mlp_params(n * k, p["fmb_widths"]) + last * p["num_fm"] * d
        fmb += p["num_fm"] * d
        lcb = AcrossEmbeddings.num_params(n, p["num_lc"], bias=False)
        residual = 0 if out == n else AcrossEmbeddings.num_params(n, out, bias=False)
        return fmb + lcb + residual + 2 * d


# ----------------------------------------------------------------------------- DHEN


class _DotInteraction(nn.Module):
    """DHEN's dot-product module: pairwise products -> MLP -> n_out embeddings."""

    def __init__(self, n: int, d: int, n_out: int, p: Params) -> None:
        super().__init__()
        self.register_buffer("pairs", upper_pairs(n), persistent=False)
        self.mlp = nn.Sequential(mlp(len(self.pairs), [p["hidden"]]),
                                 nn.Linear(p["hidden"], n_out * d))  # fmt: skip
        self.n_out, self.d = n_out, d

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.mlp(pairwise_dot(x, self.pairs)).view(-1, self.n_out, self.d)

    @staticmethod
    def cost(n: int, d: int, n_out: int, p: Params) -> tuple[int, int]:
        pairs, hidden = n * (n - 1) // 2, p["hidden"]
        flops = 2 * n * n * d + mlp_flops(pairs, [hidden, n_out * d])
        return flops, mlp_params(pairs, [hidden, n_out * d])


class _AttentionInteraction(nn.Module):
    """DHEN's self-attention module, then a linear map to n_out embeddings if needed."""

    def __init__(self, n: int, d: int, n_out: int, p: Params) -> None:
        super().__init__()
        self.attention = MultiHeadSelfAttention(d, p["num_heads"], d)
        self.resize = nn.Identity() if n_out == n else AcrossEmbeddings(n, n_out, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.resize(self.attention(x))

    @staticmethod
    def cost(n: int, d: int, n_out: int, p: Params) -> tuple[int, int]:
        flops = MultiHeadSelfAttention.flops(n, d, p["num_heads"], d)
        params = MultiHeadSelfAttention.num_params(d, p["num_heads"], d)
        if n_out != n:
            flops += AcrossEmbeddings.flops(n, n_out, d)
            params += AcrossEmbeddings.num_params(n, n_out, bias=False)
        return flops, params


class _CrossInteraction(nn.Module):
    """DHEN's DCN module: one low-rank cross layer on the flattened embeddings."""

    def __init__(self, n: int, d: int, n_out: int, p: Params) -> None:
        super().__init__()
        self.cross = CrossNet(n * d, num_layers=1, low_rank=p["rank"])
        self.resize = nn.Identity() if n_out == n else nn.Linear(n * d, n_out * d)
        self.n_out, self.d = n_out, d

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.resize(self.cross(x.flatten(1))).view(-1, self.n_out, self.d)

    @staticmethod
    def cost(n: int, d: int, n_out: int, p: Params) -> tuple[int, int]:
        width = n * d
        flops, params = 4 * width * p["rank"], 2 * width * p["rank"] + width
        if n_out != n:
            flops += 2 * width * n_out * d
            params += width * n_out * d + n_out * d
        return flops, params


class _ConvInteraction(nn.Module):
    """DHEN's convolution module: a width-3 convolution along the embedding dim, with the
    embeddings as channels."""

    def __init__(self, n: int, d: int, n_out: int, p: Params) -> None:
        super().__init__()
        self.conv = nn.Conv1d(n, n_out, kernel_size=3, padding=1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.conv(x)

    @staticmethod
    def cost(n: int, d: int, n_out: int, p: Params) -> tuple[int, int]:
        return 2 * n_out * d * n * 3, n_out * n * 3 + n_out


class _LinearInteraction(nn.Module):
    """DHEN's linear module: a linear map across the embeddings."""

    def __init__(self, n: int, d: int, n_out: int, p: Params) -> None:
        super().__init__()
        self.linear = AcrossEmbeddings(n, n_out)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.linear(x)

    @staticmethod
    def cost(n: int, d: int, n_out: int, p: Params) -> tuple[int, int]:
        return AcrossEmbeddings.flops(n, n_out, d), AcrossEmbeddings.num_params(n, n_out)


DHEN_MODULES: dict[str, type[nn.Module]] = {
    "dot": _DotInteraction,
    "attention": _AttentionInteraction,
    "dcn": _CrossInteraction,
    "conv": _ConvInteraction,
    "linear": _LinearInteraction,
}


class DHENBlock(BlockModule):
    """One DHEN layer (arXiv 2203.11014): Y = LN(Aggregate_i(Module_i(X)) + ShortCut(X)).

    Every interaction module maps `[n, d]` to `[num_out, d]`. Aggregation: `sum`,
    `weighted_sum` (one learnable weight per module) or `concat` along the embedding axis
    followed by a linear map back to `num_out` embeddings. The shortcut is the identity,
    or a linear map across the embeddings when the count changes.
    """

    op = "dhen"
    input_kind = output_kind = "sparse"
    PARAMS: ClassVar = {
        "modules": Param("choice_list", ("dot", "attention"), choices=tuple(DHEN_MODULES)),
        "aggregation": Param("choice", "sum", choices=("sum", "weighted_sum", "concat")),
        "num_out": Param("int", None, low=1, high=4096, optional=True, doc="default: n"),
        "hidden": Param("int", 64, low=1, high=65536, doc="dot module MLP width"),
        "num_heads": Param("int", 1, low=1, high=64, doc="attention module heads"),
        "rank": Param("int", 8, low=1, high=4096, doc="dcn module low rank"),
    }
    doc = "DHEN layer: ensemble of interaction modules, shortcut, LayerNorm"

    def __init__(self, x: Sparse, **p: Any) -> None:
        super().__init__()
        n, d, n_out = x.count, x.dim, self._num_out(x, p)
        self.interactions = nn.ModuleList(DHEN_MODULES[m](n, d, n_out, p) for m in p["modules"])
        self.aggregation = p["aggregation"]
        count = len(p["modules"])
        if self.aggregation == "weighted_sum":
            self.module_weights = nn.Parameter(torch.full((count,), 1.0 / count))
        if self.aggregation == "concat" and count > 1:
            self.concat_compress = AcrossEmbeddings(count * n_out, n_out, bias=False)
        self.shortcut = nn.Identity() if n_out == n else AcrossEmbeddings(n, n_out, bias=False)
        self.norm = nn.LayerNorm(d)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        outputs = [module(x) for module in self.interactions]
        if self.aggregation == "weighted_sum":
            mixed = sum(w * y for w, y in zip(self.module_weights, outputs, strict=True))
        elif self.aggregation == "concat" and len(outputs) > 1:
            mixed = self.concat_compress(torch.cat(outputs, dim=1))
        else:
            mixed = torch.stack(outputs).sum(dim=0)
        return self.norm(mixed + self.shortcut(x))

    @staticmethod
    def _num_out(x: Sparse, p: Params) -> int:
        return p["num_out"] or x.count

    @classmethod
    def check(cls, x: Sparse, p: Params) -> str | None:
        if "dot" in p["modules"] and x.count < 2:
            return f"shape mismatch: the dot module needs at least 2 embeddings, got {x}"
        return None

    @classmethod
    def output_shape(cls, x: Sparse, p: Params) -> Sparse:
        return Sparse(cls._num_out(x, p), x.dim)

    @classmethod
    def _cost(cls, x: Sparse, p: Params) -> tuple[int, int]:
        n, d, n_out = x.count, x.dim, cls._num_out(x, p)
        costs = [DHEN_MODULES[m].cost(n, d, n_out, p) for m in p["modules"]]
        flops, params = sum(c[0] for c in costs), sum(c[1] for c in costs) + 2 * d
        count = len(p["modules"])
        if p["aggregation"] == "weighted_sum":
            params += count
        if p["aggregation"] == "concat" and count > 1:
            flops += AcrossEmbeddings.flops(count * n_out, n_out, d)
            params += AcrossEmbeddings.num_params(count * n_out, n_out, bias=False)
        if n_out != n:
            flops += AcrossEmbeddings.flops(n, n_out, d)
            params += AcrossEmbeddings.num_params(n, n_out, bias=False)
        return flops, params

    @classmethod
    def flops(cls, x: Sparse, p: Params) -> int:
        return cls._cost(x, p)[0]

    @classmethod
    def num_params(cls, x: Sparse, p: Params) -> int:
        return cls._cost(x, p)[1]


OPS: dict[str, type[BlockModule]] = {
    cls.op: cls
    for cls in (
        MLPBlock,
        CrossBlock,
        ConcatBlock,
        GatingBlock,
        SumBlock,
        DotProductBlock,
        FMBlock,
        EFCBlock,
        AttentionBlock,
        WukongBlock,
        DHENBlock,
    )
}
