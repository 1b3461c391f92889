"""A bin packer's open rows in a saved state, packed: the state stays small with many pieces.

A bin packer (``best_fit``, ``first_fit``, ``best_fit_wrap``) keeps every piece of its open
and ready rows as a pointer ``[source, pass, position, start, end]``; as JSON lists that is
about 23 bytes a piece, and with short documents a lane holds thousands of pieces (over 1 MB
of state with 8 lanes). A state written out (``state_dict``) holds them packed instead: the
pieces' five columns as int64 (positions and the token ranges' ends as differences, which are
small), compressed with zlib and written in base64, with the number of pieces of each row:

    {"rows": [pieces of each row, open rows first], "open": open rows, "pieces": "<base64>"}

Inside the pipeline, and in each batch's ``state``, the rows stay lists (taking a state after
every batch costs no encoding); a loaded state is unpacked before anything reads it.
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


def _packer_of(lane_state: Any) -> dict[str, Any] | None:
    """A lane state's packer state (under its ``pack``, or under ``shuffle`` its
    ``pack["start"]``); None for a lane not begun or a state of another shape."""
    pack = lane_state.get("pack") if isinstance(lane_state, dict) else None
    if isinstance(pack, dict) and "readers" not in pack:
        pack = pack.get("start")
    packer = pack.get("packer") if isinstance(pack, dict) else None
    return packer if isinstance(packer, dict) else None


def _with_packer(lane_state: dict[str, Any], packer: dict[str, Any]) -> dict[str, Any]:
    """``lane_state`` with its packer state replaced (copied along the path, not changed)."""
    pack = dict(lane_state["pack"])
    if "readers" in pack:
        pack["packer"] = packer
    else:
        pack["start"] = {**pack["start"], "packer": packer}
    return {**lane_state, "pack": pack}


def pack_lanes(lanes: dict[str, Any]) -> dict[str, Any]:
    """Lane states by lane with every bin packer's rows packed, for a state written out."""
    return _map_packers(lanes, pack_rows)


def unpack_lanes(lanes: Any) -> Any:
    """Lane states by lane with packed rows as lists again (see ``unpack_rows``)."""
    return _map_packers(lanes, unpack_rows) if isinstance(lanes, dict) else lanes


def _map_packers(lanes: dict[str, Any], change: Callable[[Any], Any]) -> dict[str, Any]:
    out = {}
    for lane, lane_state in lanes.items():
        packer = _packer_of(lane_state)
        changed = None if packer is None else change(packer)
        if changed is not None and changed is not packer:
            lane_state = _with_packer(lane_state, changed)  # noqa: PLW2901
        out[lane] = lane_state
    return out
