"""Resume across ranks: a state saved mid-step loads only on the world sizes it is in step on,
ranks a turn apart are refused, and the final states of per-rank pipelines merge and load."""

from __future__ import annotations

import copy
import itertools
import json
import warnings
from typing import Any

import pytest

from tests.helpers import key, next_batches, on_measured_text, small_pipeline, two_sources
from zephon_torch import Pipeline


def test_a_state_saved_mid_step_resumes_on_the_world_size_it_was_saved_on(tokenizer: Any) -> None:
    """Ranks in step that stop mid-step leave each rank's lanes at the same turns, offset by
    offset: such a state was refused on every world size above one, though it continues
    exactly on its own (and is still refused where the ranks would run turns apart)."""
    from zephon_torch import merge_states
    from zephon_torch.errors import StateMismatchError

    def ranked(rank: int, world_size: int = 2) -> Pipeline:
        return small_pipeline(tokenizer, lanes=4, world_size=world_size, rank=rank)

    straight = [[key(b) for b in next_batches(ranked(rank), 6)] for rank in (0, 1)]
    states = []
    for rank in (0, 1):
        pipeline = ranked(rank)
        assert [key(b) for b in next_batches(pipeline, 3)] == straight[rank][
            :3
        ]  # a step and a half
        states.append(pipeline.state_dict())
    state = json.loads(json.dumps(merge_states(states)))
    # each rank's state twice, as its tensor-parallel peers hold it: counted as four ranks,
    # whose lanes' turns differ mid-step, they were refused
    assert json.loads(json.dumps(merge_states(states + states))) == state
    for rank in (0, 1):
        resumed = ranked(rank)
        resumed.load_state_dict(state)
        assert [key(b) for b in next_batches(resumed, 3)] == straight[rank][3:]
    # the error names the world sizes that do continue it (a fresh-user trial)
    on = r"saved mid-step: lanes at turns \[1, 2\].*the world sizes it is in step on: \[1, 2\]"
    with pytest.raises(StateMismatchError, match=on):
        ranked(0, world_size=4).load_state_dict(state)


def test_a_state_saved_mid_step_is_refused_by_the_torch_loaders_of_several_ranks(
    tokenizer: Any,
) -> None:
    """Without a process group (W from the options or the environment), the loader and the
    dataset took it, as the pipeline once did, and the ranks ran turns apart."""
    from zephon_torch.errors import StateMismatchError
    from zephon_torch.torch import DataLoader

    one = small_pipeline(tokenizer, lanes=4)
    next(iter(one))  # lane 0 of turn 0: mid-step
    state = json.loads(json.dumps(one.state_dict()))
    for rank in (0, 1):
        ranked = small_pipeline(tokenizer, lanes=4, world_size=2, rank=rank)
        for target in (DataLoader(ranked), ranked.to_torch()):
            with pytest.raises(StateMismatchError, match=r"mid-step: lanes at turns \[0, 1\]"):
                target.load_state_dict(state)
    for _ in range(3):  # the rest of the step: loads on both ranks
        next(iter(one))
    state = one.state_dict()
    following = list(itertools.islice(iter(one), 4))  # turn 1, lanes 0 to 3
    for rank in (0, 1):
        loader = DataLoader(small_pipeline(tokenizer, lanes=4, world_size=2, rank=rank))
        loader.load_state_dict(state)
        first = next(iter(loader))["input_ids"].numpy()
        assert (first == following[2 * rank].input_ids).all()


def test_a_state_saved_mid_step_is_refused_by_a_pipeline_of_several_ranks(tokenizer: Any) -> None:
    """Only the torch loader under torch.distributed checked it: pipelines on ranks (or with W
    from the options or the environment) took it and ran turns apart."""
    from zephon_torch.errors import StateMismatchError

    one = small_pipeline(tokenizer, lanes=4)
    next(iter(one))  # lane 0 of turn 0: mid-step
    state = json.loads(json.dumps(one.state_dict()))
    for rank in (0, 1):
        ranked = small_pipeline(tokenizer, lanes=4, world_size=2, rank=rank)
        with pytest.raises(StateMismatchError, match=r"saved mid-step: lanes at turns \[0, 1\]"):
            ranked.load_state_dict(state)
    for _ in range(3):  # the rest of the step: loads on both ranks
        next(iter(one))
    for rank in (0, 1):
        small_pipeline(tokenizer, lanes=4, world_size=2, rank=rank).load_state_dict(
            one.state_dict()
        )
    # per-rank pipelines under "stop" end turns apart: their merged final state is no
    # mid-step state (its lanes are spent) and loads, giving nothing more
    from zephon_torch import merge_states

    def ranked(rank: int) -> Any:
        data = two_sources(31, 17)
        return small_pipeline(tokenizer, lanes=2, world_size=2, rank=rank, datasets=data)

    ends = []
    for rank in (0, 1):
        pipeline = ranked(rank)
        assert sum(1 for _ in pipeline)
        ends.append(pipeline.state_dict())
    assert ends[0]["step"] != ends[1]["step"]
    for rank in (0, 1):
        pipeline = ranked(rank)
        pipeline.load_state_dict(merge_states(ends))
        with pytest.warns(UserWarning, match="spent"):
            assert list(pipeline) == []


def _tail(tokenizer: Any, world_size: int | None = None, rank: int | None = None) -> Pipeline:
    """Four lanes of a finite stream whose lanes run out at different turns."""
    data = two_sources(12, 9, shard_size=8)
    return small_pipeline(tokenizer, lanes=4, world_size=world_size, rank=rank, datasets=data)


def _turns(state: dict[str, Any]) -> dict[str, tuple[int, bool]]:
    return {lane: (s["turn"], s["done"]) for lane, s in state["lanes"].items()}


def test_a_spent_lane_pads_in_step_while_a_lane_of_its_rank_has_data(tokenizer: Any) -> None:
    """What the in-step checks rely on to compare a spent lane's turn."""
    batches = list(_tail(tokenizer))
    assert [(b.lane, b.turn) for b in batches] == [(i % 4, i // 4) for i in range(len(batches))]
    spent_then_padding = [
        b for b in batches if b.num_tokens == 0 and any(
            later.num_tokens for later in batches if later.turn >= b.turn
        )
    ]  # fmt: skip
    assert spent_then_padding and all(b.state["done"] for b in spent_then_padding)


@on_measured_text
def test_ranks_a_turn_apart_are_refused_where_spent_lanes_would_hide_it(tokenizer: Any) -> None:
    """Spent lanes were left out of the comparison: rank 0's states of step 8 and rank 1's of
    step 7 merged (lane 0 and lane 3, at the offsets that show it, spent), and a state saved
    mid-step there loaded on two ranks, which then paired lane 1 of step s + 1 with lane 2 of
    step s in every global batch."""
    from zephon_torch import merge_states
    from zephon_torch.errors import StateMismatchError

    def at_step(rank: int, steps: int) -> dict[str, Any]:
        pipeline = _tail(tokenizer, world_size=2, rank=rank)
        next_batches(pipeline, 2 * steps)
        return json.loads(json.dumps(pipeline.state_dict()))

    ahead, behind = at_step(0, 8), at_step(1, 7)
    assert _turns(ahead) == {"0": (8, True), "1": (8, False)}
    assert _turns(behind) == {"2": (7, False), "3": (7, True)}
    with pytest.raises(StateMismatchError, match=r"rank 0: \[8, 8\]; rank 1: \[7, 7\]"):
        merge_states([ahead, behind])
    one = _tail(tokenizer)
    next_batches(one, 4 * 7 + 2)  # seven steps and half of the eighth
    state = json.loads(json.dumps(one.state_dict()))
    assert _turns(state) == {"0": (8, True), "1": (8, False), "2": (7, False), "3": (7, True)}
    for rank in (0, 1):
        with pytest.raises(StateMismatchError, match=r"saved mid-step: lanes at turns \[7, 8\]"):
            _tail(tokenizer, world_size=2, rank=rank).load_state_dict(copy.deepcopy(state))


@on_measured_text
def test_a_rank_whose_lanes_are_all_spent_may_end_turns_before_the_others(tokenizer: Any) -> None:
    """Its stream ended where it had no more data: per-rank pipelines' final states merge and
    load, giving no more data, but the padding that completes the turn in progress."""
    from zephon_torch import merge_states

    def ended(rank: int) -> dict[str, Any]:
        data = two_sources(31, 17, shard_size=8)
        pipeline = small_pipeline(tokenizer, lanes=4, world_size=2, rank=rank, datasets=data)
        assert sum(1 for _ in pipeline)
        return pipeline.state_dict()

    ends = [ended(0), ended(1)]
    lanes = _turns(ends[0]) | _turns(ends[1])
    # each lane spent, at the turn its rank's stream ended (its step: the turns it ran)
    assert lanes == {"0": (27, True), "1": (27, True), "2": (26, True), "3": (26, True)}
    assert [end["step"] for end in ends] == [27, 26]
    merged = merge_states(ends)
    again = small_pipeline(tokenizer, lanes=4, datasets=two_sources(31, 17, shard_size=8))
    again.load_state_dict(merged)
    # one process would have padded lanes 2 and 3 in turn 26, where lanes 0 and 1 had data
    assert [(b.lane, b.turn, b.num_tokens) for b in again] == [(2, 26, 0), (3, 26, 0)]


@on_measured_text
def test_a_rank_that_ended_merges_with_a_rank_going_on_at_its_step(tokenizer: Any) -> None:
    """Per-rank pipelines under "stop": rank 1's stream ended at step 16, rank 0 saved at step
    18 with data to come. Merged, the ended rank's spent lanes stayed at turn 16, and loaded on
    one process they padded turns 16 and 17 first: four all-padding micro-batches ahead of the
    data, every global step after them shifted. They now stand at the step of the rank going
    on, so one process continues the one-process run from step 18."""
    from zephon_torch import merge_states

    def ranked(rank: int | None = None) -> Pipeline:
        data = two_sources(20, 29, shard_size=8)
        world_size = None if rank is None else 2
        return small_pipeline(tokenizer, lanes=4, world_size=world_size, rank=rank, datasets=data)

    ended = ranked(1)
    assert sum(1 for _ in ended) == 2 * 16
    going_on = ranked(0)
    next_batches(going_on, 2 * 18)
    merged = json.loads(json.dumps(merge_states([going_on.state_dict(), ended.state_dict()])))
    whole = [key(b) for b in ranked()]
    assert len(whole) == 4 * 21  # rank 0's lanes have data up to step 20
    again = ranked()
    again.load_state_dict(merged)
    assert [key(b) for b in again] == whole[4 * 18 :]


@pytest.mark.parametrize("lanes", [2, 4])
@pytest.mark.parametrize("rows", [(29, 11), (38, 11), (20, 29)])
def test_the_final_states_of_per_rank_pipelines_always_merge(
    tokenizer: Any, lanes: int, rows: tuple[int, int]
) -> None:
    """A lane whose last micro-batch was full did not know it was spent: its final state read
    not done, its rank was compared, and the ranks' final states (turns apart) were refused by
    `merge_states` in about one run in three. The state after the empty turn that ended each
    rank's stream is now the lane's final one."""
    from zephon_torch import merge_states

    ends = []
    for rank in (0, 1):
        data = two_sources(*rows, shard_size=8)
        pipeline = small_pipeline(tokenizer, lanes=lanes, world_size=2, rank=rank, datasets=data)
        assert sum(1 for _ in pipeline)
        ends.append(pipeline.state_dict())
        assert all(lane["done"] for lane in ends[-1]["lanes"].values())
    merged = merge_states(ends)
    again = small_pipeline(tokenizer, lanes=lanes, datasets=two_sources(*rows, shard_size=8))
    again.load_state_dict(merged)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # a spent state, where no turn is left to complete
        rest = list(again)
    # at most the padding that completes the turn in progress
    assert len(rest) < lanes and all(b.num_tokens == 0 for b in rest)
