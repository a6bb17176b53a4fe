"""Dense-column transforms as training and serving apply them.

A transform per dense column, fitted on the training split only (`trainers.data.preprocess`):
`log1p` for count-like columns (as Criteo models do), then standardization with the
training mean and standard deviation, then clipping to +-`CLIP` (a transform whose
`clip` is null keeps every value: the Criteo reader's convention); a missing value (NaN)
becomes the training mean (0 after standardization). The same function runs in
training and in the exported model (the export copies this file into `ranknas_model.py`),
so a served raw row is transformed exactly as the model's training rows were.

Categorical values become ids here too, for the same reason: id 0 is a missing value, 1 a
value out of vocabulary (unseen in training, or rarer there than the column's min-count),
2.. the training vocabulary by decreasing frequency; a hashed column puts a value in
bucket 1 + (a fixed 64-bit BLAKE2b hash of its text) mod (buckets - 1), the same in every
process (Python's `hash()` of a string is salted per process). A multi-valued cell (a list
of values, or a text with a separator) becomes the ids of its items; an empty one, [0].
"""

from __future__ import annotations

import hashlib
import numbers
import re
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import torch

CLIP = 5.0  # standard deviations: a stray 1e9 cannot dominate a batch


def transform_dense(dense: torch.Tensor, transforms: Sequence[Mapping[str, Any]]) -> torch.Tensor:
    """`[B, D]` raw dense values -> the model's inputs; `transforms[k]` is column k's
    (`log1p`, `mean`, `std`, and `clip`: +-`CLIP` where absent, none where null); an empty
    sequence leaves the values as they are."""
    if not transforms:
        return dense
    if dense.shape[1] != len(transforms):
        raise ValueError(f"expected {len(transforms)} dense columns, got {dense.shape[1]}")
    columns = []
    for k, t in enumerate(transforms):
        x = dense[:, k].double()
        if t["log1p"]:
            x = torch.log1p(torch.clamp(x, min=0))
        standardized = (x - t["mean"]) / t["std"]
        clip = t.get("clip", CLIP)
        if clip is not None:
            standardized = torch.clamp(standardized, -clip, clip)
        columns.append(torch.nan_to_num(standardized, nan=0.0))
    return torch.stack(columns, dim=1).to(dense.dtype)


# How exports write a missing number (pandas, R, SQL, spreadsheets), in any case: in a
# dense column these are missing values; in a categorical one "NA" may well be Namibia.
MISSING_NUMBERS = ("", "na", "n/a", "nan", "null", "none", "#n/a", "<na>")


def dense_value(value: Any) -> float:
    """A raw dense value as a float: NaN where missing (None, NaN or a `MISSING_NUMBERS`
    text), which `transform_dense` fills as training did; ValueError for other texts."""
    if value is None or _is_null(value):
        return float("nan")
    if isinstance(value, str) and value.strip().lower() in MISSING_NUMBERS:
        return float("nan")
    if is_flag(value):  # float(True) is 1.0: a flag is no measure
        raise ValueError(f"{value!r} is a boolean, not a number")
    return float(value)


def is_flag(value: Any) -> bool:
    """True or False, Python's or numpy's (whose `bool` is no subclass of Python's)."""
    return isinstance(value, bool) or type(value).__name__ in ("bool", "bool_")


MISSING_ID = 0
OOV_ID = 1
FIRST_ID = 2  # the training vocabulary's first value


def is_missing(value: Any) -> bool:
    """None, NaN (pandas' NaT and NA too) or a blank text."""
    return value is None or _is_null(value) or str(value).strip() == ""


def _is_null(value: Any) -> bool:
    """NaN and NaT, unequal to themselves, and pandas' NA, whose comparisons are NA, which
    has no truth value (nullable columns: `read_csv(dtype_backend=...)`, `convert_dtypes`)."""
    try:
        return bool(value != value)
    except TypeError:
        return type(value).__name__ == "NAType"


def hash_bucket(text: str, buckets: int) -> int:
    """The id of a value of a hashed column: 1 + a fixed hash of its text mod (buckets - 1)."""
    digest = hashlib.blake2b(text.encode("utf-8"), digest_size=8).digest()
    return 1 + int.from_bytes(digest, "little") % (buckets - 1)


def encode_value(
    value: Any,
    index: Mapping[str, int] | None = None,
    buckets: int | None = None,
    whole_numbers: str | None = None,
) -> int:
    """A raw categorical value's id: through `index` (text -> id; other texts: OOV_ID) or
    hashed into `buckets` (a whole number written as the training file wrote them,
    `whole_numbers`: see `as_written`); missing: MISSING_ID."""
    if is_missing(value):
        return MISSING_ID
    text = str(value).strip()
    if buckets is not None:
        return hash_bucket(as_written(text, whole_numbers), buckets)
    if index is None:
        return OOV_ID
    found = index.get(text)
    if found is None and not isinstance(value, bool):
        # a number, or a text of one written as a float ("425.0": a column of ids with
        # blanks, read by pandas and written back), may have lost its id's leading zeros
        padded = isinstance(value, numbers.Number) or bool(WHOLE_FLOAT.fullmatch(text))
        found = next((index[t] for t in _number_texts(text, padded) if t in index), None)
    return OOV_ID if found is None else found


INTEGER = re.compile(r"-?\d+")
WHOLE_FLOAT = re.compile(r"-?\d+\.0+")
EXACT = 2**53  # whole numbers beyond it lose digits as floats: left as given


def as_written(text: str, whole_numbers: str | None) -> str:
    """A whole number's text as the training file wrote its whole numbers (`number_form`):
    "int" (118: a CSV) or "float" (118.0: a Parquet column of floats, as an integer
    column with blanks is); other texts, and any where the training file wrote both ways
    or neither, as given. A hashed value is its text's hash: pandas reads a CSV column of
    ids with blanks as floats, and 118.0 then hashed to another bucket than the file's 118."""
    whole = INTEGER.fullmatch(text) or WHOLE_FLOAT.fullmatch(text)
    if not whole or whole_numbers is None or abs(int(text.split(".")[0])) >= EXACT:
        return text
    return text.split(".")[0] if whole_numbers == "int" else str(float(text))


def number_forms(texts: Iterable[str]) -> set[str]:
    """The ways `texts` write whole numbers: "int" (118), "float" (118.0, as Python and
    pandas write a float) and "other" (118.00, which `as_written` could not rebuild)."""
    forms = set()
    for text in texts:
        if INTEGER.fullmatch(text):
            forms.add("int")
        elif WHOLE_FLOAT.fullmatch(text):
            forms.add("float" if text == str(float(text)) else "other")
    return forms


def number_form(forms: set[str]) -> str | None:
    """A hashed column's way of writing whole numbers (`number_forms` of its training
    values), where it is one: "int" or "float"; else None (served values hashed as given)."""
    return next(iter(forms)) if len(forms) == 1 and forms <= {"int", "float"} else None


HEX_ID = re.compile(r"[0-9a-fA-F]{1,8}")


def hex_id(value: Any) -> int | None:
    """A Criteo id's value: 1 to 8 hex digits in either case, as its reader takes them (also
    the number pandas makes of an all-digit one: 00015445 read as 15445, or 15445.0); None
    where missing. ValueError otherwise (78e03281 read by pandas is inf): the vocabulary
    holds each as 8 lowercase digits, and the text as given was out of vocabulary."""
    if is_missing(value):
        return None
    text = str(value).strip()
    if WHOLE_FLOAT.fullmatch(text):
        text = text.split(".")[0]
    if not HEX_ID.fullmatch(text):
        raise ValueError(f"{value!r} is not a hex id (1 to 8 hex digits); read a Criteo file's "
                         "ids as text (pandas: dtype=str)")  # fmt: skip
    return int(text, 16)


def encode_hex(value: Any, index: Mapping[str, int], buckets: int | None) -> int:
    """A Criteo id's model id, as its reader and the study made it: its value hashed into
    `buckets` (1 + value mod (buckets - 1)), or its 8-digit text through `index`."""
    number = hex_id(value)
    if number is None:
        return MISSING_ID
    if buckets is not None:
        return 1 + number % (buckets - 1)
    return index.get(f"{number:08x}", OOV_ID)


MAX_PADDED_DIGITS = 20  # the widest id a number is zero-padded to


def _number_texts(text: str, padded: bool = False) -> list[str]:
    """Other texts of the same number (none for a text that is not one): a served 3 is
    the training file's "3.0" (whole numbers written as floats), and 3.0 its "3"; with
    `padded` (a value served as a number), also "03", "003", ...: a zip code "00425" that
    pandas read as 425."""
    try:
        number = float(text)
    except ValueError:
        return []
    if not number.is_integer():
        return [repr(number)]
    whole = str(int(number))
    # narrowest first: where a vocabulary holds "07" and "007", a served 7 is the first
    zeros = [whole.zfill(width) for width in range(len(whole) + 1, MAX_PADDED_DIGITS + 1)]
    return [whole, f"{whole}.0", *(zeros if padded and number >= 0 else [])]


def vocabulary_index(values: Sequence[str]) -> dict[str, int]:
    """A training vocabulary (most frequent first) as text -> id."""
    return {v: i + FIRST_ID for i, v in enumerate(values)}


def split_cell(cell: Any, separator: str | None) -> list[str]:
    """The items of a multi-valued cell as stripped texts: a list (or tuple, or array) as
    it is, less its null elements (as Spark and pandas write them), a text split at
    `separator`; a missing cell or an empty list has none. Raises ValueError for an empty
    item ("a||b", a blank text in a list) or an item that is a list."""
    if isinstance(cell, str):
        text = cell.strip()
        items = (text.split(separator) if separator else [text]) if text else []
    elif cell is None or (isinstance(cell, float) and cell != cell):
        return []
    else:
        items = cell.tolist() if hasattr(cell, "tolist") else cell  # numpy: pyarrow's lists
        items = items if isinstance(items, list | tuple) else [items]
        # a null element is no item; a blank text stays an empty item, as "a|" is in CSV
        items = [i for i in items if i is not None and not (isinstance(i, float) and i != i)]
    texts = []
    for item in items:
        if isinstance(item, list | tuple | dict):
            raise ValueError(f"an item that is a {type(item).__name__}, not a value")
        if is_missing(item):
            raise ValueError("an empty item" + (f" (separator {separator!r})" if separator else ""))
        texts.append(str(item).strip())
    return texts
