"""A state's turns counted in another micro-batch size (``_regroup``): the rows each lane has
delivered are kept, or the state is refused."""

from __future__ import annotations

import math
import re
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from zephon_torch._regroup import _MOST_TRIED, _divisors, as_loaded, regroup
from zephon_torch.errors import StateMismatchError


def _state(size: int, turns: list[int | None]) -> dict[str, Any]:
    lanes = {
        str(lane): None if turn is None else {"turn": turn, "done": False, "pack": {"p": lane}}
        for lane, turn in enumerate(turns)
    }
    began = [t for t in turns if t is not None]
    step = min(began) if len(began) == len(turns) and began else 0
    return {
        "version": 2,
        "fingerprint": {"seed": 1},
        "step": step,
        "microbatch_size": size,
        "lanes": lanes,
    }


@settings(deadline=None)
@given(
    saved=st.integers(1, 16),
    size=st.integers(1, 16),
    base=st.integers(0, 50),
    ahead=st.lists(st.booleans(), min_size=1, max_size=6),
)
def test_regrouping_keeps_every_lane_s_rows_or_refuses(
    saved: int, size: int, base: int, ahead: list[bool]
) -> None:
    turns = [base + a for a in ahead]  # a step begun: lanes a turn apart at most
    state = _state(saved, list(turns))
    rows = [t * saved for t in turns]
    if all(r % size == 0 for r in rows):
        out = regroup(state, size)
        assert [out["lanes"][str(i)]["turn"] * size for i in range(len(turns))] == rows
        assert out["step"] * size == state["step"] * saved
        assert out["microbatch_size"] == size
        assert [out["lanes"][str(i)]["pack"] for i in range(len(turns))] == [
            state["lanes"][str(i)]["pack"] for i in range(len(turns))
        ]
        back = regroup(out, saved)
        assert back["lanes"] == state["lanes"] and back["step"] == state["step"]
    else:
        with pytest.raises(StateMismatchError, match="microbatch_size"):
            regroup(state, size)
    assert state == _state(saved, list(turns))  # the caller's state is left as it was


@settings(deadline=None)
@given(saved=st.integers(1, 16), size=st.integers(1, 16))
def test_lanes_not_begun_and_the_size_in_an_older_fingerprint_are_regrouped_too(
    saved: int, size: int
) -> None:
    state = _state(saved, [None, None])
    state["fingerprint"]["microbatch_size"] = state.pop("microbatch_size")
    out = regroup(state, size)
    assert out["lanes"] == {"0": None, "1": None} and out["step"] == 0
    assert "microbatch_size" not in out["fingerprint"] and out["microbatch_size"] == size


def test_a_lane_whose_rows_do_not_divide_is_refused_where_the_step_s_rows_do() -> None:
    """Lanes mid-step at turns 3 and 2 of 2 rows: 6 and 4 rows, the step's 4. In micro-batches
    of 4 the step divides and lane 0 does not; the sizes offered divide every lane's rows."""
    state = _state(2, [3, 2])
    with pytest.raises(StateMismatchError) as caught:
        regroup(state, 4)
    saved, expected = caught.value.mismatches["microbatch_size"]
    assert saved == "2, rows a lane so far: lane 0: 6"
    assert "micro-batch sizes that divide them: [1, 2] (" in expected


@settings(deadline=None)
@given(uneven=st.integers(1, 9), even=st.integers(0, 3))
def test_every_lane_whose_rows_do_not_divide_is_named_or_counted(uneven: int, even: int) -> None:
    """Lanes of 1 row (uneven in micro-batches of 2) and of 2 rows (even): the message names
    the first four uneven lanes and counts the rest, and counts none it did not name."""
    state = _state(1, [1] * uneven + [2] * even)
    with pytest.raises(StateMismatchError) as caught:
        regroup(state, 2)
    saved, _ = caught.value.mismatches["microbatch_size"]
    named = re.findall(r"lane (\d+): 1\b", saved)
    more = re.search(r"and (\d+) more lanes", saved)
    assert named == [str(lane) for lane in range(min(uneven, 4))]
    assert (int(more.group(1)) if more else 0) == uneven - len(named)
    assert more is None or int(more.group(1)) > 0


@settings(deadline=None)
@given(saved=st.integers(1, 12), turns=st.lists(st.integers(1, 30), min_size=1, max_size=5))
def test_the_sizes_offered_are_the_smallest_that_divide_every_lane_s_rows(
    saved: int, turns: list[int]
) -> None:
    rows = [t * saved for t in turns]
    size = next(s for s in range(2, 1 << 12) if any(r % s for r in rows))
    with pytest.raises(StateMismatchError) as caught:
        regroup(_state(saved, turns), size)
    _, expected = caught.value.mismatches["microbatch_size"]
    offered = re.search(r"that divide them: \[([\d, ]*)\]", expected)
    assert offered is not None
    every = math.gcd(*rows, min(turns) * saved)  # the lanes' rows and the step's
    assert [int(d) for d in offered.group(1).split(", ")] == [
        d for d in range(1, every + 1) if every % d == 0
    ][:12]


@settings(deadline=None)
@given(number=st.integers(1, 20_000) | st.integers(1, 140).map(lambda r: r * r))
def test_divisors_are_every_divisor_once_ascending(number: int) -> None:
    assert _divisors(number) == [d for d in range(1, number + 1) if number % d == 0]


def test_divisors_are_whole_up_to_the_square_of_the_trial_bound_and_bounded_past_it() -> None:
    """2**32, the bound squared, has its 33 powers of two; past it only the divisors up to the
    bound are tried, so 2**34 gives those up to 2**16."""
    assert _MOST_TRIED == 1 << 16
    assert _divisors(1 << 32) == [1 << k for k in range(33)]
    assert _divisors((1 << 32) - 1) == sorted(
        math.prod(c) for c in _subsets([3, 5, 17, 257, 65537])
    )
    assert _divisors(1 << 34) == [1 << k for k in range(17)]


def _subsets(primes: list[int]) -> list[list[int]]:
    subsets: list[list[int]] = [[]]
    for prime in primes:
        subsets += [[*subset, prime] for subset in subsets]
    return subsets


@pytest.mark.parametrize(
    "state",
    [None, [1, 2], "state", {"microbatch_size": 2, "lanes": {}}, {"fingerprint": [], "step": 1}],
)
def test_what_is_not_a_state_s_dict_is_returned_as_it_is(state: Any) -> None:
    """Its shape is checked where it is loaded, which names what is wrong with it."""
    assert regroup(state, 3) is state


@pytest.mark.parametrize("saved", [0, -2, 2.0, True, "2"])
def test_a_saved_size_that_is_not_a_positive_int_is_refused(saved: Any) -> None:
    state = _state(2, [1, 1])
    state["microbatch_size"] = saved
    with pytest.raises(StateMismatchError, match="microbatch_size") as caught:
        regroup(state, 2)
    assert caught.value.mismatches["microbatch_size"][0] == saved


@pytest.mark.parametrize("lanes", [None, [{"turn": 1}], "lanes"])
def test_lanes_that_are_not_a_dict_are_left_to_the_shape_check(lanes: Any) -> None:
    state = _state(2, [1]) | {"lanes": lanes}
    out = regroup(state, 1)
    assert out["lanes"] is lanes and out["microbatch_size"] == 1


def test_a_state_mid_step_with_lanes_not_begun_is_refused_with_a_smaller_size() -> None:
    """Lanes not begun stand at turn 0: beside a lane at turn 1 of 2 rows they are a turn
    apart, two turns in micro-batches of 1."""
    with pytest.raises(StateMismatchError, match="saved mid-step") as caught:
        as_loaded(_state(2, [None, 1]), 1)
    assert "would stand 2 turns apart" in caught.value.mismatches["microbatch_size"][1]


def test_a_finished_lane_a_turn_behind_does_not_make_a_state_mid_step() -> None:
    state = _state(2, [1, 2])
    state["lanes"]["0"]["done"] = True
    out = as_loaded(state, 1)
    assert [out["lanes"][lane]["turn"] for lane in ("0", "1")] == [2, 4]


@pytest.mark.parametrize("state", [None, [1], {"fingerprint": {}, "lanes": "lanes"}])
def test_as_loaded_returns_what_is_not_a_state_s_dict_as_it_is(state: Any) -> None:
    assert as_loaded(state, 2) == state
