"""The micro-batch size is a performance knob: global steps hold the same rows for every size
whose micro-batches make them up, and a state resumes with another size (``_regroup``)."""

from __future__ import annotations

import copy
import json
from typing import Any

import pytest

from tests.helpers import small_pipeline
from zephon_torch import Pipeline, StateMismatchError
from zephon_torch.ops.batch import Batch

LANES = 2
STEP_ROWS = 8  # a global step's rows per lane: 8 micro-batches of 1 row, ..., 1 of 8


def _rows(batch: Batch) -> list[tuple[bytes, str]]:
    """Each row of ``batch``: its ids and its layout (lengths, sources, document starts)."""
    return [
        (
            batch.input_ids[r].tobytes(),
            json.dumps([batch.lengths[r], batch.sources[r], batch.starts_document[r]]),
        )
        for r in range(batch.input_ids.shape[0])
    ]


def _lane_rows(pipeline: Pipeline, rows: int) -> dict[int, list[tuple[bytes, str]]]:
    """Each lane's first ``rows`` rows from where ``pipeline`` stands."""
    out: dict[int, list[tuple[bytes, str]]] = {lane: [] for lane in pipeline.lanes}
    for batch in pipeline:
        out[batch.lane] += _rows(batch)
        if all(len(got) >= rows for got in out.values()):
            break
    return {lane: got[:rows] for lane, got in out.items()}


def _pipeline(tokenizer: Any, size: int, algorithm: str = "wrap") -> Pipeline:
    return small_pipeline(
        tokenizer, lanes=LANES, microbatch_size=size, algorithm=algorithm, exhaustion="repeat"
    )


@pytest.mark.parametrize("algorithm", ["wrap", "best_fit"])
@pytest.mark.parametrize("shuffle", [None, 8])
def test_every_global_step_holds_the_same_rows_for_every_microbatch_size(
    tokenizer: Any, algorithm: str, shuffle: int | None
) -> None:
    """A global step of 16 rows is one turn of micro-batches of 8, or 8 turns of 1; each
    step's rows (and their layouts) are the same set, bit for bit, whatever the size."""
    steps = 4

    def global_steps(size: int) -> list[list[tuple[bytes, str]]]:
        pipeline = _pipeline(tokenizer, size, algorithm)
        if shuffle is not None:
            pipeline = pipeline.shuffle(shuffle)
        out: list[list[tuple[bytes, str]]] = [[] for _ in range(steps)]
        turns_per_step = STEP_ROWS // size
        for batch in pipeline:
            step = batch.turn // turns_per_step
            if step == steps:
                break
            out[step] += _rows(batch)
        return [sorted(rows) for rows in out]

    reference = global_steps(STEP_ROWS)
    assert all(len(rows) == LANES * STEP_ROWS for rows in reference)
    assert len({json.dumps([r[1] for r in rows]) for rows in reference}) == steps  # not alike
    for size in (1, 2, 4):
        assert global_steps(size) == reference, f"micro-batches of {size}"


def test_a_state_resumes_with_another_microbatch_size_after_every_turn(tokenizer: Any) -> None:
    """Saved with micro-batches of 4 after each of the first 6 turns, loaded with 2 (and, at
    even turns, 8), the lanes go on with exactly the rows of the uninterrupted run."""
    total = 40
    reference = _lane_rows(_pipeline(tokenizer, 4), total)
    for turns in range(7):
        saved = _pipeline(tokenizer, 4)
        iterator = iter(saved)
        for _ in range(turns * LANES):
            next(iterator)
        state = json.loads(json.dumps(saved.state_dict()))
        assert state["microbatch_size"] == 4
        for size in (2, 8) if turns % 2 == 0 else (2,):
            resumed = _pipeline(tokenizer, size)
            resumed.load_state_dict(copy.deepcopy(state))
            assert resumed.state_dict()["step"] == turns * 4 // size
            done = turns * 4
            got = _lane_rows(resumed, total - done)
            for lane in range(LANES):
                assert got[lane] == reference[lane][done:], f"turn {turns}, size {size}"


def test_a_state_whose_rows_are_no_whole_number_of_new_micro_batches_is_refused(
    tokenizer: Any,
) -> None:
    saved = _pipeline(tokenizer, 2)
    iterator = iter(saved)
    for _ in range(3 * LANES):  # 6 rows a lane
        next(iterator)
    state = saved.state_dict()
    with pytest.raises(StateMismatchError, match="microbatch_size") as info:
        _pipeline(tokenizer, 4).load_state_dict(state)
    message = str(info.value)
    assert "lane 0: 6" in message and "whole number of micro-batches of 4" in message
    assert "micro-batch sizes that divide them: [1, 2, 3, 6]" in message, message  # would load
    # the step's rows are told as such, not counted as one more lane (with 4 lanes shown:
    # "lane 3: 6 and 1 more", of a pipeline of 4 lanes)
    assert "more lanes" not in message and "; the step's 6" in message, message
    _pipeline(tokenizer, 3).load_state_dict(state)  # 6 rows: two micro-batches of 3


def test_a_state_saved_with_the_size_in_its_fingerprint_resumes_with_another(
    tokenizer: Any,
) -> None:
    """States saved before the size left the recipe hold it in their fingerprint."""
    reference = _lane_rows(_pipeline(tokenizer, 4), 16)
    saved = _pipeline(tokenizer, 4)
    iterator = iter(saved)
    for _ in range(2 * LANES):
        next(iterator)
    state = saved.state_dict()
    state["fingerprint"]["microbatch_size"] = state.pop("microbatch_size")
    resumed = _pipeline(tokenizer, 2)
    resumed.load_state_dict(state)
    got = _lane_rows(resumed, 8)
    assert all(got[lane] == reference[lane][8:] for lane in range(LANES))
    state["fingerprint"]["microbatch_size"] = "4"
    with pytest.raises(StateMismatchError, match="the micro-batch size saved"):
        _pipeline(tokenizer, 2).load_state_dict(state)


def test_a_torch_loader_with_workers_resumes_a_state_of_another_microbatch_size(
    tokenizer: Any,
) -> None:
    """Through ``zephon_torch.torch.DataLoader`` with two workers: saved with micro-batches
    of 4 after 3 global steps of 8 rows, resumed with 2; each later global step holds the
    same rows as the uninterrupted run's."""
    from zephon_torch.torch import DataLoader

    def steps_of(loader: DataLoader, count: int, per_step: int) -> list[list[bytes]]:
        out: list[list[bytes]] = []
        rows: list[bytes] = []
        for item in loader:
            rows += [row.numpy().tobytes() for row in item["input_ids"]]
            if len(rows) == per_step * LANES:
                out.append(sorted(rows))
                rows = []
                if len(out) == count:
                    break
        return out

    reference = steps_of(DataLoader(_pipeline(tokenizer, 4), num_workers=2), 6, 4)
    saved = DataLoader(_pipeline(tokenizer, 4), num_workers=2)
    assert steps_of(saved, 3, 4) == reference[:3]
    state = saved.state_dict()
    resumed = DataLoader(_pipeline(tokenizer, 2), num_workers=2)
    resumed.load_state_dict(state)
    assert steps_of(resumed, 3, 4) == reference[3:]


def test_a_state_saved_mid_step_is_refused_with_a_smaller_size_naming_why(
    tokenizer: Any,
) -> None:
    """Saved with micro-batches of 4 after lane 0's batch of turn 3 (lanes at turns 3 and 2),
    every lane's rows (12, 8) are whole micro-batches of 2, but in them the lanes would stand
    two turns apart (6 and 4), which no run of micro-batches of 2 gives: refused as a matter of
    the size, saying the state was saved mid-step (not as turns edited or merged by hand)."""
    saved = _pipeline(tokenizer, 4)
    iterator = iter(saved)
    for _ in range(2 * LANES + 1):
        next(iterator)
    state = json.loads(json.dumps(saved.state_dict()))
    with pytest.raises(StateMismatchError) as info:
        _pipeline(tokenizer, 2).load_state_dict(copy.deepcopy(state))
    assert set(info.value.mismatches) == {"microbatch_size"}
    assert "mid-step" in str(info.value)
    with pytest.warns(UserWarning, match="mid-step"):  # its own size takes it
        _pipeline(tokenizer, 4).load_state_dict(state)


def test_a_state_refused_for_its_size_names_the_recipe_s_other_differences_too(
    tokenizer: Any,
) -> None:
    """One error lists every difference (docs/design.md, State shape): rows that are no whole
    micro-batches of the new size, and a changed packing beside them."""
    saved = _pipeline(tokenizer, 2)
    iterator = iter(saved)
    for _ in range(3 * LANES):  # 6 rows a lane: not whole micro-batches of 4
        next(iterator)
    state = saved.state_dict()
    changed = small_pipeline(
        tokenizer, lanes=LANES, microbatch_size=4, max_length=32, exhaustion="repeat"
    )
    with pytest.raises(StateMismatchError) as info:
        changed.load_state_dict(state)
    assert {"microbatch_size", "pack"} <= set(info.value.mismatches)
