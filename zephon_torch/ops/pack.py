"""Mix and pack one lane: pick the source furthest below target a row ahead, pack its next piece.

Serial per lane by design: the choice of the next source depends on the real token (or
document) counts delivered so far. The packer asks for at most the space it has (a row's rest,
or ``max_length``); a longer document is cut there and its rest waits as its source's carry,
so after a very long document the other sources fill the next rows instead of waiting for it to
end. Every decision thus moves the counts by at most one row, and every lane (so every global
batch) stays within about one row per lane of its targets. The counts, the readers' positions,
the carries and the packer's open rows (all as pointers) are the whole state.

``wrap`` rows of plain documents are also built a micro-batch at a time (``wrap_rows``, in
``_wrap_blocks``); documents that give no tokens are counted and checked in ``_pack_skips``.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal

import numpy as np
import numpy.typing as npt
from torchdata.nodes import BaseNode

from zephon_torch._caller import warn
from zephon_torch._weak import weakly
from zephon_torch.errors import DataError
from zephon_torch.ops._barren_run import BarrenRun
from zephon_torch.ops._pack_skips import SKIP_REASONS, SkipAccounting
from zephon_torch.ops._pack_state import checked_pack_state
from zephon_torch.ops._wrap_blocks import WrapBlocks
from zephon_torch.ops.columns import TokenChunk
from zephon_torch.ops.document import Document, Tokens
from zephon_torch.ops.packers import (
    ChangedDocument,
    Packer,
    Piece,
    pieces_from_state,
)
from zephon_torch.ops.pretokenized import Owner
from zephon_torch.ops.read import DocumentReader

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


# A source that runs out while the others have more than this part of the lane's tokens
# (documents without token mixing; over all sources and passes) to come is warned of: the
# shares no longer hold from there
_LATE_SHARE = 0.05


class MixPack(SkipAccounting, WrapBlocks, BaseNode[PackedRow]):
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
        "active": [bool...], "carry": [[piece] or []...], "skipped": {reason: int},
        "packer": packer state}``:
        ``skipped`` holds the documents skipped by reason (``"too_long"``, ``"too_short"``,
        ``"empty"``, ``"malformed"``), the reasons of none left out (a lane state of 64 lanes
        is the smaller by about 4 KiB).

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
        # per source, the rows skipped as malformed before one read well, and the first; None
        # once one did (see `_check_bad_start`)
        self._bad_start: list[tuple[int, str] | None] = [(0, "")] * len(readers)
        self._plain: list[DocumentReader] = []  # each source's reader beneath its filters
        for source, reader in enumerate(readers):
            plain: Any = reader
            while not isinstance(plain, DocumentReader):  # beneath the stateful filters
                # a stateful filter's rejection is no pure fact of the row: it may let the
                # document through later (a curriculum), so it ends the run's proof, not its
                # dry spell (`_rejected`; the filter's own check covers a state that cycles)
                plain.on_rejected = weakly(self._rejected, source)
                plain = plain.reader
            plain.on_filtered = weakly(self._dropped, source)
            self._plain.append(plain)
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
            self._share_out()
            return
        state = checked_pack_state(initial_state, len(self.readers))
        for reader, reader_state in zip(self.readers, state["readers"]):
            reader.reset(reader_state)
        self.tokens = [t for t, _ in state["delivered"]]
        self.documents = [d for _, d in state["delivered"]]
        self.active = list(state["active"])
        self._share_out()
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
                "since the state was saved (or a map is not pure, or the state was edited)",
                dataset=self.readers[doc.source].layout.name,
                shard=None if paths is None else paths[doc.source][doc.shard],
                row=doc.row,
            ) from None

    def get_state(self) -> dict[str, Any]:
        """Counters, reader positions and the packer's open rows.

        Taken after every batch: loops, not comprehensions, which cost a call each before
        Python 3.12 (0.97 us against 0.68 a state, of a batch's 16 in a pre-tokenized run)."""
        readers, delivered, carry, skipped = [], [], [], {}
        for reader in self.readers:
            readers.append(reader.get_state())
        for tokens, documents in zip(self.tokens, self.documents):
            delivered.append([tokens, documents])
        for piece in self.carry:
            carry.append([] if piece is None else [piece.pointer()])
        for reason, n in self.skipped.items():
            if n:
                skipped[reason] = n
        return {
            "readers": readers,
            "delivered": delivered,
            "active": self.active.copy(),
            "carry": carry,
            "skipped": skipped,
            "packer": self.packer.get_state(),
        }

    def next(self) -> PackedRow:
        """The next packed row; StopIteration when every source and open row is spent."""
        pieces = self.packer.next_row(self._pull)
        if pieces is None:
            raise StopIteration
        return _to_row(pieces)

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
        self._share_out()
        reader = self.readers[source]
        if self.tokens[source] == 0 and reader.lane_rows > 0:
            if not self._first_warning("no token", source):
                return
            warn(
                f"dataset {reader.layout.name!r} gave a lane no token: every document of it "
                f"that the lane read was {self._empty_words()} or dropped (by filters, "
                "min_document_length or long_documents='drop'), and with exhaustion='stop' "
                "its pass is over",
                once=self._once_key("no token", source),
            )
            return
        left, total = self._to_come()
        if left > _LATE_SHARE * total and self._first_warning("ran out", source):
            warn(
                f"dataset {reader.layout.name!r} ran out (exhaustion='stop': its passes are "
                f"read) with more than {_LATE_SHARE:.0%} of a lane's {self.mixing}, of other "
                "datasets, to come: the rest of the run is theirs alone, and the delivered "
                "shares leave their targets; give it more `passes`, or use "
                "exhaustion='repeat' with a step budget to keep the shares",
                once=self._once_key("ran out", source),
            )

    def _share_out(self) -> None:
        """Each active source's reader reads ahead by its share among the active sources: a
        small source left alone once the others are spent (``exhaustion="stop"``) kept the
        read-ahead of its share of the whole mixture, one chunk in flight at 1%."""
        total = math.fsum(w for w, on in zip(self.weights, self.active, strict=True) if on)
        for plain, weight, on in zip(self._plain, self.weights, self.active, strict=True):
            if on and total > 0:
                plain.set_share(weight / total)

    def _to_come(self) -> tuple[float, float]:
        """What the lane's active sources still have to give, and what all its sources give
        over the run, in the mixture's unit: documents, or tokens, each source's documents
        weighed by the tokens per document it gave the lane so far (the others' mean where it
        gave none yet). Counted in documents under token mixing, a source of short documents
        spent beside a few long ones still to come (40% of the lane's tokens) was no sign."""
        counts = [reader.unread() for reader in self.readers]
        sizes = [1.0] * len(counts)
        if self.mixing == "tokens":
            known = [t / d for t, d in zip(self.tokens, self.documents, strict=True) if d]
            mean = sum(known) / len(known) if known else 1.0
            sizes = [t / d if d else mean for t, d in zip(self.tokens, self.documents)]
        left = sum(c[0] * s for c, s, on in zip(counts, sizes, self.active, strict=True) if on)
        return left, sum(c[1] * s for c, s in zip(counts, sizes, strict=True))

    def _fetch(self, source: int, pass_index: int, pos: int) -> Document:
        """The document a saved piece points at (its source is checked with the state's
        shape; its position here: one past the stream failed with an IndexError)."""
        reader = self.readers[source]
        reader.check_position(pass_index, pos, document=True)
        return reader.fetch(pass_index, pos)


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
