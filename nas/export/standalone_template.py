"""Helpers that `nas.export` copies verbatim into every exported `ranknas_model.py`.

This module must import only the standard library, torch and safetensors: the exported
file has to run where neither ranknas nor torchrec is installed (torchrec's wheel pulls a
CUDA build of fbgemm-gpu that does not load on a CPU machine). Its docstring and its imports are
not copied (the export merges the imports of everything it copies into one block).
"""

from __future__ import annotations

import functools
import json
from collections.abc import Sequence
from pathlib import Path

import torch
from safetensors.torch import load_file
from torch import nn

from search_space.names import table_name
from search_space.preprocessing import (
    dense_value,
    encode_hex,
    encode_value,
    is_flag,
    split_cell,
    transform_dense,
    vocabulary_index,
)

# a feature's ids: `[B]` (one per row), or `(values, offsets)` (a list per row)
Ids = torch.Tensor | tuple[torch.Tensor, torch.Tensor]


class EmbeddingBags(nn.Module):
    """The model's embedding tables, one table `t_<feature>` (`table_name`) per feature
    pooled by the feature's pooling (sum or mean), with the state-dict layout of torchrec's
    `EmbeddingBagCollection` (`embedding_bags.<table>.weight`) so that ranknas's weights
    load as they are; plain `nn.EmbeddingBag`s, not torchrec."""

    def __init__(
        self,
        features: Sequence[str],
        num_embeddings: Sequence[int],
        dims: Sequence[int],
        poolings: Sequence[str],
    ) -> None:
        super().__init__()
        self.features = list(features)
        self.embedding_bags = nn.ModuleDict(
            {
                table_name(f): nn.EmbeddingBag(rows, dim, mode=pooling)
                for f, rows, dim, pooling in zip(
                    features, num_embeddings, dims, poolings, strict=True
                )
            }
        )

    def forward(self, ids: torch.Tensor | Sequence[Ids]) -> dict[str, torch.Tensor]:
        """feature -> `[B, dim]` from the id matrix `[B, F]` (column i: ids of
        `features[i]`), or from one entry per feature: its ids `[B]`, or for a multi-valued
        feature a `(values, offsets)` tuple, row i's ids being values[offsets[i]:offsets[i +
        1]] (B + 1 offsets, as `encode_ids` gives)."""
        if isinstance(ids, tuple | list):
            return self._per_feature(ids)
        ids = torch.as_tensor(ids, dtype=torch.long)
        if ids.dim() != 2 or ids.shape[1] != len(self.features):
            raise ValueError(
                f"expected ids of shape [B, {len(self.features)}], got {list(ids.shape)}"
            )
        for i, f in enumerate(self.features):
            self._check_range(f, ids[:, i])
        bags = self.embedding_bags
        return {f: bags[table_name(f)](ids[:, i : i + 1]) for i, f in enumerate(self.features)}

    def _check_range(self, feature: str, ids: torch.Tensor) -> None:
        """A clear error for an id outside the feature's table (torch's names no feature)."""
        rows = self.embedding_bags[table_name(feature)].num_embeddings
        if len(ids) and (int(ids.min()) < 0 or int(ids.max()) >= rows):  # two reductions
            first = int(((ids < 0) | (ids >= rows)).nonzero()[0, 0])
            raise ValueError(
                f"feature {feature!r}: id {int(ids[first])} (at {first}) is outside its table, "
                f"ids 0..{rows - 1}: give ids in that range, or for a feature with a "
                "vocabulary or hashing, encode its raw values with encode_ids as in training"
            )

    def _per_feature(self, entries: Sequence[Ids]) -> dict[str, torch.Tensor]:
        if len(entries) != len(self.features):
            raise ValueError(f"expected {len(self.features)} id entries, got {len(entries)}")
        pooled = {}
        for f, entry in zip(self.features, entries, strict=True):
            bag = self.embedding_bags[table_name(f)]
            if isinstance(entry, tuple):
                values, offsets = (torch.as_tensor(t, dtype=torch.long) for t in entry)
                self._check_range(f, values)
                pooled[f] = bag(values, offsets[:-1])
            else:
                ids = torch.as_tensor(entry, dtype=torch.long).view(-1)
                self._check_range(f, ids)
                pooled[f] = bag(ids.view(-1, 1))
        return pooled


def load_weights(model: nn.Module, path: str | Path, device: str = "cpu") -> nn.Module:
    """Load a safetensors state dict into `model` (every key must match) and set eval mode."""
    model.load_state_dict(load_file(str(path)))
    return model.to(device).eval()


def prepare_dense(
    dense: torch.Tensor | Sequence[Sequence[object]], directory: str | Path = "."
) -> torch.Tensor:
    """Raw dense values `[B, len(DENSE_COLUMNS)]` -> the model's dense input: the transforms
    fitted on the training data (`preprocessing.json` in `directory`; none: as they are).
    Rows as a file gives them may hold texts: "3.5" is 3.5, a blank, "N/A", "null" or None
    is missing, as in training."""
    transforms = _preprocessing(directory).get("dense", [])
    values = _dense_tensor(dense)
    if values.numel() == 0 and values.dim() < 2:  # no rows: `[]` reads as shape [0]
        values = values.reshape(0, len(globals().get("DENSE_COLUMNS", transforms)))
    if values.isinf().any():  # inf, or beyond float32's range
        raise ValueError(f"dense value in {_first_cell(values.isinf())} is not a finite number "
                         "within float32's range (3.4e38); give one")  # fmt: skip
    if not transforms and values.isnan().any():  # nothing fitted to fill a missing value
        raise ValueError(
            f"dense value missing (NaN) in {_first_cell(values.isnan())}: this model's training "
            "data had no missing dense values, so nothing was fitted to fill one; give a number"
        )
    return transform_dense(values, transforms)


def _first_cell(bad: torch.Tensor) -> str:
    """The first True cell of `bad` `[B, F]` by row and column (named where this file has
    DENSE_COLUMNS, as an exported module does), and how many more there are."""
    cells = bad.nonzero().tolist()
    return _cell(*cells[0], len(cells) - 1)


def _cell(row: int, column: int, more: int) -> str:
    names = globals().get("DENSE_COLUMNS", ())
    name = f" ({names[column]})" if column < len(names) else ""
    return f"row {row}, column {column}{name}" + (f" (and {more} more such cells)" if more else "")


def _dense_tensor(dense: torch.Tensor | Sequence[Sequence[object]]) -> torch.Tensor:
    if str(getattr(dense, "dtype", "")) in ("bool", "torch.bool"):  # flags: no measure
        raise ValueError("dense values are booleans (a bool array): give numbers")
    if isinstance(dense, torch.Tensor):
        return dense.to(torch.float32)
    try:
        if _holds_flags(dense):  # as_tensor reads True as 1.0: cell by cell, refused there
            raise TypeError
        values = torch.as_tensor(dense, dtype=torch.float32)
    except (TypeError, ValueError, RuntimeError):  # texts or None among the numbers
        pass
    else:  # a blank first cell reads as an empty list: [B, F, 0]; parse those cell by cell
        if values.dim() <= 2:
            return values
    rows, bad = [], []
    for row, cells in enumerate(dense):
        values = []
        for column, value in enumerate(cells):
            try:
                values.append(dense_value(value))
            except (TypeError, ValueError):
                bad.append((row, column, value))
                values.append(0.0)
        rows.append(values)
    if bad:
        row, column, value = bad[0]
        raise ValueError(
            f"dense value {value!r} in {_cell(row, column, len(bad) - 1)} is not a number; "
            "give a number (blank, N/A or None for a missing one)"
        )
    return torch.tensor(rows, dtype=torch.float32)


def _holds_flags(dense: Sequence[Sequence[object]]) -> bool:
    """Whether a boolean (Python's or numpy's) stands among the rows' cells; an array's
    cells are its dtype's."""
    if hasattr(dense, "dtype"):
        return False
    rows = (cells for cells in dense if isinstance(cells, Sequence) and not isinstance(cells, str))
    return any(is_flag(value) for cells in rows for value in cells)


def encode_ids(
    columns: Sequence[Sequence[object]], features: Sequence[str], directory: str | Path = "."
) -> torch.Tensor | list[Ids]:
    """Raw categorical values, one sequence per feature (in `features` order) -> the id
    matrix `[B, F]`, or where a feature is multi-valued (its cells lists of values, or texts
    split at its separator) one entry per feature: ids `[B]`, or `(values, offsets)` for
    the multi-valued ones (an empty cell: [0]). A feature with a training vocabulary maps
    its values through it (id 0: missing, 1: out of vocabulary), a hashed one hashes them
    into its buckets, as in training; the others must already be ids."""
    fitted = _preprocessing(directory)
    vocabularies, hashing = fitted.get("vocabulary", {}), fitted.get("hashing", {})
    written = fitted.get("whole_numbers", {})  # how a hashed column's file wrote 118
    hex_ids = fitted.get("hex_ids", {})  # a Criteo file's: column -> its buckets, or None
    multi_valued = fitted.get("multi_valued", {})
    encoded: list[Ids] = []
    for feature, values in zip(features, columns, strict=True):
        if feature in hex_ids:
            index = fitted["index"].get(feature, {})
            ids = []
            for row, value in enumerate(values):
                try:
                    ids.append(encode_hex(value, index, hex_ids[feature]))
                except ValueError as exc:
                    raise ValueError(f"feature {feature!r}, row {row}: {exc}") from None
            encoded.append(torch.as_tensor(ids, dtype=torch.long))
            continue
        known, buckets, form = vocabularies.get(feature), hashing.get(feature), written.get(feature)
        if known is None and buckets is None:
            encoded.append(torch.as_tensor(_given_ids(feature, values), dtype=torch.long))
            continue
        index = fitted["index"].get(feature, {})
        if feature not in multi_valued:
            for row, value in enumerate(values):
                if several_values(value):  # else scored as one unseen value
                    raise ValueError(f"feature {feature!r}, row {row}: {value!r} is a "
                                     "collection, not one value; this feature takes one value a "
                                     "row")  # fmt: skip
            ids = [encode_value(v, index, buckets, form) for v in values]
            encoded.append(torch.as_tensor(ids, dtype=torch.long))
            continue
        separator, items, offsets = multi_valued[feature]["separator"], [], [0]
        for row, cell in enumerate(values):
            try:
                texts = split_cell(cell, separator)
            except ValueError as exc:
                raise ValueError(f"feature {feature!r}, row {row}: {exc}") from None
            items.extend(encode_value(t, index, buckets, form) for t in texts or [None])
            offsets.append(len(items))
        encoded.append((torch.as_tensor(items, dtype=torch.long), torch.as_tensor(offsets)))
    if multi_valued:
        return encoded
    return torch.stack(encoded, dim=1)  # type: ignore[arg-type]


def _given_ids(feature: str, values: Sequence[object]) -> list[int]:
    """A feature trained on ids (no vocabulary, no hashing): its values as they are."""
    ids = []
    for row, value in enumerate(values):
        number = whole_number(value)
        if number is None:
            raise ValueError(
                f"feature {feature!r}, row {row}: {value!r} is not an id; this model was "
                "trained on this feature's integer ids (no vocabulary), so give those"
            )
        ids.append(number)
    return ids


def several_values(value: object) -> bool:
    """Whether `value` is a list, tuple, set, mapping or array rather than one value."""
    return isinstance(value, list | tuple | set | dict) or getattr(value, "ndim", 0) > 0


def whole_number(value: object) -> int | None:
    """`value` as a whole number (an int, a whole float, or a text of one: 3, 3.0 and "3"
    are id 3); None otherwise (3.5, True, "shop-3", None)."""
    if isinstance(value, bool):
        return None
    try:
        number = float(value)  # type: ignore[arg-type]
    except (TypeError, ValueError):
        return None
    return int(number) if number.is_integer() else None


def _preprocessing(directory: str | Path) -> dict:
    """The fitted preprocessing, with each vocabulary's index under "index": read and built
    once per version of the file (a served model calls this on every request)."""
    path = Path(directory) / "preprocessing.json"
    return _read_preprocessing(str(path), path.stat().st_mtime_ns) if path.exists() else {}


@functools.lru_cache(maxsize=8)
def _read_preprocessing(path: str, version: int) -> dict:
    fitted = json.loads(Path(path).read_text())
    vocabularies = fitted.get("vocabulary", {})
    return fitted | {"index": {f: vocabulary_index(v) for f, v in vocabularies.items()}}
