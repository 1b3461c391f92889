"""Downloads that stall are cut short, so a store that stops sending cannot hold a run.

A shard's download must bring `min_rate` bytes a second: judged, once the client has an
answer, each time it reports bytes, over the time since the last judgement (at least
`rate_window`), which ends a server trickling bytes (no socket timeout fires while bytes
come); and, on an async file system whose transfer runs on fsspec's event loop, by a deadline
of `rate_window + size / min_rate` from the attempt's start, at which the calling thread
cancels it (closing its connection and file), which ends a transfer that brings nothing.
Clients report bytes late where they download in parallel parts (s3fs over 50 MiB, gcsfs over
100 MiB, adlfs: one report a part or batch of parts), so between reports only the deadline is
safe to judge by, except where a client reports each read: fsspec's http and s3fs's
one-stream downloads, which must bring `min_rate` every `rate_window` once answered (a request
waiting for a pooled connection brings nothing and is no stall). huggingface_hub's file
system runs its own download, which reports nothing: no floor there. The range reads of
opening (`cat_range`: footers, headers) end by the same deadline. A `Stalled` attempt is
retried like any transient error."""

from __future__ import annotations

import asyncio
import concurrent.futures
import gc
import threading
import time
from collections.abc import Callable
from typing import Any

from fsspec.exceptions import FSTimeoutError

from zephon_torch.io._retry import RetryPolicy
from zephon_torch.io._s3_answers import is_s3, recording

_WATCH_S = 0.5  # how often the calling thread looks at an async transfer


class Stalled(TimeoutError):
    """A download brought less than its `min_rate` (transient)."""


class Pace:
    """The rate floor of one download attempt of `size` bytes.

    `check(received)`, called with the bytes received so far, raises `Stalled` where the time
    since the last judgement is at least `rate_window` and brought fewer than `min_rate` a
    second. It judges nothing before `begin()` (the client has an answer: it reports the
    size) or the first bytes: a request waiting for a pooled connection, or for a store that
    never answers, is left to the deadline. A count that goes back (a client restarting the
    transfer from byte 0) starts the window again. `overdue()` says whether the attempt has
    run past its deadline. Neither where `min_rate` is 0.
    """

    def __init__(self, min_rate: float, rate_window: float, size: int, what: str = "download"):
        self.min_rate = min_rate
        self.what = what
        self.window = rate_window
        self.size = size
        self.began = time.monotonic()
        self.deadline = self.began + rate_window + (size / min_rate if min_rate else 0.0)
        self._lock = threading.Lock()
        self._since: float | None = None  # when the window began; None before an answer
        self._mark = 0

    @property
    def on(self) -> bool:
        return self.min_rate > 0

    def begin(self) -> None:
        """The client has an answer: from now on the window is judged."""
        with self._lock:
            if self._since is None:
                self._since, self._mark = time.monotonic(), 0

    def check(self, received: int) -> None:
        if not self.on:
            return
        with self._lock:
            now = time.monotonic()
            if self._since is None or received < self._mark:
                if self._since is not None or received > 0:  # a restart, or the first bytes
                    self._since, self._mark = now, received
                return
            spent = now - self._since
            if spent < self.window:
                return
            got = received - self._mark
            if got < self.min_rate * spent:
                raise Stalled(
                    f"{self.what} stalled: {got} bytes came in the last {spent:.1f} s, "
                    f"{self._under}"
                )
            self._since, self._mark = now, received

    def overdue(self) -> bool:
        return self.on and time.monotonic() > self.deadline

    def raise_overdue(self, received: int | None) -> None:
        """Raises `Stalled`; `received`: the bytes so far, None where the client does not say."""
        got = "not done" if received is None else f"{received} bytes came"
        raise Stalled(
            f"{self.what} stalled: {got} in {time.monotonic() - self.began:.1f} s, "
            f"past the {self.deadline - self.began:.1f} s its size allows, {self._under}"
        )

    @property
    def _under(self) -> str:
        return (
            f"under the retry policy's `min_rate` of {self.min_rate:g} bytes/s (set "
            "io_options={'retry': {'min_rate': 0}} to wait on a slow link)"
        )


def reports_each_read(fs: Any, size: int) -> bool:
    """Whether `fs` reports a download's bytes as each read brings them (fsspec's http; s3fs's
    one-stream downloads: objects up to its block size, or `max_concurrency` 1), rather than
    once per part of a parallel download (s3fs's larger objects, gcsfs, adlfs)."""
    kind = type(fs).__name__
    if kind == "HTTPFileSystem":
        return True
    if kind == "S3FileSystem":
        block = getattr(fs, "default_block_size", None)
        parts = getattr(fs, "max_concurrency", None)
        return isinstance(block, int) and (size <= block or parts == 1)
    return False


def get_file(
    fs: Any,
    fs_path: str,
    target: str,
    callback: Any,
    pace: Pace,
    answers: list[str] | None = None,
) -> None:
    """`fs.get_file(fs_path, target, callback=callback)` of an object of `pace.size` bytes,
    cut short as `Stalled` where it falls under `pace` (whose `check` `callback` calls with its
    progress as bytes arrive). `answers`: where given, the ETags of its GETs on S3 are added
    to it (see `_s3_answers.recording`; nothing where the transfer is not watched).

    On an async file system the transfer runs on its event loop while this thread looks at it
    every half second, and cancels it once past `pace`'s deadline, or under its rate where the
    file system reports each read: its connection and file are let go before this returns (or
    within a further half second), so a retry can write `target` again.
    """
    loop = _running_loop(fs)
    if loop is None or not pace.on:
        fs.get_file(fs_path, target, callback=callback)
        return
    transfer = fs._get_file(fs_path, target, callback=callback)
    if answers is not None and is_s3(fs):
        transfer = recording(fs, fs.split_path(fs_path)[0], transfer, answers)
    judge_rate = reports_each_read(fs, pace.size)
    # s3fs's parallel parts hold their pooled connections past a cancel until they are
    # collected, and the retry would wait on the pool for them
    _watched(loop, transfer, pace, lambda: int(callback.value), judge_rate, collect=not judge_rate)


def cat_range(
    fs: Any,
    fs_path: str,
    start: int | None,
    end: int | None,
    retry: RetryPolicy,
    *,
    listed: int | None = None,
) -> bytes:
    """`fs.cat_file(fs_path, start=start, end=end)` (a footer, a header's value, an index:
    the whole object where `start` and `end` are None), cut short as `Stalled` on an async
    file system once past the deadline `retry`'s floor gives its bytes. A store that answered
    and then sent nothing held the read for the client's own timeouts (aiohttp's: 5
    minutes), and one that trickled, for ever.

    `listed`: the object's listed size (None: not known). The bytes of the deadline are the
    range's, but the object's on http(s)://, whose server may ignore a range and send the
    object whole, except from byte 0, where only the range's bytes are read from such an
    answer; the whole object's where no range is given, and no deadline where its size is
    not known.
    """
    if start is not None and end is not None and end <= start:
        return b""  # Azure refuses an empty range; nothing to read
    http = type(fs).__name__ == "HTTPFileSystem"
    if start is None or end is None:
        size = listed
    elif http and start > 0 and listed is not None:
        size = max(end - start, listed)
    else:
        size = end - start
    pace = Pace(retry.min_rate, retry.rate_window, size or 0, what="read")
    loop = _running_loop(fs) if pace.on and size is not None else None  # None: never cut
    data: bytes
    if http and start == 0 and end is not None and listed is not None:
        # fsspec's http file reads only the range's bytes of an answer that ignores it
        with fs.open(fs_path, "rb", block_size=end, size=listed) as handle:
            if loop is None:
                data = handle.read(end)
            else:
                data = _watched(loop, handle.async_fetch_range(0, end), pace, None)
        return data
    if loop is None:
        data = fs.cat_file(fs_path, start=start, end=end)
    else:
        data = _watched(loop, fs._cat_file(fs_path, start=start, end=end), pace, None)
    return data


def bounded(fs: Any, method: str, *args: Any, retry: RetryPolicy, what: str, **kwargs: Any) -> Any:
    """`fs.<method>(*args, **kwargs)` (`info`, `find`: a question, not a transfer), cut short
    as `Stalled` on an async file system once it has taken `retry`'s `timeout` (at least
    `_LEAST_S`): no single question outlasts what its retries may take. A store that stopped
    answering held the HEAD that checks a finished download against its listing for the
    client's own timeouts and retries (over 9 minutes with s3fs's defaults, its object's
    lock held all the while, every rank waiting on it). Not `rate_window`: a request waiting
    for a pooled connection, held by another download, is no stall. A listing of the whole
    dataset at an open is not bounded so (it may be long)."""
    loop = _running_loop(fs)
    coroutine = getattr(fs, f"_{method}", None)
    if loop is None or coroutine is None:
        return getattr(fs, method)(*args, **kwargs)
    deadline = _Deadline(max(retry.timeout, _LEAST_S), what)
    return _watched(loop, coroutine(*args, **kwargs), deadline, None)


_LEAST_S = 1.0  # the shortest a question is given (a policy's `timeout` nearly spent)


class _Deadline(Pace):
    """A question's time (see `bounded`): no rate is judged, only the time."""

    def __init__(self, seconds: float, what: str) -> None:
        super().__init__(0.0, seconds, 0, what)
        self.deadline = self.began + seconds

    def overdue(self) -> bool:
        return time.monotonic() > self.deadline

    def raise_overdue(self, received: int | None) -> None:
        raise Stalled(
            f"{self.what} stalled: no answer in {time.monotonic() - self.began:.1f} s, the "
            f"{self.deadline - self.began:.1f} s the retry policy's `timeout` gives a request"
        )


def _running_loop(fs: Any) -> asyncio.AbstractEventLoop | None:
    """The event loop that runs `fs`'s transfers, where it is async and its loop runs."""
    loop = getattr(fs, "loop", None) if getattr(fs, "async_impl", False) else None
    return loop if loop is not None and loop.is_running() else None


def _watched(
    loop: asyncio.AbstractEventLoop,
    work: Any,
    pace: Pace,
    received: Callable[[], int] | None,
    judge_rate: bool = False,
    *,
    collect: bool = False,
) -> Any:
    """The result of coroutine `work`, run on `loop` while this thread looks at it every half
    second: `Stalled` once past `pace`'s deadline, or under its rate where `judge_rate`
    (`received()`: the bytes so far, where the client reports them); the work is cancelled
    then, or on any other error, and garbage collected where `collect`.

    A client may not end at the cancel: the Azure SDK's listing on a store that stopped
    answering (SIGSTOP) went on until the connection failed, and its error, which no one
    waits for, was logged by asyncio as "Task exception was never retrieved" with a long
    traceback. What comes of work let go is dropped."""
    ended, let_go = threading.Event(), threading.Event()

    async def run() -> Any:
        try:
            return await work
        except BaseException:
            if let_go.is_set():
                return None  # no one waits for it: not an unretrieved error on the loop
            raise
        finally:
            ended.set()

    future = asyncio.run_coroutine_threadsafe(run(), loop)
    try:
        while not concurrent.futures.wait([future], timeout=_WATCH_S).done:
            got = None if received is None else received()
            if judge_rate and got is not None:
                pace.check(got)
            if pace.overdue():
                pace.raise_overdue(got)
    except BaseException:  # a stall, or Ctrl-C: the transfer must not go on alone
        let_go.set()
        future.cancel()
        ended.wait(_WATCH_S)
        if collect:
            gc.collect()
        raise
    error = future.exception()
    if isinstance(error, asyncio.TimeoutError) and not isinstance(error, Stalled):
        raise FSTimeoutError from error  # as fsspec's own `sync` raises it
    if error is not None:
        raise error
    return future.result()
