"""The exceptions zephon_torch raises: each subclasses the built-in a caller would expect; and
`integer_setting` and `flag_setting`, which read an int or a bool setting or raise the
ConfigError naming it."""

from __future__ import annotations

import math
import numbers
import operator
import pickle
import re
import traceback
from typing import Any

import numpy as np

__all__ = [
    "ConfigError",
    "DataError",
    "StateMismatchError",
    "StorageError",
    "WorkerTraceback",
    "ZephonError",
    "ZephonWarning",
]

_QUOTED = r"'(?:[^'\\\n]|\\.)*'|" + r'"(?:[^"\\\n]|\\.)*"'  # a str's repr
# the last line of a worker's traceback that torch re-raises as text: "pkg.DataError: dataset
# 'name', shard 'path', row 7: what" (shard and row only where known)
# (the class's own name, so that a subclass not named *Error, like HashMismatch, reads back too)
_WHERE = (
    r"^(?:[\w.]+\.)?{name}: dataset (?P<dataset>{quoted})(?:, shard (?P<shard>{quoted}))?"
    r"(?:, row (?P<row>\d+))?: "
)

# its URL, in a traceback (object keys may hold spaces)
_URL = r"^(?:[\w.]+\.)?{name}: (.+?): "


class ZephonError(Exception):
    """Base class of every zephon_torch error.

    Pickled (sent back from a DataLoader worker or a `runner="processes"` worker), it keeps its
    cause: the cause itself where it pickles and unpickles, else a `WorkerTraceback` standing
    in for it; either way with the cause's traceback text, which names the frames of the
    function that raised it, chained below as a `WorkerTraceback`.
    """

    def __reduce__(self) -> tuple[Any, ...]:
        return _with_cause(self, super().__reduce__())


class ZephonWarning(UserWarning):
    """Every warning zephon_torch gives (a source that ran out mid-run, skipped rows, a cache
    too small for its shuffle window): ``warnings.filterwarnings("error",
    category=ZephonWarning)`` makes them errors, ``"ignore"`` silences them alone. Each points at
    the user's line that led to it, where one is on the stack."""

    once: tuple[str, ...] | None = None
    """A warning given once an iteration per key (``(kind, dataset)``): DataLoader workers each
    give their own, and the loader gives the first of each key (see `torch._warnings`)."""


class WorkerTraceback(Exception):
    """The traceback of an error's cause, as text, after the error crossed a process boundary
    (its frames cannot cross); chained as ``__cause__``, so a printed traceback shows it."""

    def __str__(self) -> str:
        return str(self.args[0]) if self.args else ""


def _with_cause(error: BaseException, reduced: str | tuple[Any, ...]) -> tuple[Any, ...]:
    """`reduced` (an error's `__reduce__` value), carrying the error's `__cause__` across."""
    cause = error.__cause__
    assert isinstance(reduced, tuple)  # an exception reduces to a tuple, never a global's name
    if cause is None:
        return reduced
    text = "".join(traceback.format_exception(cause)).rstrip("\n")
    try:
        blob: bytes | None = pickle.dumps(cause)
    except Exception:  # any cause that does not pickle travels as text
        blob = None
    return (_rebuild_with_cause, (reduced, blob, text))


def _rebuild_with_cause(reduced: tuple[Any, ...], blob: bytes | None, text: str) -> BaseException:
    rebuild, args, *rest = reduced
    error: BaseException = rebuild(*args)
    if rest and rest[0]:
        error.__dict__.update(rest[0])
    cause: BaseException
    try:
        cause = pickle.loads(blob) if blob is not None else WorkerTraceback(text)
    except Exception:  # e.g. a class this process cannot import
        cause = WorkerTraceback(text)
    if not isinstance(cause, WorkerTraceback):
        cause.__cause__ = WorkerTraceback(text)
    error.__cause__ = cause
    return error


class ConfigError(ZephonError, ValueError):
    """A setting is invalid: the message names the argument, the rule and the value (a URL's
    credentials blanked, see `without_secrets`)."""

    def __init__(self, *args: object) -> None:
        super().__init__(*(_urls_without_secrets(a) if isinstance(a, str) else a for a in args))


class StateMismatchError(ZephonError, ValueError):
    """A saved state does not fit the pipeline it is loaded into; lists every difference."""

    def __reduce__(self) -> tuple[Any, ...]:
        return _with_cause(self, (StateMismatchError, (self.mismatches, self.note)))

    def __init__(self, mismatches: dict[str, tuple[object, object]], note: str = "") -> None:
        self.mismatches = dict(mismatches)
        self.note = note
        lines = "\n".join(
            f"  {key}: saved {shown(saved)}, live {shown(live)}"
            for key, (saved, live) in sorted(mismatches.items())
        )
        super().__init__(
            f"state does not match this pipeline in {len(mismatches)} setting(s):\n{lines}"
            + (f"\n{note}" if note else "")
        )


def shown(value: object) -> str:
    """``repr(value)``, or what it is where it nests too deeply for repr (a state unpickled
    from a checkpoint may nest at any depth: a bare RecursionError where its error was made)."""
    try:
        return repr(value)
    except RecursionError:
        return f"a {type(value).__name__} nested too deeply to show"


def integer_setting(value: Any, name: str) -> int:
    """``value`` as a plain int (numpy and torch integers too: a state must be plain JSON),
    else a ``ConfigError`` naming the setting ``name`` (a float, even 2.0, is refused)."""
    if isinstance(value, bool):
        raise ConfigError(f"{name} must be an integer, got {value!r}")
    try:
        return operator.index(value)
    except TypeError:
        raise ConfigError(f"{name} must be an integer, got {value!r}") from None


def positive_setting(value: Any, name: str, *, what: str = "a positive int") -> int:
    """``value`` as a plain int of at least 1 (see ``integer_setting``), else a
    ``ConfigError`` naming the setting ``name`` and saying it must be ``what``."""
    number = integer_setting(value, name)
    if number < 1:
        raise ConfigError(f"{name} must be {what}, got {number}")
    return number


def finite_number(value: Any) -> float | None:
    """``value`` as a finite float where it is a real number (not a bool, not a string), else
    None: an int past the largest float too, which `math.isfinite` raises OverflowError on."""
    if not isinstance(value, numbers.Real) or isinstance(value, (bool, np.bool_)):
        return None
    try:
        number = float(value)
    except OverflowError:
        return None
    return number if math.isfinite(number) else None


def flag_setting(value: Any, name: str) -> bool:
    """``value`` as a plain bool (a numpy bool too: a state must be plain JSON), else a
    ``ConfigError`` naming the setting ``name`` (a string such as "False" is truthy, and 0 or 1
    are not flags)."""
    if isinstance(value, (bool, np.bool_)):
        return bool(value)
    raise ConfigError(f"{name} must be True or False, got {value!r}")


class DataError(ZephonError, ValueError):
    """Bad input data, with the dataset, shard and row where it was found.

    The library always names the dataset. The fields may be left out only so that torch, which
    re-raises a DataLoader worker's error as ``type(error)(message)`` (the worker's traceback
    as text), keeps its type: the fields are then read back from the traceback's last line,
    which this class wrote (``zephon_torch.torch.DataLoader`` passes them as they are).
    ``shard_wide``: the shard is at fault (changed or cut short since it was opened), though
    ``row`` names where it showed; ``bad_rows="skip"`` never skips such an error, nor one of a
    subclass whose ``rows_fault`` is False (a user's function that is wrong on every row).
    """

    rows_fault = True  # whether a row can be at fault; False: the error never is a row's

    def __init__(
        self,
        message: str,
        *,
        dataset: str | None = None,
        shard: str | None = None,
        row: int | None = None,
        shard_wide: bool = False,
    ) -> None:
        given = dataset is not None or shard is not None or row is not None
        if not given:
            dataset, shard, row = _where_in_traceback(message, type(self).__name__)
        self.dataset = dataset
        self.shard = shard
        self.row = row
        self.shard_wide = shard_wide
        self.detail = message
        if not given and dataset is not None:  # read back: the message says where already
            super().__init__(message)
            return
        super().__init__(_located(message, dataset, shard, row))

    def locate(self, *, dataset: str, shard: str | None, row: int | None) -> None:
        """Name where the error was found, when it names nowhere yet (one a user's map or
        filter raised): its fields and text become those of ``DataError(detail, dataset=...,
        shard=..., row=...)``; the rest (type, cause, traceback) stays."""
        if self.dataset is not None or self.shard is not None or self.row is not None:
            return
        self.dataset, self.shard, self.row = dataset, shard, row
        self.args = (_located(self.detail, dataset, shard, row),)

    def add_place(self, text: str) -> None:
        """Say more of where the error was found (``text``: "line 37 of the file"), after its
        message, once (an error passed on is told once); the fields stay as they are."""
        if self.detail.endswith(f" ({text})"):
            return
        self.detail = f"{self.detail} ({text})"
        self.args = (f"{self.args[0]} ({text})",)

    def __reduce__(self) -> tuple[Any, ...]:
        # Keyword-only fields survive the trip back from a worker process (ones read back
        # from a traceback are read back again).
        kind = type(self)
        if str(self) == self.detail:
            return _with_cause(self, (_rebuild_data_error, (self.detail, None, None, None, kind)))
        where = (self.detail, self.dataset, self.shard, self.row, kind, self.shard_wide)
        return _with_cause(self, (_rebuild_data_error, where))


def row_fault(error: DataError) -> bool:
    """Whether ``error`` is its row's own fault: it names a row, and not one a changed or cut
    shard no longer holds (``shard_wide``), and its kind can be a row's (``rows_fault``)."""
    return error.row is not None and not error.shard_wide and error.rows_fault


def cannot_pickle(error: BaseException) -> bool:
    """Whether ``error`` is pickle's refusal of what it cannot send: a ``PicklingError``, or
    the AttributeError or TypeError it raises for a local function or a lock ("Can't pickle
    local object", from Python 3.13 "Can't get local object"; "cannot pickle '_thread.lock'
    object"), which name no pickling in 3.13's words."""
    if isinstance(error, pickle.PicklingError):
        return True
    text = str(error).lower()
    return isinstance(error, AttributeError | TypeError) and (
        "pickle" in text or "local object" in text
    )


# a URL query value that is a credential: an OAuth token (gcsfs asks Google's tokeninfo with
# `?access_token=`), an Azure SAS signature, a signed URL's parts
_SECRET_QUERY = re.compile(
    r"(?<![\w-])((?:access_token|token|sig|signature|key|code|"
    r"x-amz-signature|x-amz-credential|x-amz-security-token|x-goog-signature|x-goog-credential)"
    r"=)[^&\s'\"()<>]+",
    re.IGNORECASE,
)


# a URL's password: scheme://user:password@host (up to the host's last "@", which an
# unencoded "@" in the password comes before)
_URL_PASSWORD = re.compile(r"(://[^/?#\s@:]*:)[^/?#\s]*@")
_URL_IN_TEXT = re.compile(r"[A-Za-z][A-Za-z0-9+.-]*://[^\s]*")


def without_secrets(text: str) -> str:
    """``text`` with every credential a URL carries (in its query, or a password before its
    host) replaced by ``***``."""
    return _URL_PASSWORD.sub(r"\1***@", _SECRET_QUERY.sub(r"\1***", text))


def _urls_without_secrets(text: str) -> str:
    """``text`` with the URLs in it blanked by `without_secrets` (the rest, such as a repr
    holding ``token=None``, as it is)."""
    return _URL_IN_TEXT.sub(lambda url: without_secrets(url.group()), text)


def secret_free(error: BaseException) -> BaseException | None:
    """``error`` to chain as a cause, or None where its text holds a credential: a traceback
    prints every cause whole."""
    text = str(error)
    return error if without_secrets(text) == text else None


class StorageError(ZephonError, OSError):
    """Storage failed after retries; names the URL (left out only as for ``DataError``, and
    read back from a worker's traceback text alike). ``reason``: ``"failed"`` (the retries
    ran out, or the error is not worth retrying), ``"refused"`` (the store refused the
    request: an answer that waiting cannot cure) or ``"stopped"`` (a background download,
    stopped before its retries ran out because another download from the store failed)."""

    def __init__(self, message: str, *, url: str | None = None, reason: str = "failed") -> None:
        self.reason = reason
        message = without_secrets(message)  # a client's error may quote a signed request
        read_back = url is None and "Traceback" in message
        if read_back:
            name = re.escape(type(self).__name__)
            found = re.findall(_URL.format(name=name), message, re.MULTILINE)
            url = found[-1] if found else None
        self.url = url
        self.detail = message
        shown = message if url is None or read_back else f"{without_secrets(url)}: {message}"
        super().__init__(shown)

    def __reduce__(self) -> tuple[Any, ...]:
        url = None if str(self) == self.detail else self.url  # None: no URL, or read back
        return _with_cause(self, (StorageError._rebuild, (self.detail, url, self.reason)))

    @staticmethod
    def _rebuild(message: str, url: str | None, reason: str = "failed") -> StorageError:
        return StorageError(message, url=url, reason=reason)


def _located(message: str, dataset: str | None, shard: str | None, row: int | None) -> str:
    """``message`` after where it was found, as far as known."""
    where = [] if dataset is None else [f"dataset {dataset!r}"]
    if shard is not None:  # a signed URL's credentials blanked
        where.append(f"shard {without_secrets(shard)!r}")
    if row is not None:
        where.append(f"row {row}")
    return f"{', '.join(where)}: {message}" if where else message


def _rebuild_data_error(
    message: str,
    dataset: str | None,
    shard: str | None,
    row: int | None,
    kind: type[DataError] = DataError,
    shard_wide: bool = False,
) -> DataError:
    error = kind(message, dataset=dataset, shard=shard, row=row)
    error.shard_wide = shard_wide  # set after: a subclass's own __init__ need not take it
    return error


def _where_in_traceback(text: str, name: str) -> tuple[str | None, str | None, int | None]:
    """The dataset, shard and row of the last line of class `name` (a DataError's) in a
    traceback's text (torch's re-raise of a worker's error); Nones when there is none."""
    if "Traceback" not in text:
        return None, None, None
    where = re.compile(_WHERE.format(name=re.escape(name), quoted=_QUOTED), re.MULTILINE)
    matches = list(where.finditer(text))
    if not matches:
        return None, None, None
    found = matches[-1]
    shard, row = found["shard"], found["row"]
    return (
        _unrepr(found["dataset"]),
        None if shard is None else _unrepr(shard),
        None if row is None else int(row),
    )


def _unrepr(quoted: str) -> str:
    """The str whose `repr` is `quoted`, without `ast` (see `io._mapped.read_header` for why):
    repr leaves printable characters as they are and escapes the rest, which `unicode_escape`
    reads back once every character outside latin-1 is itself written as an escape."""
    return quoted[1:-1].encode("latin-1", "backslashreplace").decode("unicode_escape")
