"""Mapping raw categorical values to embedding ids.

Both the Criteo and the tabular readers use the same id layout:

- frequency mapping: id 0 = missing, id 1 = rare (seen fewer than `min_count` times), then
  ids 2, 3, ... in order of decreasing frequency (ties by raw value); the cardinality is
  2 + the number of values kept;
- hashing: id 0 = missing, other values go to 1 + hash % (hash_size - 1); the cardinality
  is `hash_size`.
"""

from __future__ import annotations

import numpy as np

from search_space.preprocessing import MISSING_ID, OOV_ID

RARE_ID = OOV_ID  # a value seen fewer than min_count times: out of vocabulary


def frequency_ids(codes: np.ndarray, min_count: int) -> tuple[np.ndarray, int]:
    """Ids by frequency for integer `codes` (negative = missing); returns (ids, cardinality).

    Codes are any integers identifying the raw values (hex values, factorized codes);
    ties in frequency are broken by smaller code first, so the result is deterministic.
    """
    present = codes >= 0
    _, inverse, counts = np.unique(codes[present], return_inverse=True, return_counts=True)
    order = np.argsort(-counts, kind="stable")
    rank = np.empty_like(order)
    rank[order] = np.arange(order.size)
    kept = counts >= min_count
    new_ids = np.where(kept, rank + 2, RARE_ID)
    ids = np.full(codes.shape, MISSING_ID, dtype=np.int64)
    ids[present] = new_ids[inverse]
    return ids, int(kept.sum()) + 2


def hashed_ids(hashes: np.ndarray, missing: np.ndarray, hash_size: int) -> np.ndarray:
    """Ids from unsigned/non-negative `hashes`: 0 where `missing`, else 1 + hash % (size - 1)."""
    buckets = (hashes.astype(np.uint64) % np.uint64(hash_size - 1)).astype(np.int64) + 1
    return np.where(missing, MISSING_ID, buckets)
