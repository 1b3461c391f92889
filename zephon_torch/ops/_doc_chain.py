"""The fused per-document chain: fetch, then every per-document operator, on one chunk.

A `DocChain` is one picklable function of (source, span), so a ``runner="processes"`` pool
sends it to each worker once (see `_runner`). Where bad rows are skipped, each stage sets its
own bad rows apart, each try on copies of its documents, so the good documents go on together.
"""

from __future__ import annotations

import copy
import heapq
import time
from collections.abc import Callable, Sequence
from functools import partial
from operator import attrgetter
from typing import Any

from zephon_torch.errors import DataError
from zephon_torch.io import Dataset
from zephon_torch.ops.document import (
    DocOp,
    Document,
    OperatorClock,
    bad_document,
    index_named,
    skipping_bad,
)
from zephon_torch.ops.fetch import FetchOp
from zephon_torch.work.pointers import Pointer, PointerSpan


class DocChain(OperatorClock):
    """Fetch then every per-document operator, as one picklable function of a chunk.

    With ``skip_bad_rows`` (``bad_rows="skip"``), a row whose fetch or operators raise a
    ``DataError`` naming it comes out as a ``Document`` with that ``error`` and no tokens, in
    its place in the stream (``skipping_bad``); the rest of its chunk as without it.
    """

    def __init__(self, fetch: FetchOp, ops: Sequence[DocOp], *, skip_bad_rows: bool = False):
        self.fetch = fetch
        self.ops = tuple(ops)
        self.skip_bad_rows = skip_bad_rows
        super().__init__(["fetch"] + [str(op.fingerprint()["kind"]) for op in self.ops])

    @property
    def datasets(self) -> tuple[Dataset, ...]:
        """The datasets read, by source index."""
        return self.fetch.datasets

    def __call__(self, source: int, span: PointerSpan) -> list[Document]:
        return self.run(source, span.pointers(), self.ops, timed=True)

    def run(
        self, source: int, pointers: list[Pointer], ops: Sequence[DocOp], *, timed: bool = False
    ) -> list[Document]:
        """The documents at ``pointers`` of ``source`` through ``ops`` (bad rows skipped where
        asked); ``timed``: each stage's time goes to the operators' clock."""
        start = time.perf_counter()
        docs = self._isolating(source, partial(self.fetch.fetch, source), pointers)
        marks = [(len(docs), time.perf_counter() - start)]
        for op in ops:
            start = time.perf_counter()
            docs = self._stage(source, op, docs)
            marks.append((len(docs), time.perf_counter() - start))
        if timed:
            self.record(marks)
        return docs

    def apply(self, source: int, ops: Sequence[DocOp], docs: list[Document]) -> list[Document]:
        """``docs`` of ``source`` through ``ops`` (bad rows skipped where asked)."""
        for op in ops:
            docs = self._stage(source, op, docs)
        return docs

    def _stage(self, source: int, op: DocOp, docs: list[Document]) -> list[Document]:
        """``op(docs)``. Where bad rows are skipped, documents skipped by an earlier stage pass
        it by in their places, and it sets its own bad rows apart (``_isolating``), each try
        on copies: each stage isolates its own, so the good documents go on together (a bad
        row found in reading leaves the tokenizer's batch whole)."""
        if not self.skip_bad_rows:
            return op(docs)
        skipped = [d for d in docs if d.error is not None]
        if skipped:
            docs = [d for d in docs if d.error is None]
        done = self._isolating(source, partial(_on_copies, op), docs)
        if not skipped:
            return done
        return list(heapq.merge(skipped, done, key=attrgetter("pos")))  # in stream order

    def _isolating(
        self, source: int, step: Callable[[list[Any]], list[Document]], items: list[Any]
    ) -> list[Document]:
        """``step(items)`` (``Pointer``s or ``Document``s); where bad rows are skipped, an item
        whose row raises its own ``DataError`` gives a document with that ``error`` and no
        tokens instead (``skipping_bad``)."""
        if not self.skip_bad_rows:
            return step(items)
        shards = self.datasets[source].shards

        def named(some: list[Any], error: DataError) -> int | None:
            return index_named(error, ((item.shard, item.row) for item in some), shards)

        return skipping_bad(step, items, partial(bad_document, source), named)


def _on_copies(
    step: Callable[[list[Document]], list[Document]], docs: list[Document]
) -> list[Document]:
    """``step`` over copies of ``docs`` (and of their rows' top level), which it may change:
    an operator sets its results on the documents it is given (``data``, ``tokens``), and a
    ``map`` may change its row in place, so a try that fails part way leaves ``docs`` as they
    were for the next (a map run twice on a row, or ids read from a row already cleared,
    otherwise)."""
    fresh = []
    for doc in docs:
        copied = copy.copy(doc)
        if isinstance(doc.data, dict):
            copied.data = dict(doc.data)
        fresh.append(copied)
    return step(fresh)
