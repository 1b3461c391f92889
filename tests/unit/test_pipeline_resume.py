"""Exact resume: a state taken after any batch, loaded into a fresh pipeline, continues exactly."""

from __future__ import annotations

import copy
import itertools
import json
import sys
import threading
import time
import warnings
from typing import Any

import pytest

from tests.helpers import (
    as_lists,
    assert_resumes_at_every_step,
    key,
    on_measured_text,
    small_pipeline,
    two_sources,
)
from zephon_torch import DataError, Pipeline
from zephon_torch._packed_rows import unpack_rows
from zephon_torch.io import Dataset
from zephon_torch.work import StaticMixtureWorkSource


@pytest.mark.parametrize("algorithm", ["wrap", "best_fit", "first_fit", "best_fit_wrap"])
@pytest.mark.parametrize("lanes", [1, 3])
def test_resume_after_every_batch_continues_the_uninterrupted_stream(
    tokenizer: Any, algorithm: str, lanes: int
) -> None:
    datasets = two_sources(24, 20, shard_size=7)
    n = assert_resumes_at_every_step(
        lambda: small_pipeline(
            tokenizer, algorithm=algorithm, lanes=lanes, datasets=datasets, max_length=48
        )
    )
    assert n > 10


def test_resume_in_repeat_mode_across_a_pass_boundary(tokenizer: Any) -> None:
    datasets = two_sources(8, 6, shard_size=3)
    n = assert_resumes_at_every_step(
        lambda: small_pipeline(tokenizer, exhaustion="repeat", datasets=datasets, max_length=48),
        max_steps=40,
    )
    assert n == 40


def test_state_is_json_and_its_size_does_not_grow_with_steps(tokenizer: Any) -> None:
    pipeline = small_pipeline(tokenizer, exhaustion="repeat", lanes=4, algorithm="best_fit")
    sizes = []
    for step, _ in enumerate(pipeline):
        state = pipeline.state_dict()
        assert json.loads(json.dumps(state)) == state
        sizes.append(len(json.dumps(state)))
        if step == 400:
            break
    # counters gain digits, bins vary by a few pointers; nothing grows with the step count
    assert max(sizes[200:]) <= max(sizes[:200]) + 200
    assert max(sizes) < 16 * 1024


def test_a_state_saved_mid_turn_resumes_with_the_next_lane(tokenizer: Any) -> None:
    def build() -> Any:
        return small_pipeline(tokenizer, lanes=4)

    reference = [key(b) for b in build()]
    pipeline = build()
    stream = iter(pipeline)
    for _ in range(6):  # one full turn of 4 lanes, then lanes 0 and 1 of the next
        next(stream)
    state = pipeline.state_dict()
    assert [state["lanes"][str(lane)]["turn"] for lane in range(4)] == [2, 2, 1, 1]
    resumed = build()
    with pytest.warns(UserWarning, match="mid-step: the first 2 of this rank's micro-batches"):
        resumed.load_state_dict(state)
    assert [key(b) for b in resumed] == reference[6:]


def test_a_state_loaded_mid_step_is_warned_of_once_and_one_at_a_step_end_is_not(
    tokenizer: Any,
) -> None:
    """A loop that counts whole steps from a loaded state is off by the part of a step the
    state was saved in; on one process such a state loads without a word."""
    from zephon_torch.torch import DataLoader

    pipeline = small_pipeline(tokenizer, lanes=4)
    mid = json.loads(json.dumps(pipeline.state_dict()))  # at the start: no warning below
    stream = iter(pipeline)
    states = []
    for _ in range(8):
        next(stream)
        states.append(json.loads(json.dumps(pipeline.state_dict())))
    for count, state in enumerate(states, start=1):
        left = (4 - count % 4) % 4
        for load in (
            lambda s: small_pipeline(tokenizer, lanes=4).load_state_dict(s),
            lambda s: small_pipeline(tokenizer, lanes=4).to_torch().load_state_dict(s),
        ):
            with warnings.catch_warnings(record=True) as heard:
                warnings.simplefilter("always")
                load(state)
            said = [str(w.message) for w in heard if "mid-step" in str(w.message)]
            assert len(said) == (1 if left else 0), (count, said)
            if left:
                assert f"the first {left} of this rank's micro-batches" in said[0]
    small_pipeline(tokenizer, lanes=4).load_state_dict(mid)
    # the loader warns at its load, not again in its workers, whose lanes load apart
    loader = DataLoader(small_pipeline(tokenizer, lanes=4), num_workers=2)
    with warnings.catch_warnings(record=True) as heard:
        warnings.simplefilter("always")
        loader.load_state_dict(states[4])  # turns [2, 1, 1, 1]
        items = iter(loader)
        next(items)
        del items
    said = [str(w.message) for w in heard if "mid-step" in str(w.message)]
    assert len(said) == 1 and "the first 3 of" in said[0], said


def test_iterating_again_continues_where_the_last_iteration_stopped(tokenizer: Any) -> None:
    reference = [key(b) for b in small_pipeline(tokenizer)]
    pipeline = small_pipeline(tokenizer)
    first = []
    for b in pipeline:
        first.append(key(b))
        if len(first) == 5:
            break
    assert first + [key(b) for b in pipeline] == reference


@pytest.mark.parametrize("prefetch", [0, 4])
def test_an_iterator_made_before_a_load_raises_instead_of_recording_over_it(
    tokenizer: Any, prefetch: int
) -> None:
    reference = [key(b) for b in small_pipeline(tokenizer)]
    pipeline = small_pipeline(tokenizer, prefetch=prefetch)
    stale = iter(pipeline)
    for _ in range(3):
        next(stale)
    saved = pipeline.state_dict()
    next(stale)
    pipeline.load_state_dict(saved)
    # with prefetch it handed out what its stopped thread had queued, then waited forever;
    # without, it went on and its states replaced the loaded one
    with pytest.raises(RuntimeError, match="iterator of the pipeline is stale"):
        next(stale)
    assert pipeline.state_dict() == saved
    assert [key(b) for b in pipeline] == reference[3:]


@pytest.mark.parametrize("prefetch", [0, 4])
def test_only_the_newest_iterator_of_a_pipeline_runs(tokenizer: Any, prefetch: int) -> None:
    reference = [key(b) for b in small_pipeline(tokenizer)]
    pipeline = small_pipeline(tokenizer, prefetch=prefetch)
    first = iter(pipeline)
    taken = [key(next(first)) for _ in range(2)]
    second = iter(pipeline)
    never_started = iter(pipeline)
    latest = iter(pipeline)
    for stale in (first, second, never_started):
        with pytest.raises(RuntimeError, match="stale"):
            next(stale)
    assert taken + [key(b) for b in latest] == reference


class _HoldOnce:
    """A map that, once armed, holds its next call until released, saying when it began."""

    def __init__(self) -> None:
        self.armed = False
        self.entered = threading.Event()
        self.release = threading.Event()

    def __call__(self, row: dict[str, Any]) -> dict[str, Any]:
        if self.armed:
            self.armed = False
            self.entered.set()
            self.release.wait(60)
        return row


def _wait_until_blocked_in(thread: threading.Thread, function: str) -> None:
    """Return once ``thread`` waits (on a lock or an event) somewhere under ``function``."""
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        frame = sys._current_frames().get(thread.ident or 0)
        names = []
        while frame is not None:
            names.append(frame.f_code.co_name)
            frame = frame.f_back
        if names and names[0] == "wait" and function in names:
            return
        time.sleep(0.001)
    raise AssertionError(f"{thread.name} never waited in {function}")


@pytest.mark.parametrize("runner", ["inline", "threads"])
@pytest.mark.parametrize("action", ["load_state_dict", "iter"])
def test_a_next_in_flight_when_another_thread_moves_the_pipeline_on_raises_stale(
    tokenizer: Any, action: str, runner: str
) -> None:
    """Without a prefetch thread the stream runs on the consumer's thread, and ending it from
    another thread emptied its readers mid-call: the call raised a bare IndexError from the
    reader (threads: waiting for a chunk), or delivered a batch whose state replaced the
    loaded one (inline: running the map)."""
    hold = _HoldOnce()

    def build() -> Pipeline:
        source = StaticMixtureWorkSource(
            two_sources(300, 200, shard_size=50), {"long": 0.6, "short": 0.4}, seed=7
        )
        return (
            Pipeline(source)
            .options(canonical_replicas=1, prefetch=0, read_ahead=1)
            .map(hold, name="hold")
            .tokenize(tokenizer=tokenizer, parallelism=1, runner=runner)  # type: ignore[arg-type]
            .pack_flat(64, "wrap")
            .batch(2)
        )

    reference = [key(b) for b in build()]
    pipeline = build()
    stream = iter(pipeline)
    taken = [key(next(stream))]
    saved = pipeline.state_dict()
    errors: list[Exception] = []

    def consume() -> None:
        try:
            while True:
                taken.append(key(next(stream)))
        except Exception as error:
            errors.append(error)

    hold.armed = True
    consumer = threading.Thread(target=consume, name="consumer")
    consumer.start()
    assert hold.entered.wait(60), "the map was never called again"
    _wait_until_blocked_in(consumer, "_next_chunk")
    before = len(taken)
    newer = iter(pipeline) if action == "iter" else None
    if newer is None:
        pipeline.load_state_dict(saved)
    hold.release.set()
    consumer.join(60)
    assert not consumer.is_alive()
    assert len(taken) == before, "the call in flight delivered a batch of the ended iteration"
    assert len(errors) == 1 and isinstance(errors[0], RuntimeError), errors
    assert "iterator of the pipeline is stale" in str(errors[0])
    if newer is None:
        assert pipeline.state_dict() == saved
        assert [key(b) for b in pipeline] == reference[1:]
    else:
        assert taken + [key(b) for b in newer] == reference


@pytest.mark.parametrize(("lanes", "rows"), [(2, (60, 40)), (4, (40, 30))])
def test_iterating_a_spent_pipeline_again_warns_that_it_gives_no_data(
    tokenizer: Any, lanes: int, rows: tuple[int, int]
) -> None:
    """(4 lanes, 40 and 30 rows): the last lane's last delivered state reads not done (its
    all-padding batch, which says so, is cut off), and the warning was not given."""
    pipeline = small_pipeline(tokenizer, lanes=lanes, datasets=two_sources(*rows))
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # a pass, and the rest of a cut one, do not warn
        warnings.filterwarnings("ignore", "dataset 'short' ran out")  # (of the mixture)
        next(iter(pipeline))
        assert list(pipeline)
    with pytest.warns(UserWarning, match="every lane of this pipeline is spent"):
        again = list(pipeline)
    assert sum(b.num_tokens for b in again) == 0


def test_a_state_saved_mid_step_resumes_on_the_world_size_it_was_saved_on(tokenizer: Any) -> None:
    """Ranks in step that stop mid-step leave each rank's lanes at the same turns, offset by
    offset: such a state was refused on every world size above one, though it continues
    exactly on its own (and is still refused where the ranks would run turns apart)."""
    from zephon_torch import merge_states
    from zephon_torch.errors import StateMismatchError

    def ranked(rank: int, world_size: int = 2) -> Pipeline:
        return small_pipeline(tokenizer, lanes=4, world_size=world_size, rank=rank)

    straight = [[key(b) for b in _take(ranked(rank), 6)] for rank in (0, 1)]
    states = []
    for rank in (0, 1):
        pipeline = ranked(rank)
        assert [key(b) for b in _take(pipeline, 3)] == straight[rank][:3]  # a step and a half
        states.append(pipeline.state_dict())
    state = json.loads(json.dumps(merge_states(states)))
    # each rank's state twice, as its tensor-parallel peers hold it: counted as four ranks,
    # whose lanes' turns differ mid-step, they were refused
    assert json.loads(json.dumps(merge_states(states + states))) == state
    for rank in (0, 1):
        resumed = ranked(rank)
        resumed.load_state_dict(state)
        assert [key(b) for b in _take(resumed, 3)] == straight[rank][3:]
    # the error names the world sizes that do continue it (a fresh-user trial)
    on = r"saved mid-step: lanes at turns \[1, 2\].*the world sizes it is in step on: \[1, 2\]"
    with pytest.raises(StateMismatchError, match=on):
        ranked(0, world_size=4).load_state_dict(state)


def _take(pipeline: Pipeline, count: int) -> list[Any]:
    batches = iter(pipeline)
    return [next(batches) for _ in range(count)]


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


def test_a_state_no_run_saves_is_refused_naming_what_is_wrong(tokenizer: Any) -> None:
    """Edited or hand-merged states loaded without a word: lanes with data turns apart (states
    of different steps, or an edited turn) skipped a lane's turns on one rank, and on two were
    refused as "saved mid-step"; a reader position past its rows or passes skipped documents
    or ended the lane; a lane number past L and a `step` of text were taken (fresh-user
    trial)."""
    from zephon_torch.errors import StateMismatchError

    def at_step(steps: int, world_size: int = 1, rank: int = 0) -> dict[str, Any]:
        pipeline = small_pipeline(tokenizer, lanes=4, world_size=world_size, rank=rank)
        _take(pipeline, steps * 4 // world_size)
        return json.loads(json.dumps(pipeline.state_dict()))

    state = at_step(2)
    edited = copy.deepcopy(state)
    edited["lanes"]["0"]["turn"] = 5
    by_hand = at_step(1, world_size=2, rank=0)  # rank 0 of step 1, rank 1 of step 3
    by_hand["lanes"].update(at_step(3, world_size=2, rank=1)["lanes"])
    turns_apart = r"lane turns: saved \{'0': (5|1), '1': (2|1), '2': (2|3), '3': (2|3)\}"
    for bad in (edited, by_hand):
        for world_size, rank in ((1, 0), (2, 0), (2, 1)):
            pipeline = small_pipeline(tokenizer, lanes=4, world_size=world_size, rank=rank)
            with pytest.raises(StateMismatchError, match=turns_apart):
                pipeline.load_state_dict(copy.deepcopy(bad))

    def refused(edit: Any, match: str) -> None:
        bad = as_lists(copy.deepcopy(state))
        edit(bad)
        pipeline = small_pipeline(tokenizer, lanes=4)
        with pytest.raises(StateMismatchError, match=match):
            pipeline.load_state_dict(bad)
            next(iter(pipeline))  # the readers check their positions as they start

    readers = lambda bad: bad["lanes"]["1"]["pack"]["readers"]  # noqa: E731
    where = r"lane 1 dataset 'long' position: saved \{'pass': %s, 'pos': %s\}"
    refused(lambda bad: readers(bad)[0].update({"pass": 1}), where % (1, 1))
    refused(lambda bad: readers(bad)[0].update(pos=16), where % (0, 16))
    # a carried piece's document past the stream: an IndexError, in a mismatch of "lane 1"
    carry = lambda bad: bad["lanes"]["1"]["pack"]["carry"][0][0]  # noqa: E731
    assert carry(as_lists(state))[:3] == [0, 0, 0]  # [source, pass, pos, start, end]
    piece = r"lane 1 dataset 'long' document: saved \{'pass': 0, 'pos': 15\}"
    refused(lambda bad: carry(bad).__setitem__(2, 15), piece)
    refused(lambda bad: bad["lanes"].update({"7": bad["lanes"]["0"]}), r"lane numbers: saved \[7\]")
    refused(lambda bad: bad.update({"step": "2"}), "step: saved '2'")
    # lanes set to null start again from the beginning (trial C): one, among lanes at turn 2,
    # is turns apart; all, under a step of 2, are a state of no lane at that step
    refused(lambda bad: bad["lanes"].update({"0": None}), r"lane turns: saved \{'0': 0, '1': 2")
    nulls = {str(lane): None for lane in range(4)}
    refused(lambda bad: bad["lanes"].update(nulls), r"step: saved 2, live 'a turn of its lanes")
    # each field's last valid value loads: the position at the end of this lane's pass
    last = as_lists(copy.deepcopy(state))
    readers(last)[0]["pos"] = 15
    pipeline = small_pipeline(tokenizer, lanes=4)
    pipeline.load_state_dict(last)
    assert next(iter(pipeline)).lane == 0


def test_a_document_changed_since_the_state_was_saved_is_a_data_error_naming_it(
    tmp_path: Any,
) -> None:
    """A JSONL file rewritten between save and resume (same rows, shorter documents): the
    saved carry ran past the document's end, a bare numpy ValueError at the batch."""
    shard = tmp_path / "a.jsonl"

    def write(length: int) -> None:
        shard.write_text("".join(json.dumps({"ids": [i] * length}) + "\n" for i in range(6)))

    def build() -> Pipeline:
        source = StaticMixtureWorkSource([Dataset.from_path("a", shard)], shuffle=False)
        return Pipeline(source).pretokenized("ids").pack_flat(8).batch(1)

    write(20)
    pipeline = build()
    next(iter(pipeline))  # row 0 cut at 8 tokens: its rest is the carry
    state = json.loads(json.dumps(pipeline.state_dict()))
    write(5)
    resumed = build()
    resumed.load_state_dict(state)
    with pytest.raises(
        DataError, match=r"row 0: cannot resume here: the state continues it"
    ) as caught:
        next(iter(resumed))
    assert (caught.value.dataset, caught.value.shard) == ("a", str(shard))


@pytest.mark.parametrize("length", [2, 4])
def test_a_document_of_an_open_row_changed_since_the_state_was_saved_is_a_data_error(
    tmp_path: Any, length: int
) -> None:
    """A bin packer writes a piece that runs to its document's end without the end (-1: read
    back from the document). Each row's token count, saved beside, tells a document re-read
    longer or shorter than when saved; longer went unsaid even when ends were written."""
    shard = tmp_path / "a.jsonl"

    def write(length: int) -> None:
        shard.write_text("".join(json.dumps({"ids": [i + 1] * length}) + "\n" for i in range(40)))

    def build() -> Pipeline:
        source = StaticMixtureWorkSource([Dataset.from_path("a", shard)], shuffle=False)
        return Pipeline(source).pretokenized("ids").pack_flat(16, "best_fit", num_bins=4).batch(1)

    write(3)
    pipeline = build()
    next(iter(pipeline))
    state = json.loads(json.dumps(pipeline.state_dict()))
    packer = as_lists(state)["lanes"]["0"]["pack"]["packer"]
    assert {piece[4] for row in packer["bins"] for piece in row} == {-1}  # whole documents
    assert packer["filled"] == [sum(3 for _ in row) for row in packer["bins"] + packer["ready"]]
    resumed = build()
    resumed.load_state_dict(copy.deepcopy(state))
    expected = [b.input_ids.tolist() for _, b in zip(range(3), resumed)]
    write(length)
    resumed = build()
    resumed.load_state_dict(state)
    with pytest.raises(DataError, match=r"cannot resume here: a row the state holds \(open") as e:
        next(iter(resumed))
    assert "or the state was edited" in str(e.value)  # a pointer edited by hand reads so too
    write(3)  # as saved again: resumes
    resumed = build()
    resumed.load_state_dict(state)
    assert [b.input_ids.tolist() for _, b in zip(range(3), resumed)] == expected


def test_a_held_document_a_filter_drops_on_resume_is_named_by_its_shard_path(
    tokenizer: Any,
) -> None:
    """The error named the shard by its number ("shard '2'"), not its path."""
    from tests.conftest import prose_documents

    dropped: set[int] = set()
    texts = prose_documents(30, seed=1, max_words=30)
    dataset = Dataset.from_dict("docs", {"text": texts, "n": list(range(30))}, shard_size=7)

    def build() -> Pipeline:
        return (
            Pipeline(StaticMixtureWorkSource([dataset], seed=3))
            .filter(lambda row: row["n"] not in dropped, name="keep")
            .tokenize(tokenizer=tokenizer)
            .pack_flat(64, "best_fit", num_bins=4)
            .batch(1)
        )

    pipeline = build()
    next(iter(pipeline))
    state = pipeline.state_dict()
    packer = unpack_rows(state["lanes"]["0"]["pack"]["packer"])
    _, pass_index, pos, _, _ = packer["bins"][0][0]
    span = pipeline._source.layouts[0].span(
        pass_index=pass_index, lane=0, num_lanes=1, start=pos, count=1
    )
    shard, row = int(span.shards[0]), int(span.rows[0])
    dropped.add(7 * shard + row)  # the filter changed: the held document goes
    resumed = build()
    resumed.load_state_dict(state)
    with pytest.raises(DataError, match="dropped by a filter on resume") as caught:
        next(iter(resumed))
    assert (caught.value.dataset, caught.value.shard, caught.value.row) == (
        "docs",
        dataset.shards[shard].path,
        row,
    )


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
        _take(pipeline, 2 * steps)
        return json.loads(json.dumps(pipeline.state_dict()))

    ahead, behind = at_step(0, 8), at_step(1, 7)
    assert _turns(ahead) == {"0": (8, True), "1": (8, False)}
    assert _turns(behind) == {"2": (7, False), "3": (7, True)}
    with pytest.raises(StateMismatchError, match=r"rank 0: \[8, 8\]; rank 1: \[7, 7\]"):
        merge_states([ahead, behind])
    one = _tail(tokenizer)
    _take(one, 4 * 7 + 2)  # seven steps and half of the eighth
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
    _take(going_on, 2 * 18)
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


@pytest.mark.parametrize("algorithm", ["wrap", "best_fit"])
def test_a_resume_reads_every_lanes_open_rows_on_the_runner_side_by_side(
    tokenizer: Any, algorithm: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Each lane re-read the documents of its saved open rows one after another on the
    calling thread as it was restored (8 lanes of Parquet text: 17 ms of a 47 ms start). They
    are now all started on the runner before the first lane restores; the resumed stream is
    the uninterrupted one."""
    from zephon_torch.ops._runner import Runner

    build = lambda: small_pipeline(tokenizer, algorithm=algorithm, lanes=4, max_length=40)  # noqa: E731
    whole = [key(b) for b in build()]
    pipeline = build()
    stream = iter(pipeline)
    for _ in range(9):
        next(stream)
    state = pipeline.state_dict()
    lanes = as_lists(state)["lanes"].values()
    assert any(lane["pack"]["carry"] != [[], []] for lane in lanes)
    on_caller: list[int] = []
    real = Runner.run_now

    def counted(self: Runner, source: int, span: Any) -> Any:
        on_caller.append(source)
        return real(self, source, span)

    monkeypatch.setattr(Runner, "run_now", counted)
    resumed = build()
    resumed.load_state_dict(state)
    assert [key(b) for b in resumed] == whole[9:]
    assert on_caller == []  # every open row's document came from the runner
