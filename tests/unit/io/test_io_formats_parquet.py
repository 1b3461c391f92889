"""Parquet column projection, token columns and corrupt files."""

from __future__ import annotations

import pickle
from collections import OrderedDict
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


@pytest.mark.parametrize("groups", [300, 3000])
def test_rows_drawn_at_random_from_many_small_row_groups_decode_each_group_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, groups: int
) -> None:
    """Short documents make many row groups per shuffle window: as long as they fit the
    cache's byte bound, each is decoded once however the window's rows are drawn. A bound of
    1,024 groups as well decoded each of 3,000 groups (under 200 KiB of ids) 3 times."""
    from zephon_torch.io.parquet import ParquetReader

    per_group = 4
    table = pa.table({"ids": [[i, i + 1] for i in range(groups * per_group)]})
    pq.write_table(table, tmp_path / "part-0.parquet", row_group_size=per_group)
    decoded: list[int] = []
    decode = ParquetReader._decode

    def counted(self: ParquetReader, path: str, opened: object, group: int) -> object:
        decoded.append(group)
        return decode(self, path, opened, group)  # type: ignore[arg-type]

    monkeypatch.setattr(ParquetReader, "_decode", counted)
    dataset = Dataset.from_path("d", tmp_path, token_columns=["ids"])
    order = np.random.default_rng(0).permutation(groups * per_group)
    for start in range(0, len(order), 32):  # a chunk of 32 documents at a time
        rows = order[start : start + 32]
        got = dataset.read_rows(0, rows)
        assert [int(r["ids"][0]) for r in got] == rows.tolist()
    assert sorted(decoded) == list(range(groups))


def test_a_row_group_cache_too_small_for_the_window_is_reported_once(tmp_path: Path) -> None:
    import warnings

    from zephon_torch.io.parquet import ParquetReader

    groups, per_group = 300, 16
    table = pa.table({"x": list(range(groups * per_group))})
    path = str(tmp_path / "part-0.parquet")
    pq.write_table(table, path, row_group_size=per_group)
    # rows drawn at random within windows of 30 groups, window after window, as a shuffle
    # window of shards draws them; a cache of one group decodes one for almost every row
    window = 30 * per_group
    rng = np.random.default_rng(0)
    rows = np.concatenate(
        [start + rng.permutation(window) for start in range(0, groups * per_group, window)]
    )
    small = ParquetReader(dataset="web", max_row_group_bytes=1)
    with pytest.warns(UserWarning, match="dataset 'web': Parquet row groups are decoded again"):
        for start in range(0, len(rows), 8):
            small.read(path, rows[start : start + 8])
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # said once only
        for start in range(0, len(rows), 8):
            small.read(path, rows[start : start + 8])
    # in order, pass after pass, each group is decoded once a pass: nothing to report
    ordered = ParquetReader(dataset="web", max_row_group_bytes=1)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        for _ in range(4):
            for start in range(0, groups * per_group, 32):
                ordered.read(path, np.arange(start, min(start + 32, groups * per_group)))


def test_the_decode_log_stays_quiet_over_many_shuffled_passes_that_fit() -> None:
    """Each pass decodes every group once, its windows in a new order: the last window of a
    pass may come first in the next, re-decoding a few groups early, pass after pass."""
    from zephon_torch.io.parquet import _DecodeLog

    rng = np.random.default_rng(0)
    log = _DecodeLog()
    windows = [list(range(w, w + 30)) for w in range(0, 300, 30)]
    for _ in range(300):
        for window in rng.permutation(len(windows)):
            for group in rng.permutation(windows[window]):
                assert not log.again_soon(("part-0", int(group)))
    # a cache of 4 groups under the same windows, rows drawn at random in each, for 3 passes
    thrashing, cache, said = _DecodeLog(), OrderedDict[int, None](), []
    for _ in range(3):
        for window in rng.permutation(len(windows)):
            for group in rng.choice(windows[window], size=16 * 30):
                if int(group) in cache:
                    cache.move_to_end(int(group))
                    continue
                said.append(thrashing.again_soon(("part-0", int(group))))
                cache[int(group)] = None
                if len(cache) > 4:
                    cache.popitem(last=False)
    assert said.count(True) == 1


def test_the_decode_log_is_bounded_over_a_pass_of_many_groups() -> None:
    """It kept every group ever decoded: a pass over 10M row groups held 1.8 GB of it in
    each process. Now the last 65,536, and it still tells a cache that thrashes."""
    from zephon_torch.io.parquet import _DecodeLog

    log = _DecodeLog()
    limit = _DecodeLog._MAX_SEEN
    for group in range(limit + 5_000):
        assert not log.again_soon(("part-0", group))
    assert len(log._seen) == limit
    said = [log.again_soon(("part-1", group % 40)) for group in range(40 * 20)]
    assert said.count(True) == 1
    assert not log._seen  # nothing kept once it has said it


# -- big shards split into window blocks ----------------------------------------------------------


def _token_shards(
    folder: Path, shards: int, groups: int, per_group: int = 16, width: int = 64
) -> int:
    """`shards` Parquet files of `groups` row groups of `per_group` rows of `width` token ids
    (row i holds ids i, i+1, ... of its shard); returns one row group's `decoded_bytes`."""
    folder.mkdir(parents=True, exist_ok=True)
    for shard in range(shards):
        rows = [list(range(i, i + width)) for i in range(groups * per_group)]
        table = pa.table({"ids": pa.array(rows, type=pa.list_(pa.int32()))})
        pq.write_table(table, folder / f"part-{shard}.parquet", row_group_size=per_group)
    from zephon_torch.io.parquet import decoded_bytes

    return decoded_bytes(pq.ParquetFile(folder / "part-0.parquet").metadata.row_group(0))


def test_a_shard_above_the_block_size_is_split_into_runs_of_row_groups(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from zephon_torch.io import parquet

    group = _token_shards(tmp_path / "big", shards=1, groups=10)
    unsplit = Dataset.from_path("d", tmp_path / "big")
    assert unsplit.shards[0].blocks == ()
    assert "blocks_digest" not in unsplit.fingerprint()
    monkeypatch.setattr(parquet, "WINDOW_BLOCK_BYTES", 3 * group + group // 2)
    split = Dataset.from_path("d", tmp_path / "big")
    assert split.shards[0].blocks == (48, 48, 48, 16)  # 3 groups of 16 rows, then the rest
    assert split.fingerprint()["blocks_digest"] != ""
    assert split.fingerprint()["rows_digest"] == unsplit.fingerprint()["rows_digest"]
    # a group above the size stands alone; a shard of one group is never split
    monkeypatch.setattr(parquet, "WINDOW_BLOCK_BYTES", group // 2)
    assert Dataset.from_path("d", tmp_path / "big").shards[0].blocks == (16,) * 10
    _token_shards(tmp_path / "one", shards=1, groups=1)
    assert Dataset.from_path("d", tmp_path / "one").shards[0].blocks == ()


@pytest.mark.parametrize("split", [True, False])
def test_windows_of_blocks_decode_each_row_group_once_a_pass_where_windows_of_shards_thrash(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, split: bool
) -> None:
    """Two shards of 40 row groups of 128 rows, a window of 2 blocks (or shards) and a
    row-group cache of 32 groups: blocks of 4 groups keep the groups of the windows being read
    (chunks of up to 256 rows, two at a time, so at most two windows of 8 groups) in the
    cache, and each group is decoded once a pass; windows of two whole shards (80 groups)
    decode groups again and again."""
    from zephon_torch import Pipeline
    from zephon_torch.io import parquet
    from zephon_torch.io.parquet import GROUP_OVERHEAD, ParquetReader
    from zephon_torch.work import StaticMixtureWorkSource

    per_group, width = 128, 8
    group = _token_shards(tmp_path / "data", shards=2, groups=40, per_group=per_group, width=width)
    if split:
        monkeypatch.setattr(parquet, "WINDOW_BLOCK_BYTES", 4 * group + group // 2)
    decoded: list[tuple[str, int]] = []
    decode = ParquetReader._decode

    def counted(self: ParquetReader, path: str, opened: object, number: int) -> object:
        decoded.append((path, number))
        return decode(self, path, opened, number)  # type: ignore[arg-type]

    monkeypatch.setattr(ParquetReader, "_decode", counted)
    # a group's decoded ids and offsets, and its objects
    weight = per_group * width * 4 + (per_group + 1) * 8 + GROUP_OVERHEAD
    cache = {"parquet": {"row_group_cache_bytes": 32 * weight}}
    dataset = Dataset.from_path("d", tmp_path / "data", token_columns=["ids"], io_options=cache)
    assert [len(s.blocks) for s in dataset.shards] == ([10, 10] if split else [0, 0])
    source = StaticMixtureWorkSource([dataset], seed=5, exhaustion="stop", shuffle_window_shards=2)
    pipeline = Pipeline(source).pretokenized("ids").pack_flat(256).batch(2)
    firsts = []
    for batch in pipeline:
        ids = batch.input_ids.reshape(-1, width)[: batch.num_tokens // width]
        firsts += ids[:, 0].tolist()
    assert sorted(firsts) == sorted(list(range(40 * per_group)) * 2)  # every row once
    every_group = [
        (str(p), g) for p in sorted((tmp_path / "data").glob("*.parquet")) for g in range(40)
    ]
    if split:
        assert sorted(decoded) == every_group
    else:
        assert len(decoded) > 10 * len(every_group)


def test_a_row_group_is_weighed_by_its_decoded_token_arrays_plus_its_other_columns(
    tmp_path: Path,
) -> None:
    """A token column counts once, by its decoded arrays: counting its footer size as well
    made a window of token shards weigh twice what it holds."""
    from zephon_torch.io.parquet import GROUP_OVERHEAD

    table = pa.table(
        {
            "ids": pa.array([[i] * 100 for i in range(50)], pa.list_(pa.int32())),
            "text": [f"row {i} " * 20 for i in range(50)],
        }
    )
    pq.write_table(table, tmp_path / "part-0.parquet", row_group_size=50)
    column = pq.ParquetFile(tmp_path / "part-0.parquet").metadata.row_group(0).column(1)
    assert column.path_in_schema == "text"
    ids_bytes = 50 * 100 * 4 + 51 * 8 + GROUP_OVERHEAD  # values, offsets and objects
    for columns, expected in (
        (["ids"], ids_bytes),
        (["ids", "text"], ids_bytes + column.total_uncompressed_size),
    ):
        dataset = Dataset.from_path("d", tmp_path, columns=columns, token_columns=["ids"])
        dataset.read_rows(0, [7])
        groups = dataset._reader._groups  # type: ignore[attr-defined]
        assert groups._current().weight == expected


def test_decoded_bytes_count_dictionary_encoded_token_ids_at_their_width(tmp_path: Path) -> None:
    """Dictionary-encoded ids take a few bits each in the pages (2 bytes below 65,536) and 4
    as int32 arrays: window blocks sized by the pages held twice what they should and
    thrashed the cache."""
    from zephon_torch.io.parquet import decoded_bytes

    rng = np.random.default_rng(0)
    ids = rng.integers(0, 1000, size=(400, 500), dtype=np.int32)
    table = pa.table(
        {
            "ids": pa.array(list(ids), pa.list_(pa.int32())),
            "text": [f"document {i}" for i in range(400)],
        }
    )
    pq.write_table(table, tmp_path / "part-0.parquet", compression="none")
    group = pq.ParquetFile(tmp_path / "part-0.parquet").metadata.row_group(0)
    assert group.total_byte_size < 0.5 * ids.nbytes  # the pages fall short
    text = group.column(1).total_uncompressed_size
    assert decoded_bytes(group) == ids.nbytes + text


def test_a_pipeline_over_split_shards_resumes_exactly_at_every_step_and_refuses_old_states(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from tests.helpers import assert_resumes_at_every_step
    from zephon_torch import Pipeline
    from zephon_torch.errors import ZephonError
    from zephon_torch.io import parquet
    from zephon_torch.work import StaticMixtureWorkSource

    group = _token_shards(tmp_path / "data", shards=3, groups=6, per_group=4, width=5)
    unsplit = Dataset.from_path("d", tmp_path / "data", token_columns=["ids"])
    monkeypatch.setattr(parquet, "WINDOW_BLOCK_BYTES", 2 * group)
    split = Dataset.from_path("d", tmp_path / "data", token_columns=["ids"])
    assert [s.blocks for s in split.shards] == [(8, 8, 8)] * 3

    def build(dataset: Dataset = split) -> Pipeline:
        source = StaticMixtureWorkSource(
            [dataset], seed=4, exhaustion="repeat", shuffle_window_shards=2
        )
        pipeline = Pipeline(source).options(canonical_replicas=2)
        return pipeline.pretokenized("ids").pack_flat(12, "best_fit").batch(2)

    assert assert_resumes_at_every_step(build, max_steps=40) == 40  # past a pass (72 rows)
    # a state of the same files read before the split names another order: refused
    old = build(unsplit)
    next(iter(old))
    with pytest.raises(ZephonError, match=r"(?s)does not match this pipeline.*blocks_digest"):
        build().load_state_dict(old.state_dict())


def test_empty_row_groups_join_a_block_and_never_make_one_of_their_own(tmp_path: Path) -> None:
    from zephon_torch.io.parquet import WINDOW_BLOCK_BYTES, group_sizes, window_blocks

    big = WINDOW_BLOCK_BYTES  # each non-empty group fills a block alone
    assert window_blocks([(0, 14), (100, big), (100, big), (0, 14)]) == (100, 100)
    assert window_blocks([(100, big), (0, 14), (100, big), (100, big), (0, 14)]) == (
        100,
        100,
        100,
    )
    # a writer's last, empty, write makes an empty row group
    path = tmp_path / "part-0.parquet"
    table = pa.table({"n": list(range(30))})
    with pq.ParquetWriter(path, table.schema) as writer:
        for start in (0, 10, 20):
            writer.write_table(table.slice(start, 10))
        writer.write_table(table.slice(30, 0))
    groups = group_sizes(pq.ParquetFile(path).metadata)
    assert [rows for rows, _ in groups] == [10, 10, 10, 0]
    sized = [(rows, big if rows else 14) for rows, _ in groups]
    assert window_blocks(sized) == (10, 10, 10)


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
