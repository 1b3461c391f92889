"""The compiled search for every MDS sample's array (``zephon_torch._native.places``, run by
``ShardArrays`` once a shard's places are wanted) finds what numpy's ``array_bounds`` and
``places`` find, and refuses what they refuse: over random layouts (variable and fixed-size
columns before and after the array, a stated count or a shape header of 1, 2, 4 or 8 bytes,
any dtype size, odd byte shifts), well-formed samples, damaged ones and bytes at random."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from zephon_torch._compiled import native
from zephon_torch.io import _mds_bulk
from zephon_torch.io._mds_bulk import OneArray, ShardArrays, array_bounds, compiled_layout
from zephon_torch.io._views import TypedViews, places

pytestmark = pytest.mark.skipif(native is None, reason="zephon_torch._native was not built")


def sample(
    draw: Any, before: list[int | None], after: list[int | None], ours: dict[str, Any]
) -> tuple[bytes, int | None]:
    """One sample: the variable columns' lengths, then every column's bytes in order; and
    where its shape header's first byte lies (None: a stated count)."""
    itemsize, count = ours["itemsize"], ours["count"]
    values = count if count is not None else draw(st.integers(0, 6))
    body = draw(st.binary(min_size=values * itemsize, max_size=values * itemsize))
    if count is None:  # a shape header: one byte (1 dimension, its width), then the dimension
        code = draw(st.integers(0, 3))
        body = bytes([4 | code]) + values.to_bytes(1 << code, "little") + body
    columns = [draw(st.binary(min_size=s or 0, max_size=s if s is not None else 5)) for s in before]
    columns.append(body)
    columns += [draw(st.binary(min_size=s or 0, max_size=s if s is not None else 5)) for s in after]
    sizes = [*before, None if count is None else len(body), *after]
    lengths = b"".join(len(c).to_bytes(4, "little") for c, s in zip(columns, sizes) if s is None)
    shape_at = None if count is not None else len(lengths) + sum(map(len, columns[: len(before)]))
    return lengths + b"".join(columns), shape_at


@st.composite
def shards(draw: Any) -> tuple[bytes, np.ndarray[Any, Any], OneArray, int, int]:
    itemsize = draw(st.sampled_from([1, 2, 4, 8]))
    sized = st.one_of(st.none(), st.integers(0, 4))
    before, after = draw(st.lists(sized, max_size=3)), draw(st.lists(sized, max_size=2))
    count = draw(st.one_of(st.none(), st.integers(0, 4)))
    ours = {"itemsize": itemsize, "count": count}
    samples = [sample(draw, before, after, ours) for _ in range(draw(st.integers(1, 8)))]
    raw = bytearray(draw(st.binary(max_size=7)))  # a header: samples at any byte shift
    offsets, shapes = [len(raw)], []
    for one, shape_at in samples:
        if shape_at is not None:
            shapes.append(len(raw) + shape_at)
        raw += one
        offsets.append(len(raw))
    for _ in range(draw(st.integers(0, 2))):  # damage: a byte changed anywhere
        if raw:
            raw[draw(st.integers(0, len(raw) - 1))] = draw(st.integers(0, 255))
    if shapes and draw(st.booleans()):  # or a shape header's first byte
        raw[draw(st.sampled_from(shapes))] = draw(st.integers(0, 255))
    if draw(st.booleans()) and len(samples) > 1:  # or a sample boundary moved
        k = draw(st.integers(1, len(samples) - 1))
        offsets[k] = draw(st.integers(offsets[k - 1], offsets[k + 1]))
    variable = sum(s is None for s in (*before, *after)) + (count is None)
    fixed = sum(s or 0 for s in (*before, *after)) + (count or 0) * itemsize
    size = None if count is None else count * itemsize
    if draw(st.integers(0, 4)) == 0:  # a layout the samples do not follow (an index's damage)
        fixed = max(0, fixed + draw(st.integers(-2, 2)))
        size = None if size is None else size + draw(st.integers(0, 2))
    spec = OneArray(
        "tok",
        np.dtype(f"<u{itemsize}"),
        tuple(before),
        None if count is not None else sum(s is None for s in before),
        size,
        count,
    )
    return bytes(raw), np.asarray(offsets, dtype=np.int64), spec, variable, fixed


def compiled(raw: bytes, offsets: Any, spec: OneArray, variable: int, fixed: int) -> Any:
    assert native is not None
    count = len(offsets) - 1
    out = np.empty(count, np.uint8), np.empty(count, np.uint32), np.empty(count, np.uint32)
    layout = compiled_layout(spec, variable, fixed)
    return out if native.places(TypedViews(memoryview(raw)).raw(), offsets, layout, *out) else None


def with_numpy(raw: bytes, offsets: Any, spec: OneArray, variable: int, fixed: int) -> Any:
    views = TypedViews(memoryview(raw))
    positions = np.arange(len(offsets) - 1, dtype=np.int64)
    bounds = array_bounds(views, offsets, positions, spec, variable, fixed)
    if bounds is None:
        return None
    found = places(spec.dtype, *bounds)
    return tuple(a.astype(t) for a, t in zip(found, (np.uint8, np.uint32, np.uint32), strict=True))


def found_by_shard_arrays(
    raw: bytes, offsets: Any, spec: OneArray, variable: int, fixed: int
) -> Any:
    """What ``ShardArrays`` keeps for the whole shard (None: a sample is not as encoded)."""
    found = ShardArrays(TypedViews(memoryview(raw)), offsets, spec, variable, fixed)._find_all()
    return found if isinstance(found, tuple) else None


@settings(max_examples=400, deadline=None)
@given(shard=shards())
def test_the_compiled_places_are_numpy_s(shard: tuple[Any, ...]) -> None:
    expected, got = with_numpy(*shard), compiled(*shard)
    kept = [found_by_shard_arrays(*shard)]  # compiled, then numpy as where it is not built
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(_mds_bulk, "_native", None)
        kept.append(found_by_shard_arrays(*shard))
    for other in (got, *kept):
        assert (other is None) == (expected is None)
        if other is not None:
            for a, b in zip(other, expected, strict=True):
                assert a.dtype == b.dtype and a.tolist() == b.tolist()


def test_arrays_of_other_types_or_sizes_and_impossible_layouts_are_refused() -> None:
    assert native is not None
    raw, offsets = np.zeros(16, np.uint8), np.array([0, 8, 16], np.int64)
    good = np.empty(2, np.uint8), np.empty(2, np.uint32), np.empty(2, np.uint32)
    layout = (0, 8, 0, 0, -1, 8, 2, 4)  # two int32 of a stated shape, nothing else
    assert native.places(raw, offsets, layout, *good)
    assert [a.tolist() for a in good] == [[0, 0], [0, 2], [2, 4]]
    for shifts, firsts, stops in (
        (np.empty(2, np.uint16), good[1], good[2]),
        (good[0], np.empty(2, np.int64), good[2]),
        (good[0], good[1], np.empty(3, np.uint32)),
    ):
        with pytest.raises(ValueError, match="must be 1-D"):
            native.places(raw, offsets, layout, shifts, firsts, stops)
    with pytest.raises(ValueError, match="must be 1-D"):
        native.places(raw, offsets.astype(np.int32), layout, *good)
    for impossible in (
        (0, 8, 0, 0, -1, 8, 2, 3),
        (1, 8, 0, 2, -1, 8, 2, 4),
        (0, -1, 0, 0, -1, 8, 2, 4),
    ):
        with pytest.raises(ValueError, match="impossible layout"):
            native.places(raw, offsets, impossible, *good)


def test_samples_of_more_than_64_variable_columns_are_found_as_numpy_finds_them() -> None:
    # MDS puts no bound on a row's columns: 70 of variable size (text, say) lead every sample
    # with 70 lengths, the token array's shape header after the first 40 columns
    variable, earlier = 70, 40
    raw, offsets = bytearray(b"\x07"), [1]
    for i in range(5):
        columns = [b"x" * ((i + k) % 3) for k in range(variable - 1)]
        columns.insert(earlier, bytes([4, i]) + bytes(range(2 * i)))  # i uint16 values
        raw += b"".join(len(c).to_bytes(4, "little") for c in columns) + b"".join(columns)
        offsets.append(len(raw))
    spec = OneArray("tok", np.dtype("<u2"), (None,) * earlier, earlier, None, None)
    shard = bytes(raw), np.asarray(offsets, dtype=np.int64), spec, variable, 0
    expected = with_numpy(*shard)
    assert expected is not None
    for found in (compiled(*shard), found_by_shard_arrays(*shard)):
        assert found is not None
        assert [a.tolist() for a in found] == [a.tolist() for a in expected]


@pytest.mark.parametrize(
    "layout",
    [
        (0, 32, 2**63 - 1, 0, -1, 10, -1, 1),  # fixed-size bytes before the array past the end
        (0, 32, 0, 0, -1, 2**63 - 8, 2**60 - 1, 8),  # an array's size past it
    ],
)
def test_layout_sizes_past_a_sample_are_refused_reading_nothing_outside_it(
    layout: tuple[int, ...],
) -> None:
    # sums of such sizes past 2**63 once wrapped below the sample's end: the first read a
    # shape byte about 2**63 bytes before the buffer, the second kept 2**60 values of 8 bytes
    # in a sample of 32
    assert native is not None
    raw, offsets = np.zeros(64, np.uint8), np.array([16, 48], np.int64)  # one 32-byte sample
    out = np.empty(1, np.uint8), np.empty(1, np.uint32), np.empty(1, np.uint32)
    assert not native.places(raw, offsets, layout, *out)


def test_offsets_that_descend_are_refused_reading_nothing_outside_the_buffer() -> None:
    # a sample ending far below its start: end - start once wrapped to about 2**63, past the
    # check that the sample holds its 40 lengths, which were then read from the 160 bytes
    # after the 16 of the buffer (zeros here, of the array it is a slice of) and the sample
    # kept as one value
    assert native is not None
    raw, offsets = np.zeros(256, np.uint8)[:16], np.array([5, -(2**63)], np.int64)
    out = np.empty(1, np.uint8), np.empty(1, np.uint32), np.empty(1, np.uint32)
    layout = (40, 2**63 - 165, 0, 0, -1, 4, 1, 4)  # the fixed bytes that end - start says
    assert not native.places(raw, offsets, layout, *out)
