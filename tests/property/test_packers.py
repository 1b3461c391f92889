"""Mix+pack: no token lost or duplicated, rows within max_length, exact resume at any cut."""

from __future__ import annotations

import json
from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from zephon_torch._packed_rows import pack_rows, unpack_rows
from zephon_torch.io import Dataset
from zephon_torch.ops._doc_chain import DocChain
from zephon_torch.ops._runner import Runner
from zephon_torch.ops.columns import TokenChain
from zephon_torch.ops.document import Document
from zephon_torch.ops.fetch import FetchOp
from zephon_torch.ops.pack import MixPack, PackedRow
from zephon_torch.ops.packers import make_packer
from zephon_torch.ops.read import DocumentReader
from zephon_torch.work.pointers import PointerLayout


class IdsField:
    """Pre-tokenized rows: the ``ids`` field holds the tokens."""

    def __call__(self, docs: list[Document]) -> list[Document]:
        for doc in docs:
            assert doc.data is not None
            doc.tokens = np.asarray(doc.data["ids"], dtype=np.int32)
        return docs

    def fingerprint(self) -> dict[str, Any]:
        return {"kind": "ids"}


def build(
    sources: list[list[int]],
    algorithm: str,
    max_length: int,
    bins: int,
    columns: bool = False,
    *,
    chunk_docs: int = 3,
    runner_kind: str = "threads",
    eos: int | None = None,
    exhaustion: str = "stop",
    **mix: Any,
) -> MixPack:
    """A real MixPack over in-memory datasets; document d of source s holds s*1e6 + d*1e3 + i."""
    datasets = tuple(
        Dataset.from_dict(
            f"s{s}",
            {
                "ids": [
                    [s * 1_000_000 + d * 1000 + i for i in range(n)] for d, n in enumerate(lengths)
                ]
            },
        )
        for s, lengths in enumerate(sources)
    )
    # columns: documents travel as token columns (TokenChain), else one object each
    chain = (
        TokenChain(datasets, "ids", eos) if columns else DocChain(FetchOp(datasets), [IdsField()])
    )
    runner = Runner(chain, parallelism=1, kind=runner_kind)  # type: ignore[arg-type]
    readers = [
        DocumentReader(
            source=s,
            layout=PointerLayout(
                name=d.name, shard_rows=(d.num_rows,), seed=0, window_shards=1, shuffle=False
            ),
            lane=0,
            num_lanes=1,
            exhaustion=exhaustion,  # type: ignore[arg-type]
            runner=runner,
            chunk_docs=chunk_docs,
            ahead=2,
        )
        for s, d in enumerate(datasets)
    ]
    weights = tuple(1 / len(sources) for _ in sources)
    max_pieces = mix.pop("max_pieces", None)
    packer = make_packer(algorithm, max_length, bins, None if algorithm == "wrap" else max_pieces)
    return MixPack(readers, weights, "tokens", packer, **mix)


def rows(node: MixPack, limit: int | None = None) -> list[PackedRow]:
    out: list[PackedRow] = []
    for row in node:
        out.append(row)
        if limit is not None and len(out) == limit:
            break
    return out


lengths_st = st.lists(st.lists(st.integers(1, 70), min_size=1, max_size=15), min_size=1, max_size=3)
algorithms = st.sampled_from(["wrap", "best_fit", "first_fit", "best_fit_wrap"])


@given(
    sources=lengths_st, max_length=st.integers(1, 32), algorithm=algorithms, bins=st.integers(1, 5)
)
@settings(max_examples=150, deadline=None)
def test_every_token_appears_once_in_order_and_rows_never_exceed_max_length(
    sources: list[list[int]], max_length: int, algorithm: str, bins: int
) -> None:
    node = build(sources, algorithm, max_length, bins)
    out = rows(node)
    assert all(0 < len(r.tokens) <= max_length for r in out)
    assert all(sum(r.lengths) == len(r.tokens) for r in out)
    if algorithm == "wrap":
        assert all(len(r.tokens) == max_length for r in out[:-1])
    flat = np.concatenate([r.tokens for r in out]).tolist()
    expected = [
        s * 1_000_000 + d * 1000 + i
        for s, lengths in enumerate(sources)
        for d, n in enumerate(lengths)
        for i in range(n)
    ]
    assert sorted(flat) == expected
    # within each document, tokens keep their order
    seen: dict[int, int] = {}
    for token in flat:
        doc, i = divmod(token, 1000)
        assert seen.get(doc, -1) == i - 1
        seen[doc] = i


@given(
    sources=lengths_st,
    max_length=st.integers(1, 32),
    algorithm=algorithms,
    bins=st.integers(1, 5),
    columns=st.booleans(),
    data=st.data(),
)
@settings(max_examples=150, deadline=None)
def test_restoring_the_state_at_a_random_cut_gives_the_same_remaining_rows(
    sources: list[list[int]],
    max_length: int,
    algorithm: str,
    bins: int,
    columns: bool,
    data: st.DataObject,
) -> None:
    full = [r.tokens.tolist() for r in rows(build(sources, algorithm, max_length, bins))]
    cut = data.draw(st.integers(0, len(full)))
    first = build(sources, algorithm, max_length, bins, columns)
    assert [r.tokens.tolist() for r in rows(first, cut)] == full[:cut] if cut else True
    state = first.get_state() if cut else first.state_dict()
    restored = build(sources, algorithm, max_length, bins, not columns)
    restored.reset(state)
    assert [r.tokens.tolist() for r in rows(restored)] == full[cut:]


def test_after_a_very_long_document_the_other_source_fills_the_next_rows() -> None:
    node = build([[200], [5] * 40], "wrap", 10, 1)
    out = rows(node)
    first_twenty = [set(r.sources) for r in out[:20]]
    # the 200-token document does not monopolise the first 20 rows: sources alternate
    assert sum(1 for s in first_twenty if 1 in s) >= 8


def test_best_fit_puts_a_piece_in_the_tightest_open_row() -> None:
    node = build([[6, 7, 3, 4]], "best_fit", 10, 3)
    out = rows(node)
    # 6 -> bin A, 7 -> bin B, 3 fits A (4 left) and B (3 left): B is tighter and becomes full
    assert out[0].lengths == [7, 3]
    # 6 -> A, 6 -> B; 3 fits both as tightly: the first open row takes it
    assert [r.lengths for r in rows(build([[6, 6, 3]], "best_fit", 10, 3))] == [[6, 3], [6]]


@given(
    sources=lengths_st,
    max_length=st.integers(2, 32),
    algorithm=algorithms,
    pieces=st.integers(1, 3),
)
@settings(max_examples=100, deadline=None)
def test_bin_packers_respect_max_sequences_per_bin(
    sources: list[list[int]], max_length: int, algorithm: str, pieces: int
) -> None:
    out = rows(build(sources, algorithm, max_length, 3, max_pieces=pieces))
    if algorithm != "wrap":
        assert all(len(r.lengths) <= pieces for r in out)
    flat = sorted(np.concatenate([r.tokens for r in out]).tolist())
    assert len(flat) == sum(n for lengths in sources for n in lengths)


def test_best_fit_wrap_cuts_at_most_one_document_per_row_instead_of_opening_rows() -> None:
    out = rows(build([[7, 7, 7, 7]], "best_fit_wrap", 10, 1))
    # 7 -> row A (3 left); the next 7 fills A with 3 and carries 4 into row B, and so on
    assert [len(r.tokens) for r in out] == [10, 10, 8]
    for r in out:
        ends = np.cumsum(r.lengths) - 1
        # a piece ending before its document's last token (i = 6) is a cut
        cut = [int(r.tokens[e]) % 1000 < 6 for e in ends]
        assert sum(cut) <= 1
    plain = rows(build([[7, 7, 7, 7]], "best_fit", 10, 1))
    assert [len(r.tokens) for r in plain] == [7, 7, 7, 7]


def test_first_fit_takes_the_first_open_row_that_fits() -> None:
    out = rows(build([[6, 7, 3]], "first_fit", 10, 3))
    # 6 -> A, 7 -> B, 3 fits A (first) though B is tighter
    assert [r.lengths for r in out] == [[6, 3], [7]]


@pytest.mark.parametrize(
    ("algorithm", "expected"),
    [("best_fit", [[7], [6, 4], [5]]), ("first_fit", [[6], [7], [5, 4]])],
)
def test_a_piece_that_fits_no_open_row_closes_the_fullest_or_the_oldest(
    algorithm: str, expected: list[list[int]]
) -> None:
    out = rows(build([[6, 7, 5, 4]], algorithm, 10, 2))
    # 6 -> A, 7 -> B; 5 fits neither and both rows are open: best_fit closes the fullest (B),
    # first_fit the oldest (A), and 5 opens row C; 4 then fits A and C (best_fit: A, the
    # tighter) or only C (first_fit: B holds 7)
    assert [r.lengths for r in out] == expected


def test_best_fit_wrap_cuts_into_the_roomiest_row_and_puts_the_rest_where_it_fits() -> None:
    out = rows(build([[5, 6, 7]], "best_fit_wrap", 10, 2))
    # 5 -> A (5 left), 6 -> B (4 left); 7 fits neither: its first 5 fill A, the roomiest, and
    # its last 2 go to B, where they fit, not to a new row
    assert [r.lengths for r in out] == [[5, 5], [6, 2]]
    # a single token of room is filled too, not closed with padding
    assert [r.lengths for r in rows(build([[9, 3]], "best_fit_wrap", 10, 1))] == [[9, 1], [2]]


@given(
    sources=lengths_st,
    max_length=st.integers(1, 32),
    algorithm=st.sampled_from(["best_fit", "first_fit", "best_fit_wrap"]),
    bins=st.integers(1, 4),
)
@settings(max_examples=60, deadline=None)
def test_a_bin_packer_never_holds_more_than_num_bins_open_rows(
    sources: list[list[int]], max_length: int, algorithm: str, bins: int
) -> None:
    node = build(sources, algorithm, max_length, bins)
    for _ in node:
        assert len(node.packer.get_state()["bins"]) <= bins


def test_long_and_short_documents_are_dropped_and_counted_when_asked() -> None:
    node = build([[3, 40, 5, 1, 12]], "best_fit", 10, 2, drop_longer_than=10, drop_shorter_than=2)
    out = rows(node)
    assert sorted(n for r in out for n in r.lengths) == [3, 5]
    assert node.get_state()["skipped"] == {"too_long": 2, "too_short": 1}  # zeros left out


@given(
    sources=st.lists(st.lists(st.integers(0, 40), min_size=1, max_size=20), min_size=1, max_size=3),
    max_length=st.integers(1, 16),
    algorithm=st.sampled_from(["best_fit", "first_fit", "best_fit_wrap"]),
    bins=st.integers(1, 8),
    max_pieces=st.one_of(st.none(), st.integers(1, 4)),
    columns=st.booleans(),
    data=st.data(),
)
@settings(max_examples=100, deadline=None)
def test_a_bin_packer_s_written_state_at_a_random_cut_resumes_exactly(
    sources: list[list[int]],
    max_length: int,
    algorithm: str,
    bins: int,
    max_pieces: int | None,
    columns: bool,
    data: st.DataObject,
) -> None:
    """Pieces to their documents' ends are written with end -1 and each row's tokens beside
    (``filled``): through JSON and the packed form, with empty documents, documents of exactly
    ``max_length``, many bins and ``max_sequences_per_bin``, the state resumes exactly and
    ``filled`` matches the rows at every row."""
    sources = [[max_length if n % 7 == 3 else n for n in lengths] for lengths in sources]

    def counts_match(node: MixPack) -> None:
        state = node.packer.get_state()
        held = node.packer.bins + list(node.packer.ready)  # type: ignore[union-attr]
        assert state["filled"] == [sum(p.length for p in row) for row in held]

    full = [
        r.tokens.tolist()
        for r in rows(build(sources, algorithm, max_length, bins, max_pieces=max_pieces))
    ]
    cut = data.draw(st.integers(0, len(full)))
    first = build(sources, algorithm, max_length, bins, columns, max_pieces=max_pieces)
    for done, _ in enumerate(first if cut else [], 1):
        counts_match(first)
        if done == cut:
            break
    state = json.loads(json.dumps(first.get_state() if cut else first.state_dict()))
    state["packer"] = unpack_rows(json.loads(json.dumps(pack_rows(state["packer"]))))
    restored = build(sources, algorithm, max_length, bins, not columns, max_pieces=max_pieces)
    restored.reset(state)
    counts_match(restored)
    assert [r.tokens.tolist() for r in rows(restored)] == full[cut:]


def test_a_state_holding_a_closed_row_not_yet_emitted_resumes_with_it() -> None:
    # 5 -> A, 7 -> B; 8 fits neither: its first 5 fill A and its last 3 fill B, so two rows
    # close at once, and the state after the first holds the second, closed but not emitted
    first = build([[5, 7, 8]], "best_fit_wrap", 10, 2)
    assert next(iter(first)).lengths == [5, 5]
    state = json.loads(json.dumps(first.get_state()))
    assert state["packer"]["ready"] and not state["packer"]["bins"]
    state["packer"] = unpack_rows(json.loads(json.dumps(pack_rows(state["packer"]))))
    restored = build([[5, 7, 8]], "best_fit_wrap", 10, 2)
    restored.reset(state)
    assert [r.lengths for r in rows(restored)] == [[7, 3]]
