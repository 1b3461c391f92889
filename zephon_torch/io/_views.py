"""Arrays of one dtype over a shard's bytes: a row's array is a slice of a view made once.

`np.frombuffer` on a slice of a memory map costs about 0.5 us a call (it takes a new buffer
export each time); slicing a numpy view of the whole buffer costs a fifth of that. Rows start
at any byte, so there is one view per byte shift within the dtype's size; views of shifted
bytes are unaligned, which numpy reads as well (their copies into batches take the same time).
"""

from __future__ import annotations

from typing import Any

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
    ) -> list[npt.NDArray[Any]]:
        """For each row, the ``counts[i]`` values of ``dtype`` from byte ``begins[i]`` on; the
        caller has checked that they lie within the buffer."""
        shifts, firsts, stops = places(dtype, begins, counts)
        return self.pieces(dtype, shifts.tolist(), firsts.tolist(), stops.tolist())

    def pieces(
        self, dtype: np.dtype[Any], shifts: list[int], firsts: list[int], stops: list[int]
    ) -> list[npt.NDArray[Any]]:
        """For each row, values ``firsts[i]`` to ``stops[i]`` of the view of ``dtype``
        shifted by ``shifts[i]`` bytes (see ``places``)."""
        views = [self._view(dtype, shift) for shift in range(dtype.itemsize)]
        return [
            views[shift][first:stop]
            for shift, first, stop in zip(shifts, firsts, stops, strict=True)
        ]

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
