"""Streaming decompression of JSONL shards, chosen by the file's magic bytes.

The magic bytes decide, not the extension, so `format="jsonl"` on a compressed file with an odd
name still reads. No plain JSONL file can start with either magic: both begin with bytes that are
not valid at the start of UTF-8 JSON text. zstandard is optional and imported on first use.
"""

from __future__ import annotations

import gzip
import importlib
import shutil
from types import ModuleType
from typing import Literal

Compression = Literal["gzip", "zstd"]

_GZIP_MAGIC = b"\x1f\x8b"
_ZSTD_MAGIC = b"\x28\xb5\x2f\xfd"
ZSTD_HINT = "pip install 'zephon-torch[zstd]'"
_COPY_BYTES = 1 << 22


def compression_of(path: str) -> Compression | None:
    """Returns the compression of the file at `path`, or None for a plain file."""
    with open(path, "rb") as handle:
        head = handle.read(4)
    if head.startswith(_GZIP_MAGIC):
        return "gzip"
    if head.startswith(_ZSTD_MAGIC):
        return "zstd"
    return None


def decompress_to(path: str, compression: Compression, target: str) -> None:
    """Decompresses a whole file, every gzip member or zstd frame in it, into the file
    `target`, streaming (a few MiB of memory whatever the size).

    Args:
        path: the compressed file.
        compression: how it is compressed.
        target: the file to write.

    Raises:
        ImportError: for zstd when `zstandard` is not installed; the message has the install hint.
        OSError, EOFError, zlib.error, zstandard.ZstdError: when the data is corrupt.
    """
    with open(path, "rb") as handle, open(target, "wb") as out:
        if compression == "gzip":
            with gzip.GzipFile(fileobj=handle) as reader:
                shutil.copyfileobj(reader, out, _COPY_BYTES)
            return
        decompressor = zstandard_module().ZstdDecompressor()
        with decompressor.stream_reader(handle, read_across_frames=True) as stream:
            shutil.copyfileobj(stream, out, _COPY_BYTES)


def zstandard_module() -> ModuleType:
    """Imports `zstandard`, or raises ImportError with the install hint."""
    try:
        return importlib.import_module("zstandard")
    except ImportError as error:
        raise ImportError(
            f"reading .zst files needs the optional `zstandard` package: {ZSTD_HINT}"
        ) from error
