"""Real DataLoader workers and StatefulDataLoader: same batches, exact resume.

Workers are forked (torch's default on Linux; a spawned worker imports torch anew, about 30
times slower to start here) except where spawning is what a test shows: pickled pipelines,
errors and the data of a spawned worker."""

from __future__ import annotations

import gc
import itertools
import json
import multiprocessing
import threading
import warnings
from typing import Any

import pytest
import torch
from torchdata.stateful_dataloader import StatefulDataLoader

from tests.helpers import on_measured_text, small_pipeline, two_sources
from zephon_torch import ConfigError, DataError, Pipeline, StateMismatchError, merge_states
from zephon_torch.errors import WorkerTraceback
from zephon_torch.io import Dataset
from zephon_torch.torch import DataLoader
from zephon_torch.torch.dataset import lanes_for_worker, workers_used
from zephon_torch.work import StaticMixtureWorkSource

DATASETS = two_sources(40, 30, shard_size=8)


def build(tokenizer: Any, **kw: Any) -> Any:
    kw.setdefault("lanes", 4)
    kw.setdefault("datasets", DATASETS)
    return small_pipeline(tokenizer, **kw)


def fingerprint(item: dict[str, Any]) -> bytes:
    return b"".join(
        item[k].numpy().tobytes() for k in ("input_ids", "labels", "position_ids", "cu_seqlens")
    )


def take(loader: Any, n: int | None = None) -> list[bytes]:
    out = []
    for item in loader:
        out.append(fingerprint(item))
        if n is not None and len(out) == n:
            break
    return out


@pytest.mark.parametrize("num_workers", [1, 2, 4])
def test_worker_counts_give_the_batches_of_a_single_process(
    tokenizer: Any, num_workers: int
) -> None:
    reference = take(DataLoader(build(tokenizer, exhaustion="repeat")), 40)
    loader = DataLoader(
        build(tokenizer, exhaustion="repeat"),
        num_workers=num_workers,
        multiprocessing_context="fork",
    )
    assert take(loader, 40) == reference


def test_a_finite_stream_gives_the_same_data_batches_with_workers(tokenizer: Any) -> None:
    reference = take(DataLoader(build(tokenizer)))
    assert take(DataLoader(build(tokenizer), num_workers=2, multiprocessing_context="spawn")) == (
        reference
    )


def uneven_lanes(**options: Any) -> Any:
    """Lane 0 of 4 gets every long document, so it runs for many turns after the others."""
    rows = [{"input_ids": [i + 1] * (40 if i % 4 == 0 else 3)} for i in range(40)]
    dataset = Dataset.from_dict("d", rows)
    source = StaticMixtureWorkSource([dataset], seed=1, exhaustion="stop", shuffle=False)
    pipeline = Pipeline(source).options(canonical_replicas=4, **options)
    return pipeline.pretokenized("input_ids").pack_flat(16, "best_fit").batch(2)


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
    reference = take(DataLoader(build(tokenizer, exhaustion="repeat")), 30)
    first = DataLoader(
        build(tokenizer, exhaustion="repeat"),
        num_workers=save_workers,
        multiprocessing_context="fork",
    )
    assert take(first, 13) == reference[:13]  # 13: mid-turn on purpose (4 lanes)
    state = json.loads(json.dumps(first.state_dict()))
    second = DataLoader(
        build(tokenizer, exhaustion="repeat"),
        num_workers=load_workers,
        multiprocessing_context="fork",
    )
    second.load_state_dict(state)
    assert take(second, 17) == reference[13:]


def test_a_loader_iterated_again_continues_from_what_it_delivered(tokenizer: Any) -> None:
    reference = take(DataLoader(build(tokenizer, exhaustion="repeat")), 20)
    loader = DataLoader(
        build(tokenizer, exhaustion="repeat"), num_workers=2, multiprocessing_context="fork"
    )
    assert take(loader, 7) + take(loader, 13) == reference


@pytest.mark.parametrize("num_workers", [0, 2])
def test_a_restarting_loader_shows_the_same_batches_at_every_pass(
    tokenizer: Any, num_workers: int
) -> None:
    """An evaluation loader (`restart=True`): each pass, whole or cut short, starts where the
    loader started, the pipeline's beginning or the state loaded last."""
    whole = take(DataLoader(build(tokenizer)))
    assert len(whole) > 6
    loader = DataLoader(build(tokenizer), num_workers=num_workers, restart=True)
    assert take(loader, 3) == whole[:3]
    assert take(loader) == whole
    assert take(loader) == whole
    at_four = DataLoader(build(tokenizer))
    take(at_four, 4)
    loader.load_state_dict(at_four.state_dict())
    assert take(loader, 2) == whole[4:6]
    assert take(loader) == whole[4:]
    with pytest.raises(ConfigError, match="`restart` must be True or False"):
        DataLoader(build(tokenizer), restart=1)  # type: ignore[arg-type]


def test_a_lambda_in_a_pipeline_for_spawned_workers_is_a_config_error_saying_so(
    tokenizer: Any,
) -> None:
    """Spawned (or forkserver) workers get the pipeline pickled: a lambda gave pickle's bare
    AttributeError from inside torch."""
    source = StaticMixtureWorkSource(DATASETS, seed=1)
    pipeline = (
        Pipeline(source)
        .map(lambda row: {**row, "text": row["text"].upper()})
        .tokenize(tokenizer=tokenizer)
        .pack_flat(64)
        .batch(2)
    )
    loader = DataLoader(pipeline, num_workers=1, multiprocessing_context="spawn")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # torch's own note on the pickle error
        with pytest.raises(
            ConfigError, match=r"started by 'spawn' get the pipeline pickled.*lambda"
        ):
            next(iter(loader))
    assert take(DataLoader(pipeline, num_workers=1, multiprocessing_context="fork"), 1)


def test_forkserver_workers_come_from_the_loader_s_own_server_with_the_same_batches(
    tokenizer: Any,
) -> None:
    """Forkserver workers are started by a fork server of the loader's (see torch/_signals.py),
    not multiprocessing's, which stays the program's to start; the batches are those of fork."""
    import multiprocessing.forkserver

    from zephon_torch.torch import _signals

    shared = multiprocessing.forkserver._forkserver
    before = shared._forkserver_pid  # type: ignore[attr-defined]
    got = take(DataLoader(build(tokenizer), num_workers=2, multiprocessing_context="forkserver"))
    assert got == take(DataLoader(build(tokenizer), num_workers=0))
    assert _signals._SERVER._forkserver_pid is not None  # type: ignore[attr-defined]
    assert shared._forkserver_pid == before  # type: ignore[attr-defined]


def test_a_pipeline_given_to_torch_s_own_loader_says_how_to_load_it(tokenizer: Any) -> None:
    """torch's DataLoader takes what is not an IterableDataset for a map-style dataset and
    asked a Pipeline for its length: a bare "object of type 'Pipeline' has no len()"."""
    pipeline = build(tokenizer)
    with pytest.raises(
        TypeError, match=r"zephon_torch\.torch\.DataLoader\(pipeline\).*batch_size=None"
    ):
        next(iter(torch.utils.data.DataLoader(pipeline)))
    assert pipeline and len(list(pipeline)) > 1  # truth and list() do not ask for a length
    item = next(iter(torch.utils.data.DataLoader(build(tokenizer).to_torch(), batch_size=None)))
    assert item["input_ids"].shape == (2, 64)


@pytest.mark.parametrize("num_workers", [0, 2])
def test_a_loader_over_a_dataset_iterated_before_continues_from_it(
    tokenizer: Any, num_workers: int
) -> None:
    """The loader started its dataset copy from nothing delivered: the items the dataset had
    given were given again."""
    reference = take(DataLoader(build(tokenizer, exhaustion="repeat")), 12)
    dataset = build(tokenizer, exhaustion="repeat").to_torch()
    head = [fingerprint(item) for _, item in zip(range(5), dataset)]
    loader = DataLoader(dataset, num_workers=num_workers, multiprocessing_context="fork")
    assert head + take(loader, 7) == reference


@pytest.mark.parametrize("num_workers", [0, 2])
def test_stateful_dataloader_restores_mid_epoch_exactly(tokenizer: Any, num_workers: int) -> None:
    def loader() -> StatefulDataLoader:
        ctx = "fork" if num_workers else None
        return StatefulDataLoader(
            build(tokenizer, exhaustion="repeat").to_torch(),
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
        for target in (DataLoader(build(tokenizer, exhaustion="repeat")), loader().dataset):
            with pytest.raises(StateMismatchError, match="one DataLoader worker's"):
                target.load_state_dict(worker)


@pytest.mark.parametrize("kind", [torch.utils.data.DataLoader, StatefulDataLoader])
def test_each_pass_of_persistent_workers_repeats_the_data_from_the_start(
    tokenizer: Any, kind: type[torch.utils.data.DataLoader[Any]]
) -> None:
    """A persistent worker began its next pass from what it had produced (prefetched items
    too) and dealt the lanes by turns of its own lanes only: lanes 0 and 2 never came again,
    lanes 1 and 3 twice over. A fresh worker's pass starts from the dataset's state."""
    reference = take(DataLoader(build(tokenizer, exhaustion="repeat")), 10)
    loader = kind(
        build(tokenizer, exhaustion="repeat").to_torch(),
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
            build(tokenizer, exhaustion="repeat").to_torch(),
            batch_size=None,
            num_workers=2,
            persistent_workers=persistent,
            multiprocessing_context="fork",
        )

    reference = take(DataLoader(build(tokenizer, exhaustion="repeat")), 12)
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
    loader = DataLoader(build(tokenizer), pin_memory=torch.cuda.is_available())
    item = next(iter(loader))
    assert item["input_ids"].dtype == torch.int64
    if torch.cuda.is_available():
        assert item["input_ids"].is_pinned()


def test_a_state_from_eight_lanes_is_refused_by_a_four_lane_loader(tokenizer: Any) -> None:
    eight = DataLoader(build(tokenizer, lanes=8))
    take(eight, 3)
    with pytest.raises(StateMismatchError, match="canonical_replicas"):
        DataLoader(build(tokenizer, lanes=4)).load_state_dict(eight.state_dict())


def test_three_ranks_over_eight_lanes_are_refused_with_the_supported_list(tokenizer: Any) -> None:
    with pytest.raises(ConfigError, match=r"supported world sizes: \[1, 2, 4, 8\]"):
        build(tokenizer, lanes=8, world_size=3)


def test_a_data_error_in_a_worker_reaches_the_loop_as_a_data_error(
    tokenizer: Any, tmp_path: Any
) -> None:
    shard = tmp_path / "a.jsonl"
    shard.write_text("".join(json.dumps({"text": f"document {i}"}) + "\n" for i in range(9)))
    with shard.open("a") as out:
        out.write('{"text": "broken\n')
    source = StaticMixtureWorkSource([Dataset.from_path("web", shard)], shuffle=False)
    pipeline = Pipeline(source).options(canonical_replicas=2).tokenize(tokenizer=tokenizer)
    loader = DataLoader(
        pipeline.pack_flat(16).batch(1), num_workers=2, multiprocessing_context="fork"
    )
    with pytest.raises(DataError) as caught:
        list(loader)
    assert (caught.value.dataset, caught.value.shard, caught.value.row) == ("web", str(shard), 9)
    # stopped with the error: its frames hold torch's iterator, whose workers lived on
    # until the error was collected
    assert multiprocessing.active_children() == []


@pytest.mark.parametrize("context", ["fork", "spawn"])
def test_a_map_s_exception_reaches_the_loop_as_the_cause_with_its_frames(context: str) -> None:
    from tests.unit.test_runner_errors import refusing_pipeline

    loader = DataLoader(refusing_pipeline("inline"), num_workers=2, multiprocessing_context=context)
    with pytest.raises(DataError, match=r"row 1: map .* raised RowRefused") as caught:
        list(loader)
    cause = caught.value.__cause__
    assert type(cause).__name__ == "RowRefused" and str(cause) == "row 5 is refused"
    assert isinstance(cause.__cause__, WorkerTraceback)
    assert "in refuse_row_five" in str(cause.__cause__)


@pytest.mark.parametrize("kind", ["torch", "stateful"])
def test_a_plain_torch_loader_keeps_a_worker_s_data_error_type_and_fields(kind: str) -> None:
    """torch (and torchdata's StatefulDataLoader) re-raise a worker's error as
    `type(error)(traceback text)`: DataError accepts that, so `except DataError` still works
    there, and reads the dataset, shard and row back from the text."""
    import torch.utils.data

    docs = [[1, 2, 3]] * 8 + [[4, -5]]  # the last one holds an id outside [0, 2**31)
    source = StaticMixtureWorkSource([Dataset.from_dict("ids", {"ids": docs})], shuffle=False)
    pipeline = Pipeline(source).pretokenized("ids").pack_flat(4).batch(1)
    loader_class = torch.utils.data.DataLoader if kind == "torch" else StatefulDataLoader
    loader = loader_class(
        pipeline.to_torch(), batch_size=None, num_workers=1, multiprocessing_context="fork"
    )
    with pytest.raises(DataError, match=r"dataset 'ids', shard 'memory://ids/0', row 8") as caught:
        list(loader)
    # its own type, a DataError: an id out of range is no row's fault (IdOutOfRange)
    assert "Caught IdOutOfRange in DataLoader worker process 0" in str(caught.value)
    assert type(caught.value).__name__ == "IdOutOfRange" and not caught.value.rows_fault
    assert (caught.value.dataset, caught.value.shard, caught.value.row) == (
        "ids",
        "memory://ids/0",
        8,
    )


def test_worker_settings_are_ignored_without_workers(tokenizer: Any) -> None:
    """So a worker count can be set to 0 alone: `timeout` was a bare AssertionError from torch
    at the first batch."""
    reference = take(DataLoader(build(tokenizer)), 2)
    loader = DataLoader(
        build(tokenizer), timeout=30, prefetch_factor=4, multiprocessing_context="spawn"
    )
    assert take(loader, 2) == reference


def test_persistent_workers_are_refused(tokenizer: Any) -> None:
    with pytest.raises(ConfigError, match="persistent_workers"):
        DataLoader(build(tokenizer), num_workers=1, persistent_workers=True)


def test_worker_lane_split_rotates_to_the_next_lane_due() -> None:
    assert workers_used(num_lanes=4, num_workers=3) == 2
    assert workers_used(num_lanes=6, num_workers=4) == 3
    lanes = [4, 5, 6, 7]
    assert lanes_for_worker(lanes=lanes, turns={}, num_workers=2, worker_id=0) == [4, 6]
    turns = {4: 3, 5: 3, 6: 2, 7: 2}  # saved mid-turn: 6 and 7 are due first
    assert lanes_for_worker(lanes=lanes, turns=turns, num_workers=4, worker_id=0) == [6]
    assert lanes_for_worker(lanes=lanes, turns=turns, num_workers=2, worker_id=1) == [7, 5]
    assert lanes_for_worker(lanes=lanes, turns=turns, num_workers=3, worker_id=2) == []


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
    expected = take(DataLoader(build(tokenizer)), 8)
    loader = DataLoader(build(tokenizer), num_workers=2, multiprocessing_context="fork", timeout=60)
    assert take(loader, 8) == expected
    assert os.environ["TOKENIZERS_PARALLELISM"] == "true"  # turned off in the workers only


def test_states_of_ranks_resumed_from_a_state_merge_into_the_global_one(tokenizer: Any) -> None:
    """Each rank's loader state held, beside its own lanes, the other ranks' lanes as loaded;
    merged (or gathered), those stale copies overwrote the lanes that had moved on."""

    def on(world: int | None = None, rank: int | None = None) -> Any:
        return DataLoader(build(tokenizer, exhaustion="repeat", world_size=world, rank=rank))

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
    rank_zero = build(tokenizer, exhaustion="repeat", world_size=2, rank=0)
    batches = iter(rank_zero)
    for _ in range(4):
        next(batches)
    own_lanes_only = rank_zero.state_dict()  # not merged with rank 1's
    loader = DataLoader(build(tokenizer, exhaustion="repeat", world_size=2, rank=1))
    with pytest.raises(
        StateMismatchError,
        match=r"lanes: saved \[0, 1\], live .needs \[2, 3\]: the state holds the lanes of some "
        r"ranks only \(a Pipeline's state_dict\(\) holds its own rank's\); merge every rank's "
        r"state with merge_states, or save zephon_torch.torch.DataLoader's state_dict\(\)",
    ):
        loader.load_state_dict(own_lanes_only)


@pytest.mark.parametrize("num_workers", [0, 2])
def test_loaders_never_move_the_caller_s_pipeline_nor_each_other(
    tokenizer: Any, num_workers: int
) -> None:
    """Without workers a loader iterated the caller's own pipeline: a second loader made from
    it went on where the first stopped (with workers it started over), and two loaders
    iterated in turn made each other's iterators stale."""
    pipeline = build(tokenizer)
    reference = take(DataLoader(build(tokenizer)), 6)
    first = DataLoader(pipeline, num_workers=num_workers)
    assert take(first, 3) == reference[:3]
    with pytest.raises(ConfigError, match="not what the training loop received"):
        pipeline.state_dict()  # it stayed put: its state would be the loop's start
    assert all(lane is None for lane in pipeline._state_dict()["lanes"].values())
    second = DataLoader(pipeline, num_workers=num_workers)
    a, b = iter(first), iter(second)
    interleaved = [(fingerprint(next(a)), fingerprint(next(b))) for _ in range(3)]
    assert [x for x, _ in interleaved] == reference[3:6]  # `first` goes on from what it gave
    assert [y for _, y in interleaved] == reference[:3]
    # the calibration is made once, in this process, and frozen into every loader state
    state = second.state_dict()
    assert state["estimation"] is not None
    resumed = DataLoader(build(tokenizer), num_workers=num_workers)
    resumed.load_state_dict(state)
    assert take(resumed, 3) == reference[3:6]


@pytest.mark.parametrize("num_workers", [0, 2])
def test_a_stale_loader_iterator_stops_its_workers_at_once(
    tokenizer: Any, num_workers: int
) -> None:
    """A stale iterator raised on its next call, but its worker processes (or, without
    workers, its pipeline's threads) read ahead as long as the caller held it: a peek with
    `iter(loader)` before `for item in loader` doubled the workers."""
    loader = DataLoader(build(tokenizer, exhaustion="repeat"), num_workers=num_workers)
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


@on_measured_text
@pytest.mark.parametrize("num_workers", [0, 1, 2])
def test_the_final_states_of_per_rank_loaders_merge(tokenizer: Any, num_workers: int) -> None:
    """A lane whose last micro-batch was full read "not done" in the loader's final state, so
    the ranks' final states (turns apart) were refused by `merge_states`. The loader cuts the
    stream itself with any worker count and keeps the empty turn's states."""
    ends = []
    for rank in (0, 1):
        data = two_sources(20, 11, shard_size=8)
        pipeline = build(tokenizer, world_size=2, rank=rank, datasets=data)
        loader = DataLoader(pipeline, num_workers=num_workers)
        assert take(loader)
        ends.append(loader.state_dict())
        assert all(lane["done"] for lane in ends[-1]["lanes"].values())
    again = DataLoader(build(tokenizer, datasets=two_sources(20, 11, shard_size=8)))
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
        dataset = build(tokenizer, world_size=2, rank=rank, datasets=data).to_torch()
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
