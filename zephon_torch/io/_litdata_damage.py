"""What a LitData chunk's shared parts raise when damaged (a compressed frame, a record batch
of the Arrow footer), and the helpers that read them: inflating zstd, opening the footer, and
finding the footer's record batch that holds a row."""

from __future__ import annotations

import bisect
import struct
from typing import TYPE_CHECKING, Protocol

import pyarrow as pa

from zephon_torch.io._compression import CorruptError, TooLargeError, inflate, zstandard_module

if TYPE_CHECKING:
    from zephon_torch.io.litdata import Chunk

# what a damaged item or footer batch raises (pyarrow: ArrowInvalid is a ValueError, a damaged
# IPC message an OSError)
CORRUPT = (ValueError, KeyError, IndexError, struct.error, OSError, pa.ArrowException)


class SharedDamage(ValueError):
    """Damage to a part of a chunk that several items share: a compressed frame, a record
    batch of the Arrow footer, a footer shorter than `index.json` says. The shard is at fault
    wherever it showed, so ``bad_rows="skip"`` does not skip its rows one by one."""


class Footer(Protocol):
    """A chunk's Arrow footer, by record batch (`pa.ipc.RecordBatchFileReader` is one)."""

    @property
    def num_record_batches(self) -> int: ...

    def get_batch(self, i: int) -> pa.RecordBatch: ...


class _StreamFooter:
    """A footer in the Arrow IPC stream format, which litdata wrote before its IPC files and
    still reads: a stream has no index of its batches, so they are all read (zero-copy) at
    the open."""

    def __init__(self, ipc: pa.Buffer) -> None:
        self._batches = list(pa.ipc.open_stream(ipc))

    @property
    def num_record_batches(self) -> int:
        return len(self._batches)

    def get_batch(self, i: int) -> pa.RecordBatch:
        return self._batches[i]


def open_footer(ipc: memoryview) -> Footer:
    """The Arrow footer held in ``ipc``: an IPC file (`ARROW1` first), else an IPC stream."""
    buffer = pa.py_buffer(ipc)
    if bytes(ipc[:6]) == b"ARROW1":
        footer: Footer = pa.ipc.open_file(buffer)
        return footer
    return _StreamFooter(buffer)


def batch_of(chunk: Chunk, row: int) -> tuple[int, int]:
    """The footer's record batch holding `row`, and the row's place in it. Batches may hold
    any number of rows each (litdata writes 256, other writers need not): their sizes are
    summed, reading each batch's size the first time a row at or past it is asked for."""
    ends, footer = chunk.batch_ends, chunk.footer
    assert footer is not None
    if ends[-1] <= row:
        with chunk.lock:
            while ends[-1] <= row:
                if len(ends) == footer.num_record_batches:
                    raise SharedDamage(f"the Arrow footer holds {ends[-1]} rows, not row {row}")
                try:
                    ends.append(ends[-1] + footer.get_batch(len(ends)).num_rows)
                except CORRUPT as error:
                    number = len(ends)
                    raise SharedDamage(
                        f"record batch {number} of its Arrow footer: {error!r}"
                    ) from None
    number = bisect.bisect_right(ends, row)
    return number, row - (ends[number - 1] if number else 0)


def inflated(packed: memoryview, size: int) -> memoryview:
    """A whole zstd chunk or frame, inflated when it holds at most `size` bytes (the size
    recorded for it): no more is inflated. ValueError when larger or corrupt."""
    try:
        return memoryview(inflate(packed, "zstd", size))
    except TooLargeError:
        raise ValueError(f"it inflates to more than the {size} bytes recorded for it") from None
    except CorruptError as error:
        raise ValueError(f"zstd: {error}") from None


def unzstd(data: memoryview) -> memoryview:
    """Inflates one zstd-compressed item; ValueError when corrupt."""
    zstandard = zstandard_module()
    try:
        return memoryview(zstandard.ZstdDecompressor().decompressobj().decompress(data))
    except zstandard.ZstdError as error:
        raise ValueError(f"zstd: {error}") from None
