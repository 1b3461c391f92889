"""A keyed pseudo-random permutation of ``range(n)`` evaluated point-wise, never materialised.

A balanced Feistel network over the smallest even bit width covering ``n``, with cycle walking
for indices that land outside ``[0, n)``. Being a bijection on the covering domain, walking
always returns inside ``range(n)`` and the map stays a bijection of ``range(n)``. The domain is
at most 4n, so walks are short (under 4 steps on average). Cost: O(1) memory, a few vectorised
numpy passes per query batch, whatever ``n`` is. ``permute_runs`` evaluates many permutations
(the shuffle windows of tiny shards) in the same numpy passes, each entry by its own ``n`` and
key: the same results as a ``permute`` call a run, which cost about 100 us a window.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from functools import lru_cache

import numpy as np
import numpy.typing as npt

from zephon_torch._compiled import native as _native
from zephon_torch.work._hashing import mix64_inplace, stable_key, stable_key_grid

_ROUNDS = 4
_POWERS = np.left_shift(1, np.arange(63, dtype=np.int64))  # bit_length(m): powers <= m


def permute(index: npt.ArrayLike, n: int, key: int) -> npt.NDArray[np.int64]:
    """Map each position in ``index`` (all in ``[0, n)``) through the permutation ``key``."""
    idx = np.atleast_1d(np.asarray(index, dtype=np.uint64))  # rounds run in place: arrays
    if n <= 1:
        return idx.astype(np.int64)
    params = np.array([_params(n, _round_keys(key))], dtype=np.uint64).T  # one column: scalars
    return _walk(idx, params)


def permute_runs(
    index: npt.ArrayLike,
    lengths: npt.NDArray[np.int64] | Sequence[int],
    sizes: npt.ArrayLike,
    keys: Iterable[int],
) -> npt.NDArray[np.int64]:
    """``permute`` of consecutive runs of ``index``: run j, the next ``lengths[j]`` entries, maps
    through ``permute(_, sizes[j], keys[j])``; each run's entries lie in ``[0, sizes[j])`` and
    each key is a plain int (its text is hashed for the round keys)."""
    idx = np.atleast_1d(np.asarray(index, dtype=np.uint64))
    # a run of one row maps 0 to 0 by walking too: 0 is all of [0, 1) on its cycle
    n = np.maximum(np.asarray(sizes, dtype=np.int64), 1)
    half_bits = np.maximum(1, (np.searchsorted(_POWERS, n - 1, side="right") + 1) // 2)
    mask = np.left_shift(1, half_bits) - 1
    round_keys = stable_key_grid(keys, _ROUNDS)
    params = np.vstack([np.array([n, half_bits, mask], dtype=np.uint64), round_keys.T])
    return _walk(idx, np.repeat(params, lengths, axis=1))


def _params(n: int, round_keys: Sequence[int]) -> list[int]:
    """A permutation's parameters: ``n``, the half width's shift and mask, the round keys."""
    half_bits = max(1, ((n - 1).bit_length() + 1) // 2)
    return [n, half_bits, (1 << half_bits) - 1, *round_keys]


def _walk(idx: npt.NDArray[np.uint64], params: npt.NDArray[np.uint64]) -> npt.NDArray[np.int64]:
    """Encrypt ``idx`` until each entry is inside its range; ``params`` has one column (shared
    by every entry) or one per entry, rows as ``_params`` gives them. Compiled where it was
    built (``zephon_torch._compiled``): numpy takes a dozen calls a round, and the longest
    walk of a few hundred entries is about ten rounds."""
    if _native is not None:
        out = np.array(idx, dtype=np.uint64)  # a copy, walked in place
        _native.walk(out, np.ascontiguousarray(params, dtype=np.uint64))
        return out.view(np.int64)  # each below its n, itself below 2**63: the same numbers
    out = _encrypt(idx, params)
    todo = np.flatnonzero(out >= params[0])
    shared = params.shape[1] == 1
    while len(todo):  # each entry walks on its own: the same steps, whatever walks beside it
        own = params if shared else params[:, todo]
        step = _encrypt(out[todo], own)
        out[todo] = step
        todo = todo[step >= own[0]]
    return out.astype(np.int64)


def _encrypt(x: npt.NDArray[np.uint64], params: npt.NDArray[np.uint64]) -> npt.NDArray[np.uint64]:
    shift, mask = params[1], params[2]
    left: npt.NDArray[np.uint64] = x >> shift
    right: npt.NDArray[np.uint64] = x & mask
    for k in params[3:]:
        scrambled: npt.NDArray[np.uint64] = right ^ k
        mix64_inplace(scrambled)
        scrambled &= mask
        scrambled ^= left
        left, right = right, scrambled
    left <<= shift
    left |= right
    return left


@lru_cache(maxsize=1024)
def _round_keys(key: int) -> tuple[int, ...]:
    return tuple(stable_key(key, r) for r in range(_ROUNDS))
