"""Calls through a weak reference to a method's object, for callbacks an object hands to the
parts it holds: held strongly, the cycle keeps the object (a pipeline with its decoded data, a
remote dataset with its open shard files) until a full garbage collection, which a process of
millions of objects runs rarely."""

from __future__ import annotations

import weakref
from collections.abc import Callable
from typing import Any


def weakly(method: Callable[..., Any], *first: Any, gone: str | None = None) -> Callable[..., Any]:
    """``method(*first, ...)`` through a weak reference to its object. Once the object is gone
    a call does nothing (returns None), or, given ``gone``, raises ReferenceError(gone)."""
    ref = weakref.WeakMethod(method)

    def call(*rest: Any) -> Any:
        bound = ref()
        if bound is None:
            if gone is not None:
                raise ReferenceError(gone)
            return None
        return bound(*first, *rest)

    return call
