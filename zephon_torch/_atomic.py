"""Small files that appear whole: written beside their target, then renamed into place."""

from __future__ import annotations

import contextlib
import glob
import os
import re
import time
import uuid

STALE_S = 24 * 3600  # a temporary this old is a killed writer's: no write takes that long
_swept: set[str] = set()  # folders swept by this process
_OURS = re.compile(r"\..+\.\d+\.[0-9a-f]{32}\.tmp")  # `.{name}.{pid}.{uuid hex}.tmp`


def write_text_atomically(path: str | os.PathLike[str], text: str) -> None:
    """Writes ``text`` as UTF-8 to a unique hidden file beside ``path``, then replaces ``path``
    with it, so readers see the old file or the new one, never a part; creates the folder.
    The first write of a process into a folder removes the temporaries there that writers
    killed between writing and renaming left behind (a day old)."""
    target = os.fspath(path)
    folder, name = os.path.split(target)
    os.makedirs(folder or ".", exist_ok=True)
    temporary = os.path.join(folder, f".{name}.{os.getpid()}.{uuid.uuid4().hex}.tmp")
    try:
        with open(temporary, "w", encoding="utf-8", newline="\n") as out:
            out.write(text)
        os.replace(temporary, target)
    finally:
        if os.path.exists(temporary):
            os.unlink(temporary)
    _sweep(folder or ".")


def _sweep(folder: str) -> None:
    if folder in _swept:
        return
    _swept.add(folder)
    old = time.time() - STALE_S
    for left in glob.glob(os.path.join(glob.escape(folder), ".*.tmp")):
        if not _OURS.fullmatch(os.path.basename(left)):  # another tool's, in a user's folder
            continue
        with contextlib.suppress(OSError):  # another process's sweep took it first
            if os.stat(left).st_mtime < old:
                os.unlink(left)
