"""A lane state as it is written out, packed: a bin packer's open rows, and reader positions.

A bin packer (``best_fit``, ``first_fit``, ``best_fit_wrap``) keeps every piece of its open
and ready rows as a pointer ``[source, pass, position, start, end]``; as JSON lists that is
about 23 bytes a piece, and with short documents a lane holds thousands of pieces (over 1 MB
of state with 8 lanes). A state written out (``state_dict``) holds them packed instead: the
pieces' five columns as int64 (positions and the token ranges' ends as differences, which are
small), compressed with zlib and written in base64, with the number of pieces of each row:

    {"rows": [pieces of each row, open rows first], "open": open rows, "pieces": "<base64>"}

The lane's reader positions, one ``{"pass", "pos", "filtered"}`` per source, are written as
three columns (``pack_readers``): with 64 lanes a ``wrap`` state of 10 sources was 52 KiB, of
20 sources 91 KiB, much of it those dicts' keys; 36 and 57 KiB as columns
(``benchmarks/state_size.py``). Inside the pipeline,
and in each batch's ``state``, rows and readers stay lists (taking a state after every batch
costs no encoding); a loaded state is unpacked before anything reads it.
"""

from __future__ import annotations

import base64
import binascii
import zlib
from collections.abc import Callable
from typing import Any

import numpy as np

from zephon_torch.errors import StateMismatchError

_WHERE = "pack.packer.pieces"


def pack_rows(packer: dict[str, Any]) -> dict[str, Any]:
    """A bin packer's state with its rows packed; other states (``wrap``'s, an already packed
    one) as they are."""
    bins, ready = packer.get("bins"), packer.get("ready")
    if not isinstance(bins, list) or not isinstance(ready, list):
        return packer
    rows = bins + ready
    pieces = np.array([piece for row in rows for piece in row], dtype=np.int64).reshape(-1, 5)
    columns = pieces.T.copy()
    columns[2] = np.diff(columns[2], prepend=0)  # positions: from the piece before
    columns[4] -= columns[3]  # ends: as lengths
    encoded = base64.b64encode(zlib.compress(columns.tobytes(), 6)).decode("ascii")
    out = {k: v for k, v in packer.items() if k not in ("bins", "ready")}
    out.update(rows=[len(row) for row in rows], open=len(bins), pieces=encoded)
    return out


def unpack_rows(packer: Any) -> Any:
    """A packer state with packed rows (``pack_rows``) as lists again; any other as it is.

    Raises:
        StateMismatchError: naming ``pack.packer.pieces`` when the packed rows cannot be
            read back (cut short, edited, or counts that do not add up).
    """
    if not isinstance(packer, dict) or "pieces" not in packer:
        return packer
    rows, opened, encoded = packer.get("rows"), packer.get("open"), packer["pieces"]
    if not isinstance(rows, list) or not all(type(n) is int and n >= 0 for n in rows):
        raise _unreadable(packer, "rows: the pieces of each row, ints")
    if type(opened) is not int or not 0 <= opened <= len(rows):
        raise _unreadable(packer, "open: how many of the rows are open, an int")
    total = sum(rows)
    try:
        raw = zlib.decompress(base64.b64decode(str(encoded), validate=True))
    except (binascii.Error, zlib.error, ValueError) as error:
        raise _unreadable(packer, f"zlib in base64 ({error})") from None
    if len(raw) != total * 5 * 8:
        raise _unreadable(packer, f"{total} pieces of 5 int64, not {len(raw)} bytes")
    columns = np.frombuffer(raw, dtype=np.int64).reshape(5, total).copy()
    columns[2] = np.cumsum(columns[2])
    columns[4] += columns[3]
    flat = columns.T.tolist()
    out = {k: v for k, v in packer.items() if k not in ("rows", "open", "pieces")}
    unpacked, at = [], 0
    for count in rows:
        unpacked.append(flat[at : at + count])
        at += count
    out["bins"], out["ready"] = unpacked[:opened], unpacked[opened:]
    return out


def _unreadable(packer: dict[str, Any], expected: str) -> StateMismatchError:
    shown = {
        k: (v[:40] + "..." if isinstance(v, str) and len(v) > 40 else v) for k, v in packer.items()
    }
    return StateMismatchError({_WHERE: (shown, f"packed rows: {expected}")})


_READER_KEYS = ("pass", "pos", "filtered")


def pack_readers(readers: Any) -> Any:
    """A lane's reader positions as three columns (``{"pass": [...], "pos": [...],
    "filtered": [...]}``, one entry per source) where every reader is a plain one: 37 bytes a
    source as dicts, about 9 as columns. Others (a stateful filter's reader) as they are."""
    plain = isinstance(readers, list) and all(
        isinstance(r, dict) and tuple(r) == _READER_KEYS for r in readers
    )
    if not plain or not readers:
        return readers
    return {key: [r[key] for r in readers] for key in _READER_KEYS}


def unpack_readers(readers: Any) -> Any:
    """Reader positions as columns (``pack_readers``) as a list again; any other as it is.

    Raises:
        StateMismatchError: naming ``pack.readers`` for columns of other keys or lengths.
    """
    if not isinstance(readers, dict):
        return readers
    columns = [readers.get(key) for key in _READER_KEYS]
    lists = [c for c in columns if isinstance(c, list)]
    if set(readers) != set(_READER_KEYS) or len(lists) != len(columns):
        raise StateMismatchError(
            {"pack.readers": (readers, f"a list of reader states, or columns {_READER_KEYS}")}
        )
    if len({len(c) for c in lists}) != 1:
        raise StateMismatchError({"pack.readers": (readers, "columns of one length")})
    return [dict(zip(_READER_KEYS, values, strict=True)) for values in zip(*lists, strict=True)]


def mixpack_of(lane_state: Any) -> dict[str, Any] | None:
    """A lane state's packing state (its ``pack``, or under ``shuffle`` its
    ``pack["start"]``): readers, counts and the packer's; None for a lane not begun or a state
    of another shape."""
    pack = lane_state.get("pack") if isinstance(lane_state, dict) else None
    if isinstance(pack, dict) and "readers" not in pack:
        pack = pack.get("start")
    return pack if isinstance(pack, dict) and "readers" in pack else None


def _with_mixpack(lane_state: dict[str, Any], mixpack: dict[str, Any]) -> dict[str, Any]:
    """``lane_state`` with its packing state replaced (copied along the path, not changed)."""
    if "readers" in lane_state["pack"]:
        return {**lane_state, "pack": mixpack}
    return {**lane_state, "pack": {**lane_state["pack"], "start": mixpack}}


def pack_lanes(lanes: dict[str, Any]) -> dict[str, Any]:
    """Lane states by lane as a state is written out: every bin packer's rows packed
    (``pack_rows``), reader positions as columns (``pack_readers``)."""
    return _map_mixpacks(lanes, pack_rows, pack_readers)


def unpack_lanes(lanes: Any) -> Any:
    """Lane states by lane as the pipeline reads them (``unpack_rows``, ``unpack_readers``).

    Raises:
        StateMismatchError: naming the lane and the part that cannot be read back.
    """
    if not isinstance(lanes, dict):
        return lanes
    out = {}
    for lane, lane_state in lanes.items():
        try:
            out.update(_map_mixpacks({lane: lane_state}, unpack_rows, unpack_readers))
        except StateMismatchError as error:
            named = {f"lane {lane} {key}": value for key, value in error.mismatches.items()}
            raise StateMismatchError(named) from None
    return out


def _map_mixpacks(
    lanes: dict[str, Any], rows: Callable[[Any], Any], readers: Callable[[Any], Any]
) -> dict[str, Any]:
    out = {}
    for lane, lane_state in lanes.items():
        mixpack = mixpack_of(lane_state)
        if mixpack is not None:
            changed = {**mixpack, "readers": readers(mixpack["readers"])}
            if isinstance(mixpack.get("packer"), dict):
                changed["packer"] = rows(mixpack["packer"])
            lane_state = _with_mixpack(lane_state, changed)  # noqa: PLW2901
        out[lane] = lane_state
    return out
