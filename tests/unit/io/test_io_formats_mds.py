"""MDS datasets written by mosaicml-streaming's MDSWriter, read natively: detection, row counts
from the index, projections, every encoding and compression, threads and pickling."""

from __future__ import annotations

import json
import pickle
from decimal import Decimal
from pathlib import Path

import numpy as np
import pytest

from tests.unit.io.test_io_formats_writers import (
    MDS_COLUMNS,
    MDS_ROWS,
    assert_threads_read_like_one,
    plain,
    write_mds,
)
from zephon_torch.errors import ConfigError, DataError
from zephon_torch.io import Dataset


@pytest.fixture(scope="module", params=[None, "zstd"], ids=["plain", "zstd"])
def mds_dir(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("mds") / "data"
    return write_mds(out, MDS_ROWS, MDS_COLUMNS, compression=request.param, size_limit=1500)


def test_a_directory_with_an_mds_index_is_detected_and_every_row_reads_back(
    mds_dir: Path,
) -> None:
    dataset = Dataset.from_path("m", mds_dir)
    assert dataset.format == "mds"
    assert len(dataset.shards) > 3
    index = json.loads((mds_dir / "index.json").read_text())
    assert [shard.num_rows for shard in dataset.shards] == [s["samples"] for s in index["shards"]]
    read = [
        plain(row)
        for number, shard in enumerate(dataset.shards)
        for row in dataset.read_rows(number, range(shard.num_rows))
    ]
    assert read == [plain(row) for row in MDS_ROWS]


def test_the_index_file_itself_and_format_mds_open_the_same_dataset(mds_dir: Path) -> None:
    by_dir = Dataset.from_path("m", mds_dir)
    assert Dataset.from_path("m", mds_dir / "index.json").shards == by_dir.shards
    assert Dataset.from_path("m", mds_dir, format="mds").shards == by_dir.shards
    with pytest.raises(ConfigError, match=r"`format` is 'litdata' but .* holds a mds index"):
        Dataset.from_path("m", mds_dir, format="litdata")


def test_format_mds_on_anything_but_an_index_folder_is_refused(tmp_path: Path) -> None:
    (tmp_path / "a.jsonl").write_text('{"x": 1}\n')
    with pytest.raises(ConfigError, match=r"`format` is 'mds' but .* holds no mds index.json"):
        Dataset.from_path("m", tmp_path, format="mds")
    with pytest.raises(ConfigError, match=r"`path` must be a directory holding index.json"):
        Dataset.from_path("m", tmp_path / "a.jsonl", format="mds")


@pytest.mark.parametrize("compression", [None, "zstd"])
def test_shards_without_their_index_json_are_named_as_such(
    tmp_path: Path, compression: str | None
) -> None:
    """MDSWriter's shards without the index.json it writes last (a writer killed, a copy of
    the shards only) were "no known extension; pass `format=`", which leads nowhere."""
    out = write_mds(tmp_path / "d", MDS_ROWS[:20], MDS_COLUMNS, compression=compression)
    (out / "index.json").unlink()
    with pytest.raises(ConfigError, match=r"look like MDS shards \('shard\.00000\.mds.*index"):
        Dataset.from_path("m", out)


def test_row_counts_come_from_the_index_without_reading_a_shard(
    mds_dir: Path, tmp_path: Path
) -> None:
    copy = tmp_path / "copy"
    copy.mkdir()
    for file in mds_dir.iterdir():
        # Shards emptied: only index.json holds anything.
        (copy / file.name).write_bytes(file.read_bytes() if file.name == "index.json" else b"")
    dataset = Dataset.from_path("m", copy)
    assert dataset.num_rows == len(MDS_ROWS)
    with pytest.raises(DataError) as caught:
        dataset.read_rows(0, [0])
    assert (caught.value.dataset, caught.value.shard) == ("m", dataset.shards[0].path)


def test_a_projection_returns_only_the_requested_columns_in_order(mds_dir: Path) -> None:
    dataset = Dataset.from_path("m", mds_dir, columns=["tokens", "id"], token_columns=["tokens"])
    [row] = dataset.read_rows(1, [2])
    assert list(row) == ["tokens", "id"]
    assert row["tokens"].dtype == np.int32 and row["tokens"].ndim == 1
    with pytest.raises(DataError) as caught:
        Dataset.from_path("m", mds_dir, columns=["nope"])
    assert caught.value.detail.startswith("has no column 'nope'; its columns are")
    assert caught.value.shard in (
        str(mds_dir / "shard.00000.mds"),
        str(mds_dir / "shard.00000.mds.zstd"),
    )


def test_a_shard_of_a_merged_index_without_a_column_is_the_one_named(tmp_path: Path) -> None:
    """Shards of other columns (an index merging two writers' outputs) were all named as the
    index, not the shard that lacks the column."""
    shards = []
    for sub, columns in (
        ("a", {"ids": "ndarray:uint16", "text": "str"}),
        ("b", {"ids": "ndarray:uint16"}),
    ):
        rows = [{"ids": np.arange(3, dtype=np.uint16), "text": f"t{i}"} for i in range(5)]
        written = write_mds(
            tmp_path / "root" / sub, [{k: r[k] for k in columns} for r in rows], columns
        )
        for shard in json.loads((written / "index.json").read_text())["shards"]:
            shard["raw_data"]["basename"] = f"{sub}/{shard['raw_data']['basename']}"
            shards.append(shard)
    (tmp_path / "root" / "index.json").write_text(json.dumps({"version": 2, "shards": shards}))
    assert Dataset.from_path("m", tmp_path / "root", columns=["ids"]).num_rows == 10
    with pytest.raises(DataError, match="has no column 'text'") as caught:
        Dataset.from_path("m", tmp_path / "root", columns=["ids", "text"])
    assert caught.value.shard == str(tmp_path / "root" / "b" / "shard.00000.mds")


def test_a_token_column_of_floats_is_refused_at_the_open(tmp_path: Path) -> None:
    """MDS arrays of floats were read as token columns (Parquet and JSONL refuse them)."""
    rows = [{"ids": np.arange(3, dtype=np.float32)} for _ in range(4)]
    out = write_mds(tmp_path / "f", rows, {"ids": "ndarray:float32"})
    with pytest.raises(
        DataError,
        match=r"token column 'ids' has encoding 'ndarray:float32', not an ndarray of integer ids",
    ) as caught:
        Dataset.from_path("m", out, token_columns=["ids"])
    assert caught.value.shard == str(out / "shard.00000.mds")


def test_a_token_column_of_an_ndarray_without_a_dtype_refuses_a_row_of_floats(
    tmp_path: Path,
) -> None:
    """An `ndarray` column states no dtype, so its rows are checked as read: a row of floats
    came back as a float array, where every other format refuses it as token ids."""
    rows = [{"ids": np.array([1.5, 2.5], np.float32)}, {"ids": np.arange(3, dtype=np.int32)}]
    out = write_mds(tmp_path / "any", rows, {"ids": "ndarray"})
    dataset = Dataset.from_path("m", out, token_columns=["ids"])
    assert dataset.read_rows(0, [1])[0]["ids"].tolist() == [0, 1, 2]
    with pytest.raises(
        DataError, match=r"token column 'ids' .* dtype float32, not a 1-D"
    ) as caught:
        dataset.read_rows(0, [1, 0])
    assert caught.value.row == 0


def test_a_column_left_out_is_never_decoded(tmp_path: Path) -> None:
    rows = [{"text": f"t{i}", "blob": {"i": i}} for i in range(5)]
    out = write_mds(tmp_path / "pkl", rows, {"text": "str", "blob": "pkl"})
    with pytest.raises(DataError, match=r"column 'blob' has encoding 'pkl', which is not read"):
        Dataset.from_path("m", out)
    dataset = Dataset.from_path("m", out, columns=["text"])
    assert dataset.read_rows(0, range(5)) == [{"text": row["text"]} for row in rows]


def test_every_scalar_and_array_encoding_reads_back_as_written(tmp_path: Path) -> None:
    columns = {
        "b": "bytes",
        "j": "json",
        "f": "float32",
        "u": "uint8",
        "si": "str_int",
        "sd": "str_decimal",
        "any": "ndarray",
        "fixed": "ndarray:int16:2,3",
        "wide": "ndarray:int64",
    }
    rows = [
        {
            "b": bytes([i, 255]),
            "j": {"k": [i, None]},
            "f": np.float32(i / 4),
            "u": np.uint8(i),
            "si": 10**30 + i,
            "sd": Decimal(f"{i}.25"),
            "any": np.arange(1, 2 + i, dtype=np.uint16).reshape(1, -1),
            "fixed": np.full((2, 3), -i, np.int16),
            "wide": np.arange(i + 1, dtype=np.int64) * 2**40,
        }
        for i in range(6)
    ]
    dataset = Dataset.from_path("m", write_mds(tmp_path / "all", rows, columns))
    read = dataset.read_rows(0, range(6))
    assert [plain(row) for row in read] == [
        plain({**row, "f": float(row["f"]), "u": int(row["u"])}) for row in rows
    ]
    assert type(read[0]["f"]) is float and type(read[0]["si"]) is int
    assert not read[3]["wide"].flags.writeable


def test_a_token_column_must_be_a_one_dimensional_array(mds_dir: Path) -> None:
    with pytest.raises(DataError, match=r"token column 'text' has encoding 'str'"):
        Dataset.from_path("m", mds_dir, token_columns=["text"])


@pytest.mark.parametrize("compression", ["gz", "bz2", "br", "snappy", "zstd:7"])
def test_every_mds_compression_reads_back(tmp_path: Path, compression: str) -> None:
    out = write_mds(
        tmp_path / "c", MDS_ROWS[:40], MDS_COLUMNS, compression=compression, size_limit=800
    )
    dataset = Dataset.from_path("m", out)
    assert len(dataset.shards) > 1
    read = [
        plain(row)
        for number, shard in enumerate(dataset.shards)
        for row in dataset.read_rows(number, range(shard.num_rows))
    ]
    assert read == [plain(row) for row in MDS_ROWS[:40]]


def test_shards_that_are_symlinks_to_files_elsewhere_still_read(tmp_path: Path) -> None:
    out = write_mds(tmp_path / "m", MDS_ROWS, MDS_COLUMNS, size_limit=1500)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (out / "shard.00000.mds").rename(elsewhere / "shard.00000.mds")
    (out / "shard.00000.mds").symlink_to(elsewhere / "shard.00000.mds")
    dataset = Dataset.from_path("m", out)
    assert dataset.shards[0].path == str(out / "shard.00000.mds")
    assert plain(dataset.read_rows(0, [0])[0]) == plain(MDS_ROWS[0])


def test_an_empty_shard_written_before_an_oversized_first_sample_is_skipped(
    tmp_path: Path,
) -> None:
    """MDSWriter writes a shard of 0 samples when the first sample exceeds the size limit: the
    whole dataset was refused as holding an empty shard, which no user could remove."""
    rows = [{"text": "x" * 5000, "id": 0}] + [{"text": f"row {i}", "id": i} for i in range(1, 10)]
    out = write_mds(tmp_path / "m", rows, {"text": "str", "id": "int"}, size_limit=4096)
    assert json.loads((out / "index.json").read_text())["shards"][0]["samples"] == 0
    dataset = Dataset.from_path("m", out)
    read = [
        r for n, s in enumerate(dataset.shards) for r in dataset.read_rows(n, range(s.num_rows))
    ]
    assert read == rows


def test_eight_threads_reading_at_random_see_what_one_thread_sees(mds_dir: Path) -> None:
    assert_threads_read_like_one(lambda: Dataset.from_path("m", mds_dir))


def test_a_pickled_dataset_travels_without_its_shards_and_reads_the_same(mds_dir: Path) -> None:
    dataset = Dataset.from_path("m", mds_dir)
    before = [plain(row) for row in dataset.read_rows(2, [0, 1])]
    payload = pickle.dumps(dataset)
    assert len(payload) < 4096
    copy = pickle.loads(payload)
    assert [plain(row) for row in copy.read_rows(2, [0, 1])] == before
