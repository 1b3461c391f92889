"""Small files written whole, and what killed writers leave behind."""

from __future__ import annotations

import os
import pathlib
import time

from zephon_torch import _atomic
from zephon_torch._atomic import STALE_S, write_text_atomically


def test_a_write_replaces_the_file_whole_and_leaves_no_temporary(tmp_path: pathlib.Path) -> None:
    target = tmp_path / "sub" / "record.json"
    write_text_atomically(target, "first")
    write_text_atomically(target, "second ✓")
    assert target.read_text(encoding="utf-8") == "second ✓"
    assert sorted(p.name for p in target.parent.iterdir()) == ["record.json"]


def test_temporaries_a_killed_writer_left_are_swept_once_a_day_old(
    tmp_path: pathlib.Path,
) -> None:
    """A writer killed between writing and renaming left its hidden temporary for ever."""
    _atomic._swept.discard(str(tmp_path))
    stale = tmp_path / f".other.json.123.{'a' * 32}.tmp"
    fresh = tmp_path / f".other.json.456.{'b' * 32}.tmp"  # perhaps a live writer's: kept
    mine = tmp_path / "notes.tmp"  # not a temporary of ours: kept
    foreign = tmp_path / ".model.safetensors.tmp"  # another tool's, hidden too: kept
    for path in (stale, fresh, mine, foreign):
        path.write_text("{")
    past = time.time() - STALE_S - 60
    for path in (stale, mine, foreign):
        os.utime(path, (past, past))
    write_text_atomically(tmp_path / "record.json", "{}")
    names = sorted(p.name for p in tmp_path.iterdir())
    assert names == [foreign.name, fresh.name, "notes.tmp", "record.json"]
