"""Pure pointer streams: coverage without duplicates per pass, bounded locality, fresh passes."""

from __future__ import annotations

import itertools
from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from zephon_torch.work._permutation import permute
from zephon_torch.work.pointers import PointerLayout, lane_length


@given(n=st.integers(0, 5000), key=st.integers(0, 2**64 - 1))
@settings(max_examples=200, deadline=None)
def test_permute_is_a_bijection_of_range_n(n: int, key: int) -> None:
    out = permute(np.arange(n), n, key)
    assert sorted(out.tolist()) == list(range(n))


@given(n=st.integers(2, 5000), key=st.integers(0, 2**64 - 1), data=st.data())
@settings(max_examples=100, deadline=None)
def test_permute_point_queries_agree_with_the_whole_permutation(
    n: int, key: int, data: st.DataObject
) -> None:
    full = permute(np.arange(n), n, key)
    picks = data.draw(st.lists(st.integers(0, n - 1), min_size=1, max_size=20))
    assert permute(np.asarray(picks), n, key).tolist() == full[picks].tolist()


shard_rows = st.lists(st.integers(1, 50), min_size=1, max_size=12)


@given(
    rows=shard_rows,
    lanes=st.integers(1, 12),
    window=st.integers(1, 5),
    seed=st.integers(0, 1000),
    pass_index=st.integers(0, 3),
)
@settings(max_examples=150, deadline=None)
def test_every_row_belongs_to_exactly_one_lane_per_pass(
    rows: list[int], lanes: int, window: int, seed: int, pass_index: int
) -> None:
    layout = PointerLayout(
        name="d", shard_rows=tuple(rows), seed=seed, window_shards=window, shuffle=True
    )
    seen = []
    for lane in range(lanes):
        n = lane_length(num_rows=layout.num_rows, lane=lane, num_lanes=lanes)
        seen += [
            (p.shard, p.row)
            for p in layout.pointers(
                pass_index=pass_index, lane=lane, num_lanes=lanes, start=0, count=n
            )
        ]
    expected = [(s, r) for s, count in enumerate(rows) for r in range(count)]
    assert sorted(seen) == expected


@given(rows=shard_rows, lanes=st.integers(1, 6), seed=st.integers(0, 1000), data=st.data())
@settings(max_examples=100, deadline=None)
def test_a_chunk_of_a_lane_stream_equals_the_same_positions_read_one_by_one(
    rows: list[int], lanes: int, seed: int, data: st.DataObject
) -> None:
    layout = PointerLayout(
        name="d", shard_rows=tuple(rows), seed=seed, window_shards=2, shuffle=True
    )
    lane = data.draw(st.integers(0, lanes - 1))
    n = lane_length(num_rows=layout.num_rows, lane=lane, num_lanes=lanes)
    whole = layout.pointers(pass_index=1, lane=lane, num_lanes=lanes, start=0, count=n)
    singles = [
        layout.pointers(pass_index=1, lane=lane, num_lanes=lanes, start=i, count=1)[0]
        for i in range(n)
    ]
    assert whole == singles


def test_consecutive_positions_stay_within_one_window_of_shards() -> None:
    rows = tuple([100] * 20)
    layout = PointerLayout(name="d", shard_rows=rows, seed=3, window_shards=4, shuffle=True)
    pointers = layout.pointers(pass_index=0, lane=0, num_lanes=1, start=0, count=400)
    assert len({p.shard for p in pointers}) == 4
    later = layout.pointers(pass_index=0, lane=0, num_lanes=1, start=400, count=400)
    assert not {p.shard for p in pointers} & {p.shard for p in later}


def test_each_pass_has_a_different_order_and_a_different_seed_gives_another() -> None:
    def order(seed: int, pass_index: int) -> list[tuple[int, int]]:
        layout = PointerLayout(
            name="d", shard_rows=(30, 30, 30), seed=seed, window_shards=3, shuffle=True
        )
        return [
            (p.shard, p.row)
            for p in layout.pointers(pass_index=pass_index, lane=0, num_lanes=1, start=0, count=90)
        ]

    assert order(1, 0) != order(1, 1)
    assert order(1, 0) != order(2, 0)
    assert order(1, 0) == order(1, 0)
    assert sorted(order(1, 0)) == sorted(order(1, 1))


def test_the_order_depends_on_the_dataset_name_not_its_position() -> None:
    a = PointerLayout(name="wiki", shard_rows=(40,), seed=1, window_shards=1, shuffle=True)
    b = PointerLayout(name="news", shard_rows=(40,), seed=1, window_shards=1, shuffle=True)
    pa = [p.row for p in a.pointers(pass_index=0, lane=0, num_lanes=1, start=0, count=40)]
    pb = [p.row for p in b.pointers(pass_index=0, lane=0, num_lanes=1, start=0, count=40)]
    assert pa != pb


def test_unshuffled_streams_read_storage_order() -> None:
    layout = PointerLayout(name="d", shard_rows=(2, 3), seed=1, window_shards=1, shuffle=False)
    got = [
        (p.shard, p.row)
        for p in layout.pointers(pass_index=0, lane=0, num_lanes=1, start=0, count=5)
    ]
    assert got == [(0, 0), (0, 1), (1, 0), (1, 1), (1, 2)]


@given(
    rows=st.lists(st.integers(0, 40), min_size=1, max_size=12).filter(any),
    lanes=st.integers(1, 6),
    window=st.integers(1, 4),
    seed=st.integers(0, 1000),
    shuffle=st.booleans(),
    data=st.data(),
)
@settings(max_examples=150, deadline=None)
def test_upcoming_shards_list_every_shard_still_to_read_in_order_of_first_need(
    rows: list[int], lanes: int, window: int, seed: int, shuffle: bool, data: st.DataObject
) -> None:
    layout = PointerLayout(
        name="d", shard_rows=tuple(rows), seed=seed, window_shards=window, shuffle=shuffle
    )
    lane = data.draw(st.integers(0, lanes - 1))
    length = lane_length(num_rows=sum(rows), lane=lane, num_lanes=lanes)
    start = data.draw(st.integers(0, max(0, length - 1)))
    upcoming = list(layout.upcoming_shards(pass_index=1, lane=lane, num_lanes=lanes, start=start))
    assert len(set(upcoming)) == len(upcoming)
    assert all(rows[s] for s in upcoming)
    read = layout.pointers(
        pass_index=1, lane=lane, num_lanes=lanes, start=start, count=length - start
    )
    needed = list(dict.fromkeys(p.shard for p in read))
    assert set(needed) <= set(upcoming)
    # first needs follow the list, up to the order inside one window of shards
    order = list(layout.upcoming_shards(pass_index=1, lane=0, num_lanes=1, start=0))
    position = {shard: i for i, shard in enumerate(order)}
    shard_order = layout._layout(1).block_shards.tolist()  # unsplit: the keyed shard order
    window_of = {s: i // window for i, s in enumerate(shard_order)}
    key = window_of if shuffle else position
    assert [key[s] for s in needed] == sorted(key[s] for s in needed)
    assert [position[s] for s in upcoming] == sorted(position[s] for s in upcoming)


# -- shards split into window blocks (big Parquet shards) -----------------------------------------


Split = tuple[tuple[int, ...], tuple[tuple[int, ...], ...]]  # shard rows, each one's blocks


@st.composite
def split_shards(draw: st.DrawFn) -> Split:
    """Shard row counts and, per shard, a split into blocks (empty: unsplit)."""
    blocks = draw(
        st.lists(st.lists(st.integers(1, 12), min_size=1, max_size=5), min_size=1, max_size=8)
    )
    rows = tuple(sum(b) for b in blocks)
    return rows, tuple(tuple(b) if len(b) > 1 else () for b in blocks)


def _blocked(rows: tuple[int, ...], blocks: tuple[tuple[int, ...], ...], **kw: object) -> Any:
    return PointerLayout(name="d", shard_rows=rows, shard_blocks=blocks, **kw)  # type: ignore[arg-type]


@given(
    shards=split_shards(),
    lanes=st.integers(1, 6),
    window=st.integers(1, 4),
    seed=st.integers(0, 1000),
    shuffle=st.booleans(),
)
@settings(max_examples=150, deadline=None)
def test_split_shards_still_give_every_row_to_exactly_one_lane_per_pass(
    shards: Split,
    lanes: int,
    window: int,
    seed: int,
    shuffle: bool,
) -> None:
    rows, blocks = shards
    layout = _blocked(rows, blocks, seed=seed, window_shards=window, shuffle=shuffle)
    seen = []
    for lane in range(lanes):
        n = lane_length(num_rows=layout.num_rows, lane=lane, num_lanes=lanes)
        span = layout.span(pass_index=2, lane=lane, num_lanes=lanes, start=0, count=n)
        seen += list(zip(span.shards.tolist(), span.rows.tolist()))
    assert sorted(seen) == [(s, r) for s, count in enumerate(rows) for r in range(count)]


@given(shards=split_shards(), window=st.integers(1, 4), seed=st.integers(0, 1000))
@settings(max_examples=150, deadline=None)
def test_a_window_holds_at_most_window_blocks_and_a_shard_is_read_over_one_stretch(
    shards: Split, window: int, seed: int
) -> None:
    rows, blocks = shards
    layout = _blocked(rows, blocks, seed=seed, window_shards=window, shuffle=True)
    span = layout.span(pass_index=0, lane=0, num_lanes=1, start=0, count=layout.num_rows)
    # the block of each row: its shard and which run of the shard's rows it lies in
    starts = {s: np.cumsum((0,) + (blocks[s] or (rows[s],))) for s in range(len(rows))}
    block_of = [
        (s, int(np.searchsorted(starts[s], r, side="right")) - 1)
        for s, r in zip(span.shards.tolist(), span.rows.tolist())
    ]
    # rows of one window (window_starts) come from at most `window` blocks
    window_starts = layout._layout(0).window_starts.tolist()
    for begin, end in itertools.pairwise(window_starts):
        assert len(set(block_of[begin:end])) <= window
    # each block's and each shard's rows lie in consecutive windows: read over one stretch
    which = np.searchsorted(window_starts, np.arange(layout.num_rows), side="right") - 1
    for key in [lambda b: b, lambda b: b[0]]:
        groups: dict[Any, list[int]] = {}
        for position, block in enumerate(block_of):
            groups.setdefault(key(block), []).append(int(which[position]))
        for windows in groups.values():
            assert sorted(set(windows)) == list(range(min(windows), max(windows) + 1))


@given(
    rows=shard_rows, window=st.integers(1, 4), seed=st.integers(0, 1000), lanes=st.integers(1, 4)
)
@settings(max_examples=100, deadline=None)
def test_shards_that_are_one_block_each_keep_the_order_of_unsplit_shards(
    rows: list[int], window: int, seed: int, lanes: int
) -> None:
    plain = PointerLayout(
        name="d", shard_rows=tuple(rows), seed=seed, window_shards=window, shuffle=True
    )
    ones = _blocked(
        tuple(rows), tuple(() for _ in rows), seed=seed, window_shards=window, shuffle=True
    )
    n = lane_length(num_rows=sum(rows), lane=lanes - 1, num_lanes=lanes)
    where = {"pass_index": 1, "lane": lanes - 1, "num_lanes": lanes, "start": 0, "count": n}
    assert plain.pointers(**where) == ones.pointers(**where)


@given(shards=split_shards(), window=st.integers(1, 4), seed=st.integers(0, 1000), data=st.data())
@settings(max_examples=150, deadline=None)
def test_upcoming_shards_of_split_shards_name_each_shard_once_in_order_of_first_need(
    shards: Split,
    window: int,
    seed: int,
    data: st.DataObject,
) -> None:
    rows, blocks = shards
    layout = _blocked(rows, blocks, seed=seed, window_shards=window, shuffle=True)
    start = data.draw(st.integers(0, layout.num_rows - 1))
    upcoming = list(layout.upcoming_shards(pass_index=0, lane=0, num_lanes=1, start=start))
    assert len(set(upcoming)) == len(upcoming)
    span = layout.span(
        pass_index=0, lane=0, num_lanes=1, start=start, count=layout.num_rows - start
    )
    needed = list(dict.fromkeys(span.shards.tolist()))
    assert set(needed) <= set(upcoming)
    # a shard comes up no later than the window of its first row
    window_starts = layout._layout(0).window_starts
    first_window = {}
    for position, shard in enumerate(span.shards.tolist()):
        w = int(np.searchsorted(window_starts, start + position, side="right")) - 1
        first_window.setdefault(shard, w)
    windows = [first_window[s] for s in upcoming if s in first_window]
    assert windows == sorted(windows)


def test_blocks_that_do_not_split_their_shard_are_refused() -> None:
    with pytest.raises(ValueError, match="do not split"):
        _blocked((10, 5), ((4, 5), ()), seed=0, window_shards=1, shuffle=True)
    with pytest.raises(ValueError, match="block lists"):
        _blocked((10, 5), ((4, 6),), seed=0, window_shards=1, shuffle=True)


def test_an_unsplit_dataset_keeps_the_order_it_had_before_blocks_existed() -> None:
    """Pinned from the code before window blocks (b95b2f9): a saved run resumes into the
    same documents."""
    layout = PointerLayout(
        name="web", shard_rows=(3, 5, 2, 4), seed=7, window_shards=2, shuffle=True
    )
    got = layout.pointers(pass_index=1, lane=1, num_lanes=2, start=0, count=7)
    assert [(p.shard, p.row) for p in got] == [
        (0, 1), (2, 0), (3, 0), (3, 2), (1, 0), (1, 2), (1, 1)
    ]  # fmt: skip
    assert list(layout.upcoming_shards(pass_index=1, lane=1, num_lanes=2, start=3)) == [3, 1]


@given(
    shards=split_shards(),
    lanes=st.integers(1, 5),
    window=st.integers(1, 4),
    seed=st.integers(0, 1000),
    shuffle=st.booleans(),
    data=st.data(),
)
@settings(max_examples=150, deadline=None)
def test_upcoming_shards_of_split_shards_cover_every_lane_from_any_position(
    shards: Split,
    lanes: int,
    window: int,
    seed: int,
    shuffle: bool,
    data: st.DataObject,
) -> None:
    rows, blocks = shards
    layout = _blocked(rows, blocks, seed=seed, window_shards=window, shuffle=shuffle)
    lane = data.draw(st.integers(0, lanes - 1))
    length = lane_length(num_rows=layout.num_rows, lane=lane, num_lanes=lanes)
    start = data.draw(st.integers(0, max(0, length - 1)))
    where = {"pass_index": 3, "lane": lane, "num_lanes": lanes}
    upcoming = list(layout.upcoming_shards(**where, start=start))
    span = layout.span(**where, start=start, count=length - start)
    needed = list(dict.fromkeys(span.shards.tolist()))
    assert len(set(upcoming)) == len(upcoming)
    assert set(needed) <= set(upcoming)
    position = {shard: i for i, shard in enumerate(upcoming)}
    if not shuffle:  # in storage order, first needs follow the list exactly
        assert [position[s] for s in needed] == sorted(position[s] for s in needed)


def test_block_order_setup_is_vectorised_for_many_split_shards() -> None:
    """10,000 shards of 16 blocks each: a pass's layout is built without a Python loop per
    shard (it took 0.34 s per pass and process that way; 200,000 shards took 21 s)."""
    rows = tuple([1600] * 10_000)
    layout = _blocked(rows, tuple((100,) * 16 for _ in rows), seed=1, window_shards=4, shuffle=True)
    built = layout._layout(0)
    assert len(built.block_shards) == 160_000
    # each shard's blocks are adjacent, in a keyed order that is a permutation of its blocks
    shards = built.block_shards.reshape(10_000, 16)
    assert (shards == shards[:, :1]).all()
    firsts = built.block_rows.reshape(10_000, 16)
    assert (np.sort(firsts, axis=1) == np.arange(0, 1600, 100)).all()
    assert (firsts != np.arange(0, 1600, 100)).any(axis=1).mean() > 0.99
