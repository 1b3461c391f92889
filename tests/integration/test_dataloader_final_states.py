"""Per-rank DataLoader states: the ranks' states, resumed or final, merge into the global one, a
state without this rank's lanes is refused, and a state saved in the stream's last turn resumes
exactly to its end (a loop holding batches ahead, or leaving one unmarked, too)."""

from __future__ import annotations

import itertools
import json
import warnings
from typing import Any

import pytest
import torch

from tests.helpers import loader_pipeline, on_measured_text, take, two_sources, uneven_lanes
from zephon_torch import Pipeline, StateMismatchError, merge_states
from zephon_torch.io import Dataset
from zephon_torch.torch import DataLoader
from zephon_torch.work import StaticMixtureWorkSource


def test_lanes_several_turns_apart_resume_alike_in_one_process_and_with_workers() -> None:
    """Such states come from ranks that ended at different turns (rank 1's stream ends after
    one turn: its final state, every lane spent, merges with rank 0's of turn 6); every lane
    below the furthest one's turn is completed, whether one process or the loader cuts the
    stream. (Per-rank loaders' final states were refused while the last turn's states read
    "not done".)"""
    ranks = []
    for rank, count in ((0, 12), (1, 4)):  # lanes 0, 1 at turn 6; lanes 2, 3 spent at turn 1
        loader = DataLoader(uneven_lanes(world_size=2, rank=rank))
        take(loader, count)
        ranks.append(loader.state_dict())
    lanes = {lane: (s["turn"], s["done"]) for r in ranks for lane, s in r["lanes"].items()}
    assert lanes == {"0": (6, False), "1": (6, True), "2": (1, True), "3": (1, True)}
    state = json.loads(json.dumps(merge_states(ranks)))
    streams = []
    for workers in (0, 2, 4):
        context = "fork" if workers else None
        loader = DataLoader(uneven_lanes(), num_workers=workers, multiprocessing_context=context)
        loader.load_state_dict(state)
        streams.append(take(loader))
    assert len(streams[0]) > 0 and streams[1] == streams[0] and streams[2] == streams[0]


def test_states_of_ranks_resumed_from_a_state_merge_into_the_global_one(tokenizer: Any) -> None:
    """Each rank's loader state held, beside its own lanes, the other ranks' lanes as loaded;
    merged (or gathered), those stale copies overwrote the lanes that had moved on."""

    def on(world: int | None = None, rank: int | None = None) -> Any:
        return DataLoader(
            loader_pipeline(tokenizer, exhaustion="repeat", world_size=world, rank=rank)
        )

    reference = take(on(), 4 * 8)  # global step s: items 4s .. 4s + 3
    first = on()
    taken = iter(first)
    for _ in range(4 * 3):
        next(taken)
    at_three = json.loads(json.dumps(first.state_dict()))
    states = []
    for rank in range(2):  # resumed on two ranks, two more steps each
        loader = on(2, rank)
        loader.load_state_dict(at_three)
        got = take(loader, 2 * 2)
        assert got == [reference[4 * s + 2 * rank + j] for s in (3, 4) for j in range(2)]
        states.append(json.loads(json.dumps(loader.state_dict())))
    assert [sorted(s["lanes"]) for s in states] == [["0", "1"], ["2", "3"]]
    merged = merge_states(states)
    assert merged["step"] == 5
    resumed = on()
    resumed.load_state_dict(merged)
    assert take(resumed, 4 * 3) == reference[4 * 5 : 4 * 8]
    with pytest.raises(StateMismatchError, match="lane 0"):  # two states for one lane
        merge_states([states[0], at_three])
    behind = on(2, 1)  # rank 1 a step behind rank 0: merged, a state no run makes
    behind.load_state_dict(at_three)
    take(behind, 2)
    with pytest.raises(StateMismatchError, match=r"rank 0: \[5, 5\]; rank 1: \[4, 4\]"):
        merge_states([states[0], behind.state_dict()])


def test_a_state_without_this_rank_s_lanes_is_refused_by_the_loader(tokenizer: Any) -> None:
    """Pipeline.load_state_dict refused it; the loader took it, and those lanes restarted."""
    rank_zero = loader_pipeline(tokenizer, exhaustion="repeat", world_size=2, rank=0)
    batches = iter(rank_zero)
    for _ in range(4):
        next(batches)
    own_lanes_only = rank_zero.state_dict()  # not merged with rank 1's
    loader = DataLoader(loader_pipeline(tokenizer, exhaustion="repeat", world_size=2, rank=1))
    with pytest.raises(
        StateMismatchError,
        match=r"lanes: saved \[0, 1\], live .needs \[2, 3\]: the state holds the lanes of some "
        r"ranks only \(a Pipeline's state_dict\(\) holds its own rank's\); merge every rank's "
        r"state with merge_states, or save zephon_torch.torch.DataLoader's state_dict\(\)",
    ):
        loader.load_state_dict(own_lanes_only)


@on_measured_text
@pytest.mark.parametrize("num_workers", [0, 1, 2])
def test_the_final_states_of_per_rank_loaders_merge(tokenizer: Any, num_workers: int) -> None:
    """A lane whose last micro-batch was full read "not done" in the loader's final state, so
    the ranks' final states (turns apart) were refused by `merge_states`. The loader cuts the
    stream itself with any worker count and keeps the empty turn's states."""
    ends = []
    for rank in (0, 1):
        data = two_sources(20, 11, shard_size=8)
        pipeline = loader_pipeline(tokenizer, world_size=2, rank=rank, datasets=data)
        loader = DataLoader(pipeline, num_workers=num_workers)
        assert take(loader)
        ends.append(loader.state_dict())
        assert all(lane["done"] for lane in ends[-1]["lanes"].values())
    again = DataLoader(loader_pipeline(tokenizer, datasets=two_sources(20, 11, shard_size=8)))
    again.load_state_dict(merge_states(ends))
    with pytest.warns(UserWarning, match="spent"):
        assert take(again) == []  # no lane padded up to the furthest one's turn


@pytest.mark.parametrize("num_workers", [0, 2])
def test_a_loop_holding_batches_ahead_resumes_exactly_from_its_last_checkpoints(
    num_workers: int,
) -> None:
    """With deliver_on_use, the states of the empty turn that ends the stream were recorded as
    soon as the loader read past the end, while the loop still held its last batches unused:
    a checkpoint before the last step read "spent" and its resume lost the last batch."""
    reference = take(DataLoader(uneven_lanes()))
    loader = DataLoader(uneven_lanes(), num_workers=num_workers, deliver_on_use=True)
    items = iter(loader)
    ahead = [next(items), next(items)]  # a device prefetcher's two batches in flight
    checkpoints = []
    while ahead:
        batch = ahead.pop(0)
        ahead.extend(itertools.islice(items, 1))  # fetched while this step runs
        loader.mark_delivered(batch)
        checkpoints.append(loader.state_dict())
    assert len(checkpoints) == len(reference)
    for used in (len(reference) - 3, len(reference) - 2, len(reference) - 1):
        resumed = DataLoader(uneven_lanes())
        resumed.load_state_dict(checkpoints[used - 1])
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # the last: a spent state
            assert take(resumed) == reference[used:]


def test_a_state_saved_inside_the_last_turn_resumes_to_the_end_of_that_turn() -> None:
    """Every lane reads spent after the last micro-batch with data, but the turn's padding of
    the lanes after it belongs to the stream (a loop stepping every L/W micro-batches completes
    its last step with it); a shortcut for spent states dropped it."""
    reference = list(uneven_lanes())
    tail = [(b.lane, b.turn) for b in reference[-4:]]
    for saved in range(len(reference) - 4, len(reference) + 1):
        pipeline = uneven_lanes()
        list(itertools.islice(pipeline, saved))
        state = pipeline.state_dict()
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # the last: a spent state
            again = uneven_lanes()
            again.load_state_dict(state)
            assert [(b.lane, b.turn) for b in again] == tail[saved - len(reference) + 4 :]
            loader = DataLoader(uneven_lanes())
            loader.load_state_dict(state)
            assert len(take(loader)) == len(reference) - saved
    # and a finished run's step counts the turns it ran, as under torch.distributed
    assert state["step"] == reference[-1].turn + 1


def test_the_final_states_of_per_rank_torch_datasets_merge(tokenizer: Any) -> None:
    """`to_torch()` under torch's own DataLoader (or iterated directly) recorded only the
    batches it yielded, so its last lanes read "not done" and ranks' final states were refused
    as Pipeline's and zephon_torch's loader's were."""
    ends = []
    for rank in (0, 1):
        data = two_sources(20, 11, shard_size=8)
        dataset = loader_pipeline(tokenizer, world_size=2, rank=rank, datasets=data).to_torch()
        assert sum(1 for _ in torch.utils.data.DataLoader(dataset, batch_size=None))
        ends.append(dataset.state_dict())
        assert all(lane["done"] for lane in ends[-1]["lanes"].values())
    merge_states(ends)


def test_a_batch_never_marked_does_not_keep_the_final_states_back() -> None:
    """With deliver_on_use, the empty turn's final states waited for every batch handed out
    to be marked: one never marked (a step skipped for a bad loss), though later batches of
    its lane were, kept them back for ever; a lane whose last batch was full then read not
    spent, and the ranks' final states did not merge."""
    lengths = [40, 3, 36, 3]  # lanes 0 and 2 end on full batches
    rows = [{"input_ids": [i + 1] * lengths[i % 4]} for i in range(32)]
    source = StaticMixtureWorkSource([Dataset.from_dict("d", rows)], seed=1, shuffle=False)
    ends = []
    for rank in (0, 1):
        recipe = Pipeline(source).options(canonical_replicas=4, world_size=2, rank=rank)
        loader = DataLoader(recipe.pretokenized("input_ids").pack_flat(16, "best_fit").batch(2),
                            deliver_on_use=True)  # fmt: skip
        for number, item in enumerate(loader):
            if number:  # the first batch is never used
                loader.mark_delivered(item)
        ends.append(loader.state_dict())
        assert all(lane["done"] for lane in ends[-1]["lanes"].values())
    merge_states(ends)
