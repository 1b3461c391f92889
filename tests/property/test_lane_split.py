"""The lane arithmetic alone (``zephon_torch._lane_split``, public through ``elastic``): which
lanes a rank owns, the topology checks, and whether ranks holding a state's lanes are in step."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from zephon_torch._lane_split import step_remainder
from zephon_torch.elastic import (
    check_in_step,
    check_topology,
    lanes_for_rank,
    rank_turns,
    ranks_out_of_step,
    supported_world_sizes,
)
from zephon_torch.errors import ConfigError, StateMismatchError


def lane(turn: int, done: bool = False) -> dict[str, Any]:
    return {"turn": turn, "done": done}


@settings(deadline=None)
@given(lanes=st.integers(1, 60), data=st.data())
def test_the_ranks_own_contiguous_equal_blocks_that_cover_the_lanes_in_order(
    lanes: int, data: st.DataObject
) -> None:
    sizes = supported_world_sizes(canonical_replicas=lanes)
    assert sizes == [w for w in range(1, lanes + 1) if lanes % w == 0]
    world = data.draw(st.sampled_from(sizes))
    owned = [
        lanes_for_rank(canonical_replicas=lanes, world_size=world, rank=r) for r in range(world)
    ]
    assert [n for block in owned for n in block] == list(range(lanes))
    assert {len(block) for block in owned} == {lanes // world}


@pytest.mark.parametrize(
    ("kw", "message"),
    [
        ({"canonical_replicas": 4.0}, "`canonical_replicas` must be an integer"),
        ({"world_size": 2.0}, "`world_size` must be an integer"),
        ({"rank": 1.0}, "`rank` must be an integer"),
        ({"canonical_replicas": 0}, "`canonical_replicas` must be positive, got 0"),
        ({"world_size": 0}, "`world_size` must be positive, got 0"),
        ({"world_size": 3}, r"`world_size` 3 does not divide .* sizes: \[1, 2, 4\] \(set by"),
        ({"rank": 2}, r"`rank` must be in \[0, 2\), got 2"),
        ({"rank": -1}, r"`rank` must be in \[0, 2\), got -1"),
    ],
)
def test_a_topology_that_does_not_fit_is_refused_naming_the_setting(
    kw: dict[str, Any], message: str
) -> None:
    args = {"canonical_replicas": 4, "world_size": 2, "rank": 1} | kw
    with pytest.raises(ConfigError, match=message):
        check_topology(**args)
    with pytest.raises(ConfigError, match=message):
        lanes_for_rank(**args)


def test_the_last_rank_and_a_world_of_all_lanes_fit() -> None:
    check_topology(canonical_replicas=4, world_size=2, rank=1)
    assert lanes_for_rank(canonical_replicas=4, world_size=4, rank=3) == [3]
    assert lanes_for_rank(canonical_replicas=4, world_size=1, rank=0) == [0, 1, 2, 3]


def test_a_rank_s_turns_count_lanes_not_begun_as_turn_0_and_spent_lanes_while_one_has_data() -> (
    None
):
    assert rank_turns([None, lane(2)]) == [0, 2]
    assert rank_turns([lane(3, done=True), lane(2)]) == [3, 2]
    assert rank_turns([lane(3, done=True), lane(2, done=True)]) is None
    assert rank_turns([None, lane(2, done=True)]) == [0, 2]  # a lane not begun has data


@settings(deadline=None)
@given(
    per_rank=st.integers(1, 6),
    world=st.integers(1, 6),
    turn=st.integers(0, 50),
    ahead=st.data(),
)
def test_ranks_stopped_mid_step_together_are_in_step_on_their_world_size_only(
    per_rank: int, world: int, turn: int, ahead: st.DataObject
) -> None:
    """Ranks deliver micro-batches together: stopped mid-step, each rank's first ``k`` lanes
    are a turn ahead of the rest. In step on that world size; on another one whose ranks'
    blocks hold other numbers of lanes ahead, not."""
    k = ahead.draw(st.integers(0, per_rank - 1))
    lanes_total = per_rank * world
    turns = [turn + (n % per_rank < k) for n in range(lanes_total)]
    state = {str(n): lane(t) for n, t in enumerate(turns)}
    assert ranks_out_of_step(state, canonical_replicas=lanes_total, world_size=world) is None
    check_in_step(state, canonical_replicas=lanes_total, world_size=world)
    for size in supported_world_sizes(canonical_replicas=lanes_total):
        width = lanes_total // size
        blocks = {tuple(turns[r * width : (r + 1) * width]) for r in range(size)}
        got = ranks_out_of_step(state, canonical_replicas=lanes_total, world_size=size)
        if len(blocks) == 1:
            assert got is None
        else:
            assert got == [list(turns[r * width : (r + 1) * width]) for r in range(size)]
            with pytest.raises(StateMismatchError, match=f"the {size} ranks at different turns"):
                check_in_step(state, canonical_replicas=lanes_total, world_size=size)


def test_a_state_out_of_step_is_refused_naming_its_turns_and_the_world_sizes_it_fits() -> None:
    state = {"0": lane(2), "1": lane(2), "2": lane(1), "3": lane(1)}
    assert ranks_out_of_step(state, canonical_replicas=4, world_size=1) is None
    assert ranks_out_of_step(state, canonical_replicas=4, world_size=2) == [[2, 2], [1, 1]]
    with pytest.raises(StateMismatchError) as caught:
        check_in_step(state, canonical_replicas=4, world_size=4)
    saved, expected = caught.value.mismatches["lanes"]
    assert "lanes at turns [1, 2]" in saved and "the 4 ranks at different turns" in saved
    assert "the world sizes it is in step on: [1]" in saved
    assert expected == "each rank's lanes at the turns of every other rank's"
    one_ahead = {"0": lane(2), "1": lane(1), "2": lane(2), "3": lane(1)}
    with pytest.raises(StateMismatchError, match=r"it is in step on: \[1, 2\]"):
        check_in_step(one_ahead, canonical_replicas=4, world_size=4)
    with pytest.raises(StateMismatchError, match=r"it is in step on: \[1\]\)"):
        check_in_step({"0": lane(2), "1": lane(1)}, canonical_replicas=2, world_size=2)


def test_a_rank_whose_lanes_are_all_spent_is_not_compared_and_a_missing_lane_is_not_begun() -> None:
    spent = {"0": lane(5, done=True), "1": lane(4, done=True), "2": lane(1), "3": lane(1)}
    assert ranks_out_of_step(spent, canonical_replicas=4, world_size=2) is None
    assert ranks_out_of_step(spent, canonical_replicas=4, world_size=4) is None
    apart = spent | {"3": lane(2)}
    assert ranks_out_of_step(apart, canonical_replicas=4, world_size=4) == [None, None, [1], [2]]
    one_spent = {"0": lane(5, done=True), "1": lane(1), "2": lane(1), "3": lane(1)}
    assert ranks_out_of_step(one_spent, canonical_replicas=4, world_size=2) == [[5, 1], [1, 1]]
    missing = {"0": lane(1), "1": lane(1)}  # lanes 2 and 3 not begun: turn 0
    assert ranks_out_of_step(missing, canonical_replicas=4, world_size=2) == [[1, 1], [0, 0]]
    assert ranks_out_of_step({}, canonical_replicas=4, world_size=2) is None


@pytest.mark.parametrize(
    ("turns", "left"),
    [
        ([3, 3, 2, 2, 2], 3),  # stopped mid-step: the three lanes a turn behind, then in step
        ([3, 2], 1),
        ([2, 2, 2], 0),  # at a step's end
        ([4, 2, 2], 0),  # further apart: ranks that ended at different turns, merged
        ([], 0),
    ],
)
def test_a_rank_stopped_mid_step_has_the_lanes_a_turn_behind_left_to_deliver(
    turns: list[int], left: int
) -> None:
    assert step_remainder([lane(t) for t in turns]) == left
    assert step_remainder([lane(t, done=True) for t in turns]) == 0  # all spent: nothing


def test_a_rank_s_lanes_not_begun_stand_at_turn_0() -> None:
    assert step_remainder([lane(1), None, None]) == 2
