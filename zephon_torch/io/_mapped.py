"""Shard files mapped into memory, and the check that keeps a file cut short under its map from
killing the process.

A map reads the page cache in place (no copy, one copy per node). But if the file is truncated
in place while it is mapped, touching a page past its new end raises SIGBUS, which ends the
process without a message (a DataLoader worker "killed by signal"). So each read first checks,
with one fstat of the mapped file (about 1 us, per read call, not per row), that the file is
still as long as its map. A file replaced by a rename keeps its old pages and passes.

`.npy` files are mapped here too (`map_array`), their headers read by `read_header`.
"""

from __future__ import annotations

import mmap
import re
import struct
from typing import IO, Any, NamedTuple

import numpy as np
import numpy.typing as npt

from zephon_torch._literal import AST_LOCK
from zephon_torch.errors import DataError
from zephon_torch.io._rows import CHANGED_NOTE


def map_file(path: str) -> mmap.mmap | bytes:
    """`path` mapped read-only (empty bytes for an empty file, which mmap refuses)."""
    with open(path, "rb") as handle:
        if not handle.seek(0, 2):
            return b""
        return mmap.mmap(handle.fileno(), 0, access=mmap.ACCESS_READ)


class NpyHeader(NamedTuple):
    shape: tuple[int, ...]
    dtype: np.dtype[Any]
    fortran_order: bool


# The header numpy writes for an integer array: its dict's repr, keys sorted, space-padded.
_INTEGER_HEADER = re.compile(
    r"\{'descr': '([<>|=]?[iu][1248])', 'fortran_order': (False|True), "
    r"'shape': \((|\d+,|\d+(?:, \d+)+)\), \}[ ]*\n"
)


def read_header(handle: IO[bytes]) -> NpyHeader:
    """The shape, dtype and order a `.npy` header records, reading the header only; the
    handle is left at the first data byte.

    An integer header as numpy writes it is matched without `ast`; any other goes to numpy's
    own parser under `AST_LOCK` (see `zephon_torch._literal`).

    Raises:
        ValueError: when the bytes are not a `.npy` header.
    """
    start = handle.tell()
    version = np.lib.format.read_magic(handle)
    size = struct.Struct("<H" if version == (1, 0) else "<I")
    length = handle.read(size.size)
    text = handle.read(size.unpack(length)[0]) if len(length) == size.size else b""
    found = _INTEGER_HEADER.fullmatch(text.decode("latin1"))
    if found is not None:
        descr, fortran_order, dims = found.groups()
        shape = tuple(int(dim) for dim in dims.split(",") if dim)
        return NpyHeader(shape, np.dtype(descr), fortran_order == "True")
    handle.seek(start)
    with AST_LOCK:
        np.lib.format.read_magic(handle)
        if version == (1, 0):
            shape, fortran, dtype = np.lib.format.read_array_header_1_0(handle)
        else:
            shape, fortran, dtype = np.lib.format.read_array_header_2_0(handle)
    return NpyHeader(tuple(int(dim) for dim in shape), np.dtype(dtype), bool(fortran))


def map_array(path: str) -> npt.NDArray[Any]:
    """Maps a `.npy` file read-only as a plain ndarray (np.memmap's Python-level hooks on every
    slice cost more than small reads themselves), as `np.load(mmap_mode="r")` would.

    Raises:
        FileNotFoundError: when there is no file.
        ValueError: when it is not a `.npy` file of plain values, or is shorter than its header
            says.
    """
    with open(path, "rb") as handle:
        header = read_header(handle)
        offset = handle.tell()
    if header.dtype.hasobject:
        raise ValueError("holds Python objects, which cannot be memory-mapped")
    mapped = np.memmap(
        path,
        dtype=header.dtype,
        mode="r",
        shape=header.shape,
        order="F" if header.fortran_order else "C",
        offset=offset,
    )
    array: npt.NDArray[Any] = mapped.view(np.ndarray)
    return array


def check_whole(data: Any, *, dataset: str, shard: str) -> None:
    """Raise DataError when the file mapped under `data` (a map, a memoryview of one, or a
    numpy array viewing one) is now shorter than its map; bytes and other buffers pass.

    Raises:
        DataError: naming the shard, with the sizes.
    """
    mapped = data
    while mapped is not None and not isinstance(mapped, mmap.mmap):
        mapped = mapped.obj if isinstance(mapped, memoryview) else getattr(mapped, "base", None)
    if mapped is None or mapped.closed:
        return
    size = mapped.size()
    if size < len(mapped):
        raise DataError(
            f"the shard file was cut to {size} bytes while {len(mapped)} were mapped; reading "
            f"on would crash the process{CHANGED_NOTE}",
            dataset=dataset,
            shard=shard,
        )
