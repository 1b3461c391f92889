"""A batch's row layout: per row, its segments' lengths, sources and document starts.

``wrap`` rows of plain documents come as one block of segments laid end to end
(``MixPack.wrap_rows``); a ``RowLayout`` keeps them so and cuts them into rows only when first
read, so a consumer that takes only the token ids never pays for the per-row lists. Counts per
source are taken from the segments directly.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterable, Iterator
from typing import TypeVar

T = TypeVar("T")
Rows = tuple[list[list[int]], list[list[int]], list[list[bool]]]  # lengths, sources, starts


class RowLayout:
    """A batch's segments (document pieces) per row: their lengths, their sources, and whether
    each begins its document.

    Given per row, or (``end_to_end``) as the segments of ``wrap`` rows laid end to end, cut
    into rows only when first read: a consumer that takes only the token ids never pays for
    the per-row lists.
    """

    __slots__ = ("_rows", "_segments")

    def __init__(self, rows: Rows) -> None:
        self._rows: Rows | None = rows
        self._segments: tuple[list[int], list[int], list[bool], int, int] | None = None

    @classmethod
    def end_to_end(
        cls, sizes: list[int], sources: list[int], starts: list[bool], *, width: int, rows: int
    ) -> RowLayout:
        """Segments filling rows of ``width`` one after another (the last may be short),
        followed by empty rows up to ``rows``."""
        layout = cls.__new__(cls)
        layout._rows = None
        layout._segments = (sizes, sources, starts, width, rows)
        return layout

    @property
    def rows(self) -> Rows:
        """Per row: segment lengths, segment sources, whether each segment begins its document."""
        if self._rows is None:
            assert self._segments is not None
            sizes, sources, starts, width, rows = self._segments
            self._rows = _split_rows(sizes, sources, starts, width, rows)
            self._segments = None
        return self._rows

    def tokens_by_source(self, num_sources: int) -> list[int]:
        """Tokens per source index, without cutting segments into rows."""
        if self._segments is not None:
            return _per_source(num_sources, self._segments[1], self._segments[0])
        lengths, sources, _ = self.rows
        return _per_source(num_sources, _flat(sources), _flat(lengths))

    def documents_by_source(self, num_sources: int) -> list[int]:
        """Segments that begin their document, per source index (a document cut across
        batches counts in the batch of its first piece)."""
        if self._segments is not None:
            if num_sources == 1:  # a count, not a sum per segment
                return [self._segments[2].count(True)]
            return _per_source(num_sources, self._segments[1], self._segments[2])
        _, sources, starts = self.rows
        return _per_source(num_sources, _flat(sources), _flat(starts))

    def __eq__(self, other: object) -> bool:
        return isinstance(other, RowLayout) and self.rows == other.rows

    __hash__ = None  # type: ignore[assignment]


def _flat(rows: Iterable[Iterable[T]]) -> Iterator[T]:
    return itertools.chain.from_iterable(rows)


def _per_source(num_sources: int, sources: Iterable[int], values: Iterable[int]) -> list[int]:
    """The sum of ``values`` (a segment's length, or its document-start flag) per source."""
    out = [0] * num_sources
    for s, value in zip(sources, values):
        out[s] += value
    return out


def _split_rows(
    sizes: list[int], sources: list[int], starts: list[bool], width: int, num_rows: int
) -> Rows:
    """Segments laid end to end, cut into rows of ``width``, then empty rows up to
    ``num_rows``: per row, its segments' lengths, sources and whether each begins its document
    (only a segment's first piece can)."""
    lengths: list[list[int]] = []
    by_source: list[list[int]] = []
    by_start: list[list[bool]] = []
    row_lengths: list[int] = []
    row_sources: list[int] = []
    row_starts: list[bool] = []
    space = width
    for size, source, start in zip(sizes, sources, starts):
        if size < space:  # ends inside the current row
            row_lengths.append(size)
            row_sources.append(source)
            row_starts.append(start)
            space -= size
            continue
        row_lengths.append(space)  # closes the current row, fills whole ones, starts one
        row_sources.append(source)
        row_starts.append(start)
        lengths.append(row_lengths)
        by_source.append(row_sources)
        by_start.append(row_starts)
        whole, rest = divmod(size - space, width)
        if whole:
            lengths += [[width] for _ in range(whole)]
            by_source += [[source] for _ in range(whole)]
            by_start += [[False] for _ in range(whole)]
        if rest:
            row_lengths, row_sources, row_starts = [rest], [source], [False]
        else:
            row_lengths, row_sources, row_starts = [], [], []
        space = width - rest
    if row_lengths:
        lengths.append(row_lengths)
        by_source.append(row_sources)
        by_start.append(row_starts)
    empty = num_rows - len(lengths)
    for out in (lengths, by_source, by_start):
        out.extend([] for _ in range(empty))
    return lengths, by_source, by_start
