"""Stable seeds: every random choice is keyed by names and counters, never by list positions.

A key is a 64-bit integer derived with BLAKE2b from the parts' text, so it is the same on every
platform, Python and numpy version. Inserting a dataset never reseeds the others.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable
from typing import Any

import numpy as np
import numpy.typing as npt

_M1 = np.uint64(0xBF58476D1CE4E5B9)
_M2 = np.uint64(0x94D049BB133111EB)


def stable_key(*parts: object) -> int:
    """A 64-bit key from the text of ``parts`` (ints and strs), identical everywhere."""
    text = "\x1f".join(f"{type(p).__name__}:{p}" for p in parts)
    return int.from_bytes(hashlib.blake2b(text.encode(), digest_size=8).digest(), "little")


def stable_keys(parts: tuple[object, ...], counters: Iterable[int]) -> npt.NDArray[np.uint64]:
    """``stable_key(*parts, c)`` for each (plain int) ``c`` in ``counters``, as an array: the
    text of ``parts`` is hashed once, and a copy of that hash fed each counter."""
    text = "".join(f"{type(p).__name__}:{p}\x1f" for p in parts)  # as stable_key joins them
    head = hashlib.blake2b(f"{text}int:".encode(), digest_size=8)
    return _words(b"".join(_digests(head, [b"%d" % c for c in counters])))


def stable_key_grid(keys: Iterable[int], count: int) -> npt.NDArray[np.uint64]:
    """``stable_key(k, c)`` for each (plain int) ``k`` in ``keys`` (rows) and each ``c`` in
    ``range(count)`` (columns): about 0.5 us a key on a 2-core VM, where a call took 2."""
    tails = [b"%d" % c for c in range(count)]
    blake2b = hashlib.blake2b
    digests = b"".join(
        digest
        for k in keys
        for digest in _digests(blake2b(b"int:%d\x1fint:" % k, digest_size=8), tails)
    )
    return _words(digests).reshape(-1, count)


def _digests(head: Any, tails: list[bytes]) -> list[bytes]:
    """The digests of ``head``'s text followed by each of ``tails``."""
    out = []
    for tail in tails:
        whole = head.copy()
        whole.update(tail)
        out.append(whole.digest())
    return out


def _words(digests: bytes) -> npt.NDArray[np.uint64]:
    """8-byte digests as the integers ``int.from_bytes(digest, "little")`` reads."""
    return np.frombuffer(digests, dtype="<u8").astype(np.uint64)


_S30, _S27, _S31 = np.uint64(30), np.uint64(27), np.uint64(31)


def mix64_inplace(x: npt.NDArray[np.uint64]) -> None:
    """SplitMix64's finaliser over an array of 64-bit words, in place: a bijective scramble
    (integer arrays wrap silently on overflow)."""
    x ^= x >> _S30
    x *= _M1
    x ^= x >> _S27
    x *= _M2
    x ^= x >> _S31
