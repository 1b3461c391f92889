"""Files the shard cache makes from shards (`open_made`, decompressed JSONL) in a cache folder
deleted during a run, on the LRU clock, and pinned only while their block runs."""

from __future__ import annotations

import os
import shutil
from collections.abc import Callable
from pathlib import Path

from tests.helpers import cache_item, cache_writer, cached_files
from zephon_torch.io._shard_cache import ShardCache


def _make(content: bytes) -> Callable[[str], None]:
    """A make writing `content`."""

    def make(target: str) -> None:
        Path(target).write_bytes(content)

    return make


def test_a_file_is_made_in_a_cache_folder_deleted_during_a_run(tmp_path: Path) -> None:
    cache = ShardCache(str(tmp_path / "cache"), max_bytes=1000)
    shutil.rmtree(tmp_path / "cache")  # a tmp cleaner's
    with cache.open_made("k", "s3://bucket/a.jsonl.gz", _make(b"m" * 10)) as path:
        assert Path(path).read_bytes() == b"m" * 10


def test_a_made_file_found_is_marked_used_and_outlives_older_shards(tmp_path: Path) -> None:
    cache = ShardCache(str(tmp_path), max_bytes=200)
    made = ("k", "s3://bucket/a.jsonl.gz")
    with cache.open_made(*made, _make(b"m" * 100)) as path:
        os.utime(path, (1, 1))
    older = cache_item("older.jsonl", 100)
    cache.ensure(older, cache_writer(b"o" * 100), pin=False)
    os.utime(cache.path(older), (2, 2))
    with cache.open_made(*made, _make(b"never made")) as path:  # found: used now
        kept = path
    cache.ensure(cache_item("new.jsonl", 100), cache_writer(b"n" * 100), pin=False)
    assert os.path.exists(kept) and not os.path.exists(cache.path(older))


def test_a_made_file_is_evicted_once_its_block_ends(tmp_path: Path) -> None:
    cache = ShardCache(str(tmp_path), max_bytes=100, full_timeout=0.5)
    with cache.open_made("k", "s3://bucket/a.jsonl.gz", _make(b"m" * 100)):
        pass
    path = cache.ensure(cache_item("new.jsonl", 100), cache_writer(b"n" * 100), pin=False)
    assert list(cached_files(tmp_path)) == [os.path.basename(path)]
