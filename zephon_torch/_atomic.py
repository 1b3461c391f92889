"""Small files that appear whole: written beside their target, then renamed into place."""

from __future__ import annotations

import os
import uuid


def write_text_atomically(path: str | os.PathLike[str], text: str) -> None:
    """Writes ``text`` as UTF-8 to a unique hidden file beside ``path``, then replaces ``path``
    with it, so readers see the old file or the new one, never a part; creates the folder."""
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
