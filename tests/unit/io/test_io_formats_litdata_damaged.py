"""Damaged LitData chunks: a JSON leaf, an Arrow footer's offsets or record batches, a
compressed frame or a framed chunk's item offsets that do not decode are DataErrors naming the
chunk or the row; footers of unusual but valid layouts read back as written."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from tests.unit.io.test_io_formats_litdata import all_rows
from tests.unit.io.test_io_formats_writers import write_litdata
from zephon_torch import Pipeline
from zephon_torch.errors import DataError
from zephon_torch.io import Dataset
from zephon_torch.work import StaticMixtureWorkSource


@pytest.mark.parametrize(
    "leaf",
    [
        # records of no keys: litdata writes none (keyless dicts go as JSON), and no bytes
        # bound their count (0xFFFFFFFF of them hung the reader, then ran out of memory)
        bytes([6]) + (2).to_bytes(4, "little") + (0).to_bytes(4, "little"),
        # dicts nested past the recursion limit (a RecursionError the reader did not catch)
        (bytes([5]) + (1).to_bytes(4, "little") + (0).to_bytes(4, "little")) * 5000 + bytes([11]),
        b"[" * 100_000,
    ],
)
def test_a_damaged_json_leaf_is_a_value_error_the_reader_names(leaf: bytes) -> None:
    from zephon_torch.io._litdata_damage import CORRUPT
    from zephon_torch.io._litdata_format import _nested

    with pytest.raises(CORRUPT):
        _nested(memoryview(leaf))


def footer_chunk(tmp_path: Path, count: int) -> tuple[Path, Path, bytearray, tuple[int, int]]:
    """A LitData dataset of `count` text items in one chunk with an Arrow footer: its folder,
    the chunk file, the chunk's bytes (to damage) and the footer's (start, length) in them."""
    from zephon_torch.io import _litdata_format as fmt

    items = [{"text": f"text {i}"} for i in range(count)]
    out = write_litdata(tmp_path / "footer", items, chunk_bytes=None, chunk_size=count)
    chunk = next(out.glob("*.bin"))
    data = bytearray(chunk.read_bytes())
    footer = fmt.parse_layout(memoryview(bytes(data)), count).footer
    assert footer is not None
    return out, chunk, data, footer


def test_damaged_offsets_in_an_arrow_footer_are_a_data_error_naming_the_row(
    tmp_path: Path,
) -> None:
    """pyarrow reads a footer's record batch unchecked: a string offset gone backwards was a
    SystemError (other damage a segfault) when the rows were converted."""
    import pyarrow as pa

    out, chunk, data, (start, length) = footer_chunk(tmp_path, 6)
    ipc = pa.py_buffer(bytes(data[start : start + length]))
    offsets = pa.ipc.open_file(ipc).get_batch(0).column("text").buffers()[1]
    at = start + offsets.address - ipc.address
    # row 1 ends before it starts
    data[at + 8 : at + 12] = (-100).to_bytes(4, "little", signed=True)
    chunk.write_bytes(bytes(data))
    with pytest.raises(
        DataError, match=r"row 1: cannot read the part of the chunk .*record batch 0"
    ) as caught:
        Dataset.from_path("l", out).read_rows(0, [1])
    assert (caught.value.dataset, caught.value.shard) == ("l", str(chunk))
    assert caught.value.shard_wide  # the batch is shared: bad_rows="skip" does not skip it


def test_a_damaged_later_record_batch_of_an_arrow_footer_is_a_data_error_naming_the_row(
    tmp_path: Path,
) -> None:
    """The chunk opens (its first footer batch is whole); a later batch's message was a bare
    OSError ('Invalid IPC stream') at the read, out of the pipeline and `inspect` alike."""
    out, chunk, data, (start, length) = footer_chunk(tmp_path, 600)
    # IPC messages start with a 0xFFFFFFFF continuation mark: the schema's, then each batch's
    marks = [i for i in range(start, start + length - 3) if data[i : i + 4] == b"\xff" * 4]
    data[marks[2] + 3] = 0x80  # the second batch's mark, made negative
    chunk.write_bytes(bytes(data))
    dataset = Dataset.from_path("l", out)
    assert dataset.read_rows(0, [0, 255]) == [{"text": "text 0"}, {"text": "text 255"}]
    with pytest.raises(DataError, match=r"row 256: .* record batch 1 .*: OSError") as caught:
        dataset.read_rows(0, list(range(600)))
    assert (caught.value.dataset, caught.value.shard) == ("l", str(chunk))
    # 256 rows share the batch: under bad_rows="skip" they were each skipped as malformed
    assert caught.value.shard_wide


def test_a_damaged_compressed_frame_is_the_chunks_fault(tmp_path: Path) -> None:
    """A framed-zstd chunk whose third frame (items 16..23) does not inflate: the rows read
    there raise naming the first asked for, as the shard's fault (``shard_wide``), so
    ``bad_rows="skip"`` ends the run rather than skip the frame's eight rows one by one; the
    other frames read."""
    from zephon_torch.io import _litdata_format as fmt

    items = [{"ids": np.arange(i, i + 5, dtype=np.int32)} for i in range(64)]
    out = write_litdata(
        tmp_path / "framed",
        items,
        chunk_bytes=1 << 20,
        compression="zstd",
        compression_batch_size=8,
    )
    index = json.loads((out / "index.json").read_text())
    chunk = out / index["chunks"][0]["filename"]
    data = bytearray(chunk.read_bytes())
    frames = fmt.parse_layout(memoryview(bytes(data)), 64).frames
    assert [(f.first, f.count) for f in frames[:3]] == [(0, 8), (8, 8), (16, 8)]
    data[frames[2].start : frames[2].start + 4] = bytes(4)  # its zstd magic gone
    chunk.write_bytes(bytes(data))
    dataset = Dataset.from_path("l", out)
    assert [r["ids"][0] for r in dataset.read_rows(0, [15, 24, 0])] == [15, 24, 0]
    with pytest.raises(DataError, match=r"row 17: .* frame of items 16\.\.23: zstd") as caught:
        dataset.read_rows(0, [17, 16])
    assert caught.value.shard == str(chunk) and caught.value.shard_wide
    source = StaticMixtureWorkSource([dataset], seed=1, exhaustion="stop")
    pipeline = Pipeline(source).options(bad_rows="skip").pretokenized("ids").pack_flat(8)
    with pytest.raises(DataError, match=r"frame of items 16\.\.23"):
        list(pipeline.batch(2))


def rewrite_footer(
    out: Path, chunk: Path, data: bytearray, start: int, table: Any, *, stream: bool = False
) -> None:
    """Put `table` in place of the Arrow footer at `start` of `chunk` (bytes `data`), one
    record batch per batch of `table` (an IPC file, or with `stream` an IPC stream), and
    record the chunk's new size in index.json."""
    import pyarrow as pa

    sink = pa.BufferOutputStream()
    with (pa.ipc.new_stream if stream else pa.ipc.new_file)(sink, table.schema) as writer:
        for batch in table.to_batches():
            writer.write_batch(batch)
    ipc = sink.getvalue().to_pybytes()
    chunk.write_bytes(bytes(data[:start]) + ipc + len(ipc).to_bytes(4, "little") + data[-8:])
    index = json.loads((out / "index.json").read_text())
    index["chunks"][0]["chunk_bytes"] = chunk.stat().st_size
    (out / "index.json").write_text(json.dumps(index))


def test_a_footer_batch_that_does_not_convert_is_the_chunks_fault(tmp_path: Path) -> None:
    """A record batch whose column pyarrow cannot give as Python values (a map of nanosecond
    times): each of its rows was refused as its own fault, so bad_rows="skip" skipped them
    one by one, decoding the batch again for each (a review)."""
    import pyarrow as pa

    out, chunk, data, (start, _) = footer_chunk(tmp_path, 4)
    times = pa.array([[("k", 1001)]] * 4, pa.map_(pa.string(), pa.timestamp("ns")))
    rewrite_footer(out, chunk, data, start, pa.table({"text": times}))
    dataset = Dataset.from_path("l", out)
    with pytest.raises(DataError, match=r"row 2: .*record batch 0 .*Nanosecond") as caught:
        dataset.read_rows(0, [2])
    assert caught.value.shard_wide


def test_damaged_item_offsets_of_a_framed_chunk_are_the_chunks_fault(tmp_path: Path) -> None:
    """The offsets table is shared by every item: damaged, items came out cut short or long,
    each refused (or under skip, skipped) as its own row's fault (a review). Checked against
    the frames' sizes: damage to an offset inside a frame that keeps them rising still reads
    as two items' other bytes."""
    from zephon_torch.io import _litdata_format as fmt

    items = [{"ids": np.arange(i, i + 5, dtype=np.int32)} for i in range(32)]
    out = write_litdata(
        tmp_path / "framed", items, chunk_bytes=1 << 20, compression="zstd",
        compression_batch_size=8,
    )  # fmt: skip
    chunk = next(out.glob("*.bin"))
    data = bytearray(chunk.read_bytes())
    offsets_at = fmt._FRAMED_PREFIX.size
    assert len(fmt.parse_layout(memoryview(bytes(data)), 32).frames) == 4
    item = offsets_at + 4 * 8  # item 8's start: where the second frame starts
    value = int.from_bytes(data[item : item + 4], "little")
    data[item : item + 4] = (value + 3).to_bytes(4, "little")
    chunk.write_bytes(bytes(data))
    with pytest.raises(DataError, match=r"truncated or corrupt: the item offsets") as caught:
        Dataset.from_path("l", out).read_rows(0, [0])
    assert caught.value.row is None


def test_rows_of_an_arrow_footer_with_record_batches_of_unequal_sizes_read_back(
    tmp_path: Path,
) -> None:
    """Rows were located as if every record batch held as many rows as the first: with
    batches of 15, 5, 15 and 5 rows, rows 30 to 39 came back as rows 20 to 29, silently."""
    import pyarrow as pa

    out, chunk, data, (start, length) = footer_chunk(tmp_path, 40)
    table = pa.ipc.open_file(pa.py_buffer(bytes(data[start : start + length]))).read_all()
    batches = [table.slice(first, rows) for first, rows in ((0, 15), (15, 5), (20, 15), (35, 5))]
    rewrite_footer(out, chunk, data, start, pa.concat_tables(batches))
    dataset = Dataset.from_path("l", out)
    assert dataset.read_rows(0, [39, 30, 20, 19, 15, 14, 0]) == [
        {"text": f"text {i}"} for i in (39, 30, 20, 19, 15, 14, 0)
    ]
    assert dataset.read_rows(0, range(40)) == [{"text": f"text {i}"} for i in range(40)]


def test_an_arrow_footer_in_the_ipc_stream_format_reads_as_litdata_reads_it(
    tmp_path: Path,
) -> None:
    """litdata wrote its footers as Arrow IPC streams before it wrote IPC files, and reads
    both; such a chunk was refused as "truncated or corrupt: Not an Arrow file"."""
    import pyarrow as pa

    out, chunk, data, (start, length) = footer_chunk(tmp_path, 40)
    table = pa.ipc.open_file(pa.py_buffer(bytes(data[start : start + length]))).read_all()
    halves = pa.concat_tables([table.slice(0, 15), table.slice(15, 25)])
    rewrite_footer(out, chunk, data, start, halves, stream=True)
    expected = [{"text": f"text {i}"} for i in (39, 15, 14, 0)]
    theirs = pytest.importorskip("litdata").StreamingDataset(str(out))
    assert [theirs[i] for i in (39, 15, 14, 0)] == expected
    assert Dataset.from_path("l", out).read_rows(0, [39, 15, 14, 0]) == expected


def test_items_whose_last_bytes_are_the_footer_magic_are_not_read_as_a_footer(
    tmp_path: Path,
) -> None:
    """A chunk without a footer whose last item ended in `LDARW01\\0` (a bytes leaf) was
    refused as corrupt, its last bytes taken for an Arrow footer; litdata reads it."""
    items = [
        {"ids": np.arange(3, dtype=np.int32), "raw": b"x" * i + b"LDARW01\0"} for i in range(3)
    ]
    out = write_litdata(tmp_path / "magic", items)
    theirs = pytest.importorskip("litdata").StreamingDataset(str(out))
    assert [bytes(theirs[i]["raw"]) for i in range(3)] == [item["raw"] for item in items]
    assert [row["raw"] for row in all_rows(Dataset.from_path("l", out))] == [
        item["raw"] for item in items
    ]
