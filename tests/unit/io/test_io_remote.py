"""Remote datasets over fsspec (memory://): listing, row counts, reads through the cache."""

from __future__ import annotations

import http.server
import io
import json
import os
import pickle
import shutil
import sys
import time
import traceback
import uuid
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import fsspec
import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from tests.helpers import keys
from tests.loopback import serve_in_thread
from zephon_torch import Pipeline
from zephon_torch.errors import ConfigError, DataError, StorageError
from zephon_torch.io import Dataset
from zephon_torch.io._io_options import IoOptions
from zephon_torch.work import StaticMixtureWorkSource


def _put_jsonl(fs: Any, path: str, rows: list[dict[str, Any]]) -> None:
    fs.pipe(path, "".join(json.dumps(row) + "\n" for row in rows).encode())


def _put_parquet(fs: Any, path: str, table: pa.Table, **options: Any) -> None:
    with fs.open(path, "wb") as handle:
        pq.write_table(table, handle, **options)


def _root() -> str:
    return f"/zt-{uuid.uuid4().hex[:8]}"


def _equal_parquet_shards(count: int) -> tuple[str, int]:
    """`count` Parquet shards of the same size in a fresh memory:// folder: (folder, size)."""
    fs = fsspec.filesystem("memory")
    root = _root()
    for number in range(count):
        _put_parquet(fs, f"{root}/{number}.parquet", pa.table({"n": [7] * 10}))
    return root, fs.size(f"{root}/0.parquet")


def _options(tmp_path: Path, max_bytes: int = 1 << 20) -> dict[str, Any]:
    return {
        "cache": {"dir": str(tmp_path / "cache"), "max_bytes": max_bytes},
        "retry": {"attempts": 2, "initial_delay": 0.01},
    }


def test_a_memory_url_reads_the_same_rows_as_the_local_copy(tmp_path: Path) -> None:
    fs = fsspec.filesystem("memory")
    root = _root()
    local = tmp_path / "local"
    local.mkdir()
    for number in range(3):
        rows = [{"text": f"doc {number}-{i}", "n": i} for i in range(5 + number)]
        _put_jsonl(fs, f"{root}/part-{number}.jsonl", rows)
        (local / f"part-{number}.jsonl").write_bytes(fs.cat(f"{root}/part-{number}.jsonl"))
    fs.pipe(f"{root}/_SUCCESS", b"")
    remote = Dataset.from_path(
        "r", f"memory://{root}/", io_options=_options(tmp_path), index_cache_dir=str(tmp_path)
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
    root = _root()
    _put_jsonl(fs, f"{root}/part-00000", [{"text": "a"}, {"text": "b"}])
    _put_jsonl(fs, f"{root}/part-00001", [{"text": "c"}])
    fs.pipe(f"{root}/README.md", b"# notes\n")
    remote = Dataset.from_path(
        "r",
        f"memory://{root}/",
        format="jsonl",
        io_options=_options(tmp_path),
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
    root = _root()
    _put_jsonl(fs, f"{root}/part-0.jsonl", [{"text": "a"}])
    fs.pipe(f"{root}/_delta_log/00000000000000000000.json", b'{"commitInfo": {}}\n')
    with pytest.warns(UserWarning, match=r"is a Delta Lake table \('memory://.*/_delta_log/'"):
        remote = Dataset.from_path(
            "r", f"memory://{root}/", io_options=_options(tmp_path), index_cache_dir=str(tmp_path)
        )
    assert remote.num_rows == 1


def test_parquet_rows_are_counted_from_the_footer_without_a_download(tmp_path: Path) -> None:
    fs = fsspec.filesystem("memory")
    root = _root()
    table = pa.table({"text": [f"t{i}" for i in range(40)], "n": list(range(40))})
    _put_parquet(fs, f"{root}/a.parquet", table, row_group_size=16)
    dataset = Dataset.from_path("p", f"memory://{root}/*.parquet", io_options=_options(tmp_path))
    assert dataset.num_rows == 40
    assert not (tmp_path / "cache").exists()
    assert dataset.read_rows(0, [39, 0]) == [{"text": "t39", "n": 39}, {"text": "t0", "n": 0}]


def test_a_truncated_shard_raises_a_data_error_naming_the_url(tmp_path: Path) -> None:
    fs = fsspec.filesystem("memory")
    root = _root()
    _put_parquet(fs, f"{root}/a.parquet", pa.table({"n": list(range(100))}))
    dataset = Dataset.from_path("p", f"memory://{root}", io_options=_options(tmp_path))
    fs.pipe(f"{root}/b.parquet", b"PAR1 not really")
    with pytest.raises(DataError, match=r"b\.parquet"):
        Dataset.from_path("p", f"memory://{root}/b.parquet", io_options=_options(tmp_path))
    assert dataset.num_rows == 100


@pytest.mark.parametrize("kind", ["parquet", "jsonl"])
def test_a_shard_removed_after_opening_is_a_data_error_naming_the_url(
    tmp_path: Path, kind: str
) -> None:
    fs = fsspec.filesystem("memory")
    root = _root()
    for name in ("a", "b"):
        if kind == "parquet":
            _put_parquet(fs, f"{root}/{name}.parquet", pa.table({"n": [1, 2]}))
        else:
            _put_jsonl(fs, f"{root}/{name}.jsonl", [{"n": 1}, {"n": 2}])
    opened = Dataset.from_path("p", f"memory://{root}", io_options=_options(tmp_path))
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
    root = _root()
    _put_jsonl(fs, f"{root}/a.jsonl", [{"n": 1}, {"n": 2}])
    cache = tmp_path / "other"  # not the one the open downloaded into
    dataset = Dataset.from_path("p", f"memory://{root}", io_options=_options(tmp_path))
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
        Dataset.from_path("m", f"memory://{_root()}/none", io_options=_options(tmp_path))
    with pytest.raises(ConfigError, match="unknown keys"):
        Dataset.from_path("m", "memory:///x", io_options={"cache": {"max_byte": 1}})
    with pytest.raises(ConfigError, match="attempts"):
        Dataset.from_path("m", "memory:///x", io_options={"retry": {"attempts": 0}})


def test_a_shard_larger_than_the_cache_is_an_error_naming_it(tmp_path: Path) -> None:
    fs = fsspec.filesystem("memory")
    root = _root()
    _put_jsonl(fs, f"{root}/big.jsonl", [{"text": "x" * 100}] * 10)
    with pytest.raises(ConfigError, match=r"big\.jsonl"):
        Dataset.from_path("b", f"memory://{root}", io_options=_options(tmp_path, 100))


class _Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_a_foreground_download_shows_a_bar_on_a_terminal_only(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    fs = fsspec.filesystem("memory")
    root = _root()
    _put_jsonl(fs, f"{root}/a.jsonl", [{"text": "x" * 100}] * 50)
    terminal = _Terminal()
    monkeypatch.setattr(sys, "stderr", terminal)
    dataset = Dataset.from_path("bar", f"memory://{root}/", io_options=_options(tmp_path))
    assert dataset.read_rows(0, [0])[0]["text"] == "x" * 100
    assert "downloading a.jsonl" in terminal.getvalue()
    quiet = io.StringIO()
    monkeypatch.setattr(sys, "stderr", quiet)
    _put_jsonl(fs, f"{root}2/b.jsonl", [{"text": "y"}] * 5)
    Dataset.from_path("q", f"memory://{root}2/", io_options=_options(tmp_path)).read_rows(0, [0])
    assert quiet.getvalue() == ""


def test_a_parquet_footer_longer_than_the_first_tail_read_is_read_whole(tmp_path: Path) -> None:
    fs = fsspec.filesystem("memory")
    root = _root()
    table = pa.table({f"c{i}": list(range(600)) for i in range(40)})
    # 200 row groups x 40 columns
    _put_parquet(fs, f"{root}/wide.parquet", table, row_group_size=3)
    data = fs.cat(f"{root}/wide.parquet")
    assert int.from_bytes(data[-8:-4], "little") > 64 << 10  # the footer alone
    dataset = Dataset.from_path("w", f"memory://{root}", io_options=_options(tmp_path, 1 << 24))
    assert dataset.num_rows == 600
    assert not (tmp_path / "cache").exists()  # counted without a download
    assert dataset.read_rows(0, [599])[0]["c39"] == 599


def test_pipeline_io_options_move_the_cache_of_remote_datasets_and_keep_the_rest(
    tmp_path: Path,
) -> None:
    fs = fsspec.filesystem("memory")
    root = _root()
    for number in range(3):
        ids = [[number * 100 + i] * (5 + i) for i in range(8)]
        _put_parquet(fs, f"{root}/{number}.parquet", pa.table({"input_ids": ids}))
    dataset = Dataset.from_path("p", f"memory://{root}", io_options=_options(tmp_path))
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


def test_jsonl_row_counts_are_remembered_so_a_later_open_downloads_nothing(
    tmp_path: Path,
) -> None:
    fs = fsspec.filesystem("memory")
    root = _root()
    for number in range(3):
        _put_jsonl(fs, f"{root}/{number}.jsonl", [{"text": f"{number}-{i}"} for i in range(4)])
    index = str(tmp_path / "index")

    def open_cold(cache: str) -> Dataset:
        options = {"cache": {"dir": str(tmp_path / cache)}}
        return Dataset.from_path("j", f"memory://{root}", io_options=options, index_cache_dir=index)

    first = open_cold("first")
    total = sum(fs.size(f"{root}/{number}.jsonl") for number in range(3))
    assert first.cache_counters() == {"hits": 0, "misses": 3, "bytes_downloaded": total}
    second = open_cold("second")
    assert second.cache_counters() == {"hits": 0, "misses": 0, "bytes_downloaded": 0}
    assert [s.num_rows for s in second.shards] == [4, 4, 4]
    assert second.read_rows(2, [3]) == [{"text": "2-3"}]
    _put_jsonl(fs, f"{root}/1.jsonl", [{"text": "changed"}] * 6)  # a new version: counted again
    third = open_cold("third")
    assert [s.num_rows for s in third.shards] == [4, 6, 4]
    changed = fs.size(f"{root}/1.jsonl")
    assert third.cache_counters() == {"hits": 0, "misses": 1, "bytes_downloaded": changed}


@pytest.mark.parametrize("damage", ["thrift", "empty", "short"])
def test_a_bad_parquet_footer_is_a_data_error_at_once_not_a_retried_storage_error(
    tmp_path: Path, damage: str
) -> None:
    fs = fsspec.filesystem("memory")
    root = _root()
    buffer = io.BytesIO()
    pq.write_table(pa.table({"n": list(range(50))}), buffer)
    data = buffer.getvalue()
    length = int.from_bytes(data[-8:-4], "little")
    if damage == "thrift":  # the footer's bytes garbled, its length and magic kept
        data = data[: -8 - length] + b"\xff" * length + data[-8:]
    fs.pipe(f"{root}/a.parquet", {"thrift": data, "empty": b"", "short": b"PAR1"}[damage])
    # retried, the OSError pyarrow raises for bad thrift would end as a StorageError
    with pytest.raises(DataError, match=r"a\.parquet.*not a readable Parquet file"):
        Dataset.from_path("p", f"memory://{root}/a.parquet", io_options=_options(tmp_path))


@pytest.mark.parametrize("size", ["same size", "other size"])
def test_an_object_rewritten_after_listing_is_refused_not_cached_as_the_listed_one(
    tmp_path: Path, size: str
) -> None:
    """The download took whatever the object held then: a same-size rewrite was cached under
    the listed version's name (a JSONL line index of the old bytes then cut the new ones), and
    another size was retried as a cut transfer, then a StorageError."""
    fs = fsspec.filesystem("memory")
    root = _root()
    path = f"{root}/a.parquet"
    _put_parquet(fs, path, pa.table({"n": [7] * 10}))
    listed = fs.size(path)
    dataset = Dataset.from_path("p", f"memory://{root}", io_options=_options(tmp_path))
    rewritten = pa.table({"n": [8] * 10} if size == "same size" else {"n": list(range(40))})
    _put_parquet(fs, path, rewritten)
    assert (fs.size(path) == listed) == (size == "same size")
    with pytest.raises(DataError, match=r"a\.parquet.*changed since it was listed"):
        dataset.read_rows(0, [0])
    cached = [p for p in (tmp_path / "cache").rglob("*") if p.is_file() and p.stat().st_size]
    assert all(p.stat().st_size != listed for p in cached)  # nothing kept under the old name


@pytest.fixture
def http_folder(tmp_path: Path) -> Iterator[tuple[Path, str]]:
    """A folder served by python's http.server on loopback (no ETag, no range requests)."""
    import functools
    import http.server

    folder = tmp_path / "served"
    folder.mkdir()
    handler = functools.partial(http.server.SimpleHTTPRequestHandler, directory=str(folder))
    handler.log_message = lambda *args: None  # type: ignore[attr-defined]
    with serve_in_thread(handler) as url:
        yield folder, url


def test_http_urls_of_a_file_and_of_a_folder_page_open_and_read(
    tmp_path: Path, http_folder: tuple[Path, str]
) -> None:
    """fsspec's http:// lists a file without details and a page's links without sizes: both
    failed with a bare KeyError or TypeError. A rewrite is seen by its Last-Modified."""
    folder, base = http_folder
    for shard in range(2):
        rows = [{"text": f"row {shard}-{i}"} for i in range(5)]
        (folder / f"part-{shard}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
        os.utime(folder / f"part-{shard}.jsonl", (time.time() - 10,) * 2)  # settled
    options = _options(tmp_path)
    index = str(tmp_path / "index")
    single = Dataset.from_path("h", f"{base}/part-1.jsonl", io_options=options)
    assert single.read_rows(0, [4]) == [{"text": "row 1-4"}]
    listed = Dataset.from_path("h", f"{base}/", io_options=options, index_cache_dir=index)
    assert [listed.read_rows(n, [0])[0]["text"] for n in range(2)] == ["row 0-0", "row 1-0"]
    from tests.unit.io.test_io_formats_writers import write_mds  # an indexed folder too

    write_mds(folder / "mds", [{"text": f"sample {i}"} for i in range(6)], {"text": "str"})
    mds = Dataset.from_path("m", f"{base}/mds/", io_options=options)
    assert (mds.format, mds.num_rows) == ("mds", 6)
    assert mds.read_rows(0, [5]) == [{"text": "sample 5"}]
    # another node's cache: its open lists the object and takes its remembered row count
    other = _options(tmp_path / "other")
    later = Dataset.from_path("h", f"{base}/part-0.jsonl", io_options=other, index_cache_dir=index)
    path = folder / "part-0.jsonl"
    path.write_text(path.read_text().replace("row 0", "row 9"))  # same size, later
    os.utime(path, (path.stat().st_atime, path.stat().st_mtime + 10))
    with pytest.raises(DataError, match="changed since it was listed"):
        later.read_rows(0, [0])


class _Failing(http.server.BaseHTTPRequestHandler):
    """Answers every GET with 500 (a store having a bad minute); HEAD as a file of 14 bytes."""

    def do_HEAD(self) -> None:
        self.send_response(200)
        self.send_header("Content-Length", "14")
        self.end_headers()

    def do_GET(self) -> None:
        self.send_error(500)

    def log_message(self, *args: Any) -> None:
        pass


def test_a_signed_http_url_is_no_glob_and_never_shows_its_credentials(
    tmp_path: Path, http_folder: tuple[Path, str]
) -> None:
    """A server error at the open of a signed URL was a ConfigError, "no files found", not
    retried (its "?" was taken for a glob), and errors printed the URL's credentials where the
    URL stood first (a review). A password before the host is blanked too."""
    folder, base = http_folder
    (folder / "a.jsonl").write_text('{"text": "x"}\n')
    os.utime(folder / "a.jsonl", (time.time() + 60,) * 2)  # not settled: a warning names it
    query = "?X-Amz-Credential=AKIAKEYID&X-Amz-Signature=SECRETSIG"
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        signed = Dataset.from_path("h", f"{base}/a.jsonl{query}", io_options=_options(tmp_path))
    assert caught and all("SECRETSIG" not in str(w.message) for w in caught)
    assert signed.read_rows(0, [0]) == [{"text": "x"}]
    retry = {"attempts": 2, "initial_delay": 0.01}
    with serve_in_thread(_Failing) as failing:
        for url in (f"{failing}/a.jsonl{query}", failing.replace("//", "//al:SECRETPW@") + "/a"):
            with pytest.raises(StorageError, match=r"failed after 2 attempt") as raised:
                Dataset.from_path("h", url, format="jsonl", io_options={"retry": retry})
            text = "".join(traceback.format_exception(raised.value))
            assert all(secret not in text for secret in ("AKIAKEYID", "SECRETSIG", "SECRETPW"))
    error = DataError("bad", dataset="h", shard=f"{base}/a.jsonl{query}", row=0)
    assert "SECRETSIG" not in str(error) and error.shard == f"{base}/a.jsonl{query}"
    assert "SECRETPW" not in str(ConfigError("no files at 'https://al:SECRETPW@host/a'"))


@pytest.mark.parametrize(
    ("text", "shown"),
    [
        ("https://al:pa'ss@host/a", "https://al:***@host/a"),  # a quote is legal there
        ("https://al:pa@ss@host/a?b", "https://al:***@host/a?b"),  # so is an unencoded "@"
        ("s3://bucket/a and me:you@host", "s3://bucket/a and me:you@host"),  # no URL's
        ("dataset 'x': a:b@c", "dataset 'x': a:b@c"),
    ],
)
def test_a_url_s_password_is_blanked_and_nothing_else(text: str, shown: str) -> None:
    from zephon_torch.errors import without_secrets

    assert without_secrets(text) == shown


def test_a_config_error_blanks_credentials_in_its_urls_only() -> None:
    """A repr such as `Options(token=None, key=3)` lost its values (a review)."""
    error = ConfigError("Options(token=None, key=3) at https://u:pw@h/a?sig=S&x=1")
    assert str(error) == "Options(token=None, key=3) at https://u:***@h/a?sig=***&x=1"


def test_npy_tokens_open_and_read_from_a_server_that_ignores_ranges(
    tmp_path: Path, http_folder: tuple[Path, str]
) -> None:
    """python's http.server answers a range request with the whole file: each offsets value
    read by range was refused as a file changed since its listing, so no .npy dataset opened
    over such a server (other formats did)."""
    folder, base = http_folder
    tokens = np.arange(3000, dtype=np.int32)
    for shard in range(2):
        np.save(folder / f"{shard}.npy", tokens + shard)
        np.save(folder / f"{shard}.offsets.npy", np.arange(0, 3001, 100, dtype=np.int64))
        for name in (f"{shard}.npy", f"{shard}.offsets.npy"):
            os.utime(folder / name, (time.time() - 10,) * 2)  # settled
    dataset = Dataset.from_path("t", f"{base}/", io_options=_options(tmp_path))
    assert (dataset.format, dataset.num_rows) == ("npy", 60)
    [row] = dataset.read_rows(1, [29])
    assert np.array_equal(np.asarray(row["input_ids"]), tokens[2900:3000] + 1)


def test_an_empty_remote_jsonl_file_is_refused_naming_it(tmp_path: Path) -> None:
    fs = fsspec.filesystem("memory")
    root = _root()
    _put_jsonl(fs, f"{root}/a.jsonl", [{"text": "x"}])
    fs.pipe(f"{root}/b.jsonl", b"")
    with pytest.raises(DataError, match=r"b\.jsonl.*no rows"):
        Dataset.from_path("e", f"memory://{root}", io_options=_options(tmp_path))


def test_parquet_row_counts_are_remembered_so_a_later_open_reads_no_footer(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import zephon_torch.io._remote_rows as remote_rows

    fs = fsspec.filesystem("memory")
    root = _root()
    for number, rows in enumerate((5, 9)):
        _put_parquet(fs, f"{root}/{number}.parquet", pa.table({"n": list(range(rows))}))
    index = str(tmp_path / "index")
    footers: list[str] = []
    count = remote_rows.parquet_layout

    def counted(tail: Any, **where: Any) -> Any:
        footers.append(where["url"])
        return count(tail, **where)

    monkeypatch.setattr(remote_rows, "parquet_layout", counted)

    def open_cold() -> Dataset:
        return Dataset.from_path(
            "p", f"memory://{root}", io_options=_options(tmp_path), index_cache_dir=index
        )

    assert [s.num_rows for s in open_cold().shards] == [5, 9]
    assert len(footers) == 2
    again = open_cold()
    assert [s.num_rows for s in again.shards] == [5, 9]
    assert len(footers) == 2  # nothing read but the listing
    assert again.read_rows(1, [8]) == [{"n": 8}]
    _put_parquet(fs, f"{root}/1.parquet", pa.table({"n": list(range(4))}))  # a new version
    assert [s.num_rows for s in open_cold().shards] == [5, 4]
    assert len(footers) == 3


def test_a_remote_parquet_shard_lacking_a_column_read_is_named_at_the_open(
    tmp_path: Path,
) -> None:
    """A local shard is checked at the open; a remote one was checked at its first read
    (hours into a run, in a worker), from the footer's row count alone."""
    fs = fsspec.filesystem("memory")
    root = _root()
    _put_parquet(fs, f"{root}/0.parquet", pa.table({"text": ["a"], "ids": [[1, 2]]}))
    _put_parquet(fs, f"{root}/1.parquet", pa.table({"text": ["b"], "ids": [["x"]]}))
    index = str(tmp_path / "index")

    def open_(**kwargs: Any) -> Dataset:
        options = _options(tmp_path)
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
    root = _root()
    for number, table in enumerate(
        (pa.table({"text": ["a"], "ids": [[1, 2]]}), pa.table({"text": ["b"], "ids": [["x"]]}))
    ):
        write_vortex(tmp_path / f"{number}.vortex", table)
        fs.pipe(f"{root}/{number}.vortex", (tmp_path / f"{number}.vortex").read_bytes())
    index = str(tmp_path / "index")

    def open_(**kwargs: Any) -> Dataset:
        options = _options(tmp_path)
        url = f"memory://{root}"
        return Dataset.from_path("v", url, io_options=options, index_cache_dir=index, **kwargs)

    assert open_().num_rows == 2  # counted, and remembered with the columns
    for _ in range(2):  # the remembered records, then again
        with pytest.raises(DataError, match=r"0\.vortex.*has no column 'nope'"):
            open_(columns=["text", "nope"])
        with pytest.raises(DataError, match=r"1\.vortex.*token column 'ids' holds list<"):
            open_(token_columns=["ids"])
    assert open_(columns=["text"]).read_rows(1, [0]) == [{"text": "b"}]


def test_row_counts_of_objects_listed_without_a_version_are_not_remembered(
    tmp_path: Path,
) -> None:
    from zephon_torch.io._remote_rows import remember_layout, remembered_layout
    from zephon_torch.io._shard_cache import CachedObject

    index = str(tmp_path / "index")
    versioned = CachedObject(url="s3://b/a.parquet", size=100, version='"etag-1"')
    columns = (("text", "string", False), ("ids", "list<item: int32>", True))
    remember_layout(index, versioned, "parquet", 7, ((3, 100), (4, 120)), columns)
    assert remembered_layout(index, versioned, "parquet") == (7, ((3, 100), (4, 120)), columns)
    bare = CachedObject(url="s3://b/a.parquet", size=100, version="")
    remember_layout(index, bare, "parquet", 9)
    assert remembered_layout(index, bare, "parquet") is None
    # a Parquet record of an older format, or of sizes estimated by another rule, is measured
    # again; one from before formats were kept is a JSONL count where it holds no columns
    old = CachedObject(url="s3://b/a.parquet", size=100, version='"etag-2"')
    remember_layout(index, old, "jsonl", 7)
    record = next(Path(index).rglob(f"{old.name}.json"))
    assert remembered_layout(index, old, "jsonl") == (7, (), ())
    for stale in (
        {"rows": 7},
        {"rows": 7, "blocks": [3, 4]},
        {"rows": 7, "groups": [], "estimate": 0},
        {"rows": 7, "groups": [], "estimate": 1},  # no columns: remembered before they were
    ):
        record.write_text(json.dumps({"url": old.url, **stale}))
        assert remembered_layout(index, old, "parquet") is None
        assert remembered_layout(index, old, "jsonl") == (7, (), ())
    kept = {"url": old.url, "rows": 7, "groups": [[7, 90]], "columns": columns, "estimate": 1}
    record.write_text(json.dumps(kept))
    assert remembered_layout(index, old, "parquet") == (7, ((7, 90),), columns)
    assert remembered_layout(index, old, "jsonl") is None


def test_remembered_row_counts_unread_for_a_week_go_as_records_are_written(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Each version of an object gets a record of its own: a dataset rewritten again and again
    left one per version for ever. A record read is marked used and stays."""
    from zephon_torch.io import _remote_rows
    from zephon_torch.io._remote_rows import remember_layout, remembered_layout
    from zephon_torch.io._shard_cache import CachedObject

    index = str(tmp_path / "index")
    versions = [CachedObject(url="s3://b/a.jsonl", size=10, version=f'"e{i}"') for i in range(3)]
    for item in versions:
        remember_layout(index, item, "jsonl", 5)
    records = {item: next(Path(index).rglob(f"{item.name}.json")) for item in versions}
    old = time.time() - 8 * 24 * 3600
    for record in records.values():
        os.utime(record, (old, old))
    assert remembered_layout(index, versions[1], "jsonl") == (5, (), ())  # read: used now
    user = Path(index) / "remote-rows" / ".a-temporary.tmp"
    user.write_text("")
    os.utime(user, (old, old))
    remember_layout(index, versions[2], "jsonl", 5)  # written again: used now
    assert all(record.exists() for record in records.values())  # no tidy within _TIDY_S
    monkeypatch.setattr(_remote_rows, "_TIDIED", {})  # as a process ten minutes on
    fresh = CachedObject(url="s3://b/a.jsonl", size=10, version='"e3"')
    remember_layout(index, fresh, "jsonl", 5)
    left = {path.name for path in Path(index, "remote-rows").iterdir()}
    assert left == {f"{item.name}.json" for item in (*versions[1:], fresh)} | {user.name}
    assert remembered_layout(index, versions[0], "jsonl") is None  # counted again, once


@pytest.mark.parametrize("where", ["local", "remote"])
def test_a_file_read_with_another_format_before_is_counted_in_the_format_asked(
    tmp_path: Path, where: str
) -> None:
    """A remote object's remembered row count was keyed by its URL, size and version alone:
    a Parquet file without an ending, opened with format="jsonl" and then "parquet", had its
    line count for rows (rows past it lost, or read past the end), and a JSONL file opened
    as Parquet after it its line count, where a local open reads the file as asked."""
    folder = tmp_path / "spark"
    folder.mkdir()
    texts = [f"row {i}\nof\nthree lines" for i in range(9)]
    pq.write_table(pa.table({"text": texts}), folder / "part-0", compression="none")
    (folder / "part-1").write_text("".join(json.dumps({"text": t}) + "\n" for t in texts[:3]))
    path = str(folder)
    if where == "remote":
        path = f"memory://{_root()}"
        fsspec.filesystem("memory").put(str(folder), path.split("://", 1)[1], recursive=True)

    def open_(name: str, format_: str) -> Dataset:
        return Dataset.from_path(
            "s", f"{path}/{name}", format=format_, io_options=_options(tmp_path)
        )

    assert open_("part-0", "jsonl").num_rows > 9  # its newline bytes
    as_parquet = open_("part-0", "parquet")
    assert as_parquet.num_rows == 9
    assert [row["text"] for row in as_parquet.read_rows(0, range(9))] == texts
    assert open_("part-1", "jsonl").num_rows == 3
    with pytest.raises(DataError, match=r"part-1'?: not a readable Parquet file"):
        open_("part-1", "parquet")


def test_a_forked_child_reads_although_a_parent_thread_held_the_readers_locks(
    tmp_path: Path,
) -> None:
    import os
    import threading

    fs = fsspec.filesystem("memory")
    root = _root()
    _put_parquet(fs, f"{root}/a.parquet", pa.table({"n": list(range(10))}))
    dataset = Dataset.from_path("p", f"memory://{root}", io_options=_options(tmp_path))
    assert dataset.read_rows(0, [1]) == [{"n": 1}]  # the parent's file system and cache exist
    reader = dataset._reader
    held = [reader._lock, reader._opening, reader._shard_cache()._pins._lock]  # type: ignore[attr-defined]
    entered, release = threading.Event(), threading.Event()

    def hold() -> None:  # a parent thread inside the reader when the DataLoader forks
        for lock in held:
            lock.acquire()
        entered.set()
        release.wait()
        for lock in held:
            lock.release()

    holder = threading.Thread(target=hold)
    holder.start()
    entered.wait()
    pid = os.fork()
    if pid == 0:  # the child: no thread will ever release the inherited locks
        code = 1
        try:
            done = threading.Event()
            result: list[Any] = []
            worker = threading.Thread(
                target=lambda: (result.append(dataset.read_rows(0, [7])), done.set()),
                daemon=True,
            )
            worker.start()
            if done.wait(10) and result == [[{"n": 7}]]:
                code = 0
        finally:
            os._exit(code)
    release.set()
    holder.join()
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0


def test_the_parquet_row_group_cache_is_set_for_local_and_remote_datasets(
    tmp_path: Path,
) -> None:
    from zephon_torch.io.parquet import ParquetReader

    local_dir = tmp_path / "local"
    local_dir.mkdir()
    pq.write_table(pa.table({"n": list(range(10))}), local_dir / "a.parquet")
    small = {"parquet": {"row_group_cache_bytes": 12345}}

    def bound(dataset: Dataset) -> int:
        reader = dataset._reader
        if not isinstance(reader, ParquetReader):  # remote: the local reader behind it
            reader = reader._open()[0]  # type: ignore[attr-defined]
        assert isinstance(reader, ParquetReader)
        return reader.max_row_group_bytes

    local = Dataset.from_path("l", local_dir)
    assert bound(local) == 256 << 20
    assert bound(Dataset.from_path("l", local_dir, io_options=small)) == 12345
    resized = local.with_io_options(small)
    assert bound(resized) == 12345 and bound(local) == 256 << 20
    assert resized.read_rows(0, [3]) == local.read_rows(0, [3])
    assert local.with_io_options({"cache": {"max_bytes": 1 << 20}}) is local
    for kept in ({"parquet": {}}, {"parquet": None}):  # the keys not given are kept
        assert bound(resized.with_io_options(kept)) == 12345
    source = StaticMixtureWorkSource([local], seed=0, exhaustion="stop")
    assert bound(Pipeline(source).options(io_options=small)._datasets[0]) == 12345

    root, _ = _equal_parquet_shards(2)
    remote = Dataset.from_path("r", f"memory://{root}", io_options={**_options(tmp_path), **small})
    assert bound(remote) == 12345
    moved = remote.with_io_options({"parquet": {"row_group_cache_bytes": 777}})
    assert bound(moved) == 777
    for bad in ({"parquet": {"row_group_cache_bytes": 0}}, {"parquet": {"rows": 1}}):
        with pytest.raises(ConfigError, match="parquet"):
            local.with_io_options(bad)


def test_a_big_remote_parquet_shard_is_split_into_the_blocks_of_its_local_copy(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import zephon_torch.io._remote_rows as remote_rows
    from zephon_torch.io import parquet

    fs = fsspec.filesystem("memory")
    root = _root()
    local = tmp_path / "local"
    local.mkdir()
    table = pa.table(
        {"ids": pa.array([[i, i + 1, i + 2] for i in range(600)], pa.list_(pa.int32()))}
    )
    for number in range(2):
        pq.write_table(table, local / f"{number}.parquet", row_group_size=50)
        _put_parquet(fs, f"{root}/{number}.parquet", table, row_group_size=50)
    group = parquet.decoded_bytes(pq.ParquetFile(local / "0.parquet").metadata.row_group(0))
    monkeypatch.setattr(parquet, "WINDOW_BLOCK_BYTES", 3 * group + group // 2)
    on_disk = Dataset.from_path("p", local, token_columns=["ids"])

    def open_remote() -> Dataset:
        return Dataset.from_path(
            "p",
            f"memory://{root}",
            token_columns=["ids"],
            io_options=_options(tmp_path),
            index_cache_dir=str(tmp_path / "index"),
        )

    remote = open_remote()
    assert [s.blocks for s in remote.shards] == [(150, 150, 150, 150)] * 2
    assert [s.blocks for s in on_disk.shards] == [(150, 150, 150, 150)] * 2
    assert remote.fingerprint()["blocks_digest"] == on_disk.fingerprint()["blocks_digest"]

    def no_footer(*_: Any, **__: Any) -> Any:
        raise AssertionError("a remembered shard's footer was read again")

    monkeypatch.setattr(remote_rows, "parquet_layout", no_footer)
    assert [s.blocks for s in open_remote().shards] == [(150, 150, 150, 150)] * 2

    def build(dataset: Dataset) -> Pipeline:
        source = StaticMixtureWorkSource([dataset], seed=2, shuffle_window_shards=2)
        return Pipeline(source).pretokenized("ids").pack_flat(32).batch(2)

    assert keys(build(remote)) == keys(build(on_disk))


def test_remembered_remote_sizes_give_the_blocks_of_the_current_block_size(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Row-group sizes are remembered, not blocks: a later block size applies to a remote
    reopen as to a local open (blocks remembered as such went stale)."""
    from zephon_torch.io import parquet

    fs = fsspec.filesystem("memory")
    root = _root()
    local = tmp_path / "local"
    local.mkdir()
    table = pa.table({"ids": pa.array([[i, i] for i in range(600)], pa.list_(pa.int32()))})
    pq.write_table(table, local / "0.parquet", row_group_size=50)
    _put_parquet(fs, f"{root}/0.parquet", table, row_group_size=50)
    group = parquet.decoded_bytes(pq.ParquetFile(local / "0.parquet").metadata.row_group(0))

    def blocks(path: str) -> tuple[int, ...]:
        options = {"io_options": _options(tmp_path), "index_cache_dir": str(tmp_path / "i")}
        return Dataset.from_path("p", path, **options).shards[0].blocks

    for size, expected in ((3, (150,) * 4), (6, (300, 300)), (100, ())):
        monkeypatch.setattr(parquet, "WINDOW_BLOCK_BYTES", size * group + group // 2)
        assert blocks(f"memory://{root}") == blocks(str(local)) == expected


def test_an_object_listed_without_a_version_is_downloaded_again_by_each_open(
    tmp_path: Path,
) -> None:
    """A server that sends no ETag or Last-Modified: a rewrite of the same size was served
    from the node cache's old copy by every later job, silently."""
    from tests.helpers import serve_without_versions

    folder = tmp_path / "served"
    folder.mkdir()
    options = _options(tmp_path)
    index = str(tmp_path / "index")
    with serve_without_versions(folder) as base:
        url = f"{base}/data.jsonl"
        for tag in ("OLD", "NEW"):  # the same size
            (folder / "data.jsonl").write_text(json.dumps({"text": tag}) + "\n")
            with pytest.warns(UserWarning, match="without a version .* downloads them again"):
                dataset = Dataset.from_path("h", url, io_options=options, index_cache_dir=index)
            assert dataset.read_rows(0, [0]) == [{"text": tag}]
    # what each open counted is keyed by its own version: kept, it would pile up unread
    assert not Path(index).exists() or not any(Path(index).rglob("*.*"))


def test_opens_versioned_per_open_share_one_index_folder_and_dead_processes_are_swept(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Each such open made its own temporary index folder and exit hook (60 opens: 60 folders),
    and a process killed before its exit hooks left its folder in /tmp for good. A process now
    has one folder, locked for its life; the next process to make one removes those no process
    holds (a killed one's), and keeps a live one's."""
    import subprocess
    import sys
    import tempfile

    from tests.helpers import serve_without_versions
    from zephon_torch.io import _versions

    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    monkeypatch.setattr(_versions, "_OWN_INDEX", {})
    make = "from zephon_torch.io._versions import per_open_index_dir as d; print(d(), flush=True)"
    live = subprocess.Popen(
        [sys.executable, "-c", f"{make}; import sys; sys.stdin.read()"],
        env={**os.environ, "TMPDIR": str(tmp_path)},
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert live.stdout is not None
        held = live.stdout.readline().strip()
        dead = subprocess.run(
            [sys.executable, "-c", f"{make}; import os; os._exit(0)"],  # no exit hooks: killed
            env={**os.environ, "TMPDIR": str(tmp_path)},
            capture_output=True,
            text=True,
            check=True,
        ).stdout.strip()
        assert os.path.isdir(dead) and os.path.isdir(held)
        folder = tmp_path / "served"
        folder.mkdir()
        (folder / "data.jsonl").write_text(json.dumps({"text": "a"}) + "\n")
        with serve_without_versions(folder) as base:
            opened = []
            for _ in range(3):
                with pytest.warns(UserWarning, match="without a version"):
                    opened.append(
                        Dataset.from_path("h", f"{base}/data.jsonl", io_options=_options(tmp_path))
                    )
                assert opened[-1].read_rows(0, [0]) == [{"text": "a"}]
        ours = {dataset._reader.index_cache_dir for dataset in opened}
        assert len(ours) == 1 and os.path.dirname(ours.pop()) == str(tmp_path)
        assert not os.path.exists(dead)  # swept
        assert os.path.isdir(held)  # its process lives
        assert len(list(tmp_path.glob("zephon-open-index-*"))) == 2
    finally:
        live.communicate("", timeout=30)
        for fd in _versions._OWN_INDEX.values():  # this test's folder: its lock let go
            os.close(fd)


def test_a_same_size_rewrite_within_the_second_of_its_last_modified_is_read_anew(
    tmp_path: Path, http_folder: tuple[Path, str]
) -> None:
    """A server whose only version is Last-Modified (whole seconds): a rewrite of the same size
    in the second a listing saw kept its version, and every later open read the cached old
    copy. A Last-Modified under 2 s old is now versioned by the open; an older one is kept."""
    import warnings

    folder, base = http_folder
    options = _options(tmp_path)
    path = folder / "data.jsonl"
    second = int(time.time())
    for tag in ("OLD", "NEW"):  # the same size, the same Last-Modified
        path.write_text(json.dumps({"text": tag}) + "\n")
        os.utime(path, (second, second))
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # the first open warns; the second, if still racy
            dataset = Dataset.from_path("h", f"{base}/data.jsonl", io_options=options)
        assert dataset.read_rows(0, [0]) == [{"text": tag}]
    os.utime(path, (second - 10, second - 10))  # settled: one download, kept, no warning
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        for _ in range(2):
            dataset = Dataset.from_path("h", f"{base}/data.jsonl", io_options=options)
            assert dataset.read_rows(0, [0]) == [{"text": "NEW"}]
    names = [p.name for p in (tmp_path / "cache").rglob("*data.jsonl")]
    assert len(names) == len(set(names)) == 3, names


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
    root = _root()
    names = ["a/x.jsonl", "a/_meta.jsonl", "a/.hidden.jsonl", ".h/y.jsonl", "a-b/v.jsonl"]
    names += [".h/.z.jsonl", "s/.x/g.jsonl", ".a/.x/f.jsonl"]
    for number, name in enumerate(names):
        (tmp_path / "local" / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / "local" / name).write_text(json.dumps({"i": number}) + "\n")
        _put_jsonl(fs, f"{root}/{name}", [{"i": number}])
    options = _options(tmp_path)
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
        path = f"memory://{_root()}"
        fsspec.filesystem("memory").put(str(folder), path.split("://", 1)[1], recursive=True)
    options = _options(tmp_path)
    for name, shards in (
        ("a[1].jsonl", {"a[1].jsonl": 3}),
        ("run[2]", {"run[2]/x.jsonl": 4}),
        ("run[2]/", {"run[2]/x.jsonl": 4}),
        ("a[12].jsonl", {"a1.jsonl": 2}),  # no such name: a glob
    ):
        dataset = Dataset.from_path("d", f"{path}/{name}", io_options=options)
        assert {s.path[len(path) + 1 :]: s.num_rows for s in dataset.shards} == shards, name


def test_a_damaged_remote_index_is_a_data_error_naming_dataset_and_index(tmp_path: Path) -> None:
    """As a local one: a ConfigError naming neither before."""
    from tests.unit.io.test_io_formats_writers import write_mds

    write_mds(tmp_path / "mds", [{"text": f"sample {i}"} for i in range(6)], {"text": "str"})
    fs = fsspec.filesystem("memory")
    root = _root()
    for file in (tmp_path / "mds").iterdir():
        fs.pipe(f"{root}/{file.name}", file.read_bytes())
    fs.pipe(f"{root}/index.json", b'{"shards": [{"format": "mds", "column_')  # cut short
    for format_ in ("mds", None):
        with pytest.raises(DataError, match=r"does not read as an MDS or LitData index") as caught:
            Dataset.from_path(
                "m", f"memory://{root}/", format=format_, io_options=_options(tmp_path)
            )
        assert caught.value.dataset == "m"
        assert caught.value.shard is not None and caught.value.shard.endswith("/index.json")


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
