"""MDS datasets damaged or forged: a shard cut short, appended to or inflating past its size, and an
index.json with values of the wrong type, shards outside the folder or columns its shards do not
hold, each refused as a DataError naming the dataset and the shard."""

from __future__ import annotations

import bz2
import gzip
import json
import tracemalloc
from collections.abc import Callable
from decimal import Decimal
from pathlib import Path
from typing import Any

import brotli
import pytest
import snappy
import zstandard

from tests.unit.io.test_io_formats_writers import MDS_COLUMNS, MDS_ROWS, plain, write_mds
from zephon_torch.errors import DataError
from zephon_torch.io import Dataset
from zephon_torch.io.mds import MdsReader


@pytest.mark.parametrize("compression", [None, "zstd"])
def test_a_truncated_shard_raises_a_data_error_naming_dataset_and_shard(
    tmp_path: Path, compression: str | None
) -> None:
    out = write_mds(tmp_path / "t", MDS_ROWS, MDS_COLUMNS, compression=compression, size_limit=1500)
    dataset = Dataset.from_path("broken", out)
    victim = Path(dataset.shards[1].path)
    victim.write_bytes(victim.read_bytes()[: victim.stat().st_size // 2])
    with pytest.raises(DataError, match=r"truncated|corrupt|cannot read") as caught:
        dataset.read_rows(1, [0])
    assert (caught.value.dataset, caught.value.shard) == ("broken", str(victim))
    assert len(dataset.read_rows(0, [0])) == 1
    if compression is None:  # cut before the open: not only "changed after the open?"
        reopened = Dataset.from_path("broken", out)
        with pytest.raises(DataError, match=r"truncated .* \(written or copied wrongly, or"):
            reopened.read_rows(1, [0])


@pytest.mark.parametrize("compression", ["zstd", "gz"])
def test_bytes_after_a_compressed_shard_are_a_data_error_naming_it(
    tmp_path: Path, compression: str
) -> None:
    """zstd reads a file's first frame only, so bytes appended to a zstd shard read as
    nothing and passed unseen (a fuzz run's damage), where a plain shard's size is checked
    against index.json: a compressed shard's is now checked against its `zip_data` bytes."""
    out = write_mds(
        tmp_path / "a", MDS_ROWS[:30], MDS_COLUMNS, compression=compression, size_limit=800
    )
    dataset = Dataset.from_path("appended", out)
    victim = Path(dataset.shards[1].path)
    victim.write_bytes(victim.read_bytes() + b"trailing bytes")
    with pytest.raises(
        DataError, match=r"truncated or corrupt: \d+ bytes where index.json"
    ) as caught:
        dataset.read_rows(1, [0])
    assert (caught.value.dataset, caught.value.shard) == ("appended", str(victim))
    assert len(dataset.read_rows(0, [0])) == 1


BOMB_BYTES = 64 << 20  # what the forged shards below inflate to


def bomb(codec: str) -> bytes:
    """BOMB_BYTES of zeros compressed with an MDS codec ("zstd-unsized": a zstd frame that
    does not state its content size)."""
    zeros = bytes(BOMB_BYTES)
    if codec.startswith("zstd"):
        sized = codec == "zstd"
        return zstandard.ZstdCompressor(write_content_size=sized).compress(zeros)
    compress = {"gz": gzip.compress, "bz2": bz2.compress, "br": brotli.compress}
    return compress.get(codec, snappy.compress)(zeros)


@pytest.mark.parametrize("codec", ["zstd", "zstd-unsized", "gz", "bz2", "br", "snappy"])
def test_a_shard_that_inflates_past_its_recorded_size_is_refused_without_inflating_it(
    tmp_path: Path, codec: str
) -> None:
    """A compressed shard was decompressed whole before its size was compared with the one
    index.json records: a 64 KB file naming 600 bytes took gigabytes of memory first."""
    out = write_mds(
        tmp_path / "m", MDS_ROWS[:10], MDS_COLUMNS, compression=codec.split("-", maxsplit=1)[0]
    )
    index = json.loads((out / "index.json").read_text())
    shard = index["shards"][0]
    forged = bomb(codec)
    (out / shard["zip_data"]["basename"]).write_bytes(forged)
    shard["zip_data"]["bytes"] = len(forged)  # the file's own size: only its inflated one lies
    (out / "index.json").write_text(json.dumps(index))
    dataset = Dataset.from_path("m", out)
    tracemalloc.start()
    try:
        with pytest.raises(
            DataError, match=r"decompresses to more than the \d+ bytes index"
        ) as caught:
            dataset.read_rows(0, [0])
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert caught.value.shard == str(out / shard["zip_data"]["basename"])
    assert peak < BOMB_BYTES // 8


def test_a_shard_missing_from_disk_is_refused_at_open(tmp_path: Path) -> None:
    out = write_mds(tmp_path / "gone", MDS_ROWS, MDS_COLUMNS, size_limit=1500)
    (out / "shard.00001.mds").unlink()
    with pytest.raises(DataError, match=r"shard file is missing, though index.json lists it"):
        Dataset.from_path("m", out)


def edit_index(out: Path, edit: Callable[[dict[str, Any]], object]) -> Path:
    """Applies `edit` to the dataset's parsed index.json and writes it back."""
    index = json.loads((out / "index.json").read_text())
    edit(index)
    (out / "index.json").write_text(json.dumps(index))
    return out


@pytest.mark.parametrize("name", ["../outside.mds", "sub/../../outside.mds", "absolute"])
def test_a_shard_name_leading_outside_the_dataset_folder_is_refused_at_open(
    tmp_path: Path, name: str
) -> None:
    """A basename of `../x` or `/x` opened and read that file, outside the dataset folder
    (any file the process could read, `/etc/passwd` too)."""
    out = write_mds(tmp_path / "m", MDS_ROWS, MDS_COLUMNS, size_limit=1500)
    (tmp_path / "outside.mds").write_bytes((out / "shard.00000.mds").read_bytes())
    name = str(tmp_path / "outside.mds") if name == "absolute" else name
    edit_index(out, lambda index: index["shards"][0]["raw_data"].update(basename=name))
    with pytest.raises(DataError, match=r"lies outside the dataset folder") as caught:
        Dataset.from_path("m", out)
    assert (caught.value.dataset, caught.value.shard) == ("m", str(tmp_path / "outside.mds"))


@pytest.mark.parametrize(
    ("field", "value", "message"),
    [
        ("compression", 5, "compression of .* is 5, not a str or null"),
        ("compression", "lz4", "has compression 'lz4', not one of bz2, gz, zstd"),
        ("column_sizes", ["8", None, None], r"column_sizes of .* not whole numbers >= 0 or null"),
        ("column_sizes", [8.0, None, None], r"column_sizes of .* not whole numbers >= 0 or null"),
        ("column_names", [5, "id", "tokens"], "column_names of .* not a list of str"),
        ("column_names", ["id", "id", "tokens"], "duplicate column name 'id' in column_names"),
        ("column_encodings", ["str", "int"], "has 3 column_names, 2 column_encodings"),
    ],
)
def test_an_index_value_of_the_wrong_type_is_a_data_error_at_open(
    tmp_path: Path, field: str, value: Any, message: str
) -> None:
    """Such values escaped as a bare TypeError or AttributeError (at open, or at the first
    read), were accepted (a compression no codec reads, on a plain shard), or returned the
    wrong column's values (a duplicate column name), silently."""
    out = write_mds(
        tmp_path / "m", MDS_ROWS, {"text": "str", "id": "int", "tokens": "ndarray:int32"}
    )
    edit_index(out, lambda index: index["shards"][0].update({field: value}))
    with pytest.raises(DataError, match=f"cannot read this MDS index: .*{message}") as caught:
        Dataset.from_path("m", out).read_rows(0, [0])
    assert (caught.value.dataset, caught.value.shard) == ("m", str(out / "index.json"))


@pytest.mark.parametrize(
    ("value", "what"), [(-3, "samples"), (2.5, "samples"), (True, "samples"), (-1, "raw bytes")]
)
def test_a_sample_or_byte_count_that_is_no_count_is_named_as_such(
    tmp_path: Path, value: object, what: str
) -> None:
    """A negative sample count was reported as a shard with no rows ("an empty file, or only
    blank lines"); a fractional one or true was cut to a whole number, silently."""
    out = write_mds(tmp_path / "m", MDS_ROWS, MDS_COLUMNS, size_limit=1500)

    def edit(index: dict[str, Any]) -> None:
        shard = index["shards"][0]
        (shard if what == "samples" else shard["raw_data"])[what.rsplit(maxsplit=1)[-1]] = value

    edit_index(out, edit)
    with pytest.raises(DataError, match=rf"records {value} {what} for this shard") as caught:
        Dataset.from_path("m", out)
    assert caught.value.shard == str(out / "shard.00000.mds")


@pytest.mark.parametrize("value", [2**32, 2**64])
def test_a_sample_count_no_shard_can_hold_is_refused_at_open(tmp_path: Path, value: int) -> None:
    """A shard's header holds its count in 4 bytes. A count of 2**64 opened, then ended the
    first job to lay out its rows in a bare OverflowError (int64), naming nothing."""
    out = write_mds(tmp_path / "m", MDS_ROWS, MDS_COLUMNS, size_limit=1500)
    edit_index(out, lambda index: index["shards"][0].update(samples=value))
    with pytest.raises(
        DataError, match=rf"records {value} samples for this shard, more than the 4294967295"
    ) as caught:
        Dataset.from_path("m", out)
    assert caught.value.shard == str(out / "shard.00000.mds")


def test_an_index_nested_too_deeply_to_parse_is_a_data_error_naming_it(tmp_path: Path) -> None:
    """JSON nested deeper than Python's parser goes was a bare RecursionError (detection
    refuses such an index first; the reader is reached directly, or for an index that
    changed after detection)."""
    out = write_mds(tmp_path / "m", MDS_ROWS, MDS_COLUMNS, size_limit=1500)
    (out / "index.json").write_text('{"shards": ' + "[" * 100_000 + "]" * 100_000 + "}")
    with pytest.raises(
        DataError, match=r"cannot read the index: its JSON nests too deeply"
    ) as caught:
        MdsReader(dataset="m", index_path=str(out / "index.json"))
    assert (caught.value.dataset, caught.value.shard) == ("m", str(out / "index.json"))


def test_a_shard_file_listed_twice_is_refused_at_open(tmp_path: Path) -> None:
    """An index listing one file twice opened with that shard once: fewer rows than the
    index records, silently."""
    out = write_mds(tmp_path / "m", MDS_ROWS, MDS_COLUMNS, size_limit=1500)
    edit_index(out, lambda index: index["shards"][2].update(index["shards"][0]))
    with pytest.raises(
        DataError, match=r"lists this shard file twice \(as shards 0 and 2\)"
    ) as caught:
        Dataset.from_path("m", out)
    assert (caught.value.dataset, caught.value.shard) == ("m", str(out / "shard.00000.mds"))


def test_an_mds_dataset_of_no_samples_is_refused_not_read_as_jsonl(tmp_path: Path) -> None:
    out = write_mds(tmp_path / "empty", [], MDS_COLUMNS)
    for format_ in (None, "mds"):
        with pytest.raises(DataError, match=r"the index lists no shards") as caught:
            Dataset.from_path("m", out, format=format_)
        assert caught.value.shard == str(out / "index.json")


def test_a_decimal_that_is_no_number_is_a_data_error_naming_the_row(tmp_path: Path) -> None:
    rows = [{"price": Decimal(f"{i}.25")} for i in range(10)]
    out = write_mds(tmp_path / "m", rows, {"price": "str_decimal"}, size_limit=1 << 20)
    shard = out / "shard.00000.mds"
    data = shard.read_bytes()
    at = data.index(b"7.25")
    shard.write_bytes(data[:at] + b"x" + data[at + 1 :])  # same length: offsets still agree
    with pytest.raises(DataError, match=r"shard\.00000\.mds.*row 7.*does not decode"):
        Dataset.from_path("m", out).read_rows(0, [6, 7])


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("column_encodings", ["int8", "int", "ndarray:int32"]),
        ("column_names", ["title", "id", "tokens"]),
        ("column_sizes", [None, None, None]),
    ],
)
def test_an_index_whose_columns_differ_from_the_shards_own_is_a_data_error(
    tmp_path: Path, field: str, value: list[Any]
) -> None:
    """A damaged index.json (which no hash covers) naming a column other than its shard was
    written with read without an error, silently wrong: 'text' as an int8 (its first byte),
    or under another name. The shard's own copy of its columns now decides, hashes or not."""
    out = write_mds(tmp_path / "m", MDS_ROWS, MDS_COLUMNS, size_limit=1500, hashes=["sha1"])
    edit_index(out, lambda index: index["shards"][1].update({field: value}))
    dataset = Dataset.from_path("m", out, io_options={"mds": {"verify_hashes": True}})
    assert plain(dataset.read_rows(0, [0])[0]) == plain(MDS_ROWS[0])
    with pytest.raises(DataError, match=rf"index.json records {field} .* where the shard itself"):
        dataset.read_rows(1, [0])


def test_a_shard_whose_count_the_index_damaged_to_zero_is_refused_not_dropped(
    tmp_path: Path,
) -> None:
    """A shard of 0 samples is skipped (MDSWriter writes one before an oversized first
    sample), so an index whose count of a full shard read 0 dropped all its rows, silently."""
    out = write_mds(tmp_path / "m", MDS_ROWS, MDS_COLUMNS, size_limit=1500)
    edit_index(out, lambda index: index["shards"][1].update({"samples": 0}))
    with pytest.raises(
        DataError, match=r"header says \d+ samples where index.json records 0"
    ) as caught:
        Dataset.from_path("m", out)
    assert (caught.value.dataset, caught.value.shard) == ("m", str(out / "shard.00001.mds"))
