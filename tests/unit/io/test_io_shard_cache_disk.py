"""The shard cache on a disk that fills before `max_bytes` (64 GiB by default, more than many
nodes have free): unpinned shards are evicted to make room, else a ConfigError names the folder
and the limit. The disk is a real 64 KiB tmpfs, which only root can mount: skipped elsewhere."""

from __future__ import annotations

import os
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from zephon_torch.errors import ConfigError
from zephon_torch.io._shard_cache import CachedObject, ShardCache

_SHARD = 25_000  # two fit on the disk, a third does not


@pytest.fixture
def small_disk(tmp_path: Path) -> Iterator[Path]:
    """A 64 KiB tmpfs mounted at a fresh folder."""
    if os.geteuid() != 0:
        pytest.skip("mounting a tmpfs needs root")
    disk = tmp_path / "disk"
    disk.mkdir()
    mounted = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=64k", "tmpfs", str(disk)],
        capture_output=True,
        check=False,
    )
    if mounted.returncode != 0:  # root without CAP_SYS_ADMIN (a container)
        pytest.skip(f"cannot mount a tmpfs: {mounted.stderr.decode().strip()}")
    try:
        yield disk
    finally:
        subprocess.run(["umount", "-l", str(disk)], check=False)


def _item(name: str) -> CachedObject:
    return CachedObject(url=f"s3://bucket/{name}", size=_SHARD, version="v1")


def _download(target: str) -> None:
    with open(target, "wb") as handle:
        handle.write(b"x" * _SHARD)


def test_a_full_disk_evicts_unpinned_shards_to_make_room(small_disk: Path) -> None:
    """ENOSPC was retried as a transient store failure, then raised as a StorageError blaming
    the remote URL, while the cache held shards it could evict."""
    cache = ShardCache(str(small_disk / "cache"), max_bytes=1 << 30)
    cache.ensure(_item("a.parquet"), _download, pin=False)
    cache.ensure(_item("b.parquet"), _download, pin=False)
    os.utime(cache.path(_item("a.parquet")), (1, 1))  # the least recently used
    path = cache.ensure(_item("c.parquet"), _download, pin=False)
    assert os.path.getsize(path) == _SHARD
    assert not os.path.exists(cache.path(_item("a.parquet")))
    assert os.path.exists(cache.path(_item("b.parquet")))


def test_a_disk_full_of_shards_in_use_is_a_config_error_naming_the_folder_and_limit(
    small_disk: Path,
) -> None:
    cache = ShardCache(str(small_disk / "cache"), max_bytes=1 << 30)
    with (
        cache.open(_item("a.parquet"), _download),
        cache.open(_item("b.parquet"), _download),
        pytest.raises(ConfigError, match=r"disk of the shard cache folder .*max_bytes") as caught,
    ):
        cache.ensure(_item("c.parquet"), _download, pin=False)
    assert str(small_disk / "cache") in str(caught.value)
    assert "s3://bucket/c.parquet" in str(caught.value)
    assert os.listdir(small_disk / "cache" / ".downloading") == []
