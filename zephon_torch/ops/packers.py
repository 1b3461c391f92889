"""Packing algorithms: pieces of documents in, rows of at most ``max_length`` tokens out.

The mixer hands out *pieces*: a document, or while it is longer than the space asked for, its
next ``space`` tokens (the rest waits as that source's carry, so another source can fill the
next rows). ``wrap`` fills every row to exactly ``max_length`` (no padding; documents may span
rows). The bin packers keep ``num_bins`` open rows (padded when closed): ``best_fit`` puts each
piece into the open row it fills most tightly and, when none fits, closes the fullest;
``first_fit`` takes the first open row it fits and closes the oldest; ``best_fit_wrap`` is
``best_fit`` that, when no row fits and all ``num_bins`` are open, cuts the piece to fill the
roomiest row instead of closing a row with padding (so each row ends in at most one cut
document). A piece of exactly ``max_length`` tokens is a row by itself and never touches the
open rows. All are deterministic functions of the piece sequence,
and their state is pieces as pointers (source, pass, pos, start, end).

In a bin packer's rows a piece that runs to its document's end (most do: whole documents, and
the last part of a cut one) is written with ``end`` -1, which a restore reads as the end of the
document it re-reads. The length of every such piece is then no part of the state (with
documents of a few tokens it was nearly all of it: 5.4 KB of the 5.8 KB of a lane's packed
pieces), and each row's token count (``filled``) checks the documents re-read against the
state. That check is of sizes, what the rows' bookkeeping needs (no row past ``max_length``):
a document whose tokens changed but not their number, or two of one row whose lengths swapped,
resume as read now, as a document of the same length always did."""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Literal

from zephon_torch.errors import ConfigError, positive_setting
from zephon_torch.ops.document import Document

Algorithm = Literal["wrap", "best_fit", "first_fit", "best_fit_wrap"]
ALGORITHMS = ("wrap", "best_fit", "first_fit", "best_fit_wrap")
LongDocuments = Literal["split", "drop"]

Pull = Callable[[int], "Piece | None"]  # at most this many tokens -> a piece, None when spent
Fetch = Callable[[int, int, int], Document]  # (source, pass, pos) -> document


@dataclass(slots=True)
class Piece:
    """Tokens ``[start, end)`` of one document."""

    doc: Document
    start: int
    end: int

    @property
    def length(self) -> int:
        """Number of tokens in the piece."""
        return self.end - self.start

    def pointer(self) -> list[int]:
        """The piece as plain data for the state."""
        d = self.doc
        return [d.source, d.pass_index, d.pos, self.start, self.end]

    def row_pointer(self) -> list[int]:
        """``pointer``, with ``end`` -1 where the piece runs to its document's end (see the
        module's docstring)."""
        d = self.doc
        size = 0 if d.tokens is None else len(d.tokens)
        return [d.source, d.pass_index, d.pos, self.start, TO_END if self.end == size else self.end]


TO_END = -1  # a piece's saved end: its document's end


class ChangedDocument(ValueError):
    """A saved piece reaches past its document's tokens as read now, or a saved row's
    documents hold another number of tokens: the data, or what a per-document function makes
    of it, changed since the state was saved."""

    def __init__(self, doc: Document, end: int, size: int, what: str | None = None) -> None:
        super().__init__(
            what or f"the state continues it up to token {end}, but it has {size} tokens"
        )
        self.doc = doc


def pieces_from_state(rows: list[list[list[int]]], fetch: Fetch) -> list[list[Piece]]:
    """Rebuild pieces from pointers (an ``end`` of -1: the document's end), fetching each
    distinct document once.

    Raises:
        ChangedDocument: where a piece lies past its document's end.
    """
    docs: dict[tuple[int, int, int], Document] = {}
    out: list[list[Piece]] = []
    for row in rows:
        pieces = []
        for source, pass_index, pos, start, end in row:
            key = (source, pass_index, pos)
            if key not in docs:
                docs[key] = fetch(source, pass_index, pos)
            doc = docs[key]
            size = 0 if doc.tokens is None else len(doc.tokens)
            if end == TO_END:
                end = size  # noqa: PLW2901
            if not 0 <= start <= end <= size:  # a piece to the end past it: from its start
                raise ChangedDocument(doc, max(start, end), size)
            pieces.append(Piece(doc, start, end))
        out.append(pieces)
    return out


class WrapPacker:
    """Rows of exactly ``max_length`` tokens; the last row of a finite stream may be shorter.

    State: ``{}``: a row is built whole inside one call, so nothing is open between rows.
    """

    def __init__(self, max_length: int) -> None:
        self.max_length = max_length

    def next_row(self, pull: Pull) -> list[Piece] | None:
        """The next row, or None when the pieces are exhausted."""
        row: list[Piece] = []
        space = self.max_length
        while space:
            piece = pull(space)
            if piece is None:
                break
            row.append(piece)
            space -= piece.length
        return row or None

    def clear(self) -> None:
        """Nothing to forget."""

    def get_state(self) -> dict[str, Any]:
        """Empty: no row is open between calls."""
        return {}

    def set_state(self, state: dict[str, Any], fetch: Fetch) -> None:
        """Nothing to restore."""


class BinPacker:
    """Pieces in ``num_bins`` open rows; closed rows are padded.

    Args:
        max_length: row length.
        num_bins: open rows at a time.
        fit: ``"best"`` (tightest row; closes the fullest when none fits) or ``"first"``
            (first row it fits; closes the oldest).
        cut: when no row fits, cut the piece to fill the roomiest row (``best_fit_wrap``).
        max_sequences_per_bin: close a row once it holds this many pieces (None: no limit).

    State: ``{"bins": [[piece, ...], ...], "ready": [[piece, ...], ...], "filled": [tokens,
    ...]}``: open rows in opening order and closed rows not yet emitted, pieces as
    ``Piece.row_pointer`` writes them, and each row's tokens (open rows first).
    """

    def __init__(
        self,
        max_length: int,
        num_bins: int,
        *,
        fit: Literal["best", "first"] = "best",
        cut: bool = False,
        max_sequences_per_bin: int | None = None,
    ) -> None:
        if num_bins < 1:
            raise ConfigError(f"`num_bins` must be positive, got {num_bins}")
        if max_sequences_per_bin is not None and max_sequences_per_bin < 1:
            raise ConfigError(
                f"`max_sequences_per_bin` must be positive or None, got {max_sequences_per_bin}"
            )
        self.max_length = max_length
        self.num_bins = num_bins
        self.fit = fit
        self.cut = cut
        self.max_pieces = max_sequences_per_bin
        self.bins: list[list[Piece]] = []
        self.used: list[int] = []
        self.ready: deque[list[Piece]] = deque()
        self.ready_used: deque[int] = deque()
        self.bin_pointers: list[list[list[int]]] = []
        self.ready_pointers: deque[list[list[int]]] = deque()

    def next_row(self, pull: Pull) -> list[Piece] | None:
        """The next closed row, or None when pieces and open rows are exhausted."""
        row = self._next_row(pull)
        if row is not None:
            self.ready_pointers.popleft()
            self.ready_used.popleft()
        return row

    def _next_row(self, pull: Pull) -> list[Piece] | None:
        while not self.ready:
            piece = pull(self.max_length)
            if piece is not None:
                self._place(piece)
            elif self.bins:
                self._close(0)
            else:
                return None
        return self.ready.popleft()

    def _place(self, piece: Piece) -> None:
        if piece.length == self.max_length:  # a full row by itself: no open row is disturbed
            self.ready.append([piece])
            self.ready_pointers.append([piece.row_pointer()])
            self.ready_used.append(piece.length)
            return
        target = self._choose(piece.length)
        if target < 0 and self.cut and len(self.bins) == self.num_bins:
            # rather than close a row with padding, fill the roomiest one with a cut
            roomiest = min(range(len(self.used)), key=lambda i: (self.used[i], i))
            space = self.max_length - self.used[roomiest]
            if 0 < space < piece.length:
                cut = piece.start + space
                self._add(roomiest, Piece(piece.doc, piece.start, cut))  # fills it: closes
                piece = Piece(piece.doc, cut, piece.end)
                target = self._choose(piece.length)
        if target < 0:
            if len(self.bins) == self.num_bins:
                if self.fit == "best":
                    self._close(max(range(len(self.used)), key=lambda i: (self.used[i], -i)))
                else:
                    self._close(0)
            self.bins.append([])
            self.bin_pointers.append([])
            self.used.append(0)
            target = len(self.bins) - 1
        self._add(target, piece)

    def _choose(self, length: int) -> int:
        best, best_space = -1, self.max_length + 1
        for i, used in enumerate(self.used):
            space = self.max_length - used
            if length <= space < best_space:
                if self.fit == "first":
                    return i
                best, best_space = i, space
        return best

    def _add(self, index: int, piece: Piece) -> None:
        self.bins[index].append(piece)
        self.bin_pointers[index].append(piece.row_pointer())
        self.used[index] += piece.length
        full = self.used[index] == self.max_length
        if full or (self.max_pieces is not None and len(self.bins[index]) >= self.max_pieces):
            self._close(index)

    def _close(self, index: int) -> None:
        self.ready.append(self.bins.pop(index))
        self.ready_pointers.append(self.bin_pointers.pop(index))
        self.ready_used.append(self.used.pop(index))

    def clear(self) -> None:
        """Forget open and ready rows."""
        self.bins, self.used, self.ready, self.ready_used = [], [], deque(), deque()
        self.bin_pointers, self.ready_pointers = [], deque()

    def get_state(self) -> dict[str, Any]:
        """Open and ready rows as pointers (kept up to date as pieces move, so taking the
        state after every batch costs a shallow copy)."""
        return {
            "bins": [list(row) for row in self.bin_pointers],
            "ready": [list(row) for row in self.ready_pointers],
            "filled": [*self.used, *self.ready_used],
        }

    def set_state(self, state: dict[str, Any], fetch: Fetch) -> None:
        """Restore open and ready rows, re-reading their documents."""
        # one call, so a document cut across an open and a ready row is read once
        rows = pieces_from_state(state["bins"] + state["ready"], fetch)
        filled = [sum(p.length for p in row) for row in rows]
        saved = state.get("filled", filled)  # states before version 4 wrote every end
        for row, tokens, was in zip(rows, filled, saved, strict=True):
            if tokens != was:
                what = (
                    f"a row the state holds (open, or closed and not yet emitted) had {was} "
                    f"tokens when saved; its documents (this one first) hold {tokens} as read now"
                )
                raise ChangedDocument(row[0].doc, 0, 0, what)
        self.bins, ready = rows[: len(state["bins"])], rows[len(state["bins"]) :]
        self.used = filled[: len(self.bins)]
        self.ready, self.ready_used = deque(ready), deque(filled[len(self.bins) :])
        self.bin_pointers = [[p.row_pointer() for p in row] for row in self.bins]
        self.ready_pointers = deque([p.row_pointer() for p in row] for row in self.ready)


Packer = WrapPacker | BinPacker


def make_packer(
    algorithm: str, max_length: int, num_bins: int, max_sequences_per_bin: int | None = None
) -> Packer:
    """The packer for ``algorithm``; raises ``ConfigError`` listing the known ones."""
    max_length = positive_setting(max_length, "`max_length`")
    if algorithm == "wrap":
        if max_sequences_per_bin is not None:
            raise ConfigError("`max_sequences_per_bin` needs a bin packer, not 'wrap'")
        return WrapPacker(max_length)
    if algorithm in ("best_fit", "first_fit", "best_fit_wrap"):
        return BinPacker(
            max_length,
            num_bins,
            fit="first" if algorithm == "first_fit" else "best",
            cut=algorithm == "best_fit_wrap",
            max_sequences_per_bin=max_sequences_per_bin,
        )
    raise ConfigError(f"`algorithm` must be one of {list(ALGORITHMS)}, got {algorithm!r}")
