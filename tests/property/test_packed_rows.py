"""A bin packer's rows packed for a saved state (``_packed_rows``): read back exactly, and a
damaged packing is refused naming it."""

from __future__ import annotations

import json
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from zephon_torch._packed_rows import (
    pack_lanes,
    pack_readers,
    pack_rows,
    unpack_lanes,
    unpack_readers,
    unpack_rows,
)
from zephon_torch.errors import StateMismatchError

_BIG = (1 << 48) - 1
_piece = st.tuples(
    st.integers(0, 7), st.integers(0, 1000), st.integers(0, _BIG), st.integers(0, 1 << 20)
).flatmap(
    lambda t: st.integers(t[3], t[3] + (1 << 20)).map(lambda end: [t[0], t[1], t[2], t[3], end])
)
_rows = st.lists(st.lists(_piece, max_size=12), max_size=8)


@given(bins=_rows, ready=_rows)
def test_packed_rows_read_back_exactly(bins: list[Any], ready: list[Any]) -> None:
    packer = {"bins": bins, "ready": ready}
    packed = json.loads(json.dumps(pack_rows(packer)))  # through JSON, as a checkpoint goes
    assert set(packed) == {"rows", "open", "pieces"}
    assert unpack_rows(packed) == packer


def test_bin_packers_rows_and_plain_readers_are_packed_under_shuffle_too() -> None:
    rows = {"bins": [[[0, 0, 4, 0, 2]], []], "ready": []}
    readers = [{"pass": 0, "pos": 5, "filtered": 0}, {"pass": 1, "pos": 2, "filtered": 3}]
    filtered = [{"reader": readers[0], "filter": {"seen": 4}, "rejected": 1}]  # stateful
    lanes: dict[str, Any] = {
        "0": None,  # not begun
        "1": {"turn": 3, "pack": {"readers": readers, "packer": {}}},  # wrap: no rows
        "2": {
            "turn": 3,
            "pack": {"block": 1, "emitted": 0, "start": {"readers": readers, "packer": rows}},
        },
        "3": {"turn": 3, "pack": {"readers": filtered, "packer": {}}},
    }
    packed = pack_lanes(lanes)
    assert packed["0"] is None
    columns = {"pass": [0, 1], "pos": [5, 2], "filtered": [0, 3]}
    assert packed["1"]["pack"] == {"readers": columns, "packer": {}}
    assert packed["2"]["pack"]["start"]["packer"]["rows"] == [1, 0]
    assert packed["2"]["pack"]["start"]["readers"] == columns
    assert packed["3"] == lanes["3"]  # a stateful filter's readers stay as they are
    assert lanes["2"]["pack"]["start"]["packer"] is rows  # the caller's state is left alone
    assert lanes["1"]["pack"]["readers"] is readers
    assert unpack_lanes(json.loads(json.dumps(packed))) == lanes


@given(
    readers=st.lists(
        st.fixed_dictionaries(
            {"pass": st.integers(0, 99), "pos": st.integers(0, _BIG), "filtered": st.integers(0, 9)}
        ),
        min_size=1,
        max_size=40,
    )
)
def test_reader_columns_read_back_exactly(readers: list[dict[str, int]]) -> None:
    packed = json.loads(json.dumps(pack_readers(readers)))
    assert unpack_readers(packed) == readers


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
