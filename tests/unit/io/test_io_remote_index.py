"""What a remote open remembers (row counts, sizes, blocks in the index folder) and when it
reads or downloads again instead: objects without a version, rewrites, damaged indexes."""

from __future__ import annotations

import json
import os
import sys
import time
import warnings
from pathlib import Path
from typing import Any

import fsspec
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from tests.helpers import keys
from tests.memory_store import (
    equal_parquet_shards,
    fresh_root,
    put_jsonl,
    put_parquet,
    remote_options,
)
from zephon_torch import Pipeline
from zephon_torch.errors import ConfigError, DataError
from zephon_torch.io import Dataset
from zephon_torch.work import StaticMixtureWorkSource


def test_jsonl_row_counts_are_remembered_so_a_later_open_downloads_nothing(
    tmp_path: Path,
) -> None:
    fs = fsspec.filesystem("memory")
    root = fresh_root()
    for number in range(3):
        put_jsonl(fs, f"{root}/{number}.jsonl", [{"text": f"{number}-{i}"} for i in range(4)])
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
    put_jsonl(fs, f"{root}/1.jsonl", [{"text": "changed"}] * 6)  # a new version: counted again
    third = open_cold("third")
    assert [s.num_rows for s in third.shards] == [4, 6, 4]
    changed = fs.size(f"{root}/1.jsonl")
    assert third.cache_counters() == {"hits": 0, "misses": 1, "bytes_downloaded": changed}


def test_parquet_row_counts_are_remembered_so_a_later_open_reads_no_footer(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import zephon_torch.io._remote_rows as remote_rows

    fs = fsspec.filesystem("memory")
    root = fresh_root()
    for number, rows in enumerate((5, 9)):
        put_parquet(fs, f"{root}/{number}.parquet", pa.table({"n": list(range(rows))}))
    index = str(tmp_path / "index")
    footers: list[str] = []
    count = remote_rows.parquet_layout

    def counted(tail: Any, **where: Any) -> Any:
        footers.append(where["url"])
        return count(tail, **where)

    monkeypatch.setattr(remote_rows, "parquet_layout", counted)

    def open_cold() -> Dataset:
        return Dataset.from_path(
            "p", f"memory://{root}", io_options=remote_options(tmp_path), index_cache_dir=index
        )

    assert [s.num_rows for s in open_cold().shards] == [5, 9]
    assert len(footers) == 2
    again = open_cold()
    assert [s.num_rows for s in again.shards] == [5, 9]
    assert len(footers) == 2  # nothing read but the listing
    assert again.read_rows(1, [8]) == [{"n": 8}]
    put_parquet(fs, f"{root}/1.parquet", pa.table({"n": list(range(4))}))  # a new version
    assert [s.num_rows for s in open_cold().shards] == [5, 4]
    assert len(footers) == 3


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
        path = f"memory://{fresh_root()}"
        fsspec.filesystem("memory").put(str(folder), path.split("://", 1)[1], recursive=True)

    def open_(name: str, format_: str) -> Dataset:
        return Dataset.from_path(
            "s", f"{path}/{name}", format=format_, io_options=remote_options(tmp_path)
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
    root = fresh_root()
    put_parquet(fs, f"{root}/a.parquet", pa.table({"n": list(range(10))}))
    dataset = Dataset.from_path("p", f"memory://{root}", io_options=remote_options(tmp_path))
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

    root, _ = equal_parquet_shards(2)
    remote = Dataset.from_path(
        "r", f"memory://{root}", io_options={**remote_options(tmp_path), **small}
    )
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
    root = fresh_root()
    local = tmp_path / "local"
    local.mkdir()
    table = pa.table(
        {"ids": pa.array([[i, i + 1, i + 2] for i in range(600)], pa.list_(pa.int32()))}
    )
    for number in range(2):
        pq.write_table(table, local / f"{number}.parquet", row_group_size=50)
        put_parquet(fs, f"{root}/{number}.parquet", table, row_group_size=50)
    group = parquet.decoded_bytes(pq.ParquetFile(local / "0.parquet").metadata.row_group(0))
    monkeypatch.setattr(parquet, "WINDOW_BLOCK_BYTES", 3 * group + group // 2)
    on_disk = Dataset.from_path("p", local, token_columns=["ids"])

    def open_remote() -> Dataset:
        return Dataset.from_path(
            "p",
            f"memory://{root}",
            token_columns=["ids"],
            io_options=remote_options(tmp_path),
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
    root = fresh_root()
    local = tmp_path / "local"
    local.mkdir()
    table = pa.table({"ids": pa.array([[i, i] for i in range(600)], pa.list_(pa.int32()))})
    pq.write_table(table, local / "0.parquet", row_group_size=50)
    put_parquet(fs, f"{root}/0.parquet", table, row_group_size=50)
    group = parquet.decoded_bytes(pq.ParquetFile(local / "0.parquet").metadata.row_group(0))

    def blocks(path: str) -> tuple[int, ...]:
        options = {"io_options": remote_options(tmp_path), "index_cache_dir": str(tmp_path / "i")}
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
    options = remote_options(tmp_path)
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
                        Dataset.from_path(
                            "h", f"{base}/data.jsonl", io_options=remote_options(tmp_path)
                        )
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

    folder, base = http_folder
    options = remote_options(tmp_path)
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


def test_a_damaged_remote_index_is_a_data_error_naming_dataset_and_index(tmp_path: Path) -> None:
    """As a local one: a ConfigError naming neither before."""
    from tests.unit.io.test_io_formats_writers import write_mds

    write_mds(tmp_path / "mds", [{"text": f"sample {i}"} for i in range(6)], {"text": "str"})
    fs = fsspec.filesystem("memory")
    root = fresh_root()
    for file in (tmp_path / "mds").iterdir():
        fs.pipe(f"{root}/{file.name}", file.read_bytes())
    fs.pipe(f"{root}/index.json", b'{"shards": [{"format": "mds", "column_')  # cut short
    for format_ in ("mds", None):
        with pytest.raises(DataError, match=r"does not read as an MDS or LitData index") as caught:
            Dataset.from_path(
                "m", f"memory://{root}/", format=format_, io_options=remote_options(tmp_path)
            )
        assert caught.value.dataset == "m"
        assert caught.value.shard is not None and caught.value.shard.endswith("/index.json")
