"""Warnings of DataLoader workers: heard in the worker, given once in the main process.

Each worker of a rank runs the same pipeline over its own lanes, so a warning about the data (a
source that ran out mid-run, a shard cache too small for a shuffle window) came once per worker
process, each copy printed by the worker: four on a rank of four workers, 256 in a 64-rank job,
and none that the main process's filters, ``pytest.warns`` or a logging capture could see.
``zephon_torch.torch.DataLoader`` records every warning in its workers (each once: the same
text from the same line is sent once), sends it with the worker's next item, and gives it in
the main process, where its filters decide and Python shows a repeat once: as from the user's
line that iterates the loader, or, where none is on the stack, the worker's line and module. A
worker that ends without another item (an exception, a shutdown) prints what it still holds;
one killed outright (a signal, a crash in native code) loses it with the rest of its output.
"""

from __future__ import annotations

import contextlib
import sys
import warnings
from collections.abc import Iterator
from typing import Any

from zephon_torch._caller import user_site

WARNINGS_KEY = "zephon_warnings"
"""An item's warnings heard in its worker since the previous item: ``Heard`` tuples."""

# category, text, file, line, module, and the key of a warning given once an iteration
Heard = tuple[type[Warning], str, str, int, str | None, tuple[str, ...] | None]
_GIVEN: dict[str, dict[Any, Any]] = {}  # per file, the registry of warnings given from it


class WorkerWarnings:
    """The warnings a worker heard and has not yet sent (see ``heard_warnings``)."""

    def __init__(self, log: list[warnings.WarningMessage]) -> None:
        self._log = log
        self._sent: set[tuple[Any, ...]] = set()

    def __bool__(self) -> bool:
        return bool(self._log)

    def take(self) -> list[Heard]:
        """The warnings heard since the last call, each the first time only, as plain data to
        send. A category the main process could not unpickle (a class defined in a function)
        travels as UserWarning."""
        taken = self._log[: len(self._log)]
        del self._log[: len(taken)]  # one recorded meanwhile by another thread stays for next
        heard = []
        for w in taken:
            key = (w.category, str(w.message), w.filename, w.lineno)
            if key not in self._sent:
                self._sent.add(key)
                once = getattr(w.message, "once", None)
                category = _sendable(w.category)
                heard.append((category, str(w.message), w.filename, w.lineno, _module(w), once))
        return heard

    def show_left(self) -> None:
        """Print, in the worker, what was heard and never sent."""
        for category, text, filename, lineno, *_ in self.take():
            warnings.showwarning(category(text), category, filename, lineno)


@contextlib.contextmanager
def heard_warnings(active: bool) -> Iterator[WorkerWarnings | None]:
    """Record the process's warnings while inside, where ``active`` (a worker); else None.

    Every warning is recorded once (the main process's filters decide, not the worker's,
    which under spawn are Python's defaults); on leaving, what was not sent is printed here."""
    if not active:
        yield None
        return
    heard = None
    try:
        with warnings.catch_warnings(record=True) as log:
            # the first of each (text, category, line), whatever the worker's filters say;
            # repeats are dropped here by Python's registry, at its cost (a warning a row)
            warnings.simplefilter("default")
            heard = WorkerWarnings(log)
            yield heard
    finally:
        if heard:
            heard.show_left()


def give(heard: list[Heard], given: set[tuple[str, ...]]) -> None:
    """Issue warnings heard in a worker in the main process, whose filters decide: as from the
    user's line that iterates the loader (see `zephon_torch._caller`), where one is on the
    stack, whose module's registry shows a repeat once; else as from the place and module the
    worker warned from. A warning given once an iteration (``ZephonWarning.once``) whose key
    is in ``given`` (the iteration's) is left out: each worker gave its own, naming its first
    bad row, say, where one process gives one."""
    site = user_site()
    for category, text, worker_file, worker_line, worker_module, once in heard:
        if once is not None:
            if once in given:
                continue
            given.add(once)
        if site is not None:
            filename, lineno, module_globals = site
            module = module_globals.get("__name__")
            registry = module_globals.setdefault("__warningregistry__", {})
        else:
            filename, lineno, module = worker_file, worker_line, worker_module
            registry = _GIVEN.setdefault(filename, {})
        warnings.warn_explicit(text, category, filename, lineno, module=module, registry=registry)


def _sendable(category: type[Warning]) -> type[Warning]:
    module = sys.modules.get(category.__module__)
    found: Any = module
    for name in category.__qualname__.split("."):
        found = getattr(found, name, None)
    return category if found is category else UserWarning


def _module(message: warnings.WarningMessage) -> str | None:
    """The name of the module the warning was made from, for filters by module (None: the
    main process derives one from the file name, as Python does). Looked up in a copy of
    ``sys.modules``: listing its items allocates, a garbage collection then may run a
    finalizer, and another thread may import meanwhile ("dictionary changed size during
    iteration" ended a worker in a CI run); its copy allocates nothing per item."""
    for name, module in sys.modules.copy().items():
        if getattr(module, "__file__", None) == message.filename:
            return name
    return None
