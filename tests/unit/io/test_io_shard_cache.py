"""The node-local shard cache: LRU eviction, atomic downloads, pins, several processes."""

from __future__ import annotations

import hashlib
import multiprocessing
import os
import threading
import time
from collections.abc import Callable
from pathlib import Path

import fsspec
import pytest

from zephon_torch.errors import ConfigError
from zephon_torch.io import Dataset
from zephon_torch.io._shard_cache import CachedObject, ShardCache


def _item(name: str, size: int, version: str = "v1") -> CachedObject:
    return CachedObject(url=f"s3://bucket/{name}", size=size, version=version)


def _writer(content: bytes, delay: float = 0.0) -> Callable[[str], None]:
    def download(target: str) -> None:
        with open(target, "wb") as handle:
            half = len(content) // 2
            handle.write(content[:half])
            handle.flush()
            time.sleep(delay)
            handle.write(content[half:])

    return download


def _cached(directory: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in directory.iterdir() if not p.name.startswith(".")}


def test_the_least_recently_used_shard_is_evicted_first(tmp_path: Path) -> None:
    cache = ShardCache(str(tmp_path), max_bytes=300)
    a, b, c = _item("a.jsonl", 100), _item("b.jsonl", 100), _item("c.jsonl", 100)
    for item in (a, b, c):
        cache.ensure(item, _writer(b"x" * 100), pin=False)
        time.sleep(0.01)
    cache.ensure(a, _writer(b"never called"), pin=False)  # a is now the newest
    cache.ensure(_item("d.jsonl", 100), _writer(b"y" * 100), pin=False)
    names = {name.split("-", 1)[1] for name in _cached(tmp_path)}
    assert names == {"a.jsonl", "c.jsonl", "d.jsonl"}
    assert cache.used_bytes() <= 300


def test_a_shard_in_use_is_never_evicted(tmp_path: Path) -> None:
    cache = ShardCache(str(tmp_path), max_bytes=200, full_timeout=0.3)
    a, b = _item("a.jsonl", 100), _item("b.jsonl", 100)
    with cache.open(a, _writer(b"a" * 100)) as path_a, cache.open(b, _writer(b"b" * 100)):
        with pytest.raises(OSError, match="full of shards in use"):
            cache.ensure(_item("c.jsonl", 100), _writer(b"c" * 100), pin=False)
        assert Path(path_a).read_bytes() == b"a" * 100
    cache.ensure(_item("c.jsonl", 100), _writer(b"c" * 100), pin=False)
    assert cache.used_bytes() == 200


def test_no_partial_file_is_ever_visible(tmp_path: Path) -> None:
    cache = ShardCache(str(tmp_path), max_bytes=10_000)
    item = _item("slow.jsonl", 1000)
    seen: list[int] = []
    stop = threading.Event()

    def watch() -> None:
        while not stop.is_set():
            if os.path.exists(cache.path(item)):
                seen.append(os.path.getsize(cache.path(item)))

    watcher = threading.Thread(target=watch)
    watcher.start()
    cache.ensure(item, _writer(b"z" * 1000, delay=0.2), pin=False)
    deadline = time.monotonic() + 5  # a loaded machine may not have run the watcher yet
    while not seen and time.monotonic() < deadline:
        time.sleep(0.01)
    stop.set()
    watcher.join()
    assert seen and set(seen) == {1000}


def test_a_failed_or_short_download_leaves_nothing_behind(tmp_path: Path) -> None:
    cache = ShardCache(str(tmp_path), max_bytes=10_000)
    with pytest.raises(OSError, match="expected 100"):
        cache.ensure(_item("a.jsonl", 100), _writer(b"short"), pin=False)
    assert _cached(tmp_path) == {}
    assert os.listdir(tmp_path / ".tmp") == []
    assert os.listdir(tmp_path / ".reserve") == []


def test_a_shard_larger_than_the_limit_is_an_error_naming_it(tmp_path: Path) -> None:
    cache = ShardCache(str(tmp_path), max_bytes=10)
    with pytest.raises(ConfigError, match=r"s3://bucket/huge.parquet"):
        cache.ensure(_item("huge.parquet", 11), _writer(b"x" * 11), pin=False)


def _fill(directory: str, seed: int) -> None:
    cache = ShardCache(directory, max_bytes=2500)
    order = list(range(12))
    order = order[seed:] + order[:seed]
    for number in order:
        content = hashlib.sha256(str(number).encode()).digest() * 16  # 512 bytes
        item = _item(f"{number}.bin", len(content))
        with cache.open(item, _writer(content, delay=0.005)) as path:
            assert Path(path).read_bytes() == content
            assert cache.used_bytes() <= 2500


def test_two_processes_filling_one_cache_stay_within_the_limit(tmp_path: Path) -> None:
    context = multiprocessing.get_context("spawn")
    workers = [context.Process(target=_fill, args=(str(tmp_path), seed)) for seed in (0, 0, 5)]
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join(60)
    assert [worker.exitcode for worker in workers] == [0, 0, 0]
    files = _cached(tmp_path)
    assert 0 < sum(len(content) for content in files.values()) <= 2500
    for name, content in files.items():
        number = int(name.split("-", 1)[1].split(".")[0])
        assert content == hashlib.sha256(str(number).encode()).digest() * 16


def test_a_changed_remote_object_is_downloaded_again(tmp_path: Path) -> None:
    fs = fsspec.filesystem("memory")
    fs.pipe("/changing/a.jsonl", b'{"v": 1}\n')
    options = {"cache": {"dir": str(tmp_path / "c")}}
    first = Dataset.from_path("d", "memory:///changing", io_options=options)
    assert first.read_rows(0, [0]) == [{"v": 1}]
    time.sleep(0.01)
    fs.pipe("/changing/a.jsonl", b'{"v": 2}\n{"v": 3}\n')
    second = Dataset.from_path("d", "memory:///changing", io_options=options)
    assert second.read_rows(0, [0, 1]) == [{"v": 2}, {"v": 3}]
    assert len(_cached(tmp_path / "c")) == 2
