"""The shard cache folder's ledger: the bytes of its cached files, kept so that a reservation
that fits needs no listing of the folder (see `_cache_folder`). Read and written only under
the folder lock.

The file `.ledger` holds `<bytes> <reservations since the folder was last listed>` and a
newline. A crash that cuts a write short leaves a ledger `read_ledger` does not read (no
newline, or not two numbers), and the folder is listed again, as when the file is missing.
"""

from __future__ import annotations

import contextlib
import os

LEDGER = ".ledger"


def read_ledger(directory: str) -> tuple[int, int] | None:
    """The ledger's bytes and reservations since the last listing; None when it is missing or
    unreadable."""
    try:
        with open(os.path.join(directory, LEDGER), "rb") as handle:
            text = handle.read(64)
    except OSError:
        return None
    fields = text.split()
    if not text.endswith(b"\n") or len(fields) != 2 or not all(f.isdigit() for f in fields):
        return None
    return int(fields[0]), int(fields[1])


def write_ledger(directory: str, total: int, since: int) -> None:
    """Sets the ledger, in one write of a few bytes. Where that fails (a full disk), the
    ledger is deleted: an old one left in place could count too little."""
    path = os.path.join(directory, LEDGER)
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        try:
            os.write(fd, f"{max(total, 0)} {since}\n".encode())
        finally:
            os.close(fd)
    except OSError:
        with contextlib.suppress(OSError):
            os.unlink(path)


def add_to_ledger(directory: str, size: int) -> None:
    """`size` more bytes in the ledger, where there is one (else the next reservation lists
    the folder)."""
    found = read_ledger(directory)
    if found is not None:
        write_ledger(directory, found[0] + size, found[1])
