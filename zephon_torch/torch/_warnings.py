"""Warnings of DataLoader workers: heard in the worker, given once in the main process.

Each worker of a rank runs the same pipeline over its own lanes, so a warning about the data (a
source that ran out mid-run, a shard cache too small for a shuffle window) came once per worker
process, each copy printed by the worker: four on a rank of four workers, 256 in a 64-rank job,
and none that the main process's filters, ``pytest.warns`` or a logging capture could see.
``zephon_torch.torch.DataLoader`` records them in its workers, sends each with the worker's next
item, and gives it in the main process, at the place the worker warned from, where Python's
filters show a repeated warning once.
"""

from __future__ import annotations

import contextlib
import sys
import warnings
from collections.abc import Iterator
from typing import Any

WARNINGS_KEY = "zephon_warnings"
"""An item's warnings heard in its worker since the previous item: ``Heard`` tuples."""

Heard = tuple[type[Warning], str, str, int]  # category, text, file, line
_GIVEN: dict[Any, Any] = {}  # the main process's registry of warnings given: a repeat is not


@contextlib.contextmanager
def heard_warnings(active: bool) -> Iterator[list[warnings.WarningMessage] | None]:
    """Record the process's warnings while inside, where ``active`` (a worker); else None.

    What Python's filters would have shown is recorded instead: a repeat from the same place
    is left out here as it would have been printed once."""
    if not active:
        yield None
        return
    with warnings.catch_warnings(record=True) as log:
        yield log


def take(log: list[warnings.WarningMessage]) -> list[Heard]:
    """The warnings ``log`` holds, as plain data to send, and ``log`` emptied. A category the
    main process could not unpickle (a class defined in a function) travels as UserWarning."""
    heard = [(_sendable(w.category), str(w.message), w.filename, w.lineno) for w in log[: len(log)]]
    del log[: len(heard)]  # a warning recorded meanwhile by another thread stays for the next
    return heard


def give(heard: list[Heard]) -> None:
    """Issue warnings heard in a worker, as from the place the worker warned from."""
    for category, text, filename, lineno in heard:
        warnings.warn_explicit(text, category, filename, lineno, registry=_GIVEN)


def _sendable(category: type[Warning]) -> type[Warning]:
    module = sys.modules.get(category.__module__)
    found: Any = module
    for name in category.__qualname__.split("."):
        found = getattr(found, name, None)
    return category if found is category else UserWarning
