"""Remote datasets over fsspec (memory://): listing, row counts, reads through the cache."""

from __future__ import annotations

import io
import json
import pickle
import shutil
import sys
from pathlib import Path
from typing import Any

import fsspec
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from tests.helpers import keys
from tests.memory_store import fresh_root, put_jsonl, put_parquet, remote_options
from zephon_torch import Pipeline
from zephon_torch.errors import ConfigError, DataError
from zephon_torch.io import Dataset
from zephon_torch.io._io_options import IoOptions
from zephon_torch.work import StaticMixtureWorkSource


class _Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_a_memory_url_reads_the_same_rows_as_the_local_copy(tmp_path: Path) -> None:
    fs = fsspec.filesystem("memory")
    root = fresh_root()
    local = tmp_path / "local"
    local.mkdir()
    for number in range(3):
        rows = [{"text": f"doc {number}-{i}", "n": i} for i in range(5 + number)]
        put_jsonl(fs, f"{root}/part-{number}.jsonl", rows)
        (local / f"part-{number}.jsonl").write_bytes(fs.cat(f"{root}/part-{number}.jsonl"))
    fs.pipe(f"{root}/_SUCCESS", b"")
    remote = Dataset.from_path(
        "r", f"memory://{root}/", io_options=remote_options(tmp_path), index_cache_dir=str(tmp_path)
    )
    plain = Dataset.from_path("r", local, index_cache_dir=str(tmp_path / "i2"))
    assert remote.format == "jsonl"
    assert [s.num_rows for s in remote.shards] == [s.num_rows for s in plain.shards]
    assert remote.fingerprint() == plain.fingerprint()
    for shard in range(3):
        rows = list(range(remote.shards[shard].num_rows))[::-1]
        assert remote.read_rows(shard, rows) == plain.read_rows(shard, rows)
    copy = pickle.loads(pickle.dumps(remote))
    assert copy.read_rows(1, [0, 2]) == plain.read_rows(1, [0, 2])
    assert len(pickle.dumps(remote)) < 4000


def test_format_given_for_a_remote_folder_leaves_its_notes_out(tmp_path: Path) -> None:
    """As for a local folder: `format=` read a bucket folder's README.md as a shard."""
    fs = fsspec.filesystem("memory")
    root = fresh_root()
    put_jsonl(fs, f"{root}/part-00000", [{"text": "a"}, {"text": "b"}])
    put_jsonl(fs, f"{root}/part-00001", [{"text": "c"}])
    fs.pipe(f"{root}/README.md", b"# notes\n")
    remote = Dataset.from_path(
        "r",
        f"memory://{root}/",
        format="jsonl",
        io_options=remote_options(tmp_path),
        index_cache_dir=str(tmp_path),
    )
    assert [shard.path.rsplit("/", 1)[-1] for shard in remote.shards] == [
        "part-00000",
        "part-00001",
    ]
    assert remote.num_rows == 3


def test_a_remote_delta_lake_table_folder_is_read_with_a_warning(tmp_path: Path) -> None:
    """As for a local folder: a table's removed Parquet files were read without a word."""
    fs = fsspec.filesystem("memory")
    root = fresh_root()
    put_jsonl(fs, f"{root}/part-0.jsonl", [{"text": "a"}])
    fs.pipe(f"{root}/_delta_log/00000000000000000000.json", b'{"commitInfo": {}}\n')
    with pytest.warns(UserWarning, match=r"is a Delta Lake table \('memory://.*/_delta_log/'"):
        remote = Dataset.from_path(
            "r",
            f"memory://{root}/",
            io_options=remote_options(tmp_path),
            index_cache_dir=str(tmp_path),
        )
    assert remote.num_rows == 1


def test_parquet_rows_are_counted_from_the_footer_without_a_download(tmp_path: Path) -> None:
    fs = fsspec.filesystem("memory")
    root = fresh_root()
    table = pa.table({"text": [f"t{i}" for i in range(40)], "n": list(range(40))})
    put_parquet(fs, f"{root}/a.parquet", table, row_group_size=16)
    dataset = Dataset.from_path(
        "p", f"memory://{root}/*.parquet", io_options=remote_options(tmp_path)
    )
    assert dataset.num_rows == 40
    assert not (tmp_path / "cache").exists()
    assert dataset.read_rows(0, [39, 0]) == [{"text": "t39", "n": 39}, {"text": "t0", "n": 0}]


def test_a_truncated_shard_raises_a_data_error_naming_the_url(tmp_path: Path) -> None:
    fs = fsspec.filesystem("memory")
    root = fresh_root()
    put_parquet(fs, f"{root}/a.parquet", pa.table({"n": list(range(100))}))
    dataset = Dataset.from_path("p", f"memory://{root}", io_options=remote_options(tmp_path))
    fs.pipe(f"{root}/b.parquet", b"PAR1 not really")
    with pytest.raises(DataError, match=r"b\.parquet"):
        Dataset.from_path("p", f"memory://{root}/b.parquet", io_options=remote_options(tmp_path))
    assert dataset.num_rows == 100


@pytest.mark.parametrize("kind", ["parquet", "jsonl"])
def test_a_shard_removed_after_opening_is_a_data_error_naming_the_url(
    tmp_path: Path, kind: str
) -> None:
    fs = fsspec.filesystem("memory")
    root = fresh_root()
    for name in ("a", "b"):
        if kind == "parquet":
            put_parquet(fs, f"{root}/{name}.parquet", pa.table({"n": [1, 2]}))
        else:
            put_jsonl(fs, f"{root}/{name}.jsonl", [{"n": 1}, {"n": 2}])
    opened = Dataset.from_path("p", f"memory://{root}", io_options=remote_options(tmp_path))
    dataset = opened.with_io_options({"cache": {"dir": str(tmp_path / "other")}})  # not cached
    fs.rm(f"{root}/b.{kind}")
    with pytest.raises(DataError, match="the object is missing") as caught:
        dataset.read_rows(1, [0])
    assert (caught.value.dataset, caught.value.shard) == ("p", f"memory://{root}/b.{kind}")


def test_a_cache_folder_made_again_under_a_download_is_not_taken_for_a_missing_object(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The cache folder deleted while a shard downloaded, and made again at once by another
    process sharing it: the download's temporary file was gone, its folder there, and the
    read raised "the object is missing" for an object the store still held."""
    fs = fsspec.filesystem("memory")
    root = fresh_root()
    put_jsonl(fs, f"{root}/a.jsonl", [{"n": 1}, {"n": 2}])
    cache = tmp_path / "other"  # not the one the open downloaded into
    dataset = Dataset.from_path("p", f"memory://{root}", io_options=remote_options(tmp_path))
    dataset = dataset.with_io_options({"cache": {"dir": str(cache), "prefetch_bytes": 0}})
    get_file, calls = fs.get_file, []

    def cleaned_under(rpath: str, lpath: str, **kwargs: Any) -> None:
        get_file(rpath, lpath, **kwargs)
        calls.append(lpath)
        if len(calls) == 1:  # a cleaner, then the other process's next download
            shutil.rmtree(cache)
            (cache / ".downloading").mkdir(parents=True)

    monkeypatch.setattr(fs, "get_file", cleaned_under)
    assert dataset.read_rows(0, [1, 0]) == [{"n": 2}, {"n": 1}]
    assert len(calls) == 2


def test_a_missing_url_and_bad_options_are_refused(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="does not exist"):
        Dataset.from_path("m", f"memory://{fresh_root()}/none", io_options=remote_options(tmp_path))
    with pytest.raises(ConfigError, match="unknown keys"):
        Dataset.from_path("m", "memory:///x", io_options={"cache": {"max_byte": 1}})
    with pytest.raises(ConfigError, match="attempts"):
        Dataset.from_path("m", "memory:///x", io_options={"retry": {"attempts": 0}})


def test_a_shard_larger_than_the_cache_is_an_error_naming_it(tmp_path: Path) -> None:
    fs = fsspec.filesystem("memory")
    root = fresh_root()
    put_jsonl(fs, f"{root}/big.jsonl", [{"text": "x" * 100}] * 10)
    with pytest.raises(ConfigError, match=r"big\.jsonl"):
        Dataset.from_path("b", f"memory://{root}", io_options=remote_options(tmp_path, 100))


def test_a_foreground_download_shows_a_bar_on_a_terminal_only(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    fs = fsspec.filesystem("memory")
    root = fresh_root()
    put_jsonl(fs, f"{root}/a.jsonl", [{"text": "x" * 100}] * 50)
    terminal = _Terminal()
    monkeypatch.setattr(sys, "stderr", terminal)
    dataset = Dataset.from_path("bar", f"memory://{root}/", io_options=remote_options(tmp_path))
    assert dataset.read_rows(0, [0])[0]["text"] == "x" * 100
    assert "downloading a.jsonl" in terminal.getvalue()
    quiet = io.StringIO()
    monkeypatch.setattr(sys, "stderr", quiet)
    put_jsonl(fs, f"{root}2/b.jsonl", [{"text": "y"}] * 5)
    Dataset.from_path("q", f"memory://{root}2/", io_options=remote_options(tmp_path)).read_rows(
        0, [0]
    )
    assert quiet.getvalue() == ""


def test_a_parquet_footer_longer_than_the_first_tail_read_is_read_whole(tmp_path: Path) -> None:
    fs = fsspec.filesystem("memory")
    root = fresh_root()
    table = pa.table({f"c{i}": list(range(600)) for i in range(40)})
    # 200 row groups x 40 columns
    put_parquet(fs, f"{root}/wide.parquet", table, row_group_size=3)
    data = fs.cat(f"{root}/wide.parquet")
    assert int.from_bytes(data[-8:-4], "little") > 64 << 10  # the footer alone
    dataset = Dataset.from_path(
        "w", f"memory://{root}", io_options=remote_options(tmp_path, 1 << 24)
    )
    assert dataset.num_rows == 600
    assert not (tmp_path / "cache").exists()  # counted without a download
    assert dataset.read_rows(0, [599])[0]["c39"] == 599


def test_pipeline_io_options_move_the_cache_of_remote_datasets_and_keep_the_rest(
    tmp_path: Path,
) -> None:
    fs = fsspec.filesystem("memory")
    root = fresh_root()
    for number in range(3):
        ids = [[number * 100 + i] * (5 + i) for i in range(8)]
        put_parquet(fs, f"{root}/{number}.parquet", pa.table({"input_ids": ids}))
    dataset = Dataset.from_path("p", f"memory://{root}", io_options=remote_options(tmp_path))
    moved = dataset.with_io_options({"cache": {"dir": str(tmp_path / "moved")}})
    assert moved.fingerprint() == dataset.fingerprint()
    assert moved.read_rows(2, [1]) == dataset.read_rows(2, [1])

    def build(io_options: dict[str, Any] | None) -> Pipeline:
        pipeline = Pipeline(StaticMixtureWorkSource([dataset], seed=3, exhaustion="stop"))
        if io_options is not None:
            pipeline = pipeline.options(io_options=io_options)
        return pipeline.pretokenized("input_ids").pack_flat(16).batch(2)

    plain = keys(build(None))
    other = tmp_path / "other"
    relocated = build({"cache": {"dir": str(other), "enabled": True}})
    assert keys(relocated) == plain
    assert len(list(other.glob("*.parquet"))) == 3
    cache = relocated.stats()["cache"]
    assert cache is not None and cache["misses"] == 3
    # the dataset's retry settings were kept: only the cache keys given changed
    options = relocated._datasets[0]._reader.options  # type: ignore[attr-defined]
    assert options.retry.attempts == 2
    # a second call keeps the first one's keys
    chained = build({"cache": {"dir": str(other)}}).options(io_options={"retry": {"attempts": 4}})
    options = chained._datasets[0]._reader.options  # type: ignore[attr-defined]
    assert (options.cache.dir, options.retry.attempts) == (str(other), 4)
    whole = dataset.with_io_options(IoOptions())  # an IoOptions replaces every setting
    assert whole._reader.options == IoOptions()  # type: ignore[attr-defined]
    with pytest.raises(ConfigError, match="unknown keys"):
        build({"cache": {"size": 1}})
    with pytest.raises(ConfigError, match="enabled"):
        build({"cache": {"enabled": False}})


def test_pipeline_io_options_leave_local_datasets_alone() -> None:
    dataset = Dataset.from_dict("d", {"input_ids": [[i + 1] * 7 for i in range(10)]})
    source = StaticMixtureWorkSource([dataset], seed=0, exhaustion="stop")
    plain = Pipeline(source)
    cached = Pipeline(source).options(io_options={"cache": {"enabled": True}})
    assert cached._datasets[0] is dataset
    build = [p.pretokenized("input_ids").pack_flat(8).batch(2) for p in (plain, cached)]
    assert keys(build[0]) == keys(build[1])


@pytest.mark.parametrize("damage", ["thrift", "empty", "short"])
def test_a_bad_parquet_footer_is_a_data_error_at_once_not_a_retried_storage_error(
    tmp_path: Path, damage: str
) -> None:
    fs = fsspec.filesystem("memory")
    root = fresh_root()
    buffer = io.BytesIO()
    pq.write_table(pa.table({"n": list(range(50))}), buffer)
    data = buffer.getvalue()
    length = int.from_bytes(data[-8:-4], "little")
    if damage == "thrift":  # the footer's bytes garbled, its length and magic kept
        data = data[: -8 - length] + b"\xff" * length + data[-8:]
    fs.pipe(f"{root}/a.parquet", {"thrift": data, "empty": b"", "short": b"PAR1"}[damage])
    # retried, the OSError pyarrow raises for bad thrift would end as a StorageError
    with pytest.raises(DataError, match=r"a\.parquet.*not a readable Parquet file"):
        Dataset.from_path("p", f"memory://{root}/a.parquet", io_options=remote_options(tmp_path))


@pytest.mark.parametrize("size", ["same size", "other size"])
def test_an_object_rewritten_after_listing_is_refused_not_cached_as_the_listed_one(
    tmp_path: Path, size: str
) -> None:
    """The download took whatever the object held then: a same-size rewrite was cached under
    the listed version's name (a JSONL line index of the old bytes then cut the new ones), and
    another size was retried as a cut transfer, then a StorageError."""
    fs = fsspec.filesystem("memory")
    root = fresh_root()
    path = f"{root}/a.parquet"
    put_parquet(fs, path, pa.table({"n": [7] * 10}))
    listed = fs.size(path)
    dataset = Dataset.from_path("p", f"memory://{root}", io_options=remote_options(tmp_path))
    rewritten = pa.table({"n": [8] * 10} if size == "same size" else {"n": list(range(40))})
    put_parquet(fs, path, rewritten)
    assert (fs.size(path) == listed) == (size == "same size")
    with pytest.raises(DataError, match=r"a\.parquet.*changed since it was listed"):
        dataset.read_rows(0, [0])
    cached = [p for p in (tmp_path / "cache").rglob("*") if p.is_file() and p.stat().st_size]
    assert all(p.stat().st_size != listed for p in cached)  # nothing kept under the old name


def test_an_empty_remote_jsonl_file_is_refused_naming_it(tmp_path: Path) -> None:
    fs = fsspec.filesystem("memory")
    root = fresh_root()
    put_jsonl(fs, f"{root}/a.jsonl", [{"text": "x"}])
    fs.pipe(f"{root}/b.jsonl", b"")
    with pytest.raises(DataError, match=r"b\.jsonl.*no rows"):
        Dataset.from_path("e", f"memory://{root}", io_options=remote_options(tmp_path))


def test_a_remote_parquet_shard_lacking_a_column_read_is_named_at_the_open(
    tmp_path: Path,
) -> None:
    """A local shard is checked at the open; a remote one was checked at its first read
    (hours into a run, in a worker), from the footer's row count alone."""
    fs = fsspec.filesystem("memory")
    root = fresh_root()
    put_parquet(fs, f"{root}/0.parquet", pa.table({"text": ["a"], "ids": [[1, 2]]}))
    put_parquet(fs, f"{root}/1.parquet", pa.table({"text": ["b"], "ids": [["x"]]}))
    index = str(tmp_path / "index")

    def open_(**kwargs: Any) -> Dataset:
        options = remote_options(tmp_path)
        url = f"memory://{root}"
        return Dataset.from_path("p", url, io_options=options, index_cache_dir=index, **kwargs)

    for _ in range(2):  # the footers read, then their remembered records
        with pytest.raises(DataError, match=r"0\.parquet.*has no column 'nope'"):
            open_(columns=["text", "nope"])
        with pytest.raises(DataError, match=r"1\.parquet.*token column 'ids' holds list<"):
            open_(token_columns=["ids"])
    assert open_(columns=["text"]).read_rows(1, [0]) == [{"text": "b"}]


def test_a_remote_vortex_shard_lacking_a_column_read_is_named_at_every_open(
    tmp_path: Path,
) -> None:
    """The first open checked the columns on the downloaded file; once its row count was
    remembered, later opens (a restart, `zephon-torch index` first) skipped the check, and the
    error came at the first read, mid-run."""
    from tests.unit.io.test_io_formats_writers import write_vortex

    fs = fsspec.filesystem("memory")
    root = fresh_root()
    for number, table in enumerate(
        (pa.table({"text": ["a"], "ids": [[1, 2]]}), pa.table({"text": ["b"], "ids": [["x"]]}))
    ):
        write_vortex(tmp_path / f"{number}.vortex", table)
        fs.pipe(f"{root}/{number}.vortex", (tmp_path / f"{number}.vortex").read_bytes())
    index = str(tmp_path / "index")

    def open_(**kwargs: Any) -> Dataset:
        options = remote_options(tmp_path)
        url = f"memory://{root}"
        return Dataset.from_path("v", url, io_options=options, index_cache_dir=index, **kwargs)

    assert open_().num_rows == 2  # counted, and remembered with the columns
    for _ in range(2):  # the remembered records, then again
        with pytest.raises(DataError, match=r"0\.vortex.*has no column 'nope'"):
            open_(columns=["text", "nope"])
        with pytest.raises(DataError, match=r"1\.vortex.*token column 'ids' holds list<"):
            open_(token_columns=["ids"])
    assert open_(columns=["text"]).read_rows(1, [0]) == [{"text": "b"}]


@pytest.mark.parametrize(
    "pattern",
    [
        "**/*.jsonl",
        "*/*.jsonl",
        "a/*",
        "a*/*.jsonl",
        "a/.*",
        "*/.x/*.jsonl",
        ".*/*.jsonl",
        "**/.x/*.jsonl",
        "**",
        "a/**.jsonl",  # a `**` within a name is a `*`: fsspec refused it (a ConfigError)
        "a**/*.jsonl",
        "*/",  # a glob ending in "/" names folders, no files: it read `*`'s before
        "**/",
    ],
)
def test_a_remote_glob_lists_the_shards_the_same_glob_lists_locally(
    tmp_path: Path, pattern: str
) -> None:
    """A wildcard matched names starting with "." remotely, which a local glob leaves out:
    other shards, fingerprint and batches than the local copy. Where the local glob finds no
    file, the URL's is the same ConfigError."""
    fs = fsspec.filesystem("memory")
    root = fresh_root()
    names = ["a/x.jsonl", "a/_meta.jsonl", "a/.hidden.jsonl", ".h/y.jsonl", "a-b/v.jsonl"]
    names += [".h/.z.jsonl", "s/.x/g.jsonl", ".a/.x/f.jsonl"]
    for number, name in enumerate(names):
        (tmp_path / "local" / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / "local" / name).write_text(json.dumps({"i": number}) + "\n")
        put_jsonl(fs, f"{root}/{name}", [{"i": number}])
    options = remote_options(tmp_path)
    if pattern.endswith("/"):
        for path in (f"memory://{root}/{pattern}", f"{tmp_path / 'local'}/{pattern}"):
            with pytest.raises(ConfigError, match=r"the glob holds no visible files"):
                Dataset.from_path("d", path, io_options=options)
        return
    remote = Dataset.from_path("d", f"memory://{root}/{pattern}", io_options=options)
    local = Dataset.from_path("d", f"{tmp_path / 'local'}/{pattern}")
    assert [s.path.split(f"{root}/", 1)[1] for s in remote.shards] == [
        str(Path(s.path).relative_to(tmp_path / "local")) for s in local.shards
    ]


@pytest.mark.parametrize("where", ["local", "remote"])
def test_a_name_holding_glob_characters_is_read_as_itself_where_it_exists(
    tmp_path: Path, where: str
) -> None:
    """A URL was always read as a glob: `a[1].jsonl` read `a1.jsonl` without a word, and a
    folder `run[2]` named nothing, where a local path that exists is read as itself."""
    folder = tmp_path / "local"
    for name, count in (("a[1].jsonl", 3), ("a1.jsonl", 2), ("run[2]/x.jsonl", 4)):
        (folder / name).parent.mkdir(parents=True, exist_ok=True)
        (folder / name).write_text("".join(f'{{"i": {i}}}\n' for i in range(count)))
    path = str(folder)
    if where == "remote":
        path = f"memory://{fresh_root()}"
        fsspec.filesystem("memory").put(str(folder), path.split("://", 1)[1], recursive=True)
    options = remote_options(tmp_path)
    for name, shards in (
        ("a[1].jsonl", {"a[1].jsonl": 3}),
        ("run[2]", {"run[2]/x.jsonl": 4}),
        ("run[2]/", {"run[2]/x.jsonl": 4}),
        ("a[12].jsonl", {"a1.jsonl": 2}),  # no such name: a glob
    ):
        dataset = Dataset.from_path("d", f"{path}/{name}", io_options=options)
        assert {s.path[len(path) + 1 :]: s.num_rows for s in dataset.shards} == shards, name


def test_objects_of_a_scheme_registered_for_another_protocol_keep_the_scheme_written() -> None:
    """adlfs before 2024 has the one protocol "abfs", which fsspec's registry also serves for
    az://: an az:// dataset's shards, errors and cache keys were named abfs://, not the URL
    written (5 az:// tests failed with adlfs 2023.8). The memory file system, of the one
    protocol "memory", stands for it."""
    from zephon_torch.io._remote import url_namer

    memory = fsspec.filesystem("memory")
    assert url_namer(memory, "alias://bucket/x")("bucket/x/a.jsonl") == "alias://bucket/x/a.jsonl"
    assert url_namer(memory, "memory://bucket/x")("bucket/x/a.jsonl") == (
        "memory://bucket/x/a.jsonl"
    )
