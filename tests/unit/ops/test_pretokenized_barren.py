"""Pre-tokenized sources that give a lane no token (every document dropped or empty, by the
length rules, filters or stateful filters) are refused or warned of, not read for ever; sources
with fewer documents than lanes are warned of once."""

from __future__ import annotations

import itertools
import threading
import warnings
from typing import Any

import pytest

from tests.unit.ops.test_stateful_filter import Stateless
from zephon_torch import DataError, Pipeline
from zephon_torch.io import Dataset
from zephon_torch.ops.stateful import StatefulFilter
from zephon_torch.work import StaticMixtureWorkSource, TokenEstimation


def test_a_repeated_source_whose_every_document_gives_no_tokens_is_refused_not_read_forever() -> (
    None
):
    short = Dataset.from_dict("short", {"ids": [[1, 2]] * 5 + [[]] * 3}, shard_size=3)
    fine = Dataset.from_dict("fine", {"ids": [[3] * 9] * 6})

    def pipeline(datasets: list[Dataset], **pack: Any) -> Pipeline:
        source = StaticMixtureWorkSource(datasets, exhaustion="repeat", seed=1)
        return Pipeline(source).pretokenized("ids").pack_flat(8, **pack).batch(2)

    for datasets in ([short], [fine, short]):  # alone, or starving a mixture's turn
        with pytest.raises(
            DataError,
            match=r"dataset 'short': every document of a whole pass of this lane is empty or "
            r"dropped by min_document_length=3: with exhaustion='repeat'",
        ):
            list(itertools.islice(pipeline(datasets, min_document_length=3), 50))
    with pytest.raises(DataError, match=r"is empty or dropped by long_documents='drop' above 8"):
        list(itertools.islice(pipeline([fine], long_documents="drop"), 50))
    # one document in a pass that gives tokens is enough, wherever the shuffle puts it
    rare = Dataset.from_dict("rare", {"ids": [[1]] * 9 + [[5] * 4]}, shard_size=4)
    batches = list(itertools.islice(pipeline([rare], min_document_length=3), 40))
    assert sum(b.num_tokens for b in batches) == 40 * 2 * 8


def _first_batch_or_error(pipeline: Pipeline) -> str:
    """The first batch's rows, or the error it raised, within 60 s (else "read forever")."""
    said: list[str] = []

    def first() -> None:
        try:
            said.append(str(next(iter(pipeline)).input_ids.tolist()))
        except DataError as error:
            said.append(str(error))

    thread = threading.Thread(target=first, daemon=True)
    thread.start()
    thread.join(60)
    return said[0] if said else "read forever"


@pytest.mark.parametrize("lanes", [1, 2, 4])
def test_a_source_the_filters_and_the_length_rules_share_out_is_refused_not_read_forever(
    lanes: int,
) -> None:
    """With several shuffled lanes, the filters' run and the length rules' run each met only
    their own rows, so neither ever met every row: the rank read for ever, with no batch and
    no error. With one lane, the error named the length rule alone."""
    good = Dataset.from_dict("good", {"ids": [[1, 2, 3]] * 10})

    def pipeline(bad_rows: list[list[int]], **pack: Any) -> Pipeline:
        bad = Dataset.from_dict("bad", {"ids": bad_rows})
        source = StaticMixtureWorkSource([good, bad], seed=1, exhaustion="repeat")
        recipe = Pipeline(source).options(canonical_replicas=lanes)
        recipe = recipe.filter(lambda row: int(row["ids"][0]) != 7, name="not_7")
        return recipe.pretokenized("ids").pack_flat(16, "wrap", **pack).batch(1)

    whole = "a whole pass of this lane" if lanes == 1 else "the dataset"
    shared = [[7] * 5, [8] * 40, [8] * 40, [9], [7]]  # filtered, too long, too short
    said = _first_batch_or_error(pipeline(shared, long_documents="drop", min_document_length=2))
    assert said == (
        f"dataset 'bad': every document of {whole} is empty or dropped by the filters or "
        "min_document_length=2 or long_documents='drop' above 16 tokens: with "
        "exhaustion='repeat' it would be read forever without giving a token"
    )
    # one row that gives tokens is enough, wherever the shuffles deal it
    rare = pipeline([*shared, [5] * 4], long_documents="drop", min_document_length=2)
    batches = list(itertools.islice(rare, 60))
    assert any(b.tokens_by_source()["bad"] for b in batches)


class _Curriculum(StatefulFilter):
    """Keeps one-token documents at once, longer ones after 25 documents."""

    name = "curriculum"

    def __init__(self) -> None:
        self.seen = 0

    def keep(self, tokens: Any, source: str) -> bool:
        self.seen += 1
        return len(tokens) <= 1 or self.seen > 25

    def state_dict(self) -> dict[str, Any]:
        return {"seen": self.seen}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.seen = state["seen"]


def test_a_stateful_filter_that_keeps_a_good_document_later_is_read_on() -> None:
    """The packer's run counted only what the filter let through: two passes of one-token
    documents, dropped by the length rule, were taken for a proof, though the filter keeps
    the long document from its third pass on."""
    data = Dataset.from_dict("d", {"ids": [[1]] * 9 + [[5] * 6]})
    source = StaticMixtureWorkSource([data], exhaustion="repeat", seed=0)
    recipe = Pipeline(source).pretokenized("ids").stateful_filter(lambda lane: _Curriculum())
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the rows in a row that gave no token are warned of
        batches = list(itertools.islice(recipe.pack_flat(4, min_document_length=2).batch(1), 3))
    assert [b.input_ids.tolist() for b in batches] == [[[5] * 4]] * 3


class _KeepAll(Stateless):
    name = "keep_all"

    def keep(self, tokens: Any, source: str) -> bool:
        return True


def test_a_source_a_stateful_filter_lets_through_whole_and_the_rules_drop_is_refused() -> None:
    """Exempting every source beneath a stateful filter from the proof made a source that the
    filter never rejects, and the length rule drops whole, read for ever."""
    short = Dataset.from_dict("short", {"ids": [[1]] * 9})
    source = StaticMixtureWorkSource([short], exhaustion="repeat", seed=0)
    recipe = Pipeline(source).pretokenized("ids").stateful_filter(lambda lane: _KeepAll())
    said = _first_batch_or_error(recipe.pack_flat(4, min_document_length=2).batch(1))
    assert said.startswith("dataset 'short': every document of a whole pass of this lane is ")


def test_pack_sequences_names_its_own_rule_for_a_source_it_drops_whole() -> None:
    """It named `long_documents='drop'`, a setting pack_sequences has no argument for."""
    long = Dataset.from_dict("d", {"ids": [[5] * 40] * 4})
    source = StaticMixtureWorkSource([long], exhaustion="repeat")
    pipeline = Pipeline(source).pretokenized("ids").pack_sequences(16).batch(1)
    assert _first_batch_or_error(pipeline) == (
        "dataset 'd': every document of a whole pass of this lane is empty or dropped by "
        "pack_sequences, which drops documents above max_length=16: with exhaustion='repeat' "
        "it would be read forever without giving a token"
    )


@pytest.mark.parametrize("rule", [0, 1])
def test_empty_documents_do_not_count_as_documents_delivered(rule: int) -> None:
    """Under document shares an empty document counted as one delivered (with
    min_document_length=0): a source with every other document empty got 0.33 of the
    documents for a 0.5 target."""
    full = Dataset.from_dict("full", {"ids": [[10000 + i % 7] * 5 for i in range(100)]})
    holey = [[20000] * 5 if i % 2 else [] for i in range(100)]
    datasets = [full, Dataset.from_dict("holey", {"ids": holey})]
    source = StaticMixtureWorkSource(datasets, seed=1, exhaustion="repeat")
    pipeline = Pipeline(source).pretokenized("ids").pack_flat(50, min_document_length=rule)
    begun = {"full": 0, "holey": 0}
    for batch in itertools.islice(pipeline.batch(4), 100):
        for names, starts in zip(batch.row_sources(), batch.starts_document):
            for name, start in zip(names, starts):
                begun[name] += start
    assert abs(begun["full"] - begun["holey"]) <= 1


def test_several_shuffled_lanes_read_on_through_passes_that_deal_a_lane_only_dropped_rows() -> None:
    """Each pass deals a dataset's documents to the lanes anew: a lane may draw only dropped
    documents for several passes and a good one after. That was refused as read forever."""
    big = Dataset.from_dict("big", {"ids": [[1000 + d] * 30 for d in range(50)]})
    small = Dataset.from_dict("small", {"ids": [[7], [9] * 20]})  # the first is dropped
    source = StaticMixtureWorkSource(
        [big, small],
        {"big": 0.5, "small": 0.5},
        seed=0,
        token_estimation=TokenEstimation(calibration_documents=1),
        exhaustion="repeat",
    )
    pipeline = (
        Pipeline(source)
        .options(canonical_replicas=2)
        .pretokenized("ids")
        .pack_flat(16, min_document_length=2)
        .batch(1)
    )
    small_tokens = {0: 0, 1: 0}
    for batch in itertools.islice(pipeline, 400):
        small_tokens[batch.lane] += batch.tokens_by_source()["small"]
    assert min(small_tokens.values()) > 0
    assert pipeline.stats()["skipped_documents"]["too_short"] > 0
    # a source none of whose documents gives a token is refused once a run met every row
    barren = Dataset.from_dict("barren", {"ids": [[7]] * 40 + [[]] * 9}, shard_size=7)
    source = StaticMixtureWorkSource([barren], seed=0, exhaustion="repeat")
    stuck = Pipeline(source).options(canonical_replicas=4).pretokenized("ids")
    with pytest.raises(DataError, match=r"'barren': every document of the dataset is empty or"):
        next(iter(stuck.pack_flat(16, min_document_length=2).batch(1)))


@pytest.mark.parametrize("exhaustion", ["repeat", "stop"])
def test_a_weighted_dataset_with_fewer_documents_than_lanes_is_warned_of(exhaustion: str) -> None:
    """Lanes past its row count never read it: under repeat its share of every global batch
    fell to rows/L of its weight (6 rows, 8 lanes: 0.375 for 0.5), without a word."""
    big = Dataset.from_dict("big", {"ids": [[1000 + d] * 30 for d in range(200)]})
    small = Dataset.from_dict("small", {"ids": [[9] * 40] * 6})

    def first_batches(lanes: int) -> None:
        source = StaticMixtureWorkSource(
            [big, small], {"big": 0.5, "small": 0.5}, seed=0, exhaustion=exhaustion
        )
        pipeline = Pipeline(source).options(canonical_replicas=lanes).pretokenized("ids")
        list(itertools.islice(pipeline.pack_flat(16).batch(1), 8))

    effect = "about 6/8 of its weight" if exhaustion == "repeat" else "reach only 6 lanes'"
    with pytest.warns(UserWarning, match=r"dataset 'small' has 6 documents, fewer than the 8 "):
        first_batches(8)
    with pytest.warns(UserWarning, match=effect):
        first_batches(8)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        first_batches(6)


def test_a_lane_past_a_dataset_s_rows_is_not_told_it_gave_no_token() -> None:
    """A lane past a dataset's row count reads none of it: its pass ends at once, with no
    document read, so none was empty or dropped, and the lane gets all the tokens of the
    other. Only the fewer-documents-than-lanes warning is given, not "gave a lane no token"
    (which says every document the lane read was empty or dropped)."""
    big = Dataset.from_dict("big", {"ids": [[1000 + d] * 30 for d in range(200)]})
    small = Dataset.from_dict("small", {"ids": [[9] * 40] * 6})
    source = StaticMixtureWorkSource(
        [big, small], {"big": 0.5, "small": 0.5}, seed=0, exhaustion="stop"
    )
    pipeline = Pipeline(source).options(canonical_replicas=8).pretokenized("ids")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        batches = list(pipeline.pack_flat(16).batch(1))
    said = [str(w.message) for w in caught]
    assert any("'small' has 6 documents, fewer than the 8 " in s for s in said), said
    assert not [s for s in said if "gave a lane no token" in s], said
    assert sum(b.num_tokens for b in batches) == 200 * 30 + 6 * 40


def test_a_finite_source_whose_documents_are_all_dropped_just_ends_with_them_counted() -> None:
    short = Dataset.from_dict("short", {"ids": [[1, 2]] * 4})
    fine = Dataset.from_dict("fine", {"ids": [[3] * 5] * 4})
    source = StaticMixtureWorkSource([short, fine], exhaustion="stop", passes=4, seed=1)
    pipeline = Pipeline(source).pretokenized("ids").pack_flat(10, min_document_length=3).batch(1)
    with pytest.warns(
        UserWarning, match=r"dataset 'short' gave a lane no token: every document of it"
    ):
        batches = list(pipeline)
    assert sum(b.num_tokens for b in batches) == 4 * 4 * 5
    skipped = {"too_long": 0, "too_short": 16, "empty": 0, "malformed": 0, "filtered": 0}
    assert pipeline.stats()["skipped_documents"] == skipped


class KeepLongerThan(Stateless):
    def __init__(self, length: int) -> None:
        self.length = length

    def keep(self, tokens: Any, source: str) -> bool:
        return len(tokens) > self.length


@pytest.mark.parametrize("how", ["min_document_length", "filter", "stateful_filter"])
def test_a_finite_run_that_gets_no_token_of_a_source_says_so(how: str) -> None:
    """A pass whose every document is dropped ended with no batch and no word (its skips
    counted only in a lane state that no batch carried); a source that gives a token in
    some lane is not warned of."""
    short = Dataset.from_dict("short", {"ids": [[1, 2]] * 6}, shard_size=4)
    source = StaticMixtureWorkSource([short], exhaustion="stop", seed=1)
    recipe = Pipeline(source).options(canonical_replicas=2)
    if how == "filter":
        recipe = recipe.filter(lambda row: len(row["ids"]) > 2)
    recipe = recipe.pretokenized("ids")
    if how == "stateful_filter":
        recipe = recipe.stateful_filter(lambda lane: KeepLongerThan(2))
    rules = {"min_document_length": 3} if how == "min_document_length" else {}
    pipeline = recipe.pack_flat(8, **rules).batch(1)  # type: ignore[arg-type]
    with pytest.warns(UserWarning, match=r"dataset 'short' gave a lane no token"):
        assert list(pipeline) == []
    source = StaticMixtureWorkSource([short], exhaustion="stop", seed=1)
    kept = Pipeline(source).options(canonical_replicas=2).pretokenized("ids")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert sum(b.num_tokens for b in kept.pack_flat(8, min_document_length=2).batch(1)) == 12


def test_many_datasets_with_fewer_documents_than_lanes_are_warned_of_at_once() -> None:
    """A mixture of hundreds of small sources gave a warning each (300 sources: 125 of them)."""
    big = Dataset.from_dict("big", {"ids": [[1000 + d] * 30 for d in range(200)]})
    smalls = [Dataset.from_dict(f"s{n}", {"ids": [[9] * 40] * (1 + n % 7)}) for n in range(9)]
    source = StaticMixtureWorkSource([big, *smalls], seed=0, exhaustion="repeat")
    pipeline = Pipeline(source).options(canonical_replicas=8).pretokenized("ids")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        list(itertools.islice(pipeline.pack_flat(16).batch(1), 8))
    few = [str(w.message) for w in caught if "fewer documents than the 8 lanes" in str(w.message)]
    assert len(few) == 1, few
    named = "'s0' (1), 's1' (2), 's2' (3), 's3' (4), 's4' (5) and 4 more"
    assert few[0].startswith(
        f"9 datasets have fewer documents than the 8 lanes (canonical_replicas): {named}."
    )
