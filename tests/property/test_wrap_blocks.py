"""Wrap rows in blocks (``MixPack.wrap_rows``, ``BatchNode`` with ``plain=True``), from
documents as objects or as token columns (``ops.columns``), give exactly the batches and states
of the row-by-row path, and resume exactly after every batch."""

from __future__ import annotations

import pickle
from typing import Any

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.property.test_packers import build
from zephon_torch.ops.batch import Batch, BatchNode

MAX_BATCHES = 2000  # far above what the strategies below can fill


def batch_node(
    sources: list[list[int]],
    width: int,
    rows: int,
    plain: bool,
    columns: bool = False,
    **mix: Any,
) -> BatchNode:
    """``plain``: wrap rows in blocks; ``columns``: documents come as token columns."""
    weights = mix.pop("weights", None)
    mixing = mix.pop("mixing", "tokens")
    mixpack = build(sources, "wrap", width, 1, columns, **mix)
    if weights is not None:
        total = sum(weights[: len(sources)])
        mixpack.weights = tuple(w / total for w in weights[: len(sources)])
    mixpack.mixing = mixing
    return BatchNode(
        mixpack,
        microbatch_size=rows,
        max_length=width,
        lane=0,
        pad_id=7,
        source_names=[f"s{i}" for i in range(len(sources))],
        plain=plain,
    )


def run(node: BatchNode, state: dict[str, Any] | None = None) -> list[Batch]:
    """Batches until the first all-padding one (included), or MAX_BATCHES."""
    node.reset(state)
    out = []
    while len(out) < MAX_BATCHES:
        batch = next(node)
        out.append(batch)
        if batch.num_tokens == 0:
            break
    return out


def same(a: Batch, b: Batch) -> None:
    np.testing.assert_array_equal(a.input_ids, b.input_ids)
    # first, while a block's layout is still segments laid end to end (not yet cut into rows)
    assert a.tokens_by_source() == b.tokens_by_source()
    assert a.documents_by_source() == b.documents_by_source()
    assert pickle.loads(pickle.dumps(a.layout)) == b.layout
    assert a.lengths == b.lengths
    assert a.sources == b.sources
    assert a.starts_document == b.starts_document
    assert a.num_tokens == b.num_tokens == sum(map(sum, b.lengths))
    assert a.turn == b.turn
    assert a.state == b.state


sources_st = st.lists(st.lists(st.integers(1, 60), min_size=1, max_size=8), min_size=1, max_size=3)
# empty documents too, and up to four sources
mixed_st = st.lists(st.lists(st.integers(0, 30), min_size=1, max_size=8), min_size=1, max_size=4)


@settings(max_examples=200, deadline=None)
@given(
    sources=mixed_st,
    width=st.integers(1, 30),
    rows=st.integers(1, 5),
    weights=st.lists(st.integers(1, 5), min_size=4, max_size=4),
    mixing=st.sampled_from(["tokens", "documents"]),
    drop_short=st.integers(0, 5),
    drop_long=st.one_of(st.none(), st.integers(0, 60)),
)
def test_blocks_match_rows_and_either_resumes_from_the_others_states(
    sources: list[list[int]],
    width: int,
    rows: int,
    weights: list[int],
    mixing: str,
    drop_short: int,
    drop_long: int | None,
) -> None:
    mix = {
        "weights": weights,
        "mixing": mixing,
        "drop_shorter_than": drop_short,
        "drop_longer_than": drop_long,
    }
    blocks = run(batch_node(sources, width, rows, True, **dict(mix)))
    by_row = run(batch_node(sources, width, rows, False, **dict(mix)))
    columns = run(batch_node(sources, width, rows, True, True, **dict(mix)))
    assert len(blocks) == len(by_row) == len(columns) < MAX_BATCHES
    for a, b, c in zip(blocks, by_row, columns):
        same(a, b)
        same(c, b)
    kept = [n for lengths in sources for n in lengths if n >= drop_short]
    assert sum(b.num_tokens for b in blocks) == sum(
        n for n in kept if drop_long is None or n <= drop_long
    )
    last = len(by_row) - 1
    for cut in sorted({0, last // 3, last // 2, last - 1, last - 2} & set(range(last))):
        from_rows = run(batch_node(sources, width, rows, True, **dict(mix)), by_row[cut].state)
        from_blocks = run(batch_node(sources, width, rows, False, **dict(mix)), blocks[cut].state)
        state = by_row[cut].state
        columns_from_rows = run(batch_node(sources, width, rows, True, True, **dict(mix)), state)
        rows_from_columns = run(
            batch_node(sources, width, rows, False, **dict(mix)), columns[cut].state
        )
        assert len(from_rows) == len(from_blocks) == last - cut
        assert len(columns_from_rows) == len(rows_from_columns) == last - cut
        for w, x, y, z in zip(from_rows, from_blocks, columns_from_rows, by_row[cut + 1 :]):
            same(w, z)
            same(x, z)
            same(y, z)
        for y, z in zip(rows_from_columns, by_row[cut + 1 :]):
            same(y, z)


@settings(max_examples=40, deadline=None)
@given(sources=sources_st, width=st.integers(8, 40), rows=st.integers(1, 4))
def test_blocks_resume_after_every_batch(sources: list[list[int]], width: int, rows: int) -> None:
    full = run(batch_node(sources, width, rows, True, True))
    for cut, batch in enumerate(full[:-1]):
        resumed = run(batch_node(sources, width, rows, True, True), batch.state)
        assert len(resumed) == len(full) - cut - 1
        for a, b in zip(resumed, full[cut + 1 :]):
            same(a, b)


def test_a_long_document_of_a_single_source_is_one_pull_per_block() -> None:
    node = batch_node([[100, 3]], 10, 4, True)
    pulls = 0
    mixpack = node.source
    original = mixpack._pull  # type: ignore[attr-defined]

    def counted(max_tokens: int) -> Any:
        nonlocal pulls
        pulls += 1
        return original(max_tokens)

    mixpack._pull = counted  # type: ignore[attr-defined]
    batches = run(node)
    assert [b.num_tokens for b in batches] == [40, 40, 23, 0]
    assert batches[2].lengths == [[10], [10], [3], []]
    assert batches[2].starts_document == [[False], [False], [True], []]
    # 3 blocks of the 100-token document, the 3-token one, and the pull that finds the end
    assert pulls == 5
