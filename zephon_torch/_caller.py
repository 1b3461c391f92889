"""Where a warning points: the first frame outside zephon_torch, the user's own line."""

from __future__ import annotations

import os
import sys

_PACKAGE = os.path.dirname(os.path.abspath(__file__)) + os.sep


def user_stacklevel() -> int:
    """The ``stacklevel`` that makes a ``warnings.warn`` in the calling function name the first
    frame outside zephon_torch (a ``Dataset.from_path`` line of the user's), however deep in
    the library the warning is made; the outermost frame where all are the library's."""
    frame = sys._getframe(1)  # the function that warns: stacklevel 1
    level = 1
    while frame.f_back is not None and frame.f_code.co_filename.startswith(_PACKAGE):
        frame = frame.f_back
        level += 1
    return level
