"""What a spawned process (a `runner="processes"` worker) can find of this process's
``__main__``.

Pickle sends a function or class by its module and name, so a map defined in the main script
reaches a worker as ``__main__.name``. A spawned process runs the main script again (as
``__mp_main__``) where it has a file or was run with ``-m``, and finds there only what the
script defines at its top level. Code given with ``python -c``, typed into the interpreter or
run in a notebook has no file to run again: its functions cannot be found. A script read from
stdin (``python - < script.py``) names ``<stdin>``, which a spawned process cannot read again,
so no process starts at all.
"""

from __future__ import annotations

import contextlib
import io
import os
import pickle
import sys
import types
from multiprocessing import process
from typing import Any

from zephon_torch.errors import ConfigError


def check_main(chain: object, *, what: str, instead: str) -> None:
    """Refuse to send ``chain`` to spawned processes where they could not run this
    ``__main__`` again. ``what``: who they are ("the processes of runner='processes'");
    ``instead``: the other way, for the message.

    Raises:
        ConfigError: where ``__main__`` names a file that is not there (a script read from
            stdin: no process would start), or where ``chain`` holds a function or class of a
            ``__main__`` that has no file (``python -c``, an interactive session, a notebook).
    """
    main = sys.modules.get("__main__")
    if main is None or getattr(getattr(main, "__spec__", None), "name", None) is not None:
        return  # run with -m: imported again by its name
    path = getattr(main, "__file__", None)
    if path is not None:
        # relative to the folder the process started in, as multiprocessing reads it
        where = os.path.join(getattr(process, "ORIGINAL_DIR", None) or "", path)
        if not os.path.isfile(where):
            raise ConfigError(
                f"{what} cannot start: spawned processes run the main script again, and it "
                f"names {path!r}, which is no file to run (a script read from stdin, `python - "
                f"< script.py`?): save the script to a file and run that, or {instead}"
            )
        return
    found = _main_objects(chain)
    if found:
        names = ", ".join(f"`__main__.{name}`" for name in found)
        raise ConfigError(
            f"{what} cannot receive {names}: pickle sends a function or class "
            "by its module and name, and `__main__` here is a `python -c` command, an "
            "interactive session or a notebook, which spawned processes cannot "
            'import (an `if __name__ == "__main__":` guard does not help here): move it into '
            f"a module of its own (a .py file your code imports), or {instead}"
        )


class _MainFinder(pickle.Pickler):
    """A pickler that notes the functions and classes of ``__main__`` it sends by name."""

    def __init__(self) -> None:
        super().__init__(io.BytesIO(), protocol=pickle.HIGHEST_PROTOCOL)
        self.found: list[str] = []

    def reducer_override(self, obj: Any) -> Any:
        is_named = isinstance(obj, (type, types.FunctionType))
        if is_named and getattr(obj, "__module__", None) == "__main__":
            name = str(getattr(obj, "__qualname__", "?"))
            if name not in self.found:
                self.found.append(name)
        return NotImplemented  # pickled as it would be


def _main_objects(chain: object) -> list[str]:
    """The qualified names of the functions and classes of ``__main__`` in ``chain``; none
    where it does not pickle at all (a lambda): the caller's own pickling says why."""
    finder = _MainFinder()
    with contextlib.suppress(Exception):
        finder.dump(chain)
        return finder.found
    return []
