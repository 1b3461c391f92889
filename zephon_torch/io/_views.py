"""Arrays of one dtype over a shard's bytes: a row's array is a slice of a view made once.

`np.frombuffer` on a slice of a memory map costs about 0.5 us a call (it takes a new buffer
export each time); slicing a numpy view of the whole buffer costs a fifth of that. Rows start
at any byte, so there is one view per byte shift within the dtype's size; views of shifted
bytes are unaligned, which numpy reads as well (their copies into batches take the same time).

Readers hand a request's rows over as ``TokenSpans``: each row's place in one of those views,
the view itself made only when the row is asked for.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Any, overload

import numpy as np
import numpy.typing as npt


class TypedViews:
    """Numpy views of ``data`` (read-only when it is), made on first use and kept."""

    __slots__ = ("_data", "_views")

    def __init__(self, data: memoryview) -> None:
        self._data = data
        self._views: dict[tuple[str, int], npt.NDArray[Any]] = {}

    def raw(self) -> npt.NDArray[np.uint8]:
        """The bytes as a uint8 array (no copy)."""
        return self._view(np.dtype(np.uint8), 0)

    def slices(
        self,
        dtype: np.dtype[Any],
        begins: npt.NDArray[np.int64],
        counts: npt.NDArray[np.int64],
    ) -> TokenSpans:
        """For each row, the ``counts[i]`` values of ``dtype`` from byte ``begins[i]`` on; the
        caller has checked that they lie within the buffer."""
        return self.pieces(dtype, *places(dtype, begins, counts))

    def pieces(
        self,
        dtype: np.dtype[Any],
        shifts: npt.NDArray[Any],
        firsts: npt.NDArray[Any],
        stops: npt.NDArray[Any],
    ) -> TokenSpans:
        """For each row, values ``firsts[i]`` to ``stops[i]`` of the view of ``dtype``
        shifted by ``shifts[i]`` bytes (see ``places``)."""
        views = np.empty(dtype.itemsize, object)  # one per byte shift, picked by numpy
        for shift in range(dtype.itemsize):
            views[shift] = self._view(dtype, shift)
        bases = views[shifts]
        return TokenSpans(
            bases, firsts.astype(np.int64, copy=False), stops.astype(np.int64, copy=False)
        )

    def _view(self, dtype: np.dtype[Any], shift: int) -> npt.NDArray[Any]:
        key = (dtype.str, shift)
        found = self._views.get(key)
        if found is None:  # two threads may both make it: the same view either way
            usable = max(0, (len(self._data) - shift) // dtype.itemsize * dtype.itemsize)
            raw = np.frombuffer(self._data, np.uint8)
            found = self._views[key] = raw[shift : shift + usable].view(dtype)
        return found


def places(
    dtype: np.dtype[Any], begins: npt.NDArray[np.int64], counts: npt.NDArray[np.int64]
) -> tuple[npt.NDArray[np.int64], npt.NDArray[np.int64], npt.NDArray[np.int64]]:
    """Where ``counts[i]`` values of ``dtype`` from byte ``begins[i]`` on lie among the
    shifted views: each row's byte shift, and its first and end value in that view."""
    itemsize = dtype.itemsize
    shifts = begins % itemsize
    firsts = (begins - shifts) // itemsize
    return shifts, firsts, firsts + counts


class TokenSpans(Sequence[npt.NDArray[Any]]):
    """Rows' token ids as spans of a few 1-D arrays: row ``i`` is ``bases[i][firsts[i]:
    stops[i]]``, a view made only where it is asked for (``[i]``, or iterating). A sequence
    of the rows' arrays, as a list of them would be.

    A view costs about 80 ns to make, most of what a row cost a packer that takes whole
    documents from a chunk: that packer hands the spans themselves to the copy instead
    (``(base, first, stop)``, see ``ops._copy.fill``), which asks each base for its buffer
    once. The places are int64 arrays, so a chunk's sums and extremes are numpy's work."""

    __slots__ = ("bases", "firsts", "stops")

    def __init__(
        self,
        bases: npt.NDArray[np.object_],
        firsts: npt.NDArray[np.int64],
        stops: npt.NDArray[np.int64],
    ) -> None:
        """``bases``: an object array of each row's array (numpy picks and joins them)."""
        self.bases, self.firsts, self.stops = bases, firsts, stops

    @classmethod
    def of(cls, arrays: Sequence[npt.NDArray[Any]]) -> TokenSpans:
        """``arrays`` as spans, each array whole (the spans themselves where they are)."""
        if isinstance(arrays, TokenSpans):
            return arrays
        count = len(arrays)
        stops = np.fromiter(map(len, arrays), np.int64, count)
        return cls(np.fromiter(arrays, object, count), np.zeros(count, np.int64), stops)

    @classmethod
    def repeated(
        cls, base: npt.NDArray[Any], firsts: npt.NDArray[np.int64], stops: npt.NDArray[np.int64]
    ) -> TokenSpans:
        """Rows all of ``base``."""
        bases = np.empty(len(firsts), object)
        bases.fill(base)
        return cls(bases, firsts, stops)

    @classmethod
    def joined(cls, groups: list[TokenSpans], order: npt.NDArray[np.int64]) -> TokenSpans:
        """The rows of ``groups`` laid end to end, then taken in ``order`` (indices into
        them)."""
        if not groups:
            return cls.of([])
        return cls(
            np.concatenate([g.bases for g in groups])[order],
            np.concatenate([g.firsts for g in groups])[order],
            np.concatenate([g.stops for g in groups])[order],
        )

    def __len__(self) -> int:
        return len(self.bases)

    @overload
    def __getitem__(self, i: int) -> npt.NDArray[Any]: ...

    @overload
    def __getitem__(self, i: slice) -> TokenSpans: ...

    def __getitem__(self, i: int | slice) -> npt.NDArray[Any] | TokenSpans:
        if isinstance(i, slice):
            return TokenSpans(self.bases[i], self.firsts[i], self.stops[i])
        base: npt.NDArray[Any] = self.bases[i]
        return base[int(self.firsts[i]) : int(self.stops[i])]

    def __iter__(self) -> Iterator[npt.NDArray[Any]]:
        for base, first, stop in zip(
            self.bases.tolist(), self.firsts.tolist(), self.stops.tolist(), strict=True
        ):
            yield base[first:stop]

    def __repr__(self) -> str:
        return f"TokenSpans({len(self)} rows)"
