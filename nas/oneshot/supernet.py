"""A weight-sharing supernet over the DAG space (NASRec-style "single-operator any-connection").

Every architecture of a `DagSpace` is a path through the supernet. The supernet keeps the
weights of one *slot* per key and creates them on first use:

- a block slot per (block, op, normalized params): every architecture whose block `b{i}`
  runs the same operator with the same size shares it, whichever sources feed it;
- an `EmbeddingBagCollection` per tuple of per-feature embedding dims;
- a merge projection per (block, source, dim), a feature projection per
  (feature, feature dim, dim), one head.

Blocks, merge projections and the head see inputs of many shapes (the merged width or
embedding count depends on the connections and on earlier blocks' choices). Their slots are
`SharedWeights`: each parameter is held at the largest shape seen so far, and the module of
a smaller input shape runs on the leading corner of every parameter (weight slicing, as
elastic supernets do). Keying these slots by the input shape instead
(`share_across_shapes=False`) spreads a few thousand training steps over hundreds of
rarely trained modules, and inherited scores then rank architectures poorly.

Because each slot (or corner of one) is exactly a module `build_model(arch)` creates for
that position, `extract(arch)` returns a `state_dict` that loads into `build_model(arch)`
with `strict=True`, and the stand-alone model then computes exactly what the supernet
computes on that path (`tests/test_oneshot.py` checks it bit for bit).

Training (`train_supernet`) samples one path per step: NASRec's single-operator
any-connection sampling (one op per block, a uniformly drawn number of inputs), with a
warm-up that samples the "full" supernet (every input slot connected) with a probability
decaying linearly from 1 to 0, or uniform single-path sampling (SPOS).
"""

from __future__ import annotations

import functools
import hashlib
import json
import math
import random
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any, Literal

import torch
import torch.nn.functional as F
from torch import nn
from torchrec.modules.embedding_modules import EmbeddingBagCollection
from torchrec.sparse.jagged_tensor import KeyedJaggedTensor

from search_space.architecture import Analysis, Architecture, analyze
from search_space.blocks import OPS
from search_space.builder import embedding_bag_collection, merge_inputs, pooled_features
from search_space.errors import RanknasError, SpecError
from search_space.names import module_key
from search_space.spaces.dag import NONE, DagSpace, input_param
from trainers import progress as bars
from trainers.data.dataset import TabularData
from trainers.trainer import cosine_factor

Sampling = Literal["nasrec", "spos"]
LrSchedule = Literal["constant", "cosine"]
# Called with (step, mean training loss since the last call).
LossCallback = Callable[[int, float], None]


def _slot(*parts: Any) -> str:
    """A ModuleDict-safe key: a readable prefix and a hash of the full spec."""
    text = json.dumps(parts, sort_keys=True, default=repr)
    head = "_".join(str(p) for p in parts[:2] if isinstance(p, str | int))
    safe = "".join(c if c.isalnum() else "_" for c in head)
    return f"{safe}_{hashlib.sha1(text.encode()).hexdigest()[:12]}"


# (ModuleDict name, slot key, input-shape key: "" for a module of one shape)
Slot = tuple[str, str, str]


@dataclass
class SupernetPath:
    """One architecture as a path: its analysis and, for every submodule prefix of the
    stand-alone `RankingModel`, the slot that holds its weights."""

    arch: Architecture
    analysis: Analysis
    slots: dict[str, Slot]

    @property
    def inputs(self) -> dict[str, tuple[str, ...]]:
        return {name: self.arch.block(name).inputs for name in self.analysis.order}


def _corner(shape: tuple[int, ...] | torch.Size) -> tuple[slice, ...]:
    return tuple(slice(0, n) for n in shape)


def _corner_union(old: torch.Tensor | None, new: torch.Tensor) -> torch.Tensor:
    """A tensor covering both shapes: `old` in its corner, `new` where `old` does not reach
    (a region neither covers starts at zero)."""
    if old is None:
        return new.clone()
    shape = tuple(max(a, b) for a, b in zip(old.shape, new.shape, strict=True))
    out = torch.zeros(shape, dtype=old.dtype, device=old.device)
    out[_corner(new.shape)] = new.to(old.device)
    out[_corner(old.shape)] = old.detach()
    return out


def _like_parameter(tensor: torch.Tensor) -> torch.Tensor:
    """Under no_grad a corner is a leaf that does not require grad; mark it as a parameter
    would be, since matmul picks its kernel (and summation order) by requires_grad."""
    if tensor.is_leaf and not tensor.requires_grad:
        tensor.requires_grad_(True)
    return tensor


class SharedWeights(nn.Module):
    """One slot's weights for every input shape: each parameter held at the largest shape
    seen, and the module of a smaller shape run on the leading corner of each."""

    def __init__(self) -> None:
        super().__init__()
        self.weights = nn.ParameterDict()
        # per input shape: a module of that shape (its own parameters unused) and its
        # parameters' (name, key in `weights`, shape)
        self._templates: dict[str, nn.Module] = {}
        self._layouts: dict[str, list[tuple[str, str, tuple[int, ...]]]] = {}

    def has(self, shape_key: str) -> bool:
        return shape_key in self._templates

    def add_shape(
        self, shape_key: str, module: nn.Module
    ) -> list[tuple[nn.Parameter | None, nn.Parameter]]:
        """Register the (freshly initialized) module of one input shape; returns the
        (replaced, new) parameters: replaced is None for a new one, else the one it grew."""
        changes: list[tuple[nn.Parameter | None, nn.Parameter]] = []
        layout = []
        for name, value in module.named_parameters():
            key = name.replace(".", "__")
            layout.append((name, key, tuple(value.shape)))
            old = self.weights.get(key)
            if old is not None and all(n <= o for n, o in zip(value.shape, old.shape, strict=True)):
                continue
            grown = nn.Parameter(_corner_union(old, value.detach()))
            self.weights[key] = grown
            changes.append((old, grown))
        self._templates[shape_key] = module
        self._layouts[shape_key] = layout
        return changes

    def parameters_at(self, shape_key: str) -> dict[str, torch.Tensor]:
        """The parameters of the module of `shape_key`: corners of the shared weights
        (contiguous, so they compute exactly as a stand-alone module's own parameters)."""
        return {
            name: _like_parameter(self.weights[key][_corner(shape)].contiguous())
            for name, key, shape in self._layouts[shape_key]
        }

    def run(self, shape_key: str, *args: Any) -> Any:
        template = self._templates[shape_key]
        return torch.func.functional_call(template, self.parameters_at(shape_key), args)

    def state_at(self, shape_key: str) -> dict[str, torch.Tensor]:
        state = dict(self._templates[shape_key].state_dict())
        return state | self.parameters_at(shape_key)


class Supernet(nn.Module):
    """All candidate operators, sizes and connections of a `DagSpace`, weights shared."""

    def __init__(self, space: DagSpace, seed: int = 0, share_across_shapes: bool = True) -> None:
        super().__init__()
        if not isinstance(space, DagSpace):
            raise RanknasError("the one-shot supernet supports the dag search space only")
        self.space = space
        self.share_across_shapes = share_across_shapes
        self.embeddings = nn.ModuleDict()
        self.feature_projections = nn.ModuleDict()
        self.merge_projections = nn.ModuleDict()
        self.blocks = nn.ModuleDict()
        self.heads = nn.ModuleDict()
        self._generator_seed = seed
        self._created = 0
        self._paths: dict[str, SupernetPath] = {}
        self._new_parameters: list[tuple[str, nn.Parameter]] = []
        self._grown_parameters: list[tuple[nn.Parameter, nn.Parameter]] = []

    # ------------------------------------------------------------------ paths

    def path(self, arch: Architecture) -> SupernetPath:
        """The path of `arch`, creating the weights it needs on first use."""
        text = arch.to_json()
        found = self._paths.get(text)
        if found is not None:
            return found
        analysis = analyze(arch)
        emb = arch.embedding
        dims = tuple(emb.feature_dim(f) for f in emb.features)
        slots: dict[str, Slot] = {}
        slots["embedding_bags"] = self._ensure(
            "embeddings", _slot("emb", *dims), lambda: self._make_ebc(arch)
        )
        for f in emb.features:
            fdim = emb.feature_dim(f)
            if fdim != emb.dim:
                slots[f"feature_projections.{module_key(f.name)}"] = self._ensure(
                    "feature_projections",
                    _slot(f.name, fdim, emb.dim),
                    lambda fdim=fdim: nn.Linear(fdim, emb.dim, bias=False),
                )
        for p in analysis.projections:
            slots[f"merge_projections.{p.block}__{p.source}"] = self._ensure_shared(
                "merge_projections",
                (p.block, p.source, emb.dim),
                p.width,
                lambda p=p: nn.Linear(p.width, emb.dim),
            )
        for name in analysis.order:
            op, params, shape = (
                arch.block(name).op,
                analysis.params[name],
                analysis.input_shapes[name],
            )
            slots[f"blocks.{name}"] = self._ensure_shared(
                "blocks",
                (name, op, params),
                shape,
                lambda op=op, params=params, shape=shape: OPS[op](shape, **params),
            )
        head_in = analysis.shapes[arch.output_block].numel
        slots["head"] = self._ensure_shared(
            "heads", ("head",), head_in, lambda: nn.Linear(head_in, 1)
        )
        found = SupernetPath(arch, analysis, slots)
        self._paths[text] = found
        return found

    def _make_ebc(self, arch: Architecture) -> EmbeddingBagCollection:
        return embedding_bag_collection(arch.embedding)

    def _seeded(self, make: Callable[[], nn.Module]) -> nn.Module:
        """A new module, initialized from the supernet's seed and creation count."""
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(self._generator_seed * 1_000_003 + self._created)
            module = make()
        self._created += 1
        device = self._device()
        return module.to(device) if device is not None else module

    def _ensure(self, group: str, key: str, make: Callable[[], nn.Module]) -> Slot:
        modules: nn.ModuleDict = getattr(self, group)
        if key not in modules:
            modules[key] = self._seeded(make)
            self._new_parameters += [
                (f"{group}.{key}.{n}", p) for n, p in modules[key].named_parameters()
            ]
        return group, key, ""

    def _ensure_shared(
        self, group: str, spec: tuple, shape: Any, make: Callable[[], nn.Module]
    ) -> Slot:
        """The slot of `spec` at input `shape`, keyed by the spec alone when weights are
        shared across shapes, by the spec and the shape otherwise."""
        shape_key = repr(shape)
        key = _slot(*spec) if self.share_across_shapes else _slot(*spec, shape_key)
        modules: nn.ModuleDict = getattr(self, group)
        if key not in modules:
            modules[key] = SharedWeights()
        shared: SharedWeights = modules[key]
        if not shared.has(shape_key):
            for old, new in shared.add_shape(shape_key, self._seeded(make)):
                if old is None:
                    self._new_parameters.append((f"{group}.{key}", new))
                else:
                    self._grown_parameters.append((old, new))
        return group, key, shape_key

    def _device(self) -> torch.device | None:
        for p in self.parameters():
            return p.device
        return None

    def module_at(self, path: SupernetPath, prefix: str) -> Callable[..., Any]:
        """What computes the submodule `prefix` of the path's stand-alone model."""
        group, key, shape_key = path.slots[prefix]
        module = getattr(self, group)[key]
        if isinstance(module, SharedWeights):
            return functools.partial(module.run, shape_key)
        return module

    def pop_new_parameters(self) -> list[tuple[str, nn.Parameter]]:
        """Parameters created since the last call (for adding them to optimizers)."""
        new, self._new_parameters = self._new_parameters, []
        return new

    def pop_grown_parameters(self) -> list[tuple[nn.Parameter, nn.Parameter]]:
        """(old, new) pairs of parameters grown since the last call (the new one holds the
        old one in its corner; optimizers swap them)."""
        grown, self._grown_parameters = self._grown_parameters, []
        return grown

    # ------------------------------------------------------------------ forward

    def forward(
        self,
        arch: Architecture | SupernetPath,
        dense: torch.Tensor,
        sparse: KeyedJaggedTensor,
        gates: PathGates | None = None,
    ) -> torch.Tensor:
        """The logits of `arch` on a batch: the same computation as `RankingModel.forward`.
        `gates` (DNAS) scales the embeddings, each block input and each block output by a
        tensor (straight-through one-hot weights, 1 in value)."""
        path = arch if isinstance(arch, SupernetPath) else self.path(arch)
        a = path.arch
        outputs: dict[str, torch.Tensor] = {"dense": dense}
        if a.embedding.features:
            outputs["sparse"] = self._embed(path, sparse)
            if gates is not None and gates.sparse is not None:
                outputs["sparse"] = outputs["sparse"] * gates.sparse
        for name in path.analysis.order:
            block = self.module_at(path, f"blocks.{name}")
            merged = self._merge(path, name, outputs, gates)
            out = block(merged)
            if gates is not None and name in gates.outputs:
                out = out * gates.outputs[name]
            outputs[name] = out
        head = self.module_at(path, "head")
        return head(outputs[a.output_block].flatten(1)).squeeze(1)

    def _embed(self, path: SupernetPath, sparse: KeyedJaggedTensor) -> torch.Tensor:
        emb = path.arch.embedding
        return pooled_features(
            self.module_at(path, "embedding_bags")(sparse),
            [f.name for f in emb.features],
            emb.dim,
            lambda n: self._slot_module(path, f"feature_projections.{module_key(n)}"),
        )

    def _merge(
        self,
        path: SupernetPath,
        name: str,
        outputs: dict[str, torch.Tensor],
        gates: PathGates | None,
    ) -> torch.Tensor | list[torch.Tensor]:
        tensors = []
        for source in path.arch.block(name).inputs:
            t = outputs[source]
            if gates is not None and (name, source) in gates.inputs:
                t = t * gates.inputs[(name, source)]
            tensors.append((source, t))
        return merge_inputs(
            OPS[path.arch.block(name).op],
            tensors,
            lambda source: self._slot_module(path, f"merge_projections.{name}__{source}"),
        )

    def _slot_module(self, path: SupernetPath, prefix: str) -> Callable[..., Any] | None:
        return self.module_at(path, prefix) if prefix in path.slots else None

    # ------------------------------------------------------------------ extraction

    def extract(self, arch: Architecture) -> dict[str, torch.Tensor]:
        """The inherited weights of `arch`: a `state_dict` for `build_model(arch)`."""
        path = self.path(arch)
        state: dict[str, torch.Tensor] = {}
        for prefix, (group, key, shape_key) in path.slots.items():
            module = getattr(self, group)[key]
            values = (
                module.state_at(shape_key)
                if isinstance(module, SharedWeights)
                else module.state_dict()
            )
            for name, value in values.items():
                state[f"{prefix}.{name}"] = value.detach().clone()
        return state


@dataclass
class PathGates:
    """DNAS scales on one path: embeddings, (block, source) inputs, block outputs."""

    sparse: torch.Tensor | None
    inputs: dict[tuple[str, str], torch.Tensor]
    outputs: dict[str, torch.Tensor]


# ---------------------------------------------------------------------- sampling


def sample_values(
    space: DagSpace, rng: random.Random, sampling: Sampling = "nasrec", full: bool = False
) -> dict[str, Any]:
    """One path's parameter values. `spos`: every parameter uniform. `nasrec`: one op per
    block, and a uniformly drawn number of distinct inputs (`full`: every slot connected)."""
    values = space.sample_values(rng)
    if sampling == "spos" and not full:
        return values
    params = space.parameters()
    k_max = space.config.max_inputs
    for i in range(space.config.num_blocks):
        sources = list(params[input_param(i, 1)].choices)
        wanted = min(len(sources), k_max if full else rng.randint(1, k_max))
        chosen = rng.sample(sources, wanted)
        for k in range(1, k_max + 1):
            values[input_param(i, k)] = chosen[k - 1] if k <= len(chosen) else NONE
    return values


def sample_arch(
    space: DagSpace, rng: random.Random, sampling: Sampling = "nasrec", full: bool = False
) -> tuple[dict[str, Any], Architecture]:
    """Sampled values and their (valid) architecture; invalid draws are redrawn."""
    for _ in range(100):
        values = sample_values(space, rng, sampling, full)
        try:
            arch = space.decode(values)
            analyze(arch)
        except SpecError:
            continue
        return values, arch
    raise RanknasError("could not sample a valid architecture from the space in 100 draws")


# ---------------------------------------------------------------------- training


class SupernetOptimizer:
    """Adam for dense weights, Adagrad with sparse gradients for the embedding tables (as
    `trainers.trainer.make_optimizers`), growing as the supernet creates or grows weights.
    `max_grad_norm` clips the dense gradients (a newly created slot's first steps otherwise
    give loss spikes that disturb the weights other paths share)."""

    def __init__(
        self,
        supernet: Supernet,
        dense_lr: float,
        sparse_lr: float,
        max_grad_norm: float | None = None,
    ) -> None:
        self.supernet, self.dense_lr, self.sparse_lr = supernet, dense_lr, sparse_lr
        self.max_grad_norm = max_grad_norm
        self.dense: torch.optim.Optimizer | None = None
        self.sparse: torch.optim.Optimizer | None = None
        torch.sparse.check_sparse_tensor_invariants.disable()

    def refresh(self) -> None:
        for old, new in self.supernet.pop_grown_parameters():
            if self.dense is not None:
                _swap_parameter(self.dense, old, new)
        new = self.supernet.pop_new_parameters()
        if not new:
            return
        for bag_group in self.supernet.embeddings.values():
            for bag in bag_group.embedding_bags.values():
                bag.sparse = True
        dense = [p for n, p in new if not n.startswith("embeddings.")]
        sparse = [p for n, p in new if n.startswith("embeddings.")]
        if dense:
            if self.dense is None:
                self.dense = torch.optim.Adam(dense, lr=self.dense_lr)
            else:
                self.dense.add_param_group({"params": dense, "lr": self.dense_lr})
        if sparse:
            if self.sparse is None:
                self.sparse = torch.optim.Adagrad(sparse, lr=self.sparse_lr)
            else:
                self.sparse.add_param_group({"params": sparse, "lr": self.sparse_lr})

    @property
    def optimizers(self) -> list[torch.optim.Optimizer]:
        return [o for o in (self.dense, self.sparse) if o is not None]

    def scale_lr(self, factor: float) -> None:
        """Set every learning rate to `factor` times its base value."""
        for optimizer, base in ((self.dense, self.dense_lr), (self.sparse, self.sparse_lr)):
            for group in optimizer.param_groups if optimizer is not None else ():
                group["lr"] = base * factor

    def zero_grad(self) -> None:
        self.supernet.zero_grad(set_to_none=True)

    def step(self) -> None:
        if self.max_grad_norm is not None and self.dense is not None:
            params = [p for g in self.dense.param_groups for p in g["params"] if p.grad is not None]
            torch.nn.utils.clip_grad_norm_(params, self.max_grad_norm)
        for optimizer in self.optimizers:
            optimizer.step()


def _swap_parameter(optimizer: torch.optim.Optimizer, old: nn.Parameter, new: nn.Parameter) -> None:
    """Replace `old` by its grown copy `new`, its state padded with zeros."""
    for group in optimizer.param_groups:
        for i, p in enumerate(group["params"]):
            if p is old:
                group["params"][i] = new
                state = optimizer.state.pop(old, {})
                optimizer.state[new] = {
                    k: _corner_union(v, torch.zeros_like(new))
                    if torch.is_tensor(v) and v.shape == old.shape and v.dim() > 0
                    else v
                    for k, v in state.items()
                }
                return


def batches(data: TabularData, batch_size: int, seed: int) -> Iterator:
    """Shuffled batches, epoch after epoch."""
    batch_size = min(batch_size, len(data))
    loader = data.loader(batch_size, shuffle=True, seed=seed, drop_last=True)
    epoch = 0
    while True:
        loader.set_epoch(epoch)
        yield from loader
        epoch += 1


def warmup_probability(step: int, steps: int, warmup_fraction: float) -> float:
    """Probability of sampling the full supernet at `step`: 1 decaying linearly to 0."""
    horizon = warmup_fraction * steps
    return max(0.0, 1.0 - step / horizon) if horizon > 0 else 0.0


def lr_factor(step: int, steps: int, schedule: LrSchedule) -> float:
    """The learning-rate multiplier at `step` of `steps` (0-based)."""
    return cosine_factor(step / max(1, steps)) if schedule == "cosine" else 1.0


def train_supernet(
    supernet: Supernet,
    data: TabularData,
    *,
    steps: int,
    batch_size: int = 256,
    sampling: Sampling = "nasrec",
    warmup_fraction: float = 0.25,
    dense_lr: float = 2e-3,
    sparse_lr: float = 0.05,
    max_grad_norm: float | None = None,
    lr_schedule: LrSchedule = "constant",
    seed: int = 0,
    log_every: int = 20,
    on_loss: LossCallback | None = None,
    max_seconds: float | None = None,
) -> list[tuple[int, float]]:
    """Train the supernet one sampled path per step; returns the (step, loss) curve.
    `lr_schedule` "cosine" decays the learning rates to zero over the steps."""
    rng = random.Random(seed)
    optimizer = SupernetOptimizer(supernet, dense_lr, sparse_lr, max_grad_norm)
    supernet.train()
    curve: list[tuple[int, float]] = []
    total, count, started = 0.0, 0, time.monotonic()
    stream = batches(data, batch_size, seed)
    # off a terminal `on_loss`'s lines are the periodic lines
    with bars.bar(steps, "oneshot supernet", "steps", lines=False) as bar:
        for step in range(1, steps + 1):
            full = rng.random() < warmup_probability(step - 1, steps, warmup_fraction)
            _, arch = sample_arch(supernet.space, rng, sampling, full)
            dense, sparse, labels = next(stream)
            path = supernet.path(arch)
            optimizer.refresh()
            optimizer.scale_lr(lr_factor(step - 1, steps, lr_schedule))
            loss = F.binary_cross_entropy_with_logits(supernet(path, dense, sparse), labels)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            value = loss.item()
            if math.isfinite(value):
                total, count = total + value, count + 1
            bar.update()
            if step % log_every == 0 or step == steps:
                mean = total / max(count, 1)
                curve.append((step, mean))
                bar.show("loss", mean)
                if on_loss is not None:
                    on_loss(step, mean)
                total, count = 0.0, 0
            if max_seconds is not None and time.monotonic() - started > max_seconds:
                break
    return curve
