"""Datasets on S3 (moto's standalone server on loopback) when something fails: a dead endpoint
raises a StorageError naming the URL after bounded retries instead of hanging, a failed download
stops the prefetches, a bad setting or denied access is a ConfigError at once, and a process
leaves without waiting for its queued prefetches."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from tests.helpers import prefetch_threads
from tests.hooked_proxy import hooked_proxy
from tests.object_stores import all_rows, dies_naming, s3_storage, write_corpus
from zephon_torch._moto import client, moto_server, upload
from zephon_torch.errors import ConfigError, StorageError
from zephon_torch.io import Dataset

boto3 = pytest.importorskip("boto3")
pytest.importorskip("s3fs")
pytest.importorskip("moto.server")

pytestmark = pytest.mark.usefixtures("private_cache")


def test_a_dead_endpoint_raises_a_storage_error_naming_the_url_in_bounded_time(
    s3_server: tuple[str, subprocess.Popen[bytes]], tmp_path: Path
) -> None:
    endpoint, server = s3_server
    write_corpus(tmp_path / "local", "parquet", shards=3)
    upload(endpoint, tmp_path / "local", "bucket", "dying")
    options = {
        "cache": {"dir": str(tmp_path / "cache")},
        "retry": {"attempts": 2, "initial_delay": 0.1, "timeout": 10},
    }
    remote = Dataset.from_path(
        "c", "s3://bucket/dying", storage_options=s3_storage(endpoint), io_options=options
    )
    dies_naming(remote, server, "s3://bucket/dying/part-001.parquet", bound=30)


def test_a_read_that_waited_on_a_failed_prefetch_raises_its_error_without_retrying_again(
    s3_server: tuple[str, Any], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The store down, a read waiting (on the object's lock) for a prefetch of its shard
    retried from scratch once the prefetch gave up: twice the requests of one read's retries.
    Counted, not timed (a bound on the time failed once under load)."""
    import s3fs

    monkeypatch.setattr(s3fs.S3FileSystem, "retries", 1)  # one request per attempt
    endpoint, _ = s3_server
    write_corpus(tmp_path / "local", "parquet", shards=3)
    upload(endpoint, tmp_path / "local", "bucket", "dead")
    down, gate = threading.Event(), threading.Event()
    asked: list[str] = []

    def store(method: str, path: str, headers: dict[str, str]) -> None:
        if down.is_set():
            gate.wait(30)  # the prefetch's first request waits until the read waits on it
            asked.append(os.path.basename(path.split("?", maxsplit=1)[0]))
            raise ConnectionResetError("the store is down")

    def dataset(proxy: str, cache: str) -> Dataset:
        options = {
            "cache": {"dir": str(tmp_path / cache)},
            "retry": {"attempts": 4, "initial_delay": 0.01, "max_delay": 0.01, "timeout": 60},
        }
        return Dataset.from_path(
            "c", "s3://bucket/dead", storage_options=s3_storage(proxy), io_options=options
        )

    with hooked_proxy(endpoint, store) as proxy:
        remote, alone = dataset(proxy, "cache"), dataset(proxy, "other_cache")
        down.set()
        remote.prefetch([1])
        locks = tmp_path / "cache" / ".name_locks"  # a name's lock file exists while it is held
        deadline = time.monotonic() + 10
        while not (locks.is_dir() and any(locks.iterdir())) and time.monotonic() < deadline:
            time.sleep(0.01)
        assert locks.is_dir() and any(locks.iterdir())
        threading.Timer(1.0, gate.set).start()  # the read below waits on the held lock by then
        with pytest.raises(StorageError) as caught:
            remote.read_rows(1, [0])
        assert caught.value.url == "s3://bucket/dead/part-001.parquet"
        with pytest.raises(StorageError):  # a read alone, for the requests of its retries
            alone.read_rows(2, [0])
    assert asked.count("part-002.parquet") >= 4
    assert asked.count("part-001.parquet") == asked.count("part-002.parquet")  # none again


def test_a_failed_download_stops_the_prefetches_until_a_download_succeeds(
    s3_server: tuple[str, Any], tmp_path: Path
) -> None:
    """Queued prefetches each retried a dead store for the policy's whole `timeout` after the
    read that failed on it had raised (minutes each with the defaults), holding their objects'
    locks: once a download fails past its retries, no other is tried until one succeeds."""
    endpoint, _ = s3_server
    before = prefetch_threads()
    write_corpus(tmp_path / "local", "parquet", shards=8)
    upload(endpoint, tmp_path / "local", "bucket", "breaker")
    down: list[bool] = []
    asked: list[str] = []

    def store(method: str, path: str, headers: dict[str, str]) -> None:
        asked.append(path.split("?", maxsplit=1)[0])
        if down:
            raise ConnectionResetError("the store is down")

    with hooked_proxy(endpoint, store) as proxy:
        remote = _retrying(proxy, "s3://bucket/breaker", tmp_path, threads=1, timeout=1)
        down.append(True)
        asked.clear()
        remote.prefetch(range(8))  # shard 0 downloading, the 7 others queued
        with pytest.raises(StorageError) as caught:
            remote.read_rows(0, [0])
        assert caught.value.url == "s3://bucket/breaker/part-000.parquet"
        deadline = time.monotonic() + 60
        while _prefetching(before) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not _prefetching(before)
        assert {os.path.basename(path) for path in asked} == {"part-000.parquet"}
        remote.prefetch(range(1, 8))  # nothing queued while no download has succeeded
        assert not _prefetching(before)

        down.clear()  # the store is back: the next download succeeds, prefetches go on
        assert remote.read_rows(1, [0])[0]["id"] == 50
        remote.prefetch(range(1, 4))
        while len(_cache_files(tmp_path / "cache")) < 3 and time.monotonic() < deadline:
            time.sleep(0.05)
        assert _cache_files(tmp_path / "cache") == {f"part-00{n}.parquet" for n in (1, 2, 3)}


def test_a_read_waiting_on_a_prefetch_stopped_by_another_failure_downloads_itself(
    s3_server: tuple[str, Any], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A prefetch stopped (not failed) because another download failed says nothing of its
    own object: the read that waited on it tries the store itself, for what was left of the
    prefetch's retry time."""
    import s3fs

    monkeypatch.setattr(s3fs.S3FileSystem, "retries", 1)  # one request per attempt
    endpoint, _ = s3_server
    before = prefetch_threads()
    write_corpus(tmp_path / "local", "parquet", shards=2)
    upload(endpoint, tmp_path / "local", "bucket", "stopped")
    armed, release = threading.Event(), threading.Event()
    held: list[str] = []

    def store(method: str, path: str, headers: dict[str, str]) -> tuple[int, bytes] | None:
        if not armed.is_set():
            return None
        if path.split("?", maxsplit=1)[0].endswith("part-000.parquet"):  # failed for good
            return (
                400,
                b"<Error><Code>InvalidRequest</Code><Message>no</Message><RequestId>1</RequestId></Error>",
            )
        if path.split("?", maxsplit=1)[0].endswith("part-001.parquet") and _prefetching_threads(
            before
        ):
            if not held:  # the prefetch's first request, held until the read waits on it
                held.append(path)
                release.wait(60)
            raise ConnectionResetError("fails while the prefetch runs")
        return None

    with hooked_proxy(endpoint, store) as proxy:
        remote = _retrying(proxy, "s3://bucket/stopped", tmp_path, threads=2, timeout=30)
        armed.set()
        remote.prefetch(range(2))
        deadline = time.monotonic() + 60
        while (not held or _prefetching_threads(before) > 1) and time.monotonic() < deadline:
            time.sleep(0.02)  # shard 0's prefetch failed; shard 1's holds its lock
        assert held and _prefetching_threads(before) == 1
        threading.Timer(0.5, release.set).start()  # once the read below waits on the lock
        assert remote.read_rows(1, [0])[0]["id"] == 50


def _retrying(proxy: str, url: str, tmp_path: Path, *, threads: int, timeout: float) -> Dataset:
    """`url` through `proxy`, on `threads` prefetch threads, retried every 50 ms up to
    `timeout` seconds."""
    options = {
        "cache": {"dir": str(tmp_path / "cache"), "prefetch_threads": threads},
        "retry": {"attempts": 1000, "initial_delay": 0.05, "max_delay": 0.05, "timeout": timeout},
    }
    return Dataset.from_path("c", url, storage_options=s3_storage(proxy), io_options=options)


def _prefetching_threads(before: set[threading.Thread]) -> int:
    """The prefetch threads alive now that were not ``before`` (the test's start): an earlier
    test's may still be retrying a store it stopped, in this process (a flake under load)."""
    return len(prefetch_threads() - before)


def _prefetching(before: set[threading.Thread]) -> bool:
    return _prefetching_threads(before) > 0


def _cache_files(folder: Path) -> set[str]:
    """The shards cached in `folder` (a cached file's name is a digest, a dash, the shard's)."""
    return {p.name.split("-", 1)[1] for p in folder.iterdir() if p.is_file() and p.name[0] != "."}


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"client_kwargs": {"endpoint_url": "not a url"}}, "ValueError: Invalid endpoint"),
        ({"bogus_option": 1}, "TypeError: .*bogus_option"),
        ("s3://nobucket/d/", "the bucket .nobucket. does not exist, or these credentials"),
    ],
    ids=["malformed-endpoint", "unknown-option", "missing-bucket"],
)
def test_a_bad_setting_is_a_config_error_naming_the_url_at_once(
    s3_server: tuple[str, subprocess.Popen[bytes]], tmp_path: Path, change: Any, message: str
) -> None:
    """A malformed endpoint was retried for 16 s as transient, then a StorageError; an unknown
    option and a missing bucket were bare TypeError and FileNotFoundError without the URL."""
    endpoint, _ = s3_server
    client(endpoint).create_bucket(Bucket="bkt")
    url = change if isinstance(change, str) else "s3://bkt/d/"
    storage = s3_storage(endpoint)
    if isinstance(change, dict):
        storage = {**storage, **change}
        if "client_kwargs" in change:
            storage["client_kwargs"] = {
                **s3_storage(endpoint)["client_kwargs"],
                **change["client_kwargs"],
            }
    start = time.monotonic()
    with pytest.raises(ConfigError, match=rf"cannot list '{url}'.*{message}"):
        Dataset.from_path("d", url, storage_options=storage)
    assert time.monotonic() - start < 5


def test_a_setting_of_the_wrong_type_that_fails_a_read_is_a_config_error_at_once(
    s3_server: tuple[str, subprocess.Popen[bytes]], tmp_path: Path
) -> None:
    """A setting the listing takes but a read trips on (s3fs's block size as text) was a bare
    TypeError out of the read; an AttributeError of a client's setting was retried
    for 16 s as if waiting could cure it."""
    endpoint, _ = s3_server
    write_corpus(tmp_path / "d", "parquet", shards=1)
    upload(endpoint, tmp_path / "d", "bkt", "d")
    storage = {**s3_storage(endpoint), "default_block_size": "64"}
    dataset = Dataset.from_path("d", "s3://bkt/d/", storage_options=storage)
    start = time.monotonic()
    with pytest.raises(ConfigError, match=r"of 's3://bkt/d/part-000.parquet' failed on a setting"):
        dataset.read_rows(0, [0])
    assert time.monotonic() - start < 5


def _users(endpoint: str, rights: dict[str, list[str]]) -> dict[str, dict[str, Any]]:
    """Storage options of a new IAM user per entry, allowed those S3 actions on everything."""
    iam = boto3.client(
        "iam", endpoint_url=endpoint, region_name="us-east-1",
        aws_access_key_id="x", aws_secret_access_key="x",
    )  # fmt: skip
    storage = {}
    for user, actions in rights.items():
        iam.create_user(UserName=user)
        key = iam.create_access_key(UserName=user)["AccessKey"]
        if actions:
            policy = {"Effect": "Allow", "Action": actions, "Resource": "*"}
            iam.put_user_policy(
                UserName=user,
                PolicyName="p",
                PolicyDocument=json.dumps({"Version": "2012-10-17", "Statement": [policy]}),
            )
        storage[user] = {
            **s3_storage(endpoint),
            "key": key["AccessKeyId"],
            "secret": key["SecretAccessKey"],
        }
    return storage


def test_denied_access_is_a_config_error_naming_the_url_at_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """S3's AccessDenied (a PermissionError from s3fs) came out bare, naming no URL. At once:
    no wait for a retry (counted, not timed: a loaded machine took 11 s to be refused)."""
    from zephon_torch.io import _retry

    retries: list[float] = []
    between_attempts = _retry._stopped

    def counted(stop: Any, abandoned: Any, delay: float) -> bool:
        retries.append(delay)
        return between_attempts(stop, abandoned, delay)

    monkeypatch.setattr(_retry, "_stopped", counted)
    write_corpus(tmp_path / "d", "jsonl", shards=1)
    # moto checks access after its first 8 calls: 3 uploading, 5 making the two users
    with moto_server(env={"INITIAL_NO_AUTH_ACTION_COUNT": "8"}) as (endpoint, _):
        upload(endpoint, tmp_path / "d", "bkt", "d")
        users = _users(endpoint, {"lister": ["s3:ListBucket"], "nobody": []})
        caught = {}
        for user, storage in users.items():
            with pytest.raises(ConfigError) as caught[user]:
                Dataset.from_path("d", "s3://bkt/d/", storage_options=storage)
            assert retries == [], user  # not retried
    assert "download of 's3://bkt/d/part-000.jsonl' was denied" in str(caught["lister"].value)
    assert "listing of 's3://bkt/d/' was denied" in str(caught["nobody"].value)


@pytest.mark.parametrize("kind", ["jsonl", "parquet"])
def test_one_object_reads_with_the_right_to_get_it_alone(tmp_path: Path, kind: str) -> None:
    """A URL naming one object was listed first, so a user who may get objects but not list
    the bucket was refused; its prefix still is (the files are not known without a list)."""
    write_corpus(tmp_path / "d", kind, shards=1)
    local = all_rows(Dataset.from_path("d", tmp_path / "d" / f"part-000.{kind}"))
    # moto checks access after its first 7 calls: 3 uploading, a marker, 3 making the user
    with moto_server(env={"INITIAL_NO_AUTH_ACTION_COUNT": "7"}) as (endpoint, _):
        upload(endpoint, tmp_path / "d", "bkt", "d")
        # an object bearing the folder's name (as an S3 console folder marker may)
        client(endpoint).put_object(Bucket="bkt", Key="d", Body=b"")
        getter = _users(endpoint, {"getter": ["s3:GetObject"]})["getter"]
        url = f"s3://bkt/d/part-000.{kind}"
        one = Dataset.from_path("d", url, storage_options=getter)
        assert all_rows(one) == local
        # a folder URL is a folder: it was opened as that object
        with pytest.raises(ConfigError, match="listing of 's3://bkt/d/' was denied"):
            Dataset.from_path("d", "s3://bkt/d/", storage_options=getter)


_QUEUE_AND_LEAVE = """
import json, os, signal, sys
from zephon_torch.io import Dataset
retry = {"attempts": 6, "initial_delay": 1.0, "timeout": 600}
dataset = Dataset.from_path(
    "d", sys.argv[1], storage_options=json.loads(sys.argv[2]),
    io_options={"cache": {"prefetch_threads": 1}, "retry": retry},
)
dataset.read_rows(0, [0])
dataset.prefetch(range(len(dataset.shards)))  # as a lane's reader does
os.kill(int(sys.argv[3]), signal.SIGSTOP)  # the store stops answering
print("queued", flush=True)
"""


def test_a_process_exits_without_waiting_for_its_queued_prefetches(
    tmp_path: Path, s3_server: tuple[str, subprocess.Popen[bytes]]
) -> None:
    """Prefetches ran on a ThreadPoolExecutor, whose threads the interpreter joins at exit after
    every queued job: a run that stopped early (or failed) with the store gone waited for each
    queued download's retries, minutes here (7 shards, about 35 s each)."""
    endpoint, server = s3_server
    write_corpus(tmp_path / "data", "parquet", shards=8)
    upload(endpoint, tmp_path / "data", "bucket", "data")
    command = [
        sys.executable,
        "-c",
        _QUEUE_AND_LEAVE,
        "s3://bucket/data",
        json.dumps(s3_storage(endpoint)),
        str(server.pid),
    ]
    try:
        done = subprocess.run(command, capture_output=True, text=True, timeout=90, check=False)
    finally:
        os.kill(server.pid, signal.SIGCONT)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "queued"
