"""Prefetch of remote shards (memory://): in the background, as far ahead as the byte budget,
shared by datasets, walked once per window."""

from __future__ import annotations

import threading
import time
import warnings
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import fsspec
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from tests.memory_store import equal_parquet_shards, fresh_root, put_parquet, remote_options
from zephon_torch.errors import ConfigError
from zephon_torch.io import Dataset
from zephon_torch.io._shard_downloads import AHEAD_PER_THREAD
from zephon_torch.ops._runner import Runner
from zephon_torch.ops.columns import TokenChain, TokenChunk
from zephon_torch.ops.read import DocumentReader
from zephon_torch.work.pointers import PointerLayout, PointerSpan


def test_prefetch_fills_the_cache_in_the_background(tmp_path: Path) -> None:
    fs = fsspec.filesystem("memory")
    root = fresh_root()
    for number in range(2):
        put_parquet(fs, f"{root}/{number}.parquet", pa.table({"n": [number] * 10}))
    dataset = Dataset.from_path("p", f"memory://{root}", io_options=remote_options(tmp_path))
    dataset.prefetch([1, 0])
    deadline = time.monotonic() + 10
    cached: list[Path] = []
    while time.monotonic() < deadline and len(cached) < 2:
        cached = [p for p in (tmp_path / "cache").glob("*") if not p.name.startswith(".")]
        time.sleep(0.01)
    assert len(cached) == 2
    assert dataset.read_rows(1, [3]) == [{"n": 1}]


def test_prefetch_reaches_as_far_ahead_as_its_byte_budget_and_slides(tmp_path: Path) -> None:
    root, size = equal_parquet_shards(6)
    options = remote_options(tmp_path)
    options["cache"]["prefetch_bytes"] = 2 * size + size // 2  # two ahead of the one read
    dataset = Dataset.from_path("p", f"memory://{root}", io_options=options)

    def cached(count: int) -> set[str]:
        return _cached_shards(tmp_path / "cache", count)

    order = [4, 1, 5, 0, 2, 3]
    dataset.prefetch(iter(order))
    assert cached(3) == {"4.parquet", "1.parquet", "5.parquet"}
    dataset.prefetch(iter(order[2:]))  # the reader moved on two shards: two more come
    assert cached(5) == {f"{n}.parquet" for n in order[:5]}
    dataset.prefetch(iter(order[3:]))  # one more, and nothing twice
    assert cached(6) == {f"{n}.parquet" for n in order}
    assert dataset.cache_counters() == {"hits": 0, "misses": 6, "bytes_downloaded": 6 * size}
    assert dataset.read_rows(3, [0]) == [{"n": 7}]


def test_a_reader_walks_the_upcoming_shards_once_per_window_not_per_chunk(
    tmp_path: Path,
) -> None:
    """Each walk stats the shards ahead (up to the byte budget); it gives the same shards for
    every chunk of a window, so the reader walks again only when it enters the next one, and
    then checks that window against the cache (each window in turn, not the pass's first
    again: a later, larger window was not warned of)."""
    dataset, walks = _walks_recorded(
        tmp_path, lambda number: [[number * 100 + i] * 3 for i in range(10)]
    )
    checked: list[list[int]] = []
    check_window = dataset.check_window

    def recorded(window: list[int], share: int = 1) -> None:
        checked.append(sorted(window))
        check_window(window, share=share)

    dataset.check_window = recorded  # type: ignore[method-assign]
    layout = PointerLayout(name="p", shard_rows=(10,) * 6, seed=3, window_shards=2, shuffle=True)
    reader, seen = _read_all(dataset, layout)
    assert sorted(seen) == sorted(n * 100 + i for n in range(6) for i in range(10))
    # each walk is the upcoming order from the start of a window the cursor entered: once
    # per window (three here) however many chunks were asked for in it
    order = list(layout.upcoming_shards(pass_index=0, lane=0, num_lanes=1, start=0))
    suffixes = [order[first:] for first in range(0, 6, layout.window_shards)]
    assert walks[0] == order
    assert all(walk in suffixes for walk in walks)
    assert len({len(walk) for walk in walks}) == len(walks) <= 3 < reader._submitted
    assert len(walks) > 1
    assert checked == [sorted(walk[: layout.window_shards]) for walk in walks]
    assert dataset.cache_counters()["misses"] == 6


@pytest.mark.parametrize("num_lanes", [1, 25])
def test_a_reader_walks_on_into_the_next_pass_s_shards_in_that_pass_s_order(
    tmp_path: Path, num_lanes: int
) -> None:
    """The pointer stream is pure, so a lane's walk goes on past its pass's end into the
    next pass's shards, from that pass's first window, in that pass's own (shuffled) order:
    another pass's order, or a walk starting past its first window (one lane row a window
    with 25 lanes), downloads shards not read next. The last pass walks into nothing."""
    dataset, walks = _walks_recorded(tmp_path, lambda number: [[number]] * 10)
    layout = PointerLayout(name="p", shard_rows=(10,) * 6, seed=3, window_shards=2, shuffle=True)
    where = {"lane": 0, "num_lanes": num_lanes, "start": 0}
    orders = [list(layout.upcoming_shards(pass_index=p, **where)) for p in (0, 1)]
    assert orders[0] != orders[1]  # the passes' orders differ (the seed is chosen so)
    reader, seen = _read_all(dataset, layout, num_lanes=num_lanes, passes=2)
    assert len(seen) == 2 * reader.lane_rows
    # the first walk: this pass's shards from the window the read-ahead reached, then all of
    # the next pass's; the last pass's walks end with it
    this_pass, next_pass = walks[0][: -len(orders[1])], walks[0][-len(orders[1]) :]
    assert this_pass and this_pass == orders[0][-len(this_pass) :]
    assert next_pass == orders[1]
    assert walks[-1] == orders[1][-len(walks[-1]) :]


def test_a_reader_shares_the_budget_with_the_mixture_s_other_remote_datasets_only(
    tmp_path: Path,
) -> None:
    """The remote datasets of a mixture download into one cache at once, so each reader
    walks with its dataset's part of the byte budget (its share: the remote datasets'
    count); a local dataset downloads nothing and takes no part."""
    fs = fsspec.filesystem("memory")
    remote = []
    for name in ("a", "b"):
        root = fresh_root()
        for number in range(2):
            put_parquet(fs, f"{root}/{number}.parquet", pa.table({"ids": [[number]] * 10}))
        options = remote_options(tmp_path)
        remote.append(Dataset.from_path(name, f"memory://{root}", io_options=options))
    (tmp_path / "local").mkdir()
    pq.write_table(pa.table({"ids": [[9]] * 10}), tmp_path / "local" / "0.parquet")
    local = Dataset.from_path("local", str(tmp_path / "local"))
    shares: list[int] = []
    prefetch, check_window = remote[0].prefetch, remote[0].check_window

    def recorded(urls: Any, share: int = 1) -> None:
        shares.append(share)
        prefetch(urls, share=share)

    def checked(window: list[int], share: int = 1) -> None:
        shares.append(share)
        check_window(window, share=share)

    remote[0].prefetch = recorded  # type: ignore[method-assign]
    remote[0].check_window = checked  # type: ignore[method-assign]
    layout = PointerLayout(name="a", shard_rows=(10, 10), seed=3, window_shards=1, shuffle=False)
    chain = TokenChain((remote[0], local, remote[1]), "ids", None)
    reader = DocumentReader(
        source=0,
        layout=layout,
        lane=0,
        num_lanes=1,
        exhaustion="stop",
        runner=Runner(chain, parallelism=1, kind="inline"),
        chunk_docs=5,
        ahead=2,
    )
    seen = 0
    while (found := reader.columns()) is not None:
        seen += len(found[0]) - found[1]
        reader.advance(len(found[0]))
    assert seen == 20
    assert shares and set(shares) == {2}


def _walks_recorded(
    tmp_path: Path, ids_of: Callable[[int], list[list[int]]]
) -> tuple[Dataset, list[list[int]]]:
    """A remote dataset of six Parquet shards (shard n's "ids" column: `ids_of(n)`, 10 rows)
    whose prefetch records each walk's shards, in order, before downloading them."""
    fs = fsspec.filesystem("memory")
    root = fresh_root()
    for number in range(6):
        put_parquet(fs, f"{root}/{number}.parquet", pa.table({"ids": ids_of(number)}))
    dataset = Dataset.from_path("p", f"memory://{root}", io_options=remote_options(tmp_path))
    walks: list[list[int]] = []
    prefetch = dataset.prefetch

    def recorded(urls: Any, share: int = 1) -> None:
        walks.append(list(urls))
        prefetch(iter(walks[-1]), share=share)

    dataset.prefetch = recorded  # type: ignore[method-assign]
    return dataset, walks


def _read_all(
    dataset: Dataset, layout: PointerLayout, *, num_lanes: int = 1, passes: int = 1
) -> tuple[DocumentReader, list[int]]:
    """Lane 0's reader (of `num_lanes`) over `dataset`'s "ids" column, one document a chunk,
    read to the end of its `passes`, and each document's first id."""
    reader = DocumentReader(
        source=0,
        layout=layout,
        lane=0,
        num_lanes=num_lanes,
        exhaustion="stop",
        passes=passes,
        runner=Runner(TokenChain((dataset,), "ids", None), parallelism=1, kind="inline"),
        chunk_docs=1,
        ahead=2,
    )
    seen = []
    while (found := reader.columns()) is not None:
        chunk, index = found
        seen.extend(int(ids[0]) for ids in chunk.tokens[index:])
        reader.advance(len(chunk))
    return reader, seen


@pytest.mark.parametrize("window", [2, 4])
def test_a_shuffle_window_larger_than_the_cache_is_warned_of(tmp_path: Path, window: int) -> None:
    """Its shards evicted each other while their rows were read, each downloaded about five
    times, silently."""
    fs = fsspec.filesystem("memory")
    root = fresh_root()
    for number in range(6):
        put_parquet(fs, f"{root}/{number}.parquet", pa.table({"ids": [[number]] * 10}))
    size = fs.size(f"{root}/0.parquet")
    options = remote_options(tmp_path, max_bytes=2 * size + size // 2)
    dataset = Dataset.from_path("p", f"memory://{root}", token_columns=["ids"], io_options=options)
    layout = PointerLayout(
        name="p", shard_rows=(10,) * 6, seed=3, window_shards=window, shuffle=True
    )
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        assert sorted(_read_all(dataset, layout)[1]) == sorted(list(range(6)) * 10)
    said = [str(w.message) for w in caught if "shuffle window" in str(w.message)]
    if window == 2:
        assert said == []
        with pytest.warns(UserWarning, match=r"in its part \(\d+ bytes\) of the shard cache"):
            dataset.check_window([0, 1], share=2)  # a mixture's remote datasets share it
    else:
        assert said == [
            f"dataset 'p': the 4 shards of a shuffle window (up to {4 * size} bytes, read at "
            "once) do "
            f"not fit in the shard cache (max_bytes {2 * size + size // 2}), so they are "
            "downloaded again and again as their rows are read; raise `max_bytes` or lower "
            "`shuffle_window_shards`"
        ]


def test_the_shuffle_window_warning_reads_the_same_whichever_window_meets_it_first(
    tmp_path: Path,
) -> None:
    """It named the size of the window that met it first: each DataLoader worker, started
    again at every epoch, met another window and gave another text, so Python's default
    filter showed it once per worker and epoch through a long run (10 warnings in 12 epochs
    of a soak), not once."""
    fs = fsspec.filesystem("memory")
    root = fresh_root()
    for number in range(6):
        # shards of different sizes, so windows of different sizes
        table = pa.table({"text": ["x" * 1000 * (number + 1)] * (5 + 5 * number)})
        put_parquet(fs, f"{root}/{number}.parquet", table)
    sizes = sorted(fs.size(f"{root}/{number}.parquet") for number in range(6))
    options = remote_options(tmp_path, max_bytes=sizes[0] + sizes[1])
    texts = []
    for window in ([0, 1, 2], [3, 4, 5]):  # as two workers, each with its first window
        dataset = Dataset.from_path("p", f"memory://{root}", io_options=options)
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            dataset.check_window(window)
            dataset.check_window([1, 2, 3])  # once per process
        texts += [str(w.message) for w in caught]
    assert len(texts) == 2
    assert texts[0] == texts[1]
    assert f"(up to {sum(sizes[-3:])} bytes, read at once)" in texts[0]


def test_a_walk_past_many_tiny_shards_stops_at_a_count_however_large_the_byte_budget(
    tmp_path: Path,
) -> None:
    """Tiny shards (a document a file) left the byte budget unspent to the end of the pass:
    each reader's walk, once a chunk, went through (and stat'ed) every shard left, O(shards^2)
    a pass. It now stops at `AHEAD_PER_THREAD` shards a download thread."""
    root, _ = equal_parquet_shards(3)
    options = remote_options(tmp_path, max_bytes=1 << 30)  # a budget of 256 MiB: shards of 500 B
    options["cache"]["prefetch_threads"] = 2
    dataset = Dataset.from_path("p", f"memory://{root}", io_options=options)
    walked = 0

    def upcoming() -> Iterator[int]:  # passes of the 3 shards, as a long run lists them
        nonlocal walked
        for number in range(20_000):
            walked += 1
            yield number % 3

    dataset.prefetch(upcoming())
    assert walked == 2 * AHEAD_PER_THREAD + 2  # the shard read, those ahead, the one let go
    assert _cached_shards(tmp_path / "cache", 3) == {f"{n}.parquet" for n in range(3)}


def test_prefetch_bytes_zero_downloads_nothing_ahead(tmp_path: Path) -> None:
    fs = fsspec.filesystem("memory")
    root = fresh_root()
    for number in range(3):
        put_parquet(fs, f"{root}/{number}.parquet", pa.table({"n": [number] * 10}))
    options = remote_options(tmp_path)
    options["cache"]["prefetch_bytes"] = 0
    dataset = Dataset.from_path("p", f"memory://{root}", io_options=options)
    dataset.prefetch(iter([0, 1, 2]))
    time.sleep(0.2)
    assert not list((tmp_path / "cache").glob("*.parquet"))
    assert dataset.read_rows(1, [0]) == [{"n": 1}]  # the read downloads its shard itself
    assert dataset.cache_counters() == {
        "hits": 0,
        "misses": 1,
        "bytes_downloaded": fs.size(f"{root}/1.parquet"),
    }


def test_a_budget_past_half_the_cache_is_refused_or_shared_by_the_node_s_processes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A budget as large as the cache evicted prefetched shards before they were read, which
    the next window fetched again: each shard was downloaded about ten times."""
    root, size = equal_parquet_shards(6)
    options = remote_options(tmp_path, max_bytes=4 * size)
    options["cache"]["prefetch_bytes"] = 4 * size
    with pytest.raises(ConfigError, match=r"`prefetch_bytes` must be at most half of `max_b"):
        Dataset.from_path("p", f"memory://{root}", io_options=options)
    options["cache"]["prefetch_bytes"] = 2 * size  # half: four processes would pass it
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "4")
    dataset = Dataset.from_path("p", f"memory://{root}", io_options=options)
    with pytest.warns(UserWarning, match=r"for 4 processes on this node, passes half of"):
        dataset.prefetch(iter(range(6)))
    assert _cached_shards(tmp_path / "cache", 2) == {"0.parquet", "1.parquet"}  # next only
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # said once
        dataset.prefetch(iter(range(1, 6)))
    assert _cached_shards(tmp_path / "cache", 3) == {f"{n}.parquet" for n in range(3)}


def test_a_budget_given_later_is_checked_against_the_dataset_s_own_cache_size(
    tmp_path: Path,
) -> None:
    """`with_io_options` and `Pipeline.options` checked a new `prefetch_bytes` against the
    default `max_bytes`, not the dataset's: a budget its cache allows was refused."""
    from zephon_torch import Pipeline
    from zephon_torch.work import StaticMixtureWorkSource

    root, _ = equal_parquet_shards(2)
    options = remote_options(tmp_path, max_bytes=200 << 30)
    dataset = Dataset.from_path("p", f"memory://{root}", io_options=options)
    later = {"cache": {"prefetch_bytes": 40 << 30}}
    assert dataset.with_io_options(later).read_rows(1, [0]) == [{"n": 7}]
    Pipeline(StaticMixtureWorkSource([dataset])).options(io_options=later)
    with pytest.raises(ConfigError, match=r"`max_bytes` \(214748364800\), got 108447924224"):
        dataset.with_io_options({"cache": {"prefetch_bytes": 101 << 30}})


def test_datasets_prefetching_together_share_the_byte_budget(tmp_path: Path) -> None:
    root, size = equal_parquet_shards(4)
    options = remote_options(tmp_path)
    options["cache"]["prefetch_bytes"] = 4 * size + size // 2  # four ahead alone, two shared
    dataset = Dataset.from_path("p", f"memory://{root}", io_options=options)
    dataset.prefetch(iter([3, 2, 1, 0]), share=2)
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and len(list((tmp_path / "cache").glob("*.parquet"))) < 3:
        time.sleep(0.01)
    time.sleep(0.2)
    names = {p.name.split("-")[-1] for p in (tmp_path / "cache").glob("*.parquet")}
    assert names == {"3.parquet", "2.parquet", "1.parquet"}  # the one read, and two ahead


def _cached_shards(cache: Path, count: int) -> set[str]:
    """The cached shard names once `count` are there and nothing changes for 0.2 s."""
    deadline = time.monotonic() + 10
    names: set[str] = set()
    while time.monotonic() < deadline:
        names = {p.name.split("-")[-1] for p in cache.glob("*.parquet")}
        if len(names) >= count:
            time.sleep(0.2)
            return {p.name.split("-")[-1] for p in cache.glob("*.parquet")}
        time.sleep(0.01)
    return names


def test_a_shard_fetched_ahead_is_not_the_first_evicted_when_others_were_read_since(
    tmp_path: Path,
) -> None:
    """The LRU went by the download time: a shard prefetched and not yet read looked older
    than those other processes read since, and was evicted first, then downloaded again."""
    root, size = equal_parquet_shards(4)
    options = remote_options(tmp_path, max_bytes=3 * size + size // 2)  # holds three shards
    options["cache"]["prefetch_bytes"] = size + size // 2
    dataset = Dataset.from_path("p", f"memory://{root}", io_options=options)
    dataset.prefetch([0])  # shard 0 comes next for this reader
    assert _cached_shards(tmp_path / "cache", 1) == {"0.parquet"}
    other = Dataset.from_path("p", f"memory://{root}", io_options=options)  # another process
    for shard in (1, 2):
        time.sleep(0.05)
        other.read_rows(shard, [0])
    dataset.prefetch([0, 3])  # still to read 0, then 3: room for 3 is made by evicting 1
    assert _cached_shards(tmp_path / "cache", 3) == {"0.parquet", "2.parquet", "3.parquet"}


def test_the_default_budget_is_shared_by_the_node_s_ranks(tmp_path: Path, monkeypatch: Any) -> None:
    """Each process took a quarter of the cache: eight ranks prefetched twice what it holds
    and evicted each other's shards before they were read."""
    root, size = equal_parquet_shards(6)
    options = remote_options(tmp_path, max_bytes=16 * size + size // 2)  # a quarter: four shards
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "2")  # two each
    dataset = Dataset.from_path("p", f"memory://{root}", io_options=options)
    dataset.prefetch(range(6))  # the one read, and two ahead
    assert _cached_shards(tmp_path / "cache", 3) == {"0.parquet", "1.parquet", "2.parquet"}


def test_the_next_shard_is_fetched_whatever_the_budget(tmp_path: Path, monkeypatch: Any) -> None:
    """Sixteen processes to a node gave each a default budget smaller than a shard: the
    shard being read counted against it, and nothing was ever fetched ahead."""
    root, size = equal_parquet_shards(4)
    options = remote_options(tmp_path, max_bytes=16 * size)  # a quarter: four shards per node
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "16")
    dataset = Dataset.from_path("p", f"memory://{root}", io_options=options)
    dataset.prefetch([2, 0, 3])
    assert _cached_shards(tmp_path / "cache", 2) == {"2.parquet", "0.parquet"}


def test_a_shard_a_reader_keeps_open_and_reads_all_the_time_is_not_evicted_first(
    tmp_path: Path,
) -> None:
    """npy (as MDS and LitData) readers keep a shard open and went back to the cache only to
    open it: the shard a process read all the time kept its first-open time in the LRU, was
    evicted first, and the node's other processes downloaded it again."""
    import io

    import numpy as np

    fs = fsspec.filesystem("memory")
    root = fresh_root()
    for number in range(5):
        buffer = io.BytesIO()
        np.save(buffer, np.full((200, 10), number, dtype=np.int32))  # 2-D: one file a shard
        fs.pipe(f"{root}/{number}.npy", buffer.getvalue())
    size = fs.size(f"{root}/0.npy")
    options = remote_options(tmp_path, max_bytes=3 * size)
    options["cache"]["prefetch_bytes"] = 0
    dataset = Dataset.from_path("t", f"memory://{root}", io_options=options)
    assert dataset.format == "npy"
    dataset.read_rows(0, [0])
    hot = next(p for p in (tmp_path / "cache").glob("*-0.npy"))
    for other in range(1, 5):
        dataset.read_rows(other, [0])  # a new shard: evicts the least recently used
        assert hot.exists(), f"the shard read all the time was evicted for shard {other}"
        assert dataset.read_rows(0, [1])[0]["input_ids"][0] == 0
    assert dataset.cache_counters()["misses"] == 5


class _HeldChain(TokenChain):
    """The real chain, whose chunks wait until `release` is set: read-ahead chunks stay in
    flight, unread, while the reader walks ahead."""

    def __init__(self, dataset: Dataset, release: threading.Event) -> None:
        super().__init__((dataset,), "ids", None)
        self.release = release

    def __call__(self, source: int, span: PointerSpan) -> TokenChunk:
        self.release.wait(10)
        return super().__call__(source, span)


def test_the_prefetch_budget_counts_from_the_oldest_chunk_still_unread_not_the_read_ahead(
    tmp_path: Path,
) -> None:
    """The walk started at the read-ahead cursor, the end of the chunks submitted: the shards
    of the chunks in flight, not yet read, came on top of the budget (5-8 shards downloaded
    and unread with a budget of 3 in a review's run)."""
    fs = fsspec.filesystem("memory")
    root = fresh_root()
    for number in range(8):
        put_parquet(fs, f"{root}/{number}.parquet", pa.table({"ids": [[number] * 3] * 10}))
    size = max(fs.size(f"{root}/{number}.parquet") for number in range(8))
    options = remote_options(tmp_path)
    options["cache"]["prefetch_bytes"] = size + size // 2  # one shard ahead of the one read
    dataset = Dataset.from_path("p", f"memory://{root}", io_options=options)
    release = threading.Event()
    runner = Runner(_HeldChain(dataset, release), parallelism=1, kind="threads")
    layout = PointerLayout(name="p", shard_rows=(10,) * 8, seed=3, window_shards=1, shuffle=False)
    # chunks of 1, 2 and 4 shards (they double): the cursor ends at shard 7, nothing read
    reader = DocumentReader(
        source=0,
        layout=layout,
        lane=0,
        num_lanes=1,
        exhaustion="stop",
        runner=runner,
        chunk_docs=10,
        ahead=3,
    )
    reading = threading.Thread(target=reader.columns)
    reading.start()
    try:
        assert _cached_shards(tmp_path / "cache", 2) == {"0.parquet", "1.parquet"}
    finally:
        release.set()
        reading.join()
        runner.close()
