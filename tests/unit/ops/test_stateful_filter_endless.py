"""Filters that reject on and on under `exhaustion="repeat"`: read on while their state moves, an
error once a state comes back or a lane gets nothing for ever, a warning where nothing proves it."""

from __future__ import annotations

import itertools
import warnings
from typing import Any

import numpy.typing as npt
import pytest

from tests.helpers import KeepUnseen, Warmup, not_five, repeating_pipeline
from zephon_torch import Pipeline
from zephon_torch.errors import DataError
from zephon_torch.io import Dataset
from zephon_torch.ops.stateful import StatefulFilter
from zephon_torch.work import StaticMixtureWorkSource


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


def test_a_filter_that_rejects_every_document_for_ever_under_repeat_is_an_error() -> None:
    from zephon_torch import DataError

    pipeline = repeating_pipeline(5).stateful_filter(lambda lane: KeepUnseen()).batch(1)
    batches = iter(pipeline)
    kept = [next(batches).input_ids[0].tolist() for _ in range(5)]  # each document once
    assert sorted(kept) == [[i + 1] * 3 for i in range(5)]
    with pytest.raises(DataError, match="'keep_unseen' rejected every document of this lane"):
        next(batches)


def test_a_filter_whose_state_moves_while_it_rejects_is_read_on() -> None:
    # a pass is 4 documents: 11 rejections in a row span more than two passes
    pipeline = repeating_pipeline(4).stateful_filter(lambda lane: KeepEvery(12)).batch(1)
    batches = iter(pipeline)
    for _ in range(3):
        assert next(batches).num_tokens == 3


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
    pipeline = repeating_pipeline(4).stateful_filter(lambda lane: Warmup(skip=20)).batch(1)
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
        .filter(not_five, name="not_five")
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
