"""The documents a resumed lane must read again before its first batch, read at once.

A lane's saved state holds its open rows as pointers (a cut document's rest, a bin packer's
open and ready rows), whose documents are read again as the lane is restored
(``MixPack.reset``). Each lane used to read its own one after another on the calling thread:
with 8 lanes of Parquet text, 17 ms of a 47 ms start. ``read_ahead`` starts every lane's on the
runner first, so they are read side by side; each lane's restore then takes its own.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from zephon_torch._packed_rows import mixpack_of
from zephon_torch.ops.read import DocumentReader
from zephon_torch.ops.stateful import FilteredReader


def read_ahead(lanes: Sequence[tuple[Sequence[DocumentReader | FilteredReader], Any]]) -> None:
    """For each lane (its readers by source, and the state it is about to load), start
    reading the documents its saved open rows hold. A state of another shape reads nothing
    ahead: the restore itself then says what is wrong with it."""
    for readers, state in lanes:
        plain = [_beneath(reader) for reader in readers]
        for source, positions in saved_documents(state).items():
            if 0 <= source < len(plain):
                plain[source].read_ahead_for_resume(positions)


def saved_documents(state: Any) -> dict[int, list[tuple[int, int]]]:
    """Per source, the (pass, pos) of each document the lane state's open rows point at, in
    the order first met; {} for a fresh lane or a state of another shape."""
    pack = mixpack_of(state)
    if pack is None:
        return {}
    try:
        packer = pack.get("packer") or {}
        rows = [*pack.get("carry", []), *packer.get("bins", []), *packer.get("ready", [])]
        found: dict[int, dict[tuple[int, int], None]] = {}
        for row in rows:
            for source, pass_index, pos, _, _ in row:
                if all(type(v) is int for v in (source, pass_index, pos)):
                    found.setdefault(source, {})[pass_index, pos] = None
    except (KeyError, TypeError, ValueError, AttributeError):
        return {}
    return {source: list(positions) for source, positions in found.items()}


def _beneath(reader: DocumentReader | FilteredReader) -> DocumentReader:
    """The plain reader beneath a lane's stateful filters, which re-reads documents."""
    plain: Any = reader
    while not isinstance(plain, DocumentReader):
        plain = plain.reader
    return plain
