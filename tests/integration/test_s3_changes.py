"""Objects on S3 (moto on loopback, read through the real s3fs) that change, shrink or go while
they are read by range: at the open (Parquet footers, `.npy` headers) and in a ranged download.
Each is a DataError naming the dataset and shard, never a bare client error.

A writer's change between an open's listing and its row counts is staged by running it inside
`versioned_per_open`, which `_opening._open_remote` calls between the two; one between s3fs's
own HEAD and its range GETs by a proxy that runs it before it forwards the first range GET."""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from tests.hooked_proxy import hooked_proxy
from tests.object_stores import s3_storage
from zephon_torch._moto import client, upload
from zephon_torch.errors import DataError
from zephon_torch.io import Dataset, _opening
from zephon_torch.io._download import fetch
from zephon_torch.io._filesystems import open_filesystem
from zephon_torch.io._retry import RetryPolicy
from zephon_torch.io._shard_cache import CachedObject
from zephon_torch.io._versions import identity

pytest.importorskip("boto3")
pytest.importorskip("s3fs")
pytest.importorskip("moto.server")


pytestmark = pytest.mark.usefixtures("private_cache")


def _options(tmp_path: Path) -> dict[str, Any]:
    return {
        "cache": {"dir": str(tmp_path / "cache"), "prefetch_bytes": 0},
        "retry": {"attempts": 2, "initial_delay": 0.01},
    }


def _parquet(path: Path, rows: int, tag: str = "v1") -> Path:
    """A Parquet file of `rows` rows: 8,000 make about 130 KB, past the footer's 64 KiB guess,
    so its footer is read from a range that starts past a 40-row file's end."""
    docs = [{"text": f"{tag} doc {i:05d} " * 4, "id": i} for i in range(rows)]
    path.parent.mkdir(parents=True, exist_ok=True)
    pq.write_table(pa.Table.from_pylist(docs), path)
    return path


def _npy(folder: Path) -> Path:
    """A 1-D token file with its offsets file, and a 2-D token file."""
    folder.mkdir()
    np.save(folder / "0.npy", np.arange(100_000, dtype=np.int32))
    np.save(folder / "0.offsets.npy", np.arange(0, 100_001, 100, dtype=np.int64))
    np.save(folder / "1.npy", np.arange(1000, dtype=np.int32).reshape(100, 10))
    return folder


def _after_listing(monkeypatch: pytest.MonkeyPatch, change: Callable[[], None]) -> None:
    """Runs `change` between the next open's listing and its row counts."""
    real = _opening.versioned_per_open

    def hooked(objects: Any, name: str) -> Any:
        change()
        return real(objects, name)

    monkeypatch.setattr(_opening, "versioned_per_open", hooked)


@pytest.mark.parametrize(
    ("kind", "change", "shard", "said"),
    [
        ("parquet", "shrunk", "part-1.parquet", r"part-1\.parquet.*changed since it was listed"),
        ("parquet", "deleted", "part-1.parquet", "the object is missing since it was listed"),
        ("npy", "replaced", "0.npy", r"0\.offsets\.npy.*changed since it was listed"),
        ("npy", "deleted", "1.npy", "the object is missing since it was listed"),
    ],
    ids=["parquet-shrunk", "parquet-deleted", "npy-offsets-replaced", "npy-deleted"],
)
def test_an_object_changed_between_the_listing_and_its_range_reads_is_a_data_error_naming_it(
    s3_server: tuple[str, Any],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    kind: str,
    change: str,
    shard: str,
    said: str,
) -> None:
    """Each was a bare OSError (S3's 416 for a range past the new end), FileNotFoundError or
    s3fs's FileExpired, with no dataset and no URL."""
    endpoint, _ = s3_server
    prefix = f"{kind}-{change}"
    if kind == "parquet":
        local = tmp_path / "local"
        for number in range(2):
            _parquet(local / f"part-{number}.parquet", 8000)
    else:
        local = _npy(tmp_path / "local")
    upload(endpoint, local, "bucket", prefix)
    key = f"{prefix}/{'0.offsets.npy' if change == 'replaced' else shard}"
    s3 = client(endpoint)
    if change == "deleted":
        _after_listing(monkeypatch, lambda: s3.delete_object(Bucket="bucket", Key=key))
    else:
        new = _parquet(tmp_path / "v2.parquet", 40).read_bytes() if kind == "parquet" else b"x"
        _after_listing(monkeypatch, lambda: s3.put_object(Bucket="bucket", Key=key, Body=new))
    with pytest.raises(DataError, match=said) as caught:
        Dataset.from_path(
            "d",
            f"s3://bucket/{prefix}/",
            storage_options=s3_storage(endpoint),
            io_options=_options(tmp_path),
        )
    assert (caught.value.dataset, caught.value.shard) == ("d", f"s3://bucket/{prefix}/{shard}")


def test_a_shard_shrunk_during_its_ranged_download_is_a_data_error_naming_it(
    s3_server: tuple[str, Any], tmp_path: Path
) -> None:
    """s3fs downloads an object past its block size (50 MiB by default, 32 KiB here) by
    concurrent range GETs; one past the object's new end was S3's 416 as a bare OSError."""
    endpoint, _ = s3_server
    _parquet(tmp_path / "local" / "part-0.parquet", 8000)
    upload(endpoint, tmp_path / "local", "bucket", "ranged")
    small = _parquet(tmp_path / "v2.parquet", 40).read_bytes()
    armed: list[bool] = []

    def shrink_at_the_first_range_get(method: str, path: str, headers: dict[str, str]) -> None:
        if armed == [True] and method == "GET" and headers.get("Range"):
            armed.append(False)
            client(endpoint).put_object(Bucket="bucket", Key="ranged/part-0.parquet", Body=small)

    with hooked_proxy(endpoint, shrink_at_the_first_range_get) as proxy:
        storage = {**s3_storage(proxy), "default_block_size": 32 << 10}
        remote = Dataset.from_path(
            "d", "s3://bucket/ranged/", storage_options=storage, io_options=_options(tmp_path)
        )
        armed.append(True)  # after the open's footer read
        with pytest.raises(DataError, match="changed since it was listed") as caught:
            remote.read_rows(0, [0])
    assert armed == [True, False]
    assert (caught.value.dataset, caught.value.shard) == ("d", "s3://bucket/ranged/part-0.parquet")


def test_a_footer_read_from_a_rewrite_after_the_listing_is_not_remembered_for_the_listed_one(
    s3_server: tuple[str, Any], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The footer is read by range, untied to the listed version: a rewrite between the listing
    and that read was remembered as the listed version's row count (40 for 1,000 rows), and
    once the object came back to the listed bytes (S3's ETag is their MD5), every later open
    read 40 rows of it, every pass, with no error."""
    endpoint, _ = s3_server
    for number in range(2):
        _parquet(tmp_path / "v1" / f"part-{number}.parquet", 1000)
    upload(endpoint, tmp_path / "v1", "bucket", "rewritten")
    listed = (tmp_path / "v1" / "part-1.parquet").read_bytes()
    rewrite = _parquet(tmp_path / "v2.parquet", 40, tag="v2").read_bytes()
    s3 = client(endpoint)

    def put(body: bytes) -> None:
        s3.put_object(Bucket="bucket", Key="rewritten/part-1.parquet", Body=body)

    def open_it() -> Dataset:
        storage = s3_storage(endpoint)
        options = _options(tmp_path)
        return Dataset.from_path(
            "d", "s3://bucket/rewritten/", storage_options=storage, io_options=options
        )

    writes = [rewrite]  # by the first open's writer only
    _after_listing(monkeypatch, lambda: put(writes.pop()) if writes else None)
    with pytest.raises(DataError, match="changed since it was listed") as caught:
        open_it()
    assert caught.value.shard == "s3://bucket/rewritten/part-1.parquet"
    put(listed)  # rolled back: the listed bytes, size and ETag again
    again = open_it()
    assert [shard.num_rows for shard in again.shards] == [1000, 1000]
    assert len(again.read_rows(1, list(range(1000)))) == 1000


def test_an_object_rewritten_larger_after_the_listing_is_not_downloaded_whole(
    s3_server: tuple[str, Any], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The whole new object was copied into the cache (past its reservation and `max_bytes`:
    4.9x in a review's run) before its size was compared with the listing's; on a disk too
    small for it that was a `CacheDiskFullError` instead of this DataError."""
    import shutil

    import s3fs

    endpoint, _ = s3_server
    written: list[int] = []
    real_get_file = s3fs.S3FileSystem._get_file

    async def get_file(self: Any, path: str, target: str, **options: Any) -> Any:
        try:
            return await real_get_file(self, path, target, **options)
        finally:
            written.append(os.path.getsize(target))

    # before the file system is made: it binds its sync methods to these as it is made
    monkeypatch.setattr(s3fs.S3FileSystem, "_get_file", get_file)
    local = tmp_path / "local"
    local.mkdir()
    (local / "part-0.jsonl").write_text("".join(f'{{"text": "doc {i}"}}\n' for i in range(50)))
    upload(endpoint, local, "bucket", "grown")
    listed = (local / "part-0.jsonl").stat().st_size
    options = _options(tmp_path)
    remote = Dataset.from_path(
        "d", "s3://bucket/grown/", storage_options=s3_storage(endpoint), io_options=options
    )
    shutil.rmtree(options["cache"]["dir"])  # the open's copy (it counted the rows) goes
    grown = b'{"text": "a much longer document"}\n' * 250_000  # 9 MB
    client(endpoint).put_object(Bucket="bucket", Key="grown/part-0.jsonl", Body=grown)
    with pytest.raises(DataError, match="changed since it was listed") as caught:
        remote.read_rows(0, [0])
    assert (caught.value.dataset, caught.value.shard) == ("d", "s3://bucket/grown/part-0.jsonl")
    assert len(written) == 2 and max(written) <= listed + (1 << 20), written  # 64 KiB pieces


def _listed_object(endpoint: str, tmp_path: Path, body: bytes) -> tuple[Any, str, CachedObject]:
    """s3fs's file system on moto at `endpoint`, the path of an object holding `body`, and
    the object as a listing gives it."""
    local = tmp_path / "local"
    local.mkdir()
    (local / "part-0.jsonl").write_bytes(body)
    upload(endpoint, local, "bucket", "fetched")
    fs, _ = open_filesystem("s3://bucket/fetched/", s3_storage(endpoint))
    path = "bucket/fetched/part-0.jsonl"
    return fs, path, identity(f"s3://{path}", fs.info(path))


def test_a_download_answered_with_the_listed_etag_asks_the_store_nothing_more(
    s3_server: tuple[str, Any], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Each download was followed by a HEAD asking whether the object was still as listed:
    about 2.5 ms of CPU an object (as much as moving 1.5 MB) and a round trip, where the
    GET's own answer already named the version its bytes came from."""
    import s3fs

    endpoint, _ = s3_server
    body = b'{"text": "doc"}\n' * 1000
    fs, path, item = _listed_object(endpoint, tmp_path, body)
    called: list[str] = []
    real_call = s3fs.S3FileSystem._call_s3

    async def call_s3(self: Any, method: str, *args: Any, **kwargs: Any) -> Any:
        called.append(method)
        return await real_call(self, method, *args, **kwargs)

    monkeypatch.setattr(s3fs.S3FileSystem, "_call_s3", call_s3)
    target = tmp_path / "copy"
    fetch(fs, path, item, str(target), dataset="d", retry=RetryPolicy(), show=False)
    assert called == ["get_object"]
    assert target.read_bytes() == body


def test_a_download_answered_by_another_version_than_the_listed_one_is_a_data_error(
    s3_server: tuple[str, Any], tmp_path: Path
) -> None:
    """A rewrite of the same size after the listing: the GET's ETag is not the listed one, so
    the download is no proof of the listed version, and the store is asked."""
    endpoint, _ = s3_server
    fs, path, item = _listed_object(endpoint, tmp_path, b'{"text": "v1"}\n' * 1000)
    client(endpoint).put_object(Bucket="bucket", Key=path.split("/", 1)[1], Body=b"x" * item.size)
    with pytest.raises(DataError, match="changed since it was listed") as caught:
        fetch(fs, path, item, str(tmp_path / "copy"), dataset="d", retry=RetryPolicy(), show=False)
    assert caught.value.shard == f"s3://{path}"
