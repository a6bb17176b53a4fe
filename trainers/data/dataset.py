"""The one in-memory form of every data set, its splits, and the batch loader."""

from __future__ import annotations

import logging
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
# rows of the rarer label in the validation split under which its NE is said to be too
# noisy to rank models by: the NE of a few dozen positives moves by whole percents with the
# rows drawn, where architectures differ by tenths of one
FEW_TO_RANK = 100
logger = logging.getLogger(__name__)


class Jagged(NamedTuple):
    """A list per row: row i's items are `values[offsets[i]:offsets[i + 1]]`."""

    offsets: np.ndarray  # int64 [n + 1], offsets[0] = 0
    values: np.ndarray

    @property
    def lengths(self) -> np.ndarray:
        return np.diff(self.offsets)

    def take(self, rows: np.ndarray | slice) -> Jagged:
        """The lists of the given rows (indices or a slice), in that order."""
        if isinstance(rows, slice):
            start, stop, _ = rows.indices(len(self.offsets) - 1)
            stop = max(start, stop)
            first, last = self.offsets[start], self.offsets[stop]
            return Jagged(self.offsets[start : stop + 1] - first, self.values[first:last])
        rows = np.asarray(rows, dtype=np.int64)
        lengths = self.offsets[rows + 1] - self.offsets[rows]
        offsets = np.zeros(len(rows) + 1, dtype=np.int64)
        np.cumsum(lengths, out=offsets[1:])
        # item j of the result comes from offsets[rows[r]] + (j - offsets_out[r]) for its row r
        shift = np.repeat(self.offsets[rows] - offsets[:-1], lengths)
        return Jagged(offsets, self.values[np.arange(offsets[-1]) + shift])


@dataclass(frozen=True)
class RawColumn:
    """A categorical column read by name, as raw values, so that its ids can be fitted on
    the training split: item codes into `values` (-1: missing), row after row, and how to
    encode them (`trainers.data.preprocess`)."""

    codes: Jagged  # one code per row for a single-valued column, a list for a multi-valued one
    values: tuple[str, ...]
    min_count: int = 1  # values seen fewer times in training are out of vocabulary
    hash_size: int | None = None  # hash into this many buckets instead of a vocabulary
    separator: str | None = None  # multi-valued text cells: what separates the items
    multi_valued: bool = False

    def take(self, rows: np.ndarray) -> RawColumn:
        return replace(self, codes=self.codes.take(rows))


@dataclass
class TabularData:
    """Rows of one data set: dense features, categorical ids and labels.

    dense: float32 [n, D]; categorical: int64 [n, S] with column k's ids in
    [0, schema.categorical[k].cardinality), -1 for a multi-valued column, whose ids per
    row are in `multi_hot` (a feature's ids are never read from a -1 column: any use that
    assumed one id per row fails instead of training on wrong ids); labels: float32 [n];
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
    # per categorical column read by name: its raw values, so that a vocabulary can be
    # fitted on the training split
    raw_values: dict[str, RawColumn] = field(default_factory=dict)
    # per multi-valued categorical column: each row's ids
    multi_hot: dict[str, Jagged] = field(default_factory=dict)

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
        multi = {f.name for f in self.schema.categorical if f.multi_valued}
        if set(self.multi_hot) != multi:
            raise ValueError(f"multi_hot has {sorted(self.multi_hot)}, expected {sorted(multi)}")
        self._check_ids()

    def _check_ids(self) -> None:
        if len(self) == 0 or self.schema.num_sparse == 0:
            return
        low, high = self.categorical.min(axis=0), self.categorical.max(axis=0)
        for k, feature in enumerate(self.schema.categorical):
            if feature.multi_valued:
                lists = self.multi_hot[feature.name]
                if len(lists.offsets) != len(self) + 1:
                    raise ValueError(
                        f"feature {feature.name!r} has lists for "
                        f"{len(lists.offsets) - 1} rows, expected {len(self)}"
                    )
                ids = lists.values
                low[k], high[k] = (ids.min(), ids.max()) if ids.size else (0, 0)
            if low[k] < 0 or high[k] >= feature.cardinality:
                raise ValueError(
                    f"feature {feature.name!r} has ids in [{low[k]}, {high[k]}], outside its "
                    f"cardinality {feature.cardinality}"
                )

    def __len__(self) -> int:
        return int(self.labels.shape[0])

    @property
    def label_mean(self) -> float:
        """The share of positive labels (the base rate)."""
        return float(self.labels.mean()) if len(self) else 0.0

    def take(self, rows: np.ndarray) -> TabularData:
        """The rows at the given indices (a copy), in that order."""
        return replace(
            self,
            dense=self.dense[rows],
            categorical=self.categorical[rows],
            labels=self.labels[rows],
            true_prob=None if self.true_prob is None else self.true_prob[rows],
            time=None if self.time is None else self.time[rows],
            raw_values={k: raw.take(rows) for k, raw in self.raw_values.items()},
            multi_hot={k: lists.take(rows) for k, lists in self.multi_hot.items()},
        )

    def head(self, rows: int) -> TabularData:
        """The first `rows` rows (a copy)."""
        return self.take(np.arange(min(rows, len(self))))

    def split_indices(
        self,
        fractions: Sequence[float] = (0.8, 0.1, 0.1),
        seed: int = 0,
        method: str = "random",
        ties_together: bool = True,
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Row indices of train/valid/test: disjoint, covering, deterministic in `seed`.

        `random`: a seeded permutation (indices sorted within a split); `ordered`: contiguous
        in file order; `time`: contiguous in the order of `time` (ties in file order), so that
        validation and test are the future of training, as production is; rows of the same
        time stay on one side of each boundary (see `_at_time_changes`) unless not
        `ties_together` (as studies split before that rule: `data.split.ties: file_order`).
        """
        n = len(self)
        bounds = split_bounds(n, fractions)
        if method == "random":
            order = np.random.default_rng(seed).permutation(n)
        elif method == "ordered":
            order = np.arange(n)
        elif method == "time" and self.time is not None:
            order = np.argsort(self.time, kind="stable")
            if ties_together:
                bounds = _at_time_changes(self.time[order], bounds)
                _warn_split_ties(self.time[order], bounds, self.schema.time)
        elif method == "time":
            raise RanknasError(
                f"split method 'time': {self.schema.name!r} has no time column; name one in "
                "the schema (time: COLUMN), or split by a column of the file: time:COLUMN "
                "(`ranknas train --split time:COLUMN`, data.split.column in a study)"
            )
        else:
            raise RanknasError(f"split method {method!r}: use random, ordered, or time")
        parts = np.split(order, bounds)
        return tuple(np.sort(p) for p in parts)  # type: ignore[return-value]

    def split(
        self,
        fractions: Sequence[float] = (0.8, 0.1, 0.1),
        seed: int = 0,
        method: str = "random",
        ties_together: bool = True,
        source: str | None = None,
    ) -> tuple[TabularData, TabularData, TabularData]:
        """Train, validation and test sets; see `split_indices`. Each must hold both labels:
        NE (logloss over the base rate's entropy) is undefined where it does not (the error
        names `source`, the file the rows came from, where given)."""
        indices = self.split_indices(fractions, seed, method, ties_together)
        parts = tuple(self.take(p) for p in indices)
        for name, part in zip(("training", "validation", "test"), parts, strict=True):
            positives = int(np.count_nonzero(part.labels))
            if len(part) and positives in (0, len(part)):  # (an empty part is asked for)
                which = "no positive" if positives == 0 else "only positive"
                raise RanknasError(
                    f"{source + ': ' if source else ''}"
                    f"the {name} split ({len(part):,} of {len(self):,} rows, {method} split) "
                    f"holds {which} labels ({self.schema.label!r}): a model's NE there is "
                    "undefined; give more rows, or check that the label column holds both "
                    "0 and 1"
                )
        return parts  # type: ignore[return-value]

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
    sparse: KeyedJaggedTensor  # keys = categorical feature names; one id per row and key,
    # a list per row for a multi-valued feature
    labels: torch.Tensor  # float32 [B]


def split_bounds(rows: int, fractions: Sequence[float]) -> np.ndarray:
    """Where `rows` rows in split order end training and validation, for train/valid/test
    `fractions` (checked)."""
    if len(fractions) != 3 or any(f < 0 for f in fractions) or abs(sum(fractions) - 1) > 1e-6:
        raise RanknasError(
            f"split fractions {tuple(fractions)}: need three non-negative numbers "
            "(train, valid, test) that sum to 1"
        )
    return np.round(np.cumsum(fractions)[:2] * rows).astype(np.int64)


def _at_time_changes(times: np.ndarray, bounds: np.ndarray) -> np.ndarray:
    """`bounds` into rows sorted by `times`, each moved to the nearest row where the time
    changes (the earlier one where two are as near), so that no time (a day, with a column of
    days) lies on both sides; as they were where that would empty a part they do not."""
    changes = np.flatnonzero(times[1:] != times[:-1]) + 1
    if not changes.size:
        return bounds
    after = np.minimum(np.searchsorted(changes, bounds), changes.size - 1)  # first >= bound
    before = np.maximum(after - 1, 0)
    nearer_before = bounds - changes[before] <= np.abs(changes[after] - bounds)
    moved = np.where(nearer_before & (changes[before] <= bounds), changes[before], changes[after])
    inside = (bounds > 0) & (bounds < len(times))  # a part asked to be empty stays empty
    moved = np.where(inside, moved, bounds)
    edges, moved_edges = (np.concatenate([[0], b, [len(times)]]) for b in (bounds, moved))
    if np.any((np.diff(moved_edges) == 0) & (np.diff(edges) > 0)):
        return bounds
    return moved


def _warn_split_ties(times: np.ndarray, bounds: np.ndarray, column: str | None) -> None:
    """Say where a boundary still falls among rows of one time: a column of a few days
    cannot be cut between days at these fractions, so one day's rows lie on both sides in
    file order (a folder per country: the test split one country)."""
    inside = [b for b in bounds if 0 < b < len(times) and times[b - 1] == times[b]]
    if inside:
        distinct = len(np.unique(times))
        logger.warning("time column %s has %d distinct values: the split cannot fall between "
                       "two of them at these fractions, so %d boundar%s fall%s among rows of "
                       "one time, which keep the files' order there (a file or folder per "
                       "country or source puts whole ones on one side); use a finer time "
                       "column, or data.split: random", column or "time", distinct,
                       len(inside), "y" if len(inside) == 1 else "ies",
                       "s" if len(inside) == 1 else "")  # fmt: skip


def check_batch_size(batch_size: object) -> None:
    if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1:
        raise RanknasError(f"batch_size must be an integer >= 1 (got {batch_size!r})")


def batch_count(rows: int, batch_size: int, drop_last: bool) -> int:
    full, rest = divmod(rows, batch_size)
    return full + int(bool(rest) and not drop_last)


class BatchLoader:
    """Batches of a `TabularData` as torch tensors and a `KeyedJaggedTensor`.

    A batch is a slice (or, with `shuffle`, a gather) of the whole data set, copied in
    numpy and wrapped with `torch.from_numpy`: numpy copies on one thread, whereas torch's
    parallel copies slow down badly when the model's threads hold every core. With `shuffle`,
    epoch e uses a permutation seeded by (seed, e); each iteration over the loader is one
    epoch (`set_epoch` overrides); `order` gives the permutation instead. Batches are pinned
    when CUDA is available, unless `pin_memory=False`.
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
        order: np.ndarray | None = None,
    ) -> None:
        check_batch_size(batch_size)
        self.batch_size = batch_size
        self.shuffle = shuffle
        self.order = order
        self.seed = seed
        self.drop_last = drop_last
        self.pin_memory = torch.cuda.is_available() and pin_memory is not False
        self.epoch = 0
        self.keys = data.schema.feature_names
        self._rows = len(data)
        self._arrays = (data.dense, data.categorical, data.labels)
        self._ones = torch.ones(batch_size * len(self.keys), dtype=torch.int32)
        self._multi_hot = data.multi_hot

    def __len__(self) -> int:
        return batch_count(self._rows, self.batch_size, self.drop_last)

    def set_epoch(self, epoch: int) -> None:
        """Make the next iteration use epoch `epoch`'s permutation."""
        self.epoch = epoch

    def __iter__(self) -> Iterator[Batch]:
        order = self.order
        if self.shuffle and order is None:
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
        if self._multi_hot:
            sparse = self._multi_hot_kjt(ids, rows, len(labels))
        else:  # feature-major: key 0's rows, then key 1's
            sparse = self._kjt(torch.from_numpy(ids.T.flatten()), len(labels))
        batch = Batch(torch.from_numpy(dense), sparse, torch.from_numpy(labels))
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

    def _multi_hot_kjt(
        self, ids: np.ndarray, rows: slice | np.ndarray, size: int
    ) -> KeyedJaggedTensor:
        """Key-major values and lengths: one id per row of a single-valued key, the rows'
        lists of a multi-valued one."""
        values, lengths = [], []
        for k, key in enumerate(self.keys):
            lists = self._multi_hot.get(key)
            if lists is None:
                values.append(ids[:, k])
                lengths.append(np.ones(size, dtype=np.int32))
            else:
                part = lists.take(rows)
                values.append(part.values)
                lengths.append(part.lengths.astype(np.int32))
        per_key = [len(v) for v in values]
        return KeyedJaggedTensor(
            keys=self.keys,
            values=torch.from_numpy(np.concatenate(values)),
            lengths=torch.from_numpy(np.concatenate(lengths)),
            stride=size,
            length_per_key=per_key,
            offset_per_key=[0, *np.cumsum(per_key).tolist()],
        )


class ResidentBatches:
    """The shuffled, full training batches of `data` (one id per row and feature), drawn
    on `device` from a copy of the whole data set held there: no host work or copy per
    step, which a GPU step that takes well under a millisecond would wait on. The same
    batches, in the same order, as `BatchLoader(shuffle=True, seed=seed, drop_last=True)`;
    with `shuffle=False`, every row in order, the last batch short, as
    `BatchLoader(batch_size)` (evaluation).
    """

    def __init__(
        self, data: TabularData, batch_size: int, seed: int, device: torch.device,
        shuffle: bool = True,
    ):  # fmt: skip
        if data.multi_hot:
            raise ValueError("ResidentBatches takes one id per row and feature")
        check_batch_size(batch_size)
        self.batch_size, self.seed, self.epoch, self.shuffle = batch_size, seed, 0, shuffle
        self.keys = data.schema.feature_names
        self._rows = len(data)
        self._dense, self._ids, self._labels = (
            torch.from_numpy(a).to(device) for a in (data.dense, data.categorical, data.labels)
        )
        self._ones = torch.ones(batch_size * len(self.keys), dtype=torch.int32, device=device)

    @staticmethod
    def fits(data: object, limit_bytes: int = 2 << 30) -> bool:
        """Whether `data` is an in-memory data set of single-valued features, small enough
        (`limit_bytes`) to hold on the device."""
        return isinstance(data, TabularData) and not data.multi_hot and (
            data.dense.nbytes + data.categorical.nbytes + data.labels.nbytes <= limit_bytes
        )  # fmt: skip

    def __len__(self) -> int:
        return batch_count(self._rows, self.batch_size, drop_last=self.shuffle)

    def __iter__(self) -> Iterator[Batch]:
        if self.shuffle:
            order = np.random.default_rng([self.seed, self.epoch]).permutation(self._rows)
            order = torch.from_numpy(order).to(self._ids.device)
            self.epoch += 1
        else:
            order = torch.arange(self._rows, device=self._ids.device)
        count = len(self.keys)
        for i in range(len(self)):
            rows = order[i * self.batch_size : (i + 1) * self.batch_size]
            size = rows.shape[0]
            sparse = KeyedJaggedTensor(
                keys=self.keys, values=self._ids.index_select(0, rows).T.flatten(),
                lengths=self._ones[: size * count], stride=size,
                length_per_key=[size] * count,
                offset_per_key=[size * k for k in range(count + 1)],
            )  # fmt: skip
            yield Batch(self._dense.index_select(0, rows), sparse,
                        self._labels.index_select(0, rows))  # fmt: skip


def warn_if_too_few_to_rank(valid: TabularData) -> None:
    """Say where the validation split has under `FEW_TO_RANK` rows of its rarer label."""
    labels = getattr(valid, "labels", None)  # streamed rows are not in memory
    if labels is None or not len(labels):
        return
    positives = int(np.count_nonzero(labels))
    rarer = min(positives, len(labels) - positives)
    if rarer < FEW_TO_RANK:
        logger.warning("the validation split holds %d rows, %d of its rarer label: NE on so "
                       "few moves with the rows drawn more than models differ; rank models on "
                       "a validation split with %d of each label at least (more rows, or a "
                       "larger validation fraction)", len(labels), rarer, FEW_TO_RANK)  # fmt: skip
