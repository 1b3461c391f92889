"""``wrap`` rows of plain documents a micro-batch at a time: ``MixPack.wrap_rows``.

The same decisions as row by row (``MixPack.next``); while one source alone is active there is
nothing to choose, so its piece may run on across row ends, and from a columnar reader its
documents are taken straight from its token chunks, found by a search in their running sums.
"""

from __future__ import annotations

import bisect
import itertools
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from zephon_torch._compiled import native as _native
from zephon_torch.ops._barren_run import BarrenRun
from zephon_torch.ops._copy import Part
from zephon_torch.ops.columns import TokenChunk
from zephon_torch.ops.packers import Packer, Piece, WrapPacker
from zephon_torch.ops.pretokenized import Owner
from zephon_torch.ops.read import DocumentReader

if TYPE_CHECKING:
    from zephon_torch.ops.stateful import FilteredReader


@dataclass(slots=True)
class RowBlock:
    """Consecutive ``wrap`` rows as segments laid end to end, the rows one after another (only
    the last row may be short): each segment's tokens (a view or a span: ``ops._copy.Part``),
    length, source, whether it begins its document, and its document (source, shard, row).
    Cut into rows only when read (see ``ops._row_layout.RowLayout``)."""

    parts: list[Part]
    sizes: list[int]
    sources: list[int]
    starts: list[bool]
    owners: list[Owner | None]
    tokens: int


class WrapBlocks:
    """``MixPack``'s block path for the ``wrap`` packer (see ``MixPack``)."""

    # set by ``MixPack``, whose counts, carries and readers the blocks move as its rows do
    readers: list[DocumentReader | FilteredReader]
    packer: Packer
    tokens: list[int]
    documents: list[int]
    active: list[bool]
    carry: list[Piece | None]
    drop_longer_than: int | None
    drop_shorter_than: int
    _barren_runs: list[BarrenRun]
    _refusals: list[tuple[TokenChunk, list[int]] | None]
    _columnar: bool
    _pull: Callable[[int], Piece | None]
    _cut: Callable[[int, Piece, int], Piece]
    _spent: Callable[[int], None]
    _admit: Callable[[int, int, int, int, str | None], bool]

    def wrap_rows(self, num_rows: int) -> RowBlock:
        """The next ``num_rows`` rows of the ``wrap`` packer in one block (fewer, the last one
        short, where the sources run out): the rows ``next()`` would give, for documents
        without chat masks or payloads, with no object per row.

        While a single source is active, its piece runs on across row ends, as the following
        rows would choose that source anyway: a long document costs one pull per block, not
        one per row, and the counts, carries and readers end the block exactly as row by row.
        From a columnar reader, that source's documents are then taken straight from its
        chunks (``_run``).
        """
        assert isinstance(self.packer, WrapPacker)
        width = self.packer.max_length
        total = num_rows * width
        parts: list[Part] = []
        owners: list[Owner | None] = []
        sizes: list[int] = []
        sources: list[int] = []
        starts: list[bool] = []
        filled = 0
        active = self.active
        while filled < total:
            if active.count(True) == 1:
                source = active.index(True)
                if self._columnar:
                    taken = self._run(source, total - filled, parts, owners, sizes, starts)
                    sources.extend([source] * (len(sizes) - len(sources)))
                    filled += taken
                    continue
                piece = self._pull(total - filled)
            else:
                piece = self._pull(width - filled % width)
            if piece is None:
                break
            filled += _add(piece, parts, owners, sizes, starts)
            sources.append(piece.doc.source)
        return RowBlock(parts, sizes, sources, starts, owners, filled)

    def _run(
        self,
        source: int,
        want: int,
        parts: list[Part],
        owners: list[Owner | None],
        sizes: list[int],
        starts: list[bool],
    ) -> int:
        """Up to ``want`` tokens of ``source``, the only active source: its carry, then the
        documents of its reader's current chunk, as ``_pull(want)`` would give them one by one
        (same rules, counts and carry), without an object per document. Returns the tokens
        taken; the source is marked inactive when its stream is spent."""
        taken = 0
        carried = self.carry[source]
        if carried is not None:  # the rest of a cut document
            taken = _add(self._cut(source, carried, want), parts, owners, sizes, starts)
            if taken == want:
                self.tokens[source] += taken
                return taken
        reader = self.readers[source]
        assert isinstance(reader, DocumentReader)
        got = reader.columns()
        if got is None:
            self.tokens[source] += taken
            self._spent(source)
            return taken
        chunk, i = got
        refused = self._refused(source, chunk)
        count = len(chunk)
        while i < count and taken < want:
            at = bisect.bisect_left(refused, i)
            stop = refused[at] if at < len(refused) else count  # the next refused document
            if stop > i:  # kept documents i..stop-1: taken by a search, not one by one
                more, i = self._take(
                    source, chunk, i, stop, want - taken, parts, owners, sizes, starts
                )
                taken += more
            else:  # counted as skipped, or as giving no tokens
                error = chunk.error_of(i)
                self._admit(source, chunk.sizes[i], chunk.shards[i], chunk.rows[i], error)
                i += 1
        reader.advance(i)
        self.tokens[source] += taken
        return taken

    def _refused(self, source: int, chunk: TokenChunk) -> list[int]:
        """The documents of ``chunk`` (by index, ascending) that ``_admit`` would not take: cut
        by the length rules, or empty. Found once per chunk: none, by the chunk's extremes,
        in the usual case."""
        held = self._refusals[source]
        if held is not None and held[0] is chunk:
            return held[1]
        low, high = max(1, self.drop_shorter_than), self.drop_longer_than
        if chunk.smallest >= low and (high is None or chunk.largest <= high):
            refused: list[int] = []
        else:
            refused = [
                k for k, n in enumerate(chunk.sizes) if n < low or (high is not None and n > high)
            ]
        self._refusals[source] = (chunk, refused)
        return refused

    def _take(
        self,
        source: int,
        chunk: TokenChunk,
        first: int,
        stop: int,
        room: int,
        parts: list[Part],
        owners: list[Owner | None],
        sizes: list[int],
        starts: list[bool],
    ) -> tuple[int, int]:
        """``chunk``'s documents from ``first`` up to ``stop`` (all kept by ``_admit``), as
        ``_admit`` and the block would take them one by one, found by a search in the running
        token sums: the whole documents that fit in ``room`` tokens, then the next one cut to
        fill it (its rest becoming the carry). Counts the documents; returns the tokens taken
        and the index of the next document."""
        search = _search if _native is None else _native.take  # the same steps, compiled
        taken, last, cut = search(chunk, first, stop, room, source, parts, owners, sizes, starts)
        if cut:  # the rest of the last document is the carry, as ``_cut`` would leave it
            self.carry[source] = Piece(chunk[last - 1], cut, chunk.sizes[last - 1])
        # at least one document was taken: the first fits whole, or else it is cut (room > 0)
        self.documents[source] += last - first
        self._barren_runs[source].clear()
        return taken, last


def _search(
    chunk: TokenChunk,
    first: int,
    stop: int,
    room: int,
    source: int,
    parts: list[Part],
    owners: list[Owner | None],
    sizes: list[int],
    starts: list[bool],
) -> tuple[int, int, int]:
    """``WrapBlocks._take``'s search, in Python where ``zephon_torch._native.take`` is not
    built: of ``chunk``'s documents ``first``..``stop - 1``, the whole ones that fit in
    ``room`` tokens (by a search in the running sums), then the next one's first tokens to
    fill the room, appended as their spans (``(base, first, stop)``, see ``ops._copy.fill``),
    owners, sizes and starts. Returns the tokens taken, the index after the last document
    taken, and the cut one's tokens (0: none)."""
    ends = chunk.ends
    last = bisect.bisect_right(ends, ends[first] + room, first, stop + 1) - 1
    whole = last - first  # documents first..last-1 fit whole
    taken = ends[last] - ends[first]
    if whole:
        parts += zip(chunk.bases[first:last], chunk.firsts[first:last], chunk.stops[first:last])
        sizes += chunk.sizes[first:last]
        starts += [True] * whole
        owners += zip(
            itertools.repeat(source, whole), chunk.shards[first:last], chunk.rows[first:last]
        )
    if taken < room and last < stop:  # cut (it does not fit whole)
        cut = room - taken
        begin = chunk.firsts[last]
        parts.append((chunk.bases[last], begin, begin + cut))
        owners.append((source, chunk.shards[last], chunk.rows[last]))
        sizes.append(cut)
        starts.append(True)
        return room, last + 1, cut
    return taken, last, 0


def _add(
    piece: Piece,
    parts: list[Part],
    owners: list[Owner | None],
    sizes: list[int],
    starts: list[bool],
) -> int:
    """Append ``piece``'s tokens, document, size and whether it begins its document; returns
    its size."""
    doc, begin, end = piece.doc, piece.start, piece.end
    parts.append(doc.tokens[begin:end])  # type: ignore[index]
    owners.append((doc.source, doc.shard, doc.row))
    sizes.append(end - begin)
    starts.append(begin == 0)
    return end - begin
