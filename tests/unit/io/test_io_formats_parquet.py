"""Parquet column projection, token columns and corrupt files."""

from __future__ import annotations

import pickle
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from tests.unit.io.test_io_formats_writers import assert_threads_read_like_one, plain
from zephon_torch.errors import DataError
from zephon_torch.io import Dataset

COUNT = 200


def table() -> pa.Table:
    return pa.table(
        {
            "id": pa.array(range(COUNT), pa.int64()),
            "text": [f"document {i} " * (i % 5 + 1) for i in range(COUNT)],
            "blob": [bytes([i % 256]) * 300 for i in range(COUNT)],
            "ids": pa.array(
                [list(range(i, i + i % 11)) for i in range(COUNT)], pa.list_(pa.int32())
            ),
            "wide": pa.array([[i * 2**40] for i in range(COUNT)], pa.large_list(pa.int64())),
        }
    )


@pytest.fixture(scope="module")
def parquet_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("parquet")
    data = table()
    pq.write_table(data.slice(0, 120), root / "a.parquet", row_group_size=32)
    pq.write_table(data.slice(120), root / "b.parquet", row_group_size=32)
    return root


def test_a_projection_returns_only_the_requested_columns_in_order(parquet_dir: Path) -> None:
    dataset = Dataset.from_path("p", parquet_dir, columns=["text", "id"])
    rows = dataset.read_rows(1, [5, 0])
    assert rows == [{"text": f"document {i} " * (i % 5 + 1), "id": i} for i in (125, 120)]
    assert list(rows[0]) == ["text", "id"]


def test_a_projection_never_decodes_the_other_columns(tmp_path: Path) -> None:
    path = tmp_path / "c.parquet"
    pq.write_table(table(), path, row_group_size=COUNT, compression="none", use_dictionary=False)
    blob = pq.ParquetFile(path).metadata.row_group(0).column(2)
    assert blob.path_in_schema == "blob"
    data = bytearray(path.read_bytes())
    start = blob.data_page_offset
    data[start : start + blob.total_compressed_size] = b"\xff" * blob.total_compressed_size
    path.write_bytes(bytes(data))  # the blob column chunk is garbage now
    projected = Dataset.from_path("p", path, columns=["id", "text"])
    assert projected.read_rows(0, [7]) == [{"id": 7, "text": "document 7 " * 3}]
    with pytest.raises(DataError, match=r"cannot decode row group 0") as caught:
        Dataset.from_path("p", path).read_rows(0, [7])
    assert (caught.value.dataset, caught.value.shard) == ("p", str(path))


def test_token_columns_come_back_as_read_only_integer_arrays(parquet_dir: Path) -> None:
    dataset = Dataset.from_path("p", parquet_dir, token_columns=["ids", "wide"])
    rows = dataset.read_rows(0, [13, 0, 13])
    assert [row["ids"].tolist() for row in rows] == [list(range(13, 15)), [], list(range(13, 15))]
    assert rows[0]["ids"].dtype == np.int32 and rows[0]["wide"].dtype == np.int64
    assert rows[0]["wide"].tolist() == [13 * 2**40]
    assert not rows[0]["ids"].flags.writeable
    assert isinstance(Dataset.from_path("p", parquet_dir).read_rows(0, [13])[0]["ids"], list)


def test_a_null_token_list_is_none_and_a_null_token_id_is_a_data_error(tmp_path: Path) -> None:
    kind = pa.list_(pa.int32())
    pq.write_table(pa.table({"ids": pa.array([[1, 2], None, [3]], kind)}), tmp_path / "n.parquet")
    rows = Dataset.from_path("p", tmp_path / "n.parquet", token_columns=["ids"]).read_rows(
        0, [0, 1, 2]
    )
    assert [None if row["ids"] is None else row["ids"].tolist() for row in rows] == [
        [1, 2],
        None,
        [3],
    ]
    pq.write_table(pa.table({"ids": pa.array([[1, None]], kind)}), tmp_path / "m.parquet")
    dataset = Dataset.from_path("p", tmp_path / "m.parquet", token_columns=["ids"])
    with pytest.raises(DataError, match=r"token column 'ids' holds a null token id in row 0"):
        dataset.read_rows(0, [0])
    # the row is named, counted in the shard (row group 1 here); the rest of its group reads
    ids = [[1, 2]] * 5 + [[3], None, [4, None, 5], [None]]
    pq.write_table(pa.table({"ids": pa.array(ids, kind)}), tmp_path / "r.parquet", row_group_size=4)
    dataset = Dataset.from_path("p", tmp_path / "r.parquet", token_columns=["ids"])
    assert [row["ids"].tolist() for row in dataset.read_rows(0, [0, 3])] == [[1, 2], [1, 2]]
    assert [
        None if r["ids"] is None else r["ids"].tolist() for r in dataset.read_rows(0, [4, 5, 6])
    ] == [
        [1, 2],
        [3],
        None,
    ]
    with pytest.raises(
        DataError, match=r"row group 1: token column 'ids' holds a null token id in row 7"
    ) as caught:
        dataset.read_rows(0, [4, 7])
    assert (caught.value.row, caught.value.shard) == (7, str(tmp_path / "r.parquet"))
    with pytest.raises(DataError, match=r"row group 2: .* null token id in row 8"):
        dataset.read_rows(0, [8])


def test_a_shard_of_empty_token_lists_written_without_a_type_reads_as_empty_documents(
    tmp_path: Path,
) -> None:
    """pyarrow infers list<null> for a column of empty lists alone: such a shard (of empty
    documents) was refused as not holding integer token ids, where `.npy` took the same."""
    pq.write_table(pa.table({"ids": [[], []]}), tmp_path / "a.parquet")
    kind = pa.list_(pa.int32())
    pq.write_table(pa.table({"ids": pa.array([[5, 6], [7]], kind)}), tmp_path / "b.parquet")
    assert pq.read_schema(tmp_path / "a.parquet").field("ids").type == pa.list_(pa.null())
    dataset = Dataset.from_path("p", tmp_path, token_columns=["ids"])
    rows = [dataset.read_rows(shard, [0, 1]) for shard in (0, 1)]
    assert [[row["ids"].tolist() for row in shard] for shard in rows] == [[[], []], [[5, 6], [7]]]
    pq.write_table(pa.table({"ids": [[None]]}), tmp_path / "c.parquet")  # list<null>, an id
    with pytest.raises(DataError, match=r"token column 'ids' holds a null token id in row 0"):
        Dataset.from_path("p", tmp_path / "c.parquet", token_columns=["ids"]).read_rows(0, [0])


def test_a_token_column_that_is_not_a_list_of_integers_is_refused_at_open(
    parquet_dir: Path,
) -> None:
    with pytest.raises(DataError, match=r"token column 'text' holds string, not lists"):
        Dataset.from_path("p", parquet_dir, token_columns=["text"])
    with pytest.raises(DataError, match=r"has no column 'nope'"):
        Dataset.from_path("p", parquet_dir, columns=["nope"])


def test_a_file_with_two_columns_of_one_name_is_refused_at_open(tmp_path: Path) -> None:
    """pyarrow writes them without a word; read whole, a row kept the second and lost the
    first, and `columns=["text"]` failed at the first read with Arrow's bare KeyError."""
    path = tmp_path / "twice.parquet"
    columns = [pa.array(["first 0", "first 1"]), pa.array(["second 0", "second 1"])]
    pq.write_table(pa.Table.from_arrays([*columns, pa.array([0, 1])], ["text", "text", "id"]), path)
    for columns_ in (None, ["text"]):
        with pytest.raises(DataError, match=r"twice.parquet.*the file has 2 columns named 'text'"):
            Dataset.from_path("p", path, columns=columns_)
    assert Dataset.from_path("p", path, columns=["id"]).read_rows(0, [1]) == [{"id": 1}]


@pytest.mark.parametrize("name", ["doc_text", "doc.text"])
def test_a_column_named_with_a_dot_is_weighed_in_the_row_group_cache(
    tmp_path: Path, name: str
) -> None:
    """A leaf's top-level field was its path cut at the first dot: a column named "doc.text"
    weighed nothing, so the cache's byte bound never evicted its row groups."""
    groups, rows = 12, 20
    path = tmp_path / "a.parquet"
    table = pa.table({name: ["y" * 10_000] * (groups * rows), "id": list(range(groups * rows))})
    pq.write_table(table, path, row_group_size=rows, use_dictionary=False)
    options = {"parquet": {"row_group_cache_bytes": 1 << 20}}
    dataset = Dataset.from_path("d", path, columns=[name], io_options=options)
    for group in range(groups):
        assert dataset.read_rows(0, [group * rows]) == [{name: "y" * 10_000}]
    held = len(dataset._reader._groups)  # type: ignore[attr-defined]
    assert held <= 5, held  # 200 KB a group under a 1 MiB bound


def test_nanosecond_times_read_exactly_as_numpy_values(tmp_path: Path) -> None:
    """Python's datetime holds microseconds, and pyarrow refuses to cut nanoseconds without
    pandas: a shard with a nanosecond timestamp, duration or time column failed to read at
    all, even where only its text was used."""
    ticks = pa.array([1_700_000_000_123_456_789, None], pa.int64())
    table = pa.table(
        {
            "text": ["a", "b"],
            "at": ticks.cast(pa.timestamp("ns")),
            "took": pa.array([1_000_000_001, None], pa.int64()).cast(pa.duration("ns")),
            "when": pa.array([1_000_000_001, None], pa.int64()).cast(pa.time64("ns")),
        }
    )
    pq.write_table(table, tmp_path / "a.parquet")
    rows = Dataset.from_path("d", tmp_path / "a.parquet").read_rows(0, [0, 1])
    assert rows[0] == {
        "text": "a",
        "at": np.datetime64(1_700_000_000_123_456_789, "ns"),
        "took": np.timedelta64(1_000_000_001, "ns"),
        "when": np.timedelta64(1_000_000_001, "ns"),
    }
    assert rows[1] == {"text": "b", "at": None, "took": None, "when": None}


def test_nanosecond_times_inside_lists_and_structs_read_exactly(tmp_path: Path) -> None:
    """Only a top-level column of them was read: one in a list or struct made every row of
    its row group unreadable, naming none (a review)."""
    ns = pa.timestamp("ns")
    table = pa.table(
        {
            "text": ["a", "b", "c"],
            "times": pa.array([[0, 2001], None, []], pa.list_(ns)),
            "meta": pa.array(
                [{"n": 1, "took": 7}, None, {"n": 3, "took": None}],
                pa.struct([("n", pa.int32()), ("took", pa.duration("ns"))]),
            ),
            "seen": pa.array([[{"at": 9}], [None], None], pa.large_list(pa.struct([("at", ns)]))),
        }
    )
    pq.write_table(table, tmp_path / "a.parquet")
    rows = Dataset.from_path("d", tmp_path / "a.parquet").read_rows(0, [0, 1, 2])
    assert rows[0] == {
        "text": "a",
        "times": [np.datetime64(0, "ns"), np.datetime64(2001, "ns")],
        "meta": {"n": 1, "took": np.timedelta64(7, "ns")},
        "seen": [{"at": np.datetime64(9, "ns")}],
    }
    assert rows[1] == {"text": "b", "times": None, "meta": None, "seen": [None]}
    assert rows[2] == {"text": "c", "times": [], "meta": {"n": 3, "took": None}, "seen": None}


def test_a_truncated_parquet_file_raises_a_data_error_naming_dataset_and_shard(
    tmp_path: Path,
) -> None:
    path = tmp_path / "t.parquet"
    pq.write_table(table(), path)
    path.write_bytes(path.read_bytes()[:-100])
    with pytest.raises(DataError, match=r"not a readable Parquet file") as caught:
        Dataset.from_path("broken", path)
    assert (caught.value.dataset, caught.value.shard) == ("broken", str(path))


def test_a_shard_cut_short_after_the_open_says_it_changed_since(tmp_path: Path) -> None:
    """A shard truncated under an open dataset failed its next decode with pyarrow's "File too
    short" alone; the error now says the file changed since the open (a fresh-user trial)."""
    path = tmp_path / "t.parquet"
    pq.write_table(table(), path, row_group_size=32)
    dataset = Dataset.from_path("cut", path)
    assert dataset.read_rows(0, [0])[0]["id"] == 0
    size = path.stat().st_size
    with open(path, "r+b") as handle:
        handle.truncate(size // 2)
    with pytest.raises(DataError, match=r"cannot decode row group 6") as caught:
        dataset.read_rows(0, [COUNT - 1])
    said = f"the shard file is {size // 2} bytes now, {size} when the dataset was opened"
    assert said in str(caught.value)
    assert (caught.value.dataset, caught.value.shard) == ("cut", str(path))
    path.unlink()
    with pytest.raises(DataError, match=r"the shard file is gone now") as caught:
        dataset.read_rows(0, [COUNT - 33])


@pytest.mark.parametrize("occurrence", [0, 1])
def test_a_footer_name_that_is_not_utf8_is_a_data_error_naming_dataset_and_shard(
    tmp_path: Path, occurrence: int
) -> None:
    """One corrupt byte in a schema name (the first occurrence) or a column chunk's path (the
    second) raised a bare UnicodeDecodeError, from pyarrow or from our walk of the footer."""
    path = tmp_path / "t.parquet"
    pq.write_table(pa.table({"tokens": [[1], [2, 3]]}), path, store_schema=False)
    data = bytearray(path.read_bytes())
    footer = len(data) - 8 - int.from_bytes(data[-8:-4], "little")
    at = [i for i in range(footer, len(data)) if data[i : i + 6] == b"tokens"][occurrence]
    data[at + 3] = 0xE5  # b"tok\xe5ns"
    path.write_bytes(bytes(data))
    with pytest.raises(DataError, match=r"not a readable Parquet file") as caught:
        Dataset.from_path("broken", path)
    assert (caught.value.dataset, caught.value.shard) == ("broken", str(path))


@pytest.mark.parametrize("checksums", [True, False])
def test_a_flipped_byte_in_a_page_written_with_checksums_is_a_data_error(
    tmp_path: Path, checksums: bool
) -> None:
    ids = pa.array([list(range(i, i + 50)) for i in range(200)], type=pa.list_(pa.int32()))
    path = tmp_path / "t.parquet"
    pq.write_table(pa.table({"ids": ids}), path, compression="none", write_page_checksum=checksums)
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0x01  # inside the values: an id off by one, still a valid file
    path.write_bytes(bytes(data))
    dataset = Dataset.from_path("flipped", path, token_columns=["ids"])
    if not checksums:  # nothing to tell a flipped value from a stored one
        rows = dataset.read_rows(0, list(range(200)))
        assert sum(row["ids"].tolist() != list(range(i, i + 50)) for i, row in enumerate(rows)) == 1
        return
    with pytest.raises(DataError, match=r"CRC checksum verification failed") as caught:
        dataset.read_rows(0, [0])
    assert (caught.value.dataset, caught.value.shard) == ("flipped", str(path))


def test_eight_threads_reading_token_columns_see_what_one_thread_sees(parquet_dir: Path) -> None:
    assert_threads_read_like_one(
        lambda: Dataset.from_path("p", parquet_dir, columns=["id", "ids"], token_columns=["ids"])
    )


def test_a_pickled_dataset_keeps_its_projection(parquet_dir: Path) -> None:
    dataset = Dataset.from_path("p", parquet_dir, columns=["ids"], token_columns=["ids"])
    before = [plain(row) for row in dataset.read_rows(0, [3, 4])]
    copy = pickle.loads(pickle.dumps(dataset))
    assert [plain(row) for row in copy.read_rows(0, [3, 4])] == before


def test_a_dotted_column_name_beside_a_struct_reads_only_that_column(tmp_path: Path) -> None:
    """pyarrow also reads "meta.src" as a path into the struct "meta": the rows carried the
    struct too, a field the projection should have left out (pandas.json_normalize writes
    such names)."""
    table = pa.table(
        {
            "meta": pa.array([{"src": "in the struct", "n": 1}] * 3),
            "meta.src": ["a column of its own"] * 3,
            "text": ["hello"] * 3,
        }
    )
    pq.write_table(table, tmp_path / "a.parquet")
    dataset = Dataset.from_path("p", tmp_path, columns=["meta.src"])
    assert dataset.read_rows(0, [0, 2]) == [{"meta.src": "a column of its own"}] * 2
