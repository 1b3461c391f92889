"""Format detection across all formats, and projection arguments (JSONL included)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from tests.unit.io.test_io_formats_writers import sample_rows, write_mds, write_vortex
from zephon_torch.errors import ConfigError, DataError
from zephon_torch.io import Dataset
from zephon_torch.io.formats import FILE_FORMATS, detect_format


def test_the_unknown_format_message_lists_every_supported_format(tmp_path: Path) -> None:
    (tmp_path / "a.jsonl").write_text('{"x": 1}\n')
    listed = ", ".join(repr(name) for name in FILE_FORMATS)
    assert FILE_FORMATS == ("jsonl", "litdata", "mds", "npy", "parquet", "vortex")
    with pytest.raises(ConfigError, match=rf"must be one of {listed}, got 'csv'"):
        Dataset.from_path("d", tmp_path, format="csv")


@pytest.mark.parametrize(
    ("name", "expected"),
    [("x.vortex", "vortex"), ("x.NPY", "npy"), ("x.parquet", "parquet"), ("x.json.zst", "jsonl")],
)
def test_file_endings_tell_the_format(name: str, expected: str) -> None:
    assert detect_format(name) == expected


def test_a_folder_mixing_vortex_and_parquet_is_refused(tmp_path: Path) -> None:
    data = pa.table({"x": [1, 2]})
    pq.write_table(data, tmp_path / "a.parquet")
    write_vortex(tmp_path / "b.vortex", data)
    with pytest.raises(ConfigError, match=r"mixes formats \(parquet: 1 files.*vortex: 1 files"):
        Dataset.from_path("d", tmp_path)


def test_mds_datasets_in_subfolders_are_refused_with_the_folders_named(tmp_path: Path) -> None:
    for split in ("train", "val"):
        write_mds(tmp_path / split, sample_rows(3), {"id": "int"})
    with pytest.raises(ConfigError, match=r"holds 2 MDS/LitData datasets in subfolders.*train"):
        Dataset.from_path("d", tmp_path)
    assert Dataset.from_path("d", tmp_path / "val").num_rows == 3


def test_a_jsonl_file_named_index_json_is_still_jsonl(tmp_path: Path) -> None:
    (tmp_path / "index.json").write_text('{"x": 1}\n{"x": 2}\n')
    dataset = Dataset.from_path("d", tmp_path)
    assert (dataset.format, dataset.num_rows) == ("jsonl", 2)


@pytest.mark.parametrize("damage", ["cut short", "not an index", "nested too deeply"])
def test_a_damaged_mds_index_is_not_read_as_jsonl(tmp_path: Path, damage: str) -> None:
    """An index nested too deeply for Python's JSON parser was a bare RecursionError."""
    write_mds(tmp_path, sample_rows(3), {"id": "int"})
    index = tmp_path / "index.json"
    text = index.read_text()
    damaged = {
        "cut short": text[: len(text) // 2],
        "not an index": '{"version": 2}',
        "nested too deeply": '{"shards": ' + "[" * 100_000 + "]" * 100_000 + "}",
    }
    index.write_text(damaged[damage])
    # damaged data, not a setting: a DataError naming the dataset and the index (a ConfigError
    # naming neither before)
    with pytest.raises(DataError, match=r"does not read as an MDS or LitData index") as caught:
        Dataset.from_path("d", tmp_path)
    assert (caught.value.dataset, caught.value.shard) == ("d", str(index))
    # asked for by name, it said the folder held no index.json at all
    with pytest.raises(DataError, match=r"index.json does not read as an MDS") as caught:
        Dataset.from_path("d", tmp_path, format="mds")
    assert (caught.value.dataset, caught.value.shard) == ("d", str(index))


@pytest.fixture
def jsonl_file(tmp_path: Path) -> Path:
    path = tmp_path / "a.jsonl"
    path.write_text('{"text": "a", "ids": [1, 2], "n": 1}\n{"text": "b", "ids": [], "n": 2}\n')
    return path


def test_jsonl_rows_keep_only_the_projected_columns_with_token_arrays(jsonl_file: Path) -> None:
    dataset = Dataset.from_path("d", jsonl_file, columns=["ids", "text"], token_columns=["ids"])
    rows = dataset.read_rows(0, [1, 0])
    assert [list(row) for row in rows] == [["ids", "text"], ["ids", "text"]]
    assert [row["ids"].tolist() for row in rows] == [[], [1, 2]]
    assert rows[1]["ids"].dtype == np.int64


def test_a_jsonl_row_without_a_projected_field_names_the_row(jsonl_file: Path) -> None:
    dataset = Dataset.from_path("d", jsonl_file, columns=["text", "missing"])
    with pytest.raises(DataError, match=r"has no field 'missing'") as caught:
        dataset.read_rows(0, [1])
    assert caught.value.row == 1
    with pytest.raises(DataError, match=r"token column 'text': expected a list of token ids"):
        Dataset.from_path("d", jsonl_file, token_columns=["text"]).read_rows(0, [0])


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"columns": "text"}, r"`columns` must be a list of non-empty column names"),
        ({"columns": []}, r"`columns` must name at least one column"),
        ({"columns": ["a", "a"]}, r"must not repeat a column"),
        ({"columns": ["a"], "token_columns": ["b"]}, r"`token_columns` must be among `columns`"),
    ],
)
def test_bad_projection_arguments_are_refused(
    jsonl_file: Path, kwargs: dict[str, Any], message: str
) -> None:
    with pytest.raises(ConfigError, match=message):
        Dataset.from_path("d", jsonl_file, **kwargs)


@pytest.mark.parametrize("how", ["directory", "glob", "file"])
def test_a_named_pipe_or_a_dangling_link_among_the_data_is_refused_not_opened(
    tmp_path: Path, how: str
) -> None:
    """A folder's walk kept a named pipe, whose open waited for a writer for ever, and a glob
    dropped it (and a link to nothing) without a word."""
    import os

    (tmp_path / "a.jsonl").write_text('{"x": 1}\n')
    (tmp_path / "README").write_text("not data, left out by its name")
    os.mkfifo(tmp_path / "b.jsonl")
    path = {"directory": tmp_path, "glob": tmp_path / "*.jsonl", "file": tmp_path / "b.jsonl"}
    with pytest.raises(ConfigError, match=r"b\.jsonl' is not a regular file \(a named pipe\)"):
        Dataset.from_path("d", path[how])
    os.unlink(tmp_path / "b.jsonl")
    os.symlink(tmp_path / "gone.jsonl", tmp_path / "c.jsonl")
    with pytest.raises(ConfigError, match=r"c\.jsonl' is not a regular file \(a link to a file th"):
        Dataset.from_path("d", tmp_path if how == "directory" else tmp_path / "*.jsonl")
    os.unlink(tmp_path / "c.jsonl")
    assert Dataset.from_path("d", path["glob"]).num_rows == 1
    if how == "directory":  # an index.json is opened to look for datasets in subfolders
        (tmp_path / "sub").mkdir()
        os.mkfifo(tmp_path / "sub" / "index.json")
        with (
            pytest.warns(UserWarning, match=r"'index.json'; if they hold metadata"),
            pytest.raises(ConfigError, match=r"index\.json' is not a regular file"),
        ):
            Dataset.from_path("d", tmp_path)


def _lines(start: int, count: int) -> bytes:
    return b"".join(b'{"text": "doc %d"}\n' % i for i in range(start, start + count))


def test_every_shard_of_a_folder_is_read_or_named_as_left_out(tmp_path: Path) -> None:
    """A folder of `.jsonl.zst`, `.jsonl.zstd`, `.jsonl.bz2`, ... read the first alone and
    dropped the rest without a word (80% of the rows in a review's run); `.pq` and `.parq`
    Parquet files likewise."""
    import bz2
    import gzip
    import warnings

    import zstandard

    (tmp_path / "part-0.jsonl.zst").write_bytes(zstandard.compress(_lines(0, 10)))
    (tmp_path / "part-1.jsonl.zstd").write_bytes(zstandard.compress(_lines(10, 10)))
    (tmp_path / "part-2.jsonl.gzip").write_bytes(gzip.compress(_lines(20, 10)))
    (tmp_path / "part-3.jsonl.bz2").write_bytes(bz2.compress(_lines(30, 10)))
    (tmp_path / "part-4.arrow").write_bytes(b"ARROW1")
    (tmp_path / "README.md").write_text("# notes\n")  # notes beside data: left out quietly
    (tmp_path / "LICENSE").write_text("CC-BY\n")
    with pytest.warns(UserWarning) as caught:
        dataset = Dataset.from_path("web", tmp_path)
    assert (len(dataset.shards), dataset.num_rows) == (3, 30)
    assert [row["text"] for row in dataset.read_rows(1, [0, 9])] == ["doc 10", "doc 19"]
    [said] = [str(w.message) for w in caught]
    assert "2 file(s) whose names end in no format it reads are left out: " in said
    assert "'part-3.jsonl.bz2', 'part-4.arrow' (it reads JSON Lines" in said
    assert caught[0].filename == __file__  # the user's from_path line
    assert "README" not in said and "LICENSE" not in said
    parquet = tmp_path / "parquet"
    parquet.mkdir()
    for number, ending in enumerate([".parquet", ".pq", ".parq"]):
        table = pa.table({"text": [f"p{number}-{i}" for i in range(4)]})
        pq.write_table(table, parquet / f"part-{number}{ending}")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        found = Dataset.from_path("pq", parquet)
    assert (found.format, len(found.shards), found.num_rows) == ("parquet", 3, 12)


@pytest.mark.parametrize("codec", ["bz2", "lzma"])
def test_a_shard_compressed_as_no_reader_reads_is_a_data_error_saying_so(
    tmp_path: Path, codec: str
) -> None:
    """Read with `format="jsonl"`, a `.jsonl.bz2` or `.jsonl.xz` shard was taken for plain
    text: its first "row" was malformed JSON asking whether the file was cut short, and under
    `bad_rows="skip"` a shard of 200 rows went as 2 skipped malformed ones."""
    import importlib

    (tmp_path / "part-0.jsonl").write_bytes(_lines(0, 10))
    packed = importlib.import_module(codec).compress(_lines(10, 10))
    (tmp_path / "part-1.jsonl.packed").write_bytes(packed)
    with pytest.raises(DataError, match=r"is (bz2|xz)-compressed.*recompress it with gzip or zstd"):
        Dataset.from_path("web", tmp_path, format="jsonl")


@pytest.mark.parametrize("left", ["0-index.json", "0.index.json"])
def test_a_litdata_folder_whose_write_did_not_merge_its_index_is_refused(
    tmp_path: Path, left: str
) -> None:
    """Left with a per-node `0-index.json` or per-rank `0.index.json` (optimize merges them
    into index.json as it ends), the folder read as JSON Lines: the index one "document",
    its chunks dropped."""
    from tests.unit.io.test_io_formats_writers import write_litdata

    write_litdata(tmp_path, sample_rows(6))
    (tmp_path / "index.json").rename(tmp_path / left)
    with pytest.raises(ConfigError, match=rf"but no index.json: only a write's .*\({left}\)"):
        Dataset.from_path("lit", tmp_path)


def test_a_file_beside_its_compressed_copy_is_warned_of(tmp_path: Path) -> None:
    """`gzip -k` leaves both: every row read twice, without a word."""
    import gzip

    (tmp_path / "train.jsonl").write_bytes(_lines(0, 10))
    (tmp_path / "train.jsonl.gz").write_bytes(gzip.compress(_lines(0, 10)))
    with pytest.warns(UserWarning, match=r"'train.jsonl' and 'train.jsonl.gz' differ only by a "):
        assert Dataset.from_path("twice", tmp_path).num_rows == 20


def test_json_files_beside_json_lines_are_warned_of_and_a_json_document_is_named(
    tmp_path: Path,
) -> None:
    """A one-line `stats.json` beside the data became a training row without a word; a
    pretty-printed JSON array read as JSON Lines failed with a bare "malformed JSON"."""
    import json
    import warnings

    (tmp_path / "data.jsonl").write_bytes(_lines(0, 3))
    (tmp_path / "stats.json").write_text(json.dumps({"num_docs": 3, "text": "not a document"}))
    with pytest.warns(UserWarning, match=r"1 .json file\(s\) are read as JSON Lines beside its "):
        assert Dataset.from_path("a", tmp_path).num_rows == 4
    array = tmp_path / "array"
    array.mkdir()
    (array / "data.json").write_text(json.dumps([{"text": "x"}, {"text": "y"}], indent=2))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        dataset = Dataset.from_path("b", array)  # .json alone: JSON Lines, no warning
    # the array's bracket, an object's brace, an indented field: each row says what it is
    for row in (0, 1, 2):
        with pytest.raises(DataError, match=r"looks like one JSON document over many lines"):
            dataset.read_rows(0, [row])


def test_a_file_of_lines_ended_by_carriage_returns_alone_is_named(tmp_path: Path) -> None:
    """A file whose lines end with a carriage return alone (old Mac endings) is one JSON Lines
    row: its error said "Extra data" and no more (a fuzz of odd files)."""
    (tmp_path / "mac.jsonl").write_bytes(b'{"text": "a"}\r{"text": "b"}\r{"text": "c"}\r')
    dataset = Dataset.from_path("mac", tmp_path)
    assert dataset.num_rows == 1
    with pytest.raises(DataError, match=r"Extra data.*ended by \\r alone \(old Mac endings\)"):
        dataset.read_rows(0, [0])
    # a line that fails for another reason gets no such hint; \r\n endings read as lines
    (tmp_path / "mac.jsonl").write_bytes(b'{"text": "a"}\r\n{"text": \r\n')
    dataset = Dataset.from_path("crlf", tmp_path)
    assert dataset.read_rows(0, [0]) == [{"text": "a"}]
    with pytest.raises(DataError, match=r"malformed JSON") as raised:
        dataset.read_rows(0, [1])
    assert "Mac" not in str(raised.value)
