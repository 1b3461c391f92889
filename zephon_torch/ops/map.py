"""User maps: a function from a row dict to a row dict, applied to every document."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from zephon_torch.errors import ConfigError
from zephon_torch.ops.document import Document

Row = dict[str, Any]


def function_name(fn: Callable[..., Any], name: str | None) -> str:
    """A stable name for a user function: explicit, else ``module.qualname``."""
    if name is not None:
        return name
    return f"{getattr(fn, '__module__', '?')}.{getattr(fn, '__qualname__', repr(fn))}"


class MapOp:
    """Apply ``fn(row) -> row`` to each document's row.

    Args:
        fn: a pure function (same row in, same row out on every call); with the processes
            runner it must be picklable (a module-level function).
        name: names the function in the state fingerprint; defaults to its qualified name.
    """

    def __init__(self, fn: Callable[[Row], Row], *, name: str | None = None) -> None:
        if not callable(fn):
            raise ConfigError(f"`map` needs a callable, got {fn!r}")
        self.fn = fn
        self.name = function_name(fn, name)

    def __call__(self, docs: list[Document]) -> list[Document]:
        for doc in docs:
            assert doc.data is not None  # fetch always fills data before user ops
            out = self.fn(doc.data)
            if not isinstance(out, dict):
                raise ConfigError(f"map {self.name!r} must return a dict, got {type(out).__name__}")
            doc.data = out
        return docs

    def fingerprint(self) -> dict[str, Any]:
        """The function's name: changing it changes the data."""
        return {"kind": "map", "name": self.name}
