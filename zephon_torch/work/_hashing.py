"""Stable seeds: every random choice is keyed by names and counters, never by list positions.

A key is a 64-bit integer derived with BLAKE2b from the parts' text, so it is the same on every
platform, Python and numpy version. Inserting a dataset never reseeds the others.
"""

from __future__ import annotations

import hashlib

import numpy as np
import numpy.typing as npt

_M1 = np.uint64(0xBF58476D1CE4E5B9)
_M2 = np.uint64(0x94D049BB133111EB)


def stable_key(*parts: object) -> int:
    """A 64-bit key from the text of ``parts`` (ints and strs), identical everywhere."""
    text = "\x1f".join(f"{type(p).__name__}:{p}" for p in parts)
    return int.from_bytes(hashlib.blake2b(text.encode(), digest_size=8).digest(), "little")


_S30, _S27, _S31 = np.uint64(30), np.uint64(27), np.uint64(31)


def mix64_inplace(x: npt.NDArray[np.uint64]) -> None:
    """SplitMix64's finaliser over an array of 64-bit words, in place: a bijective scramble
    (integer arrays wrap silently on overflow)."""
    x ^= x >> _S30
    x *= _M1
    x ^= x >> _S27
    x *= _M2
    x ^= x >> _S31
