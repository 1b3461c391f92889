"""Retries of transient storage errors with capped exponential backoff, then a StorageError.

Object stores fail transiently (throttling, dropped connections, a restarting endpoint); one
such failure must not end a training run, and a dead endpoint must not hang it either. So every
remote call gets a bounded number of attempts, none started after a time limit, and then
raises one `StorageError` naming the URL and the last cause. An attempt runs in the client's
code and is not cut short (its own timeouts and retries bound it, see `RetryPolicy`), save a
shard's download or a range read that falls under a rate floor (see `_stall`). Errors that
cannot heal by waiting (a missing object, a denied permission, a bad setting) are raised at
once.
"""

from __future__ import annotations

import contextlib
import contextvars
import errno
import functools
import logging
import sys
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import TypeVar

from zephon_torch.errors import (
    ConfigError,
    StorageError,
    ZephonError,
    finite_number,
    secret_free,
    without_secrets,
)

T = TypeVar("T")

_PERMANENT: tuple[type[BaseException], ...] = (
    FileNotFoundError,
    PermissionError,
    IsADirectoryError,
    NotADirectoryError,
    ImportError,
    TypeError,
    AttributeError,
    ZephonError,
)
# What a client raises on a setting of the wrong type or shape (`storage_options`)
_BAD_SETTING: tuple[type[BaseException], ...] = (TypeError, AttributeError)


# Set while a storage call of this package runs, in the calling thread and in the tasks it
# starts on fsspec's event-loop thread (which copy the caller's context).
_CALLING: contextvars.ContextVar[bool] = contextvars.ContextVar("zephon_call", default=False)
# Clients that log each failure they give up on at ERROR, with its traceback (gcsfs, for every
# request out of retries: 170 tracebacks on stderr for one dead store in a review's run), or a
# WARNING per broken download (azure-core): during this package's calls, whose failures reach
# the caller as one error chained to the client's, these records are demoted to DEBUG.
_CHATTY_LOGGERS = (
    "gcsfs",
    "azure.core.pipeline.transport._aiohttp",
    "azure.core.pipeline.transport._requests_asyncio",
    "azure.core.pipeline.transport._requests_basic",
)


class _DemotedInCalls(logging.Filter):
    """Demotes a record to DEBUG when logged during a storage call of this package."""

    def filter(self, record: logging.LogRecord) -> bool:
        if _CALLING.get() and record.levelno > logging.DEBUG:
            record.levelno, record.levelname = logging.DEBUG, "DEBUG"
        return True


_DEMOTED = _DemotedInCalls()


@functools.cache
def _demote_client_logs() -> None:
    """Adds the filter to the chatty clients' loggers, once, at this package's first storage
    call: not on import, which changes nothing outside the package."""
    for name in _CHATTY_LOGGERS:
        logging.getLogger(name).addFilter(_DEMOTED)


@dataclass(frozen=True, kw_only=True)
class RetryPolicy:
    """How often and how long a failing storage call is retried.

    Args:
        attempts: the most calls in all, the first included; at least 1.
        initial_delay: seconds slept after the first failure; doubled after each further one.
        max_delay: the longest single sleep, in seconds.
        timeout: seconds after the first attempt's start past which no retry starts (one
            whose backoff would end past it is not slept for). A running attempt is not cut
            short, so a call can take this plus one whole attempt, and an attempt against a
            store that stops answering lasts the client's own timeouts times its own retries:
            for s3fs, its 5 tries times botocore's attempts, each up to `read_timeout` (60 s
            by default); 412 s for one shard with every default, measured. Bound it with the
            client's settings, for s3fs `storage_options={"config_kwargs": {"connect_timeout":
            1, "read_timeout": 10, "retries": {"max_attempts": 1}}}` (24 s measured with
            `read_timeout` 2). Downloads are the exception: see `min_rate`.
        min_rate: bytes a second a shard's download must bring, else the attempt is cut
            short as stalled and retried (0: never). Judged as the client reports bytes, over
            at least `rate_window`; on s3://, gs://, az:// and http(s):// also by a deadline of
            `rate_window + size / min_rate`, which ends a download bringing nothing (see
            `_stall`). Not on hf://, whose client reports no bytes. The same deadline ends
            opening's reads (Parquet footers, `.npy` headers and values, `index.json`).
        rate_window: the fewest seconds `min_rate` is judged over; more than 0. A deadline
            also allows this long for the first byte (a pooled connection waited for
            included), all a small read gets beyond its bytes' time: keep it above the
            store's slowest answer.
    """

    attempts: int = 6
    initial_delay: float = 0.5
    max_delay: float = 8.0
    timeout: float = 120.0
    min_rate: float = 16384.0
    rate_window: float = 30.0

    def __post_init__(self) -> None:
        if isinstance(self.attempts, bool) or not isinstance(self.attempts, int):
            raise ConfigError(f"retry `attempts` must be an int, got {self.attempts!r}")
        if self.attempts < 1:
            raise ConfigError(f"retry `attempts` must be at least 1, got {self.attempts}")
        for field in ("initial_delay", "max_delay", "timeout", "min_rate", "rate_window"):
            value = getattr(self, field)
            unit = "bytes/s" if field == "min_rate" else "seconds"
            number = finite_number(value)
            if number is None or number < 0:
                raise ConfigError(
                    f"retry `{field}` must be a finite number of {unit} >= 0, got {value!r}"
                )
        if self.rate_window == 0:
            raise ConfigError("retry `rate_window` must be more than 0 seconds, got 0")


# Clients that found no usable credentials: a setting to fix, not a failure to wait out. Looked
# up only in modules already imported (the client that raised has imported its own).
_CREDENTIAL_ERRORS = {
    "botocore.exceptions": ("NoCredentialsError", "PartialCredentialsError"),
    "google.auth.exceptions": ("DefaultCredentialsError",),
}


# Errors holding the status elsewhere, looked up only in modules already imported (aiohttp's
# `code` is a deprecated alias of its `status`: not read).
_STATUS_ATTRIBUTES = (
    ("gcsfs.retry", "HttpError", "code"),
    ("aiohttp.client_exceptions", "ClientResponseError", "status"),
)


# S3 answers with a 400 that a later attempt may not get: a connection the server found idle
# too long.
_S3_WAIT_CODES = frozenset({"RequestTimeout"})


def http_status(error: BaseException) -> int | None:
    """The HTTP status of the answer an error carries (`error.response.status_code`, as
    huggingface_hub's, requests' and Azure's errors have it, botocore's `response` dict, gcsfs's
    `code`, aiohttp's `status` (for fsspec's http://)), or that its causes carry: s3fs raises
    most S3 answers as a plain OSError caused by botocore's error. None: no answer came."""
    seen: set[int] = set()
    current: BaseException | None = error
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        status = _own_status(current)
        if status is not None:
            return status
        current = current.__cause__
    return None


def _own_status(error: BaseException) -> int | None:
    response = getattr(error, "response", None)
    if isinstance(response, dict):  # botocore's ClientError
        status = response.get("ResponseMetadata", {}).get("HTTPStatusCode")
        if response.get("Error", {}).get("Code") in _S3_WAIT_CODES:
            status = 408
    else:
        status = getattr(response, "status_code", None)
    for module, name, attribute in _STATUS_ATTRIBUTES:
        loaded = sys.modules.get(module)
        if not isinstance(status, int) and loaded is not None:
            kind = getattr(loaded, name, None)
            if isinstance(kind, type) and isinstance(error, kind):
                status = getattr(error, attribute, None)
    return status if isinstance(status, int) and not isinstance(status, bool) else None


def lacks_credentials(error: BaseException) -> bool:
    """Whether `error` is a storage client's "no usable credentials"."""
    return _loaded_instance(error, _CREDENTIAL_ERRORS)


def _loaded_instance(error: BaseException, kinds: dict[str, tuple[str, ...]]) -> bool:
    """Whether `error` is of one of the named classes, in modules already imported."""
    for module, names in kinds.items():
        loaded = sys.modules.get(module)
        if loaded is not None and isinstance(
            error, tuple(getattr(loaded, name) for name in names if hasattr(loaded, name))
        ):
            return True
    return False


# A full local disk (or quota) under a download's target: the node's to fix, not the store's.
_DISK_FULL = frozenset({errno.ENOSPC, errno.EDQUOT})


def disk_full(error: BaseException) -> bool:
    """Whether `error` is a local disk's "no space left" (ENOSPC) or "quota exceeded"."""
    return isinstance(error, OSError) and error.errno in _DISK_FULL


# Client-side refusals of a setting (an invalid bucket name), looked up as above.
_INVALID_SETTINGS: dict[str, tuple[str, ...]] = {"botocore.exceptions": ("ParamValidationError",)}


def is_transient(error: BaseException) -> bool:
    """Whether waiting and trying again may cure `error`: not a missing object, denied
    access, a bad argument, a full local disk (`disk_full`), or an HTTP 4xx answer other than
    408 (timeout) and 429 (too many requests)."""
    if not isinstance(error, Exception) or isinstance(error, _PERMANENT) or disk_full(error):
        return False
    if _loaded_instance(error, _INVALID_SETTINGS):
        return False
    if lacks_credentials(error):
        return False
    status = http_status(error)
    return status is None or status >= 500 or status in (408, 429)


def refused(error: BaseException | None) -> bool:
    """Whether `error` is an answer of the store that waiting cannot cure (an HTTP 4xx other
    than 408 and 429) in an error type that says nothing of storage: gcsfs raises a 409 or a
    416 as its own `HttpError`, not an OSError."""
    if not isinstance(error, Exception) or isinstance(error, (OSError, ZephonError)):
        return False
    return http_status(error) is not None and not is_transient(error)


def denied(error: BaseException) -> bool:
    """Whether the store refused access: a `PermissionError` naming no local file (as s3fs
    raises S3's AccessDenied; a local file's names it), gcsfs's plain `OSError` for a 403
    ("Forbidden: path"), or an HTTP 401 or 403 answer."""
    if isinstance(error, PermissionError) and error.filename is None:
        return True
    gcs = type(error) is OSError and "gcsfs.retry" in sys.modules
    if gcs and str(error).startswith("Forbidden: "):
        return True
    return http_status(error) in (401, 403)


def call_with_retry(
    call: Callable[[], T],
    *,
    url: str,
    policy: RetryPolicy,
    what: str = "storage call",
    permanent: tuple[type[Exception], ...] = (),
    stop: threading.Event | None = None,
) -> T:
    """Returns `call()`, retrying transient errors under `policy`.

    Args:
        call: the storage operation.
        url: the object it concerns, named in the error.
        policy: the retry bounds.
        what: a few words on the operation ("download", "listing"), for the message.
        permanent: more error types raised at once (for this call, not transient).
        stop: once set, no retry starts (a sleep between attempts ends early): a prefetch
            stops when another download from the store has failed.

    Raises:
        StorageError: when the attempts or the time run out, or `stop` is set (its `reason`
            "stopped"), naming `url` and the last error; at once, for an answer of the store
            that waiting cannot cure in an error type that says nothing of storage (`refused`;
            its `reason` "refused").
        ConfigError: at once, when the client found no usable credentials, or the store
            denied access (`denied`), or the client failed on a setting of the wrong type
            (a TypeError or AttributeError), naming `url`.
        Exception: another permanent error (a missing object, a bad argument), unchanged.
    """
    start = time.monotonic()
    delay = min(policy.initial_delay, policy.max_delay)
    attempt = 0
    while True:
        attempt += 1
        try:
            return quietly(call)
        except Exception as error:
            if lacks_credentials(error):
                raise ConfigError(
                    f"{what} of {url!r} found no usable credentials: "
                    f"{type(error).__name__}: {without_secrets(str(error))}"
                ) from secret_free(error)
            if isinstance(error, permanent):
                raise
            if isinstance(error, _BAD_SETTING):
                raise ConfigError(
                    f"{what} of {url!r} failed on a setting of the storage client (check "
                    f"storage_options): {type(error).__name__}: {without_secrets(str(error))}"
                ) from secret_free(error)
            if denied(error):
                raise ConfigError(
                    f"{what} of {url!r} was denied (check the credentials and what they may "
                    f"read): {type(error).__name__}: {without_secrets(str(error))}"
                ) from secret_free(error)
            if refused(error):
                raise StorageError(
                    f"{what} was refused by the store (not retried): "
                    f"{type(error).__name__}: {error}",
                    url=url,
                    reason="refused",
                ) from secret_free(error)
            if not is_transient(error):
                raise
            elapsed = time.monotonic() - start
            spent = attempt >= policy.attempts or elapsed + delay > policy.timeout
            abandoned = _ABANDONED.get()
            if spent or _stopped(stop, abandoned, delay):
                why = "failed" if spent else "stopped, another download having failed,"
                if not spent and abandoned is not None and abandoned.is_set():
                    why = "stopped, the work it served having been abandoned,"
                raise StorageError(  # which blanks the credentials the text may quote
                    f"{what} {why} after {attempt} attempt(s) in "
                    f"{time.monotonic() - start:.1f} s: {type(error).__name__}: {error}",
                    url=url,
                    reason="failed" if spent else "stopped",
                ) from secret_free(error)
        delay = min(delay * 2, policy.max_delay)


def quietly(call: Callable[[], T]) -> T:
    """`call()`, a storage call whose failure this package reports itself, with the storage
    clients' own logs of it demoted to DEBUG (see `_CHATTY_LOGGERS`)."""
    _demote_client_logs()
    calling = _CALLING.set(True)
    try:
        return call()
    finally:
        _CALLING.reset(calling)


def _stopped(stop: threading.Event | None, abandoned: threading.Event | None, delay: float) -> bool:
    """Sleeps `delay` seconds, or less where `stop` or `abandoned` is set meanwhile; whether
    one is."""
    events = [event for event in (stop, abandoned) if event is not None]
    if not events:
        time.sleep(delay)
        return False
    if len(events) == 1:
        return events[0].wait(delay)
    deadline = time.monotonic() + delay
    while not any(event.is_set() for event in events):
        left = deadline - time.monotonic()
        if left <= 0:
            return False
        events[0].wait(min(left, _POLL_S))
    return True


# the event that ends this thread's retries early: set where the work they serve was
# abandoned (see `abandoned_when`)
_ABANDONED: contextvars.ContextVar[threading.Event | None] = contextvars.ContextVar(
    "zephon_abandoned", default=None
)
_POLL_S = 0.05  # how often a sleep watching two events looks at the second


@contextlib.contextmanager
def abandoned_when(event: threading.Event) -> Iterator[None]:
    """Within it, storage retries on this thread stop, as a prefetch's `stop` does, once
    `event` is set: a pool's threads, or a batch prefetcher's, whose pipeline stopped (an
    error raised to the loop, or a `break`). A read of theirs still retrying a dead store
    held its object's lock and reservation for the policy's whole `timeout` (two minutes by
    default) after the run had its error."""
    token = _ABANDONED.set(event)
    try:
        yield
    finally:
        _ABANDONED.reset(token)
