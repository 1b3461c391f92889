"""MDS rows that keep a single 1-D `ndarray` column of a stated dtype (a token column,
typically), read for a whole request at once.

The column's place, its length and the shape header of every requested sample are found with
numpy over the shard's bytes (for a whole shard, compiled where it was built); each row is then
a slice of a typed view (`_views`). Any sample that is not as the encoding says makes the whole
request return None: the caller decodes it sample by sample, and the per-sample decoder names the
sample that does not decode.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt

from zephon_torch._compiled import native as _native
from zephon_torch.io._mds_columns import array_config
from zephon_torch.io._views import TokenSpans, TypedViews, places


@dataclass(frozen=True)
class OneArray:
    """Rows that keep one `ndarray` column of a stated dtype and one dimension (a token
    column, typically): read for a whole request at once by `ShardArrays`."""

    name: str
    dtype: np.dtype[Any]
    before: tuple[int | None, ...]  # sizes of the columns stored before it (None: variable)
    length_at: int | None  # its place among the variable columns; None when fixed-size
    size: int | None  # its bytes when fixed-size
    count: int | None  # elements of a fixed shape, or None when each sample states its own


# fewer rows are decoded one by one until a shard's places are found (`ShardArrays`): a request
# of its own costs about as much as decoding 30 rows
BULK_ROWS = 32
# a shard's places are found at once once an eighth of it was asked for, or a 64th where the
# compiled search finds them (10 times faster: `ShardArrays`)
_FIND_ALL_SHARE = 8
_FIND_ALL_SHARE_COMPILED = 64
_STEPS = np.arange(8, dtype=np.int64)


def one_array(
    names: tuple[str, ...],
    encodings: tuple[str, ...],
    sizes: tuple[int | None, ...],
    kept: tuple[int, ...],
) -> OneArray | None:
    """The fast layout of rows keeping a single `ndarray:<dtype>` column of one dimension
    (stated or per sample), else None."""
    if len(kept) != 1:
        return None
    column = kept[0]
    name, _, config = encodings[column].partition(":")
    if name != "ndarray":
        return None
    dtype, shape = array_config(config)
    if dtype is None or (shape is not None and len(shape) != 1):
        return None
    before = sizes[:column]
    length_at = None if sizes[column] is not None else sum(s is None for s in before)
    count = None if shape is None else shape[0]
    return OneArray(names[column], dtype, before, length_at, sizes[column], count)


class ShardArrays:
    """``spec``'s column of one shard's samples (which lead with ``variable`` lengths and
    hold ``fixed`` bytes of fixed-size columns), read for a whole request at once.

    Where each sample's array lies is found for every sample of the shard once this process
    has asked for a 64th of its samples, in one compiled pass (``zephon_torch._native.places``:
    10 ns a sample), or for an eighth where numpy finds them (105 ns a sample: the module is
    not built), and kept (9 bytes a sample): a request is then a slice of a typed view a row.
    Found per request, it cost 3 times the slicing (a pass over MDS shards spent 0.54 us a
    document where `.npy` spent 0.17); found for the whole shard where a process reads few of
    its rows (one lane of many), it cost far more than the rows read (with numpy, 0.1 us a
    sample: 32 ms for 300,000, for a lane of 64 reading 4,688; compiled, a tenth of that).
    Before that, and for good where the shard holds a sample that is not as the encoding says,
    each request finds its own (`array_bounds`), in bulk where it avoids that sample."""

    __slots__ = ("_asked", "_fixed", "_found", "_offsets", "_spec", "_variable", "_views")

    def __init__(
        self,
        views: TypedViews,
        offsets: npt.NDArray[np.int64],
        spec: OneArray,
        variable: int,
        fixed: int,
    ) -> None:
        self._views, self._offsets, self._spec = views, offsets, spec
        self._variable, self._fixed = variable, fixed
        self._found: tuple[npt.NDArray[Any], ...] | bool | None = None  # False: a bad sample
        self._asked = 0  # the rows asked for while not found (as threads count them: about)

    @property
    def found(self) -> bool:
        """Whether the places of every sample are found and kept (a request of any size is
        then cheaper read in bulk than decoded)."""
        return isinstance(self._found, tuple)

    def read(self, positions: npt.NDArray[np.int64]) -> TokenSpans | None:
        """The arrays at ``positions`` (in range), as spans of read-only views of the shard;
        None when one of them is not as the encoding says (the per-sample decoder then names
        it)."""
        found = self._found
        if found is None:
            self._asked += len(positions)
            share = _FIND_ALL_SHARE if _native is None else _FIND_ALL_SHARE_COMPILED
            if self._asked * share >= len(self._offsets) - 1:
                # two threads may both find them: the same places either way
                found = self._found = self._find_all()
        if not isinstance(found, tuple):
            bounds = self._bounds(positions)
            return None if bounds is None else self._views.slices(self._spec.dtype, *bounds)
        shifts, firsts, stops = (column[positions] for column in found)
        return self._views.pieces(self._spec.dtype, shifts, firsts, stops)

    def _bounds(
        self, positions: npt.NDArray[np.int64]
    ) -> tuple[npt.NDArray[np.int64], npt.NDArray[np.int64]] | None:
        return array_bounds(
            self._views, self._offsets, positions, self._spec, self._variable, self._fixed
        )

    def _find_all(self) -> tuple[npt.NDArray[Any], ...] | bool:
        if _native is not None:  # the same checks and places, in one compiled pass
            count = len(self._offsets) - 1
            found = tuple(np.empty(count, dtype) for dtype in (np.uint8, np.uint32, np.uint32))
            layout = compiled_layout(self._spec, self._variable, self._fixed)
            kept = _native.places(self._views.raw(), self._offsets, layout, *found)
            return found if kept else False
        bounds = self._bounds(np.arange(len(self._offsets) - 1, dtype=np.int64))
        if bounds is None:
            return False
        shifts, firsts, stops = places(self._spec.dtype, *bounds)
        # a shard's offsets are 4-byte (MDS): its values' places fit in 32 bits
        return shifts.astype(np.uint8), firsts.astype(np.uint32), stops.astype(np.uint32)


def compiled_layout(spec: OneArray, variable: int, fixed: int) -> tuple[int, ...]:
    """``spec``'s place in a sample for ``zephon_torch._native.places``: (variable, fixed,
    bytes of the fixed-size columns before it, variable columns before it, its place among
    the variable ones, its size, its stated count, its dtype's size), -1 for a None."""
    before = spec.before
    return (
        variable,
        fixed,
        sum(size or 0 for size in before),
        sum(size is None for size in before),
        -1 if spec.length_at is None else spec.length_at,
        -1 if spec.size is None else spec.size,
        -1 if spec.count is None else spec.count,
        spec.dtype.itemsize,
    )


def array_bounds(
    views: TypedViews,
    offsets: npt.NDArray[np.int64],
    positions: npt.NDArray[np.int64],
    spec: OneArray,
    variable: int,
    fixed: int,
) -> tuple[npt.NDArray[np.int64], npt.NDArray[np.int64]] | None:
    """Where the arrays of ``spec``'s column at ``positions`` lie in the shard (whose
    samples lead with ``variable`` lengths and hold ``fixed`` bytes of fixed-size columns):
    each one's first byte and count of values, found for every sample at once with numpy
    (column places, lengths and shape headers). None when any sample is not as the encoding
    says (the per-sample decoder then names it)."""
    raw = views.raw()
    last = len(raw) - 1
    starts = offsets[positions]
    ends = offsets[positions + 1]

    def little(at: npt.NDArray[np.int64], width: int) -> npt.NDArray[np.int64]:
        # little-endian unsigned ints of `width` (1, 2, 4 or 8) bytes at byte offsets `at`
        # (of any shape), gathered at once, flat (clipped to the buffer: a sample too short
        # for them is refused below); 8-byte values of 2**63 or more come out negative
        gathered = raw[np.minimum(at[..., None] + _STEPS[:width], last)]
        values: npt.NDArray[np.int64] = gathered.view(f"<u{width}").reshape(-1).astype(np.int64)
        return values

    if (ends - starts < 4 * variable).any():
        return None
    # each sample's `variable` leading lengths, read at once: [samples, variable]
    lengths = little(starts[:, None] + 4 * np.arange(variable), 4).reshape(len(starts), variable)
    # every sample is its columns end to end: one the index says more or less of is damaged
    # (an index of another write: each row would lose its last ids, or gain another's)
    if (starts + 4 * variable + fixed + lengths.sum(axis=1) != ends).any():
        return None
    before = spec.before
    earlier = sum(size is None for size in before)  # variable columns before it
    column = starts + 4 * variable + sum(size or 0 for size in before)
    column = column + lengths[:, :earlier].sum(axis=1)
    itemsize = spec.dtype.itemsize
    if spec.length_at is None:
        column_end = column + (spec.size or 0)
    else:
        column_end = column + lengths[:, spec.length_at]
    if (column_end > ends).any():
        return None
    if spec.count is None:  # a shape header per sample: one byte, then one dimension
        if (column >= column_end).any():
            return None
        shape_byte = raw[column].astype(np.int64)
        if (shape_byte >> 2 != 1).any():
            return None
        codes = shape_byte & 3
        widths = 1 << codes
        begin = column + 1 + widths
        counts = np.zeros(len(positions), dtype=np.int64)
        # the widths present, counted rather than sorted (np.unique was a sixth of the time)
        for code in np.flatnonzero(np.bincount(codes, minlength=4)).tolist():
            chosen = codes == code
            counts[chosen] = little(column[chosen] + 1, 1 << code)
    else:
        begin = column
        counts = np.full(len(positions), spec.count, dtype=np.int64)
    room = column_end - begin  # a dimension of 2**63 or more read as int64 is negative:
    if (room < 0).any() or (counts < 0).any() or (counts > room).any():
        return None
    if (counts * itemsize != room).any():
        return None
    return begin, counts
