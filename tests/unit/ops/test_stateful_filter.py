"""User stateful filters: applied in order per lane, state saved with the lane, exact resume."""

from __future__ import annotations

import copy
import importlib.util
import itertools
import json
import threading
import time
import warnings
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt
import pytest

from tests.helpers import assert_resumes_at_every_step, small_pipeline, two_sources
from zephon_torch import ConfigError, Pipeline
from zephon_torch.errors import DataError
from zephon_torch.io import Dataset
from zephon_torch.ops.stateful import StatefulFilter
from zephon_torch.work import StaticMixtureWorkSource

EXAMPLE = Path(__file__).resolve().parents[3] / "examples" / "curriculum_filter.py"


def load_example() -> Any:
    spec = importlib.util.spec_from_file_location("curriculum_filter", EXAMPLE)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


class EveryOther(StatefulFilter):
    name = "every_other"

    def __init__(self) -> None:
        self.count = 0

    def keep(self, tokens: npt.NDArray[Any], source: str) -> bool:
        self.count += 1
        return self.count % 2 == 1

    def state_dict(self) -> dict[str, Any]:
        return {"count": self.count}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.count = state["count"]


def test_the_curriculum_example_limits_early_documents_and_resumes_exactly(tokenizer: Any) -> None:
    curriculum = load_example().LengthCurriculum

    def build() -> Any:
        base = small_pipeline(tokenizer, lanes=2, datasets=two_sources(20, 16, shard_size=5))
        return base.stateful_filter(lambda lane: curriculum(start=60, growth=20))

    n = assert_resumes_at_every_step(build)
    assert n >= 4
    pipeline = build()
    first = next(iter(pipeline))
    assert first.num_tokens > 0
    lane_state = pipeline.state_dict()["lanes"]["0"]["pack"]["readers"][0]
    assert lane_state["filter"]["seen"] > 0


def test_a_stateful_filter_sees_each_lanes_documents_and_drops_what_it_rejects(
    tokenizer: Any,
) -> None:
    datasets = two_sources(20, 16, shard_size=5)
    everything = sum(b.num_tokens for b in small_pipeline(tokenizer, datasets=datasets))
    half = small_pipeline(tokenizer, datasets=datasets).stateful_filter(lambda lane: EveryOther())
    kept = sum(b.num_tokens for b in half)
    assert 0 < kept < everything
    assert half.fingerprint()["stateful_filters"] == ["every_other"]


def test_a_factory_returning_something_else_is_refused(tokenizer: Any) -> None:
    with pytest.raises(ConfigError, match="must return a StatefulFilter, got int"):
        small_pipeline(tokenizer).stateful_filter(lambda lane: 3)  # type: ignore[arg-type,return-value]


class Stateless(StatefulFilter):
    """A filter that keeps no state (its decisions depend on the document alone)."""

    def state_dict(self) -> dict[str, Any]:
        return {}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        pass


class Recorder(Stateless):
    name = "recorder"

    def __init__(self) -> None:
        self.seen: list[tuple[str, list[int]]] = []

    def keep(self, tokens: npt.NDArray[Any], source: str) -> bool:
        self.seen.append((str(tokens.dtype), tokens.tolist()))
        return True


def test_a_filter_sees_pre_tokenized_ids_as_int32_whatever_their_stored_type() -> None:
    import numpy as np

    from zephon_torch import DataError, Pipeline
    from zephon_torch.io import Dataset
    from zephon_torch.work import StaticMixtureWorkSource

    def pipeline(ids: list[Any]) -> Any:
        source = StaticMixtureWorkSource([Dataset.from_dict("d", {"ids": ids})], shuffle=False)
        return Pipeline(source).pretokenized("ids").pack_flat(4)

    recorder = Recorder()
    stored = [np.array([1, 2], dtype=np.uint64), np.array([3], dtype=np.uint16)]
    list(pipeline(stored).stateful_filter(lambda lane: recorder).batch(1))
    assert recorder.seen == [("int32", [1, 2]), ("int32", [3])]
    wide = [np.array([1], dtype=np.int64), np.array([2, 2**40], dtype=np.int64)]
    with pytest.raises(DataError, match=rf"row 1: holds token id {2**40}; ids must lie in"):
        list(pipeline(wide).stateful_filter(lambda lane: Recorder()).batch(1))


class KeepUnseen(StatefulFilter):
    """Deduplicates: keeps a document only the first time its ids are seen."""

    name = "keep_unseen"

    def __init__(self, limit: int = 10_000) -> None:
        self.seen: list[list[int]] = []
        self.calls, self.limit = 0, limit

    def keep(self, tokens: npt.NDArray[Any], source: str) -> bool:
        self.calls += 1
        assert self.calls < self.limit, "read on and on: the endless rejection was not caught"
        if tokens.tolist() in self.seen:
            return False
        self.seen.append(tokens.tolist())
        return True

    def state_dict(self) -> dict[str, Any]:
        return {"seen": self.seen}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.seen = [list(ids) for ids in state["seen"]]


class KeepEvery(StatefulFilter):
    """Keeps one document in ``every``, counting each it sees: its state moves on rejects."""

    name = "keep_every"

    def __init__(self, every: int) -> None:
        self.every, self.count = every, 0

    def keep(self, tokens: npt.NDArray[Any], source: str) -> bool:
        self.count += 1
        return self.count % self.every == 0

    def state_dict(self) -> dict[str, Any]:
        return {"count": self.count}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.count = state["count"]


def _repeating(rows: int) -> Any:
    from zephon_torch import Pipeline
    from zephon_torch.io import Dataset
    from zephon_torch.work import StaticMixtureWorkSource

    ids = [[i + 1] * 3 for i in range(rows)]
    dataset = Dataset.from_dict("d", {"ids": ids})
    source = StaticMixtureWorkSource([dataset], exhaustion="repeat")
    return Pipeline(source).pretokenized("ids").pack_flat(3)


def test_a_filter_that_rejects_every_document_for_ever_under_repeat_is_an_error() -> None:
    from zephon_torch import DataError

    pipeline = _repeating(5).stateful_filter(lambda lane: KeepUnseen()).batch(1)
    batches = iter(pipeline)
    kept = [next(batches).input_ids[0].tolist() for _ in range(5)]  # each document once
    assert sorted(kept) == [[i + 1] * 3 for i in range(5)]
    with pytest.raises(DataError, match="'keep_unseen' rejected every document of this lane"):
        next(batches)


def test_a_filter_whose_state_moves_while_it_rejects_is_read_on() -> None:
    # a pass is 4 documents: 11 rejections in a row span more than two passes
    pipeline = _repeating(4).stateful_filter(lambda lane: KeepEvery(12)).batch(1)
    batches = iter(pipeline)
    for _ in range(3):
        assert next(batches).num_tokens == 3


class Warmup(StatefulFilter):
    """Skips the first ``skip`` documents; updates in place the dict it returns as state."""

    name = "warmup"

    def __init__(self, skip: int) -> None:
        self.skip, self.state = skip, {"seen": 0}

    def keep(self, tokens: npt.NDArray[Any], source: str) -> bool:
        self.state["seen"] += 1
        return self.state["seen"] > self.skip

    def state_dict(self) -> dict[str, Any]:
        return self.state

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.state = dict(state)


class LongerLater(StatefulFilter):
    """Keeps 3-token documents only after its first 40: a curriculum."""

    name = "longer_later"

    def __init__(self) -> None:
        self.count = 0

    def keep(self, tokens: npt.NDArray[Any], source: str) -> bool:
        self.count += 1
        return len(tokens) < 3 or self.count > 40

    def state_dict(self) -> dict[str, Any]:
        return {"count": self.count}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.count = state["count"]


def test_a_filter_returning_its_live_state_dict_is_compared_by_value() -> None:
    pipeline = _repeating(4).stateful_filter(lambda lane: Warmup(skip=20)).batch(1)
    batches = iter(pipeline)
    assert [next(batches).num_tokens for _ in range(3)] == [3, 3, 3]


def test_a_filter_above_another_whose_state_moves_is_read_on() -> None:
    from zephon_torch import Pipeline
    from zephon_torch.io import Dataset
    from zephon_torch.work import StaticMixtureWorkSource

    dataset = Dataset.from_dict("d", {"ids": [[1, 2], [3, 4], [5, 6, 7], [8, 9, 10]]})
    source = StaticMixtureWorkSource([dataset], exhaustion="repeat", shuffle=False)
    pipeline = (
        Pipeline(source)
        .pretokenized("ids")
        .stateful_filter(lambda lane: LongerLater())
        .stateful_filter(lambda lane: KeepUnseen())
        .pack_flat(3, "wrap")
        .batch(1)
    )
    # the dedup above sees the two short documents, then nothing new for 10 passes while the
    # curriculum beneath counts on, then the two long ones
    rows = [b.input_ids[0].tolist() for b in itertools.islice(pipeline, 3)]
    assert rows == [[1, 2, 3], [4, 5, 6], [7, 8, 9]]


class KeepMarked(StatefulFilter):
    """Keeps only documents that begin with 999, counting those it keeps."""

    name = "keep_marked"

    def __init__(self) -> None:
        self.kept, self.calls = 0, 0

    def keep(self, tokens: npt.NDArray[Any], source: str) -> bool:
        self.calls += 1
        assert self.calls < 100_000, "read on and on"
        if int(tokens[0]) != 999:
            return False
        self.kept += 1
        return True

    def state_dict(self) -> dict[str, Any]:
        return {"kept": self.kept}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.kept = state["kept"]


def test_with_several_shuffled_lanes_a_filter_waiting_for_its_documents_is_read_on() -> None:
    """Each pass deals the documents to the lanes anew: a lane that saw nothing to keep for two
    passes may be dealt the marked document in the next."""
    from zephon_torch import Pipeline
    from zephon_torch.io import Dataset
    from zephon_torch.work import StaticMixtureWorkSource

    ids = [[999, 1, 2]] + [[i + 3, i + 3, i + 3] for i in range(39)]
    source = StaticMixtureWorkSource([Dataset.from_dict("d", {"ids": ids})], exhaustion="repeat")
    pipeline = (
        Pipeline(source)
        .options(canonical_replicas=4)
        .pretokenized("ids")
        .stateful_filter(lambda lane: KeepMarked())
        .pack_flat(3)
        .batch(1)
    )
    rows = [b.input_ids[0].tolist() for b in itertools.islice(pipeline, 8)]
    assert rows == [[999, 1, 2]] * 8


def test_with_several_shuffled_lanes_a_filter_rejecting_on_and_on_is_warned_of() -> None:
    """Nothing proves a dedup filter rejects for ever there (each pass deals the lanes anew):
    the lanes read on without a batch, and without a word until this warning."""
    import warnings

    from zephon_torch import Pipeline
    from zephon_torch.io import Dataset
    from zephon_torch.work import StaticMixtureWorkSource

    ids = [[i + 1] * 3 for i in range(40)]
    source = StaticMixtureWorkSource([Dataset.from_dict("d", {"ids": ids})], exhaustion="repeat")
    pipeline = (
        Pipeline(source)
        .options(canonical_replicas=4)
        .pretokenized("ids")
        .stateful_filter(lambda lane: KeepUnseen(limit=100_000))
        .pack_flat(3)
        .batch(1)
    )
    kept = []
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        with pytest.raises(UserWarning, match=r"'keep_unseen' rejected 80 documents in a row"):
            for batch in pipeline:
                kept.append((batch.lane, batch.input_ids[0].tolist()))
    assert len(set(map(repr, kept))) == len(kept) > 3 * 40  # each lane kept each at most once


class Holding(Warmup):
    """A warm-up whose state holds ``value`` beside its count, from the document ``when``."""

    name = "holding"

    def __init__(self, value: Any, when: int = 0) -> None:
        super().__init__(skip=0)
        self.value, self.when = value, when

    def state_dict(self) -> dict[Any, Any]:
        held = self.value if self.state["seen"] >= self.when else None
        return {"seen": self.state["seen"], "held": held}


class _Thing:
    pass


@pytest.mark.parametrize(
    ("value", "where", "what"),
    [
        ({1, 2}, "['held']", "a builtins.set"),
        ((1, 2), "['held']", "a builtins.tuple"),
        ({("seen", 0): 1}, "['held'][('seen', 0)]", "a key of type tuple"),
        ({7: 1}, "['held'][7]", "a key of type int"),
        ([b"x"], "['held'][0]", "a builtins.bytes"),
        (np.arange(3), "['held']", "a numpy.ndarray"),
        (threading.Lock(), "['held']", "a _thread.lock"),
        (
            {"deep": [_Thing()]},
            "['held']['deep'][0]",
            "a tests.unit.ops.test_stateful_filter._Thing",
        ),
    ],
)
@pytest.mark.parametrize("when", [0, 2])
def test_a_state_that_is_not_plain_json_is_refused_naming_the_filter(
    value: Any, where: str, what: str, when: int
) -> None:
    """It was handed out, to fail in the user's `json.dump` naming neither the filter nor the
    key (a set, bytes), or to come back changed from JSON (a tuple, an int key), or as a bare
    "cannot pickle" TypeError (a lock) (review H, F5). Refused from the first state on, and
    from a later one that starts holding it."""
    pipeline = _repeating(4).stateful_filter(lambda lane: Holding(value, when)).batch(1)
    with pytest.raises(ConfigError) as caught:
        list(itertools.islice(pipeline, 4))
    assert str(caught.value) == (
        "stateful filter 'holding': its state_dict() must be plain JSON data (dicts with string "
        "keys, lists, str, int, float, bool, None), which a checkpoint saves and a resume gives "
        f"back as it was; state{where} holds {what}"
    )


def test_numpy_numbers_in_a_state_are_saved_as_plain_numbers() -> None:
    """A counter updated with numpy (np.int64) made a state `json.dumps` refused."""
    value = {"count": np.int64(5), "mean": np.float32(0.5), "flag": np.bool_(True)}
    pipeline = _repeating(4).stateful_filter(lambda lane: Holding(value)).batch(1)
    list(itertools.islice(pipeline, 2))
    state = pipeline.state_dict()
    held = state["lanes"]["0"]["pack"]["readers"][0]["filter"]["held"]
    assert held == {"count": 5, "mean": 0.5, "flag": True}
    assert [type(v) for v in held.values()] == [int, float, bool]
    json.dumps(state)


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


def _drop_b(row: dict[str, Any]) -> bool:
    return bool(row["text"].startswith("a"))


@pytest.mark.timeout(60)
@pytest.mark.parametrize("lanes", [1, 2])
def test_a_plain_filter_that_drops_a_whole_source_under_repeat_is_an_error_or_a_warning(
    tokenizer: Any, lanes: int
) -> None:
    """It was read for ever, spinning with no batch and no word. Filters are pure: where
    every pass hands a lane the same documents it is refused after two lane passes; with
    several shuffled lanes (each pass deals anew) once the run has met every row."""
    from zephon_torch import DataError, Pipeline
    from zephon_torch.io import Dataset
    from zephon_torch.work import StaticMixtureWorkSource

    datasets = [
        Dataset.from_dict(name, {"text": [f"{name} {i} words" for i in range(20)]}, shard_size=5)
        for name in ("a", "b")
    ]
    source = StaticMixtureWorkSource(datasets, {"a": 0.5, "b": 0.5}, seed=3, exhaustion="repeat")
    pipeline = (
        Pipeline(source)
        .options(canonical_replicas=lanes)
        .filter(_drop_b)
        .tokenize(tokenizer=tokenizer, parallelism=1)
        .pack_flat(32)
        .batch(1)
    )
    whole = "a whole pass of lane 0" if lanes == 1 else "the dataset"
    with pytest.raises(DataError, match=f"dataset 'b'.* every document of {whole}"):
        next(iter(pipeline))


class Raises(Stateless):
    name = "raises"

    def keep(self, tokens: npt.NDArray[Any], source: str) -> bool:
        if len(tokens) and tokens[0] == 4:
            raise KeyError("boom")
        return True


def test_errors_of_a_user_filter_s_decision_name_the_row() -> None:
    """A stateful filter's exception, and a plain filter's result with no truth value, came
    out bare, naming no row."""
    from zephon_torch import DataError

    pipeline = _repeating(6).stateful_filter(lambda lane: Raises()).batch(1)
    with pytest.raises(DataError, match=r"dataset 'd', shard .*, row 3: stateful filter 'raises'"):
        list(itertools.islice(pipeline, 12))

    import numpy as np

    from zephon_torch import Pipeline
    from zephon_torch.io import Dataset
    from zephon_torch.work import StaticMixtureWorkSource

    dataset = Dataset.from_dict("t", {"ids": [[1, 2], [3, 4]]})
    plain = (
        Pipeline(StaticMixtureWorkSource([dataset]))
        .filter(lambda row: np.array([True, False]), name="array")
        .pretokenized("ids")
        .pack_flat(4)
        .batch(1)
    )
    with pytest.raises(DataError, match=r"row 0: filter 'array' raised ValueError: The truth"):
        next(iter(plain))


class Forgets(Stateless):
    """Returns nothing (a missed `return`) from its first call on."""

    name = "forgets"

    def keep(self, tokens: npt.NDArray[Any], source: str) -> bool:
        return None  # type: ignore[return-value]


def test_a_filter_that_returns_no_decision_is_refused_naming_the_row() -> None:
    """A filter that returned None (a missed `return`) dropped every document, and one that
    returned a function (a predicate not called) kept every one, without a word (fresh-user
    trials); other results still count by their truth value, as Python's `filter` reads
    them."""
    import numpy as np

    from zephon_torch import DataError, Pipeline
    from zephon_torch.io import Dataset
    from zephon_torch.work import StaticMixtureWorkSource

    def first_ids(fn: Any, name: str) -> list[int]:
        dataset = Dataset.from_dict("t", {"ids": [[1, 2], [3, 4], [5, 6]]})
        pipeline = Pipeline(StaticMixtureWorkSource([dataset], shuffle=False))
        pipeline = pipeline.filter(fn, name=name).pretokenized("ids").pack_flat(2).batch(1)
        return [int(batch.input_ids[0, 0]) for batch in pipeline]

    for fn, got in ((lambda row: None, "None"), (lambda row: _not_five, "a callable")):
        with pytest.raises(DataError, match=rf"dataset 't', .* row 0: filter 'f' returned {got}"):
            first_ids(fn, "f")
    assert first_ids(lambda row: np.int64(row["ids"][0] - 3), "int") == [1, 5]
    assert first_ids(lambda row: np.bool_(row["ids"][0] > 1), "numpy") == [3, 5]
    assert first_ids(lambda row: "" if row["ids"][0] == 5 else "x", "text") == [1, 3]

    pipeline = _repeating(6).stateful_filter(lambda lane: Forgets()).batch(1)
    with pytest.raises(DataError, match=r"row \d+: stateful filter 'forgets' returned None"):
        next(iter(pipeline))


class Phase(StatefulFilter):
    """Keeps a document whose first id is ``first`` only at step 0 of a cycle of ``cycle``
    decisions: its state comes back to the same value every ``cycle`` documents."""

    name = "phase"

    def __init__(self, first: int, cycle: int) -> None:
        self.first, self.cycle, self.step = first, cycle, 0

    def keep(self, tokens: npt.NDArray[Any], source: str) -> bool:
        kept = self.step == 0 and int(tokens[0]) == self.first
        self.step = (self.step + 1) % self.cycle
        return kept

    def state_dict(self) -> dict[str, Any]:
        return {"step": self.step}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.step = state["step"]


def _not_five(row: dict[str, Any]) -> bool:
    return bool(row["ids"][0] != 5)


def test_a_filter_whose_state_cycles_under_a_stateless_filter_is_read_on() -> None:
    """The proof compared states 2 x 5 rejections apart, taken for two passes: with a stateless
    filter dropping one document of five, that was two and a half, and a filter that keeps a
    document every 10 decisions (a whole number of 4-document passes later) was refused."""
    from zephon_torch import Pipeline
    from zephon_torch.io import Dataset
    from zephon_torch.work import StaticMixtureWorkSource

    ids = [[i + 1] * 3 for i in range(5)]
    source = StaticMixtureWorkSource(
        [Dataset.from_dict("d", {"ids": ids})], exhaustion="repeat", shuffle=False
    )
    pipeline = (
        Pipeline(source)
        .filter(_not_five, name="not_five")
        .pretokenized("ids")
        .pack_flat(3)
        .stateful_filter(lambda lane: Phase(1, 10))
        .batch(1)
    )
    batches = iter(pipeline)
    assert [next(batches).input_ids[0].tolist() for _ in range(4)] == [[1, 1, 1]] * 4


@pytest.mark.parametrize("cycle", [2, 7, 40])
def test_a_filter_whose_state_cycles_without_keeping_is_an_error(cycle: int) -> None:
    """Compared a pass apart only, a state cycling over 2 or more passes was never seen equal:
    the stream read for ever (the same state comes back every `cycle` passes here)."""
    from zephon_torch import DataError, Pipeline
    from zephon_torch.io import Dataset
    from zephon_torch.work import StaticMixtureWorkSource

    ids = [[i + 1] * 3 for i in range(3)]
    source = StaticMixtureWorkSource(
        [Dataset.from_dict("d", {"ids": ids})], exhaustion="repeat", shuffle=False
    )
    pipeline = (
        Pipeline(source)
        .pretokenized("ids")
        .pack_flat(3)
        .stateful_filter(lambda lane: Phase(first=99, cycle=cycle))  # never keeps
        .batch(1)
    )
    with (
        warnings.catch_warnings(),
        pytest.raises(DataError, match="came back to a state it had at the same position"),
    ):
        warnings.simplefilter("ignore")  # the eight-pass warning, on the longer cycles
        next(iter(pipeline))


class KeepNone(StatefulFilter):
    """Rejects every document, counting them: a state that never comes back."""

    name = "keep_none"

    def __init__(self) -> None:
        self.seen = 0

    def keep(self, tokens: Any, source: str) -> bool:
        self.seen += 1
        return False

    def state_dict(self) -> dict[str, Any]:
        return {"seen": self.seen}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.seen = state["seen"]


class KeepTiny(StatefulFilter):
    """Keeps documents of at most one token, and no state to speak of."""

    name = "keep_tiny"

    def keep(self, tokens: Any, source: str) -> bool:
        return len(tokens) <= 1

    def state_dict(self) -> dict[str, Any]:
        return {}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        pass


@pytest.mark.parametrize("case", ["counter rejects all", "filter then min length", "lane"])
def test_a_source_that_gives_a_lane_nothing_for_ever_is_refused_not_read_on(case: str) -> None:
    """Each read for ever without a word past one warning (a resume fuzzer's hangs): a
    counting filter that rejects everything (no state comes back to prove it), a filter whose
    kept documents the length rules drop (its rejections ended the proof of the rules), and a
    lane a one-shard shuffle window deals only the empty documents of a tiny dataset."""
    if case == "lane":
        data = Dataset.from_dict("small", {"ids": [[], [], [8] * 9]}, shard_size=2)
        source = StaticMixtureWorkSource(
            [data], exhaustion="repeat", shuffle_window_shards=1, seed=0
        )
        recipe = Pipeline(source).options(canonical_replicas=2).pretokenized("ids")
        pipeline = recipe.pack_flat(32).batch(1)
        said = r"gave lane 1 nothing in 256 passes of it \(257 documents in a row"
    else:
        data = Dataset.from_dict("s0", {"ids": [[1], [2, 3], [4, 5, 6], [7] * 9]})
        source = StaticMixtureWorkSource([data], exhaustion="repeat", shuffle=False, seed=0)
        recipe = Pipeline(source).pretokenized("ids")
        make = KeepNone if case == "counter rejects all" else KeepTiny
        recipe = recipe.stateful_filter(lambda lane: make())
        pipeline = recipe.pack_flat(8, min_document_length=2).batch(1)
        said = r"gave lane 0 nothing in 256 passes of it \(1025 documents in a row"
    with warnings.catch_warnings(), pytest.raises(DataError, match=said):
        warnings.simplefilter("ignore")  # the eight-pass warning comes first
        list(itertools.islice(pipeline, 2))  # lane 1's first micro-batch never came


class MisreadsItsState(EveryOther):
    """EveryOther whose ``load_state_dict`` reads a key its state does not hold."""

    name = "misreads"

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.count = state["seen"]


def test_a_factory_s_shared_instance_and_its_errors_are_named_with_filter_and_lane() -> None:
    """One instance for every lane was taken, and its decisions then changed with the world
    size; a factory's exception, and one from `load_state_dict` (called as every iteration
    starts, even with no state loaded), came out bare (fresh-user trial C)."""
    from zephon_torch import ConfigError, Pipeline
    from zephon_torch.io import Dataset
    from zephon_torch.work import StaticMixtureWorkSource

    dataset = Dataset.from_dict("d", {"ids": [[i + 1] * 3 for i in range(16)]})
    recipe = (
        Pipeline(StaticMixtureWorkSource([dataset]))
        .options(canonical_replicas=2)
        .pretokenized("ids")
    )
    shared = Recorder()
    pipeline = recipe.stateful_filter(lambda lane: shared).pack_flat(3).batch(1)
    with pytest.raises(ConfigError, match=r"'recorder': its factory returned an instance it had"):
        next(iter(pipeline))

    def fails_for_lane_one(lane: int) -> StatefulFilter:
        if lane == 1:
            raise RuntimeError("cannot build for this lane")
        return Recorder()

    pipeline = recipe.stateful_filter(fails_for_lane_one).pack_flat(3).batch(1)
    with pytest.raises(ConfigError, match=r"factory raised RuntimeError for lane 1: cannot build"):
        next(iter(pipeline))
    pipeline = recipe.stateful_filter(lambda lane: MisreadsItsState()).pack_flat(3).batch(1)
    with pytest.raises(
        ConfigError, match=r"'misreads' of lane 0, dataset 'd': its load_state_dict raised KeyError"
    ):
        next(iter(pipeline))
