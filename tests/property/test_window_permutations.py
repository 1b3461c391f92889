"""Shuffle windows permuted all at once (``permute_runs``) give the order of one ``permute`` call
a window, as the keyed Feistel network spelled out on Python ints defines it: the order is part
of a saved state's contract, so a run saved before resumes into the same documents."""

from __future__ import annotations

import hashlib
import itertools
import threading
import time
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from zephon_torch import Pipeline
from zephon_torch.io import Dataset
from zephon_torch.work import StaticMixtureWorkSource, TokenEstimation, _permutation, pointers
from zephon_torch.work._hashing import stable_key, stable_key_grid, stable_keys
from zephon_torch.work._permutation import permute, permute_runs
from zephon_torch.work.pointers import PointerLayout, lane_length

_WORD = (1 << 64) - 1


def _mix64(x: int) -> int:
    x ^= x >> 30
    x = (x * 0xBF58476D1CE4E5B9) & _WORD
    x ^= x >> 27
    x = (x * 0x94D049BB133111EB) & _WORD
    return x ^ (x >> 31)


def reference_permute(i: int, n: int, key: int) -> int:
    """Position ``i`` of the permutation ``key`` of ``range(n)``: 4 Feistel rounds over the
    smallest even bit width covering ``n``, walked until inside ``range(n)``."""
    if n <= 1:
        return i
    half = max(1, ((n - 1).bit_length() + 1) // 2)
    mask = (1 << half) - 1
    round_keys = [stable_key(key, r) for r in range(4)]
    while True:
        left, right = i >> half, i & mask
        for k in round_keys:
            left, right = right, (_mix64(right ^ k) & mask) ^ left
        i = (left << half) | right
        if i < n:
            return i


def reference_span(
    layout: PointerLayout, pass_index: int, lane: int, num_lanes: int, start: int, count: int
) -> list[tuple[int, int]]:
    """(shard, row) of each lane position, one window at a time, as the code before
    ``permute_runs`` located them (through the same pass layout)."""
    built = layout._layout(pass_index)
    windows, ordered = built.window_starts.tolist(), built.ordered_starts.tolist()
    out = []
    for pos in range(start * num_lanes + lane, (start + count) * num_lanes, num_lanes):
        w = int(np.searchsorted(windows, pos, side="right")) - 1
        key = stable_key(layout.seed, layout.name, pass_index, "window", w)
        offset = windows[w] + reference_permute(pos - windows[w], windows[w + 1] - windows[w], key)
        block = int(np.searchsorted(ordered, offset, side="right")) - 1
        row = offset - ordered[block] + int(built.block_rows[block])
        out.append((int(built.block_shards[block]), row))
    return out


def each_walk() -> Iterator[str]:
    """The compiled walk (``zephon_torch._native``), then numpy's, as where it is not built."""
    assert _permutation._native is not None, "zephon_torch._native was not built"
    yield "compiled"
    held, _permutation._native = _permutation._native, None
    try:
        yield "numpy"
    finally:
        _permutation._native = held


@given(
    n=st.one_of(st.integers(0, 3000), st.integers(2**62, 2**63 - 1)),
    key=st.integers(0, 2**64 - 1),
    data=st.data(),
)
@settings(max_examples=150, deadline=None)
def test_permute_is_the_feistel_network_spelled_out_on_python_ints(
    n: int, key: int, data: st.DataObject
) -> None:
    picks = data.draw(st.lists(st.integers(0, n - 1), max_size=30)) if n else []
    for _ in each_walk():
        got = permute(np.asarray(picks, dtype=np.int64), n, key).tolist()
        assert got == [reference_permute(i, n, key) for i in picks]


def test_the_compiled_walk_refuses_what_would_never_walk_back_into_range() -> None:
    from zephon_torch import _native

    params = np.array([[5], [2], [3], [1], [2], [3], [4]], dtype=np.uint64)  # n 5, 4-bit domain
    values = np.arange(5, dtype=np.uint64)
    expected = [_permutation._walk(values, params).tolist() for walk in each_walk()]
    _native.walk(values, params)
    assert values.tolist() == expected[0] == expected[1]
    assert sorted(expected[0]) == [0, 1, 2, 3, 4]
    bad = [
        (np.array([5], np.uint64), params, "value 0 lies outside"),  # not below n
        (np.array([1], np.uint64), params.astype(np.int64), "`params` must be"),
        (np.array([1], np.int64), params, "`values` must be"),
        (np.array([1, 2, 3], np.uint64), np.repeat(params, 2, axis=1), "`params` must be"),
        (np.array([1], np.uint64), params[:2], "`params` must be"),
    ]
    wide = params.copy()
    wide[0, 0] = 17  # beyond the 4-bit domain: a cycle of values above n would never end
    bad.append((np.array([16], np.uint64), wide, "value 0 lies outside"))
    for values, table, message in bad:
        with pytest.raises(ValueError, match=message):
            _native.walk(values, table)
    with pytest.raises(ValueError, match="not C-contiguous"):
        _native.walk(np.arange(4, dtype=np.uint64)[::2], params)


runs = st.lists(
    st.tuples(
        st.one_of(st.integers(1, 12), st.integers(1, 5000), st.integers(2**40, 2**40 + 9)),
        st.integers(0, 2**64 - 1),
        st.lists(st.integers(0, 2**62), max_size=6),  # picks, taken modulo the size
    ),
    max_size=25,
)


@given(runs=runs)
@settings(max_examples=200, deadline=None)
def test_permute_runs_maps_each_run_as_permute_of_its_size_and_key(
    runs: list[tuple[int, int, list[int]]],
) -> None:
    """Sizes of one row, a few rows (walks of several steps) and 2**40 rows side by side."""
    index = [p % size for size, _, picks in runs for p in picks]
    expected = [reference_permute(p % size, size, key) for size, key, picks in runs for p in picks]
    for _ in each_walk():
        got = permute_runs(
            np.asarray(index, dtype=np.int64),
            [len(picks) for _, _, picks in runs],
            [size for size, _, _ in runs],
            [key for _, key, _ in runs],
        ).tolist()
        assert got == expected
        singly = [
            permute(np.asarray([p % size for p in picks], dtype=np.int64), size, key).tolist()
            for size, key, picks in runs
        ]
        assert got == list(itertools.chain.from_iterable(singly))


@given(
    parts=st.lists(st.one_of(st.integers(), st.text(max_size=8)), max_size=4),
    counters=st.lists(st.integers(0, 2**64), max_size=8),
)
@settings(max_examples=100, deadline=None)
def test_batched_keys_are_the_keys_of_one_call_each(
    parts: list[object], counters: list[int]
) -> None:
    assert stable_keys(tuple(parts), counters).tolist() == [stable_key(*parts, c) for c in counters]
    keys = [c % 2**64 for c in counters]
    assert stable_key_grid(keys, 4).tolist() == [[stable_key(k, r) for r in range(4)] for k in keys]


@given(
    rows=st.lists(st.integers(0, 4), min_size=1, max_size=60).filter(any)
    | st.lists(st.integers(0, 300), min_size=1, max_size=8).filter(any),
    lanes=st.integers(1, 20),
    window=st.integers(1, 6),
    seed=st.integers(0, 2**32),
    pass_index=st.integers(0, 5),
    data=st.data(),
)
@settings(max_examples=200, deadline=None)
def test_a_span_of_tiny_or_big_shards_equals_the_window_by_window_reference(
    rows: list[int],
    lanes: int,
    window: int,
    seed: int,
    pass_index: int,
    data: st.DataObject,
) -> None:
    layout = PointerLayout(
        name="web", shard_rows=tuple(rows), seed=seed, window_shards=window, shuffle=True
    )
    lane = data.draw(st.integers(0, lanes - 1))
    length = lane_length(num_rows=layout.num_rows, lane=lane, num_lanes=lanes)
    start = data.draw(st.integers(0, length))
    count = data.draw(st.integers(0, length - start))
    where = {"pass_index": pass_index, "lane": lane, "num_lanes": lanes}
    span = layout.span(**where, start=start, count=count)
    got = list(zip(span.shards.tolist(), span.rows.tolist()))
    assert got == reference_span(layout, pass_index, lane, lanes, start, count)


@given(
    blocks=st.lists(st.lists(st.integers(1, 4), min_size=1, max_size=4), min_size=1, max_size=12),
    lanes=st.integers(1, 8),
    window=st.integers(1, 4),
    seed=st.integers(0, 1000),
)
@settings(max_examples=100, deadline=None)
def test_a_span_of_split_shards_equals_the_window_by_window_reference(
    blocks: list[list[int]], lanes: int, window: int, seed: int
) -> None:
    layout = PointerLayout(
        name="d",
        shard_rows=tuple(sum(b) for b in blocks),
        shard_blocks=tuple(tuple(b) if len(b) > 1 else () for b in blocks),
        seed=seed,
        window_shards=window,
        shuffle=True,
    )
    for lane in range(lanes):
        n = lane_length(num_rows=layout.num_rows, lane=lane, num_lanes=lanes)
        span = layout.span(pass_index=1, lane=lane, num_lanes=lanes, start=0, count=n)
        got = list(zip(span.shards.tolist(), span.rows.tolist()))
        assert got == reference_span(layout, 1, lane, lanes, 0, n)


def _digest(arrays: list[np.ndarray]) -> str:
    h = hashlib.sha256()
    for a in arrays:
        h.update(np.ascontiguousarray(a, dtype=np.int64).tobytes())
    return h.hexdigest()[:32]


def test_tiny_shards_keep_the_lane_order_of_the_code_of_one_call_a_window() -> None:
    """Pinned from the code before ``permute_runs`` (f31eccf): 3,000 shards of 1-3 rows, 16
    lanes, two passes, read in chunks of 100 positions that cut windows."""
    rows = tuple(1 + (i * 7) % 3 for i in range(3000))
    layout = PointerLayout(name="code", shard_rows=rows, seed=5, window_shards=4, shuffle=True)
    columns = []
    for pass_index, lane in itertools.product((0, 1), range(16)):
        n = lane_length(num_rows=layout.num_rows, lane=lane, num_lanes=16)
        for start in range(0, n, 100):
            where = {"pass_index": pass_index, "lane": lane, "num_lanes": 16}
            span = layout.span(**where, start=start, count=min(100, n - start))
            columns += [span.shards, span.rows]
    assert _digest(columns) == "4b55d4532a2318c83967adc1961abbfa"


def test_a_pipeline_over_one_document_a_file_gives_the_batches_of_the_code_before() -> None:
    """Pinned from the code before ``permute_runs`` (f31eccf): 150 batches, several passes,
    of two datasets of one and two documents a shard over 4 lanes."""

    def one_file_a_document(name: str, count: int, shard_size: int, first: int) -> Dataset:
        ids = [np.arange(first + i, first + i + 1 + i % 5, dtype=np.int32) for i in range(count)]
        return Dataset.from_dict(name, {"ids": ids}, shard_size=shard_size)

    datasets = [one_file_a_document("code", 400, 1, 1000), one_file_a_document("web", 300, 2, 5000)]
    source = StaticMixtureWorkSource(
        datasets,
        {"code": 1, "web": 1},
        seed=11,
        token_estimation=TokenEstimation(),
        exhaustion="repeat",
    )
    pipeline = (
        Pipeline(source).options(canonical_replicas=4).pretokenized("ids").pack_flat(32).batch(2)
    )
    batches = [batch.input_ids for batch in itertools.islice(pipeline, 150)]
    assert _digest(batches) == "e0e815e402e7db42768f5a0f6893da15"


def test_a_chunk_over_a_thousand_windows_is_located_without_a_call_a_window(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """16 lanes over 2-row shards: each position is a window of its own. A ``permute`` and a
    ``stable_key`` call a window cost 70-150 us a document, most of a pass over such shards."""
    layout = PointerLayout(
        name="web", shard_rows=(2,) * 8192, seed=3, window_shards=4, shuffle=True
    )
    layout._layout(0)  # the pass layout (its shard order is one call a pass) is cached
    calls: list[str] = []

    def counted(name: str) -> Any:
        real = getattr(pointers, name)

        def call(*args: Any) -> Any:
            calls.append(name)
            return real(*args)

        return call

    for name in ("permute", "stable_key"):
        monkeypatch.setattr(pointers, name, counted(name))
    span = layout.span(pass_index=0, lane=5, num_lanes=16, start=0, count=1000)
    assert len(set(span.shards.tolist())) == 1000
    assert calls == []


def test_a_long_walk_lets_other_threads_run() -> None:
    """The elastic sampler permutes a whole dataset at once (about a second for 20 million
    rows): held through it, the GIL stopped every other thread of the process that long."""
    from zephon_torch import _native

    count, stop = [0], threading.Event()

    def spin() -> None:
        while not stop.is_set():
            count[0] += 1

    spinner = threading.Thread(target=spin, daemon=True)
    spinner.start()
    try:
        time.sleep(0.05)
        before, start = count[0], time.perf_counter()
        time.sleep(0.1)
        rate = (count[0] - before) / (time.perf_counter() - start)
        n = 1 << 22
        values = np.arange(n, dtype=np.uint64)
        params = np.array([[n], [11], [(1 << 11) - 1], [1], [2], [3], [4]], dtype=np.uint64)
        before, start = count[0], time.perf_counter()
        _native.walk(values, params)
        took = time.perf_counter() - start
        spun = count[0] - before
    finally:
        stop.set()
        spinner.join()
    assert sorted(values[:1000].tolist()) != list(range(1000))  # walked
    assert took > 0.02, "too fast to tell on this machine"
    # held, the spinner runs a switch interval (5 ms) at most
    assert spun > 0.25 * rate * took, (spun, rate, took)
