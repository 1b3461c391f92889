"""A lane's state packed for a saved state (``_packed_rows``): a bin packer's rows and the
per-source counts read back exactly, reader columns of version 3 still do, and a damaged
packing is refused naming it."""

from __future__ import annotations

import base64
import json
import tracemalloc
import zlib
from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from zephon_torch._packed_rows import (
    pack_lanes,
    pack_rows,
    pack_sources,
    unpack_lanes,
    unpack_readers,
    unpack_rows,
    unpack_sources,
)
from zephon_torch.errors import StateMismatchError

_BIG = (1 << 48) - 1
_piece = st.tuples(
    st.integers(0, 7), st.integers(0, 1000), st.integers(0, _BIG), st.integers(0, 1 << 20)
).flatmap(
    lambda t: st.integers(t[3], t[3] + (1 << 20)).map(lambda end: [t[0], t[1], t[2], t[3], end])
)
_rows = st.lists(st.lists(_piece, max_size=12), max_size=8)


@settings(deadline=None)
@given(bins=_rows, ready=_rows)
def test_packed_rows_read_back_exactly(bins: list[Any], ready: list[Any]) -> None:
    packer = {"bins": bins, "ready": ready}
    packed = json.loads(json.dumps(pack_rows(packer)))  # through JSON, as a checkpoint goes
    assert set(packed) == {"rows", "open", "pieces"}
    assert unpack_rows(packed) == packer


def _per_source(readers: list[Any], carry: list[Any] | None = None) -> dict[str, Any]:
    count = len(readers)
    return {
        "readers": readers,
        "delivered": [[40 * i, i] for i in range(count)],
        "active": [i % 2 == 0 for i in range(count)],
        "carry": carry if carry is not None else [[] for _ in range(count)],
        "skipped": {"too_long": 1},
    }


def test_bin_packers_rows_and_plain_per_source_states_are_packed_under_shuffle_too() -> None:
    rows = {"bins": [[[0, 0, 4, 0, 2]], []], "ready": []}
    readers = [{"pass": 0, "pos": 5, "filtered": 0}, {"pass": 1, "pos": 2, "filtered": 3}]
    filtered = [{"reader": readers[0], "filter": {"seen": 4}, "rejected": 1}]  # stateful
    plain = {**_per_source(readers, [[], [[1, 1, 1, 0, 7]]]), "packer": {}}
    lanes: dict[str, Any] = {
        "0": None,  # not begun
        "1": {"turn": 3, "pack": plain},  # wrap: no rows
        "2": {"turn": 3, "pack": {"block": 1, "emitted": 0, "start": {**plain, "packer": rows}}},
        "3": {"turn": 3, "pack": {**_per_source(filtered), "packer": {}}},
    }
    packed = pack_lanes(lanes)
    assert packed["0"] is None
    assert set(packed["1"]["pack"]) == {"sources", "skipped", "packer"}
    assert packed["1"]["pack"]["skipped"] == {"too_long": 1}
    assert packed["2"]["pack"]["start"]["packer"]["rows"] == [1, 0]
    assert packed["2"]["pack"]["start"]["sources"] == packed["1"]["pack"]["sources"]
    assert packed["3"] == lanes["3"]  # a stateful filter's readers stay as they are
    assert lanes["2"]["pack"]["start"]["packer"] is rows  # the caller's state is left alone
    assert lanes["1"]["pack"] is plain and "sources" not in plain
    assert unpack_lanes(json.loads(json.dumps(packed))) == lanes


_count = st.integers(0, _BIG)
_source = st.tuples(
    st.fixed_dictionaries({"pass": st.integers(0, 99), "pos": _count, "filtered": _count}),
    st.tuples(_count, _count).map(list),
    st.booleans(),
    st.one_of(st.just([]), _piece.map(lambda piece: [piece])),
)


@settings(deadline=None)
@given(sources=st.lists(_source, min_size=1, max_size=40))
def test_per_source_states_read_back_exactly(sources: list[Any]) -> None:
    readers, delivered, active, carry = (list(column) for column in zip(*sources, strict=True))
    mixpack = {"readers": readers, "delivered": delivered, "active": active, "carry": carry}
    mixpack["packer"] = {}
    packed = json.loads(json.dumps(pack_sources(mixpack)))  # through JSON, as a checkpoint goes
    assert set(packed) == {"sources", "packer"}
    assert unpack_sources(packed) == mixpack


@pytest.mark.parametrize(
    "change",
    [
        lambda m: m["delivered"].append([1, 1]),  # lengths differ
        lambda m: m["active"].__setitem__(0, 1),  # an int for a flag
        lambda m: m["carry"].__setitem__(0, [[0, 0, 1, 0, 2], [0, 0, 2, 0, 2]]),  # two pieces
        lambda m: m["carry"].__setitem__(0, [[0, 0, 1, 0]]),  # a piece of four
        lambda m: m["readers"].__setitem__(0, {"pass": 0, "pos": 1 << 48, "filtered": 0}),
        lambda m: m["readers"].__setitem__(0, {"pass": 0, "pos": True, "filtered": 0}),
        lambda m: m["readers"].__setitem__(0, {"pass": 0, "pos": 1, "filtered": 0, "seen": 3}),
        lambda m: m["delivered"].__setitem__(0, [1.5, 1]),
    ],
)
def test_a_per_source_state_that_would_not_read_back_exactly_stays_as_lists(change: Any) -> None:
    mixpack = _per_source([{"pass": 0, "pos": 5, "filtered": 0}] * 2)
    change(mixpack)
    assert pack_sources(mixpack) is mixpack


def _encoded(values: list[int]) -> str:
    raw = np.array(values, "<i8").view(np.uint8).reshape(-1, 8).T.tobytes()
    return base64.b64encode(zlib.compress(raw)).decode("ascii")


@pytest.mark.parametrize(
    ("change", "said"),
    [
        (lambda s: s[:-8], "zlib in base64"),
        (lambda s: "not base64!", "zlib in base64"),
        (lambda s: _encoded([2, 0, 0]), "2 values for 2 sources"),
        (lambda s: _encoded([1, 0, 5, 0, 9, 1, 2, 0]), "active and carried flags of 0 or 1"),
        (lambda s: _encoded([1, 0, 5, 0, 9, 1, 1, 1, 0, 0, 5]), "1 carried pieces of 5"),
    ],
)
def test_a_damaged_per_source_packing_is_refused_naming_it(change: Any, said: str) -> None:
    packed = pack_sources(_per_source([{"pass": 0, "pos": 5, "filtered": 0}] * 3))
    damaged = {**packed, "sources": change(packed["sources"])}
    with pytest.raises(StateMismatchError, match=r"pack\.sources") as refused:
        unpack_sources(damaged)
    assert said in str(refused.value)
    lanes = {"7": {"turn": 1, "pack": {"block": 0, "emitted": 0, "start": damaged}}}
    with pytest.raises(StateMismatchError, match=r"lane 7 pack\.start\.sources"):
        unpack_lanes(lanes)


@settings(deadline=None)
@given(
    readers=st.lists(
        st.fixed_dictionaries(
            {"pass": st.integers(0, 99), "pos": st.integers(0, _BIG), "filtered": st.integers(0, 9)}
        ),
        min_size=1,
        max_size=40,
    )
)
def test_version_3_reader_columns_read_back_exactly(readers: list[dict[str, int]]) -> None:
    columns = {key: [r[key] for r in readers] for key in ("pass", "pos", "filtered")}
    assert unpack_readers(json.loads(json.dumps(columns))) == readers


@pytest.mark.parametrize(
    "columns",
    [
        {"pass": [0], "pos": [1, 2], "filtered": [0]},
        {"pass": [0], "pos": [1]},
        {"pass": [0], "pos": 1, "filtered": [0]},
    ],
)
def test_damaged_reader_columns_are_refused_naming_them(columns: dict[str, Any]) -> None:
    with pytest.raises(StateMismatchError, match=r"pack\.readers"):
        unpack_readers(columns)


@pytest.mark.parametrize(
    ("change", "said"),
    [
        (lambda p: p.update(pieces=p["pieces"][:-8]), "zlib in base64"),
        (lambda p: p.update(pieces="not base64!"), "zlib in base64"),
        (lambda p: p.update(rows=[*p["rows"], 1]), "pieces of 5 int64"),
        (lambda p: p.update(rows=["2", 1]), "rows: the pieces of each row"),
        (lambda p: p.update(open=5), "open: how many of the rows are open"),
    ],
)
def test_a_damaged_packing_is_refused_naming_it(change: Any, said: str) -> None:
    packer = pack_rows({"bins": [[[0, 0, 5, 0, 9], [1, 0, 2, 3, 4]]], "ready": [[[0, 0, 6, 0, 1]]]})
    change(packer)
    with pytest.raises(StateMismatchError, match=r"pack\.packer\.pieces") as refused:
        unpack_rows(packer)
    assert said in str(refused.value)


def _appended(encoded: str, extra: bytes) -> str:
    """``encoded`` (base64 of a zlib stream) with ``extra`` after the stream, still valid
    base64: zlib alone read such a string as the stream before it, the rest ignored."""
    return base64.b64encode(base64.b64decode(encoded) + extra).decode("ascii")


@pytest.mark.parametrize(
    "extra",
    [
        b"garbage!",
        zlib.compress(b"\x00" * 8),  # another stream: two lanes' strings joined by hand
    ],
    ids=["garbage", "another stream"],
)
def test_a_packing_with_something_after_its_stream_is_refused(extra: bytes) -> None:
    mixpack = _per_source([{"pass": 0, "pos": 5, "filtered": 0}] * 3)
    packed = pack_sources(mixpack)
    assert unpack_sources(packed) == mixpack
    damaged = {**packed, "sources": _appended(packed["sources"], extra)}
    with pytest.raises(StateMismatchError, match=r"pack\.sources") as refused:
        unpack_sources(damaged)
    assert "after the stream's end" in str(refused.value)
    packer = pack_rows({"bins": [[[0, 0, 5, 0, 9]]], "ready": []})
    packer["pieces"] = _appended(packer["pieces"], extra)
    with pytest.raises(StateMismatchError, match=r"pack\.packer\.pieces"):
        unpack_rows(packer)


@pytest.mark.parametrize("key", ["readers", "delivered", "active", "carry"])
def test_a_packing_beside_lists_of_the_per_source_part_is_refused(key: str) -> None:
    """A state holding both (hand-edited: no release writes it) read the packed string and
    dropped the lists, an edit of them lost without a word."""
    mixpack = _per_source([{"pass": 0, "pos": 5, "filtered": 0}] * 2)
    edited = {**pack_sources(mixpack), key: mixpack[key]}
    with pytest.raises(StateMismatchError, match=r"pack\.sources") as refused:
        unpack_sources(edited)
    assert f"not also as lists (['{key}'])" in str(refused.value)


def _bomb(size: int) -> str:
    """Base64 of one zlib stream of ``size`` zero bytes: a few hundred KiB that inflate to
    ``size``."""
    deflater, chunk = zlib.compressobj(9), b"\x00" * (1 << 20)
    parts = [deflater.compress(chunk) for _ in range(size >> 20)]
    return base64.b64encode(b"".join([*parts, deflater.flush()])).decode("ascii")


def test_a_packing_that_inflates_past_its_counts_is_refused_without_inflating_it() -> None:
    """An edited string of a few hundred KiB stood for 256 MiB, all of it held in memory
    before its length was compared; inflating now stops one byte past what the counts
    allow (the rows' pieces; at most 65,536 sources)."""
    bomb = _bomb(256 << 20)
    packer = pack_rows({"bins": [[[0, 0, 5, 0, 9]]], "ready": []})
    packer["pieces"] = bomb
    tracemalloc.start()
    try:
        with pytest.raises(StateMismatchError, match=r"pack\.packer\.pieces") as rows:
            unpack_rows(packer)
        packed = pack_sources(_per_source([{"pass": 0, "pos": 5, "filtered": 0}] * 2))
        with pytest.raises(StateMismatchError, match=r"pack\.sources") as sources:
            unpack_sources({**packed, "sources": bomb})
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert "inflates past the 40 bytes its counts allow" in str(rows.value)
    assert "inflates past the" in str(sources.value)
    assert peak < 32 << 20, f"{peak:,} bytes held while refusing"


def test_more_sources_than_a_packing_holds_stay_as_lists() -> None:
    mixpack = _per_source([{"pass": 0, "pos": 5, "filtered": 0}] * ((1 << 16) + 1))
    assert pack_sources(mixpack) is mixpack
    fewer = _per_source([{"pass": 0, "pos": 5, "filtered": 0}] * (1 << 16))
    assert unpack_sources(pack_sources(fewer)) == fewer
