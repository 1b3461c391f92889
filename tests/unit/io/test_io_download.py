"""What a failed read of a listed object is taken for (`read_listed`), and downloads that
stall (`_stall`)."""

from __future__ import annotations

import email.utils
import errno
import http.server
import io
import json
import shutil
import threading
import time
import traceback
import types
from pathlib import Path
from typing import Any

import fsspec
import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from tests.loopback import serve_in_thread
from zephon_torch.errors import ConfigError, DataError, StorageError
from zephon_torch.io import Dataset, _stall
from zephon_torch.io._download import read_listed
from zephon_torch.io._retry import RetryPolicy
from zephon_torch.io._s3_answers import answered_listed
from zephon_torch.io._shard_cache import CachedObject
from zephon_torch.io._stall import Pace, Stalled, cat_range
from zephon_torch.io._versions import identity


def _store() -> tuple[fsspec.AbstractFileSystem, CachedObject]:
    fs = fsspec.filesystem("memory")
    fs.pipe("/bucket/part-0.jsonl", b'{"text": "a"}\n')
    return fs, CachedObject(url="memory://bucket/part-0.jsonl", size=14, version="")


def _not_found() -> bytes:  # what a gateway that lists but serves no downloads answers
    raise FileNotFoundError(2, "Not Found", "https://gateway/download/bucket/part-0.jsonl")


def _read(folder: Path) -> bytes:
    fs, item = _store()
    return read_listed(
        _not_found,
        fs,
        "/bucket/part-0.jsonl",
        item,
        dataset="d",
        retry=RetryPolicy(attempts=1),
        what="downloading",
        folder=str(folder),
    )


def test_not_found_for_a_listed_object_is_the_store_s_not_the_cache_folder_s(
    tmp_path: Path,
) -> None:
    """It was taken for the cache folder deleted under the download, and the run ended in
    a CacheFolderError telling the user to move the cache away from a cleaner."""
    with pytest.raises(StorageError, match="answered 'not found' for an object it lists"):
        _read(tmp_path)
    shutil.rmtree(tmp_path)  # the folder gone under the download: left to the cache to tell
    with pytest.raises(FileNotFoundError):
        _read(tmp_path)


@pytest.mark.parametrize("signed", [False, True])
def test_a_refusal_in_a_client_s_own_error_type_is_a_storage_error_or_a_change(
    tmp_path: Path, signed: bool
) -> None:
    """gcsfs raises a 409 or a 416 (a range past a shrunk end) as its own HttpError, not an
    OSError: it escaped unwrapped, naming no URL, dataset or shard. Where its text quotes a
    credential (a signed URL), the error's cause is left out, and the change went unseen."""
    http_error = pytest.importorskip("gcsfs.retry").HttpError
    fs, item = _store()
    where = " for https://h/part-0.jsonl?sig=s3cret" if signed else ""

    def refused() -> bytes:
        raise http_error({"code": 416, "message": f"Requested range not satisfiable{where}"})

    def read() -> bytes:
        policy = RetryPolicy(attempts=3, initial_delay=0)
        return read_listed(
            refused, fs, "/bucket/part-0.jsonl", item, dataset="d", retry=policy, what="reading"
        )

    with pytest.raises(
        StorageError, match=r"reading was refused by the store \(not retried\)"
    ) as caught:
        read()
    assert caught.value.url == item.url
    assert isinstance(caught.value.__cause__, http_error) != signed
    fs.pipe("/bucket/part-0.jsonl", b"{}\n")  # shrunk since the listing
    with pytest.raises(DataError, match="changed since it was listed") as changed:
        read()
    assert (changed.value.dataset, changed.value.shard) == ("d", item.url)


def test_a_gcs_object_s_version_is_its_generation_not_its_metadata_s_etag() -> None:
    """GCS's JSON API changes an object's `etag` with its metadata (an ACL, a label) too: read
    as the version, a relabelled shard looked rewritten mid-run, a DataError 'changed since it
    was listed'. Its `generation` changes with its data only (fields as gcsfs lists them)."""
    url = "gs://bucket/c/part-0.parquet"
    listed = {
        "size": 5,
        "generation": "1796249439724963390",
        "metageneration": "1",
        "etag": "CL6K8Y7l2pEDEAE=",
        "md5Hash": "XUFAKrxLKna5cZ2REBfFkg==",
        "updated": "2026-12-02T22:10:39.724968Z",
    }
    labelled = {
        **listed,
        "metageneration": "2",
        "etag": "CL6K8Y7l2pEDEAI=",
        "updated": "2026-12-03T08:00:00Z",
    }
    rewritten = {**listed, "generation": "1796249439724963391", "etag": "CL+K8Y7l2pEDEAE="}
    assert identity(url, labelled) == identity(url, listed)
    assert identity(url, rewritten) != identity(url, listed)
    s3 = {"size": 5, "ETag": '"5d41402abc4b2a76b9719d911017c592"', "LastModified": "x"}
    assert identity("s3://b/k", s3).version == s3["ETag"]  # elsewhere as before


@pytest.mark.parametrize("refused", [True, False])
def test_a_failed_read_whose_change_check_fails_too_raises_the_read_s_error(
    monkeypatch: pytest.MonkeyPatch, refused: bool
) -> None:
    """The check of whether the object changed, made after a read failed for good, raised
    its own error in place of the read's: a listing refused, or a bare OSError (s3fs's
    'Bad Request' for a HEAD answered 400) that escaped unwrapped from a prefetch."""
    http_error = pytest.importorskip("gcsfs.retry").HttpError
    fs, item = _store()

    def gone() -> Any:
        raise http_error({"code": 410, "message": "Gone"})

    def bad() -> Any:  # as s3fs raises a 400: an OSError caused by botocore's error
        error = OSError(errno.EINVAL, "Bad Request")
        error.response = type("Response", (), {"status_code": 400})()  # type: ignore[attr-defined]
        raise error

    monkeypatch.setattr(fs, "info", lambda *args, **kwargs: bad())  # fsspec's shared one
    monkeypatch.setattr(fs, "find", lambda *args, **kwargs: gone() if refused else bad())
    said = "was refused" if refused else "failed, and not in a way worth retrying"
    with pytest.raises(StorageError, match=f"^memory://bucket/part-0.jsonl: reading {said}"):
        read_listed(
            gone if refused else bad,
            fs,
            "/bucket/part-0.jsonl",
            item,
            dataset="d",
            retry=RetryPolicy(attempts=1),
            what="reading",
        )


def test_the_download_cap_stops_past_the_listed_size_and_counts_a_restarted_transfer_anew() -> None:
    """gcsfs restarts a transfer cut mid-stream within one call, on the same callback, from
    its first byte: counted on, its bytes passed the listed size and a good download stopped."""
    from zephon_torch.io._download import _Capped, _PastListedSize

    capped = _Capped(100, None, Pace(0, 30, 100))
    capped.set_size(100)
    capped.relative_update(60)
    capped.set_size(100)  # the transfer starts again
    capped.relative_update(100)
    with pytest.raises(_PastListedSize):
        capped.relative_update(1)


_BODY = b'{"text": "a row"}\n' * 8000  # 144,000 bytes
# a fixed version, a minute old: one computed per answer had moved on by a second between
# the listing and the download on a loaded machine, a change that is a DataError
_MODIFIED = email.utils.formatdate(time.time() - 60, usegmt=True)


class _Slow(http.server.BaseHTTPRequestHandler):
    """Serves `body` (`_BODY`) at any path: HEAD at once, GET `trickle` bytes every 10 ms (none
    at all where `trickle` is 0), until the client leaves or `done` is set."""

    body = _BODY
    trickle = 0
    done = threading.Event()

    def _head(self) -> None:
        self.send_response(200)
        self.send_header("Content-Length", str(len(self.body)))
        self.send_header("Content-Type", "application/octet-stream")  # not a page of links
        self.send_header("Last-Modified", _MODIFIED)
        self.end_headers()

    def do_HEAD(self) -> None:
        self._head()

    def do_GET(self) -> None:
        self._head()
        sent = 0
        try:
            while not self.done.wait(0.01) and sent < len(self.body):
                if self.trickle:
                    self.wfile.write(self.body[sent : sent + self.trickle])
                    self.wfile.flush()
                    sent += self.trickle
        except OSError:  # the client gave up: what a cut-short download does
            pass

    def log_message(self, *args: Any) -> None:
        pass


@pytest.mark.parametrize("trickle", [0, 20])
def test_a_download_that_stalls_or_trickles_is_cut_short_then_a_storage_error(
    tmp_path: Path, trickle: int
) -> None:
    """A server that sends nothing after its headers held a download for the client's own
    timeouts (aiohttp's: 5 minutes), and one that trickles bytes held it for ever, since
    no socket timeout fires while bytes come (a review). A download now has to average
    `min_rate` over each `rate_window`, else the attempt is retried, then a StorageError."""
    retry = {"attempts": 2, "initial_delay": 0.01, "min_rate": 10_000, "rate_window": 0.5}
    options = {"cache": {"dir": str(tmp_path / "cache")}, "retry": retry}
    handler = type("Handler", (_Slow,), {"trickle": trickle, "done": threading.Event()})
    with serve_in_thread(handler) as base:
        started = time.monotonic()
        try:
            with pytest.raises(StorageError, match=r"after 2 attempt.*stalled: \d+ bytes") as e:
                Dataset.from_path("slow", f"{base}/a.jsonl", io_options=options)
        finally:
            handler.done.set()
    assert time.monotonic() - started < 20  # a loaded machine is slow to start answers
    assert e.value.url == f"{base}/a.jsonl"
    assert "Stalled" in "".join(traceback.format_exception(e.value))
    # the same server sending at speed, under the same floor, serves the rows (a longer
    # window: a loaded machine may take a while to start the answer)
    handler = type("Handler", (_Slow,), {"trickle": 16_000, "done": threading.Event()})
    options["retry"] = {**retry, "rate_window": 5}
    with serve_in_thread(handler) as base:
        dataset = Dataset.from_path("fast", f"{base}/a.jsonl", io_options=options)
        assert dataset.num_rows == 8000
        assert dataset.read_rows(0, [7999]) == [{"text": "a row"}]


def _npy_tokens() -> bytes:
    buffer = io.BytesIO()
    np.save(buffer, np.arange(4000, dtype=np.int32).reshape(2, 2000))
    return buffer.getvalue()


def _parquet() -> bytes:
    buffer = io.BytesIO()
    pq.write_table(pa.table({"text": [f"row {i}" for i in range(2000)]}), buffer)
    return buffer.getvalue()


@pytest.mark.parametrize("name, body", [("a.npy", _npy_tokens), ("a.parquet", _parquet)])
def test_a_footer_or_header_read_that_stalls_is_cut_short_then_a_storage_error(
    tmp_path: Path, name: str, body: Any
) -> None:
    """A Parquet footer and a `.npy` header are range reads, not downloads: a server that
    answered and then sent nothing held the open for the client's own timeouts (aiohttp's: 5
    minutes), one that trickled, for ever. They now end by the deadline the floor gives their
    bytes; the same server at speed opens them."""
    data = body()
    options = _opening_stalls(tmp_path, name, data)
    fast = {"body": data, "trickle": 1 << 20, "done": threading.Event()}
    with serve_in_thread(type("Handler", (_Slow,), fast)) as base:
        dataset = Dataset.from_path("fast", f"{base}/{name}", io_options=options)
        assert dataset.num_rows == (2 if name == "a.npy" else 2000)


def _opening_stalls(tmp_path: Path, name: str, body: bytes) -> dict[str, Any]:
    """Opens `name` from a server that answers every GET and then sends nothing: a
    StorageError naming the stalled read within 20 s. Returns the options it used."""
    retry = {"attempts": 2, "initial_delay": 0.01, "min_rate": 1_000_000, "rate_window": 0.5}
    options = {"cache": {"dir": str(tmp_path / "cache")}, "retry": retry}
    handler = type("Handler", (_Slow,), {"body": body, "done": threading.Event()})
    with serve_in_thread(handler) as base:
        started = time.monotonic()
        try:
            with pytest.raises(StorageError, match=r"after 2 attempt.*read stalled: not done"):
                Dataset.from_path("slow", f"{base}/{name}", io_options=options)
        finally:
            handler.done.set()
    assert time.monotonic() - started < 20
    return options


def _big_npy() -> bytes:
    buffer = io.BytesIO()
    np.save(buffer, np.random.default_rng(0).integers(0, 2**31, (2, 150_000), dtype=np.int32))
    return buffer.getvalue()


def _big_parquet() -> bytes:
    rng = np.random.default_rng(0)
    texts = [rng.bytes(24).hex() for _ in range(25_000)]
    buffer = io.BytesIO()
    pq.write_table(pa.table({"text": texts}), buffer, compression="none")
    return buffer.getvalue()


@pytest.mark.parametrize("name, body", [("a.npy", _big_npy), ("a.parquet", _big_parquet)])
def test_a_server_that_ignores_ranges_opens_under_the_floor(
    tmp_path: Path, name: str, body: Any
) -> None:
    """A server that ignores `Range` sends the whole object for a header's or a footer's read.
    Read with the deadline of the range's bytes alone, an object that takes longer to come
    than that failed its open on every attempt (a review: 20 MB at 4 MB/s); the header is
    now read from such an answer up to its own bytes, and a footer's read is given the
    object's."""
    data = body()
    assert len(data) > 1_000_000
    retry = {"attempts": 2, "initial_delay": 0.01, "min_rate": 100_000, "rate_window": 0.5}
    options = {"cache": {"dir": str(tmp_path / "cache")}, "retry": retry}
    # at most 0.5 MB/s, past the floor: the whole object takes over 2 s, a header's deadline
    # is 0.6 s and a footer's under 1.2 s (judged every half second)
    handler = type("Handler", (_Slow,), {"body": data, "trickle": 5_000, "done": threading.Event()})
    with serve_in_thread(handler) as base:
        try:
            dataset = Dataset.from_path("ranges", f"{base}/{name}", io_options=options)
            assert dataset.num_rows == (2 if name == "a.npy" else 25_000)
        finally:
            handler.done.set()


def test_an_empty_range_is_read_as_nothing_without_asking_the_store() -> None:
    """A 0-byte `.npy` asked Azure for an empty range, which it refuses: a StorageError after
    the retries, where every other store gave the DataError of a file too short (a review)."""
    fs = fsspec.filesystem("memory")
    retry = RetryPolicy(attempts=1)
    assert cat_range(fs, "/no/such/object.npy", 0, 0, retry, listed=0) == b""


def test_an_index_read_that_stalls_is_cut_short_then_a_storage_error(tmp_path: Path) -> None:
    """An MDS or LitData `index.json` is read whole at the open: a server that answered and
    then sent nothing held it for the client's own timeouts. Its listed size now gives it a
    deadline as a footer's bytes do."""
    _opening_stalls(tmp_path, "index.json", json.dumps({"version": 2, "shards": []}).encode())


def test_the_rate_floor_is_judged_over_each_window_and_by_a_deadline_of_the_size(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Not before the client has an answer: a request waiting for one of the pool's
    connections, held by another download's parts, had been cut as a stall (a review). A
    client that sets the size before each part's count (adlfs) is judged all the same. The
    clock is the test's own: slept through, a loaded machine's late wake-up stretched a
    window past what its bytes were due for (a stall where none was meant)."""
    now = [0.0]
    monkeypatch.setattr(_stall, "time", types.SimpleNamespace(monotonic=lambda: now[0]))

    def wait(seconds: float) -> None:
        now[0] += seconds

    pace = Pace(100, 0.05, 10)  # 100 bytes/s; a deadline of 0.05 + 10 / 100 s
    wait(0.06)
    pace.check(0)  # no answer yet: left to the deadline
    pace.begin()  # the answer came: from now on
    pace.check(0)  # within the first window: nothing to judge
    wait(0.06)
    pace.check(10)  # 10 bytes where 6 were due
    pace.begin()  # the size again (adlfs, each part): no new window
    wait(0.06)
    with pytest.raises(Stalled, match="2 bytes came in the last"):
        pace.check(12)
    pace.check(0)  # from byte 0 again (a restart): not a negative count, nor a stall
    wait(0.06)
    pace.check(20)
    late = Pace(100, 0.05, 10)
    wait(0.06)
    late.check(5)  # the first bytes, with no size reported: the window starts
    wait(0.06)
    with pytest.raises(Stalled, match="1 bytes came"):
        late.check(6)
    timed = Pace(100, 0.05, 10)
    assert not timed.overdue()
    wait(0.2)
    assert timed.overdue()
    with pytest.raises(Stalled, match=r"20 bytes came in 0\.\d s, past the 0\.\d s its size"):
        timed.raise_overdue(20)
    never = Pace(0, 0.05, 10)
    wait(0.06)
    never.check(0)  # a `min_rate` of 0: never a stall
    assert not never.overdue()
    with pytest.raises(ConfigError, match="`rate_window` must be more than 0"):
        RetryPolicy(rate_window=0)


def test_an_etag_listed_bare_is_the_same_as_the_one_given_quoted() -> None:
    """adlfs 2023.8 and 2024.12 list an Azure blob's ETag bare and give it quoted through
    `info`: every az:// download was "changed since it was listed". Another tag still is."""
    from zephon_torch.io._download import _same
    from zephon_torch.io._shard_cache import CachedObject

    listed = CachedObject(url="az://b/part-0.jsonl", size=10, version="0x8DC1")
    assert _same(listed, {"size": 10, "etag": '"0x8DC1"'})
    assert _same(
        CachedObject(url="s3://b/k", size=10, version='"abc"'), {"size": 10, "ETag": "abc"}
    )
    assert not _same(listed, {"size": 10, "etag": '"0x8DC2"'})
    assert not _same(listed, {"size": 11, "etag": '"0x8DC1"'})


@pytest.mark.parametrize(
    ("answers", "listed", "proof"),
    [
        (['"abc"'], '"abc"', True),
        (["abc", '"abc"'], '"abc"', True),  # parts of one download, quoted or bare
        (['"abc"', '"def"'], '"abc"', False),  # one part from a rewrite
        ([], '"abc"', False),  # nothing recorded: the store is asked
        ([""], "", False),  # no version listed
        ([""], '"abc"', False),
    ],
)
def test_a_download_proves_the_listed_version_only_where_every_get_named_it(
    answers: list[str], listed: str, proof: bool
) -> None:
    """Where it does, `fetch` asks the store nothing after the download."""
    assert answered_listed(answers, listed) is proof
