"""A batch's token ids copied into its int64 buffer (``fill``): compiled where it was built.

The compiled ``fill`` (``zephon_torch._compiled``) copies and checks the ids in one pass over
the stored ones. Without it, numpy's concatenate copies them and ``IdCheck`` reads the batch
again: the same batches, each copy about a third slower.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, TypeAlias

import numpy as np
import numpy.typing as npt

from zephon_torch._compiled import native as _native

NO_CHECK = (1 << 64) - 1  # ``top`` where the ids are not checked

Part: TypeAlias = npt.NDArray[Any] | tuple[npt.NDArray[Any], int, int]
"""What ``fill`` copies: a 1-D integer array, or a span ``(base, first, stop)``, the ids
``base[first:stop]`` of a 1-D integer array without a view made of them (``io._views``'s
``TokenSpans``: a packer's block path takes whole documents so)."""


def fill(parts: Sequence[Part], out: npt.NDArray[np.int64], top: int) -> bool:
    """Copy the ``parts`` end to end into ``out`` (C-contiguous int64 of any shape, as long
    as all of them), each id cast as numpy casts it to int64. Returns whether an id may
    exceed ``top`` read as unsigned 64-bit (negative ids do): False means none does; True,
    from the compiled copy, that one does, and from numpy's, which does not look, that the
    ids were not checked (unless ``top`` is ``NO_CHECK``)."""
    if _native is not None:
        try:
            return bool(_native.fill(parts, out, top))
        except TypeError:  # a part of byte-swapped (or not integer) values: numpy casts it
            pass
    np.concatenate(as_arrays(parts), out=out.reshape(-1))  # a view: ``out`` is contiguous
    return top != NO_CHECK


def as_arrays(parts: Sequence[Part]) -> list[npt.NDArray[Any]]:
    """``parts`` as arrays: each span's view made."""
    return [part[0][part[1] : part[2]] if isinstance(part, tuple) else part for part in parts]


def part_dtype(part: Part) -> np.dtype[Any]:
    """The stored type of a part's ids (a span's is its base's: no view made)."""
    return part[0].dtype if isinstance(part, tuple) else part.dtype
