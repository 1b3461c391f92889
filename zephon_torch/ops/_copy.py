"""A batch's token ids copied into its int64 buffer (``fill``): compiled where it was built.

The compiled ``zephon_torch._copy`` (zephon_torch/_copy.c, built at install where a C compiler
is found) copies and checks the ids in one pass over the stored ones. Without it, or with the
environment variable ``ZEPHON_TORCH_NO_NATIVE=1`` set when zephon_torch is imported, numpy's
concatenate copies them and ``IdCheck`` reads the batch again: the same batches, each copy
about a third slower (``benchmarks/pretokenized.py`` measures both).
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from types import ModuleType
from typing import Any

import numpy as np
import numpy.typing as npt

NO_CHECK = (1 << 64) - 1  # ``top`` where the ids are not checked

_native: ModuleType | None
try:
    from zephon_torch import _copy as _native
except ImportError:  # not built: numpy copies
    _native = None
if os.environ.get("ZEPHON_TORCH_NO_NATIVE", "") not in ("", "0"):
    _native = None

NATIVE = _native is not None  # whether batches are copied by the compiled module


def fill(parts: Sequence[npt.NDArray[Any]], out: npt.NDArray[np.int64], top: int) -> bool:
    """Copy the 1-D integer arrays ``parts`` end to end into ``out`` (contiguous int64, as
    long as all of them), each id cast as numpy casts it to int64. Returns whether an id may
    exceed ``top`` read as unsigned 64-bit (negative ids do): False means none does; True, from
    the compiled copy, that one does, and from numpy's, which does not look, that the ids were
    not checked (unless ``top`` is ``NO_CHECK``)."""
    if _native is not None:
        try:
            return bool(_native.fill(parts, out, top))
        except TypeError:  # a part of byte-swapped (or not integer) values: numpy casts it
            pass
    np.concatenate(parts, out=out)
    return top != NO_CHECK
