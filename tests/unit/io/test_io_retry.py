"""Retries of storage calls: transient errors retried then raised as StorageErrors; answers and
client errors that waiting cannot cure raised at once."""

from __future__ import annotations

import errno
import os
import threading
import time
from collections.abc import Callable, Iterator

import pytest

from zephon_torch.errors import ConfigError, StorageError
from zephon_torch.io._retry import RetryPolicy, abandoned_when, call_with_retry, is_transient


def _failing_twice(calls: list[int]) -> Callable[[], str]:
    """A call that fails twice as a store in trouble does, then answers "ok"."""

    def flaky() -> str:
        calls.append(1)
        if len(calls) < 3:
            raise ConnectionResetError("reset")
        return "ok"

    return flaky


def test_transient_errors_are_retried_then_raised_as_storage_errors() -> None:
    calls: list[int] = []
    flaky = _failing_twice(calls)

    policy = RetryPolicy(attempts=3, initial_delay=0.001)
    assert call_with_retry(flaky, url="s3://b/k", policy=policy) == "ok"

    def broken() -> None:
        raise TimeoutError("slow")

    with pytest.raises(StorageError, match=r"s3://b/k.*2 attempt") as caught:
        call_with_retry(broken, url="s3://b/k", policy=RetryPolicy(attempts=2, initial_delay=0))
    assert caught.value.url == "s3://b/k"
    with pytest.raises(FileNotFoundError):
        call_with_retry(
            lambda: (_ for _ in ()).throw(FileNotFoundError("gone")),
            url="s3://b/k",
            policy=policy,
        )


class _Answered(OSError):
    """An HTTP client's error carrying the server's answer, as huggingface_hub's do."""

    def __init__(self, status: int) -> None:
        super().__init__(f"HTTP {status}")
        self.response = type("Response", (), {"status_code": status})()


@pytest.mark.parametrize(
    ("status", "retried"),
    [
        (400, False),
        (401, False),
        (403, False),
        (404, False),
        (408, True),
        (429, True),
        (500, True),
        (503, True),
    ],
)
def test_an_http_answer_is_retried_only_when_waiting_may_cure_it(
    status: int, retried: bool
) -> None:
    calls: list[int] = []

    def answered() -> None:
        calls.append(1)
        raise _Answered(status)

    policy = RetryPolicy(attempts=3, initial_delay=0)
    raised = StorageError if retried else ConfigError if status in (401, 403) else _Answered
    with pytest.raises(raised):  # a denial names the URL
        call_with_retry(answered, url="hf://datasets/o/n", policy=policy)
    assert len(calls) == (3 if retried else 1)


def test_the_cloud_clients_errors_are_told_apart_without_waiting() -> None:
    """Real exception classes: gcsfs's HttpError carries its status as `code`, aiohttp's as
    `status`; missing credentials (botocore, google-auth) are a ConfigError at once, not
    six retries."""
    from botocore.exceptions import NoCredentialsError
    from gcsfs.retry import HttpError
    from google.auth.exceptions import DefaultCredentialsError

    policy = RetryPolicy(attempts=3, initial_delay=0)
    for status, retried in ((401, False), (403, False), (429, True), (503, True)):
        calls: list[int] = []

        def answered(status: int = status, calls: list[int] = calls) -> None:
            calls.append(1)
            raise HttpError({"code": status, "message": "no"})

        with pytest.raises(StorageError if retried else ConfigError, match="gs://b/k"):
            call_with_retry(answered, url="gs://b/k", policy=policy)
        assert len(calls) == (3 if retried else 1)
    import warnings

    from aiohttp import ClientResponseError, RequestInfo
    from yarl import URL

    info = RequestInfo(URL("http://h/k"), "GET", {}, URL("http://h/k"))  # type: ignore[arg-type]
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # its deprecated `code` is not read
        assert not is_transient(ClientResponseError(info, (), status=404))  # fsspec's http://
        assert is_transient(ClientResponseError(info, (), status=503))
    for error in (NoCredentialsError(), DefaultCredentialsError("none found")):
        calls = []

        def refused(error: Exception = error, calls: list[int] = calls) -> None:
            calls.append(1)
            raise error

        with pytest.raises(ConfigError, match=r"listing of 's3://b/k' found no usable cred"):
            call_with_retry(refused, url="s3://b/k", policy=policy, what="listing")
        assert len(calls) == 1


def test_an_azure_token_request_that_failed_in_transit_is_retried_a_refused_one_is_not() -> None:
    """azure-identity wraps an unreachable token endpoint in ClientAuthenticationError, the
    class it also raises for a refused key: only its status tells them apart."""
    from azure.core.exceptions import ClientAuthenticationError
    from azure.identity import ClientSecretCredential

    credential = ClientSecretCredential(
        "tenant",
        "client",
        "secret",
        authority="https://127.0.0.1:9",  # nothing listens there (a bare host:port parses
        # as a URL scheme on Python 3.10, which azure-identity refuses)
        disable_instance_discovery=True,
        retry_total=0,
    )
    calls: list[int] = []

    def refresh() -> None:
        calls.append(1)
        credential.get_token("https://storage.azure.com/.default")

    policy = RetryPolicy(attempts=3, initial_delay=0.0)
    with pytest.raises(StorageError) as raised:
        call_with_retry(refresh, url="az://c/k", policy=policy)
    assert isinstance(raised.value.__cause__, ClientAuthenticationError)
    assert len(calls) == 3

    class Answer:
        status_code, reason = 403, "Forbidden"

    refused = ClientAuthenticationError("AuthenticationFailed")
    refused.response = Answer()  # type: ignore[assignment]
    calls.clear()

    def denied() -> None:
        calls.append(1)
        raise refused

    with pytest.raises(ConfigError, match=r"storage call of 'az://c/k' was denied") as caught:
        call_with_retry(denied, url="az://c/k", policy=policy)
    assert caught.value.__cause__ is refused
    assert len(calls) == 1


def test_s3_answers_that_s3fs_raises_as_plain_os_errors_are_told_apart_by_their_cause() -> None:
    """s3fs raises most S3 4xx answers as OSError(EINVAL/EIO) caused by botocore's
    ClientError, whose status sits in a `response` dict; botocore refuses a bad bucket name
    before sending anything. All were retried six times, 15.5 s, by default."""
    from botocore.exceptions import ClientError, ParamValidationError
    from s3fs.errors import translate_boto_error

    def s3_answer(code: str, status: int) -> BaseException:
        answer = {"Error": {"Code": code, "Message": code}}
        answer["ResponseMetadata"] = {"HTTPStatusCode": status}  # type: ignore[dict-item]
        return translate_boto_error(ClientError(answer, "GetObject"))  # type: ignore[arg-type]

    for code, status in [
        ("InvalidRange", 416),
        ("InvalidArgument", 400),
        ("AuthorizationHeaderMalformed", 400),
        ("PermanentRedirect", 301),
        ("PreconditionFailed", 412),
    ]:
        error = s3_answer(code, status)
        assert isinstance(error, OSError) and not is_transient(error), code
    for code, status in [("SlowDown", 503), ("InternalError", 500), ("RequestTimeout", 400)]:
        assert is_transient(s3_answer(code, status)), code
    assert not is_transient(ParamValidationError(report="Invalid bucket name"))
    assert is_transient(OSError("connection reset"))  # no answer came: retried


def test_a_local_file_s_permission_error_is_not_taken_for_a_denial_of_the_store() -> None:
    """A store's denial is a ConfigError naming the URL; a local file the call could not write
    (in the cache folder) stays the PermissionError naming that file, as `open` raises it."""
    policy = RetryPolicy(attempts=3, initial_delay=0)

    def writes() -> None:
        raise PermissionError(13, "Permission denied", "/cache/.downloading/shard")

    def refused() -> None:
        raise PermissionError(13, "Access Denied")  # s3fs's, for S3's AccessDenied

    with pytest.raises(PermissionError, match=r"/cache/\.downloading/shard"):
        call_with_retry(writes, url="s3://b/k", policy=policy)
    with pytest.raises(ConfigError, match=r"storage call of 's3://b/k' was denied"):
        call_with_retry(refused, url="s3://b/k", policy=policy)


def test_gcsfs_s_answer_to_a_403_is_a_denial() -> None:
    """gcsfs raises a 403 as a plain OSError ("Forbidden: path"), with no status: it was
    retried as transient, then a StorageError."""
    from gcsfs.retry import validate_response

    calls: list[int] = []
    body = b'{"error": {"code": 403, "message": "no storage.objects.list access"}}'

    def forbidden() -> None:
        calls.append(1)
        validate_response(403, body, "b/bkt/o")

    policy = RetryPolicy(attempts=3, initial_delay=0)
    with pytest.raises(ConfigError, match=r"listing of 'gs://bkt/d/' was denied.*Forbidden"):
        call_with_retry(forbidden, url="gs://bkt/d/", policy=policy, what="listing")
    assert len(calls) == 1


@pytest.mark.parametrize("number", [errno.ENOSPC, errno.EDQUOT])
def test_a_full_local_disk_is_raised_at_once_not_retried_as_a_store_failure(number: int) -> None:
    """ENOSPC carries no HTTP status, so it was retried as transient (6 times over 15.6 s a
    shard), then raised as a StorageError blaming the remote URL."""
    calls: list[int] = []

    def writes() -> None:
        calls.append(1)
        raise OSError(number, os.strerror(number))

    policy = RetryPolicy(attempts=3, initial_delay=0)
    with pytest.raises(OSError) as caught:
        call_with_retry(writes, url="s3://b/k", policy=policy, what="download")
    assert caught.value.errno == number and not isinstance(caught.value, StorageError)
    assert len(calls) == 1


def test_a_set_stop_ends_the_retries_and_wakes_the_sleep_between_them() -> None:
    """A prefetch stops retrying once another download from the store has failed: the stop is
    checked after each failure, and a backoff sleep ends when it is set."""
    calls: list[int] = []
    stop = threading.Event()

    def down() -> None:
        calls.append(1)
        raise ConnectionResetError("reset")

    policy = RetryPolicy(attempts=100, initial_delay=60, timeout=600)
    threading.Timer(0.2, stop.set).start()
    start = time.monotonic()
    with pytest.raises(StorageError, match=r"stopped, .* after 1 attempt\(s\)") as caught:
        call_with_retry(down, url="s3://b/k", policy=policy, stop=stop)
    assert time.monotonic() - start < 30  # not the 60 s sleep
    assert len(calls) == 1
    assert caught.value.url == "s3://b/k"
    assert isinstance(caught.value.__cause__, ConnectionResetError)

    with pytest.raises(StorageError, match="stopped"):  # set before the call: no retry
        call_with_retry(down, url="s3://b/k", policy=policy, stop=stop)
    assert len(calls) == 2
    assert call_with_retry(lambda: "ok", url="s3://b/k", policy=policy, stop=stop) == "ok"


def test_importing_the_package_leaves_other_packages_loggers_alone() -> None:
    """The filter that demotes cloud clients' logs during this package's storage calls was
    added to their loggers on import (a side effect outside the package): now at the first
    storage call (review L, finding 11)."""
    import subprocess
    import sys

    probe = (
        "import logging, zephon_torch, zephon_torch.io._retry as r\n"
        "before = len(logging.getLogger('gcsfs').filters)\n"
        "r.quietly(lambda: None)\n"
        "print(before, len(logging.getLogger('gcsfs').filters))\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, check=True, timeout=120
    )
    assert done.stdout.split() == ["0", "1"]


def test_no_sleep_between_attempts_is_longer_than_max_delay(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """An `initial_delay` above `max_delay` was slept whole before the first retry."""
    slept: list[float] = []
    monkeypatch.setattr(time, "sleep", slept.append)

    def broken() -> None:
        raise ConnectionResetError("reset")

    policy = RetryPolicy(attempts=4, initial_delay=5.0, max_delay=0.25)
    with pytest.raises(StorageError, match="4 attempt"):
        call_with_retry(broken, url="s3://b/k", policy=policy)
    assert slept == [0.25, 0.25, 0.25]


def _retrying_forever(calls: list[float]) -> None:
    """A read of a dead store under a two-minute policy: it fails until it is stopped."""

    def down() -> None:
        calls.append(time.monotonic())
        raise ConnectionResetError("reset")

    call_with_retry(down, url="s3://b/k", policy=RetryPolicy(attempts=100, timeout=120))


def test_a_pool_shut_down_ends_its_running_reads_retries() -> None:
    """The pipeline's runner threads kept retrying their reads of a dead store for the policy's
    whole timeout after the run had raised its error (34 s with a 20 s timeout, holding their
    objects' locks and cache reservations): shutting the pool down now ends them."""
    from zephon_torch.ops._daemon_pool import DaemonPool

    calls: list[float] = []
    pool = DaemonPool(2, "zephon-test-pool")
    running = pool.submit(_retrying_forever, calls)
    while len(calls) < 2:  # retrying: past its first sleep
        time.sleep(0.01)
    pool.shutdown(wait=False, cancel_futures=True)
    pool.join(10)
    error = running.exception(timeout=0)  # settled by the time its thread ended
    assert isinstance(error, StorageError) and error.reason == "stopped"
    assert "the work it served having been abandoned" in str(error)
    assert time.monotonic() - calls[-1] < 5  # ended in its sleep, not after retrying on


def test_a_closed_prefetcher_ends_its_producers_retries() -> None:
    from zephon_torch.ops.prefetch import Prefetcher

    calls: list[float] = []

    def produce() -> Iterator[int]:
        yield 1
        _retrying_forever(calls)
        yield 2

    prefetcher = Prefetcher(produce, depth=1)
    assert next(prefetcher) == 1
    while len(calls) < 2:
        time.sleep(0.01)
    prefetcher.close()
    prefetcher._thread.join(10)
    assert not prefetcher._thread.is_alive()


def test_retries_outside_an_abandoned_scope_are_not_stopped_by_it() -> None:
    """The event holds on the thread within `abandoned_when` only, as a pool's or a
    prefetcher's threads run their work: another thread's reads retry on."""
    abandoned = threading.Event()
    abandoned.set()
    calls: list[int] = []
    flaky = _failing_twice(calls)

    policy = RetryPolicy(attempts=5, initial_delay=0.01, timeout=60)
    with abandoned_when(threading.Event()):  # a scope of its own, not set
        assert call_with_retry(flaky, url="s3://b/k", policy=policy) == "ok"
    calls.clear()
    with abandoned_when(abandoned), pytest.raises(StorageError, match="abandoned"):
        call_with_retry(flaky, url="s3://b/k", policy=policy)
    assert len(calls) == 1
    stop = threading.Event()  # with a prefetch's stop too: either ends the retries
    threading.Timer(0.2, stop.set).start()
    calls.clear()
    with abandoned_when(threading.Event()), pytest.raises(StorageError, match="another"):
        call_with_retry(flaky, url="s3://b/k", policy=RetryPolicy(initial_delay=30), stop=stop)
    assert len(calls) == 1
