"""Read one source of one lane: pointer stream in, tokenized documents out, in stream order.

A ``DocumentReader`` walks its lane's pure pointer stream, hands chunks of pointers to the
shared runner ahead of need, and returns results strictly in order. Its state is the stream
position of the next document it has not yet *returned*: read-ahead is never state.
"""

from __future__ import annotations

import itertools
import time
from collections import deque
from collections.abc import Callable, Iterable
from concurrent.futures import Future
from typing import Any

import numpy as np
from torchdata.nodes import BaseNode

from zephon_torch._state import state_dict_of, state_int
from zephon_torch.errors import DataError, StateMismatchError
from zephon_torch.ops._barren_run import BarrenRun, gave_up_error
from zephon_torch.ops._runner import Runner
from zephon_torch.ops._runner_worker import Chunk
from zephon_torch.ops.columns import TokenChain, TokenChunk
from zephon_torch.ops.document import Document
from zephon_torch.work.mixture import Exhaustion
from zephon_torch.work.pointers import PointerLayout, PointerSpan, lane_length

_VIEW_GROWTH = 256  # chunks of stored views grow to this many times chunk_docs
_VIEW_TOKENS = 1 << 22  # and to about this many tokens
_FULL_SHARE = 0.25  # a source of this share of the mixture or more reads fully ahead


def read_ahead_scale(share: float) -> float:
    """The part of the full read-ahead (chunks in flight, and how far chunks grow) that a
    reader of a source of ``share`` of the mixture keeps: all of it from a quarter up, less in
    proportion below. A source is read about as fast as its share, so this keeps what each
    lane holds read ahead about that of four full sources, plus one chunk a source, where a
    full read-ahead for every source grew with their number: 300 sources on 8 lanes read
    960,000 documents ahead (every one of them, four passes over) to deliver 6,400 in 20
    steps, 18 times as slow as 10 sources of the same rows, and 1.4 GB."""
    return min(1.0, share / _FULL_SHARE)


class DocumentReader(BaseNode[Document]):
    """In-order, read-ahead reader of one (lane, source) pointer stream.

    Args:
        source: the source index in the work source.
        layout: the dataset's pure pointer layout.
        lane: this lane's id.
        num_lanes: the canonical lane count L.
        exhaustion: ``"stop"`` after ``passes`` passes, or ``"repeat"``.
        runner: where chunks run.
        chunk_docs: pointers per task.
        ahead: tasks kept in flight by a source of a quarter or more of the mixture.
        share: the source's target share of the mixture: below a quarter, fewer tasks are
            kept in flight and chunks grow less, in proportion, down to one task of
            ``chunk_docs`` (see ``read_ahead_scale``).

    State:
        ``{"pass": int, "pos": int}``: the next document to return.

    Resume guarantee: exact; in-flight chunks are discarded and re-read.
    """

    def __init__(
        self,
        *,
        source: int,
        layout: PointerLayout,
        lane: int,
        num_lanes: int,
        exhaustion: Exhaustion,
        runner: Runner,
        passes: int = 1,
        chunk_docs: int,
        ahead: int,
        share: float = 1.0,
    ) -> None:
        super().__init__()
        self.source = source
        self.layout = layout
        self.lane = lane
        self.num_lanes = num_lanes
        self.exhaustion = exhaustion
        self.passes = passes
        self.runner = runner
        self.chunk_docs = max(1, chunk_docs)
        self._full_ahead = max(1, ahead)
        self._lane_rows = lane_length(num_rows=layout.num_rows, lane=lane, num_lanes=num_lanes)
        self._futures: deque[Future[Chunk]] = deque()
        self._spans: deque[PointerSpan] = deque()  # where each future's chunk was read from
        self._filtered = BarrenRun("were dropped by the filters")
        # told of each chunk's documents the filters dropped (arrays of shards and rows): the
        # packer counts them with those that gave no token (see MixPack)
        self.on_filtered: Callable[[Any, Any], None] | None = None
        self._chunk: Chunk = []  # the chunk being returned, from document _index on
        self._index = 0
        chain = runner.chain
        self.columnar = isinstance(chain, TokenChain)  # chunks are TokenChunks
        # inline chunks of stored views cost no copy: they grow further (see _top_up), views
        # of mapped files, which hold no decoded shard, faster still and uncapped
        self._views = self._mapped = False
        if isinstance(chain, TokenChain) and chain.eos_token_id is None:
            self._views = runner.kind == "inline"
            self._mapped = self._views and chain.datasets[source].maps_token_ids()
        self.set_share(share)
        self._seen = [0, 0]  # documents and tokens of the view chunks returned so far
        self._next: tuple[int, int] = (0, 0)  # next document to return
        self.filtered = 0  # documents the plain filters dropped before it
        self._cursor: tuple[int, int] | None = (0, 0)  # next pointer to submit; None: done
        self.waited = 0.0  # seconds spent waiting for chunks (a stall on the runner)
        self._submitted = 0
        self._walked: tuple[int, int] | None = None  # where _prefetch_ahead last walked from
        # documents a saved state's open rows hold, read ahead on the runner (see `fetch`)
        self._refetched: dict[tuple[int, int], Future[Chunk]] = {}

    def set_share(self, share: float) -> None:
        """Read ahead (chunks in flight, how far chunks grow) as a source of ``share`` of the
        mixture does (``read_ahead_scale``). The lane's packer sets a source's share among
        those not spent: one left alone at the end of a run reads fully ahead."""
        scale = read_ahead_scale(share)
        self.ahead = max(1, round(self._full_ahead * scale))
        self._growth = max(1, round((_VIEW_GROWTH if self._views else 8) * scale))

    def reset(self, initial_state: dict[str, Any] | None = None) -> None:
        """Start at the beginning, or at the saved stream position."""
        super().reset(initial_state)
        for future in self._futures:
            future.cancel()
        self._futures.clear()
        self._spans.clear()
        self._filtered.clear()
        self._chunk, self._index = [], 0
        self._submitted = 0
        self._walked = None
        if initial_state is None:
            start, self.filtered = (0, 0), 0
        else:
            state = state_dict_of(initial_state, ("pass", "pos"), "reader")
            start = (state_int(state["pass"], "reader pass"), state_int(state["pos"], "reader pos"))
            self.check_position(*start)
            # absent from states saved before it was counted
            self.filtered = state_int(state.get("filtered", 0), "reader filtered")
        self._next = start
        self._cursor = self._normalise(start)

    def check_position(self, pass_index: int, pos: int, *, document: bool = False) -> None:
        """Refuse a saved position past this lane's stream: past its rows (at most their
        count, where a pass ends; below it for a ``document``'s), or, for a finite stream, in
        a pass past its last. Such a position (an edited state) skipped documents, or ended
        the lane, without a word; a packer's piece there failed with an IndexError."""
        finite = self.exhaustion != "repeat"
        end = self._lane_rows - 1 if document else self._lane_rows
        if not 0 <= pos <= end or pass_index < 0 or (finite and pass_index >= self.passes):
            last = self.passes - 1
            passes = (f" in pass 0 to {last}" if last else " in pass 0") if finite else ""
            what = "document" if document else "position"
            raise StateMismatchError(
                {
                    f"dataset {self.layout.name!r} {what}": (
                        {"pass": pass_index, "pos": pos},
                        f"a pos of 0 to {end} (this lane has {self._lane_rows} rows){passes}",
                    )
                }
            )

    @property
    def lane_rows(self) -> int:
        """Documents in one pass of this lane."""
        return self._lane_rows

    def unread(self) -> tuple[int, int]:
        """This lane's documents (over all its passes) not yet returned, and all of them;
        (0, 0) for a lane that never ends (``exhaustion="repeat"``)."""
        if self.exhaustion == "repeat":
            return 0, 0
        total = self.passes * self._lane_rows
        pass_index, pos = self._next
        return max(0, total - pass_index * self._lane_rows - pos), total

    @property
    def same_each_pass(self) -> bool:
        """Whether every pass hands this lane the same documents: one lane, or no shuffle
        (with several lanes, each pass deals the dataset's documents to the lanes anew)."""
        return self.num_lanes == 1 or not self.layout.shuffle

    def get_state(self) -> dict[str, Any]:
        """The position of the next document to return, and the documents the plain filters
        dropped before it (exact at every position: counted as documents are returned)."""
        return {"pass": self._next[0], "pos": self._next[1], "filtered": self.filtered}

    def next(self) -> Document:
        """The next document of this lane's stream; StopIteration when exhausted."""
        chunk, index = self._chunk, self._index
        if index >= len(chunk):
            try:
                chunk, index = self._next_chunk(), 0
            except StopIteration:  # the filters dropped the rest of the stream, if any
                self.filtered += self.unread()[0]
                if self._lane_rows:
                    self._next = (self.passes - 1, self._lane_rows)
                raise
        doc = chunk[index]
        self._index = index + 1
        # the stream's positions between the last document returned and this one were dropped
        pass_index, pos = self._next
        self.filtered += (doc.pass_index - pass_index) * self._lane_rows + doc.pos - pos
        self._next = (doc.pass_index, doc.pos + 1)
        return doc

    def columns(self) -> tuple[TokenChunk, int] | None:
        """For a columnar reader: the chunk holding the next document and its index there
        (take documents from it, then ``advance``); None when the stream is spent."""
        if self._index >= len(self._chunk):
            try:
                self._next_chunk()
            except StopIteration:
                return None
        chunk = self._chunk
        assert isinstance(chunk, TokenChunk)
        return chunk, self._index

    def advance(self, index: int) -> None:
        """Mark the documents of ``columns()``'s chunk before ``index`` as returned."""
        chunk = self._chunk
        assert isinstance(chunk, TokenChunk)
        self._index = index
        self._next = (chunk.pass_index, chunk.pos + index)

    def _next_chunk(self) -> Chunk:
        """Wait for the next non-empty chunk and make it current (StopIteration: none left)."""
        while True:
            self._top_up()
            if not self._futures:
                raise StopIteration
            start = time.perf_counter()
            chunk = self._futures.popleft().result()
            span = self._spans.popleft()
            self.waited += time.perf_counter() - start
            if self._views:  # counted before the next chunk is sized
                assert isinstance(chunk, TokenChunk)
                self._seen[0] += len(chunk)
                self._seen[1] += chunk.ends[-1]
            self._top_up()
            if len(chunk):
                self._chunk, self._index = chunk, 0
                self._filtered.clear()
                if self.on_filtered is not None and len(chunk) < len(span):
                    assert isinstance(chunk, list)  # filters run on documents, not columns
                    kept = np.zeros(len(span), dtype=np.bool_)
                    kept[[doc.pos - span.pos for doc in chunk]] = True
                    self.on_filtered(span.shards[~kept], span.rows[~kept])
                return chunk
            if self._filtered.extend(self, span.shards, span.rows):  # filters are pure, too
                whole = (
                    f"a whole pass of lane {self.lane}" if self.same_each_pass else "the dataset"
                )
                raise DataError(
                    f"the filters dropped every document of {whole}: with "
                    "exhaustion='repeat' it would be read forever without giving a document",
                    dataset=self.layout.name,
                )
            if self._filtered.given_up(self):
                raise gave_up_error(self, self._filtered.dry)
            if self.on_filtered is not None:
                self.on_filtered(span.shards, span.rows)

    def read_ahead_for_resume(self, positions: Iterable[tuple[int, int]]) -> None:
        """Start reading, on the runner, the documents at ``positions`` (pass, pos) that a
        saved state's open rows hold: ``fetch`` then takes them, where each lane re-read its
        own one after another on the calling thread. A position past the stream is left to
        ``fetch``, whose caller refuses it."""
        for pass_index, pos in positions:
            try:
                self.check_position(pass_index, pos, document=True)
            except StateMismatchError:
                continue
            if (pass_index, pos) not in self._refetched:
                self._refetched[pass_index, pos] = self.runner.submit(
                    self.source, self._span_of(pass_index, pos)
                )

    def _span_of(self, pass_index: int, pos: int) -> PointerSpan:
        return self.layout.span(
            pass_index=pass_index, lane=self.lane, num_lanes=self.num_lanes, start=pos, count=1
        )

    def fetch(self, pass_index: int, pos: int) -> Document:
        """Re-read one document (to rebuild a packer's open bins): read ahead by
        ``read_ahead_for_resume``, else now, on the calling thread."""
        ahead = self._refetched.pop((pass_index, pos), None)
        if ahead is None:
            docs = self.runner.run_now(self.source, self._span_of(pass_index, pos))
        else:
            docs = ahead.result()
        if not len(docs):
            span = self._span_of(pass_index, pos)
            raise DataError(
                "a document held in a saved packing bin was dropped by a filter on resume; "
                "maps and filters must be pure functions of the row",
                dataset=self.layout.name,
                shard=self.runner.chain.datasets[self.source].shards[int(span.shards[0])].path,
                row=int(span.rows[0]),
            )
        return docs[0]

    def close(self) -> None:
        """Drop read-ahead and the current chunk (an inline reader's views of decoded shards
        reach millions of tokens, which a finished iteration kept until the next)."""
        for future in [*self._futures, *self._refetched.values()]:
            future.cancel()
        self._futures.clear()
        self._spans.clear()
        self._refetched.clear()
        self._chunk, self._index = [], 0

    def _normalise(self, at: tuple[int, int]) -> tuple[int, int] | None:
        pass_index, pos = at
        if pos < self._lane_rows:
            return at
        if self._lane_rows > 0 and (self.exhaustion == "repeat" or pass_index + 1 < self.passes):
            return (pass_index + 1, 0)
        return None

    def _top_up(self) -> None:
        while self._cursor is not None and len(self._futures) < self.ahead:
            pass_index, pos = self._cursor
            # chunks double from small (a fast first batch, little read ahead of a short run)
            # to 8x (fewer, larger tokenizer calls in the steady state); to 256x for token
            # columns read inline without an EOS to append, where a chunk holds views of the
            # stored ids and the per-chunk numpy work (locating its pointers, grouping its
            # reads) is what is left: with short documents, 1,024 a chunk spent 0.26 us a
            # document locating them, 8,192 a chunk 0.1 us. Such a chunk is capped at about
            # _VIEW_TOKENS tokens by the documents' mean length so far, so that decoded MDS
            # or LitData shards it holds views of are not kept much longer than needed. Views
            # of mapped files (`Dataset.maps_token_ids`) hold no decoded shard: their chunks
            # grow 8x a chunk, with no cap (a chunk of 858 documents of 4,887 tokens at the
            # cap against ones of up to 8,192: 23.0 against 21.4 us a [8, 2048] batch).
            step = 3 if self._mapped else 1  # chunks grow 2**step times a chunk
            size = self.chunk_docs * min(self._growth, 1 << (self._submitted * step))
            docs, tokens = self._seen
            if self._views and not self._mapped and tokens:  # hold about _VIEW_TOKENS tokens
                size = min(size, max(self.chunk_docs, _VIEW_TOKENS * docs // tokens))
            # counts only while chunks still grow: a count of every chunk of a long run made
            # an integer of one bit per chunk at each chunk (13 ms a chunk after 4M of them)
            self._submitted = min(self._submitted + 1, self._growth.bit_length())
            count = min(size, self._lane_rows - pos)
            span = self.layout.span(
                pass_index=pass_index,
                lane=self.lane,
                num_lanes=self.num_lanes,
                start=pos,
                count=count,
            )
            self._futures.append(self.runner.submit(self.source, span))
            self._spans.append(span)
            self._cursor = self._normalise((pass_index, pos + count))
            self._prefetch_ahead()

    def _prefetch_ahead(self) -> None:
        """Tell a remote dataset which shards this lane reads from its oldest chunk not yet
        read on, in order (this pass's, then the next pass's): the pointer stream is pure, so
        what comes next is known. The dataset downloads them ahead, as far as its part of the
        byte budget reaches (the remote datasets of a mixture share it). Walked from the
        read-ahead cursor instead, the shards of the chunks in flight came on top of the
        budget: 5-8 shards downloaded and unread with a budget of 3, in a review's run."""
        datasets = self.runner.chain.datasets
        dataset = datasets[self.source]
        if not dataset.remote or self._cursor is None:
            return
        unread = (span for future, span in zip(self._futures, self._spans) if not future.done())
        oldest = next(unread, None)
        pass_index, pos = self._cursor if oldest is None else (oldest.pass_index, oldest.pos)
        where = {"lane": self.lane, "num_lanes": self.num_lanes}
        # the walk (a stat of each shard, up to the budget) gives the same shards until the
        # cursor enters the next window: skip it until then
        walk = (
            pass_index,
            self.layout.first_upcoming_block(pass_index=pass_index, start=pos, **where),
        )
        if walk == self._walked:
            return
        self._walked = walk
        share = sum(d.remote for d in datasets)  # remote datasets read into the cache at once
        window = self.layout.window_at(pass_index=pass_index, start=pos, **where)
        dataset.check_window(window, share=share)
        upcoming: Iterable[int] = self.layout.upcoming_shards(
            pass_index=pass_index, start=pos, **where
        )
        following = self._normalise((pass_index, self._lane_rows))
        if following is not None:
            then = self.layout.upcoming_shards(pass_index=following[0], start=0, **where)
            upcoming = itertools.chain(upcoming, then)
        dataset.prefetch(upcoming, share=share)
