"""Exact resume: a state taken after any batch, loaded into a fresh pipeline, continues exactly;
only the newest iterator of a pipeline runs, and a spent pipeline says so."""

from __future__ import annotations

import json
import sys
import threading
import time
import warnings
from typing import Any

import pytest

from tests.helpers import as_lists, assert_resumes_at_every_step, key, small_pipeline, two_sources
from zephon_torch import Pipeline
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
