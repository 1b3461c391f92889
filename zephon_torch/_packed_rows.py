"""A lane state as it is written out, packed: a bin packer's open rows, and per-source counts.

A bin packer (``best_fit``, ``first_fit``, ``best_fit_wrap``) keeps every piece of its open
and ready rows as a pointer ``[source, pass, position, start, end]`` (``end`` -1 where the
piece runs to its document's end, which most do: ``ops.packers``); as JSON lists that is
about 20 bytes a piece, and with short documents a lane holds thousands of pieces (over 1 MB
of state with 8 lanes). A state written out (``state_dict``) holds them packed instead: the
pieces' five columns as int64 (positions as differences, and ends as lengths, which are
small or constant), compressed with zlib and written in base64, with the number of pieces of
each row:

    {"rows": [pieces of each row, open rows first], "open": open rows, "pieces": "<base64>",
     "filled": [tokens of each row]}

The rest of a lane's packing state is per source: its reader's position, the tokens and
documents delivered, an active flag and a carried piece. Written as lists that is about 47
bytes a source and lane once a long run's counts have grown, and a mixture of 20 sources on 64
lanes passed the 64 KiB of a saved state; packed into one string (``pack_sources``) it is
about 14. Version 3 wrote the reader positions alone as three columns, which still load.

Inside the pipeline, and in each batch's ``state``, all of it stays lists (taking a state
after every batch costs no encoding); a loaded state is unpacked before anything reads it.
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
_LIMIT = 1 << 48  # a saved count's bound (``_state.state_int``)


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
    # little-endian whatever the machine: a state saved here resumes on any host
    encoded = base64.b64encode(
        zlib.compress(columns.astype("<i8", copy=False).tobytes(), 6)
    ).decode("ascii")
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
    if total >= _LIMIT:  # a bound zlib takes (an OverflowError past 2**63 bytes)
        raise _unreadable(packer, f"rows: counts of pieces below 2**48 in all, not {total}")
    size = total * 5 * 8  # five int64 a piece
    try:
        raw = _inflated(encoded, size)
    except (binascii.Error, zlib.error, ValueError) as error:
        raise _unreadable(packer, f"zlib in base64 ({error})") from None
    if len(raw) != size:
        raise _unreadable(packer, f"{total} pieces of 5 int64, not {len(raw)} bytes")
    columns = np.frombuffer(raw, dtype="<i8").reshape(5, total).astype(np.int64)
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


def _inflated(encoded: object, most: int) -> bytes:
    """The bytes of ``encoded``, base64 of one zlib stream of at most ``most`` bytes and
    nothing after it (zlib alone ignores what follows a stream's end: a string with more
    appended read as the first). Inflating stops one byte past ``most``: an edited string
    of a few KiB can otherwise stand for gigabytes.

    Raises:
        binascii.Error, zlib.error, ValueError: where it is not.
    """
    inflater = zlib.decompressobj()
    raw = inflater.decompress(base64.b64decode(str(encoded), validate=True), most + 1)
    if len(raw) > most:
        raise ValueError(f"it inflates past the {most:,} bytes its counts allow")
    if not inflater.eof:
        raise ValueError("the stream is cut short")
    if inflater.unused_data:
        raise ValueError(f"{len(inflater.unused_data)} bytes after the stream's end")
    return raw


def _unreadable(packer: dict[str, Any], expected: str) -> StateMismatchError:
    shown = {
        k: (v[:40] + "..." if isinstance(v, str) and len(v) > 40 else v) for k, v in packer.items()
    }
    return StateMismatchError({_WHERE: (shown, f"packed rows: {expected}")})


_READER_KEYS = ("pass", "pos", "filtered")
# per source: its reader's three, its delivered tokens and documents, its active flag, and
# whether it carries a piece; the carried pieces follow, as five columns
_SOURCE_COLUMNS = (*_READER_KEYS, "tokens", "documents", "active", "carried")
_PER_SOURCE = ("readers", "delivered", "active", "carry")
_READER_SET = frozenset(_READER_KEYS)
_MOST_SOURCES = 1 << 16  # packed no further: a packed state inflates to at most about 7 MB
_MOST_SOURCE_BYTES = (1 + len(_SOURCE_COLUMNS) * _MOST_SOURCES + 5 * _MOST_SOURCES) * 8


def pack_sources(mixpack: dict[str, Any]) -> dict[str, Any]:
    """A lane's packing state with its per-source part (readers, delivered counts, active
    flags, carried pieces) packed into ``"sources"``: int64 columns led by the number of
    sources, byte-shuffled (every value's lowest bytes, then the next...), zlib-compressed and
    written in base64. With 64 lanes and counts of a long run that is about 14 bytes a source
    and lane instead of about 47 as lists (``benchmarks/state_size.py``). A state this cannot
    write exactly (a stateful filter's reader, a value out of range) stays as it is."""
    columns = _source_columns(mixpack)
    if columns is None:
        return mixpack
    values = np.concatenate(([len(columns[0])], *columns)).astype("<i8")
    shuffled = values.view(np.uint8).reshape(-1, 8).T.tobytes()
    out = {k: v for k, v in mixpack.items() if k not in _PER_SOURCE}
    out["sources"] = base64.b64encode(zlib.compress(shuffled, 9)).decode("ascii")
    return out


def _source_columns(mixpack: dict[str, Any]) -> list[list[int]] | None:
    """The per-source columns and the carried pieces' five, or None where a value is not a
    plain one (see ``pack_sources``)."""
    parts = [mixpack.get(key) for key in _PER_SOURCE]
    lists = [part for part in parts if isinstance(part, list)]
    if len(lists) != len(parts) or len({len(part) for part in lists}) != 1:
        return None
    if len(lists[0]) > _MOST_SOURCES:
        return None
    readers, delivered, active, carry = lists
    plain = (
        readers
        and all(isinstance(r, dict) and r.keys() == _READER_SET for r in readers)
        and all(isinstance(p, list) and len(p) == 2 for p in delivered)
        and all(type(a) is bool for a in active)
        and all(isinstance(row, list) and len(row) <= 1 for row in carry)
    )
    pieces = [row[0] for row in carry if row] if plain else []
    if not plain or not all(isinstance(piece, list) and len(piece) == 5 for piece in pieces):
        return None
    columns = [[r[key] for r in readers] for key in _READER_KEYS]
    columns += [[p[0] for p in delivered], [p[1] for p in delivered]]
    columns += [[int(a) for a in active], [len(row) for row in carry]]
    columns += [[piece[i] for piece in pieces] for i in range(5)]
    in_range = all(type(v) is int and 0 <= v < _LIMIT for column in columns for v in column)
    return columns if in_range else None


def unpack_sources(mixpack: dict[str, Any]) -> dict[str, Any]:
    """A packing state with its per-source part as lists again: from ``"sources"``
    (``pack_sources``), or from reader columns (a version 3 state, ``unpack_readers``); any
    other as it is.

    Raises:
        StateMismatchError: naming ``pack.sources`` or ``pack.readers`` where the packing
            cannot be read back (cut short, edited, or counts that do not add up).
    """
    if "sources" not in mixpack:
        return {**mixpack, "readers": unpack_readers(mixpack.get("readers"))}
    encoded = mixpack["sources"]
    beside = [key for key in _PER_SOURCE if key in mixpack]
    if beside:  # no release writes both: an edit of those lists would be dropped unsaid
        raise _no_sources(encoded, f"the per-source part, not also as lists ({beside})")
    try:
        raw = _inflated(encoded, _MOST_SOURCE_BYTES)
    except (binascii.Error, zlib.error, ValueError) as error:
        raise _no_sources(encoded, f"zlib in base64 ({error})") from None
    if not raw or len(raw) % 8:
        raise _no_sources(encoded, f"int64 values, not {len(raw)} bytes")
    values = np.frombuffer(raw, np.uint8).reshape(8, -1).T.copy().view("<i8").ravel()
    count, width = int(values[0]), len(_SOURCE_COLUMNS)
    if not 0 < count <= min(_MOST_SOURCES, (len(values) - 1) // width):
        raise _no_sources(encoded, f"{len(values) - 1} values for {count} sources")
    columns = values[1 : 1 + width * count].reshape(width, count).tolist()
    carried = sum(columns[6])
    if any(flag not in (0, 1) for flag in columns[5] + columns[6]):
        raise _no_sources(encoded, "active and carried flags of 0 or 1")
    if len(values) != 1 + width * count + 5 * carried:
        raise _no_sources(encoded, f"{carried} carried pieces of 5 values")
    pieces = iter(values[1 + width * count :].reshape(5, carried).T.tolist())
    out = {k: v for k, v in mixpack.items() if k != "sources"}
    out["readers"] = [dict(zip(_READER_KEYS, r, strict=True)) for r in zip(*columns[:3])]
    out["delivered"] = [list(pair) for pair in zip(columns[3], columns[4])]
    out["active"] = [bool(a) for a in columns[5]]
    out["carry"] = [[next(pieces)] if c else [] for c in columns[6]]
    return out


def _no_sources(encoded: object, expected: str) -> StateMismatchError:
    shown = encoded[:40] + "..." if isinstance(encoded, str) and len(encoded) > 40 else encoded
    return StateMismatchError({"pack.sources": (shown, f"packed per-source state: {expected}")})


def unpack_readers(readers: Any) -> Any:
    """Reader positions as columns (``{"pass": [...], "pos": [...], "filtered": [...]}``,
    as version 3 wrote them) as a list again; any other as it is.

    Raises:
        StateMismatchError: naming ``pack.readers`` for columns of other keys or lengths.
    """
    if not isinstance(readers, dict):
        return readers
    columns = [readers.get(key) for key in _READER_KEYS]
    lists = [c for c in columns if isinstance(c, list)]
    if readers.keys() != _READER_SET or len(lists) != len(columns):
        raise StateMismatchError(
            {"pack.readers": (readers, f"a list of reader states, or columns {_READER_KEYS}")}
        )
    if len({len(c) for c in lists}) != 1:
        raise StateMismatchError({"pack.readers": (readers, "columns of one length")})
    return [dict(zip(_READER_KEYS, values, strict=True)) for values in zip(*lists, strict=True)]


def mixpack_of(lane_state: Any) -> dict[str, Any] | None:
    """A lane state's packing state (its ``pack``, or under ``shuffle`` its
    ``pack["start"]``): readers (or, as written out, ``sources``), counts and the packer's;
    None for a lane not begun or a state of another shape."""
    pack = lane_state.get("pack") if isinstance(lane_state, dict) else None
    if isinstance(pack, dict) and not _PER_LANE.intersection(pack):
        pack = pack.get("start")
    return pack if isinstance(pack, dict) and _PER_LANE.intersection(pack) else None


_PER_LANE = frozenset({"readers", "sources"})


def _with_mixpack(lane_state: dict[str, Any], mixpack: dict[str, Any]) -> dict[str, Any]:
    """``lane_state`` with its packing state replaced (copied along the path, not changed)."""
    if _PER_LANE.intersection(lane_state["pack"]):
        return {**lane_state, "pack": mixpack}
    return {**lane_state, "pack": {**lane_state["pack"], "start": mixpack}}


def pack_lanes(lanes: dict[str, Any]) -> dict[str, Any]:
    """Lane states by lane as a state is written out: every bin packer's rows packed
    (``pack_rows``), the per-source part packed (``pack_sources``)."""
    return _map_mixpacks(lanes, pack_rows, pack_sources)


def unpack_lanes(lanes: Any) -> Any:
    """Lane states by lane as the pipeline reads them (``unpack_rows``, ``unpack_sources``).

    Raises:
        StateMismatchError: naming the lane and the part that cannot be read back
            (``lane 3 pack.start.sources`` under ``shuffle``).
    """
    if not isinstance(lanes, dict):
        return lanes
    out = {}
    for lane, lane_state in lanes.items():
        try:
            out.update(_map_mixpacks({lane: lane_state}, unpack_rows, unpack_sources))
        except StateMismatchError as error:
            direct = _PER_LANE.intersection(lane_state["pack"])
            named = {
                f"lane {lane} {key if direct else beneath_start(key)}": value
                for key, value in error.mismatches.items()
            }
            raise StateMismatchError(named) from None
    return out


def beneath_start(key: str) -> str:
    """A packing state's field name (``pack.readers``) as it lies in a shuffled lane's state,
    under the block's start (``pack.start.readers``)."""
    return "pack.start" + key.removeprefix("pack") if key.startswith("pack") else key


def _map_mixpacks(
    lanes: dict[str, Any],
    rows: Callable[[Any], Any],
    sources: Callable[[dict[str, Any]], dict[str, Any]],
) -> dict[str, Any]:
    out = {}
    for lane, lane_state in lanes.items():
        mixpack = mixpack_of(lane_state)
        if mixpack is not None:
            changed = dict(sources(mixpack))
            if isinstance(mixpack.get("packer"), dict):
                changed["packer"] = rows(mixpack["packer"])
            lane_state = _with_mixpack(lane_state, changed)  # noqa: PLW2901
        out[lane] = lane_state
    return out
