"""Datasets on S3, served by moto's standalone server on loopback: same rows in every format
(MDS, LitData and `.npy` written by their real writers), bounded cache, prefetch of `.npy`
offsets, errors naming the URL, and a dead endpoint that fails with a StorageError after
bounded retries instead of hanging."""

from __future__ import annotations

import json
import os
import pickle
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from tests.helpers import prefetch_threads
from tests.hooked_proxy import hooked_proxy
from tests.unit.io.test_io_formats_writers import plain, sample_rows, write_litdata, write_mds
from zephon_torch._moto import client, moto_server, upload
from zephon_torch.errors import ConfigError, DataError, StorageError
from zephon_torch.io import Dataset

boto3 = pytest.importorskip("boto3")
pytest.importorskip("s3fs")
pytest.importorskip("moto.server")


@pytest.fixture(autouse=True)
def _private_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Keeps the default shard cache and index folder (remembered row counts) per test."""
    monkeypatch.setenv("ZEPHON_TORCH_CACHE", str(tmp_path / "_cache"))


@pytest.fixture
def s3_server() -> Iterator[tuple[str, subprocess.Popen[bytes]]]:
    with moto_server() as running:
        yield running


def _storage(endpoint: str) -> dict[str, Any]:
    return {
        "key": "x",
        "secret": "x",
        "client_kwargs": {"endpoint_url": endpoint, "region_name": "us-east-1"},
        "config_kwargs": {
            "retries": {"max_attempts": 1},
            "connect_timeout": 1,
            "read_timeout": 2,
        },
        "skip_instance_cache": True,
    }


def _write_corpus(folder: Path, kind: str, shards: int = 4, rows: int = 50) -> None:
    folder.mkdir()
    for shard in range(shards):
        docs = [
            {"text": f"shard {shard} doc {i} " * 8, "id": shard * rows + i} for i in range(rows)
        ]
        if kind == "jsonl":
            lines = "".join(json.dumps(doc) + "\n" for doc in docs)
            (folder / f"part-{shard:03d}.jsonl").write_text(lines)
        elif kind == "vortex":
            from tests.unit.io.test_io_formats_writers import write_vortex

            write_vortex(folder / f"part-{shard:03d}.vortex", pa.Table.from_pylist(docs))
        else:
            pq.write_table(pa.Table.from_pylist(docs), folder / f"part-{shard:03d}.parquet")


def _all_rows(dataset: Dataset) -> list[list[dict[str, Any]]]:
    return [
        dataset.read_rows(number, list(range(shard.num_rows)))
        for number, shard in enumerate(dataset.shards)
    ]


def _cache_bytes(folder: Path) -> int:
    return sum(p.stat().st_size for p in folder.iterdir() if p.is_file() and p.name[0] != ".")


@pytest.mark.parametrize("kind", ["jsonl", "parquet", "vortex"])
def test_an_s3_prefix_reads_the_same_rows_as_the_local_copy(
    s3_server: tuple[str, Any], tmp_path: Path, kind: str
) -> None:
    endpoint, _ = s3_server
    _write_corpus(tmp_path / "local", kind)
    upload(endpoint, tmp_path / "local", "bucket", "corpus")
    options = {"cache": {"dir": str(tmp_path / "cache")}}
    remote = Dataset.from_path(
        "c", "s3://bucket/corpus/", storage_options=_storage(endpoint), io_options=options
    )
    local = Dataset.from_path("c", tmp_path / "local", index_cache_dir=str(tmp_path / "idx"))
    assert remote.format == kind
    assert remote.shards[0].path == f"s3://bucket/corpus/part-000.{kind}"
    assert remote.fingerprint() == local.fingerprint()
    assert _all_rows(remote) == _all_rows(local)


def test_an_s3_object_that_is_not_parquet_is_the_local_data_error(
    s3_server: tuple[str, Any], tmp_path: Path
) -> None:
    """A `.parquet` object that is not Parquet was refused in words of its own ('the file does
    not end in the Parquet magic bytes') where the local copy gave pyarrow's."""
    endpoint, _ = s3_server
    (tmp_path / "local").mkdir()
    (tmp_path / "local" / "part-0.parquet").write_bytes(b"not parquet at all\n" * 50)
    upload(endpoint, tmp_path / "local", "bucket", "odd")
    errors = []
    for where, options in (
        ("s3://bucket/odd/part-0.parquet", _storage(endpoint)),
        (str(tmp_path / "local" / "part-0.parquet"), None),
    ):
        with pytest.raises(DataError) as raised:
            Dataset.from_path("odd", where, storage_options=options)
        errors.append(str(raised.value).replace(where, "SHARD"))
    assert errors[0] == errors[1]
    assert "shard 'SHARD': not a readable Parquet file: Parquet magic bytes not found" in errors[0]


def test_a_cache_smaller_than_the_dataset_never_exceeds_its_limit(
    s3_server: tuple[str, Any], tmp_path: Path
) -> None:
    endpoint, _ = s3_server
    _write_corpus(tmp_path / "local", "jsonl", shards=6)
    upload(endpoint, tmp_path / "local", "bucket", "small")
    shard_size = max(f.stat().st_size for f in (tmp_path / "local").iterdir())
    limit = 2 * shard_size + 10
    cache = tmp_path / "cache"
    options = {"cache": {"dir": str(cache), "max_bytes": limit}}
    remote = Dataset.from_path(
        "c", "s3://bucket/small", storage_options=_storage(endpoint), io_options=options
    )
    local = Dataset.from_path("c", tmp_path / "local", index_cache_dir=str(tmp_path / "idx"))
    assert _cache_bytes(cache) <= limit
    for number, shard in enumerate(remote.shards):
        rows = list(range(shard.num_rows))
        assert remote.read_rows(number, rows) == local.read_rows(number, rows)
        assert _cache_bytes(cache) <= limit


def test_a_dead_endpoint_raises_a_storage_error_naming_the_url_in_bounded_time(
    s3_server: tuple[str, subprocess.Popen[bytes]], tmp_path: Path
) -> None:
    endpoint, server = s3_server
    _write_corpus(tmp_path / "local", "parquet", shards=3)
    upload(endpoint, tmp_path / "local", "bucket", "dying")
    options = {
        "cache": {"dir": str(tmp_path / "cache")},
        "retry": {"attempts": 2, "initial_delay": 0.1, "timeout": 10},
    }
    remote = Dataset.from_path(
        "c", "s3://bucket/dying", storage_options=_storage(endpoint), io_options=options
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
    _write_corpus(tmp_path / "local", "parquet", shards=3)
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
            "c", "s3://bucket/dead", storage_options=_storage(proxy), io_options=options
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
    _write_corpus(tmp_path / "local", "parquet", shards=8)
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
    _write_corpus(tmp_path / "local", "parquet", shards=2)
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
    return Dataset.from_path("c", url, storage_options=_storage(proxy), io_options=options)


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
    storage = _storage(endpoint)
    if isinstance(change, dict):
        storage = {**storage, **change}
        if "client_kwargs" in change:
            storage["client_kwargs"] = {
                **_storage(endpoint)["client_kwargs"],
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
    _write_corpus(tmp_path / "d", "parquet", shards=1)
    upload(endpoint, tmp_path / "d", "bkt", "d")
    storage = {**_storage(endpoint), "default_block_size": "64"}
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
            **_storage(endpoint),
            "key": key["AccessKeyId"],
            "secret": key["SecretAccessKey"],
        }
    return storage


def test_denied_access_is_a_config_error_naming_the_url_at_once(tmp_path: Path) -> None:
    """S3's AccessDenied (a PermissionError from s3fs) came out bare, naming no URL."""
    _write_corpus(tmp_path / "d", "jsonl", shards=1)
    # moto checks access after its first 8 calls: 3 uploading, 5 making the two users
    with moto_server(env={"INITIAL_NO_AUTH_ACTION_COUNT": "8"}) as (endpoint, _):
        upload(endpoint, tmp_path / "d", "bkt", "d")
        users = _users(endpoint, {"lister": ["s3:ListBucket"], "nobody": []})
        caught = {}
        for user, storage in users.items():
            start = time.monotonic()
            with pytest.raises(ConfigError) as caught[user]:
                Dataset.from_path("d", "s3://bkt/d/", storage_options=storage)
            assert time.monotonic() - start < 5  # not retried
    assert "download of 's3://bkt/d/part-000.jsonl' was denied" in str(caught["lister"].value)
    assert "listing of 's3://bkt/d/' was denied" in str(caught["nobody"].value)


@pytest.mark.parametrize("kind", ["jsonl", "parquet"])
def test_one_object_reads_with_the_right_to_get_it_alone(tmp_path: Path, kind: str) -> None:
    """A URL naming one object was listed first, so a user who may get objects but not list
    the bucket was refused; its prefix still is (the files are not known without a list)."""
    _write_corpus(tmp_path / "d", kind, shards=1)
    local = _all_rows(Dataset.from_path("d", tmp_path / "d" / f"part-000.{kind}"))
    # moto checks access after its first 7 calls: 3 uploading, a marker, 3 making the user
    with moto_server(env={"INITIAL_NO_AUTH_ACTION_COUNT": "7"}) as (endpoint, _):
        upload(endpoint, tmp_path / "d", "bkt", "d")
        # an object bearing the folder's name (as an S3 console folder marker may)
        client(endpoint).put_object(Bucket="bkt", Key="d", Body=b"")
        getter = _users(endpoint, {"getter": ["s3:GetObject"]})["getter"]
        url = f"s3://bkt/d/part-000.{kind}"
        one = Dataset.from_path("d", url, storage_options=getter)
        assert _all_rows(one) == local
        # a folder URL is a folder: it was opened as that object
        with pytest.raises(ConfigError, match="listing of 's3://bkt/d/' was denied"):
            Dataset.from_path("d", "s3://bkt/d/", storage_options=getter)


def dies_naming(
    remote: Dataset, server: subprocess.Popen[bytes], url: str, *, bound: float
) -> None:
    """Shard 0 read, the server killed: reading shard 1 raises a StorageError naming `url`
    within `bound` seconds, and shard 0, cached, still reads."""
    assert remote.read_rows(0, [0])[0]["id"] == 0
    server.kill()
    server.wait(10)
    start = time.monotonic()
    with pytest.raises(StorageError) as caught:
        remote.read_rows(1, [0])
    assert time.monotonic() - start < bound
    assert caught.value.url == url
    assert remote.read_rows(0, [1])[0]["id"] == 1


def test_a_pipeline_over_s3_gives_the_batches_of_the_local_copy_and_prefetches(
    s3_server: tuple[str, Any], tmp_path: Path, tokenizer: Any
) -> None:
    from tests.helpers import keys
    from zephon_torch import Pipeline
    from zephon_torch.work import StaticMixtureWorkSource, TokenEstimation

    endpoint, _ = s3_server
    _write_corpus(tmp_path / "local", "jsonl", shards=6, rows=30)
    upload(endpoint, tmp_path / "local", "bucket", "corpus")
    cache = tmp_path / "cache"
    remote = Dataset.from_path(
        "c",
        "s3://bucket/corpus/",
        storage_options=_storage(endpoint),
        io_options={"cache": {"dir": str(cache)}},
    )
    local = Dataset.from_path("c", tmp_path / "local", index_cache_dir=str(tmp_path / "idx"))

    def build(dataset: Dataset) -> Pipeline:
        source = StaticMixtureWorkSource(
            [dataset], seed=4, token_estimation=TokenEstimation(), shuffle_window_shards=2
        )
        return (
            Pipeline(source)
            .options(canonical_replicas=2)
            .tokenize(tokenizer=tokenizer)
            .pack_flat(64)
            .batch(2)
        )

    over_s3 = build(remote)
    assert keys(over_s3) == keys(build(local))
    cache_stats = over_s3.stats()["cache"]
    assert cache_stats["misses"] == 6 and cache_stats["bytes_downloaded"] > 0
    assert cache_stats["hits"] > 0 and 0 < cache_stats["hit_rate"] < 1
    assert build(local).stats()["cache"] is None
    cached = [p for p in cache.rglob("*.jsonl")]
    assert len(cached) == 6


MDS_COLUMNS = {"text": "str", "id": "int", "tokens": "ndarray:int32"}


def _write_format(folder: Path, kind: str, rows: int = 120) -> Path:
    """Writes `rows` rows, several shards, with the format's real writer."""
    data = sample_rows(rows)
    if kind in ("mds", "mds-zstd"):
        compression = "zstd" if kind == "mds-zstd" else None
        return write_mds(folder, data, MDS_COLUMNS, compression=compression, size_limit=1 << 11)
    if kind == "litdata":
        return write_litdata(folder, data, chunk_bytes=1 << 11)
    folder.mkdir()  # npy: two 1-D token files with offsets, and one 2-D file
    arrays = [row["tokens"] for row in data]
    for number, part in enumerate((arrays[: rows // 3], arrays[rows // 3 : 2 * rows // 3])):
        np.save(folder / f"{number}.npy", np.concatenate(part))
        np.save(folder / f"{number}.offsets.npy", np.cumsum([0] + [len(a) for a in part]))
    np.save(folder / "2.npy", np.arange(rows // 3 * 5, dtype=np.uint16).reshape(-1, 5))
    return folder


def _open_both(endpoint: str, tmp_path: Path, kind: str) -> tuple[Dataset, Dataset]:
    local = _write_format(tmp_path / kind, kind)
    upload(endpoint, local, "bucket", kind)
    options = {"cache": {"dir": str(tmp_path / "cache")}}
    remote = Dataset.from_path(
        kind, f"s3://bucket/{kind}", storage_options=_storage(endpoint), io_options=options
    )
    return remote, Dataset.from_path(kind, local)


def _plain_rows(dataset: Dataset) -> list[list[dict[str, Any]]]:
    return [[plain(row) for row in shard] for shard in _all_rows(dataset)]


@pytest.mark.parametrize("kind", ["mds", "mds-zstd", "litdata", "npy"])
def test_mds_litdata_and_npy_on_s3_read_the_same_rows_as_the_local_copy(
    s3_server: tuple[str, Any], tmp_path: Path, kind: str
) -> None:
    endpoint, _ = s3_server
    remote, local = _open_both(endpoint, tmp_path, kind)
    assert remote.format == local.format == kind.split("-", maxsplit=1)[0]
    assert len(remote.shards) > 1
    assert all(shard.path.startswith(f"s3://bucket/{kind}/") for shard in remote.shards)
    assert remote.fingerprint() == local.fingerprint()
    assert _plain_rows(remote) == _plain_rows(local)
    copy = pickle.loads(pickle.dumps(remote))  # as a DataLoader worker gets it
    assert [plain(row) for row in copy.read_rows(1, [2, 0])] == [
        plain(row) for row in local.read_rows(1, [2, 0])
    ]


def test_a_pipeline_over_npy_tokens_on_s3_gives_the_batches_of_the_local_copy(
    s3_server: tuple[str, Any], tmp_path: Path
) -> None:
    from tests.helpers import keys
    from zephon_torch import Pipeline
    from zephon_torch.work import StaticMixtureWorkSource, TokenEstimation

    endpoint, _ = s3_server
    remote, local = _open_both(endpoint, tmp_path, "npy")

    def build(dataset: Dataset) -> Pipeline:
        source = StaticMixtureWorkSource(
            [dataset], seed=3, token_estimation=TokenEstimation(), shuffle_window_shards=2
        )
        pipeline = Pipeline(source).options(canonical_replicas=2)
        return pipeline.pretokenized("input_ids", eos_token_id=0).pack_flat(16).batch(2)

    over_s3 = build(remote)
    assert keys(over_s3) == keys(build(local))
    assert over_s3.stats()["cache"]["misses"] == 5  # three token files, two offsets files


def test_an_index_listing_a_shard_the_bucket_lacks_is_a_data_error_naming_it(
    s3_server: tuple[str, Any], tmp_path: Path
) -> None:
    endpoint, _ = s3_server
    local = _write_format(tmp_path / "mds", "mds")
    upload(endpoint, local, "bucket", "mds")
    client(endpoint).delete_object(Bucket="bucket", Key="mds/shard.00001.mds")
    with pytest.raises(DataError, match=r"missing, though index\.json lists it") as caught:
        Dataset.from_path(
            "gone",
            "s3://bucket/mds/index.json",
            storage_options=_storage(endpoint),
            io_options={"cache": {"dir": str(tmp_path / "cache")}},
        )
    assert caught.value.shard == "s3://bucket/mds/shard.00001.mds"


def test_prefetching_an_npy_shard_caches_its_offsets_file_too(
    s3_server: tuple[str, Any], tmp_path: Path
) -> None:
    endpoint, _ = s3_server
    remote, local = _open_both(endpoint, tmp_path, "npy")
    assert remote.cache_counters() == {"hits": 0, "misses": 0, "bytes_downloaded": 0}
    remote.prefetch([1])
    deadline = time.monotonic() + 20
    while remote.cache_counters()["misses"] < 2 and time.monotonic() < deadline:
        time.sleep(0.01)
    cached = sorted(p.name.split("-", 1)[1] for p in (tmp_path / "cache").glob("*-*.npy"))
    assert cached == ["1.npy", "1.offsets.npy"]
    rows = range(remote.shards[1].num_rows)
    assert [plain(row) for row in remote.read_rows(1, rows)] == [
        plain(row) for row in local.read_rows(1, rows)
    ]
    assert remote.cache_counters()["misses"] == 2  # the read found both files cached
    assert remote.cache_counters()["hits"] == 2


@pytest.mark.parametrize("kind", ["mds", "npy"])
def test_a_truncated_shard_on_s3_is_a_data_error_naming_its_url(
    s3_server: tuple[str, Any], tmp_path: Path, kind: str
) -> None:
    endpoint, _ = s3_server
    local = _write_format(tmp_path / kind, kind)
    name = "shard.00001.mds" if kind == "mds" else "1.npy"
    data = (local / name).read_bytes()
    (local / name).write_bytes(data[: len(data) // 2])
    upload(endpoint, local, "bucket", kind)
    options = {"cache": {"dir": str(tmp_path / "cache")}}
    if kind == "npy":  # rows counted from its header, checked against its size at the open
        with pytest.raises(DataError, match=r"'1\.npy' is shorter than its \.npy header") as caught:
            Dataset.from_path(
                kind, f"s3://bucket/{kind}/", storage_options=_storage(endpoint), io_options=options
            )
        assert caught.value.shard == f"s3://bucket/{kind}/{name}"
        return
    remote = Dataset.from_path(
        kind, f"s3://bucket/{kind}/", storage_options=_storage(endpoint), io_options=options
    )
    assert remote.read_rows(0, [0])  # the other shards read
    with pytest.raises(DataError, match=r"truncated|not a readable") as caught:
        remote.read_rows(1, [0])
    assert caught.value.shard == f"s3://bucket/{kind}/{name}"
    assert "cache" not in str(caught.value)


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
    _write_corpus(tmp_path / "data", "parquet", shards=8)
    upload(endpoint, tmp_path / "data", "bucket", "data")
    command = [
        sys.executable,
        "-c",
        _QUEUE_AND_LEAVE,
        "s3://bucket/data",
        json.dumps(_storage(endpoint)),
        str(server.pid),
    ]
    try:
        done = subprocess.run(command, capture_output=True, text=True, timeout=90, check=False)
    finally:
        os.kill(server.pid, signal.SIGCONT)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "queued"


def test_the_first_open_of_compressed_jsonl_counts_within_a_small_cache(
    s3_server: tuple[str, Any], tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """The open counted 16 shards at once, each holding its compressed download while it
    waited for room for its decompressed copy: together past `max_bytes` (3.5x in a review's
    run), they stalled for 5 s and fell back to memory. It now counts as many at once as fit."""
    import gzip
    import logging
    import random

    endpoint, _ = s3_server
    words = [f"w{n}" for n in range(3000)]
    rng = random.Random(0)
    local = tmp_path / "local"
    local.mkdir()
    for shard in range(12):
        lines = "".join(
            json.dumps({"text": " ".join(rng.choices(words, k=120)), "id": shard * 100 + i}) + "\n"
            for i in range(100)
        )
        (local / f"part-{shard:03d}.jsonl.gz").write_bytes(gzip.compress(lines.encode()))
    upload(endpoint, local, "bucket", "gz")
    largest = max(p.stat().st_size for p in local.iterdir())
    cache = {"dir": str(tmp_path / "cache"), "max_bytes": 12 * largest, "prefetch_bytes": 0}
    with caplog.at_level(logging.WARNING, logger="zephon_torch"):
        remote = Dataset.from_path(
            "gz", "s3://bucket/gz/", storage_options=_storage(endpoint), io_options={"cache": cache}
        )
    assert [
        r.getMessage() for r in caplog.records if "holding it in memory" in r.getMessage()
    ] == []
    assert remote.num_rows == 1200
    assert _cache_bytes(tmp_path / "cache") <= 12 * largest


def test_shards_held_open_are_sized_to_the_disk_where_it_is_smaller_than_max_bytes(
    s3_server: tuple[str, Any], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A reader kept up to 16 shards open by the default 64 GiB `max_bytes`: on a small disk
    those shards, evicted but held open, filled it, and a run with nothing else in use failed
    with CacheDiskFullError (a review's 2 MiB tmpfs, at shard 13)."""
    import shutil

    from zephon_torch.io import _remote_sizing

    endpoint, _ = s3_server
    _write_corpus(tmp_path / "local", "jsonl", shards=4)
    upload(endpoint, tmp_path / "local", "bucket", "open")
    largest = max(p.stat().st_size for p in (tmp_path / "local").iterdir())
    cache = {"dir": str(tmp_path / "cache" / "not" / "made"), "max_bytes": 64 << 30}
    remote = Dataset.from_path(
        "d", "s3://bucket/open/", storage_options=_storage(endpoint), io_options={"cache": cache}
    )
    reader = remote._reader
    assert _remote_sizing.disk_size(str(tmp_path / "no" / "such")) == (
        shutil.disk_usage(tmp_path).total
    )
    monkeypatch.setattr(_remote_sizing, "disk_size", lambda folder: 64 << 30)
    assert _remote_sizing.max_open(reader.objects, reader.options.cache) == 16
    monkeypatch.setattr(_remote_sizing, "disk_size", lambda folder: 8 * 5 * largest)
    assert _remote_sizing.max_open(reader.objects, reader.options.cache) == 5
    monkeypatch.setattr(_remote_sizing, "disk_size", lambda folder: largest)
    assert _remote_sizing.max_open(reader.objects, reader.options.cache) == 2
