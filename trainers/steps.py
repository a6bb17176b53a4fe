"""One training step (forward, loss, backward, optimizer steps), run eagerly or replayed as
a CUDA graph.

A small ranking model's step on a GPU is a few hundred tiny kernels: launched one by one
from Python it waits on the launches, not on the GPU. `GraphStep` captures the whole step
once (after a few eager warm-up steps on a side stream, as `torch.cuda.graphs` asks) and
then replays it: the batch is copied into the graph's static input tensors and one launch
runs everything. It needs static shapes (one id per row and feature, full batches) and
optimizers that keep their state on the device (`capturable=True`, the learning rate as
a tensor). `EagerStep` is the reference that every other case runs.
"""

from __future__ import annotations

import warnings

import torch
import torch.nn.functional as F
from torch import nn
from torchrec.sparse.jagged_tensor import KeyedJaggedTensor

from trainers.data.dataset import Batch

WARMUP_STEPS = 3  # eager steps before the capture: lazy state (optimizers, cuBLAS) is made


class EagerStep:
    """The step as plain PyTorch; returns the batch's loss (detached, on the device).
    `compiled`: the model's dense part (`interact`) runs compiled by torch.compile."""

    def __init__(
        self, model: nn.Module, optimizers: list[torch.optim.Optimizer], bf16: bool,
        compiled: bool = False,
    ) -> None:  # fmt: skip
        self.model, self.optimizers, self.bf16 = model, optimizers, bf16
        self.forward = _compiled_forward(model) if compiled else model

    def __call__(self, batch: Batch) -> torch.Tensor:
        return self._step(*batch, cache=True)

    def _step(self, dense, sparse, labels, cache: bool) -> torch.Tensor:
        device = labels.device.type
        # a graph may not reuse autocast's cast weights across replays: no cache there
        with torch.autocast(device, torch.bfloat16, enabled=self.bf16, cache_enabled=cache):
            logits = self.forward(dense, sparse)
        loss = F.binary_cross_entropy_with_logits(logits.float(), labels)
        for optimizer in self.optimizers:
            optimizer.zero_grad(set_to_none=True)
        loss.backward()
        for optimizer in self.optimizers:
            optimizer.step()
        return loss.detach()


class GraphStep(EagerStep):
    """The step captured as a CUDA graph at its `WARMUP_STEPS + 1`-th call and replayed
    from then on. Every batch must have the first one's shapes and keys (one id per row
    and feature). If the capture fails, it says why once and stays eager."""

    def __init__(
        self, model: nn.Module, optimizers: list[torch.optim.Optimizer], bf16: bool,
        compiled: bool = False,
    ) -> None:  # fmt: skip
        super().__init__(model, optimizers, bf16, compiled)
        self._calls = 0
        self._graph: torch.cuda.CUDAGraph | None = None
        self._inputs: tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None = None
        self._loss: torch.Tensor | None = None
        self._eager = False

    def __call__(self, batch: Batch) -> torch.Tensor:
        if self._eager:
            return super().__call__(batch)
        if self._inputs is None:
            self._inputs = tuple(t.clone() for t in (batch.dense, batch.sparse.values(),
                                                      batch.labels))  # fmt: skip
            self._keys, self._batch_size = batch.sparse.keys(), batch.labels.shape[0]
        for static, given in zip(self._inputs, (batch.dense, batch.sparse.values(),
                                                batch.labels), strict=True):  # fmt: skip
            static.copy_(given, non_blocking=True)
        self._calls += 1
        if self._graph is not None:
            self._graph.replay()
            return self._loss
        if self._calls <= WARMUP_STEPS:
            return self._on_side_stream()
        return self._capture()

    def _static_step(self) -> torch.Tensor:
        dense, values, labels = self._inputs
        size, count = self._batch_size, len(self._keys)
        sparse = KeyedJaggedTensor(
            keys=self._keys, values=values,
            lengths=torch.ones(size * count, dtype=torch.int32, device=values.device),
            stride=size, length_per_key=[size] * count,
            offset_per_key=[size * k for k in range(count + 1)],
        )  # fmt: skip
        return self._step(dense, sparse, labels, cache=False)

    def _on_side_stream(self) -> torch.Tensor:
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            loss = self._static_step()
        torch.cuda.current_stream().wait_stream(side)
        return loss

    def _capture(self) -> torch.Tensor:
        graph = torch.cuda.CUDAGraph()
        for optimizer in self.optimizers:  # the graph's backward assigns fresh gradients
            optimizer.zero_grad(set_to_none=True)
        try:
            with torch.cuda.graph(graph):
                self._loss = self._static_step()
        except Exception as exc:  # any capture failure: train on, eagerly
            torch.cuda.synchronize()
            warnings.warn(
                f"CUDA graph capture failed ({type(exc).__name__}: {exc}); training eagerly",
                stacklevel=2,
            )
            self._eager = True
            return self._static_step()
        self._graph = graph
        graph.replay()
        return self._loss


def _compiled_forward(model: nn.Module):
    """The model's forward with its dense part compiled: the embedding lookups (a
    KeyedJaggedTensor in, tables that may update themselves in backward) stay eager."""
    interact = torch.compile(model.interact)

    def forward(dense: torch.Tensor, sparse: KeyedJaggedTensor) -> torch.Tensor:
        return interact(dense, model.embed(sparse) if model.feature_names else None)

    return forward


def set_lr(optimizer: torch.optim.Optimizer, lr: float) -> None:
    """The first group's learning rate; a tensor (a captured step reads it) is filled."""
    group = optimizer.param_groups[0]
    if isinstance(group["lr"], torch.Tensor):
        group["lr"].fill_(lr)
    else:
        group["lr"] = lr
