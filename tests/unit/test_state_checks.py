"""A saved state edited, cut short or mistyped is refused naming the field, never resumed.

Before these checks most such states were taken: a lane restarted or skipped without a word
(a list one short was cut by `zip`), or the first batch failed with a bare KeyError,
IndexError, TypeError or OverflowError deep in the packer.
"""

from __future__ import annotations

import copy
import json
from collections.abc import Callable
from typing import Any

import pytest

from tests.helpers import as_lists, keys, small_pipeline
from zephon_torch import Pipeline, StateMismatchError, merge_states
from zephon_torch.io import Dataset
from zephon_torch.work import StaticMixtureWorkSource

Edit = Callable[[dict[str, Any]], object]


def _lane(state: dict[str, Any]) -> dict[str, Any]:
    return state["lanes"]["0"]  # type: ignore[no-any-return]


def _pack(state: dict[str, Any]) -> dict[str, Any]:
    """Lane 0's packing state with its per-source part as lists, as the pipeline holds it
    (a state written out holds it packed, ``_packed_rows``; lists load as well)."""
    state["lanes"] = as_lists(state)["lanes"]
    return _lane(state)["pack"]  # type: ignore[no-any-return]


def _columns(state: dict[str, Any]) -> dict[str, list[Any]]:
    """Lane 0's reader positions as version 3 wrote them, a column per field."""
    pack = _pack(state)
    readers = pack["readers"]
    pack["readers"] = {key: [r[key] for r in readers] for key in ("pass", "pos", "filtered")}
    return pack["readers"]  # type: ignore[no-any-return]


EDITS: dict[str, tuple[Edit, str]] = {
    "turn -1": (lambda s: _lane(s).update(turn=-1), "lane 0 turn"),
    "turn 2.5": (lambda s: _lane(s).update(turn=2.5), "lane 0 turn"),
    "turn 10**30": (lambda s: _lane(s).update(turn=10**30), "lane 0 turn"),
    "done 'no'": (lambda s: _lane(s).update(done="no"), "lane 0 done"),
    "pack None": (lambda s: _lane(s).update(pack=None), "lane 0 pack"),
    # a lane state no dict, or without its turn: refused as such, where the step is compared
    # with the lanes' turns only once every lane reads well
    "lane a number": (lambda s: s["lanes"].update({"0": 3}), "lane 0"),
    "turn lost": (lambda s: _lane(s).pop("turn"), "lane 0"),
    "int lane key": (lambda s: s["lanes"].update({0: s["lanes"].pop("0")}), "lane 0"),
    "estimation NaN": (lambda s: s.update(estimation={"long": {"x": float("nan")}}), "estimation"),
    # an int past the largest float: math.isfinite raised OverflowError, not the state's error
    "estimation huge": (lambda s: s.update(estimation={"long": {"x": 10**400}}), "estimation"),
    "pack {}": (lambda s: _lane(s).update(pack={}), "lane 0 pack"),
    # the per-source part is written packed into one string (`_packed_rows`)
    "sources cut short": (
        lambda s: _lane(s)["pack"].update(sources=_lane(s)["pack"]["sources"][:-4]),
        "lane 0 pack.sources",
    ),
    "sources lost": (lambda s: _lane(s)["pack"].pop("sources"), "lane 0 pack"),
    "readers one short": (lambda s: _pack(s)["readers"].pop(), "lane 0 pack.readers"),
    "reader pos -1": (lambda s: _pack(s)["readers"][0].update(pos=-1), "lane 0 reader pos"),
    # version 3 wrote reader positions as columns, a list per field
    "reader columns one short": (
        lambda s: [column.pop() for column in _columns(s).values()],
        "lane 0 pack.readers",
    ),
    "reader columns apart": (lambda s: _columns(s)["pos"].pop(), "lane 0 pack.readers"),
    "reader column lost": (lambda s: _columns(s).pop("pos"), "lane 0 pack.readers"),
    "reader column pos -1": (lambda s: _columns(s)["pos"].__setitem__(0, -1), "lane 0 reader pos"),
    "reader pos '1'": (lambda s: _columns(s)["pos"].__setitem__(0, "1"), "lane 0 reader pos"),
    "reader pass 10**30": (
        lambda s: _columns(s)["pass"].__setitem__(0, 10**30),
        "lane 0 reader pass",
    ),
    # a reader's None restarted its source at the stream's start: data read again, unsaid
    "reader None": (
        lambda s: _pack(s)["readers"].__setitem__(1, None),
        r"lane 0 pack.readers\[1\]",
    ),
    "delivered one short": (lambda s: _pack(s)["delivered"].pop(), "lane 0 pack.delivered"),
    "delivered negative": (
        lambda s: _pack(s)["delivered"][0].__setitem__(0, -5),
        r"lane 0 pack.delivered\[0\]",
    ),
    # counts are below 2**48: the first past it, in a count no other check reads
    "delivered 2**48": (
        lambda s: _pack(s)["delivered"][0].__setitem__(0, 2**48),
        r"lane 0 pack.delivered\[0\]",
    ),
    "active one short": (lambda s: _pack(s)["active"].pop(), "lane 0 pack.active"),
    "carry of another source": (
        lambda s: _pack(s).update(carry=[[[7, 0, 0, 0, 10]], []]),
        r"lane 0 pack.carry\[0\]",
    ),
    # sources are numbered from 0: of two, 2 is the first past them
    "carry of the source after the last": (
        lambda s: _pack(s).update(carry=[[[2, 0, 0, 0, 10]], []]),
        r"lane 0 pack.carry\[0\]",
    ),
    "carry ending before it starts": (
        lambda s: _pack(s).update(carry=[[[0, 0, 0, 10, 5]], []]),
        r"lane 0 pack.carry\[0\]",
    ),
    # a carry is written with its end: -1 (a bin packer's rows' "to the document's end") is
    # no carry's, and no row count would tell its document re-read longer
    "carry to its document's end": (
        lambda s: _pack(s).update(carry=[[[0, 0, 0, 0, -1]], []]),
        r"lane 0 pack.carry\[0\]",
    ),
    # a carry is one piece: unchecked, a second would be dropped unsaid as the lane restores
    "carry of two pieces": (
        lambda s: _pack(s).update(carry=[[[0, 0, 0, 0, 5], [0, 0, 1, 0, 5]], []]),
        r"lane 0 pack.carry\[0\]",
    ),
    # a piece is five ints: unchecked, one short or not a list would be a bare IndexError
    "piece one value short": (
        lambda s: _pack(s).update(packer={"bins": [[[0, 0, 0, 0]]], "ready": []}),
        "lane 0 pack.packer.bins",
    ),
    "piece a number": (
        lambda s: _pack(s).update(packer={"bins": [[5]], "ready": []}),
        "lane 0 pack.packer.bins",
    ),
    # only the int -1 runs to the document's end: -1.0 is no end a release writes
    "piece ending at -1.0": (
        lambda s: _pack(s).update(packer={"bins": [[[0, 0, 0, 0, -1.0]]], "ready": []}),
        "lane 0 pack.packer.bins",
    ),
    # an empty row said to hold tokens: a bare IndexError naming no field
    "tokens of an empty row": (
        lambda s: _pack(s).update(packer={"bins": [[]], "ready": [], "filled": [3]}),
        "lane 0 pack.packer.filled",
    ),
    "skipped a list": (lambda s: _pack(s).update(skipped=[1]), "lane 0 pack.skipped"),
    # a reason no release counts: it would be summed into stats() under no known key
    "skipped for an unknown reason": (
        lambda s: _pack(s).update(skipped={"too_long": 1, "cosmic rays": 2}),
        "lane 0 pack.skipped",
    ),
    "packer bins a number": (lambda s: _pack(s).update(packer={"bins": 3}), "lane 0 pack.packer"),
    # a bare TypeError ('int' object is not iterable) where the order of datasets was read
    "datasets a number": (lambda s: s.update(datasets=3), "  datasets: saved 3"),
    "datasets of numbers": (lambda s: s.update(datasets=[0, 1]), "  datasets: saved \\[0, 1\\]"),
    "datasets None": (lambda s: s.update(datasets=None), "  datasets: saved None"),
}


@pytest.fixture(scope="module")
def saved(tokenizer: Any) -> tuple[dict[str, Any], list[Any]]:
    """A state after 5 micro-batches of two lanes, and the batches that follow it."""

    def build() -> Pipeline:
        return small_pipeline(tokenizer, lanes=2, exhaustion="repeat", prefetch=0)

    pipeline = build()
    batches = iter(pipeline)
    for _ in range(5):
        next(batches)
    state = json.loads(json.dumps(pipeline.state_dict()))
    resumed = build()
    resumed.load_state_dict(copy.deepcopy(state))
    return state, keys(resumed, limit=6)


@pytest.mark.parametrize("edit", list(EDITS))
def test_an_edited_state_is_refused_naming_the_field(
    tokenizer: Any, saved: tuple[dict[str, Any], list[Any]], edit: str
) -> None:
    state, _ = saved
    change, field = EDITS[edit]
    state = copy.deepcopy(state)
    change(state)
    pipeline = small_pipeline(tokenizer, lanes=2, exhaustion="repeat", prefetch=0)
    with pytest.raises(StateMismatchError, match=field):
        pipeline.load_state_dict(state)  # the frame is checked here, the rest as lanes restore
        next(iter(pipeline))


def test_a_state_without_its_step_resumes_as_saved(
    tokenizer: Any, saved: tuple[dict[str, Any], list[Any]]
) -> None:
    """``step`` is derived from the lanes' turns: a state without it loads and resumes where
    the state with it does."""
    state, expected = saved
    state = copy.deepcopy(state)
    del state["step"]
    pipeline = small_pipeline(tokenizer, lanes=2, exhaustion="repeat", prefetch=0)
    pipeline.load_state_dict(state)
    assert keys(pipeline, limit=6) == expected
    # merged, the ranks' steps are their lanes' (not 0, refused beside lanes at turn 2)
    merged = merge_states([state])
    assert merged["step"] == saved[0]["step"]
    pipeline = small_pipeline(tokenizer, lanes=2, exhaustion="repeat", prefetch=0)
    pipeline.load_state_dict(merged)
    assert keys(pipeline, limit=6) == expected


def test_a_state_saved_before_the_first_batch_resumes_from_the_start(tokenizer: Any) -> None:
    """Its lanes are null (not begun, at turn 0) and its step 0: it loads, and the run starts
    where a fresh one does."""

    def build() -> Pipeline:
        return small_pipeline(tokenizer, lanes=2, exhaustion="repeat", prefetch=0)

    state = json.loads(json.dumps(build().state_dict()))
    assert set(state["lanes"].values()) == {None} and state["step"] == 0
    resumed = build()
    resumed.load_state_dict(state)
    assert keys(resumed, limit=4) == keys(build(), limit=4)


def test_a_count_at_the_last_value_below_2_48_loads(
    tokenizer: Any, saved: tuple[dict[str, Any], list[Any]]
) -> None:
    """Counts and positions are ints in [0, 2**48): 2**48 - 1 is taken (2**48 is refused,
    ``EDITS``)."""
    state = copy.deepcopy(saved[0])
    _pack(state)["delivered"][0][0] = 2**48 - 1
    pipeline = small_pipeline(tokenizer, lanes=2, exhaustion="repeat", prefetch=0)
    pipeline.load_state_dict(state)
    next(iter(pipeline))


def test_a_shuffled_lane_s_edited_state_is_refused_naming_where_the_field_lies() -> None:
    """Under ``shuffle`` a lane's packing state lies under ``pack.start``: errors name that
    path (they said ``pack.readers``, a key the state does not have there)."""
    data = Dataset.from_dict("d", {"ids": [[1 + i] * (3 + i % 5) for i in range(40)]})

    def build() -> Pipeline:
        source = StaticMixtureWorkSource([data], seed=3, exhaustion="repeat")
        recipe = Pipeline(source).options(canonical_replicas=1, prefetch=0)
        return recipe.pretokenized("ids").pack_flat(8, "wrap").shuffle(4).batch(1)

    pipeline = build()
    batches = iter(pipeline)
    for _ in range(6):
        next(batches)
    state = as_lists(json.loads(json.dumps(pipeline.state_dict())))
    start = _lane(state)["pack"]["start"]
    edits: dict[str, Edit] = {
        r"lane 0 pack\.start\.readers": lambda s: s["readers"].append(s["readers"][0]),
        r"lane 0 pack\.start\.delivered\[0\]": lambda s: s["delivered"][0].__setitem__(0, -1),
        r"lane 0 pack\.start: saved": lambda s: s.pop("active"),
    }
    for field, edit in edits.items():
        bad = copy.deepcopy(state)
        edit(_lane(bad)["pack"]["start"])
        with pytest.raises(StateMismatchError, match=field):
            resumed = build()
            resumed.load_state_dict(bad)
            next(iter(resumed))
    assert start["readers"]  # the state as saved resumes
    resumed = build()
    resumed.load_state_dict(state)
    assert next(iter(resumed)).input_ids.tolist() == next(batches).input_ids.tolist()


def _zeta_alpha(world_size: int | None = None, rank: int | None = None) -> Pipeline:
    """Two pre-tokenized datasets whose names are not in sorted order."""
    data = [
        Dataset.from_dict(name, {"ids": [[base + i] * (3 + i % 5) for i in range(40)]})
        for name, base in (("zeta", 1), ("alpha", 100))
    ]
    source = StaticMixtureWorkSource(data, {"zeta": 0.5, "alpha": 0.5}, seed=3)
    recipe = Pipeline(source).options(canonical_replicas=2, world_size=world_size, rank=rank)
    return recipe.pretokenized("ids").pack_flat(8, "wrap").batch(2)


def _alpha_zeta() -> Pipeline:
    """`_zeta_alpha`'s datasets, the other way round."""
    data = [
        Dataset.from_dict(name, {"ids": [[base + i] * (3 + i % 5) for i in range(40)]})
        for name, base in (("alpha", 100), ("zeta", 1))
    ]
    source = StaticMixtureWorkSource(data, {"alpha": 0.5, "zeta": 0.5}, seed=3)
    recipe = Pipeline(source).options(canonical_replicas=2)
    return recipe.pretokenized("ids").pack_flat(8, "wrap").batch(2)


def test_states_written_with_sorted_keys_resume_and_merge() -> None:
    """`json.dumps(sort_keys=True)` sorts the mixture's keys: a state without "datasets"
    (saved before the order was recorded) is not checked for the order, and `merge_states`
    compared each state's recorded order with the first state's sorted mixture."""
    first = _zeta_alpha()
    batches = iter(first)
    for _ in range(6):  # three whole steps of the two lanes
        next(batches)
    state = first.state_dict()
    expected = keys(batches, limit=6)
    stored = json.loads(json.dumps(state, sort_keys=True))
    assert list(stored["fingerprint"]["mixture"]) == ["alpha", "zeta"]
    del stored["datasets"]
    again = _zeta_alpha()
    again.load_state_dict(stored)
    assert keys(again, limit=6) == expected
    # unsorted, the mixture's keys still tell the order: a reordered pipeline is refused
    unsorted = json.loads(json.dumps(state))  # mixture keys: zeta, alpha
    del unsorted["datasets"]
    _zeta_alpha().load_state_dict(copy.deepcopy(unsorted))  # the same order: loads
    with pytest.raises(StateMismatchError, match="order of datasets"):
        _alpha_zeta().load_state_dict(unsorted)
    halves = []
    for rank in range(2):
        half = _zeta_alpha(world_size=2, rank=rank)
        half.load_state_dict(copy.deepcopy(state))
        halves.append(json.loads(json.dumps(half.state_dict(), sort_keys=True)))
    merged = _zeta_alpha()
    merged.load_state_dict(merge_states(halves))
    assert keys(merged, limit=6) == expected


def _module_entry(state: dict[str, Any]) -> object:
    return {"zephon": state}  # what PipelineDataModule.state_dict() gives Lightning to keep


def _stateful_dataloader_state(state: dict[str, Any]) -> object:
    from torchdata.stateful_dataloader import StatefulDataLoader

    loader = StatefulDataLoader(list(range(4)), batch_size=None)
    next(iter(loader))
    return loader.state_dict()


NOT_STATES: dict[str, tuple[Edit, str]] = {
    "a PipelineDataModule's checkpoint entry": (
        _module_entry,
        r"a dict with keys \['zephon'\].*load its 'zephon' entry",
    ),
    "a StatefulDataLoader's state": (
        _stateful_dataloader_state,
        r"a dict with keys \['_.*\(and \d+ more\)",
    ),
    # four keys are all shown, with no "(and 0 more)"
    "a training checkpoint of four entries": (
        lambda s: {"model": 1, "optimizer": 2, "epoch": 3, "lr": 4},
        r"a dict with keys \['model', 'optimizer', 'epoch', 'lr'\]\"",
    ),
    "the state as JSON text": (json.dumps, r"a str.*json\.loads"),
    "None": (lambda s: None, "a NoneType"),
}


@pytest.mark.parametrize("given", list(NOT_STATES))
def test_an_object_that_is_no_state_is_refused_saying_what_it_is(
    tokenizer: Any, saved: tuple[dict[str, Any], list[Any]], given: str
) -> None:
    """Each was refused as 'version: saved None, live 1': a state of another release."""
    from zephon_torch.torch import DataLoader

    make, described = NOT_STATES[given]
    obj = make(copy.deepcopy(saved[0]))
    for load in (
        small_pipeline(tokenizer, lanes=2, exhaustion="repeat", prefetch=0).load_state_dict,
        DataLoader(small_pipeline(tokenizer, lanes=2, exhaustion="repeat")).load_state_dict,
        lambda s: merge_states([s]),
    ):
        with pytest.raises(StateMismatchError, match=described) as refused:
            load(obj)  # type: ignore[arg-type]
        assert "a zephon_torch state" in str(refused.value)
        assert "version" not in refused.value.mismatches


def test_merging_no_state_is_a_config_error() -> None:
    """A bare ValueError before: the README promises the library's own error types."""
    from zephon_torch import ConfigError

    with pytest.raises(ConfigError, match="needs at least one state"):
        merge_states([])


def test_a_changed_exhaustion_is_one_difference_not_two(
    tokenizer: Any, saved: tuple[dict[str, Any], list[Any]]
) -> None:
    # 'repeat' has no passes: listing `passes: saved None, live {...}` beside the exhaustion
    # line sent a user looking for a passes setting they never changed
    state, _ = saved
    pipeline = small_pipeline(tokenizer, lanes=2, exhaustion="stop", prefetch=0)
    with pytest.raises(StateMismatchError) as caught:
        pipeline.load_state_dict(copy.deepcopy(state))
    assert list(caught.value.mismatches) == ["exhaustion"]
    assert "saved 'repeat', live 'stop'" in str(caught.value)


def test_the_merged_final_states_of_ranks_that_ended_apart_say_the_run_s_step() -> None:
    """Plain per-rank pipelines under "stop" end turns apart; the merge said the shortest
    rank's step (1 here) for a run of 10 global steps (review F)."""
    import numpy as np

    docs = [np.arange(n, dtype=np.int32) + 10 for n in (40, 3, 3, 3)]  # lane 0: the long one
    dataset = Dataset.from_dict("a", {"input_ids": docs})

    def build(**topology: int) -> Pipeline:
        source = StaticMixtureWorkSource([dataset], seed=0, shuffle=False)
        pipeline = Pipeline(source).options(canonical_replicas=4, **topology)
        return pipeline.pretokenized("input_ids").pack_flat(4).batch(1)

    one = build()
    steps = len(list(one)) // 4
    states = []
    for rank in range(2):
        pipeline = build(world_size=2, rank=rank)
        list(pipeline)
        states.append(pipeline.state_dict())
    assert sorted(s["step"] for s in states) == [1, steps] and steps == 10
    merged = merge_states(states)
    assert merged["step"] == one.state_dict()["step"] == steps
    resumed = build()
    resumed.load_state_dict(merged)
    assert list(resumed) == []  # nothing left, as for the one-process run


def test_a_state_of_other_canonical_replicas_is_refused_for_that_alone() -> None:
    """Loaded where L differs, the refusal also listed the lanes the new L needs, advising to
    merge every rank's states with merge_states: no merge gives lanes a run of another L
    never had."""

    def recipe(lanes: int) -> Pipeline:
        data = [Dataset.from_dict("d", {"ids": [[1 + i] * (3 + i % 5) for i in range(40)]})]
        pipeline = Pipeline(StaticMixtureWorkSource(data, seed=3))
        return pipeline.options(canonical_replicas=lanes).pretokenized("ids").pack_flat(8).batch(2)

    # fewer lanes than the new L, and more: lanes 2 and 3 of four are past two lanes' numbers,
    # which says nothing the differing L does not
    for saved_lanes, live_lanes in ((2, 4), (4, 2)):
        saved = recipe(saved_lanes)
        batches = iter(saved)
        for _ in range(4):
            next(batches)
        with pytest.raises(StateMismatchError) as raised:
            recipe(live_lanes).load_state_dict(saved.state_dict())
        assert set(raised.value.mismatches) == {"canonical_replicas"}
        assert "merge_states" not in str(raised.value)


def test_ranks_states_merged_in_stages_are_those_merged_at_once(tokenizer: Any) -> None:
    """Two ranks' lanes of four (half the lanes) merge alone: they are no world's ranks to
    compare for step, and their merge with the other half's is the merge of all four."""

    def ranked(rank: int) -> Pipeline:
        return small_pipeline(tokenizer, lanes=4, world_size=4, rank=rank, prefetch=0)

    states = []
    for rank in range(4):
        pipeline = ranked(rank)
        batches = iter(pipeline)
        for _ in range(2):
            next(batches)
        states.append(pipeline.state_dict())
    staged = merge_states([merge_states(states[:2]), merge_states(states[2:])])
    assert staged == merge_states(states)
