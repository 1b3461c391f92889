"""Where a rank's stream ends, and the one-process order rebuilt from workers' streams."""

from __future__ import annotations

import itertools
from types import SimpleNamespace

from hypothesis import given, settings
from hypothesis import strategies as st

from zephon_torch._turn_order import (
    cut_at_empty_turn,
    cut_lone_lane,
    in_lane_order,
    skip_spent_turns,
)


@given(
    starts=st.lists(st.integers(0, 3), min_size=1, max_size=6),
    end=st.integers(4, 8),
    data=st.data(),
)
@settings(max_examples=200, deadline=None)
def test_items_from_workers_come_out_in_turn_then_lane_order(
    starts: list[int], end: int, data: st.DataObject
) -> None:
    """Each lane's items arrive in its own order, interleaved any way (workers, merged)."""
    queues = [[(turn, lane) for turn in range(start, end)] for lane, start in enumerate(starts)]
    arrived: list[tuple[int, int]] = []
    while any(queues):
        lane = data.draw(st.sampled_from([i for i, q in enumerate(queues) if q]))
        arrived.append(queues[lane].pop(0))
    turns = dict(enumerate(starts))
    out = list(in_lane_order(arrived, key=lambda item: item, turns=turns))
    assert out == sorted(arrived)


def _cut(
    items: list[tuple[int, int]], ahead: int = 0, ended: list[tuple[int, int]] | None = None
) -> list[tuple[int, int]]:
    """(turn, tokens) items through the cut (the empty turn that ended them into ``ended``)."""
    return list(
        cut_at_empty_turn(
            items,
            turn=lambda i: i[0],
            tokens=lambda i: i[1],
            ahead=ahead,
            ended=None if ended is None else ended.extend,
        )
    )


def test_the_stream_ends_at_the_first_turn_without_tokens_and_keeps_padding_of_live_turns() -> None:
    items = [(0, 5), (0, 0), (1, 0), (1, 3), (2, 0), (2, 0), (3, 4)]
    ended: list[tuple[int, int]] = []
    assert _cut(items, ended=ended) == items[:4]  # turn 2 holds no token: it and all after are cut
    assert ended == [(2, 0), (2, 0)]  # the turn that ended the stream (its lanes' last states)
    assert _cut([(0, 0), (0, 0), (1, 2)], ended=ended) == []
    assert ended == [(2, 0), (2, 0), (0, 0), (0, 0)]
    ended.clear()
    assert _cut([(0, 1), (0, 0)], ended=ended) == [(0, 1), (0, 0)]
    assert ended == []  # the items ran out: no turn was cut


def test_a_turn_s_held_padding_goes_out_once_before_its_first_tokens() -> None:
    """Padding waits for its turn's tokens, and goes out once: later batches of the turn with
    tokens do not repeat it."""
    items = [(0, 0), (0, 2), (0, 1), (0, 0), (1, 0), (2, 1)]
    ended: list[tuple[int, int]] = []
    assert _cut(items, ended=ended) == items[:4]
    assert ended == [(1, 0)]


def test_turns_below_ahead_are_kept_whole_even_without_tokens() -> None:
    items = [(0, 0), (1, 0), (2, 0), (2, 0), (3, 1)]
    assert _cut(items, ahead=2) == [(0, 0), (1, 0)]
    assert _cut(items, ahead=4) == items


@given(
    tokens=st.lists(st.integers(0, 2), max_size=12),
    first=st.integers(0, 3),
    ahead=st.integers(0, 8),
)
@settings(max_examples=300, deadline=None)
def test_a_lone_lane_is_cut_where_the_general_cut_ends_it(
    tokens: list[int], first: int, ahead: int
) -> None:
    """One batch per turn (turns from ``first`` on), then all-padding batches for ever."""
    items = [(first + i, n) for i, n in enumerate(tokens)]
    endless = itertools.chain(items, ((first + len(items) + i, 0) for i in itertools.count()))
    batches = (SimpleNamespace(turn=turn, num_tokens=n) for turn, n in endless)
    lone_end: list[SimpleNamespace] = []
    lone = cut_lone_lane(lambda: next(batches), ahead=ahead, ended=lone_end.extend)
    got = [(b.turn, b.num_tokens) for b in itertools.islice(lone, len(items) + 10)]
    padded = items + [(first + len(items) + i, 0) for i in range(10)]
    general_end: list[tuple[int, int]] = []
    assert got == _cut(padded, ahead, general_end)
    assert [(b.turn, b.num_tokens) for b in lone_end] == general_end


@given(
    lanes=st.lists(
        st.one_of(st.none(), st.tuples(st.integers(0, 9), st.booleans())), min_size=1, max_size=6
    )
)
@settings(max_examples=300, deadline=None)
def test_spent_lanes_far_behind_move_up_and_the_turn_in_progress_is_kept(
    lanes: list[tuple[int, bool] | None],
) -> None:
    """Only where every lane is spent; there, every lane ends within the turn in progress."""
    states = {
        str(i): None if lane is None else {"turn": lane[0], "done": lane[1], "pack": {"i": i}}
        for i, lane in enumerate(lanes)
    }
    moved = skip_spent_turns(states)
    if any(lane is None or not lane[1] for lane in lanes):
        assert moved is states
        return
    ahead = max(turn for turn, _ in lanes)  # type: ignore[misc]
    for key, state in states.items():
        assert state is not None
        after = moved[key]
        assert after is not None and after["done"] and after["pack"] == state["pack"]
        expected = state["turn"] if state["turn"] >= ahead - 1 else ahead
        assert after["turn"] == expected


def test_spent_lanes_a_turn_behind_keep_their_turn_and_those_further_behind_move_up() -> None:
    turns = [5, 4, 3, 2, 5]
    states = {str(i): {"turn": t, "done": True, "pack": {}} for i, t in enumerate(turns)}
    moved = skip_spent_turns(states)
    assert [moved[str(i)]["turn"] for i in range(len(turns))] == [5, 4, 5, 5, 5]  # type: ignore[index]
