"""Packers: no token lost or duplicated, rows within max_length, exact resume at any cut."""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from zephon_torch.ops.document import Document
from zephon_torch.ops.packers import Packer, Piece, make_packer


def make_docs(lengths: list[int]) -> list[Document]:
    docs = []
    for pos, n in enumerate(lengths):
        tokens = (np.arange(n, dtype=np.int32) + pos * 10_000).astype(np.int32)
        docs.append(Document(0, 0, pos, 0, pos, None, tokens))
    return docs


def rows_of(packer: Packer, docs: Iterator[Document]) -> list[list[Piece]]:
    out = []
    while (row := packer.next_row(lambda: next(docs, None))) is not None:
        out.append(row)
    return out


lengths_st = st.lists(st.integers(0, 70), min_size=0, max_size=40)
algorithms = st.sampled_from(["wrap", "best_fit"])


@given(lengths=lengths_st, max_length=st.integers(1, 32), algorithm=algorithms, bins=st.integers(1, 5))
@settings(max_examples=300, deadline=None)
def test_every_token_appears_once_and_rows_never_exceed_max_length(
    lengths: list[int], max_length: int, algorithm: str, bins: int
) -> None:
    docs = make_docs(lengths)
    rows = rows_of(make_packer(algorithm, max_length, bins), iter(docs))
    pieces = [p for row in rows for p in row]
    assert all(0 < sum(p.length for p in row) <= max_length for row in rows)
    for doc in docs:
        mine = sorted((p.start, p.end) for p in pieces if p.doc is doc)
        # the pieces of a document tile it exactly, once
        covered = 0
        for start, end in mine:
            assert start == covered
            covered = end
        assert doc.tokens is not None and covered == len(doc.tokens)
    if algorithm == "wrap":
        # wrap keeps document order and fills every row but the last
        flat = np.concatenate([np.concatenate([p.doc.tokens[p.start : p.end] for p in row]) for row in rows]) if rows else np.array([])
        expected = np.concatenate([d.tokens for d in docs]) if docs else np.array([])
        assert flat.tolist() == expected.tolist()
        assert all(sum(p.length for p in row) == max_length for row in rows[:-1])
    else:
        # best_fit never splits a document that fits in a row
        for doc in docs:
            n = 0 if doc.tokens is None else len(doc.tokens)
            if 0 < n <= max_length:
                assert sum(1 for p in pieces if p.doc is doc) == 1


@given(lengths=lengths_st, max_length=st.integers(1, 32), algorithm=algorithms, bins=st.integers(1, 5), data=st.data())
@settings(max_examples=300, deadline=None)
def test_restoring_the_state_at_a_random_cut_gives_the_same_remaining_rows(
    lengths: list[int], max_length: int, algorithm: str, bins: int, data: st.DataObject
) -> None:
    docs = make_docs(lengths)
    full = [[(p.doc.pos, p.start, p.end) for p in row] for row in rows_of(make_packer(algorithm, max_length, bins), iter(docs))]
    cut = data.draw(st.integers(0, len(full)))
    packer = make_packer(algorithm, max_length, bins)
    stream = iter(docs)
    consumed = 0

    def pull() -> Document | None:
        nonlocal consumed
        doc = next(stream, None)
        consumed += doc is not None
        return doc

    for _ in range(cut):
        packer.next_row(pull)
    state = packer.get_state()
    restored = make_packer(algorithm, max_length, bins)
    restored.set_state(state, lambda source, pass_index, pos: docs[pos])
    rest = rows_of(restored, iter(docs[consumed:]))
    assert [[(p.doc.pos, p.start, p.end) for p in row] for row in rest] == full[cut:]


def test_best_fit_puts_a_document_in_the_tightest_open_row() -> None:
    packer = make_packer("best_fit", 10, 3)
    docs = iter(make_docs([6, 7, 3, 4]))
    rows = rows_of(packer, docs)
    # 6 -> bin A, 7 -> bin B, 3 fits A (4 left) and B (3 left): B is tighter and becomes full
    assert [[p.doc.pos for p in row] for row in rows][0] == [1, 2]
