"""Every embedding table of one width looked up, and updated, by one kernel: the GPU's
counterpart of `FusedTables`.

On a GPU a torchrec `EmbeddingBagCollection` runs one `nn.EmbeddingBag` per table, each
with its own forward, backward and optimizer kernels, so a small model's step is mostly
kernel launches (BENCHMARKS.md, "Trials on a GPU"). `JointTables` concatenates the tables
of one width into one weight, adds each feature's row offset to its ids, gathers every
feature's rows with one index, and in backward applies the sparse optimizer (exact
Adagrad, row-wise Adagrad or SGD, as the trainer's) to the rows the batch touched. The
update coalesces repeated ids with static shapes (sort, segment sums, one padding row
that absorbs the unused segments), so the whole step can be captured as a CUDA graph.
Pure torch: fbgemm's CUDA build, whose TBE does the same, is too large to carry.

It stands in for the model's collection while `trainers.trainer.train` runs: same inputs,
outputs and state-dict keys (the tables are views of the joint weights), then
`write_back` returns the trained weights. Ids must be in range (the data pipeline's
encoding guarantees it): an id past its table would read the next table's rows.
"""

from __future__ import annotations

import torch
from torch import nn
from torchrec.modules.embedding_configs import PoolingType
from torchrec.modules.embedding_modules import EmbeddingBagCollection
from torchrec.sparse.jagged_tensor import KeyedJaggedTensor, KeyedTensor

EPS = 1e-10  # torch's Adagrad and torchrec's RowWiseAdagrad


class _Group:
    """The tables of one width: their joint weight (one padding row at the end), optimizer
    state, and each member feature's first row."""

    def __init__(self, members: list[int], tables: list[torch.Tensor], optimizer: str) -> None:
        dim, device = tables[0].shape[1], tables[0].device
        rows = [t.shape[0] for t in tables]
        self.members = members
        self.member_index = torch.tensor(members, device=device)
        self.starts = torch.tensor([0, *rows[:-1]], device=device).cumsum(0)
        self.pad = sum(rows)
        self.weight = torch.zeros(self.pad + 1, dim, device=device)
        self.views = []
        for table, start in zip(tables, self.starts.tolist(), strict=True):
            view = self.weight[start : start + table.shape[0]]
            view.copy_(table.detach())
            self.views.append(view)
        width = {"adagrad": dim, "rowwise_adagrad": 1, "sgd": 0}[optimizer]
        self.state = torch.zeros(self.pad + 1, width, device=device) if width else None


class _LookUp(torch.autograd.Function):
    """Rows of a group's weight; backward updates the rows instead of returning a gradient
    (`anchor` is a tensor that requires grad, so that backward runs)."""

    @staticmethod
    def forward(ctx, anchor, tables: JointTables, group: _Group, rows: torch.Tensor):
        ctx.tables, ctx.group, ctx.rows = tables, group, rows
        return group.weight.index_select(0, rows)

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        ctx.tables.update(ctx.group, ctx.rows, grad)
        return None, None, None, None


class JointTables(nn.Module):
    """The tables of `ebc` (one feature per table) as one weight per embedding width,
    trained in backward by `optimizer` ("adagrad", "rowwise_adagrad" or "sgd") at `lr`.
    `single_valued`: every feature has one id per row (the lookup is then one gather);
    otherwise lists of ids are pooled by each table's pooling (sum or mean)."""

    def __init__(
        self, ebc: EmbeddingBagCollection, optimizer: str, lr: float, single_valued: bool
    ) -> None:
        super().__init__()
        configs = ebc.embedding_bag_configs()
        self.keys = [c.feature_names[0] for c in configs]
        self.dims = [c.embedding_dim for c in configs]
        self.optimizer, self.lr, self.single_valued = optimizer, lr, single_valued
        tables = [ebc.embedding_bags[c.name].weight for c in configs]
        device = tables[0].device
        widths = list(dict.fromkeys(self.dims))  # in the order they first appear
        members = [[i for i, d in enumerate(self.dims) if d == w] for w in widths]
        self._groups = [_Group(m, [tables[i] for i in m], optimizer) for m in members]
        self._mean = torch.tensor([c.pooling == PoolingType.MEAN for c in configs], device=device)
        # Output columns, groups side by side, back in feature order (None: already are).
        grouped = [i for m in members for i in m]
        starts = dict(zip(grouped, [0, *torch.tensor(self.dims)[grouped].cumsum(0).tolist()],
                          strict=False))  # fmt: skip
        columns = [starts[i] + j for i in range(len(configs)) for j in range(self.dims[i])]
        self._columns = None if grouped == sorted(grouped) else torch.tensor(columns, device=device)
        # Not parameters: no optimizer of the trainer's sees them. Buffers keep the
        # collection's state-dict keys (load_state_dict copies into the joint weights).
        self.embedding_bags = nn.ModuleDict()
        views = {i: v for g in self._groups for i, v in zip(g.members, g.views, strict=True)}
        for i, config in enumerate(configs):
            holder = nn.Module()
            holder.register_buffer("weight", views[i])
            self.embedding_bags[config.name] = holder
        self._anchor = torch.zeros((), device=device, requires_grad=True)
        self._order: dict[tuple[str, ...], list[int]] = {}

    @staticmethod
    def fits(ebc: nn.Module) -> bool:
        """Whether `ebc` is an EmbeddingBagCollection of one feature per table, sum- or
        mean-pooled."""
        return isinstance(ebc, EmbeddingBagCollection) and all(
            len(c.feature_names) == 1 and c.pooling in (PoolingType.SUM, PoolingType.MEAN)
            for c in ebc.embedding_bag_configs()
        )

    def forward(self, features: KeyedJaggedTensor) -> KeyedTensor:
        keys = tuple(features.keys())
        if list(keys) != self.keys:  # another order, or more features than the model uses
            order = self._order.setdefault(keys, [keys.index(k) for k in self.keys])
            features = features.permute(order)
        look_up = self._single if self.single_valued else self._pooled
        parts = [look_up(group, features) for group in self._groups]
        values = parts[0] if len(parts) == 1 else torch.cat(parts, dim=1)
        if self._columns is not None:
            values = values.index_select(1, self._columns)
        return KeyedTensor(keys=self.keys, length_per_key=self.dims, values=values)

    def _gather(self, group: _Group, rows: torch.Tensor) -> torch.Tensor:
        anchor = self._anchor if torch.is_grad_enabled() else self._anchor.detach()
        return _LookUp.apply(anchor, self, group, rows)

    def _single(self, group: _Group, features: KeyedJaggedTensor) -> torch.Tensor:
        """One id per row and feature: feature-major values, one gather."""
        ids = features.values().view(len(self.keys), -1)
        if len(group.members) != len(self.keys):
            ids = ids.index_select(0, group.member_index)
        batch = ids.shape[1]
        found = self._gather(group, (ids + group.starts[:, None]).reshape(-1))
        return found.view(len(group.members), batch, -1).transpose(0, 1).reshape(batch, -1)

    def _pooled(self, group: _Group, features: KeyedJaggedTensor) -> torch.Tensor:
        """Lists of ids: each bag's rows summed (divided by its length where mean-pooled)."""
        batch = features.stride()
        lengths = features.lengths().view(len(self.keys), batch)[group.member_index]
        offsets = features.offset_per_key()
        segments = [features.values()[offsets[i] : offsets[i + 1]] for i in group.members]
        rows = torch.cat([ids + start for ids, start in zip(segments, group.starts, strict=True)])
        found = self._gather(group, rows)
        bags = torch.repeat_interleave(
            torch.arange(lengths.numel(), device=rows.device), lengths.reshape(-1),
            output_size=rows.numel(),
        )  # fmt: skip
        pooled = found.new_zeros(lengths.numel(), found.shape[1]).index_add_(0, bags, found)
        mean = self._mean[group.member_index][:, None].expand_as(lengths).reshape(-1, 1)
        divisor = torch.where(mean, lengths.reshape(-1, 1).clamp_min(1), 1).to(pooled.dtype)
        pooled = pooled / divisor
        return pooled.view(len(group.members), batch, -1).transpose(0, 1).reshape(batch, -1)

    @torch.no_grad()
    def update(self, group: _Group, rows: torch.Tensor, grad: torch.Tensor) -> None:
        """The optimizer's step on the rows a batch looked up, repeated ids summed first,
        with static shapes: segment k of the sorted ids holds the k-th distinct row; the
        segments past the last distinct row point at the padding row with zero gradient."""
        grad = grad.float()
        ordered, order = rows.sort()
        first = torch.ones_like(ordered, dtype=torch.bool)
        first[1:] = ordered[1:] != ordered[:-1]
        segment = first.cumsum(0) - 1
        summed = torch.zeros_like(grad).index_add_(0, segment, grad.index_select(0, order))
        distinct = torch.full_like(rows, group.pad).scatter_(0, segment, ordered)
        if self.optimizer == "sgd":
            group.weight.index_add_(0, distinct, summed, alpha=-self.lr)
            return
        squares = summed * summed
        if self.optimizer == "rowwise_adagrad":
            squares = squares.mean(dim=1, keepdim=True)
        # the distinct rows are unique but for the padding row, which gets zeros: adding
        # in place is exact (and much faster on a GPU than copying the rows back)
        group.state.index_add_(0, distinct, squares)
        step = summed / group.state.index_select(0, distinct).sqrt().add_(EPS)
        group.weight.index_add_(0, distinct, step, alpha=-self.lr)

    def write_back(self, ebc: EmbeddingBagCollection) -> None:
        """Copy the trained weights into `ebc`'s tables."""
        with torch.no_grad():
            for name, holder in self.embedding_bags.items():
                ebc.embedding_bags[name].weight.copy_(holder.weight)
