"""The LRU cache behind the readers: one load per key, bounded size, errors not kept."""

from __future__ import annotations

import multiprocessing
import os
import pickle
import random
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from zephon_torch.io import Dataset
from zephon_torch.io._cache import LruCache
from zephon_torch.io.jsonl import JsonlReader
from zephon_torch.io.parquet import ParquetReader


def test_many_threads_asking_for_one_key_load_it_once() -> None:
    cache: LruCache[int] = LruCache(4)
    calls = []

    def load() -> int:
        calls.append(1)
        time.sleep(0.05)
        return 42

    results: list[int] = []
    threads = [
        threading.Thread(target=lambda: results.append(cache.get_or_load("k", load)))
        for _ in range(16)
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert results == [42] * 16
    assert len(calls) == 1


def test_the_least_recently_used_value_goes_first() -> None:
    cache: LruCache[str] = LruCache(2)
    cache.get_or_load("a", lambda: "a")
    cache.get_or_load("b", lambda: "b")
    cache.get_or_load("a", lambda: "reloaded")
    cache.get_or_load("c", lambda: "c")
    assert len(cache) == 2
    assert cache.get_or_load("a", lambda: "reloaded") == "a"
    assert cache.get_or_load("b", lambda: "reloaded") == "reloaded"


def test_the_weight_bound_evicts_but_keeps_the_newest_value() -> None:
    cache: LruCache[bytes] = LruCache(10, max_weight=10, weigh=len)
    cache.get_or_load("a", lambda: b"x" * 6)
    cache.get_or_load("b", lambda: b"x" * 6)
    assert len(cache) == 1
    cache.get_or_load("c", lambda: b"x" * 50)
    assert len(cache) == 1
    assert cache.get_or_load("c", lambda: b"") == b"x" * 50


def test_a_failed_load_reaches_the_caller_and_is_not_cached() -> None:
    cache: LruCache[int] = LruCache(2)

    def fail() -> int:
        raise OSError("disk on fire")

    with pytest.raises(OSError, match="disk on fire"):
        cache.get_or_load("k", fail)
    assert cache.get_or_load("k", lambda: 1) == 1


def test_threads_waiting_on_a_failed_load_get_its_error() -> None:
    cache: LruCache[int] = LruCache(2)
    started = threading.Event()

    def fail() -> int:
        started.set()
        time.sleep(0.05)
        raise ValueError("bad")

    errors: list[BaseException] = []

    def ask() -> None:
        try:
            cache.get_or_load("k", fail)
        except ValueError as error:
            errors.append(error)

    first = threading.Thread(target=ask)
    first.start()
    started.wait()
    second = threading.Thread(target=ask)
    second.start()
    first.join()
    second.join()
    assert len(errors) == 2


def test_tiny_reader_caches_under_sixteen_threads_still_read_right(
    tmp_path: Path,
    write_jsonl: Any,
    write_parquet: Any,
    rows_factory: Callable[..., list[dict[str, Any]]],
) -> None:
    tables = [rows_factory(40, start=40 * i) for i in range(4)]
    for number, table in enumerate(tables):
        write_jsonl(tmp_path / "gz" / f"{number}.jsonl.gz", table, compression="gzip")
        write_parquet(tmp_path / "pq" / f"{number}.parquet", table, row_group_size=8)
    opened = [Dataset.from_path("d", tmp_path / kind) for kind in ("gz", "pq")]
    readers = [
        JsonlReader(
            dataset="d", index_cache_dir=str(tmp_path / "idx"), max_open=1, max_decompressed=1
        ),
        ParquetReader(dataset="d", max_open=1, max_row_groups=1),
    ]
    rng = random.Random(3)
    requests = [(rng.randrange(4), rng.sample(range(40), 16)) for _ in range(300)]
    for dataset, reader in zip(opened, readers, strict=True):
        small = Dataset(name="d", format=dataset.format, shards=dataset.shards, reader=reader)
        small = pickle.loads(pickle.dumps(small))
        failures: list[BaseException] = []

        def check(
            worker: int, small: Dataset = small, failures: list[BaseException] = failures
        ) -> None:
            try:
                for shard, rows in requests[worker::16]:
                    assert small.read_rows(shard, rows) == [tables[shard][r] for r in rows]
            except BaseException as error:
                failures.append(error)

        threads = [threading.Thread(target=check, args=(worker,)) for worker in range(16)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        assert failures == []


def _read_in_child(dataset: Dataset, out: Any) -> None:
    out.put(dataset.read_rows(0, [2, 0]))


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs fork")
def test_a_forked_child_reads_even_when_the_parent_held_a_cache_lock(
    tmp_path: Path, write_jsonl: Any
) -> None:
    path = write_jsonl(tmp_path / "a.jsonl.gz", [{"a": i} for i in range(3)], compression="gzip")
    dataset = Dataset.from_path("d", path)
    dataset.read_rows(0, [1])
    context = multiprocessing.get_context("fork")
    out = context.Queue()
    reader = dataset._reader
    assert isinstance(reader, JsonlReader)
    held = reader._decompressed._state.lock
    with held:  # as if another thread were inside the cache at the moment of the fork
        child = context.Process(target=_read_in_child, args=(dataset, out))
        child.start()
        rows = out.get(timeout=20)
        child.join(timeout=20)
    assert rows == [{"a": 2}, {"a": 0}]
    assert child.exitcode == 0
