"""A state's turns counted in another micro-batch size (``_regroup``): the rows each lane has
delivered are kept, or the state is refused."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from zephon_torch._regroup import regroup
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
