"""The shard cache's bookkeeping with many files cached: new shards a second, one run.

A node streaming many small shards through a shared cache folder places (and, once the cache
is full, evicts) a file per shard, each under the node-wide folder lock, so the cost of one
placement caps every process of the node together. This script fills a fresh cache folder with
`--files` cached files of `--size` bytes (written directly, as earlier downloads would have
left them), then times `--shards` new shards through `ShardCache.ensure` (a download that
writes `--size` bytes to the temporary file), twice: with a `max_bytes` that holds them all
(no eviction), and with the cache full. The baseline, in the same run, is the same against a
folder holding only `--small` files. Full, each shard of a folder of 64 files or fewer evicts;
with more, an eviction frees 1/32 of the limit past the shard, and the shards placed in that
margin list and evict nothing (with 10,000 files, 314 fit in each margin: the default 2,000
shards make six listings, each evicting 314 files; 200 would all fit in the first's). Each side
places one shard before its clock starts (the first placement lists the folder). The ratio is
the many-file rate over the few-file one: 1.0 means the folder's size costs nothing.

    .venv/bin/python benchmarks/cache_reservations.py [--files 10000] [--small 16]
        [--shards 2000] [--size 4096] [--repeats 3]
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time

from zephon_torch.io._cache_folder import cached_name
from zephon_torch.io._shard_cache import CachedObject, ShardCache


def _fill(folder: str, files: int, size: int) -> None:
    """`files` cached files of `size` bytes, oldest first."""
    content = b"x" * size
    now = time.time()
    for i in range(files):
        path = os.path.join(folder, cached_name(f"old-{i}", f"s3://bucket/old-{i}.bin"))
        with open(path, "wb") as handle:
            handle.write(content)
        os.utime(path, (now - files + i, now - files + i))


def shards_per_second(files: int, shards: int, size: int, *, full: bool) -> float:
    """New shards a second through a cache folder already holding `files` files."""
    content = b"y" * size

    def download(target: str) -> None:
        with open(target, "wb") as handle:
            handle.write(content)

    with tempfile.TemporaryDirectory(prefix="zephon-cache-bench-") as folder:
        _fill(folder, files, size)
        limit = files * size if full else (files + shards + 1) * size
        cache = ShardCache(folder, max_bytes=limit)
        # the first placement of a process may list the folder (no ledger yet): left out
        cache.ensure(CachedObject("s3://bucket/first.bin", size, "v1"), download, pin=False)
        start = time.perf_counter()
        for i in range(shards):
            item = CachedObject(url=f"s3://bucket/new-{i}.bin", size=size, version="v1")
            cache.ensure(item, download, pin=False)
        seconds = time.perf_counter() - start
        assert cache.used_bytes() <= limit, "the cache went over its limit"
    return shards / seconds


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--files", type=int, default=10_000)
    parser.add_argument("--small", type=int, default=16)
    parser.add_argument("--shards", type=int, default=2000)
    parser.add_argument("--size", type=int, default=4096)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    for full in (False, True):
        few: list[float] = []
        many: list[float] = []
        for _ in range(args.repeats):
            few.append(shards_per_second(args.small, args.shards, args.size, full=full))
            many.append(shards_per_second(args.files, args.shards, args.size, full=full))
        regime = "full" if full else "under the limit"
        print(
            f"{regime:<24} {args.small:>6,} files {max(few):8.0f} shards/s   "
            f"{args.files:>6,} files {max(many):8.0f} shards/s   "
            f"ratio {max(many) / max(few):.3f} (best of {args.repeats})"
        )


if __name__ == "__main__":
    main()
