"""Opening datasets: which files, which format, row counts, names and errors."""

from __future__ import annotations

import glob
import json
import os
import re
import shutil
import sys
import warnings
from pathlib import Path
from typing import Any

import pytest

from tests.helpers import bound_by_modes
from zephon_torch.errors import ConfigError, DataError
from zephon_torch.io import Dataset, Shard


@pytest.mark.parametrize(
    ("name", "compression"),
    [
        ("a.jsonl", None),
        ("a.ndjson", None),
        ("a.json", None),
        ("a.JSONL", None),
        ("a.jsonl.gz", "gzip"),
        ("a.ndjson.gz", "gzip"),
        ("a.jsonl.zst", "zstd"),
        ("a.json.zst", "zstd"),
    ],
)
def test_jsonl_endings_are_detected_with_or_without_compression(
    tmp_path: Path, write_jsonl: Any, name: str, compression: str | None
) -> None:
    path = write_jsonl(tmp_path / name, [{"i": i} for i in range(4)], compression=compression)
    dataset = Dataset.from_path("d", path)
    assert dataset.format == "jsonl"
    assert dataset.shards == (Shard(path=str(path), num_rows=4),)


def test_parquet_row_counts_come_from_the_footer(tmp_path: Path, write_parquet: Any) -> None:
    path = write_parquet(tmp_path / "a.parquet", [{"i": i} for i in range(25)], row_group_size=10)
    dataset = Dataset.from_path("d", path)
    assert (dataset.format, dataset.num_rows) == ("parquet", 25)


def test_a_directory_is_searched_recursively_in_path_order(
    tmp_path: Path, write_jsonl: Any
) -> None:
    for relative, count in [("b/2.jsonl", 2), ("a.jsonl", 1), ("b/1.jsonl.gz", 3)]:
        compression = "gzip" if relative.endswith(".gz") else None
        write_jsonl(tmp_path / "data" / relative, [{"x": 0}] * count, compression=compression)
    (tmp_path / "data" / "README.md").write_text("not data")
    (tmp_path / "data" / ".hidden.jsonl").write_text('{"x": 0}\n')
    dataset = Dataset.from_path("d", tmp_path / "data")
    names = [os.path.relpath(shard.path, tmp_path / "data") for shard in dataset.shards]
    assert names == ["a.jsonl", "b/1.jsonl.gz", "b/2.jsonl"]
    assert [shard.num_rows for shard in dataset.shards] == [1, 3, 2]
    assert all(os.path.isabs(shard.path) for shard in dataset.shards)


_OPEN_IN_A_CHILD = (
    "import sys; from zephon_torch.io import Dataset\n"
    "try:\n"
    "    print(Dataset.from_path('d', sys.argv[1]).num_rows)\n"
    "except OSError as error:\n"
    "    print(f'{type(error).__name__}: {error}')"
)


def test_a_folder_that_cannot_be_listed_is_an_error_not_rows_left_out(
    tmp_path: Path, write_jsonl: Any
) -> None:
    """`os.walk` leaves out a folder it cannot list: the dataset opened with the readable
    folder's 2 rows of 5, saying nothing. A file system's `lost+found` (root's alone) is
    left out still."""
    write_jsonl(tmp_path / "data" / "a" / "1.jsonl", [{"x": 0}] * 2)
    write_jsonl(tmp_path / "data" / "b" / "2.jsonl", [{"x": 0}] * 3)
    (tmp_path / "data" / "lost+found").mkdir()
    (tmp_path / "data" / "lost+found").chmod(0)
    cmd = [sys.executable, "-c", _OPEN_IN_A_CHILD, str(tmp_path / "data")]
    try:
        assert bound_by_modes(cmd).stdout.strip() == "5"
        (tmp_path / "data" / "b").chmod(0)
        for path in (tmp_path / "data", tmp_path / "data" / "**" / "*.jsonl"):
            said = bound_by_modes([*cmd[:-1], str(path)]).stdout.strip()
            assert said == f"PermissionError: [Errno 13] Permission denied: '{tmp_path}/data/b'"
    finally:
        for folder in ("b", "lost+found"):
            (tmp_path / "data" / folder).chmod(0o755)


def test_a_folder_reads_linked_folders_as_a_glob_does_each_once(
    tmp_path: Path, write_jsonl: Any
) -> None:
    """A linked folder's shards were left out of a folder's walk without a word (a `**` glob
    read them); a link back up, or a second link to one folder, must not read files twice,
    in a walk or a glob."""
    write_jsonl(tmp_path / "data" / "part1" / "a.jsonl", [{"x": 0}])
    write_jsonl(tmp_path / "store" / "part2" / "b.jsonl", [{"x": 0}] * 2)
    (tmp_path / "data" / "part2").symlink_to(tmp_path / "store" / "part2")
    (tmp_path / "data" / "again").symlink_to(tmp_path / "store" / "part2")
    (tmp_path / "data" / "part1" / "up").symlink_to(tmp_path / "data")
    walked = Dataset.from_path("d", tmp_path / "data")
    names = [os.path.relpath(shard.path, tmp_path / "data") for shard in walked.shards]
    assert names == ["again/b.jsonl", "part1/a.jsonl"]
    assert walked.num_rows == 3
    # a `**` glob followed the link up 40 times, and both links, never ending with the two
    globbed = Dataset.from_path("d", tmp_path / "data" / "**" / "*.jsonl")
    assert [shard.path for shard in globbed.shards] == [shard.path for shard in walked.shards]
    one_level = Dataset.from_path("d", tmp_path / "data" / "*" / "b.jsonl")
    assert [os.path.relpath(s.path, tmp_path / "data") for s in one_level.shards] == [
        "again/b.jsonl"
    ]


def test_a_glob_matches_as_glob_glob_does_around_links_and_hidden_folders(
    tmp_path: Path, write_jsonl: Any
) -> None:
    """Walking for `**` matched `data/*/**` to files right under `data` (a trailing `**`
    took no name), and a hidden link to a folder (`.latest -> v2`), entered first and not
    matched, kept the folder itself from being read; so did any link sorting first."""
    data = tmp_path / "data"
    for relative in ["stats.jsonl", "train/a.jsonl", "v2/b.jsonl", ".cache/c.jsonl"]:
        write_jsonl(data / relative, [{"x": 0}])
    (data / ".latest").symlink_to(data / "v2")

    def found(pattern: str) -> list[str]:
        dataset = Dataset.from_path("d", str(data / pattern))
        return [os.path.relpath(shard.path, data) for shard in dataset.shards]

    def globbed(pattern: str) -> list[str]:
        return sorted(
            os.path.relpath(m, data)
            for m in glob.glob(str(data / pattern), recursive=True)
            if os.path.isfile(m)
        )

    for pattern in ["*/**", "**/*.jsonl", "**", ".*/**", "**/.cache/*", "*/*.jsonl"]:
        assert found(pattern) == globbed(pattern), pattern
    assert found("*/**") == ["train/a.jsonl", "v2/b.jsonl"]
    # a link whose name sorts first (latest -> train) took the folder, and `**/train/*`
    # matched no file under `latest`: the folder's files were lost
    write_jsonl(data / "en" / "train" / "c.jsonl", [{"x": 0}])
    (data / "latest").symlink_to(data / "train")
    assert found("**/train/*.jsonl") == ["en/train/c.jsonl", "train/a.jsonl"]


def test_a_glob_picks_its_matches_across_folders(tmp_path: Path, write_jsonl: Any) -> None:
    for relative in ["x/1.jsonl", "y/2.jsonl", "y/3.ndjson"]:
        write_jsonl(tmp_path / relative, [{"x": 0}])
    dataset = Dataset.from_path("d", str(tmp_path / "**" / "*.jsonl"))
    assert [Path(shard.path).name for shard in dataset.shards] == ["1.jsonl", "2.jsonl"]


def test_a_file_url_reads_the_local_file(tmp_path: Path, write_jsonl: Any) -> None:
    path = write_jsonl(tmp_path / "a.jsonl", [{"x": 0}])
    assert Dataset.from_path("d", f"file://{path}").num_rows == 1


def test_format_overrides_detection_and_takes_every_visible_file(
    tmp_path: Path, write_jsonl: Any
) -> None:
    write_jsonl(tmp_path / "data" / "part-0.txt", [{"x": 0}])
    write_jsonl(tmp_path / "data" / "part-1", [{"x": 1}, {"x": 2}], compression="zstd")
    write_jsonl(tmp_path / "data" / "_SUCCESS", text="")
    write_jsonl(tmp_path / "data" / ".crc", text="junk")
    dataset = Dataset.from_path("d", tmp_path / "data", format="jsonl")
    assert [Path(shard.path).name for shard in dataset.shards] == ["part-0.txt", "part-1"]
    assert dataset.read_rows(1, [1]) == [{"x": 2}]


def test_an_index_cache_inside_the_data_folder_is_not_read_as_data(
    tmp_path: Path, write_jsonl: Any
) -> None:
    write_jsonl(tmp_path / "data" / "a.txt", [{"x": 0}])
    cache = str(tmp_path / "data" / "index")
    Dataset.from_path("d", tmp_path / "data", format="jsonl", index_cache_dir=cache)
    reopened = Dataset.from_path("d", tmp_path / "data", format="jsonl", index_cache_dir=cache)
    assert len(reopened.shards) == 1


def test_mixed_formats_in_a_directory_are_refused_with_each_listed(
    tmp_path: Path, write_jsonl: Any, write_parquet: Any
) -> None:
    write_jsonl(tmp_path / "a.jsonl", [{"x": 0}])
    write_parquet(tmp_path / "b.parquet", [{"x": 0}])
    with pytest.raises(ConfigError, match=r"mixes formats \(jsonl: 1 files.*parquet: 1 files"):
        Dataset.from_path("d", tmp_path)


def test_a_path_without_files_is_refused_by_name(tmp_path: Path) -> None:
    (tmp_path / "empty").mkdir()
    with pytest.raises(ConfigError, match=re.escape(f"no files found at {str(tmp_path)!r}")):
        Dataset.from_path("d", tmp_path)
    missing = str(tmp_path / "missing")
    with pytest.raises(ConfigError, match=re.escape(f"{missing!r}: the path does not exist")):
        Dataset.from_path("d", missing)
    with pytest.raises(ConfigError, match="no files found"):
        Dataset.from_path("d", str(tmp_path / "*.jsonl"))


def test_a_directory_of_unknown_endings_suggests_format(tmp_path: Path) -> None:
    (tmp_path / "notes.txt").write_text("{}\n")
    with pytest.raises(ConfigError, match=r"none of its 1 files .*pass `format=`"):
        Dataset.from_path("d", tmp_path)


def test_a_file_of_unknown_ending_needs_format(tmp_path: Path) -> None:
    path = tmp_path / "notes.txt"
    path.write_text('{"x": 1}\n')
    with pytest.raises(ConfigError, match=r"cannot tell the format of .*notes\.txt"):
        Dataset.from_path("d", path)
    assert Dataset.from_path("d", path, format="jsonl").num_rows == 1


def test_an_unknown_format_is_refused_with_the_supported_ones(
    tmp_path: Path, write_jsonl: Any
) -> None:
    path = write_jsonl(tmp_path / "a.jsonl", [{"x": 0}])
    with pytest.raises(
        ConfigError,
        match=r"one of 'jsonl', 'litdata', 'mds', 'npy', 'parquet', 'vortex', got 'csv'",
    ):
        Dataset.from_path("d", path, format="csv")


def test_a_url_of_an_unknown_protocol_is_refused() -> None:
    with pytest.raises(ConfigError, match=r"cannot open 'nosuchfs://bucket/data/'"):
        Dataset.from_path("d", "nosuchfs://bucket/data/")


@pytest.mark.parametrize("name", ["", None, 3])
def test_the_name_must_be_a_non_empty_str(tmp_path: Path, write_jsonl: Any, name: Any) -> None:
    path = write_jsonl(tmp_path / "a.jsonl", [{"x": 0}])
    with pytest.raises(ConfigError, match="`name` must be a non-empty str"):
        Dataset.from_path(name, path)
    with pytest.raises(ConfigError, match="`name` must be a non-empty str"):
        Dataset.from_dict(name, {"x": [1]})


@pytest.mark.parametrize("text", ["", "\n\n  \r\n"])
def test_an_empty_shard_names_the_dataset_and_the_shard(
    tmp_path: Path, write_jsonl: Any, text: str
) -> None:
    write_jsonl(tmp_path / "data" / "a.jsonl", [{"x": 0}])
    empty = write_jsonl(tmp_path / "data" / "b.jsonl", text=text)
    with pytest.raises(DataError, match="has no rows") as caught:
        Dataset.from_path("wiki", tmp_path / "data")
    assert (caught.value.dataset, caught.value.shard) == ("wiki", str(empty))
    assert "dataset 'wiki'" in str(caught.value)
    assert str(empty) in str(caught.value)


def test_an_empty_parquet_shard_gets_no_json_lines_hint(tmp_path: Path) -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq

    pq.write_table(pa.table({"text": pa.array([], pa.string())}), tmp_path / "only.parquet")
    with pytest.raises(DataError, match=r"has no rows; remove it") as caught:
        Dataset.from_path("p", tmp_path / "only.parquet")
    assert "JSON" not in str(caught.value) and "blank lines" not in str(caught.value)


def test_a_list_of_paths_is_a_config_error_pointing_to_a_glob(tmp_path: Path) -> None:
    """It was a bare TypeError from os.fspath (review H, F7)."""
    with pytest.raises(ConfigError, match=r"`path` of dataset 'd' must be one file, folder, "
                       r"glob or URL \(a str or path\), got a list: for several files, pass "
                       r"their folder or a glob"):  # fmt: skip
        Dataset.from_path("d", [str(tmp_path / "a.jsonl"), str(tmp_path / "b.jsonl")])  # type: ignore[arg-type]


def _write_table(path: Path, rows: int) -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq

    vortex = pytest.importorskip("vortex")  # vortex-data: Python 3.11+

    table = pa.table(
        {"text": [f"row {i}" for i in range(rows)]}, schema=pa.schema([("text", pa.string())])
    )
    path.parent.mkdir(parents=True, exist_ok=True)
    if path.suffix == ".parquet":
        pq.write_table(table, path)
    else:
        vortex.io.write(table, str(path))


@pytest.mark.parametrize("suffix", [".parquet", ".vortex"])
@pytest.mark.parametrize("where", ["local", "memory://"])
def test_empty_partition_files_of_a_table_folder_are_left_out_with_a_warning(
    tmp_path: Path, suffix: str, where: str
) -> None:
    """Spark, Dask and ParquetWriter write a complete file of no rows for an empty partition:
    the folder could not be opened at all (as an empty JSONL file, which may be damage, still
    cannot). Every file empty stays the error naming the first."""
    import uuid

    import fsspec

    folder = tmp_path / "data"
    for part, rows in enumerate([3, 0, 2, 0]):
        _write_table(folder / f"part-{part:05d}{suffix}", rows)
    url = str(folder)
    if where == "memory://":
        root = f"/zt-{uuid.uuid4().hex[:8]}"
        fsspec.filesystem("memory").put(str(folder), root, recursive=True)
        url = f"memory://{root}"
    options = {"cache": {"dir": str(tmp_path / "cache")}}
    with pytest.warns(UserWarning, match=r"2 of its 4 .* files hold no rows and are left out"):
        dataset = Dataset.from_path("spark", url, io_options=options)
    assert [shard.num_rows for shard in dataset.shards] == [3, 2]
    assert [re.sub(r".*/", "", shard.path) for shard in dataset.shards] == [
        f"part-00000{suffix}",
        f"part-00002{suffix}",
    ]
    rows = [row["text"] for n in range(2) for row in dataset.read_rows(n, [0, 1])]
    assert rows == ["row 0", "row 1", "row 0", "row 1"]
    nothing = tmp_path / "nothing"
    _write_table(nothing / f"a{suffix}", 0)
    _write_table(nothing / f"b{suffix}", 0)
    with pytest.raises(DataError, match="has no rows") as caught:
        Dataset.from_path("spark", nothing)
    assert caught.value.shard == str(nothing / f"a{suffix}")


def test_a_file_that_is_not_parquet_is_a_data_error(tmp_path: Path) -> None:
    path = tmp_path / "bad.parquet"
    path.write_bytes(b"not parquet at all")
    with pytest.raises(DataError, match="not a readable Parquet file") as caught:
        Dataset.from_path("d", path)
    assert caught.value.shard == str(path)


def test_fingerprint_is_json_data_that_follows_row_counts_and_names(
    tmp_path: Path, write_jsonl: Any
) -> None:
    write_jsonl(tmp_path / "a" / "0.jsonl", [{"x": 0}] * 3)
    write_jsonl(tmp_path / "b" / "0.jsonl", [{"y": 1}] * 3)
    write_jsonl(tmp_path / "c" / "0.jsonl", [{"x": 0}] * 4)
    write_jsonl(tmp_path / "d" / "1.jsonl", [{"x": 0}] * 3)
    prints = {key: Dataset.from_path("d", tmp_path / key).fingerprint() for key in "abcd"}
    assert json.loads(json.dumps(prints["a"])) == prints["a"]
    assert set(prints["a"]) == {"name", "format", "num_shards", "num_rows", "rows_digest"}
    assert prints["a"]["num_rows"] == 3
    assert re.fullmatch(r"[0-9a-f]{16}", prints["a"]["rows_digest"])
    # Same names and counts in another folder, with other content: same fingerprint.
    assert prints["a"] == prints["b"]
    assert prints["a"]["rows_digest"] != prints["c"]["rows_digest"]
    assert prints["a"]["rows_digest"] != prints["d"]["rows_digest"]


def test_fingerprint_tells_apart_shards_of_one_name_in_other_folders(
    tmp_path: Path, write_jsonl: Any
) -> None:
    """Only file names were digested: `lang=fr/part-0.jsonl` replaced by `lang=it/part-0.jsonl`
    of as many rows kept the fingerprint, and a state of the one resumed on the other without
    a word (fresh-user trial). Paths below the folder holding every shard are digested now;
    in one folder, file names, as before, and a moved tree keeps its fingerprint."""
    for root, folders in (("one", ("lang=fr", "lang=de")), ("two", ("lang=it", "lang=de"))):
        for folder in folders:
            write_jsonl(tmp_path / root / folder / "part-0.jsonl", [{"x": 0}] * 3)
    write_jsonl(tmp_path / "moved" / "deeper" / "lang=fr" / "part-0.jsonl", [{"x": 0}] * 3)
    write_jsonl(tmp_path / "moved" / "deeper" / "lang=de" / "part-0.jsonl", [{"x": 0}] * 3)
    write_jsonl(tmp_path / "flat" / "part-0.jsonl", [{"x": 0}] * 3)
    prints = {
        key: Dataset.from_path("d", tmp_path / key).fingerprint()
        for key in ("one", "two", "moved", "flat")
    }
    assert prints["one"]["rows_digest"] != prints["two"]["rows_digest"]
    assert prints["one"] == prints["moved"]
    single = Dataset.from_path("d", tmp_path / "one" / "lang=fr").fingerprint()
    assert single == prints["flat"]  # one folder: its file names, as before
    # the digest of a flat folder is what earlier releases wrote: their states still load
    assert prints["flat"]["rows_digest"] == "dd25b656e0ac9c08"
    # a resume says what the differing digest means (it showed two hex strings: trial C)
    from zephon_torch import Pipeline, StateMismatchError
    from zephon_torch.work import StaticMixtureWorkSource

    def pipeline(root: str) -> Pipeline:
        source = StaticMixtureWorkSource([Dataset.from_path("d", tmp_path / root)])
        return Pipeline(source).pretokenized("x").pack_flat(4).batch(1)

    state = pipeline("one").state_dict()
    with pytest.raises(StateMismatchError, match=r"dataset\.d: as many shards and rows, in other"):
        pipeline("two").load_state_dict(state)
    pipeline("moved").load_state_dict(state)


def test_repr_is_short(tmp_path: Path, write_jsonl: Any) -> None:
    write_jsonl(tmp_path / "0.jsonl", [{"x": 0}] * 3)
    write_jsonl(tmp_path / "1.jsonl", [{"x": 0}] * 4)
    dataset = Dataset.from_path("wiki", tmp_path)
    assert repr(dataset) == "Dataset(name='wiki', format='jsonl', shards=2, rows=7)"


def test_from_dict_takes_columns_or_rows() -> None:
    by_columns = Dataset.from_dict("d", {"a": [1, 2, 3], "b": ["x", "y", "z"]})
    by_rows = Dataset.from_dict("d", [{"a": 1, "b": "x"}, {"a": 2, "b": "y"}, {"a": 3, "b": "z"}])
    for dataset in (by_columns, by_rows):
        assert (dataset.format, dataset.num_rows, len(dataset.shards)) == ("memory", 3, 1)
        assert dataset.read_rows(0, [2, 0]) == [{"a": 3, "b": "z"}, {"a": 1, "b": "x"}]
    assert by_columns.shards == (Shard(path="memory://d/0", num_rows=3),)


def test_from_dict_splits_into_shards_of_shard_size() -> None:
    dataset = Dataset.from_dict("d", {"i": list(range(10))}, shard_size=4)
    assert [shard.num_rows for shard in dataset.shards] == [4, 4, 2]
    assert [shard.path for shard in dataset.shards] == [f"memory://d/{i}" for i in range(3)]
    assert dataset.read_rows(2, [1]) == [{"i": 9}]


def test_from_dict_copies_its_input() -> None:
    rows = [{"a": 1}]
    dataset = Dataset.from_dict("d", rows)
    rows[0]["a"] = 2
    rows.append({"a": 3})
    assert dataset.read_rows(0, [0]) == [{"a": 1}]
    dataset.read_rows(0, [0])[0]["a"] = 5
    assert dataset.read_rows(0, [0]) == [{"a": 1}]


def test_from_dict_turns_numpy_columns_into_python_values() -> None:
    np = pytest.importorskip("numpy")
    dataset = Dataset.from_dict("d", {"a": np.arange(3)})
    [row] = dataset.read_rows(0, [1])
    assert type(row["a"]) is int


def test_from_dict_refuses_bad_input() -> None:
    with pytest.raises(ConfigError, match=r"same length, got 'a': 2, 'b': 1"):
        Dataset.from_dict("d", {"a": [1, 2], "b": [1]})
    with pytest.raises(ConfigError, match="rows must be mappings, got int at row 1"):
        Dataset.from_dict("d", [{"a": 1}, 2])  # type: ignore[list-item]
    with pytest.raises(ConfigError, match="got str"):
        Dataset.from_dict("d", "abc")  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match="`shard_size` must be a positive int"):
        Dataset.from_dict("d", {"a": [1]}, shard_size=0)


@pytest.mark.parametrize("data", [{"a": []}, {}, []])
def test_from_dict_without_rows_is_a_data_error(data: Any) -> None:
    with pytest.raises(DataError, match="dataset 'd': has no rows"):
        Dataset.from_dict("d", data)


def test_a_file_linked_under_two_names_is_read_once_with_a_warning(
    tmp_path: Path, write_jsonl: Any
) -> None:
    """Two symbolic links and a hard link to one shard read its rows three times a pass, with
    no word, where a folder linked twice is read once (review H, F4)."""
    write_jsonl(tmp_path / "store" / "a.jsonl", [{"x": i} for i in range(10)])
    write_jsonl(tmp_path / "mix" / "b.jsonl", [{"x": 10}])
    (tmp_path / "mix" / "a.jsonl").symlink_to(tmp_path / "store" / "a.jsonl")
    (tmp_path / "mix" / "c.jsonl").symlink_to(tmp_path / "store" / "a.jsonl")
    os.link(tmp_path / "store" / "a.jsonl", tmp_path / "mix" / "d.jsonl")
    for path in (tmp_path / "mix", tmp_path / "mix" / "*.jsonl"):
        with pytest.warns(UserWarning, match=r"2 file\(s\) are other names \(links\) of files it "
                          r"reads, and are not read again: 'c.jsonl' \(= 'a.jsonl'\), "
                          r"'d.jsonl' \(= 'a.jsonl'\)") as caught:  # fmt: skip
            dataset = Dataset.from_path("d", path)
        assert caught[0].filename == __file__
        assert [os.path.basename(s.path) for s in dataset.shards] == ["a.jsonl", "b.jsonl"]
        assert dataset.num_rows == 11


def test_a_data_file_named_without_an_ending_is_named_as_left_out(
    tmp_path: Path, write_jsonl: Any
) -> None:
    """Spark's `saveAsTextFile` names its shards `part-00001`: they were left out without a
    word beside `.jsonl` shards of the same data (review H, F3). Notes such as LICENSE stay
    quiet."""
    write_jsonl(tmp_path / "part-00000.jsonl", [{"x": 0}])
    write_jsonl(tmp_path / "part-00001", [{"x": 1}] * 20)
    (tmp_path / "LICENSE").write_text("CC-BY\n")
    (tmp_path / "Makefile").write_text("all:\n")
    with pytest.warns(UserWarning, match=r"1 file\(s\) whose names end in no format it reads "
                      r"are left out: 'part-00001' \(it reads") as caught:  # fmt: skip
        dataset = Dataset.from_path("d", tmp_path)
    assert len(caught) == 1 and dataset.num_rows == 1


def test_format_given_for_a_folder_leaves_its_notes_out_unless_they_are_all_it_holds(
    tmp_path: Path, write_jsonl: Any
) -> None:
    """`format=` read every file of a folder in that format, so the README.md and LICENSE
    kept beside Spark's `part-00000` shards were read as JSON Lines, a DataError naming the
    README. Notes are left out as detection leaves them out, unless they are all there is."""
    spark = tmp_path / "spark"
    write_jsonl(spark / "part-00000", [{"x": 0}] * 2)
    write_jsonl(spark / "part-00001", [{"x": 1}] * 3)
    (spark / "README.md").write_text("# a dataset\n")
    (spark / "LICENSE").write_text("CC-BY\n")
    dataset = Dataset.from_path("d", spark, format="jsonl")
    assert [os.path.basename(shard.path) for shard in dataset.shards] == [
        "part-00000",
        "part-00001",
    ]
    assert dataset.num_rows == 5
    notes = tmp_path / "notes"
    write_jsonl(notes / "a.md", [{"x": 0}] * 4)
    write_jsonl(notes / "b.yaml", [{"x": 1}])
    assert Dataset.from_path("t", notes, format="jsonl").num_rows == 5
    glob = Dataset.from_path("g", str(spark / "*"), format="jsonl")
    assert len(glob.shards) == 4
    readme = [shard.path for shard in glob.shards].index(str(spark / "README.md"))
    with pytest.raises(DataError) as caught:
        glob.read_rows(readme, [0])
    assert caught.value.shard == str(spark / "README.md")


def test_a_delta_lake_table_folder_is_read_with_a_warning_that_removed_files_are_read(
    tmp_path: Path,
) -> None:
    """A Delta table's folder keeps the Parquet files later commits removed until VACUUM:
    read as a folder, their rows came beside the rows that replaced them, without a word
    (the `_delta_log` folder is skipped for its "_"). The log's first commit as Delta
    writes it; no reader of the log is here."""
    table = tmp_path / "table"
    _write_table(table / "part-00000-a.parquet", 2)
    _write_table(table / "part-00000-b.parquet", 3)  # the rewrite of a, say
    (table / "_delta_log").mkdir()
    (table / "_delta_log" / "00000000000000000000.json").write_text('{"commitInfo": {}}\n')
    with pytest.warns(UserWarning, match=r"is a Delta Lake table .*_delta_log.*VACUUM") as got:
        dataset = Dataset.from_path("t", table)
    assert len(got) == 1 and dataset.num_rows == 5
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        Dataset.from_path("t", str(table / "*.parquet"))  # files named: no table read
        shutil.rmtree(table / "_delta_log")
        Dataset.from_path("t", table)


def test_a_resume_on_another_hub_commit_says_to_pin_the_saved_one(
    tmp_path: Path, write_jsonl: Any
) -> None:
    """A state saved on an `hf://` branch that moved since was refused showing two commit
    hashes, with no word of the `@COMMIT` pin that resumes on the saved data."""
    from zephon_torch import Pipeline, StateMismatchError
    from zephon_torch.work import StaticMixtureWorkSource

    write_jsonl(tmp_path / "train.jsonl", [{"x": [1, 2, 3]}] * 3)
    local = Dataset.from_path("d", tmp_path)

    def pipeline(revision: str | None) -> Pipeline:
        dataset = Dataset(
            name="d", format="jsonl", shards=local.shards, reader=local._reader, revision=revision
        )
        return Pipeline(StaticMixtureWorkSource([dataset])).pretokenized("x").pack_flat(4).batch(1)

    state = pipeline("a" * 40).state_dict()
    pin = re.escape(f"pin the saved one, hf://org/name@{'a' * 40}/[config/]split, to resume")
    with pytest.raises(StateMismatchError, match=rf"{'b' * 40} \(the branch moved since\).*{pin}"):
        pipeline("b" * 40).load_state_dict(state)
    with pytest.raises(StateMismatchError, match=rf"and no hub commit is read now: {pin}"):
        pipeline(None).load_state_dict(state)
    pipeline("a" * 40).load_state_dict(state)
    # a state saved on no hub commit names none to pin: the revision's difference says it
    with pytest.raises(StateMismatchError, match="revision") as refused:
        pipeline("b" * 40).load_state_dict(pipeline(None).state_dict())
    assert "hub commit" not in str(refused.value)


@pytest.mark.parametrize(
    ("suffix", "library"), [(".parquet", "pyarrow"), (".vortex", "vortex-data")]
)
def test_a_file_whose_name_is_not_utf8_is_refused_by_name_not_blamed_as_unreadable(
    tmp_path: Path, suffix: str, library: str
) -> None:
    """pyarrow and vortex-data open files only by UTF-8 names: a Latin-1 name (as os.listdir
    gives it, with surrogates) failed there, and the DataError said the file was not a
    readable Parquet (or Vortex) file, sending the user to rebuild healthy data."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from tests.unit.io.test_io_formats_writers import write_vortex

    written = tmp_path / f"written{suffix}"
    table = pa.table({"text": ["a", "b"]})
    if suffix == ".parquet":
        pq.write_table(table, written)
    else:
        write_vortex(written, table)
    path = os.fsdecode(os.fsencode(tmp_path) + b"/caf\xe9" + suffix.encode())
    os.rename(written, path)
    with pytest.raises(DataError, match=rf"name is not valid UTF-8, and {library}") as caught:
        Dataset.from_path("latin", tmp_path)
    assert (caught.value.dataset, caught.value.shard) == ("latin", path)
    assert "readable" not in str(caught.value)
