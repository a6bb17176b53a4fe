"""The one in-memory form of every data set, its splits, and the batch loader."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field, replace
from typing import NamedTuple

import numpy as np
import torch
from torchrec.sparse.jagged_tensor import KeyedJaggedTensor

from search_space.errors import RanknasError
from search_space.schema import DatasetSchema
from trainers.data.report import BadRowReport

SPLIT_NAMES = ("train", "valid", "test")


@dataclass
class TabularData:
    """Rows of one data set: dense features, categorical ids and labels.

    dense: float32 [n, D]; categorical: int64 [n, S] with column k's ids in
    [0, schema.categorical[k].cardinality); labels: float32 [n] in {0, 1};
    true_prob: the true click probability per row, known only for synthetic data;
    bad_rows: what the reader skipped, if it read a file.
    """

    dense: np.ndarray
    categorical: np.ndarray
    labels: np.ndarray
    schema: DatasetSchema
    true_prob: np.ndarray | None = None
    bad_rows: BadRowReport | None = None
    time: np.ndarray | None = None  # each row's event time, when the schema names a column
    # per categorical column read by name: each row's code into the column's distinct raw
    # values (-1: missing), and those values, so that a vocabulary can be fitted per split
    raw_values: dict[str, tuple[np.ndarray, tuple[str, ...]]] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.dense = np.ascontiguousarray(self.dense, dtype=np.float32)
        self.categorical = np.ascontiguousarray(self.categorical, dtype=np.int64)
        self.labels = np.ascontiguousarray(self.labels, dtype=np.float32)
        n = self.labels.shape[0]
        if self.labels.ndim != 1:
            raise ValueError(f"labels has shape {self.labels.shape}, expected (n,)")
        if self.dense.shape != (n, self.schema.num_dense):
            raise ValueError(
                f"dense has shape {self.dense.shape}, expected {(n, self.schema.num_dense)}"
            )
        if self.categorical.shape != (n, self.schema.num_sparse):
            raise ValueError(
                f"categorical has shape {self.categorical.shape}, "
                f"expected {(n, self.schema.num_sparse)}"
            )
        if self.true_prob is not None and self.true_prob.shape != (n,):
            raise ValueError(f"true_prob has shape {self.true_prob.shape}, expected {(n,)}")
        self._check_ids()

    def _check_ids(self) -> None:
        if len(self) == 0 or self.schema.num_sparse == 0:
            return
        cardinalities = np.array([f.cardinality for f in self.schema.categorical])
        low, high = self.categorical.min(axis=0), self.categorical.max(axis=0)
        bad = np.flatnonzero((low < 0) | (high >= cardinalities))
        if bad.size:
            k = int(bad[0])
            raise ValueError(
                f"feature {self.schema.feature_names[k]!r} has ids in [{low[k]}, {high[k]}], "
                f"outside its cardinality {cardinalities[k]}"
            )

    def __len__(self) -> int:
        return int(self.labels.shape[0])

    def take(self, rows: np.ndarray) -> TabularData:
        """The rows at the given indices (a copy), in that order."""
        return replace(
            self,
            dense=self.dense[rows],
            categorical=self.categorical[rows],
            labels=self.labels[rows],
            true_prob=None if self.true_prob is None else self.true_prob[rows],
            time=None if self.time is None else self.time[rows],
            raw_values={k: (codes[rows], values) for k, (codes, values) in self.raw_values.items()},
        )

    def head(self, rows: int) -> TabularData:
        """The first `rows` rows (a copy)."""
        return self.take(np.arange(min(rows, len(self))))

    def split_indices(
        self, fractions: Sequence[float] = (0.8, 0.1, 0.1), seed: int = 0, method: str = "random"
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Row indices of train/valid/test: disjoint, covering, deterministic in `seed`.

        `random`: a seeded permutation (indices sorted within a split); `ordered`: contiguous
        in file order; `time`: contiguous in the order of `time` (ties in file order), so that
        validation and test are the future of training, as production is.
        """
        if len(fractions) != 3 or any(f < 0 for f in fractions) or abs(sum(fractions) - 1) > 1e-6:
            raise RanknasError(
                f"split fractions {tuple(fractions)}: need three non-negative numbers "
                "(train, valid, test) that sum to 1"
            )
        n = len(self)
        if method == "random":
            order = np.random.default_rng(seed).permutation(n)
        elif method == "ordered":
            order = np.arange(n)
        elif method == "time" and self.time is not None:
            order = np.argsort(self.time, kind="stable")
        else:
            raise RanknasError(
                f"split method {method!r}: use random, ordered, or time (with a time column "
                "named in the schema)"
            )
        bounds = np.round(np.cumsum(fractions)[:2] * n).astype(np.int64)
        parts = np.split(order, bounds)
        return tuple(np.sort(p) for p in parts)  # type: ignore[return-value]

    def split(
        self, fractions: Sequence[float] = (0.8, 0.1, 0.1), seed: int = 0, method: str = "random"
    ) -> tuple[TabularData, TabularData, TabularData]:
        """Train, validation and test sets; see `split_indices`."""
        train, valid, test = self.split_indices(fractions, seed, method)
        return self.take(train), self.take(valid), self.take(test)

    def loader(
        self,
        batch_size: int,
        *,
        shuffle: bool = False,
        seed: int = 0,
        drop_last: bool = False,
        pin_memory: bool | None = None,
    ) -> BatchLoader:
        return BatchLoader(
            self,
            batch_size,
            shuffle=shuffle,
            seed=seed,
            drop_last=drop_last,
            pin_memory=pin_memory,
        )


class Batch(NamedTuple):
    dense: torch.Tensor  # float32 [B, D]
    sparse: KeyedJaggedTensor  # keys = categorical feature names, one id per row and key
    labels: torch.Tensor  # float32 [B]


class BatchLoader:
    """Batches of a `TabularData` as torch tensors and a `KeyedJaggedTensor`.

    A batch is a slice (or, with `shuffle`, a gather) of the whole data set, copied in
    numpy and wrapped with `torch.from_numpy`: numpy copies on one thread, whereas torch's
    parallel copies slow down badly when the model's threads hold every core. With `shuffle`,
    epoch e uses a permutation seeded by (seed, e); each iteration over the loader is one
    epoch (`set_epoch` overrides). Batches are pinned when CUDA is available, unless
    `pin_memory=False`.
    """

    def __init__(
        self,
        data: TabularData,
        batch_size: int,
        *,
        shuffle: bool = False,
        seed: int = 0,
        drop_last: bool = False,
        pin_memory: bool | None = None,
    ) -> None:
        if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1:
            raise RanknasError(f"batch_size must be an integer >= 1 (got {batch_size!r})")
        self.batch_size = batch_size
        self.shuffle = shuffle
        self.seed = seed
        self.drop_last = drop_last
        self.pin_memory = torch.cuda.is_available() and pin_memory is not False
        self.epoch = 0
        self.keys = data.schema.feature_names
        self._rows = len(data)
        self._arrays = (data.dense, data.categorical, data.labels)
        self._ones = torch.ones(batch_size * len(self.keys), dtype=torch.int32)

    def __len__(self) -> int:
        full, rest = divmod(self._rows, self.batch_size)
        return full + int(bool(rest) and not self.drop_last)

    def set_epoch(self, epoch: int) -> None:
        """Make the next iteration use epoch `epoch`'s permutation."""
        self.epoch = epoch

    def __iter__(self) -> Iterator[Batch]:
        order = None
        if self.shuffle:
            order = np.random.default_rng([self.seed, self.epoch]).permutation(self._rows)
        self.epoch += 1
        for i in range(len(self)):
            rows = slice(i * self.batch_size, (i + 1) * self.batch_size)
            yield self._batch(rows if order is None else order[rows])

    def _batch(self, rows: slice | np.ndarray) -> Batch:
        if isinstance(rows, slice):
            dense, ids, labels = (a[rows] for a in self._arrays)
            # slices are views: copy, so a batch never aliases the data set (flatten copies ids)
            dense, labels = dense.copy(), labels.copy()
        else:
            dense, ids, labels = (np.take(a, rows, axis=0) for a in self._arrays)
        values = torch.from_numpy(ids.T.flatten())  # feature-major: key 0's rows, then key 1's
        batch = Batch(
            torch.from_numpy(dense), self._kjt(values, len(labels)), torch.from_numpy(labels)
        )
        if self.pin_memory:
            batch = Batch(*(part.pin_memory() for part in batch))
        return batch

    def _kjt(self, values: torch.Tensor, size: int) -> KeyedJaggedTensor:
        count = len(self.keys)
        return KeyedJaggedTensor(
            keys=self.keys,
            values=values,
            lengths=self._ones[: size * count],
            stride=size,
            length_per_key=[size] * count,
            offset_per_key=[size * k for k in range(count + 1)],
        )
