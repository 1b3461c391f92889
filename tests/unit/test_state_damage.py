"""Damaged states that failed with a bare error, hung, or resumed from the wrong place: each
is refused naming the field (see ``test_state_checks.py`` for the rest)."""

from __future__ import annotations

import json
from typing import Any

import pytest

from tests.helpers import as_lists, small_pipeline
from zephon_torch import Pipeline, StateMismatchError
from zephon_torch.io import Dataset
from zephon_torch.ops.stateful import StatefulFilter
from zephon_torch.work import StaticMixtureWorkSource


def _lane(state: dict[str, Any]) -> dict[str, Any]:
    return state["lanes"]["0"]  # type: ignore[no-any-return]


class _KeepAll(StatefulFilter):
    name = "keep_all"

    def keep(self, tokens: Any, source: str) -> bool:
        return True

    def state_dict(self) -> dict[str, Any]:
        return {}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        pass


def test_a_stateful_filter_s_reader_set_to_null_is_refused(tokenizer: Any) -> None:
    """Its None restarted the filtered source's reader at the stream's start, unsaid."""

    def build() -> Pipeline:
        base = small_pipeline(tokenizer, lanes=1, exhaustion="repeat", prefetch=0)
        return base.stateful_filter(lambda lane: _KeepAll())

    pipeline = build()
    batches = iter(pipeline)
    for _ in range(3):
        next(batches)
    state = as_lists(json.loads(json.dumps(pipeline.state_dict())))
    _lane(state)["pack"]["readers"][0]["reader"] = None
    resumed = build()
    with pytest.raises(StateMismatchError, match="lane 0 stateful filter reader"):
        resumed.load_state_dict(state)
        next(iter(resumed))


def _pretokenized(algorithm: str = "wrap", *, window: int | None = None, size: int = 1) -> Pipeline:
    data = Dataset.from_dict("d", {"ids": [[1 + i] * (3 + i % 5) for i in range(40)]})
    source = StaticMixtureWorkSource([data], seed=3, exhaustion="repeat")
    recipe = Pipeline(source).options(canonical_replicas=2, prefetch=0).pretokenized("ids")
    packed = recipe.pack_flat(8, algorithm)  # type: ignore[arg-type]
    return (packed.shuffle(window) if window else packed).batch(size)


def _saved_after(pipeline: Pipeline, batches: int) -> dict[str, Any]:
    stream = iter(pipeline)
    for _ in range(batches):
        next(stream)
    return json.loads(json.dumps(pipeline.state_dict()))  # type: ignore[no-any-return]


def test_a_shuffle_count_past_its_block_is_refused() -> None:
    """It failed with a bare IndexError at the lane's first batch (and one equal to the
    block's rows went on with the next block under the old block's order)."""
    for emitted in (4, 1000):
        state = _saved_after(_pretokenized(window=4), 3)
        _lane(state)["pack"]["emitted"] = emitted
        resumed = _pretokenized(window=4)
        with pytest.raises(StateMismatchError, match="lane 0 shuffle emitted"):
            resumed.load_state_dict(state)
            next(iter(resumed))


def test_a_shuffle_block_start_set_to_null_is_refused() -> None:
    """Its None restarted the lane's packing at the stream's start: data read again, unsaid."""
    state = _saved_after(_pretokenized(window=4), 3)
    _lane(state)["pack"]["start"] = None
    resumed = _pretokenized(window=4)
    with pytest.raises(StateMismatchError, match="lane 0 shuffle start"):
        resumed.load_state_dict(state)
        next(iter(resumed))


def test_a_packed_row_count_past_any_bound_is_refused() -> None:
    """zlib raised a bare OverflowError for a count of 2**60 pieces."""
    state = _saved_after(_pretokenized("best_fit"), 3)
    _lane(state)["pack"]["packer"]["rows"][0] = 2**60
    with pytest.raises(StateMismatchError, match=r"lane 0 pack\.packer\.pieces"):
        _pretokenized("best_fit").load_state_dict(state)


@pytest.mark.timeout(20)
def test_a_huge_saved_micro_batch_size_is_refused_at_once() -> None:
    """The sizes suggested were found by trial division up to the square root of the rows:
    minutes for an edited size of 2**61 - 1."""
    state = _saved_after(_pretokenized(size=3), 1)
    state["microbatch_size"] = 2**61 - 1
    with pytest.raises(StateMismatchError, match="microbatch_size"):
        _pretokenized(size=2).load_state_dict(state)


@pytest.mark.parametrize("key", ["00", "\u0660", "\uff10"])
def test_a_lane_number_not_as_written_is_refused_naming_it(key: str) -> None:
    """``int`` reads "00", an Arabic-Indic and a full-width zero as lane 0, but the lane is
    looked up as "0": the refusal said the state lacked lane 0 while listing it."""
    state = _saved_after(_pretokenized(), 2)
    state["lanes"][key] = state["lanes"].pop("0")
    with pytest.raises(StateMismatchError, match=f"lane {key!r}"):
        _pretokenized().load_state_dict(state)
