"""Compressed JSONL shards are decompressed once per node into the shard cache and mapped from
there: not held in each process's memory, bounded by the cache's `max_bytes`, made once however
many processes read them."""

from __future__ import annotations

import contextlib
import gzip
import io
import json
import multiprocessing
import os
import pickle
import random
import threading
import time
import uuid
from pathlib import Path
from typing import Any

import fsspec
import pytest
import zstandard

from tests.unit.io.conftest import WriteJsonl
from zephon_torch import Pipeline
from zephon_torch.errors import ConfigError, DataError
from zephon_torch.io import Dataset
from zephon_torch.io import jsonl as jsonl_module
from zephon_torch.io._cache_folder import _LOCKS, _RESERVE, _TMP
from zephon_torch.io._compression import CorruptError
from zephon_torch.io._io_options import CacheOptions
from zephon_torch.io._shard_cache import ShardCache
from zephon_torch.io.jsonl import JsonlReader
from zephon_torch.work import StaticMixtureWorkSource


def _rows(count: int, start: int = 0) -> list[dict[str, Any]]:
    return [{"id": start + i, "text": f"row {start + i} " + "x" * (i % 50)} for i in range(count)]


def _cached_files(folder: Path) -> list[Path]:
    return sorted(p for p in folder.iterdir() if p.is_file() and not p.name.startswith("."))


def _count_makes(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    made: list[str] = []
    original = jsonl_module.decompress_to

    def counted(path: str, compression: Any, target: str, **kw: Any) -> None:
        made.append(path)
        original(path, compression, target, **kw)

    monkeypatch.setattr(jsonl_module, "decompress_to", counted)
    return made


@pytest.mark.parametrize("compression", ["gzip", "zstd"])
def test_a_compressed_shard_is_read_from_a_mapped_file_in_the_cache(
    tmp_path: Path, write_jsonl: WriteJsonl, compression: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    rows = _rows(500)
    write_jsonl(tmp_path / "data" / "a.jsonl.gz", rows, compression=compression)
    cache = tmp_path / "cache"
    made = _count_makes(monkeypatch)
    options = {"cache": {"dir": str(cache)}}
    dataset = Dataset.from_path("d", tmp_path / "data", io_options=options)
    assert dataset.read_rows(0, [499, 0, 250]) == [rows[499], rows[0], rows[250]]
    [file] = _cached_files(cache)
    expected = "".join(f'{{"id": {r["id"]}, "text": "{r["text"]}"}}\n' for r in rows).encode()
    assert file.read_bytes() == expected
    reader = dataset._reader
    assert isinstance(reader, JsonlReader)
    held = [buffer for buffer, _ in reader._decompressed._state.items.values()]
    assert held and all(type(buffer) is not bytes for buffer in held)  # maps, not copies
    again = Dataset.from_path("d", tmp_path / "data", io_options=options)  # as another process
    assert again.read_rows(0, range(500)) == rows
    assert made == [str(tmp_path / "data" / "a.jsonl.gz")]  # decompressed once


def _read_all(path: str, cache: str, out: Any) -> None:
    made = _count_makes_in_child()
    dataset = Dataset.from_path("d", path, io_options={"cache": {"dir": cache}})
    rows = [row for shard in range(3) for row in dataset.read_rows(shard, range(200))]
    out.put((len(made), rows))


def _count_makes_in_child() -> list[str]:
    made: list[str] = []
    original = jsonl_module.decompress_to

    def counted(path: str, compression: Any, target: str, **kw: Any) -> None:
        made.append(path)
        original(path, compression, target, **kw)

    jsonl_module.decompress_to = counted  # type: ignore[assignment]  # this child only
    return made


def test_processes_sharing_the_cache_decompress_each_shard_once(
    tmp_path: Path, write_jsonl: WriteJsonl
) -> None:
    tables = [_rows(200, start=200 * i) for i in range(3)]
    for number, table in enumerate(tables):
        write_jsonl(tmp_path / "data" / f"{number}.jsonl.gz", table, compression="gzip")
    context = multiprocessing.get_context("fork")
    out = context.Queue()
    children = [
        context.Process(
            target=_read_all, args=(str(tmp_path / "data"), str(tmp_path / "cache"), out)
        )
        for _ in range(4)
    ]
    for child in children:
        child.start()
    results = [out.get(timeout=60) for _ in children]
    for child in children:
        child.join(timeout=60)
        assert child.exitcode == 0
    assert all(rows == [row for table in tables for row in table] for _, rows in results)
    assert sum(made for made, _ in results) == 3  # each shard made by one of the four
    assert len(_cached_files(tmp_path / "cache")) == 3


def test_the_cache_stays_within_max_bytes_and_evicted_shards_are_made_again(
    tmp_path: Path, write_jsonl: WriteJsonl, monkeypatch: pytest.MonkeyPatch
) -> None:
    tables = [_rows(300, start=300 * i) for i in range(4)]
    for number, table in enumerate(tables):
        write_jsonl(tmp_path / "data" / f"{number}.jsonl.zst", table, compression="zstd")
    size = max(len("".join(json.dumps(r) + "\n" for r in table)) for table in tables)
    limit = 2 * size + size // 2  # two decompressed shards fit, three do not
    cache = tmp_path / "cache"
    made = _count_makes(monkeypatch)
    dataset = Dataset.from_path(
        "d", tmp_path / "data", io_options={"cache": {"dir": str(cache), "max_bytes": limit}}
    )
    reader = dataset._reader
    assert isinstance(reader, JsonlReader)
    assert len(made) == 4  # opening counts the rows of each
    for round_ in range(2):
        made.clear()
        for number, table in enumerate(tables):
            reader._decompressed = type(reader._decompressed)(1)  # forget the maps we hold
            assert dataset.read_rows(number, [299, 3]) == [table[299], table[3]]
            assert ShardCache(str(cache), limit).used_bytes() <= limit
        if round_:  # in order, each shard was evicted by the two read after it
            assert len(made) == 4


def test_a_shard_larger_than_the_cache_is_a_config_error_naming_it(
    tmp_path: Path, write_jsonl: WriteJsonl
) -> None:
    path = write_jsonl(tmp_path / "a.jsonl.gz", _rows(300), compression="gzip")
    options = {"cache": {"dir": str(tmp_path / "c"), "max_bytes": 1000}}
    with pytest.raises(ConfigError, match=r"a\.jsonl\.gz' decompresses to more than .*\(1000\)"):
        Dataset.from_path("d", path, io_options=options)  # which counts its rows
    assert os.listdir(tmp_path / "c" / _TMP) == []  # stopped at the limit, nothing left


def test_a_zstd_shard_over_the_limit_stops_without_inflating_it_in_memory(
    tmp_path: Path,
) -> None:
    """A 4 MiB read of zstd input was inflated whole before the limit saw it: a 60 KB
    shard of one repeated line took 256 MB of memory to be refused, a crafted one far more."""
    import tracemalloc

    line = (json.dumps({"text": "x"}) + "\n").encode()
    path = tmp_path / "a.jsonl.zst"
    with open(path, "wb") as out, zstandard.ZstdCompressor().stream_writer(out) as writer:
        for _ in range(1 << 8):
            writer.write(line * (1 << 16))  # 256 MiB in all
    options = {"cache": {"dir": str(tmp_path / "c"), "max_bytes": 1 << 20}}
    tracemalloc.start()
    try:
        with pytest.raises(ConfigError, match=r"decompresses to more than"):
            Dataset.from_path("d", path, io_options=options)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 100 << 20, f"{peak / 2**20:.0f} MiB"


def test_a_rewritten_shard_is_decompressed_again(tmp_path: Path, write_jsonl: WriteJsonl) -> None:
    path = write_jsonl(tmp_path / "a.jsonl.gz", _rows(20), compression="gzip")
    assert Dataset.from_path("d", path).read_rows(0, [5]) == [_rows(20)[5]]
    write_jsonl(path, _rows(30, start=100), compression="gzip")
    os.utime(path, ns=(1, 10**18))  # a new version, whatever the clock's resolution
    assert Dataset.from_path("d", path).read_rows(0, [5, 29]) == [
        _rows(30, 100)[i] for i in (5, 29)
    ]


def test_a_shard_replaced_by_one_of_the_same_size_and_mtime_is_decompressed_again(
    tmp_path: Path,
) -> None:
    """`cp -p`, `rsync -a`, a tar extraction: the decompressed copy was keyed by size and mtime
    only, so the old rows came back (the line index, keyed by inode and ctime too, was rebuilt
    from the stale copy)."""

    def gz(words: list[str]) -> bytes:
        lines = "".join(json.dumps({"text": w}) + "\n" for w in words)
        return gzip.compress(lines.encode(), mtime=0)

    old, new = gz(["alpha one", "alpha two"]), gz(["bravo one", "bravo two"])
    assert len(old) == len(new)
    path = tmp_path / "a.jsonl.gz"
    path.write_bytes(old)
    os.utime(path, ns=(10**18, 10**18))
    assert Dataset.from_path("d", str(path)).read_rows(0, [0, 1])[1] == {"text": "alpha two"}
    beside = tmp_path / "new.jsonl.gz"
    beside.write_bytes(new)
    os.utime(beside, ns=(10**18, 10**18))
    os.replace(beside, path)
    assert [r["text"] for r in Dataset.from_path("d", str(path)).read_rows(0, [0, 1])] == [
        "bravo one",
        "bravo two",
    ]


@pytest.mark.parametrize("compression", ["gzip", "zstd"])
def test_a_compressed_shard_changed_after_its_decompressed_copy_went_is_refused(
    tmp_path: Path, write_jsonl: WriteJsonl, compression: str
) -> None:
    """Plain shards kept their first identity, compressed ones did not: once a shard's
    decompressed copy left its LRU while its line index stayed, the new version was
    decompressed and sliced at the old offsets, and a DataLoader worker (a pickled reader)
    indexed it anew; both read its new rows without a word as the rows first opened."""
    first, second = (tmp_path / f"{name}.jsonl" for name in "ab")
    for shard in (first, second):
        write_jsonl(shard, [{"text": f"alpha {i}"} for i in range(10)], compression=compression)
    reader = _reader(tmp_path, max_decompressed=1)
    assert reader.read(str(first), [3]) == [{"text": "alpha 3"}]
    worker = pickle.loads(pickle.dumps(reader))
    write_jsonl(first, [{"text": f"bravo {i}"} for i in range(10)], compression=compression)
    os.utime(first, ns=(1, 10**18))  # a new version, whatever the clock's resolution
    reader.read(str(second), [0])  # the first shard's copy goes; its index stays
    for reading in (reader, worker):
        with pytest.raises(DataError, match="since it was first read here") as caught:
            reading.read(str(first), [3])
        assert (caught.value.dataset, caught.value.shard) == ("d", str(first))


def test_pipeline_io_options_choose_where_a_local_dataset_decompresses(
    tmp_path: Path, write_jsonl: WriteJsonl, tokenizer: Any
) -> None:
    write_jsonl(tmp_path / "data" / "a.jsonl.gz", _rows(40), compression="gzip")
    dataset = Dataset.from_path("d", tmp_path / "data", columns=["text"])
    source = StaticMixtureWorkSource([dataset], seed=0, exhaustion="stop")
    chosen = tmp_path / "chosen"
    pipeline = (
        Pipeline(source)
        .options(io_options={"cache": {"dir": str(chosen)}})
        .tokenize(tokenizer=tokenizer)
        .pack_flat(64, "wrap")
        .batch(2)
    )
    assert sum(batch.num_tokens for batch in pipeline) > 0
    assert len(_cached_files(chosen)) == 1


# -- review regressions: remote copies, forks, errors, truncation, stress ---------------------


def _lines(count: int, tag: int = 0) -> bytes:
    rows = (json.dumps({"s": tag, "i": i, "t": "y" * (i % 97)}) + "\n" for i in range(count))
    return "".join(rows).encode()


def _zstd(data: bytes) -> bytes:
    buffer = io.BytesIO()  # streamed: no content size in the frame header
    with zstandard.ZstdCompressor().stream_writer(buffer, closefd=False) as writer:
        writer.write(data)
    return buffer.getvalue()


def _reader(tmp_path: Path, max_bytes: int = 1 << 26, **kw: Any) -> JsonlReader:
    options = CacheOptions(dir=str(tmp_path / "cache"), max_bytes=max_bytes)
    return JsonlReader(dataset="d", index_cache_dir=str(tmp_path / "idx"), cache=options, **kw)


def test_a_remote_compressed_shard_is_decompressed_once_per_node(tmp_path: Path) -> None:
    """Downloads live in the cache under names that say what they are, while their modification
    times move with the cache's LRU clock: the decompressed copy is keyed by the name."""
    root = f"/zt-{uuid.uuid4().hex[:8]}"
    fsspec.filesystem("memory").pipe(f"{root}/a.jsonl.gz", gzip.compress(_lines(2000)))
    options = {"cache": {"dir": str(tmp_path / "cache")}}
    dataset = Dataset.from_path(
        "r", f"memory://{root}", io_options=options, index_cache_dir=str(tmp_path / "idx")
    )
    for _ in range(3):  # as three DataLoader workers or ranks would
        worker = pickle.loads(pickle.dumps(dataset))
        time.sleep(0.01)
        assert worker.read_rows(0, [1999])[0]["i"] == 1999
    names = [p.name for p in _cached_files(tmp_path / "cache")]
    assert len([n for n in names if n.endswith("(decompressed)")]) == 1, names
    indexes = [p.name for p in (tmp_path / "idx").rglob("*.npy")]
    assert len(indexes) == 1, indexes  # and its line index is built once, too


def test_a_remote_shard_whose_copies_cannot_both_fit_is_a_config_error_naming_its_url(
    tmp_path: Path,
) -> None:
    """The download stays pinned while it is decompressed: a cache that holds the decompressed
    file alone, but not both, is too small (it waited for space until `full_timeout` before)."""
    root = f"/zt-{uuid.uuid4().hex[:8]}"
    data = _lines(3000)
    packed = gzip.compress(data)
    fsspec.filesystem("memory").pipe(f"{root}/a.jsonl.gz", packed)
    cache = tmp_path / "cache"
    options = {"cache": {"dir": str(cache), "max_bytes": len(data) + len(packed) // 2}}
    with pytest.raises(ConfigError, match=rf"minus its {len(packed)}-byte compressed") as error:
        Dataset.from_path(  # which counts the shard's rows
            "r", f"memory://{root}", io_options=options, index_cache_dir=str(tmp_path / "idx")
        )
    assert f"memory://{root}/a.jsonl.gz" in str(error.value)
    assert str(cache) not in str(error.value)
    assert os.listdir(cache / _TMP) == [] and os.listdir(cache / _RESERVE) == []


def test_shards_opened_together_that_fit_one_at_a_time_do_not_wait_on_each_other(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """The opening threads each kept their compressed download pinned while waiting for room
    for its decompressed copy, room only the others' pins held: 120 s, then a StorageError
    telling to raise `max_bytes`, though each shard and its copy fit. A copy that finds no
    room now is held in memory, with a warning."""
    root = f"/zt-{uuid.uuid4().hex[:8]}"
    fs = fsspec.filesystem("memory")
    packed = [gzip.compress(_lines(1500, tag=shard)) for shard in range(4)]
    for shard, blob in enumerate(packed):
        fs.pipe(f"{root}/part-{shard}.jsonl.gz", blob)
    largest = max(len(blob) for blob in packed)
    unpacked = max(len(_lines(1500, tag=shard)) for shard in range(4))
    cache = tmp_path / "cache"
    max_bytes = largest + unpacked + largest // 2  # one shard and its copy fit, not two
    options = {"cache": {"dir": str(cache), "max_bytes": max_bytes, "prefetch_bytes": 0}}
    started = time.monotonic()
    with caplog.at_level("WARNING"):
        dataset = Dataset.from_path(
            "r", f"memory://{root}", io_options=options, index_cache_dir=str(tmp_path / "idx")
        )
        assert dataset.num_rows == 4 * 1500
        for shard in range(4):
            assert dataset.read_rows(shard, [1499])[0]["i"] == 1499
    assert time.monotonic() - started < 60
    used = sum(p.stat().st_size for p in _cached_files(cache))
    assert used <= max_bytes


def test_a_zstd_shard_starting_with_a_skippable_frame_is_read_as_zstd(tmp_path: Path) -> None:
    """`pzstd` starts its output with a skippable frame: such a shard was taken for plain
    text and its first row refused as malformed JSON."""
    rows = [{"text": "a"}, {"text": "b"}]
    skippable = (0x184D2A50).to_bytes(4, "little") + (4).to_bytes(4, "little") + b"zeph"
    packed = zstandard.ZstdCompressor().compress(
        "".join(json.dumps(row) + "\n" for row in rows).encode()
    )
    path = tmp_path / "a.jsonl.zst"
    path.write_bytes(skippable + packed)
    options = {"cache": {"dir": str(tmp_path / "c")}}
    assert Dataset.from_path("d", path, io_options=options).read_rows(0, [0, 1]) == rows


def test_a_truncated_zstd_shard_is_a_data_error(tmp_path: Path) -> None:
    blob = _zstd(_lines(300))
    for cut in (1, len(blob) // 2):
        path = tmp_path / f"cut{cut}.jsonl.zst"
        path.write_bytes(blob[: len(blob) - cut])
        with pytest.raises(DataError, match=rf"cut{cut}\.jsonl\.zst.*ends inside a frame"):
            _reader(tmp_path).num_rows(str(path))
    several = tmp_path / "frames.jsonl.zst"  # several frames, one after another: all read
    several.write_bytes(_zstd(_lines(10)) + _zstd(_lines(20, tag=1)) + _zstd(_lines(5, tag=2)))
    assert _reader(tmp_path).num_rows(str(several)) == 35


def test_an_unusable_cache_folder_falls_back_to_memory_with_a_warning(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    path = tmp_path / "a.jsonl.gz"
    path.write_bytes(gzip.compress(_lines(30)))
    (tmp_path / "blocker").write_text("a file where the cache folder should be")
    reader = JsonlReader(
        dataset="d",
        index_cache_dir=str(tmp_path / "idx"),
        cache=CacheOptions(dir=str(tmp_path / "blocker" / "cache")),
    )
    with caplog.at_level("WARNING"):
        assert reader.read(str(path), [29])[0]["i"] == 29
    assert "holding it in memory" in caplog.text


def test_a_failing_make_leaves_no_file_temp_file_or_held_lock(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "a.jsonl.gz"
    path.write_bytes(gzip.compress(_lines(30)))

    def failing(source: str, compression: Any, target: str, **kw: Any) -> None:
        Path(target).write_bytes(b"partial")
        raise CorruptError("boom")

    monkeypatch.setattr(jsonl_module, "decompress_to", failing)
    with pytest.raises(DataError, match="boom"):
        _reader(tmp_path).num_rows(str(path))
    cache = tmp_path / "cache"
    assert _cached_files(cache) == [] and os.listdir(cache / _TMP) == []
    assert os.listdir(cache / _LOCKS) == []  # let go, and deleted as it was


def _child_make(directory: str, out: Any) -> None:
    cache = ShardCache(directory, 1 << 20)
    with cache.open_made("key", "src (made)", lambda t: Path(t).write_bytes(b"x" * 100)):
        out.put("ok")


def test_a_child_forked_while_a_thread_makes_a_file_does_not_wait_forever(tmp_path: Path) -> None:
    """flock locks belong to the open file, which a fork shares: the child drops its copies."""
    directory = str(tmp_path / "cache")
    cache = ShardCache(directory, 1 << 20)
    making = threading.Event()

    def slow(target: str) -> None:
        making.set()
        time.sleep(0.5)
        Path(target).write_bytes(b"x" * 100)

    def parent_read() -> None:
        with cache.open_made("key", "src (made)", slow):
            pass

    thread = threading.Thread(target=parent_read)
    thread.start()
    making.wait()
    context = multiprocessing.get_context("fork")
    out = context.Queue()
    child = context.Process(target=_child_make, args=(directory, out))
    child.start()  # forked while a parent thread holds the lock on the name
    thread.join()
    child.join(timeout=20)
    hung = child.is_alive()
    if hung:
        child.kill()
    assert not hung and child.exitcode == 0 and out.get(timeout=5) == "ok"


def test_a_cache_folder_inside_the_data_folder_is_not_data(
    tmp_path: Path, write_jsonl: WriteJsonl
) -> None:
    write_jsonl(tmp_path / "data" / "a.jsonl.gz", _rows(2), compression="gzip")
    options = {"cache": {"dir": str(tmp_path / "data" / "cache")}}
    dataset = Dataset.from_path("d", tmp_path / "data", format="jsonl", io_options=options)
    again = Dataset.from_path("d", tmp_path / "data", format="jsonl", io_options=options)
    assert [s.num_rows for s in dataset.shards] == [s.num_rows for s in again.shards] == [2]


STRESS_SHARDS = 6


def _stress_table(n: int) -> list[dict[str, Any]]:
    return [json.loads(line) for line in _lines(1500 + 300 * n, tag=n).splitlines()]


def _stress_worker(
    paths: list[str], cache: str, limit: int, index: str, seed: int, out: Any
) -> None:
    tables = [_stress_table(n) for n in range(STRESS_SHARDS)]
    options = CacheOptions(dir=cache, max_bytes=limit)
    errors: list[str] = []

    def fresh() -> JsonlReader:
        return JsonlReader(
            dataset="d", index_cache_dir=index, max_open=1, max_decompressed=1, cache=options
        )

    shared = fresh()

    def loop(thread: int) -> None:
        rng = random.Random(seed * 100 + thread)
        for step in range(100):
            n = rng.randrange(STRESS_SHARDS)
            rows = [rng.randrange(len(tables[n])) for _ in range(8)]
            try:
                got = (shared if step % 2 else fresh()).read(paths[n], rows)
                if got != [tables[n][r] for r in rows]:
                    errors.append(f"wrong rows from shard {n}")
            except Exception as error:  # reported below, with its kind
                errors.append(f"{type(error).__name__}: {error}")

    threads = [threading.Thread(target=loop, args=(t,)) for t in range(3)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    out.put(errors)


def test_processes_and_threads_share_a_cache_that_must_evict(tmp_path: Path) -> None:
    paths = []
    for n in range(STRESS_SHARDS):
        data = _lines(1500 + 300 * n, tag=n)
        path = tmp_path / "data" / (f"{n}.jsonl.zst" if n % 2 else f"{n}.jsonl.gz")
        path.parent.mkdir(exist_ok=True)
        path.write_bytes(_zstd(data) if n % 2 else gzip.compress(data))
        paths.append(str(path))
    largest = len(_lines(1500 + 300 * (STRESS_SHARDS - 1)))
    limit = 2 * largest + largest // 2
    cache = tmp_path / "cache"
    ShardCache(str(cache), limit)
    peak, stop = [0], threading.Event()

    def watch() -> None:
        while not stop.is_set():
            total = 0
            for entry in os.scandir(cache):
                if entry.is_file() and not entry.name.startswith("."):
                    with contextlib.suppress(FileNotFoundError):
                        total += entry.stat().st_size
            peak[0] = max(peak[0], total)
            time.sleep(0.002)

    watcher = threading.Thread(target=watch)
    watcher.start()
    context = multiprocessing.get_context("fork")
    out = context.Queue()
    children = [
        context.Process(
            target=_stress_worker,
            args=(paths, str(cache), limit, str(tmp_path / "idx"), seed, out),
        )
        for seed in range(4)
    ]
    for child in children:
        child.start()
    try:
        results = [out.get(timeout=240) for _ in children]  # a deadlock fails here
    finally:
        for child in children:
            child.join(timeout=30)
            if child.is_alive():
                child.kill()
        stop.set()
        watcher.join()
    assert all(child.exitcode == 0 for child in children)
    assert all(errors == [] for errors in results), [errors[:3] for errors in results]
    assert peak[0] <= limit
    assert os.listdir(cache / _TMP) == [] and os.listdir(cache / _RESERVE) == []
