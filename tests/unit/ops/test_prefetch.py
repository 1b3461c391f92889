"""The background producer: order, errors at their position, bounded look-ahead, closing."""

from __future__ import annotations

import os
import signal
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from zephon_torch.ops.prefetch import Prefetcher


def counting(made: list[int], stop: int | None = None, fail_at: int | None = None) -> Iterator[int]:
    i = 0
    while stop is None or i < stop:
        if i == fail_at:
            raise ValueError(f"item {i} is bad")
        made.append(i)
        yield i
        i += 1


def test_items_come_in_order_then_the_end_again_and_again() -> None:
    made: list[int] = []
    prefetcher = Prefetcher(lambda: counting(made, stop=50), depth=3)
    assert list(prefetcher) == list(range(50))
    with pytest.raises(StopIteration):
        next(prefetcher)
    prefetcher.close()


def test_a_producer_error_is_raised_where_it_happened() -> None:
    prefetcher = Prefetcher(lambda: counting([], stop=10, fail_at=4), depth=2)
    assert [next(prefetcher) for _ in range(4)] == [0, 1, 2, 3]
    for _ in range(2):  # and again on the next call
        with pytest.raises(ValueError, match="item 4 is bad"):
            next(prefetcher)
    prefetcher.close()


def test_the_producer_runs_at_most_depth_ahead() -> None:
    made: list[int] = []
    prefetcher = Prefetcher(lambda: counting(made), depth=3)
    assert next(prefetcher) == 0
    deadline = time.monotonic() + 30  # a busy machine may not have run the producer yet
    while len(made) < 1 + 3 + 1 and time.monotonic() < deadline:
        time.sleep(0.01)
    time.sleep(0.3)  # room for one more, were the bound not kept
    # three queued, one made and waiting for room: never more
    assert len(made) == 1 + 3 + 1
    prefetcher.close()


def test_closing_stops_the_producer_and_later_calls_raise() -> None:
    made: list[int] = []
    prefetcher = Prefetcher(lambda: counting(made), depth=2)
    next(prefetcher)
    prefetcher.close()
    assert not prefetcher._thread.is_alive()
    count = len(made)
    time.sleep(0.2)
    assert len(made) == count  # stopped
    for _ in range(2):  # the items it had made are dropped, not handed out
        with pytest.raises(RuntimeError, match="prefetcher was closed"):
            next(prefetcher)


def test_a_consumer_waiting_when_it_is_closed_is_woken_with_an_error() -> None:
    gate = threading.Event()

    def slow() -> Iterator[int]:
        gate.wait(5)
        yield 1

    prefetcher = Prefetcher(slow, depth=1)
    outcome: list[BaseException] = []

    def consume() -> None:
        try:
            next(prefetcher)
        except BaseException as exc:  # recorded for the assertion
            outcome.append(exc)

    consumer = threading.Thread(target=consume)
    consumer.start()
    time.sleep(0.2)  # the consumer waits on an empty queue
    closer = threading.Thread(target=prefetcher.close)
    closer.start()
    gate.set()  # the producer's item is dropped: it was stopped before it could put it
    closer.join(10)
    consumer.join(10)
    assert not consumer.is_alive(), "the waiting consumer was left waiting"
    assert len(outcome) == 1 and isinstance(outcome[0], RuntimeError)


@pytest.mark.parametrize("prefetch", [0, 4])
def test_an_iterator_dropped_before_its_first_batch_leaves_no_thread(
    tokenizer: object, prefetch: int
) -> None:
    """Its cleanup ran only once it was started: the prefetch thread and the tokenizing
    threads of an iterator never asked for a batch ran on for good."""
    import gc

    from tests.helpers import small_pipeline

    before = set(threading.enumerate())
    pipeline = small_pipeline(tokenizer, prefetch=prefetch)
    iterator = iter(pipeline)
    started = set(threading.enumerate()) - before
    assert any(t.name == "zephon-prefetch" for t in started) == bool(prefetch)
    del iterator
    gc.collect()
    deadline = time.monotonic() + 10
    while any(t.is_alive() for t in started) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert [t.name for t in started if t.is_alive()] == []
    assert sum(1 for _ in pipeline) > 0  # the pipeline still runs from its start


def test_closing_does_not_wait_for_an_item_still_being_made_and_twice_is_once() -> None:
    """Leaving a loop (a break, an error in its body, Ctrl-C) waited up to 10 s for the item
    being made (a slow map, a read retrying), and twice: the iterator's finalizer closed it
    again. The item is finished and dropped in the background."""
    release = threading.Event()

    def slow() -> Iterator[int]:
        yield 0
        release.wait(30)  # making the next item takes long
        yield 1

    prefetcher = Prefetcher(slow, depth=2)
    assert next(prefetcher) == 0
    start = time.monotonic()
    prefetcher.close()
    prefetcher.close()
    assert time.monotonic() - start < 5  # was 10 s, then 10 s again
    with pytest.raises(RuntimeError, match="closed"):
        next(prefetcher)
    release.set()
    prefetcher._thread.join(5)
    assert not prefetcher._thread.is_alive()  # it finished its item and stopped


class Interrupted(Exception):
    """Raised by the test's timer, as Ctrl-C raises KeyboardInterrupt (which pytest takes)."""


def blocked_from_row_forty(row: dict[str, Any]) -> dict[str, Any]:
    if row["ids"][0] >= 40:
        Path(os.environ["BLOCKED_MARK"]).touch()
        time.sleep(5)  # a huge document, a remote lookup
    return row


@pytest.mark.parametrize(("runner", "prefetch"), [("threads", 0), ("threads", 2), ("processes", 2)])
def test_leaving_a_loop_while_a_map_runs_waits_about_a_second_in_all(
    runner: str, prefetch: int, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The README's "about a second": interrupted while waiting for a batch whose map runs,
    the loop waited a second for the prefetch thread (blocked on the map's chunk), then one
    for the runner's threads, and one again when the iterator's finalizer closed the runner
    a second time: 2-3 s to leave it."""
    from zephon_torch import Pipeline
    from zephon_torch.io import Dataset
    from zephon_torch.work import StaticMixtureWorkSource

    mark = tmp_path / "blocked"
    monkeypatch.setenv("BLOCKED_MARK", str(mark))  # before the processes start
    data = Dataset.from_dict("d", {"ids": [[i, 2, 2] for i in range(200)]}, shard_size=8)
    recipe = Pipeline(StaticMixtureWorkSource([data], exhaustion="repeat", shuffle=False))
    recipe = recipe.map(blocked_from_row_forty).options(read_ahead=64, prefetch=prefetch)
    pipeline = recipe.pretokenized("ids", runner=runner, parallelism=2).pack_flat(8).batch(1)
    raised: list[float] = []
    ended = threading.Event()

    def interrupt(*_: object) -> None:
        raised.append(time.monotonic())
        raise Interrupted

    def interrupt_once_the_map_blocks() -> None:
        # watched here, not in the loop's body: a busy machine let the loop take every batch
        # made before the map began its long call, so the body saw the mark only with the
        # next batch, once the map's chunk was done (minutes)
        deadline = time.monotonic() + 120
        while not mark.exists() and time.monotonic() < deadline and not ended.wait(0.01):
            pass
        if not ended.wait(0.5):  # the loop waits by then
            signal.pthread_kill(threading.main_thread().ident, signal.SIGUSR1)  # type: ignore[arg-type]

    # not SIGALRM: pytest-timeout's, which this handler would take for the interrupt
    previous = signal.signal(signal.SIGUSR1, interrupt)
    watcher = threading.Thread(target=interrupt_once_the_map_blocks, daemon=True)
    try:
        watcher.start()
        with pytest.raises(Interrupted):
            for _ in pipeline:
                pass
        left = time.monotonic() - raised[-1]
    finally:
        ended.set()
        watcher.join(10)
        signal.signal(signal.SIGUSR1, previous)
    assert mark.exists(), "the map never reached its blocking row"
    assert left < 1.6, left
