"""A state that does not fit the recipe it is loaded into is refused naming every difference:
a changed recipe, datasets in another order, lanes of another rank, another version, or a
malformed state, wherever it is loaded."""

from __future__ import annotations

import json
import pickle
import re
from typing import Any

import pytest

from tests.helpers import small_pipeline
from zephon_torch import Pipeline, StateMismatchError
from zephon_torch._state import STATE_VERSION
from zephon_torch.torch import DataLoader
from zephon_torch.work import StaticMixtureWorkSource, TokenEstimation


@pytest.mark.parametrize(
    ("change", "key"),
    [
        ({"max_length": 32}, "pack"),
        ({"algorithm": "best_fit"}, "pack"),
        ({"lanes": 2}, "canonical_replicas"),
        ({"exhaustion": "repeat"}, "exhaustion"),
    ],
)
def test_loading_a_state_into_a_changed_recipe_lists_the_difference(
    tokenizer: Any, change: dict[str, Any], key: str
) -> None:
    state = small_pipeline(tokenizer).state_dict()
    with pytest.raises(StateMismatchError, match=key) as info:
        small_pipeline(tokenizer, **change).load_state_dict(state)
    assert key in info.value.mismatches


def test_every_mismatch_is_listed_in_one_error(tokenizer: Any) -> None:
    state = small_pipeline(tokenizer).state_dict()
    with pytest.raises(StateMismatchError) as info:
        small_pipeline(tokenizer, max_length=32, lanes=2, exhaustion="repeat").load_state_dict(
            state
        )
    assert {"pack", "canonical_replicas", "exhaustion"} <= set(info.value.mismatches)


def test_a_state_of_the_datasets_in_another_order_is_refused(tokenizer: Any) -> None:
    """Lane states index the datasets by position, but the mixture was compared as a dict:
    the state loaded, then crashed in packing or resumed each dataset at the other's place."""
    from tests.helpers import two_sources

    long, short = two_sources()
    state = small_pipeline(tokenizer, datasets=[long, short]).state_dict()
    with pytest.raises(StateMismatchError, match="order of datasets") as info:
        small_pipeline(tokenizer, datasets=[short, long]).load_state_dict(state)
    assert info.value.mismatches["order of datasets"] == (["long", "short"], ["short", "long"])
    small_pipeline(tokenizer, datasets=[long, short]).load_state_dict(state)  # same order: fine
    # a serialiser that sorts keys keeps the order: it is a list
    sorted_keys = json.loads(json.dumps(state, sort_keys=True))
    small_pipeline(tokenizer, datasets=[long, short]).load_state_dict(sorted_keys)
    reversed_names = small_pipeline(tokenizer, datasets=[short, long]).state_dict()
    resorted = json.loads(json.dumps(reversed_names, sort_keys=True))
    small_pipeline(tokenizer, datasets=[short, long]).load_state_dict(resorted)


def test_a_state_missing_the_lanes_of_this_rank_is_refused(tokenizer: Any) -> None:
    rank0 = small_pipeline(tokenizer, lanes=4, world_size=2, rank=0).state_dict()
    with pytest.raises(StateMismatchError, match="lanes"):
        small_pipeline(tokenizer, lanes=4, world_size=2, rank=1).load_state_dict(rank0)


def test_a_state_of_another_version_is_refused(tokenizer: Any) -> None:
    state = small_pipeline(tokenizer).state_dict()
    state["version"] = 1  # saved before the mixer looked one piece ahead
    live = STATE_VERSION
    with pytest.raises(StateMismatchError, match=f"version: saved 1, live {live}") as refused:
        small_pipeline(tokenizer).load_state_dict(state)
    assert "Resume with the release that saved it" in str(refused.value)
    with pytest.raises(StateMismatchError, match="Resume with the release") as refused:
        DataLoader(small_pipeline(tokenizer)).load_state_dict(state)
    # the note travels with the error (from a DataLoader worker, say)
    assert pickle.loads(pickle.dumps(refused.value)).note == refused.value.note
    # as releases of version 1 wrote it, the micro-batch size in the fingerprint: refused for
    # its version alone, that size no difference of the recipe's
    fingerprint = {**state["fingerprint"], "microbatch_size": 2}
    as_written = {k: v for k, v in state.items() if k != "microbatch_size"}
    with pytest.raises(StateMismatchError) as refused:
        small_pipeline(tokenizer).load_state_dict({**as_written, "fingerprint": fingerprint})
    assert set(refused.value.mismatches) == {"version"}
    # a later release's, or none's (the note had said the mixer of an earlier one differed)
    for saved, note in (
        (live + 1, f"saved by a later zephon_torch release (state version {live + 1}"),
        (str(live), f"No zephon_torch release writes state version '{live}'"),
    ):
        for target in (small_pipeline(tokenizer), DataLoader(small_pipeline(tokenizer))):
            with pytest.raises(StateMismatchError, match=re.escape(note)) as refused:
                target.load_state_dict({**state, "version": saved})
            assert "mixer" not in str(refused.value)


def _equal_mix(tokenizer: Any) -> Pipeline:
    from tests.helpers import two_sources

    source = StaticMixtureWorkSource(
        two_sources(), {"long": 1, "short": 1}, seed=7, token_estimation=TokenEstimation()
    )
    return (
        Pipeline(source).options(canonical_replicas=2)
        .tokenize(tokenizer=tokenizer).pack_flat(64).batch(2)
    )  # fmt: skip


def test_a_version_1_state_of_equal_weights_resumes_as_its_own_version(tokenizer: Any) -> None:
    """Equal weights pick alike under both versions' rules (the look-ahead adds the same to
    every source), so such a state of version 1 is taken, and continues as later versions'."""
    from tests.helpers import keys

    pipeline = _equal_mix(tokenizer)
    batches = iter(pipeline)
    for _ in range(5):
        next(batches)
    state = pipeline.state_dict()
    expected = keys(batches, 12)
    old = {**state, "version": 1}
    resumed = _equal_mix(tokenizer)
    resumed.load_state_dict(old)
    assert keys(resumed, 12) == expected
    loader = DataLoader(_equal_mix(tokenizer))
    loader.load_state_dict(old)
    got = [item["input_ids"].numpy().tobytes() for _, item in zip(range(12), loader)]
    assert got == [k[2] for k in expected]


def _broken(kind: str, state: dict[str, Any]) -> Any:
    if kind == "a list":
        return [1, 2]
    if kind == "lanes a list":
        return {**state, "lanes": list(state["lanes"].values())}
    if kind == "a lane without its pack":
        lanes = {k: {x: y for x, y in v.items() if x != "pack"} for k, v in state["lanes"].items()}
        return {**state, "lanes": lanes}
    if kind == "datasets a number":
        return {**state, "datasets": 3}
    return {k: v for k, v in state.items() if k != "fingerprint"}  # no fingerprint


@pytest.mark.parametrize(
    "kind",
    ["a list", "lanes a list", "a lane without its pack", "no fingerprint", "datasets a number"],
)
def test_a_malformed_state_is_a_state_mismatch_everywhere_it_is_loaded(
    tokenizer: Any, kind: str
) -> None:
    """Each was a bare AttributeError, KeyError or TypeError, from the loader, merge_states or
    deep in the packer's reset."""
    from zephon_torch import merge_states
    from zephon_torch.torch import DataLoader

    pipeline = small_pipeline(tokenizer, lanes=2)
    next(iter(pipeline))
    next(iter(pipeline))
    state = _broken(kind, json.loads(json.dumps(pipeline.state_dict())))
    for load in (
        small_pipeline(tokenizer, lanes=2).load_state_dict,
        DataLoader(small_pipeline(tokenizer, lanes=2)).load_state_dict,
        lambda s: merge_states([s]),
    ):
        with pytest.raises(StateMismatchError):
            load(state)
