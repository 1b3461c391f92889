"""Mix and pack one lane: pick the source furthest below target a row ahead, pack its next piece.

Serial per lane by design: the choice of the next source depends on the real token (or
document) counts delivered so far. The packer asks for at most the space it has (a row's rest,
or ``max_length``); a longer document is cut there and its rest waits as its source's carry,
so after a very long document the other sources fill the next rows instead of waiting for it to
end. Every decision thus moves the counts by at most one row, and every lane (so every global
batch) stays within about one row per lane of its targets. The counts, the readers' positions,
the carries and the packer's open rows (all as pointers) are the whole state.

``wrap`` rows of plain documents are also built a micro-batch at a time (``wrap_rows``), with
the same decisions; while one source alone is active there is nothing to choose, so its piece
may run on across row ends.
"""

from __future__ import annotations

import bisect
import itertools
import weakref
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal

import numpy as np
import numpy.typing as npt
from torchdata.nodes import BaseNode

from zephon_torch._caller import warn
from zephon_torch.errors import DataError
from zephon_torch.ops._pack_state import checked_pack_state
from zephon_torch.ops.columns import TokenChunk
from zephon_torch.ops.document import Document, Tokens
from zephon_torch.ops.packers import (
    ChangedDocument,
    Packer,
    Piece,
    WrapPacker,
    pieces_from_state,
)
from zephon_torch.ops.pretokenized import Owner
from zephon_torch.ops.read import BarrenRun, DocumentReader, gave_up_error

if TYPE_CHECKING:
    from zephon_torch.ops.stateful import FilteredReader
from zephon_torch.work.mixture import choose_source


@dataclass(slots=True)
class PackedRow:
    """One packed row: the token views of its pieces (segments), in order, and their layout.

    The pieces stay views of their documents until the batch copies them into place, so a
    token is copied once on its way from the document to the batch.
    """

    parts: list[Tokens]
    lengths: list[int]
    sources: list[int]
    starts_document: list[bool]
    trainable: npt.NDArray[np.bool_] | None = None
    payloads: list[dict[str, Any]] | None = None
    owners: list[Owner] = field(default_factory=list)  # (source, shard, row) of each part

    @property
    def length(self) -> int:
        """Tokens in the row."""
        return sum(self.lengths)

    @property
    def tokens(self) -> Tokens:
        """The row's tokens as one array (the piece itself when the row has one)."""
        return np.concatenate(self.parts) if len(self.parts) > 1 else self.parts[0]


@dataclass(slots=True)
class RowBlock:
    """Consecutive ``wrap`` rows as segments laid end to end, the rows one after another (only
    the last row may be short): each segment's token view, length, source, whether it begins
    its document, and its document (source, shard, row). Cut into rows only when read (see
    ``ops.batch.RowLayout``)."""

    parts: list[npt.NDArray[Any]]
    sizes: list[int]
    sources: list[int]
    starts: list[bool]
    owners: list[Owner | None]
    tokens: int


# A source that runs out while the others have more than this part of the lane's documents
# (over all sources and passes) to come is warned of: the shares no longer hold from there
_LATE_SHARE = 0.05
# why documents are skipped: the length rules, documents of no token, and rows that raised a
# DataError under bad_rows="skip"
SKIP_REASONS = ("too_long", "too_short", "empty", "malformed")
# rows of a source a lane may skip as malformed before its first document; one more is an error
# (with a tenth of rows bad at random, 100 in a row come once in 10**100 starts)
BAD_START_ROWS = 100


class MixPack(BaseNode[PackedRow]):
    """Mix the lane's sources by target share and pack documents into rows.

    Args:
        readers: one reader per source, in source order.
        weights: normalised target shares, in source order.
        mixing: ``"tokens"`` (token shares) or ``"documents"`` (document shares).
        packer: the packing algorithm.
        drop_longer_than: skip (and count) documents with more tokens than this.
        drop_shorter_than: skip (and count) documents with fewer tokens than this.
        shard_paths: per source, shard index to path, for error messages.
        long_rule: how errors name ``drop_longer_than`` where the user did not set it.
        warned: the warnings given (skipped bad rows, a source spent), each by its dataset,
            shared by the lanes of an iteration, so that each is given once whatever the
            warnings filter; default: this packer's own.
        line_of: ``(source, shard, row)`` to where the row lies in its file ("line 37 of the
            file"), for the warning of a skipped row (a scan of the file: once per warning).

    State:
        ``{"readers": [reader state...], "delivered": [[tokens, documents]...],
        "active": [bool...], "carry": [[piece] or []...], "skipped": {"too_long": int,
        "too_short": int, "empty": int, "malformed": int}, "packer": packer state}``.

    Resume guarantee: exact; only documents in the packer's open rows are re-read.
    """

    def __init__(
        self,
        readers: Sequence[DocumentReader | FilteredReader],
        weights: tuple[float, ...],
        mixing: Literal["tokens", "documents"],
        packer: Packer,
        *,
        drop_longer_than: int | None = None,
        drop_shorter_than: int = 0,
        shard_paths: list[list[str]] | None = None,
        long_rule: str | None = None,
        warned: set[tuple[str, str]] | None = None,
        line_of: Callable[[int, int, int], str | None] | None = None,
    ) -> None:
        super().__init__()
        self.warned = set() if warned is None else warned
        self.line_of = line_of
        self.readers = list(readers)
        self.long_rule = long_rule
        self.shard_paths = shard_paths
        self.weights = weights
        self.mixing = mixing
        self.packer = packer
        self.tokens = [0] * len(readers)
        self.documents = [0] * len(readers)
        self.active = [True] * len(readers)
        self.carry: list[Piece | None] = [None] * len(readers)
        self.drop_longer_than = drop_longer_than
        self.drop_shorter_than = drop_shorter_than
        self.skipped = dict.fromkeys(SKIP_REASONS, 0)
        # per source, its documents in a row that gave no tokens: empty, cut by the length
        # rules, or dropped by the plain filters (pure, as the rules are; the readers tell)
        self._barren_runs = [
            BarrenRun(
                "gave no token (empty, malformed, dropped by the filters or cut by the length "
                "rules)"
            )
            for _ in readers
        ]
        self._filtered = [False] * len(readers)  # whether the filters dropped any of a source
        # per source, the rows skipped as malformed while none gave a document, and the first
        self._bad_start: list[tuple[int, str]] = [(0, "")] * len(readers)
        for source, reader in enumerate(readers):
            plain: Any = reader
            while not isinstance(plain, DocumentReader):  # beneath the stateful filters
                # a stateful filter's rejection is no pure fact of the row: it may let the
                # document through later (a curriculum), so it ends the run's proof, not its
                # dry spell (`_rejected`; the filter's own check covers a state that cycles)
                plain.on_rejected = _weakly(self._rejected, source)
                plain = plain.reader
            plain.on_filtered = _weakly(self._dropped, source)
        # per source, its current token chunk and the documents _admit refuses there
        self._refusals: list[tuple[TokenChunk, list[int]] | None] = [None] * len(readers)
        # documents come as columns: a lone active source's are taken a chunk at a time
        self._columnar = all(isinstance(r, DocumentReader) and r.columnar for r in self.readers)

    def reset(self, initial_state: dict[str, Any] | None = None) -> None:
        """Start fresh, or restore counters, reader positions and open rows."""
        super().reset(initial_state)
        for run in self._barren_runs:
            run.clear()
        self._refusals = [None] * len(self.readers)
        self._bad_start = [(0, "")] * len(self.readers)
        if initial_state is None:
            for reader in self.readers:
                reader.reset(None)
            self.tokens = [0] * len(self.readers)
            self.documents = [0] * len(self.readers)
            self.active = [True] * len(self.readers)
            self.carry = [None] * len(self.readers)
            self.skipped = dict.fromkeys(SKIP_REASONS, 0)
            self.packer.clear()
            return
        state = checked_pack_state(initial_state, len(self.readers))
        for reader, reader_state in zip(self.readers, state["readers"]):
            reader.reset(reader_state)
        self.tokens = [t for t, _ in state["delivered"]]
        self.documents = [d for _, d in state["delivered"]]
        self.active = list(state["active"])
        self.skipped = {**dict.fromkeys(SKIP_REASONS, 0), **state["skipped"]}
        try:
            carries = pieces_from_state(initial_state["carry"], self._fetch)
            self.carry = [row[0] if row else None for row in carries]
            self.packer.set_state(initial_state["packer"], self._fetch)
        except ChangedDocument as error:
            doc = error.doc
            paths = self.shard_paths
            raise DataError(
                f"cannot resume here: {error}. The data, or a map, filter or tokenizer, changed "
                "since the state was saved (or a map is not pure)",
                dataset=self.readers[doc.source].layout.name,
                shard=None if paths is None else paths[doc.source][doc.shard],
                row=doc.row,
            ) from None

    def get_state(self) -> dict[str, Any]:
        """Counters, reader positions and the packer's open rows."""
        return {
            "readers": [r.get_state() for r in self.readers],
            "delivered": [[t, d] for t, d in zip(self.tokens, self.documents)],
            "active": list(self.active),
            "carry": [[] if p is None else [p.pointer()] for p in self.carry],
            "skipped": dict(self.skipped),
            "packer": self.packer.get_state(),
        }

    def next(self) -> PackedRow:
        """The next packed row; StopIteration when every source and open row is spent."""
        pieces = self.packer.next_row(self._pull)
        if pieces is None:
            raise StopIteration
        return _to_row(pieces)

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
        parts: list[npt.NDArray[Any]] = []
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
        parts: list[npt.NDArray[Any]],
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
        parts: list[npt.NDArray[Any]],
        owners: list[Owner | None],
        sizes: list[int],
        starts: list[bool],
    ) -> tuple[int, int]:
        """``chunk``'s documents from ``first`` up to ``stop`` (all kept by ``_admit``), as
        ``_admit`` and the block would take them one by one, found by a search in the running
        token sums: the whole documents that fit in ``room`` tokens, then the next one cut to
        fill it (its rest becoming the carry). Counts the documents; returns the tokens taken
        and the index of the next document."""
        ends = chunk.ends
        last = bisect.bisect_right(ends, ends[first] + room, first, stop + 1) - 1
        whole = last - first  # documents first..last-1 fit whole
        taken = ends[last] - ends[first]
        if whole:
            parts += chunk.tokens[first:last]
            sizes += chunk.sizes[first:last]
            starts += [True] * whole
            owners += zip(
                itertools.repeat(source, whole), chunk.shards[first:last], chunk.rows[first:last]
            )
        if taken < room and last < stop:  # cut: the rest waits as the carry
            whole_doc = Piece(chunk[last], 0, chunk.sizes[last])
            taken += _add(self._cut(source, whole_doc, room - taken), parts, owners, sizes, starts)
            last += 1
        if last > first:
            self.documents[source] += last - first
            self._barren_runs[source].clear()
        return taken, last

    def _pull(self, max_tokens: int) -> Piece | None:
        by_tokens = self.mixing == "tokens"
        counts = self.tokens if by_tokens else self.documents
        # a row (the most any piece adds) or a document, the same at every pick: looking ahead
        # by the space left would favour a small source where that space is small, the ends of
        # rows, and cut its documents into slivers there
        ahead = self.packer.max_length if by_tokens else 1
        while True:
            source = choose_source(self.weights, counts, self.active, ahead)
            if source < 0:
                return None
            piece = self.carry[source]
            if piece is None:
                try:
                    doc = self.readers[source].next()  # reset by our reset(): skip the check
                except StopIteration:
                    self._spent(source)
                    continue
                assert doc.tokens is not None
                size = len(doc.tokens)
                if not self._admit(source, size, doc.shard, doc.row, doc.error):
                    continue
                piece = Piece(doc, 0, size)
            piece = self._cut(source, piece, max_tokens)
            self.tokens[source] += piece.end - piece.start
            return piece

    def _cut(self, source: int, piece: Piece, max_tokens: int) -> Piece:
        """``piece`` of ``source`` up to ``max_tokens`` tokens; its rest, if any, becomes the
        source's carry (none otherwise)."""
        cut = piece.start + max_tokens
        if cut >= piece.end:
            self.carry[source] = None
            return piece
        self.carry[source] = Piece(piece.doc, cut, piece.end)
        return Piece(piece.doc, piece.start, cut)

    def _spent(self, source: int) -> None:
        """Mark ``source``'s stream spent (``exhaustion="stop"``), with a warning where the lane
        read documents of it and none gave a token: a finite run would otherwise end without
        the source, and without a word (its skips count in a state that no batch carries).
        Each warning names no lane and is given once an iteration (the lanes share
        ``warned``), whatever the warnings filter: with "always" it came once a lane."""
        self.active[source] = False
        reader = self.readers[source]
        if self.tokens[source] == 0 and reader.lane_rows > 0:
            if not self._first_warning("no token", source):
                return
            warn(
                f"dataset {reader.layout.name!r} gave a lane no token: every document of it "
                f"that the lane read was {self._empty_words()} or dropped (by filters, "
                "min_document_length or long_documents='drop'), and with exhaustion='stop' "
                "its pass is over",
            )
            return
        left = sum(r.unread()[0] for r, on in zip(self.readers, self.active, strict=True) if on)
        total = sum(r.unread()[1] for r in self.readers)
        if left > _LATE_SHARE * total and self._first_warning("ran out", source):
            warn(
                f"dataset {reader.layout.name!r} ran out (exhaustion='stop': its passes are "
                f"read) with more than {_LATE_SHARE:.0%} of a lane's documents, of other "
                "datasets, to come: the rest of the run is theirs alone, and the delivered "
                "shares leave their targets; give it more `passes`, or use "
                "exhaustion='repeat' with a step budget to keep the shares",
            )

    def _admit(
        self, source: int, size: int, shard: int, row: int, error: str | None = None
    ) -> bool:
        """Count a new document of ``source`` of ``size`` tokens under the length rules (a
        dropped one, an empty one, or one skipped for ``error`` as malformed, as skipped; a
        kept one as delivered); True when it gives tokens."""
        if error is not None:
            self.skipped["malformed"] += 1
            self._warn_bad(source, shard, row, error)
            if not self.documents[source]:
                self._check_bad_start(source, error)
        elif not size:  # no token, not even a special one (see `with_eos`)
            self.skipped["empty"] += 1
        elif self.drop_longer_than is not None and size > self.drop_longer_than:
            self.skipped["too_long"] += 1
        elif size < self.drop_shorter_than:
            self.skipped["too_short"] += 1
        else:
            self.documents[source] += 1
            self._barren_runs[source].clear()
            return True
        self._barren(source, shard, row)
        return False

    def _dropped(self, source: int, shards: Any, rows: Any) -> None:
        """Count documents of ``source`` the plain filters dropped, stored at ``(shards,
        rows)``, with those that gave no token: a source whose documents the filters and the
        length rules share out between them gives nothing, and neither alone proves it."""
        self._filtered[source] = True
        self._barren(source, shards, rows)

    def _rejected(self, source: int) -> None:
        """Count a document of ``source`` a stateful filter rejected: it ends the run's
        proof (no pure fact of the row), not its dry spell."""
        self._barren_runs[source].restart()
        self._check_dry(source, 1)

    def _check_dry(self, source: int, added: int = 0) -> None:
        """Refuse ``source`` once it went ``GIVE_UP_PASSES`` lane passes without a token."""
        run, reader = self._barren_runs[source], self.readers[source]
        if run.given_up(reader, added):
            raise gave_up_error(reader, run.dry)

    def _barren(self, source: int, shard: Any, row: Any) -> None:
        """Count documents of ``source`` that gave no tokens (empty, dropped by length or by
        the filters), stored at ``(shard, row)`` (one, or arrays): a source that would be read
        for ever without a token under ``exhaustion="repeat"`` is refused once its run proves
        it (``BarrenRun``), or once it went ``GIVE_UP_PASSES`` lane passes without one."""
        if self._barren_runs[source].extend(self.readers[source], shard, row):
            self._never_gives(source)
        self._check_dry(source)

    def _warn_bad(self, source: int, shard: int, row: int, error: str) -> None:
        """Warn of the first row of ``source``'s dataset skipped for ``error`` (one word per
        dataset and iteration: ``stats()`` counts them all), with its line in its file."""
        if not self._first_warning("bad rows", source):
            return
        place = None if self.line_of is None else self.line_of(source, shard, row)
        warn(
            "bad_rows='skip': skipping rows that raise an error, counted in "
            "stats()['skipped_documents']['malformed'] (one warning per dataset and "
            f"iteration); the first: {error}{'' if place is None else f' ({place})'}",
        )

    def _check_bad_start(self, source: int, error: str) -> None:
        """Refuse ``source`` once the lane skipped ``BAD_START_ROWS`` of its rows as malformed
        and none gave a document: ``bad_rows="skip"`` is for a dataset's few bad rows, and a
        dataset without a good one (a misspelt field, the wrong column) would otherwise be read
        through, a whole pass, for warnings and no batch. Counted from the iteration's start or
        resume."""
        count, first = self._bad_start[source]
        count, first = count + 1, first or error
        self._bad_start[source] = (count, first)
        if count < BAD_START_ROWS:
            return
        raise DataError(
            f"bad_rows='skip': a lane skipped {count} rows of it as malformed before any gave "
            "a document, and skipping is for a dataset's few bad rows, not for one without "
            f"good ones. The first: {first}. A field missing from "
            "every row is a misspelt field name (the `field` of tokenize, tokenize_chat or "
            "pretokenized)",
            dataset=self.readers[source].layout.name,
        )

    def _first_warning(self, kind: str, source: int) -> bool:
        """Whether the warning ``kind`` of ``source``'s dataset is still to be given this
        iteration (the lanes share ``warned``); it counts as given from now on."""
        key = (kind, self.readers[source].layout.name)
        if key in self.warned:
            return False
        self.warned.add(key)
        return True

    def _empty_words(self) -> str:
        """Why documents gave no token, for an error's words: empty, and, where this lane
        skipped any, malformed."""
        if self.skipped["malformed"]:
            return "empty or skipped as malformed (bad_rows='skip')"
        return "empty"

    def _never_gives(self, source: int) -> None:
        """The ``DataError`` of a source proved to give no token for ever."""
        reader = self.readers[source]
        whole = "a whole pass of this lane" if reader.same_each_pass else "the dataset"
        rules = ["the filters"] if self._filtered[source] else []
        if self.drop_shorter_than:
            rules.append(f"min_document_length={self.drop_shorter_than}")
        if self.drop_longer_than is not None:
            long = f"long_documents='drop' above {self.drop_longer_than} tokens"
            rules.append(self.long_rule or long)
        why = " or ".join(
            [self._empty_words(), *([f"dropped by {' or '.join(rules)}"] if rules else [])]
        )
        raise DataError(
            f"every document of {whole} is {why}: with exhaustion='repeat' it would be read "
            "forever without giving a token",
            dataset=reader.layout.name,
        )

    def _fetch(self, source: int, pass_index: int, pos: int) -> Document:
        """The document a saved piece points at (its source is checked with the state's
        shape; its position here: one past the stream failed with an IndexError)."""
        reader = self.readers[source]
        reader.check_position(pass_index, pos, document=True)
        return reader.fetch(pass_index, pos)


def _weakly(method: Callable[..., None], *first: Any) -> Callable[..., None]:
    """``method(*first, ...)`` through a weak reference to its object: a reader that tells the
    packer of events must not keep it alive, as the cycle would hold the whole pipeline (its
    decoded data with it) until the garbage collector runs."""
    ref = weakref.WeakMethod(method)

    def call(*rest: Any) -> None:
        bound = ref()
        if bound is not None:
            bound(*first, *rest)

    return call


def _add(
    piece: Piece,
    parts: list[npt.NDArray[Any]],
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


def _to_row(pieces: list[Piece]) -> PackedRow:
    parts, lengths, sources, starts = [], [], [], []
    owners: list[Owner] = []
    chat = with_payload = False
    for p in pieces:
        doc = p.doc
        start, end = p.start, p.end
        parts.append(doc.tokens[start:end])  # type: ignore[index]
        owners.append((doc.source, doc.shard, doc.row))
        lengths.append(end - start)
        sources.append(doc.source)
        starts.append(start == 0)
        if doc.trainable is not None:
            chat = True
        if doc.payload is not None:
            with_payload = True
    trainable = None
    if chat:
        trainable = np.concatenate(
            [
                np.ones(p.length, dtype=bool)
                if p.doc.trainable is None
                else p.doc.trainable[p.start : p.end]
                for p in pieces
            ]
        )
    return PackedRow(
        parts,
        lengths,
        sources,
        starts,
        trainable,
        [p.doc.payload or {} for p in pieces] if with_payload else None,
        owners,
    )
