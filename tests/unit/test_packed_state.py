"""A saved state holds a bin packer's open rows and each lane's per-source counts packed:
small, read back exactly, and states of versions 2 (all lists) and 3 (reader columns) still
load."""

from __future__ import annotations

import copy
import json
import random
from typing import Any

import pytest

from tests.helpers import key
from zephon_torch import Pipeline
from zephon_torch._packed_rows import unpack_lanes
from zephon_torch._state import STATE_VERSION
from zephon_torch.io import Dataset
from zephon_torch.work import StaticMixtureWorkSource

_WORDS = [
    "the",
    "a",
    "of",
    "to",
    "and",
    "in",
    "is",
    "it",
    "that",
    "for",
    "on",
    "with",
    "as",
    "was",
    "by",
    "at",
]


def _short_documents(count: int) -> list[dict[str, str]]:
    rng = random.Random(3)
    return [
        {"text": " ".join(rng.choice(_WORDS) for _ in range(rng.randint(1, 4)))}
        for _ in range(count)
    ]


def _build(tokenizer: Any, rows: list[dict[str, str]], algorithm: str) -> Pipeline:
    source = StaticMixtureWorkSource(
        [Dataset.from_dict("short", rows, shard_size=500)], seed=1, exhaustion="repeat"
    )
    return (
        Pipeline(source)
        .options(canonical_replicas=2)
        .tokenize(tokenizer=tokenizer)
        .pack_flat(512, algorithm, num_bins=8)  # type: ignore[arg-type]
        .batch(2)
    )


def test_a_bin_packer_s_state_on_short_documents_is_packed_small_and_resumes_exactly(
    tokenizer: Any,
) -> None:
    """About 500 pieces a lane: 23 bytes each as lists, a few packed."""
    rows = _short_documents(6000)
    for algorithm in ("best_fit", "first_fit", "best_fit_wrap"):
        pipeline = _build(tokenizer, rows, algorithm)
        batches = iter(pipeline)
        for _ in range(6):
            next(batches)
        state = json.loads(json.dumps(pipeline.state_dict()))
        reference = [key(next(batches)) for _ in range(6)]
        as_lists = {**state, "lanes": unpack_lanes(state["lanes"])}
        pieces = sum(
            len(row)
            for lane in as_lists["lanes"].values()
            for row in lane["pack"]["packer"]["bins"] + lane["pack"]["packer"]["ready"]
        )
        assert pieces > 800, algorithm
        ends = [
            piece[4]
            for lane in as_lists["lanes"].values()
            for row in lane["pack"]["packer"]["bins"] + lane["pack"]["packer"]["ready"]
            for piece in row
        ]
        assert ends.count(-1) > 0.9 * len(ends), algorithm  # whole documents: to their end
        assert len(json.dumps(state)) * 5 < len(json.dumps(as_lists)), algorithm
        resumed = _build(tokenizer, rows, algorithm)
        resumed.load_state_dict(state)
        assert [key(batch) for _, batch in zip(range(6), resumed)] == reference, algorithm
        # as a release before the packing wrote it: version 2, rows as lists, the micro-batch
        # size in the fingerprint
        older = copy.deepcopy({k: v for k, v in as_lists.items() if k != "microbatch_size"})
        for lane in older["lanes"].values():
            del lane["pack"]["packer"]["filled"]  # rows' token counts: none before version 4
        older["version"] = 2
        older["fingerprint"] = {**state["fingerprint"], "microbatch_size": 2}
        resumed = _build(tokenizer, rows, algorithm)
        resumed.load_state_dict(older)
        assert [key(batch) for _, batch in zip(range(6), resumed)] == reference, algorithm


def test_a_later_release_s_state_is_refused_for_its_version_not_its_packing(
    tokenizer: Any,
) -> None:
    """A state of a later version whose rows this release cannot unpack (a packing of its
    own) is refused as a later release's, with the note to resume there, through a pipeline
    and a torch loader alike: not as a damaged packing (pack.packer.pieces)."""
    from zephon_torch import StateMismatchError
    from zephon_torch.torch import DataLoader

    rows = _short_documents(600)
    pipeline = _build(tokenizer, rows, "best_fit")
    batches = iter(pipeline)
    for _ in range(4):
        next(batches)
    state = json.loads(json.dumps(pipeline.state_dict()))
    state["version"] = STATE_VERSION + 1
    for lane in state["lanes"].values():
        lane["pack"]["packer"]["pieces"] = "zstd:" + lane["pack"]["packer"]["pieces"]
    for target in (
        _build(tokenizer, rows, "best_fit"),
        DataLoader(_build(tokenizer, rows, "best_fit")),
    ):
        with pytest.raises(StateMismatchError) as refused:
            target.load_state_dict(state)
        assert set(refused.value.mismatches) == {"version"}, type(target).__name__
        assert "saved by a later zephon_torch release" in str(refused.value)


def test_per_source_counts_are_written_packed_and_states_of_versions_2_to_4_still_load(
    tokenizer: Any,
) -> None:
    rng = random.Random(5)
    datasets = [
        Dataset.from_dict(
            f"source_{i}",
            [{"text": " ".join(rng.choice(_WORDS) for _ in range(30))} for _ in range(200)],
            shard_size=50,
        )
        for i in range(10)
    ]

    def build() -> Pipeline:
        source = StaticMixtureWorkSource(datasets, seed=2, exhaustion="repeat")
        return (
            Pipeline(source)
            .options(canonical_replicas=8)
            .tokenize(tokenizer=tokenizer)
            .pack_flat(256)
            .batch(1)
        )

    pipeline = build()
    batches = iter(pipeline)
    for _ in range(8 * 2):
        next(batches)
    state = json.loads(json.dumps(pipeline.state_dict()))
    reference = [key(next(batches)) for _ in range(8)]
    pack = state["lanes"]["3"]["pack"]
    assert set(pack) == {"sources", "skipped", "packer"}
    as_lists = {**state, "lanes": unpack_lanes(state["lanes"])}
    assert len(as_lists["lanes"]["3"]["pack"]["readers"]) == 10
    assert len(json.dumps(state["lanes"])) < 0.5 * len(json.dumps(as_lists["lanes"]))
    version_3 = copy.deepcopy(as_lists)  # reader positions as columns, the rest as lists
    for lane in version_3["lanes"].values():
        readers = lane["pack"]["readers"]
        lane["pack"]["readers"] = {k: [r[k] for r in readers] for k in ("pass", "pos", "filtered")}
    # version 4 named as such: the version this packing was first written under, which a
    # later release's bump of STATE_VERSION must go on reading
    for saved in (
        state,
        {**state, "version": 4},
        {**version_3, "version": 3},
        {**as_lists, "version": 2},
    ):
        resumed = build()
        resumed.load_state_dict(saved)
        assert [key(batch) for _, batch in zip(range(8), resumed)] == reference


def test_a_version_1_state_of_one_dataset_resumes_as_its_own_version() -> None:
    """One dataset is picked alike under both versions' rules (there is no other), so such a
    state of version 1 is taken, and continues as later versions'."""

    def recipe() -> Pipeline:
        data = [Dataset.from_dict("d", {"ids": [[1 + i] * (3 + i % 5) for i in range(40)]})]
        source = StaticMixtureWorkSource(data, seed=3, exhaustion="repeat")
        return Pipeline(source).options(canonical_replicas=2).pretokenized("ids").pack_flat(8)

    pipeline = recipe().batch(2)
    batches = iter(pipeline)
    for _ in range(4):  # two steps of the two lanes
        next(batches)
    state = pipeline.state_dict()
    expected = [key(next(batches)) for _ in range(8)]
    resumed = recipe().batch(2)
    resumed.load_state_dict({**state, "version": 1})
    assert [key(batch) for _, batch in zip(range(8), resumed)] == expected


def test_a_piece_to_its_document_s_end_starting_past_it_is_named_by_its_start() -> None:
    """A piece saved with end -1 (to the document's end) whose document is re-read shorter
    than its start: the message said 'up to token 3, but it has 3 tokens'."""
    import numpy as np

    from zephon_torch.ops.document import Document
    from zephon_torch.ops.packers import ChangedDocument, pieces_from_state

    def fetch(source: int, pass_index: int, pos: int) -> Document:
        return Document(source, pass_index, pos, 0, pos, None, np.arange(3))

    with pytest.raises(ChangedDocument, match="up to token 7, but it has 3 tokens"):
        pieces_from_state([[[0, 0, 0, 7, -1]]], fetch)
    assert [(p.start, p.end) for p in pieces_from_state([[[0, 0, 0, 1, -1]]], fetch)[0]] == [(1, 3)]


def test_packed_rows_are_little_endian_whatever_the_machine() -> None:
    """The packed pieces were written in the machine's byte order: a state saved on a
    big-endian host would read back elsewhere as other numbers (this one's pins the format)."""
    import base64
    import zlib

    import numpy as np

    from zephon_torch._packed_rows import pack_rows, unpack_rows

    packer = {"bins": [[[0, 1, 7, 0, 300]]], "ready": [[[1, 2, 9, 5, 6]]], "kind": "best_fit"}
    packed = pack_rows(packer)
    raw = zlib.decompress(base64.b64decode(packed["pieces"]))
    columns = [[0, 1], [1, 2], [7, 2], [0, 5], [300, 1]]  # positions as steps, ends as lengths
    assert raw == np.array(columns, dtype="<i8").tobytes()
    assert unpack_rows(packed) == packer
