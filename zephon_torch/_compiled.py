"""The compiled loops (``zephon_torch._native``, from zephon_torch/_native.c), where they were
built: a batch's checked copy (``ops._copy.fill``), the shuffle's permutation
(``work._permutation``), the ``wrap`` block path's search in a token chunk
(``ops._wrap_blocks``) and the places of an MDS shard's token arrays (``io._mds_bulk``).

Built at install where a C compiler is found; without them, or with the environment variable
``ZEPHON_TORCH_NO_NATIVE=1`` set when zephon_torch is imported, numpy runs the same loops: the
same batches, slower (``benchmarks/pretokenized.py`` measures both).
"""

from __future__ import annotations

import os
from types import ModuleType


def _load() -> ModuleType | None:
    if os.environ.get("ZEPHON_TORCH_NO_NATIVE", "") not in ("", "0"):
        return None
    try:
        from zephon_torch import _native
    except ImportError:  # not built: numpy runs the loops
        return None
    return _native


native = _load()
NATIVE = native is not None  # whether the compiled loops run
