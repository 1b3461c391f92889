"""User maps: a function from a row dict to a row dict, applied to every document."""

from __future__ import annotations

import copy
import functools
import hashlib
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

    def apply(self, fn: Callable[[Row], R], doc: Document) -> R:
        """``fn(doc.data)``; once located, an error other than a ZephonError becomes a
        DataError naming the document (``call_user``)."""
        row = owned(doc.data)  # the function may change it in place (see `owned`)
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
    name = f"{getattr(fn, '__module__', '?')}.{fn.__qualname__}"
    if getattr(fn, "__name__", None) == "<lambda>" and hasattr(fn, "__code__"):
        return f"{name}#{_lambda_digest(fn)}"  # every lambda of a scope has one qualname
    return name


def _lambda_digest(fn: Any) -> str:
    """What a lambda computes, as a digest the same in every process of one Python version:
    its bytecode, constants and names, its defaults and the values it closes over (those
    without a text the same in every process, such as objects whose repr holds a set or an
    address, by their type). Two lambdas of one scope share a qualname: an edited threshold
    would otherwise resume a state onto other data."""
    parts = [_code_text(fn.__code__), _stable(fn.__defaults__ or ())]
    for cell in fn.__closure__ or ():
        try:
            parts.append(_stable(cell.cell_contents))
        except ValueError:  # a cell not filled yet (a helper defined after the lambda)
            parts.append("<empty>")
    return hashlib.sha256("\0".join(parts).encode()).hexdigest()[:12]


_PLAIN = (type(None), bool, int, float, complex, str, bytes)


def _stable(value: Any) -> str:
    """``value`` as text the same in every process: plain values, arrays and containers of
    them (see ``_argument``); anything else by its type's name."""
    if isinstance(value, (list, tuple, set, frozenset)):
        if all(isinstance(v, _PLAIN) for v in value):
            return _argument(value)
        inner = ", ".join(_stable(v) for v in value)
        return f"{type(value).__name__}({inner})"
    if isinstance(value, dict):
        return "{" + ", ".join(f"{_stable(k)}: {_stable(v)}" for k, v in value.items()) + "}"
    if isinstance(value, (*_PLAIN, np.ndarray)):
        return _argument(value)
    return f"<{type(value).__module__}.{type(value).__qualname__}>"


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
