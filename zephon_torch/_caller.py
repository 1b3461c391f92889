"""Where a warning points: the first frame outside zephon_torch, the user's own line."""

from __future__ import annotations

import concurrent.futures
import functools
import importlib.util
import linecache
import multiprocessing
import os
import sys
import threading
import warnings
from types import FrameType
from typing import Any

from zephon_torch.errors import ZephonWarning

_PACKAGE = os.path.dirname(os.path.abspath(__file__)) + os.sep
# frames that are nobody's line of code: a thread's start, a pool's worker loop, a process's
_NO_USER = (
    threading.__file__,
    os.path.dirname(os.path.abspath(concurrent.futures.__file__)) + os.sep,
    os.path.dirname(os.path.abspath(multiprocessing.__file__)) + os.sep,
)
Site = tuple[str, int, dict[str, Any]]  # a user's line: file, line number, module globals
_thread_site = threading.local()  # .site: the line a background thread warns from
# the loader and trainer code between the user's line and this package: walked through
_LOADERS = (
    ("torch", "utils", "data"),
    ("torchdata",),
    ("lightning",),
    ("pytorch_lightning",),
    ("lightning_fabric",),
)


@functools.cache
def _through_dirs() -> tuple[str, ...]:
    """The folders whose frames are walked through as the package's: its own, and those of
    torch's DataLoader, torchdata's nodes and Lightning's (and Fabric's) loops (found, not
    imported)."""
    found = [_PACKAGE]
    for top, *rest in _LOADERS:
        try:
            spec = importlib.util.find_spec(top)
        except (ImportError, ValueError):
            continue
        if spec is not None and spec.submodule_search_locations:
            root = os.path.abspath(next(iter(spec.submodule_search_locations)))
            found.append(os.path.join(root, *rest) + os.sep)
    return tuple(found)


def _outside(frame: FrameType) -> tuple[FrameType, int]:
    """The first frame from ``frame`` outward that is neither zephon_torch's nor the loader
    code calling it (the outermost where all are), and how many frames out it is."""
    through = _through_dirs()
    out = 0
    while frame.f_back is not None and frame.f_code.co_filename.startswith(through):
        frame = frame.f_back
        out += 1
    return frame, out


def _is_users(frame: FrameType) -> bool:
    filename = frame.f_code.co_filename
    return not filename.startswith(_through_dirs()) and not filename.startswith(_NO_USER)


def user_site() -> Site | None:
    """The calling thread's user line (see ``warn``), for a background thread it starts to warn
    from (``adopt_site``); None where none is the user's."""
    frame, _ = _outside(sys._getframe(1))
    if not _is_users(frame):
        return getattr(_thread_site, "site", None)
    return frame.f_code.co_filename, frame.f_lineno, frame.f_globals


def adopt_site(site: Site | None) -> None:
    """Have this (background) thread's warnings point at ``site``: the line of the user's that
    started its work (``for batch in pipeline``)."""
    _thread_site.site = site


def warn(text: str, *, once: tuple[str, ...] | None = None) -> None:
    """Give ``text`` as a ``ZephonWarning`` from the first frame outside zephon_torch (the
    user's ``for batch in loader`` or ``Dataset.from_path`` line), however deep in the library
    it is made; on a background thread, from the line that started its work. Where no line is
    the user's (a DataLoader worker's loop), from the library's line that warned. ``once``:
    see ``ZephonWarning.once``."""
    message = ZephonWarning(text)
    message.once = once
    frame, out = _outside(sys._getframe(1))  # the function that warns: stacklevel 2
    if _is_users(frame):
        warnings.warn(message, ZephonWarning, stacklevel=2 + out)
        return
    site = getattr(_thread_site, "site", None)
    if site is None:
        warnings.warn(message, ZephonWarning, stacklevel=2)
        return
    filename, lineno, module_globals = site
    # The source line is left to linecache, as `warnings.warn` leaves it: `warn_explicit`
    # given `module_globals` asks their loader for the source at once, which raised from
    # `python -c` or a script on stdin (ImportError: '__main__' is not a built-in module),
    # from `exec` of a string, or where the script changed since it started (IndexError).
    linecache.lazycache(filename, module_globals)
    warnings.warn_explicit(
        message,
        ZephonWarning,
        filename,
        lineno,
        module=module_globals.get("__name__"),
        registry=module_globals.setdefault("__warningregistry__", {}),
    )
