"""A keyed pseudo-random permutation of ``range(n)`` evaluated point-wise, never materialised.

A balanced Feistel network over the smallest even bit width covering ``n``, with cycle walking
for indices that land outside ``[0, n)``. Being a bijection on the covering domain, walking
always returns inside ``range(n)`` and the map stays a bijection of ``range(n)``. The domain is
at most 4n, so walks are short (under 4 steps on average). Cost: O(1) memory, a few vectorised
numpy passes per query batch, whatever ``n`` is.
"""

from __future__ import annotations

from functools import lru_cache

import numpy as np
import numpy.typing as npt

from zephon_torch.work._hashing import mix64_inplace, stable_key

_ROUNDS = 4


def permute(index: npt.ArrayLike, n: int, key: int) -> npt.NDArray[np.int64]:
    """Map each position in ``index`` (all in ``[0, n)``) through the permutation ``key``."""
    idx = np.atleast_1d(np.asarray(index, dtype=np.uint64))  # rounds run in place: arrays
    if n <= 1:
        return idx.astype(np.int64)
    half_bits = max(1, ((n - 1).bit_length() + 1) // 2)
    mask = np.uint64((1 << half_bits) - 1)
    shift = np.uint64(half_bits)
    round_keys = _round_keys(key)

    def encrypt(x: npt.NDArray[np.uint64]) -> npt.NDArray[np.uint64]:
        left: npt.NDArray[np.uint64] = x >> shift
        right: npt.NDArray[np.uint64] = x & mask
        for k in round_keys:
            scrambled: npt.NDArray[np.uint64] = right ^ k
            mix64_inplace(scrambled)
            scrambled &= mask
            scrambled ^= left
            left, right = right, scrambled
        left <<= shift
        left |= right
        return left

    out = encrypt(idx)
    outside = out >= np.uint64(n)
    while outside.any():
        out[outside] = encrypt(out[outside])
        outside = out >= np.uint64(n)
    return out.astype(np.int64)


@lru_cache(maxsize=1024)
def _round_keys(key: int) -> tuple[np.uint64, ...]:
    return tuple(np.uint64(stable_key(key, r)) for r in range(_ROUNDS))
