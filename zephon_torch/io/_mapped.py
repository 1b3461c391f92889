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

import math
import mmap
import os
import re
import struct
from typing import IO, Any, NamedTuple

import numpy as np
import numpy.typing as npt

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


MAX_HEADER_BYTES = 10_000  # numpy's own limit (`max_header_size`)
_MAX_DIM = 2**63 - 1  # the most a dimension can be (numpy's intp)
# One entry of a `.npy` header's dict, with its comma: a key, then a plain dtype string, a bool
# or a tuple of ints (Python 2 wrote longs, `3L`). A structured dtype's list is not taken.
_HEADER_ENTRY = re.compile(
    r"\s*'(?P<key>\w+)'\s*:\s*(?:"
    r"'(?P<descr>[<>|=]?[A-Za-z]\d*(?:\[\w+\])?)'"
    r"|(?P<flag>True|False)"
    r"|\((?P<dims>\s*|\s*\d+L?\s*,(?:\s*\d+L?\s*,)*(?:\s*\d+L?)?\s*)\)"
    r")\s*(?:,|(?=\}))"
)
_HEADER_GROUPS = {"descr": "descr", "fortran_order": "flag", "shape": "dims"}


def read_header(handle: IO[bytes]) -> NpyHeader:
    """The shape, dtype and order a `.npy` header records, reading the header only; the
    handle is left at the first data byte.

    Read with a regex, not numpy's parser: that one calls `ast.literal_eval`, and CPython 3.11
    keeps the AST builder's recursion count per interpreter, so a thread parsing while another
    does (any `ast` user: the traceback module placing its carets, torch.compile) can fail
    either with "SystemError: AST constructor recursion depth mismatch" (CPython issue
    gh-106905; reproduced here on 3.11.7, not on 3.10, 3.12 or 3.13). Headers of plain dtypes,
    as numpy and other writers lay them out, are taken; a structured dtype is refused.

    Raises:
        ValueError: when the bytes are not such a `.npy` header.
    """
    version = np.lib.format.read_magic(handle)
    if version not in ((1, 0), (2, 0), (3, 0)):
        raise ValueError(f"unknown .npy format version {version[0]}.{version[1]}")
    size = struct.Struct("<H" if version == (1, 0) else "<I")
    length = handle.read(size.size)
    wanted = size.unpack(length)[0] if len(length) == size.size else -1
    if not 0 <= wanted <= MAX_HEADER_BYTES:
        raise ValueError("the header's length is cut short or over 10,000 bytes")
    data = handle.read(wanted)
    if len(data) != wanted:
        raise ValueError(f"the header is cut short: {len(data)} of {wanted} bytes")
    return _parse_header(data.decode("utf-8" if version == (3, 0) else "latin-1"))


def _parse_header(text: str) -> NpyHeader:
    body = text.strip()
    fields: dict[str, str] = {}
    at = 1 if body.startswith("{") else len(body)  # not a dict: refused below
    while (found := _HEADER_ENTRY.match(body, at)) is not None:
        key, group = found["key"], _HEADER_GROUPS.get(found["key"])
        if group is None or key in fields or found[group] is None:
            break
        fields[key] = found[group]
        at = found.end()
    if len(fields) != len(_HEADER_GROUPS) or body[at:].strip() != "}":
        raise ValueError(
            f"a .npy header zephon_torch does not read: {body[:200]!r} (it takes a dict of "
            "'descr' (a plain dtype, not a structured one), 'fortran_order' and 'shape')"
        )
    try:
        dtype = np.dtype(fields["descr"])
    except TypeError as error:
        raise ValueError(
            f"the header's dtype {fields['descr']!r} is not a numpy dtype: {error}"
        ) from None
    shape = tuple(int(dim.strip().rstrip("L")) for dim in fields["shape"].split(",") if dim.strip())
    if any(dim > _MAX_DIM for dim in shape):  # numpy's limit; a bare OverflowError at the map
        raise ValueError(f"its header's shape {shape} has a dimension past {_MAX_DIM}")
    return NpyHeader(shape, dtype, fields["fortran_order"] == "True")


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
        size = os.fstat(handle.fileno()).st_size
    if header.dtype.hasobject:
        raise ValueError("holds Python objects, which cannot be memory-mapped")
    stated = offset + math.prod(header.shape) * header.dtype.itemsize
    if size != stated:
        # longer: bytes appended after it was written (ids that would never be read), or a
        # header patched to a smaller array
        how = "cut short" if size < stated else f"{size - stated} bytes longer than that"
        raise ValueError(
            f"its header describes an array of shape {header.shape} and dtype {header.dtype}, "
            f"{stated} bytes with the header, but the file has {size}: {how} (write it again "
            "with np.save, or restore a whole copy)"
        )
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
