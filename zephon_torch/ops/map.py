"""User maps: a function from a row dict to a row dict, applied to every document."""

from __future__ import annotations

import contextlib
import copy
import dataclasses
import enum
import functools
import hashlib
import os
import re
from collections.abc import Callable
from typing import Any, TypeVar

import numpy as np

from zephon_torch.errors import ConfigError
from zephon_torch.ops.document import Document, call_user, document_error, owned

Row = dict[str, Any]
Where = tuple[list[str], list[list[str]]]  # dataset names; per source, shard paths
R = TypeVar("R")
Op = TypeVar("Op", bound="UserOp")


class UserOp:
    """A user's function over rows, ``kind`` (``"map"``, ``"filter"``) named ``name``; once
    ``located``, an exception it raises on a row becomes a ``DataError`` naming that row."""

    kind = "user function"
    name: str
    where: Where | None = None

    def located(self: Op, where: Where) -> Op:
        """A copy whose errors name the document's dataset, shard and row."""
        out = copy.copy(self)
        out.where = where
        return out

    def given(self, doc: Document) -> Row:
        """The row ``fn`` is called with: the document's, which it may change in place (see
        `owned`)."""
        return owned(doc.data)  # type: ignore[no-any-return]

    def apply(self, fn: Callable[[Row], R], doc: Document) -> R:
        """``fn(doc.data)``; once located, an error other than a ZephonError becomes a
        DataError naming the document (``call_user``)."""
        row = self.given(doc)
        if self.where is None:
            return fn(row)
        names, paths = self.where
        what = f"{self.kind} {self.name!r}"
        return call_user(fn, row, doc, what, dataset_names=names, shard_paths=paths)


def function_name(fn: Callable[..., Any], name: str | None) -> str:
    """A name for a user function that is the same in every process, for the state
    fingerprint: explicit, else ``module.qualname`` (a lambda's with a digest of its code and
    the values it closes over, see ``_lambda_digest``); a ``functools.partial``'s is its
    function's with its arguments (sets in sorted order, arrays by dtype, shape and a digest of
    their bytes: their reprs differ between processes, or elide), a callable object's its
    class's.

    Raises:
        ConfigError: when that name would hold a memory address (a partial of an object
            without a repr of its own): a resume in another process would be refused.
    """
    if name is not None:
        return name
    derived = _derived_name(fn)
    if " at 0x" in derived:
        raise ConfigError(
            f"cannot name {fn!r} the same way in every process (its name holds a memory "
            "address, and the name goes into the state): pass `name=`"
        )
    return derived


def _derived_name(fn: Any) -> str:
    if isinstance(fn, functools.partial):
        arguments = [_argument(a) for a in fn.args]
        arguments += [f"{k}={_argument(v)}" for k, v in fn.keywords.items()]
        return f"partial({_derived_name(fn.func)}, {', '.join(arguments)})"
    if not hasattr(fn, "__qualname__"):  # a callable object: named by its class
        fn = type(fn)
    module = getattr(fn, "__module__", "?")
    # a spawned process (a DataLoader worker, a runner) imports the main script again as
    # `__mp_main__`: its functions are the main script's, and must be named as they are there
    name = f"{'__main__' if module == '__mp_main__' else module}.{fn.__qualname__}"
    if getattr(fn, "__name__", None) == "<lambda>" and hasattr(fn, "__code__"):
        return f"{name}#{_lambda_digest(fn)}"  # every lambda of a scope has one qualname
    return name


def _lambda_digest(fn: Any) -> str:
    """What a lambda computes, as a digest the same in every process of one Python version:
    its bytecode, constants and names, its defaults and the values it closes over (see
    ``_stable``). Two lambdas of one scope share a qualname: an edited threshold would
    otherwise resume a state onto other data.

    Raises:
        ConfigError: for a closed-over value too deep to describe (a list holding itself).
    """
    values = list(fn.__defaults__ or ())
    for cell in fn.__closure__ or ():
        try:
            values.append(cell.cell_contents)
        except ValueError:  # a cell not filled yet (a helper defined after the lambda)
            values.append(_EMPTY)
    try:
        parts = [_code_text(fn.__code__), *(_stable(value) for value in values)]
    except RecursionError:
        raise ConfigError(
            f"cannot name {fn.__module__}.{fn.__qualname__} by what it closes over (a value "
            "nested too deep, or holding itself): pass `name=`"
        ) from None
    return hashlib.sha256("\0".join(parts).encode()).hexdigest()[:12]


_EMPTY = object()
_SIMPLE = (int, float, str)  # exact types: their reprs tell values apart in every process


def _stable(value: Any) -> str:
    """``value`` as text the same in every process that tells its values apart: containers
    item by item (sets sorted), dataclasses field by field, numbers exactly, paths, patterns,
    enum members, partials and functions by name; anything else by its repr, or by its type
    where the repr holds a memory address."""
    if value is _EMPTY:
        return "<empty>"
    if isinstance(value, bool) or value is None:
        return repr(value)
    if isinstance(value, int):
        return f"int({value:#x})"  # no limit on digits, unlike str()
    if isinstance(value, (float, complex, str, bytes)):
        return repr(value)
    if isinstance(value, (np.ndarray, np.generic)):
        array = np.asarray(value)  # a numpy scalar too: by dtype and bytes
        return f"array({_stable(array.tolist())})" if array.dtype.hasobject else _argument(array)
    if isinstance(value, (set, frozenset)):
        return f"{type(value).__name__}({', '.join(sorted(_stable(v) for v in value))})"
    if isinstance(value, (list, tuple)):
        if all(type(v) in _SIMPLE for v in value):  # the common long case, at repr's speed
            with contextlib.suppress(ValueError):  # an int past str()'s digit limit
                return f"{type(value).__name__}({value!r})"
        return f"{type(value).__name__}({', '.join(_stable(v) for v in value)})"
    if isinstance(value, dict):
        return "{" + ", ".join(f"{_stable(k)}: {_stable(v)}" for k, v in value.items()) + "}"
    kind = f"{type(value).__module__}.{type(value).__qualname__}"
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        fields = (f"{f.name}={_stable(getattr(value, f.name))}" for f in dataclasses.fields(value))
        return f"{kind}({', '.join(fields)})"
    if isinstance(value, enum.Enum):
        return f"{kind}.{value.name}"
    if isinstance(value, os.PathLike):
        return f"{kind}({os.fspath(value)!r})"
    if isinstance(value, re.Pattern):
        return f"{kind}({value.pattern!r}, {value.flags})"
    if callable(value):  # a function by its name (a lambda's with its digest)
        with contextlib.suppress(ConfigError, RecursionError):
            return function_name(value, None)
        return f"{getattr(value, '__module__', '?')}.{getattr(value, '__qualname__', kind)}"
    text = repr(value)
    return f"<{kind}>" if " at 0x" in text else f"{kind}({text})"


def _code_text(code: Any) -> str:
    consts = [_code_text(c) if hasattr(c, "co_code") else _argument(c) for c in code.co_consts]
    return f"{code.co_code.hex()}|{code.co_names}|{code.co_varnames}|{', '.join(consts)}"


def _argument(value: Any) -> str:
    """A partial's argument as text that is the same in every process and tells different
    values apart."""
    if isinstance(value, (set, frozenset)):
        inner = ", ".join(sorted(_argument(v) for v in value))
        return f"{type(value).__name__}({{{inner}}})"
    if isinstance(value, dict):
        return "{" + ", ".join(f"{_argument(k)}: {_argument(v)}" for k, v in value.items()) + "}"
    if isinstance(value, (list, tuple)):
        inner = ", ".join(_argument(v) for v in value)
        return f"[{inner}]" if isinstance(value, list) else f"({inner})"
    if isinstance(value, np.ndarray) and value.dtype.hasobject:
        return f"array({_argument(value.tolist())})"
    if isinstance(value, np.ndarray):
        digest = hashlib.sha256(np.ascontiguousarray(value).tobytes()).hexdigest()
        return f"array({value.dtype}, {value.shape}, {digest[:16]})"
    return repr(value)


class MapOp(UserOp):
    """Apply ``fn(row) -> row`` to each document's row.

    Args:
        fn: a pure function (same row in, same row out on every call); with the processes
            runner it must be picklable (a module-level function).
        name: names the function in the state fingerprint; defaults to ``function_name``'s.
    """

    kind = "map"

    def __init__(self, fn: Callable[[Row], Row], *, name: str | None = None) -> None:
        if not callable(fn):
            raise ConfigError(f"`map` needs a callable, got {fn!r}")
        self.fn = fn
        self.name = function_name(fn, name)

    def __call__(self, docs: list[Document]) -> list[Document]:
        for doc in docs:
            assert doc.data is not None  # fetch always fills data before user ops
            out = self.apply(self.fn, doc)
            if not isinstance(out, dict):
                message = f"map {self.name!r} must return a dict, got {type(out).__name__}"
                if self.where is None:
                    raise ConfigError(message)
                names, paths = self.where
                raise document_error(doc, message, dataset_names=names, shard_paths=paths)
            doc.data = out
        return docs

    def fingerprint(self) -> dict[str, Any]:
        """The function's name: changing it changes the data."""
        return {"kind": "map", "name": self.name}
