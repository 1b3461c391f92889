"""Streaming decompression of JSONL shards, chosen by the file's magic bytes; and whole MDS
shards and LitData chunks by their index's codec name, never past the size the index records
(`inflate`).

The magic bytes decide, not the extension, so `format="jsonl"` on a compressed file with an odd
name still reads. No plain JSONL file can start with either magic: both begin with bytes that are
not valid at the start of UTF-8 JSON text. zstandard is optional and imported on first use.
"""

from __future__ import annotations

import bz2
import gzip
import importlib
import io
import shutil
import zlib
from collections.abc import Callable
from functools import partial
from types import ModuleType
from typing import Any, BinaryIO, Literal

Compression = Literal["gzip", "zstd"]

_GZIP_MAGIC = b"\x1f\x8b"
_ZSTD_MAGIC = b"\x28\xb5\x2f\xfd"
ZSTD_HINT = "pip install 'zephon-torch[zstd]'"
_COPY_BYTES = 1 << 22
_ZSTD_PIECE = 1 << 12  # zstd input per call: at most about 128 MiB out (11% slower than 4 MiB)
_OPTIONAL_MDS_CODECS = {"br": ("brotli", "brotli"), "snappy": ("snappy", "python-snappy")}
MDS_CODECS = ("bz2", "gz", "zstd", *_OPTIONAL_MDS_CODECS)


# compressions that JSON Lines is not read in, by their magic bytes (none can start JSON text);
# bz2's is followed by its block size, a digit
_FOREIGN = {b"\xfd7zXZ\x00": "xz", b"\x04\x22\x4d\x18": "lz4", b"PK\x03\x04": "zip"}
_FOREIGN.update({b"BZh%d" % size: "bz2" for size in range(1, 10)})


class ForeignError(Exception):
    """The file is compressed, but neither with gzip nor with zstd."""


def compression_of(path: str) -> Compression | None:
    """Returns the compression of the file at `path`, or None for a plain file.

    Raises:
        ForeignError: for a file compressed with bz2, xz, lz4 or zip: read as plain text, it
            was a malformed first row that asked whether the file was cut short.
    """
    with open(path, "rb") as handle:
        head = handle.read(6)
    if head.startswith(_GZIP_MAGIC):
        return "gzip"
    if head.startswith(_ZSTD_MAGIC) or _skippable(head[:4]):
        return "zstd"
    for magic, name in _FOREIGN.items():
        if head.startswith(magic):
            raise ForeignError(
                f"the file is {name}-compressed, which no reader here reads: recompress it "
                "with gzip or zstd"
            )
    return None


def _skippable(head: bytes) -> bool:
    """Whether `head` starts a zstd skippable frame (magic 0x184D2A50-5F, little-endian), as
    `pzstd` begins its output with: zstd data, read frame by frame."""
    return len(head) == 4 and int.from_bytes(head, "little") & ~0xF == 0x184D2A50


class CorruptError(Exception):
    """The compressed data does not decompress (corrupt, or truncated)."""


class TooLargeError(Exception):
    """The decompressed data passed the limit it was given."""


def decompress_to(
    path: str, compression: Compression, target: str, *, limit: int | None = None
) -> None:
    """Decompresses a whole file, every gzip member or zstd frame in it, into the file
    `target`, streaming (a few MiB of memory whatever the size).

    Raises:
        ImportError: for zstd when `zstandard` is not installed; the message has the install hint.
        CorruptError: when the data is corrupt or ends inside a member or frame.
        TooLargeError: as soon as more than `limit` bytes come out (the rest is not read).
        OSError: when a file cannot be read or written.
    """
    with open(path, "rb") as handle, open(target, "wb") as out:
        _copy(handle, out if limit is None else _Bounded(out, limit), compression)


class _Bounded:
    """A writer that refuses to take more than `limit` bytes in all."""

    def __init__(self, out: BinaryIO, limit: int) -> None:
        self.out, self.limit, self.written = out, limit, 0

    def write(self, data: bytes) -> int:
        self.written += len(data)
        if self.written > self.limit:
            raise TooLargeError(f"more than {self.limit} bytes")
        return self.out.write(data)


def decompress_bytes(path: str, compression: Compression) -> bytes:
    """As `decompress_to`, into memory."""
    out = io.BytesIO()
    with open(path, "rb") as handle:
        _copy(handle, out, compression)
    return out.getvalue()


def _copy(handle: BinaryIO, out: BinaryIO | _Bounded, compression: Compression) -> None:
    zstandard = zstandard_module() if compression == "zstd" else None
    corrupt: tuple[type[Exception], ...] = (EOFError, zlib.error, gzip.BadGzipFile)
    if zstandard is not None:
        corrupt += (zstandard.ZstdError,)
    try:
        if zstandard is None:
            with gzip.GzipFile(fileobj=handle) as reader:
                shutil.copyfileobj(reader, out, _COPY_BYTES)
        else:
            _copy_zstd(zstandard, handle, out)
    except corrupt as error:
        raise CorruptError(str(error) or type(error).__name__) from error


def _copy_zstd(zstandard: ModuleType, handle: BinaryIO, out: BinaryIO | _Bounded) -> None:
    """Every frame, one after another; data that ends inside a frame is an error (zstandard's
    stream reader ends quietly there). The input goes in `_ZSTD_PIECE` bytes at a time: a call
    returns all it inflates to (at most about 32,000 times its input), and a 4 MiB read of a
    crafted file inflated to gigabytes in memory before `_Bounded` saw any of it."""
    context = zstandard.ZstdDecompressor()
    frame, inside = context.decompressobj(), False
    while chunk := handle.read(_ZSTD_PIECE):
        while chunk:
            out.write(frame.decompress(chunk))
            inside = True
            if not frame.eof:
                break
            chunk, frame, inside = frame.unused_data, context.decompressobj(), False
    if inside:
        raise EOFError("the zstd data ends inside a frame (truncated)")


def zstandard_module() -> ModuleType:
    """Imports `zstandard`, or raises ImportError with the install hint."""
    try:
        return importlib.import_module("zstandard")
    except ImportError as error:
        raise ImportError(
            f"reading .zst files needs the optional `zstandard` package: {ZSTD_HINT}"
        ) from error


def inflate(packed: bytes | memoryview, codec: str, size: int) -> bytes:
    """A whole MDS shard or LitData chunk compressed with `codec` (one of `MDS_CODECS`),
    decompressed, when it holds at most `size` bytes (the size its index records).

    No more than about `size + 1` bytes are ever decompressed, so a small file that inflates
    to gigabytes (corrupt, or another file's) costs no more memory than a good one: each codec
    is given an output limit in one call, as fast as decompressing whole (zstd honours its own
    limit only when the frame states no content size).

    Raises:
        TooLargeError: when more than `size` bytes come out.
        CorruptError: when the data does not decompress.
        ImportError: for a codec whose optional package is missing, naming it.
    """
    inflater = _INFLATERS.get(codec) or partial(_optional, codec)
    try:
        data = inflater(packed, size)
    except (TooLargeError, ImportError):
        raise
    except Exception as error:  # each codec's own error type: zlib.error, ZstdError, ...
        raise CorruptError(str(error) or type(error).__name__) from error
    if len(data) > size:
        raise TooLargeError(f"more than {size} bytes")
    return data


def _unzstd(packed: bytes | memoryview, size: int) -> bytes:
    """A frame that states its content size decompresses in one call (zstd refuses data
    longer than it states, and reads the first frame only, as MDS and LitData write one);
    one that does not streams into a bounded writer."""
    zstandard = zstandard_module()
    stated = zstandard.frame_content_size(packed)
    if stated > size:
        raise TooLargeError(f"more than {size} bytes")
    context = zstandard.ZstdDecompressor()
    if stated >= 0:
        data: bytes = context.decompress(packed)
        return data
    out = io.BytesIO()
    reader = context.stream_reader(packed, read_across_frames=True)
    shutil.copyfileobj(reader, _Bounded(out, size), _COPY_BYTES)
    return out.getvalue()


def _unzip(decompressor: Callable[[], Any], packed: bytes | memoryview, size: int) -> bytes:
    """gzip members or bz2 streams, one after another, each given the room left as its output
    limit: more than `size + 1` bytes never come out."""
    parts, data, room = [], packed, size + 1
    while data and room > 0:
        member = decompressor()
        parts.append(member.decompress(data, room))
        room -= len(parts[-1])
        if not member.eof:  # out of room, or the data ends inside the member
            break
        data = member.unused_data
    return b"".join(parts)


def _optional(codec: str, packed: bytes | memoryview, size: int) -> bytes:
    """brotli and snappy, imported on first use."""
    module, package = _OPTIONAL_MDS_CODECS[codec]
    try:
        found = importlib.import_module(module)
    except ImportError as error:
        raise ImportError(
            f"reading {codec}-compressed MDS shards needs `pip install {package}`"
        ) from error
    if codec == "snappy":  # a snappy block states its length up front
        if _snappy_length(packed) > size:
            raise TooLargeError(f"more than {size} bytes")
        data: bytes = found.decompress(packed)
        return data
    try:  # the output grows no further once past the limit
        data = found.Decompressor().process(packed, output_buffer_limit=size + 1)
    except TypeError as error:
        raise ImportError(
            "reading br-compressed MDS shards needs `pip install 'brotli>=1.2'`"
        ) from error
    return data


def _snappy_length(packed: bytes | memoryview) -> int:
    """The decompressed length a snappy block starts with (a little-endian base-128 varint);
    -1 when the block is too short to hold one."""
    length = 0
    for shift, byte in zip(range(0, 35, 7), bytes(packed[:5]), strict=False):
        length |= (byte & 0x7F) << shift
        if byte < 0x80:
            return length
    return -1


_INFLATERS: dict[str, Callable[[bytes | memoryview, int], bytes]] = {
    "zstd": _unzstd,
    "gz": partial(_unzip, partial(zlib.decompressobj, zlib.MAX_WBITS | 16)),
    "bz2": partial(_unzip, bz2.BZ2Decompressor),
}
