"""The saved state of a lane's packer (``MixPack``), checked as it is restored.

A state is plain JSON that a user may have kept, edited or cut short: each field read is
checked for its type and range, and a bad one is a ``StateMismatchError`` naming it
(``pack.readers``, ``pack.carry[1]``), not a bare error at the first batch or, worse, a lane
that restarts or skips without a word (a list one short would be cut silently by ``zip``).
"""

from __future__ import annotations

from typing import Any

from zephon_torch._state import state_dict_of, state_flag, state_int, state_list
from zephon_torch.errors import StateMismatchError
from zephon_torch.ops._pack_skips import SKIP_REASONS
from zephon_torch.ops.packers import TO_END

_PACK_KEYS = ("readers", "delivered", "active", "carry", "skipped", "packer")
_ENDED = "[source, pass, position, start, end] with start <= end"
_PIECE = f"{_ENDED}, or end -1 (the document's)"


def checked_pack_state(saved: Any, sources: int) -> dict[str, Any]:
    """``saved``, a ``MixPack`` state over ``sources`` datasets, checked: per source a
    reader state, [tokens, documents] delivered, an active flag and a carried piece (or none);
    counts of skipped documents; the packer's rows of pieces (``check_pieces``)."""
    state = state_dict_of(saved, _PACK_KEYS, "pack")
    for number, reader in enumerate(state_list(state["readers"], sources, "pack.readers")):
        # a reader's None restarts its source from the stream's start: no release writes it
        state_dict_of(reader, (), f"pack.readers[{number}]")
    for number, pair in enumerate(state_list(state["delivered"], sources, "pack.delivered")):
        where = f"pack.delivered[{number}]"
        for count in state_list(pair, 2, where):
            state_int(count, where)
    for number, flag in enumerate(state_list(state["active"], sources, "pack.active")):
        state_flag(flag, f"pack.active[{number}]")
    for number, row in enumerate(state_list(state["carry"], sources, "pack.carry")):
        if not isinstance(row, list) or len(row) > 1:
            raise StateMismatchError({f"pack.carry[{number}]": (row, "[] or [piece]")})
        # a carry is written with its end (``Piece.pointer``): no row count checks it
        check_pieces([row], sources, f"pack.carry[{number}]", to_end=False)
    skipped = state_dict_of(state["skipped"], (), "pack.skipped")
    for reason, count in skipped.items():
        if reason not in SKIP_REASONS:
            raise StateMismatchError({"pack.skipped": (reason, f"a reason of {SKIP_REASONS}")})
        state_int(count, f"pack.skipped[{reason!r}]")
    packer = state_dict_of(state["packer"], (), "pack.packer")
    for key in ("bins", "ready"):
        if key in packer:
            check_pieces(packer[key], sources, f"pack.packer.{key}")
    if "filled" in packer:
        rows = [*packer.get("bins", []), *packer.get("ready", [])]
        for row, count in zip(rows, state_list(packer["filled"], len(rows), "pack.packer.filled")):
            if state_int(count, "pack.packer.filled") and not row:  # no piece holds its tokens
                raise StateMismatchError({"pack.packer.filled": (count, "0 for an empty row")})
    return state


def check_pieces(rows: Any, sources: int, where: str, *, to_end: bool = True) -> None:
    """``rows``: a list of rows, each a list of pieces ``[source, pass, position, start,
    end]`` of ints in range, ``source`` one of ``sources``, ``end`` -1 for the document's end
    (``packers.TO_END``) where ``to_end``."""
    if not isinstance(rows, list) or not all(isinstance(row, list) for row in rows):
        raise StateMismatchError({where: (rows, f"a list of rows of pieces {_PIECE}")})
    shape = _PIECE if to_end else _ENDED
    for row in rows:
        for piece in row:
            if not isinstance(piece, list) or len(piece) != 5:
                raise StateMismatchError({where: (piece, f"a piece {shape}")})
            runs_to_end = to_end and type(piece[4]) is int and piece[4] == TO_END
            source, _, _, start = (state_int(value, where) for value in piece[:4])
            end = start if runs_to_end else state_int(piece[4], where)
            if source >= sources or start > end:
                raise StateMismatchError({where: (piece, f"a piece {shape}")})
