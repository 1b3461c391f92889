"""The file a `runner="processes"` pool's workers read their chain from at start-up.

Not sent to them as an argument: the spawn writes its arguments into a pipe the parent holds
open itself, so one larger than the pipe's buffer (a tokenizer is) blocked the parent for ever
where a child died before reading them all (a script without a ``__main__`` guard).
Written privately under the temporary folder and removed when the runner closes or is
collected. Its writer holds a lock on it for as long as the file is in use, so a file left by a
writer that was killed (SIGKILL, the out-of-memory killer) is removed by the next runner that
starts on the machine: the lock went with the process. A file is locked before it takes its
final name, so a sweep never sees one whose writer has not locked it yet.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import tempfile

from zephon_torch.errors import ConfigError
from zephon_torch.io._locks import close_tracked, open_tracked, remove_unlocked

PREFIX = "zephon-chain-"
SUFFIX = ".pickle"
_PART = ".part"  # while written, before it is locked: never swept


def write_chain(payload: bytes) -> tuple[str, int]:
    """``payload`` in a new private file: its path and the descriptor holding its lock (let
    both go with `release`). Files of writers that died are removed first."""
    sweep()
    part = None
    try:
        handle, part = tempfile.mkstemp(prefix=PREFIX, suffix=_PART)
        with os.fdopen(handle, "wb") as file:
            file.write(payload)
        fd = open_tracked(part, os.O_RDONLY)  # untracked copies close in forked children
        fcntl.flock(fd, fcntl.LOCK_SH)
        path = part[: -len(_PART)] + SUFFIX
        os.rename(part, path)
    except OSError as error:
        if part is not None:
            _remove(part)
        raise ConfigError(
            f"runner='processes' cannot write its chain ({len(payload)} bytes: the maps, "
            "filters and tokenizer its processes read at start-up) to "
            f"{part or 'a temporary file'}: {error}. Free space there, or point TMPDIR at "
            "another folder"
        ) from error
    return path, fd


def release(path: str, fd: int) -> None:
    """Removes the chain file and lets its lock go."""
    try:
        _remove(path)
    finally:
        close_tracked(fd)


def sweep() -> None:
    """Removes every chain file under the temporary folder that no live writer holds."""
    remove_unlocked(os.path.join(tempfile.gettempdir(), f"{PREFIX}*{SUFFIX}"))


def _remove(path: str) -> None:
    with contextlib.suppress(FileNotFoundError):
        os.unlink(path)
