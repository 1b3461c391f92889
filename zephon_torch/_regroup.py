"""A saved state's turns in another micro-batch size: the micro-batch size is a performance
knob, not part of the recipe.

A lane's rows, and its state after each row, do not depend on how many rows a micro-batch
takes (the ``wrap`` packer's block path ends each block as row by row would). Only the lane's
turn counts micro-batches; a state saved with micro-batches of ``m`` rows, at turn ``t``, stands
after ``t * m`` rows of each lane, and goes on with micro-batches of ``m'`` rows at turn
``t * m / m'``, where that is a whole number. A global step (a turn of every lane) then holds
``L * m'`` rows: a training loop that keeps its global batch accumulates ``m / m'`` times as
many micro-batches per optimizer step.

States record the size they were saved with (``"microbatch_size"``); states saved before that
hold it in their fingerprint, as part of the recipe then.
"""

from __future__ import annotations

import copy
import math
from typing import Any

from zephon_torch._packed_rows import unpack_lanes
from zephon_torch.errors import StateMismatchError

KEY = "microbatch_size"


def saved_size(state: dict[str, Any]) -> Any:
    """The micro-batch size ``state`` was saved with (not checked)."""
    fingerprint = state.get("fingerprint")
    earlier = fingerprint.get(KEY) if isinstance(fingerprint, dict) else None
    return state.get(KEY, earlier)


def regroup(state: Any, microbatch_size: int) -> Any:
    """``state`` (a pipeline state, checked for its shape elsewhere) with its lanes' turns and
    step counted in micro-batches of ``microbatch_size`` rows; the state itself where nothing
    changes or it is not a state's dict.

    Raises:
        StateMismatchError: when the size saved is not a positive int, or some lane's rows so
            far are not a whole number of micro-batches of the new size.
    """
    if not isinstance(state, dict) or not isinstance(state.get("fingerprint"), dict):
        return state
    saved = saved_size(state)
    if saved is None:
        return state  # not a pipeline's state: its shape check says so
    if type(saved) is not int or saved < 1:
        raise StateMismatchError({KEY: (saved, "the micro-batch size saved, a positive int")})
    out = {key: value for key, value in state.items() if key != "lanes"}
    out["fingerprint"] = {k: v for k, v in state["fingerprint"].items() if k != KEY}
    out[KEY] = microbatch_size
    lanes = state.get("lanes")
    if saved == microbatch_size or not isinstance(lanes, dict):
        out["lanes"] = lanes
        return out
    uneven: list[str] = []
    counts: list[int] = []  # every lane's rows so far, and the step's
    regrouped: dict[str, Any] = {}
    for lane, lane_state in lanes.items():
        turn = lane_state.get("turn") if isinstance(lane_state, dict) else None
        if type(turn) is not int:  # None (not begun), or malformed: checked as it is
            regrouped[lane] = lane_state
            continue
        rows = turn * saved
        counts.append(rows)
        if rows % microbatch_size:
            uneven.append(f"lane {lane}: {rows}")
        regrouped[lane] = {**lane_state, "turn": rows // microbatch_size}
    step = state.get("step")
    uneven_step = ""
    if type(step) is int:
        counts.append(step * saved)
        if step * saved % microbatch_size:
            uneven_step = f"the step's {step * saved}"
    if uneven or uneven_step:
        # lanes only in the count: "lane 3: 6 and 1 more" of 4 lanes meant the step's rows
        more = f" and {len(uneven) - 4} more lanes" if len(uneven) > 4 else ""
        told = "; ".join(part for part in (", ".join(uneven[:4]) + more, uneven_step) if part)
        sizes = _divisors(math.gcd(*counts))[:12]
        raise StateMismatchError(
            {
                KEY: (
                    f"{saved}, rows a lane so far: {told}",
                    f"{microbatch_size}: resume where every lane's rows are a whole number of "
                    f"micro-batches of {microbatch_size}; micro-batch sizes that divide them: "
                    f"{sizes} (or load a state saved at a step whose rows divide by "
                    f"{microbatch_size})",
                )
            }
        )
    out["lanes"] = copy.deepcopy(regrouped)
    if type(step) is int:
        out["step"] = step * saved // microbatch_size
    return out


def as_loaded(state: Any, microbatch_size: int) -> Any:
    """A saved state as a pipeline reads it: its turns in micro-batches of
    ``microbatch_size`` (``regroup``) and its bin packers' rows as lists (``_packed_rows``).

    Raises:
        StateMismatchError: as ``regroup``, and for a state saved mid-step (its lanes with
            data a turn apart) loaded with smaller micro-batches: its lanes would stand
            several turns apart, where a run of that size never leaves them.
    """
    converted = regroup(state, microbatch_size)
    before, after = _turns_with_data(state), _turns_with_data(converted)
    if len(set(before)) == 2 and max(before) - min(before) == 1 and max(after) - min(after) > 1:
        raise StateMismatchError(
            {
                KEY: (
                    f"{saved_size(state)}, saved mid-step: lanes with data at turns "
                    f"{sorted(set(before))}",
                    f"{microbatch_size}: in micro-batches of {microbatch_size} those lanes "
                    f"would stand {max(after) - min(after)} turns apart, which no run leaves; "
                    f"load it with micro-batches of {saved_size(state)}, or resume from a "
                    "state saved at a step end",
                )
            }
        )
    if isinstance(converted, dict) and isinstance(converted.get("lanes"), dict):
        converted = {**converted, "lanes": unpack_lanes(converted["lanes"])}
    return converted


def _turns_with_data(state: Any) -> list[int]:
    """The turns of ``state``'s lanes that have data left (a lane not begun at turn 0; a
    malformed one left to the state's checks)."""
    lanes = state.get("lanes") if isinstance(state, dict) else None
    if not isinstance(lanes, dict):
        return []
    turns = []
    for lane_state in lanes.values():
        if lane_state is None:
            turns.append(0)
        elif isinstance(lane_state, dict) and not lane_state.get("done"):
            turn = lane_state.get("turn")
            if type(turn) is int:
                turns.append(turn)
    return turns


_MOST_TRIED = 1 << 16  # divisors tried: an edited size of 2**61 - 1 took minutes


def _divisors(number: int) -> list[int]:
    """``number``'s divisors, ascending (none for 0), found up to its square root; of a
    number past ``_MOST_TRIED ** 2``, those up to ``_MOST_TRIED`` only."""
    root = math.isqrt(number)
    low = [d for d in range(1, min(root, _MOST_TRIED) + 1) if number % d == 0]
    if root > _MOST_TRIED:
        return low
    return low + [number // d for d in reversed(low) if d * d != number]
