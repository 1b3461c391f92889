"""Real DataLoader workers and StatefulDataLoader: the batches of one process with any worker
count, exact resume, and loaders that never move the caller's pipeline nor each other.

Workers are forked (torch's default on Linux; a spawned worker imports torch anew, about 30
times slower to start here) except where spawning is what a test shows: pickled pipelines
and the data of a spawned worker."""

from __future__ import annotations

import gc
import json
import multiprocessing
import threading
from typing import Any

import pytest
import torch
from torchdata.stateful_dataloader import StatefulDataLoader

from tests.helpers import item_bytes, loader_pipeline, take, uneven_lanes
from zephon_torch import ConfigError, Pipeline, StateMismatchError
from zephon_torch.io import Dataset
from zephon_torch.torch import DataLoader
from zephon_torch.torch.dataset import lanes_for_worker, workers_used
from zephon_torch.work import StaticMixtureWorkSource


@pytest.mark.parametrize("num_workers", [1, 2, 4])
def test_worker_counts_give_the_batches_of_a_single_process(
    tokenizer: Any, num_workers: int
) -> None:
    reference = take(DataLoader(loader_pipeline(tokenizer, exhaustion="repeat")), 40)
    loader = DataLoader(
        loader_pipeline(tokenizer, exhaustion="repeat"),
        num_workers=num_workers,
        multiprocessing_context="fork",
    )
    assert take(loader, 40) == reference


def test_a_finite_stream_gives_the_same_data_batches_with_workers(tokenizer: Any) -> None:
    reference = take(DataLoader(loader_pipeline(tokenizer)))
    assert take(
        DataLoader(loader_pipeline(tokenizer), num_workers=2, multiprocessing_context="spawn")
    ) == (reference)


@pytest.mark.parametrize("num_workers", [2, 3, 4])  # 3: one worker idle
def test_lanes_ending_at_different_turns_give_one_process_stream_with_workers(
    num_workers: int,
) -> None:
    """Padding and all: a worker whose lanes are spent must not let torch reorder the rest."""
    reference = take(DataLoader(uneven_lanes()))
    assert len(reference) == 52  # 13 turns of 4 lanes: lanes 1-3 pad most of them
    loader = DataLoader(uneven_lanes(), num_workers=num_workers, multiprocessing_context="fork")
    assert take(loader) == reference


@pytest.mark.parametrize(("cut", "load_workers"), [(18, 4), (33, 0), (46, 2)])
def test_a_resume_in_the_padded_tail_continues_exactly_with_any_workers(
    cut: int, load_workers: int
) -> None:
    reference = take(DataLoader(uneven_lanes()))
    first = DataLoader(uneven_lanes(), num_workers=2, multiprocessing_context="fork")
    assert take(first, cut) == reference[:cut]
    state = json.loads(json.dumps(first.state_dict()))
    context = "fork" if load_workers else None
    second = DataLoader(uneven_lanes(), num_workers=load_workers, multiprocessing_context=context)
    second.load_state_dict(state)
    assert take(second) == reference[cut:]


@pytest.mark.parametrize(("save_workers", "load_workers"), [(2, 0), (0, 4), (4, 1), (2, 2)])
def test_resume_with_another_worker_count_continues_exactly(
    tokenizer: Any, save_workers: int, load_workers: int
) -> None:
    reference = take(DataLoader(loader_pipeline(tokenizer, exhaustion="repeat")), 30)
    first = DataLoader(
        loader_pipeline(tokenizer, exhaustion="repeat"),
        num_workers=save_workers,
        multiprocessing_context="fork",
    )
    assert take(first, 13) == reference[:13]  # 13: mid-turn on purpose (4 lanes)
    state = json.loads(json.dumps(first.state_dict()))
    second = DataLoader(
        loader_pipeline(tokenizer, exhaustion="repeat"),
        num_workers=load_workers,
        multiprocessing_context="fork",
    )
    second.load_state_dict(state)
    assert take(second, 17) == reference[13:]


def test_a_loader_iterated_again_continues_from_what_it_delivered(tokenizer: Any) -> None:
    reference = take(DataLoader(loader_pipeline(tokenizer, exhaustion="repeat")), 20)
    loader = DataLoader(
        loader_pipeline(tokenizer, exhaustion="repeat"),
        num_workers=2,
        multiprocessing_context="fork",
    )
    assert take(loader, 7) + take(loader, 13) == reference


@pytest.mark.parametrize("num_workers", [0, 2])
def test_a_restarting_loader_shows_the_same_batches_at_every_pass(
    tokenizer: Any, num_workers: int
) -> None:
    """An evaluation loader (`restart=True`): each pass, whole or cut short, starts where the
    loader started, the pipeline's beginning or the state loaded last."""
    whole = take(DataLoader(loader_pipeline(tokenizer)))
    assert len(whole) > 6
    loader = DataLoader(loader_pipeline(tokenizer), num_workers=num_workers, restart=True)
    assert take(loader, 3) == whole[:3]
    assert take(loader) == whole
    assert take(loader) == whole
    at_four = DataLoader(loader_pipeline(tokenizer))
    take(at_four, 4)
    loader.load_state_dict(at_four.state_dict())
    assert take(loader, 2) == whole[4:6]
    assert take(loader) == whole[4:]
    with pytest.raises(ConfigError, match="`restart` must be True or False"):
        DataLoader(loader_pipeline(tokenizer), restart=1)  # type: ignore[arg-type]


def test_forkserver_workers_come_from_the_loader_s_own_server_with_the_same_batches(
    tokenizer: Any,
) -> None:
    """Forkserver workers are started by a fork server of the loader's (see torch/_signals.py),
    not multiprocessing's, which stays the program's to start; the batches are those of fork."""
    import multiprocessing.forkserver

    from zephon_torch.torch import _signals

    shared = multiprocessing.forkserver._forkserver
    before = shared._forkserver_pid  # type: ignore[attr-defined]
    got = take(
        DataLoader(loader_pipeline(tokenizer), num_workers=2, multiprocessing_context="forkserver")
    )
    assert got == take(DataLoader(loader_pipeline(tokenizer), num_workers=0))
    assert _signals._SERVER._forkserver_pid is not None  # type: ignore[attr-defined]
    assert shared._forkserver_pid == before  # type: ignore[attr-defined]


@pytest.mark.parametrize("num_workers", [0, 2])
def test_a_loader_over_a_dataset_iterated_before_continues_from_it(
    tokenizer: Any, num_workers: int
) -> None:
    """The loader started its dataset copy from nothing delivered: the items the dataset had
    given were given again."""
    reference = take(DataLoader(loader_pipeline(tokenizer, exhaustion="repeat")), 12)
    dataset = loader_pipeline(tokenizer, exhaustion="repeat").to_torch()
    head = [item_bytes(item) for _, item in zip(range(5), dataset)]
    loader = DataLoader(dataset, num_workers=num_workers, multiprocessing_context="fork")
    assert head + take(loader, 7) == reference


@pytest.mark.parametrize("num_workers", [0, 2])
def test_stateful_dataloader_restores_mid_epoch_exactly(tokenizer: Any, num_workers: int) -> None:
    def loader() -> StatefulDataLoader:
        ctx = "fork" if num_workers else None
        return StatefulDataLoader(
            loader_pipeline(tokenizer, exhaustion="repeat").to_torch(),
            batch_size=None,
            num_workers=num_workers,
            multiprocessing_context=ctx,
        )

    reference = take(loader(), 24)
    first = loader()
    assert take(first, 10) == reference[:10]
    state = first.state_dict()
    second = loader()
    second.load_state_dict(state)
    assert take(second, 14) == reference[10:]
    if num_workers:
        # one worker's state, loaded where a whole one is due, gave its lanes to every
        # worker (the others' never came: a stall) or restarted the others' lanes at turn 0
        worker = state["_snapshot"]["_worker_snapshots"]["worker_0"]["dataset_state"]
        for target in (
            DataLoader(loader_pipeline(tokenizer, exhaustion="repeat")),
            loader().dataset,
        ):
            with pytest.raises(StateMismatchError, match="one DataLoader worker's"):
                target.load_state_dict(worker)


@pytest.mark.parametrize("kind", [torch.utils.data.DataLoader, StatefulDataLoader])
def test_each_pass_of_persistent_workers_repeats_the_data_from_the_start(
    tokenizer: Any, kind: type[torch.utils.data.DataLoader[Any]]
) -> None:
    """A persistent worker began its next pass from what it had produced (prefetched items
    too) and dealt the lanes by turns of its own lanes only: lanes 0 and 2 never came again,
    lanes 1 and 3 twice over. A fresh worker's pass starts from the dataset's state."""
    reference = take(DataLoader(loader_pipeline(tokenizer, exhaustion="repeat")), 10)
    loader = kind(
        loader_pipeline(tokenizer, exhaustion="repeat").to_torch(),
        batch_size=None,
        num_workers=2,
        persistent_workers=True,
        multiprocessing_context="fork",
    )
    assert [take(loader, n) for n in (6, 10, 3)] == [reference[:6], reference, reference[:3]]


def test_persistent_and_fresh_workers_of_a_stateful_loader_give_the_same_passes_and_resumes(
    tokenizer: Any,
) -> None:
    """A state saved mid pass 2 resumes exactly, the pass after the resumed one starts from
    the dataset's start, and so does a state saved as a pass begins (the workers' states are
    taken then, before their first item), whether the workers persist or not."""

    def loader(persistent: bool) -> StatefulDataLoader:
        return StatefulDataLoader(
            loader_pipeline(tokenizer, exhaustion="repeat").to_torch(),
            batch_size=None,
            num_workers=2,
            persistent_workers=persistent,
            multiprocessing_context="fork",
        )

    reference = take(DataLoader(loader_pipeline(tokenizer, exhaustion="repeat")), 12)
    runs = []
    for persistent in (False, True):
        first = loader(persistent)
        passes = [take(first, 6), take(first, 5)]
        resumed = loader(persistent)
        resumed.load_state_dict(first.state_dict())
        passes += [take(resumed, 7), take(resumed, 4)]
        iter(first)
        begun = loader(persistent)
        begun.load_state_dict(first.state_dict())
        runs.append([*passes, take(begun, 3)])
    assert runs[0] == [reference[:6], reference[:5], reference[5:], reference[:4], reference[:3]]
    assert runs[1] == runs[0]


def test_pin_memory_yields_pinned_tensors_when_an_accelerator_exists(tokenizer: Any) -> None:
    loader = DataLoader(loader_pipeline(tokenizer), pin_memory=torch.cuda.is_available())
    item = next(iter(loader))
    assert item["input_ids"].dtype == torch.int64
    if torch.cuda.is_available():
        assert item["input_ids"].is_pinned()


def test_worker_lane_split_rotates_to_the_next_lane_due() -> None:
    assert workers_used(num_lanes=4, num_workers=3) == 2
    assert workers_used(num_lanes=6, num_workers=4) == 3
    lanes = [4, 5, 6, 7]
    assert lanes_for_worker(lanes=lanes, turns={}, num_workers=2, worker_id=0) == [4, 6]
    turns = {4: 3, 5: 3, 6: 2, 7: 2}  # saved mid-turn: 6 and 7 are due first
    assert lanes_for_worker(lanes=lanes, turns=turns, num_workers=4, worker_id=0) == [6]
    assert lanes_for_worker(lanes=lanes, turns=turns, num_workers=2, worker_id=1) == [7, 5]
    assert lanes_for_worker(lanes=lanes, turns=turns, num_workers=3, worker_id=2) == []


def test_a_loader_sharing_its_dataset_with_another_keeps_its_own_transport() -> None:
    reference = take(DataLoader(uneven_lanes()))
    dataset = uneven_lanes().to_torch()
    with_workers = DataLoader(dataset, num_workers=2, multiprocessing_context="fork")
    DataLoader(dataset)  # a second loader over the same dataset, without workers
    assert take(with_workers) == reference


def test_repeat_with_an_empty_lane_keeps_one_process_order_with_workers() -> None:
    rows = [{"input_ids": [i + 1] * 9} for i in range(3)]  # 3 rows, 4 lanes: lane 3 is empty

    def build() -> Any:
        source = StaticMixtureWorkSource([Dataset.from_dict("d", rows)], seed=0, shuffle=False)
        pipeline = Pipeline(source).options(canonical_replicas=4).pretokenized("input_ids")
        return pipeline.pack_flat(8, "wrap").batch(1)

    reference = take(DataLoader(build()), 24)
    assert take(DataLoader(build(), num_workers=4, multiprocessing_context="fork"), 24) == (
        reference
    )


def test_editing_a_returned_state_leaves_the_loader_s_resume_point_alone() -> None:
    """``state_dict()`` after a load hands out the lanes not delivered since: editing the dict
    it returned must change neither the next ``state_dict()`` nor where iteration resumes."""

    def build() -> Pipeline:
        dataset = Dataset.from_dict("d", {"ids": [[i + 1] * 3 for i in range(40)]})
        source = StaticMixtureWorkSource([dataset], shuffle=False)
        return (
            Pipeline(source)
            .options(prefetch=0, canonical_replicas=2)
            .pretokenized("ids")
            .pack_flat(3)
            .batch(1)
        )

    pipeline = build()
    batches = iter(pipeline)
    for _ in range(4):
        next(batches)
    saved = pipeline.state_dict()
    loader = DataLoader(build())
    loader.load_state_dict(saved)
    given = loader.state_dict()
    assert given == saved
    given["lanes"]["0"]["turn"] = 0  # the caller edits what it was given
    given["lanes"]["0"]["pack"]["skipped"]["too_long"] = 5
    given["estimation"] = {"edited": True}
    assert loader.state_dict() == saved
    assert next(iter(loader))["input_ids"].tolist() == [[5, 5, 5]]


def test_forked_workers_tokenize_after_the_parent_used_the_backends_threads(
    tokenizer: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """With TOKENIZERS_PARALLELISM=true (a common setting, and this suite's) and a parent that
    had used the backend's thread pool, workers started by fork (Linux's default) waited forever
    in their first encode_batch. The timeout turns such a hang into a failure."""
    import os

    monkeypatch.setenv("TOKENIZERS_PARALLELISM", "true")
    tokenizer.encode_batch(["the parent tokenizes first, on the backend's threads"] * 64)
    expected = take(DataLoader(loader_pipeline(tokenizer)), 8)
    loader = DataLoader(
        loader_pipeline(tokenizer), num_workers=2, multiprocessing_context="fork", timeout=60
    )
    assert take(loader, 8) == expected
    assert os.environ["TOKENIZERS_PARALLELISM"] == "true"  # turned off in the workers only


@pytest.mark.parametrize("num_workers", [0, 2])
def test_loaders_never_move_the_caller_s_pipeline_nor_each_other(
    tokenizer: Any, num_workers: int
) -> None:
    """Without workers a loader iterated the caller's own pipeline: a second loader made from
    it went on where the first stopped (with workers it started over), and two loaders
    iterated in turn made each other's iterators stale."""
    pipeline = loader_pipeline(tokenizer)
    reference = take(DataLoader(loader_pipeline(tokenizer)), 6)
    first = DataLoader(pipeline, num_workers=num_workers)
    assert take(first, 3) == reference[:3]
    with pytest.raises(ConfigError, match="not what the training loop received"):
        pipeline.state_dict()  # it stayed put: its state would be the loop's start
    assert all(lane is None for lane in pipeline._state_dict()["lanes"].values())
    second = DataLoader(pipeline, num_workers=num_workers)
    a, b = iter(first), iter(second)
    interleaved = [(item_bytes(next(a)), item_bytes(next(b))) for _ in range(3)]
    assert [x for x, _ in interleaved] == reference[3:6]  # `first` goes on from what it gave
    assert [y for _, y in interleaved] == reference[:3]
    # the calibration is made once, in this process, and frozen into every loader state
    state = second.state_dict()
    assert state["estimation"] is not None
    resumed = DataLoader(loader_pipeline(tokenizer), num_workers=num_workers)
    resumed.load_state_dict(state)
    assert take(resumed, 3) == reference[3:6]


@pytest.mark.parametrize("num_workers", [0, 2])
def test_a_stale_loader_iterator_stops_its_workers_at_once(
    tokenizer: Any, num_workers: int
) -> None:
    """A stale iterator raised on its next call, but its worker processes (or, without
    workers, its pipeline's threads) read ahead as long as the caller held it: a peek with
    `iter(loader)` before `for item in loader` doubled the workers."""
    loader = DataLoader(loader_pipeline(tokenizer, exhaustion="repeat"), num_workers=num_workers)
    threads = threading.active_count()
    # children another test left to the garbage collector (a plain torch loader's workers,
    # held by the frames of the error it raised) are not this loader's
    gc.collect()
    before = set(multiprocessing.active_children())
    held = []
    for _ in range(4):
        held.append(iter(loader))
        next(held[-1])
    assert len(set(multiprocessing.active_children()) - before) == num_workers
    assert threading.active_count() - threads <= 4  # the newest iteration's, not four's
    with pytest.raises(RuntimeError, match="stale"):
        next(held[0])
    loader.load_state_dict(loader.state_dict())
    assert set(multiprocessing.active_children()) - before == set()
    with pytest.raises(RuntimeError, match="stale"):
        next(held[-1])
