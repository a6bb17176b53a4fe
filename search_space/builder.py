"""Architecture + dataset schema -> `nn.Module` returning one logit per example.

The sparse side is a torchrec `EmbeddingBagCollection` (one table per categorical feature)
fed by a `KeyedJaggedTensor`; the dense side is the `[B, num_dense]` float tensor.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import nn
from torchrec.modules.embedding_configs import EmbeddingBagConfig, PoolingType
from torchrec.modules.embedding_modules import EmbeddingBagCollection
from torchrec.sparse.jagged_tensor import KeyedJaggedTensor, KeyedTensor

from search_space.architecture import Analysis, Architecture, EmbeddingConfig, analyze
from search_space.blocks import OPS, BlockModule
from search_space.names import module_key, table_name
from search_space.schema import DatasetSchema

# Under autocast, the network's inputs are cast to its dtype first. Left in fp32 (the
# tables' dtype), the first cat of a bf16 block output with them promotes the rest of the
# network's elementwise work, and the activations saved for backward, to fp32.
AUTOCAST_INPUTS = True


def embedding_bag_collection(
    emb: EmbeddingConfig, device: torch.device | str | None = None
) -> EmbeddingBagCollection:
    """One table (`table_name`: `t_<feature>`) per feature the model uses
    (`EmbeddingConfig.used`), as every ranknas model has, pooled by the feature's pooling
    (a single id per row: sum, which is the id's embedding)."""
    return EmbeddingBagCollection(
        tables=[
            EmbeddingBagConfig(
                name=table_name(f.name),
                embedding_dim=emb.feature_dim(f),
                num_embeddings=f.num_embeddings,
                feature_names=[f.name],
                pooling=PoolingType[f.pooling.upper()],
            )
            for f in emb.used
        ],
        device=torch.device(device) if device is not None else None,
    )


class RankingModel(nn.Module):
    """The network an `Architecture` describes. `forward(dense, sparse) -> logits [B]`."""

    def __init__(self, analysis: Analysis, device: torch.device | str | None = None) -> None:
        super().__init__()
        arch = analysis.arch
        emb = arch.embedding
        self.architecture = arch
        self.order = analysis.order
        self.inputs = {name: arch.block(name).inputs for name in self.order}
        self.output_name = arch.output_block
        self.embedding_dim = emb.dim
        self.feature_names = [f.name for f in emb.used]  # the lookups read these of a batch
        self.embedding_bags = embedding_bag_collection(emb, device)
        self.feature_projections = nn.ModuleDict(
            {
                module_key(f.name): nn.Linear(emb.feature_dim(f), emb.dim, bias=False)
                for f in emb.used
                if emb.feature_dim(f) != emb.dim
            }
        )
        self.merge_projections = nn.ModuleDict(
            {f"{p.block}__{p.source}": nn.Linear(p.width, emb.dim) for p in analysis.projections}
        )
        self.blocks = nn.ModuleDict(
            {
                name: OPS[arch.block(name).op](analysis.input_shapes[name], **analysis.params[name])
                for name in self.order
            }
        )
        self.block_kinds = {name: OPS[arch.block(name).op] for name in self.order}
        self.head = nn.Linear(analysis.shapes[self.output_name].numel, 1)
        if device is not None:
            self.to(device)

    def embed(self, sparse: KeyedJaggedTensor) -> torch.Tensor:
        """Pooled embeddings as `[B, F, dim]`, features in the architecture's order."""
        return pooled_features(
            self.embedding_bags(sparse),
            self.feature_names,
            self.embedding_dim,
            lambda name: _module(self.feature_projections, module_key(name)),
        )

    def forward(self, dense: torch.Tensor, sparse: KeyedJaggedTensor) -> torch.Tensor:
        return self.interact(dense, self.embed(sparse) if self.feature_names else None)

    def interact(self, dense: torch.Tensor, pooled: torch.Tensor | None) -> torch.Tensor:
        """The dense part: the blocks and the head on the dense features and the pooled
        embeddings (`embed`), as logits `[B]`."""
        device = dense.device.type
        if AUTOCAST_INPUTS and torch.is_autocast_enabled(device):
            dtype = torch.get_autocast_dtype(device)
            dense, pooled = dense.to(dtype), pooled.to(dtype) if pooled is not None else None
        outputs: dict[str, torch.Tensor] = {"dense": dense}
        if pooled is not None:
            outputs["sparse"] = pooled
        for name in self.order:
            tensors = [(source, outputs[source]) for source in self.inputs[name]]
            merged = merge_inputs(self.block_kinds[name], tensors, self._projection_into(name))
            outputs[name] = self.blocks[name](merged)
        return self.head(outputs[self.output_name].flatten(1)).squeeze(1)

    def _projection_into(self, name: str) -> Projection:
        return lambda source: _module(self.merge_projections, f"{name}__{source}")


def _module(modules: nn.ModuleDict, key: str) -> nn.Module | None:
    return modules[key] if key in modules else None  # noqa: SIM401 (ModuleDict has no get)


Projection = Callable[[str], Callable[[torch.Tensor], torch.Tensor] | None]


def pooled_features(
    pooled: KeyedTensor, names: list[str], dim: int, projection: Projection
) -> torch.Tensor:
    """`[B, F, dim]` from an EmbeddingBagCollection's output, features in `names` order, a
    feature with its own dim through `projection(name)` (None: as is).

    A sharded collection (DistributedModelParallel) may return the features grouped by
    rank, so the order is checked rather than assumed.
    """
    projected = {n: p for n in names if (p := projection(n)) is not None}
    if not projected and pooled.keys() == names:
        return pooled.values().view(pooled.values().shape[0], -1, dim)
    by_feature = pooled.to_dict()
    columns = [projected[n](by_feature[n]) if n in projected else by_feature[n] for n in names]
    return torch.stack(columns, dim=1)


def merge_inputs(
    kind: type[BlockModule], tensors: list[tuple[str, torch.Tensor]], projection: Projection
) -> torch.Tensor | list[torch.Tensor]:
    """A block's inputs as it takes them: a dense block gets them flattened and concatenated
    (or as a list); a sparse block gets them concatenated along the embedding axis, a dense
    input as one more embedding, through `projection(source)` where its width is not dim."""
    if kind.input_kind == "dense":
        flat = [t.flatten(1) for _, t in tensors]
        return flat if kind.takes_list else _cat(flat, dim=1)
    embeddings = []
    for source, t in tensors:
        if t.dim() == 2:
            project = projection(source)
            t = (project(t) if project is not None else t).unsqueeze(1)
        embeddings.append(t)
    return _cat(embeddings, dim=1)


def _cat(tensors: list[torch.Tensor], dim: int) -> torch.Tensor:
    return tensors[0] if len(tensors) == 1 else torch.cat(tensors, dim=dim)


def build_model(
    arch: Architecture,
    schema: DatasetSchema | None = None,
    seed: int | None = None,
    device: torch.device | str | None = None,
) -> RankingModel:
    """Validate `arch` (bound to `schema` if given) and build it; `seed` fixes the init."""
    if schema is not None:
        arch = arch.bind(schema)
    analysis = analyze(arch)
    if seed is None:
        return RankingModel(analysis, device)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        return RankingModel(analysis, device)


def example_batch(
    arch: Architecture, batch_size: int, seed: int = 0
) -> tuple[torch.Tensor, KeyedJaggedTensor]:
    """Random inputs that fit a bound architecture: one id per used feature per example."""
    generator = torch.Generator().manual_seed(seed)
    dense = torch.randn(batch_size, arch.num_dense or 0, generator=generator)
    features = arch.embedding.used
    ids = [torch.randint(0, f.num_embeddings, (batch_size,), generator=generator) for f in features]
    sparse = KeyedJaggedTensor(
        keys=[f.name for f in features],
        values=torch.cat(ids) if ids else torch.empty(0, dtype=torch.long),
        lengths=torch.ones(batch_size * len(features), dtype=torch.int32),
    )
    return dense, sparse
