"""``TokenSpans``: rows as spans of a few arrays are the same rows as their views, however they
are joined, reordered or cut; a ``TokenChunk`` made of them has the sums and extremes of its
documents' sizes; a batch copied from spans is the batch copied from their views."""

from __future__ import annotations

import itertools
from typing import Any

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from zephon_torch.io._views import TokenSpans
from zephon_torch.ops._copy import as_arrays, fill
from zephon_torch.ops.columns import TokenChunk


@st.composite
def spans(draw: st.DrawFn, bases: list[np.ndarray]) -> TokenSpans:
    """Rows of any of ``bases``, each from any first id to any stop at or after it."""
    rows = draw(st.lists(st.integers(0, len(bases) - 1), max_size=12))
    firsts, stops = [], []
    for k in rows:
        first = draw(st.integers(0, len(bases[k])))
        firsts.append(first)
        stops.append(draw(st.integers(first, len(bases[k]))))
    picked = np.fromiter((bases[k] for k in rows), object, len(rows))
    return TokenSpans(picked, np.array(firsts, np.int64), np.array(stops, np.int64))


def _bases(draw: st.DrawFn) -> list[np.ndarray]:
    dtypes = [np.int32, np.uint16, np.int64, np.uint8]
    return [
        np.arange(draw(st.integers(0, 30)), dtype=dtypes[k % len(dtypes)]) * 7 + k
        for k in range(draw(st.integers(1, 12)))
    ]


def _listed(rows: TokenSpans) -> list[list[int]]:
    return [row.tolist() for row in rows]


@settings(max_examples=200, deadline=None)
@given(data=st.data())
def test_joined_spans_are_the_groups_rows_in_the_order_asked(data: st.DataObject) -> None:
    bases = _bases(data.draw)
    groups = data.draw(st.lists(spans(bases), max_size=4))
    whole = [row for group in groups for row in _listed(group)]
    order = data.draw(st.permutations(range(len(whole))))
    joined = TokenSpans.joined(groups, np.array(order, np.int64))
    assert _listed(joined) == [whole[i] for i in order]
    assert [joined[i].tolist() for i in range(len(joined))] == _listed(joined)  # by index too
    assert all(any(a is base for base in bases) for a in joined.bases)  # no copies
    cut = slice(data.draw(st.integers(0, len(joined))), None)
    assert _listed(joined[cut]) == _listed(joined)[cut]


@settings(max_examples=200, deadline=None)
@given(data=st.data())
def test_a_chunk_of_spans_has_its_documents_sizes_sums_and_extremes(data: st.DataObject) -> None:
    bases = _bases(data.draw)
    rows = data.draw(spans(bases))
    arrays = list(rows)
    for made in (
        TokenChunk(0, 0, 0, rows, [0] * len(arrays), list(range(len(arrays)))),
        TokenChunk(0, 0, 0, arrays, [0] * len(arrays), list(range(len(arrays)))),
    ):
        sizes = [len(a) for a in arrays]
        assert made.sizes == sizes
        assert made.ends == list(itertools.accumulate(sizes, initial=0))
        assert (made.smallest, made.largest) == (min(sizes, default=0), max(sizes, default=0))
        assert [made[i].tokens.tolist() for i in range(len(made))] == [a.tolist() for a in arrays]
        assert [
            made.bases[i][made.firsts[i] : made.stops[i]].tolist() for i in range(len(made))
        ] == [a.tolist() for a in arrays]
    assert TokenSpans.of(rows) is rows


@settings(max_examples=200, deadline=None)
@given(data=st.data())
def test_a_batch_copied_from_spans_is_the_batch_copied_from_their_views(
    data: st.DataObject,
) -> None:
    """Spans of up to 12 bases in any order (more than the copy keeps asked for at once: the
    oldest given up and asked for again), among whole arrays."""
    bases = _bases(data.draw)
    rows = data.draw(spans(bases))
    parts: list[Any] = [(b, int(f), int(s)) for b, f, s in zip(rows.bases, rows.firsts, rows.stops)]
    for at in data.draw(st.lists(st.integers(0, len(parts)), max_size=3)):
        parts.insert(at, bases[at % len(bases)])
    expected = np.concatenate([*as_arrays(parts), np.zeros(0, np.int64)]).astype(np.int64)
    out = np.full(len(expected), -1, np.int64)
    top = data.draw(st.integers(0, 300))
    assert fill(parts, out, top) is bool(len(expected) and expected.max() > top)
    assert out.tolist() == expected.tolist()
