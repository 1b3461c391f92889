"""States no run saves, and data changed since the save: an edited or hand-merged state is
refused naming what is wrong, and a document changed or dropped since is a DataError naming it."""

from __future__ import annotations

import copy
import json
from typing import Any

import pytest

from tests.helpers import as_lists, next_batches, small_pipeline
from zephon_torch import DataError, Pipeline
from zephon_torch._packed_rows import unpack_rows
from zephon_torch.io import Dataset
from zephon_torch.work import StaticMixtureWorkSource


def test_a_state_no_run_saves_is_refused_naming_what_is_wrong(tokenizer: Any) -> None:
    """Edited or hand-merged states loaded without a word: lanes with data turns apart (states
    of different steps, or an edited turn) skipped a lane's turns on one rank, and on two were
    refused as "saved mid-step"; a reader position past its rows or passes skipped documents
    or ended the lane; a lane number past L and a `step` of text were taken (fresh-user
    trial)."""
    from zephon_torch.errors import StateMismatchError

    def at_step(steps: int, world_size: int = 1, rank: int = 0) -> dict[str, Any]:
        pipeline = small_pipeline(tokenizer, lanes=4, world_size=world_size, rank=rank)
        next_batches(pipeline, steps * 4 // world_size)
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


@pytest.mark.parametrize("exhaustion", ["stop", "repeat"])
def test_a_reader_position_past_the_stream_is_refused_saying_the_positions_that_load(
    exhaustion: str,
) -> None:
    """The refusal says the positions the lane has (its rows; for a finite stream, its
    passes), so that a user who edited a state can put it right."""
    from zephon_torch.errors import StateMismatchError

    dataset = Dataset.from_dict("d", {"ids": [[1 + i] * 3 for i in range(10)]})

    def pipeline() -> Pipeline:
        source = StaticMixtureWorkSource(
            [dataset],
            seed=1,
            exhaustion=exhaustion,  # type: ignore[arg-type]
            passes=3 if exhaustion == "stop" else None,
        )
        pipeline = Pipeline(source).options(canonical_replicas=1)
        return pipeline.pretokenized("ids").pack_flat(4).batch(1)

    run = pipeline()
    next_batches(run, 2)
    state = as_lists(run.state_dict())
    passes = " in pass 0 to 2" if exhaustion == "stop" else ""
    past = [{"pos": 11}, {"pass": 3}] if exhaustion == "stop" else [{"pos": 11}]
    for position in past:
        bad = copy.deepcopy(state)
        bad["lanes"]["0"]["pack"]["readers"][0].update(position)
        resumed = pipeline()
        with pytest.raises(StateMismatchError) as refused:
            resumed.load_state_dict(bad)
            next(iter(resumed))
        said = f"a pos of 0 to 10 (this lane has 10 rows){passes}"
        assert said in str(refused.value)
