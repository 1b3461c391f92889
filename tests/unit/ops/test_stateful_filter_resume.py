"""A stateful filter's state travels with its batches: exact resume while a producer thread runs
ahead, under a shuffle, and with a filter that keeps and updates the state it loads."""

from __future__ import annotations

import copy
import itertools
import json
import time
from typing import Any

from tests.helpers import KeepUnseen, assert_resumes_at_every_step


def _dedup_pipeline(*, prefetch: int, shuffle: int | None = None) -> Any:
    from zephon_torch import Pipeline
    from zephon_torch.io import Dataset
    from zephon_torch.work import StaticMixtureWorkSource

    dataset = Dataset.from_dict("d", {"ids": [[i + 1] * 3 for i in range(40)]})
    source = StaticMixtureWorkSource([dataset], shuffle=False)
    pipeline = (
        Pipeline(source)
        .options(prefetch=prefetch)
        .pretokenized("ids")
        .stateful_filter(lambda lane: KeepUnseen())  # its state_dict is its live list
        .pack_flat(3)
    )
    return (pipeline if shuffle is None else pipeline.shuffle(shuffle)).batch(1)


def test_a_batch_carries_the_filter_state_of_its_own_time_while_the_producer_runs_ahead() -> None:
    """With prefetch the lane is packed on a background thread, batches ahead of the consumer:
    the state delivered with a batch must not move on with the filter's live objects."""
    pipeline = _dedup_pipeline(prefetch=4)
    batches = iter(pipeline)
    delivered = [next(batches).input_ids[0].tolist() for _ in range(3)]
    assert delivered == [[1] * 3, [2] * 3, [3] * 3]
    deadline = time.monotonic() + 10
    while pipeline._live.queued() < 4 and time.monotonic() < deadline:  # the producer ran ahead
        time.sleep(0.01)
    state = pipeline.state_dict()
    assert state["lanes"]["0"]["pack"]["readers"][0]["filter"] == {"seen": delivered}
    resumed = _dedup_pipeline(prefetch=4)
    resumed.load_state_dict(state)
    assert next(iter(resumed)).input_ids[0].tolist() == [4] * 3


def test_a_filter_returning_its_live_state_resumes_exactly_under_a_shuffle() -> None:
    """A shuffle keeps the source state from before it packed its block: the filter's state
    there must not be the one it reached packing the block."""
    assert assert_resumes_at_every_step(lambda: _dedup_pipeline(prefetch=0, shuffle=5)) == 40


class KeepUnseenKeeping(KeepUnseen):
    """``KeepUnseen`` whose ``load_state_dict`` keeps the list it is given and goes on
    appending to it."""

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.seen = state["seen"]


def _keeping_pipeline(*, prefetch: int, shuffle: int | None = None, lanes: int = 1) -> Any:
    from zephon_torch import Pipeline
    from zephon_torch.io import Dataset
    from zephon_torch.work import StaticMixtureWorkSource

    dataset = Dataset.from_dict("d", {"ids": [[i + 1] * 3 for i in range(40)]})
    source = StaticMixtureWorkSource([dataset], shuffle=False)
    pipeline = (
        Pipeline(source)
        .options(prefetch=prefetch, canonical_replicas=lanes)
        .pretokenized("ids")
        .stateful_filter(lambda lane: KeepUnseenKeeping())
        .pack_flat(3)
    )
    return (pipeline if shuffle is None else pipeline.shuffle(shuffle)).batch(1)


def _first_ids(batches: Any) -> list[int]:
    return [int(b.input_ids[0, 0]) for b in batches]


def test_a_filter_keeping_the_state_it_loads_resumes_twice_exactly_under_a_shuffle() -> None:
    """Resumed mid-block, the shuffle keeps the loaded block-start state for the block's later
    batches, and re-packing the block runs the filter: the filter must get a copy."""
    reference = _first_ids(_keeping_pipeline(prefetch=0, shuffle=5))
    assert len(reference) == 40
    for step in range(len(reference) - 1):
        first = _keeping_pipeline(prefetch=0, shuffle=5)
        got = _first_ids(itertools.islice(first, step))
        second = _keeping_pipeline(prefetch=0, shuffle=5)
        second.load_state_dict(json.loads(json.dumps(first.state_dict())))
        got += _first_ids(itertools.islice(second, 1))
        third = _keeping_pipeline(prefetch=0, shuffle=5)
        third.load_state_dict(json.loads(json.dumps(second.state_dict())))
        assert got + _first_ids(third) == reference, f"resumed at {step} and {step + 1}"


def test_a_filter_keeping_the_state_it_loads_leaves_an_undelivered_lane_state_alone() -> None:
    """After a resume, a lane not yet delivered again is saved as loaded, while the producer
    thread runs its filter ahead: the state it loaded must not be the one saved."""
    pipeline = _keeping_pipeline(prefetch=4, lanes=2)
    batches = iter(pipeline)
    for _ in range(2):
        next(batches)
    saved = json.loads(json.dumps(pipeline.state_dict()))
    pipeline._end_live()
    resumed = _keeping_pipeline(prefetch=4, lanes=2)
    resumed.load_state_dict(saved)
    batches = iter(resumed)
    assert next(batches).lane == 0
    deadline = time.monotonic() + 10
    while resumed._live.queued() < 4 and time.monotonic() < deadline:  # lane 1 ran ahead
        time.sleep(0.01)
    lane = resumed.state_dict()["lanes"]["1"]
    assert lane == saved["lanes"]["1"]
    resumed._end_live()


def test_iterating_again_leaves_the_delivered_batch_states_alone() -> None:
    """A new iteration restarts from the last delivered batches' states: a filter loading and
    then updating them must not change the states those batches carry."""
    pipeline = _keeping_pipeline(prefetch=0)
    last = list(itertools.islice(pipeline, 3))[-1]
    before = copy.deepcopy(last.state)
    list(itertools.islice(pipeline, 3))
    assert last.state == before
