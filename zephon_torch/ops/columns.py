"""Pre-tokenized documents as columns: a chunk of one source's token ids without an object per
document.

When nothing but the token field is used (no ``map``, ``filter`` or payload fields), a chunk of
pointers becomes a ``TokenChunk``: the token ids of each document (spans of the stored arrays
where the format allows, ``io._views.TokenSpans``) and where each lies. The packer takes
documents from it by index and makes a ``Document`` only where one must outlive the batch (a
cut document's rest). It is the same documents in the same order as the per-document chain, at
a fraction of the cost.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import numpy.typing as npt

from zephon_torch.errors import DataError
from zephon_torch.io import Dataset
from zephon_torch.io._projection import field_error, token_ids
from zephon_torch.io._views import TokenSpans
from zephon_torch.ops.document import (
    NO_TOKENS,
    Document,
    OperatorClock,
    index_named,
    skipping_bad,
)
from zephon_torch.ops.fetch import read_span, read_token_span
from zephon_torch.ops.pretokenized import with_eos
from zephon_torch.work.pointers import PointerSpan


@dataclass(slots=True)
class TokenChunk:
    """Consecutive documents of one source's lane stream: ``tokens[i]`` is the document at lane
    position ``pos + i`` of pass ``pass_index``, stored at ``(shards[i], rows[i])``."""

    source: int
    pass_index: int
    pos: int
    tokens: Sequence[npt.NDArray[Any]]  # kept as ``TokenSpans``
    shards: list[int]
    rows: list[int]
    # by index, why a row gave no document (``bad_rows="skip"``); its tokens are empty
    bad: dict[int, str] = field(default_factory=dict)
    # the spans' columns: tokens[i] is bases[i][firsts[i]:stops[i]], sizes[i] ids
    bases: list[npt.NDArray[Any]] = field(init=False)
    firsts: list[int] = field(init=False)
    stops: list[int] = field(init=False)
    sizes: list[int] = field(init=False)
    ends: list[int] = field(init=False)  # ends[i]: the tokens of documents 0..i-1 (from 0)
    smallest: int = field(init=False)  # the fewest tokens of a document (0 when empty)
    largest: int = field(init=False)  # the most

    def __post_init__(self) -> None:
        spans = self.tokens = TokenSpans.of(self.tokens)
        self.bases = spans.bases.tolist()
        self.firsts, self.stops = spans.firsts.tolist(), spans.stops.tolist()
        counts = spans.stops - spans.firsts
        self.sizes = counts.tolist()
        ends = np.zeros(len(counts) + 1, np.int64)
        np.cumsum(counts, out=ends[1:])
        self.ends = ends.tolist()
        # numpy's, not Python's: a third of a 7,000-document chunk's making (0.3 of 1 ms)
        self.smallest = int(counts.min()) if len(counts) else 0
        self.largest = int(counts.max()) if len(counts) else 0

    def __len__(self) -> int:
        return len(self.sizes)

    def __getitem__(self, i: int) -> Document:
        """The i-th document as an object (for the per-piece paths and saved carries)."""
        return Document(  # by position, the view made here: 0.53 us, where keywords took 0.65
            self.source,
            self.pass_index,
            self.pos + i,
            self.shards[i],
            self.rows[i],
            None,
            self.bases[i][self.firsts[i] : self.stops[i]],
            None,
            None,
            self.bad.get(i) if self.bad else None,  # error_of(i), without a call
        )

    def error_of(self, i: int) -> str | None:
        """Why the i-th row gave no document (``bad_rows="skip"``); None for a document."""
        return self.bad.get(i) if self.bad else None


class TokenChain(OperatorClock):
    """Pointers in, a ``TokenChunk`` out: each shard's ids read at once, as views of the stored
    ids where the format keeps them as 1-D integer arrays (``Dataset.read_tokens``: nothing to
    check), else rows read and their token field taken and validated (a 1-D integer array or
    list); the EOS id appended when asked. Picklable, so any runner can run it.

    Args:
        datasets: the work source's datasets, by source index.
        field: the row field holding token ids.
        eos_token_id: appended to every non-empty document when set.
        skip_bad_rows: a row whose reading or token field raises a ``DataError`` naming it
            gives no tokens, its error kept in the chunk's ``bad`` (``bad_rows="skip"``).
    """

    def __init__(
        self,
        datasets: tuple[Dataset, ...],
        field: str,
        eos_token_id: int | None,
        *,
        skip_bad_rows: bool = False,
    ) -> None:
        self.datasets = datasets
        self.field = field
        self.eos_token_id = eos_token_id
        self.skip_bad_rows = skip_bad_rows
        super().__init__(["fetch", "pretokenized"])

    def __call__(self, source: int, span: PointerSpan) -> TokenChunk:
        shards = span.shards.tolist()
        rows = span.rows.tolist()
        if not self.skip_bad_rows:
            tokens = self._ids(source, span, shards, rows)
            return TokenChunk(source, span.pass_index, span.pos, tokens, shards, rows)

        def step(indices: list[int]) -> list[npt.NDArray[Any] | str]:
            a, b = indices[0], indices[-1] + 1
            part = PointerSpan(span.pass_index, span.pos + a, span.shards[a:b], span.rows[a:b])
            return list(self._ids(source, part, shards[a:b], rows[a:b]))

        def named(indices: list[int], error: DataError) -> int | None:
            places = ((shards[i], rows[i]) for i in indices)
            return index_named(error, places, self.datasets[source].shards)

        # a row that raises its own DataError gives no tokens, its error kept in `bad`
        got = skipping_bad(step, list(range(len(span))), lambda _, error: str(error), named)
        bad = {i: ids for i, ids in enumerate(got) if isinstance(ids, str)}
        tokens = [NO_TOKENS if isinstance(ids, str) else ids for ids in got]
        return TokenChunk(source, span.pass_index, span.pos, tokens, shards, rows, bad)

    def _ids(
        self, source: int, span: PointerSpan, shards: list[int], rows: list[int]
    ) -> Sequence[npt.NDArray[Any]]:
        """Each document's ids (``shards`` and ``rows``: the span's, as lists), timed."""
        start = time.perf_counter()
        dataset, field = self.datasets[source], self.field
        # stored ids come as views, nothing to check; else rows are read and checked
        stored = read_token_span(dataset, span.shards, span.rows, field)
        read = read_span(dataset, span.shards, span.rows) if stored is None else []
        fetched = time.perf_counter()
        tokens = self._tokens(source, read, shards, rows) if stored is None else stored
        if self.eos_token_id is not None:
            eos = self.eos_token_id
            tokens = [with_eos(ids, eos) if len(ids) else ids for ids in tokens]
        count = len(span)
        self.record([(count, fetched - start), (count, time.perf_counter() - fetched)])
        return tokens

    def _tokens(
        self, source: int, read: list[dict[str, Any]], shards: list[int], rows: list[int]
    ) -> list[npt.NDArray[Any]]:
        """The token field of each row read, as 1-D integer arrays; a ``DataError`` names
        the first row whose field is missing or not token ids."""
        field = self.field
        try:
            values = [row[field] for row in read]
            if _all_token_arrays(values):
                return values
            return [token_ids(v) for v in values]
        except (KeyError, TypeError, ValueError):
            return [self._checked(row, source, shards[i], rows[i]) for i, row in enumerate(read)]

    def _checked(
        self, row: dict[str, Any], source: int, shard: int, position: int
    ) -> npt.NDArray[Any]:
        """``row``'s token ids, or a ``DataError`` naming the dataset, shard and row."""
        dataset = self.datasets[source]
        try:
            return token_ids(row[self.field])
        except (KeyError, TypeError, ValueError) as exc:
            raise DataError(
                field_error(self.field, row, exc),
                dataset=dataset.name,
                shard=dataset.shards[shard].path,
                row=position,
            ) from None


def _all_token_arrays(values: list[Any]) -> bool:
    """Whether every value is already a 1-D integer numpy array (``token_ids`` would return
    each unchanged)."""
    ndarray = np.ndarray
    return all(type(v) is ndarray and v.ndim == 1 and v.dtype.kind in "iu" for v in values)
