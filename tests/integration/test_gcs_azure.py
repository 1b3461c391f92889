"""Datasets on Google Cloud Storage (`gs://`, gcsfs) and Azure Blob Storage (`az://`, adlfs),
served by their emulators on loopback: every format reads the same rows as its local copy,
pipelines give the same batches, and a dead endpoint fails with a StorageError naming the URL
(in the scheme the user wrote) after bounded retries."""

from __future__ import annotations

import pickle
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.helpers import keys
from tests.object_stores import (
    AZURE_ACCOUNT,
    AZURE_KEY,
    Store,
    azure_store,
    dies_naming,
    gcs_store,
    plain_rows,
    write_corpus,
    write_format,
)
from tests.unit.io.test_io_formats_writers import plain
from zephon_torch import Pipeline
from zephon_torch.io import Dataset
from zephon_torch.work import StaticMixtureWorkSource, TokenEstimation

pytest.importorskip("gcsfs")
pytest.importorskip("adlfs")

STORES: dict[str, Callable[[], Any]] = {"gs": gcs_store, "az": azure_store}


pytestmark = pytest.mark.usefixtures("private_cache")


@pytest.fixture(params=sorted(STORES))
def store(request: pytest.FixtureRequest) -> Iterator[Store]:
    with STORES[request.param]() as running:
        yield running


def _open(store: Store, bucket: str, prefix: str, tmp_path: Path, **options: Any) -> Dataset:
    return Dataset.from_path(
        prefix,
        store.url(bucket, prefix),
        storage_options=store.options,
        io_options={"cache": {"dir": str(tmp_path / "cache")}, **options},
    )


def test_every_format_reads_the_same_rows_as_the_local_copy(store: Store, tmp_path: Path) -> None:
    for kind in ("jsonl", "parquet"):
        write_corpus(tmp_path / kind, kind, shards=3, rows=20)
    for kind in ("mds-zstd", "litdata", "npy"):
        write_format(tmp_path / kind, kind)
    for kind in ("jsonl", "parquet", "mds-zstd", "litdata", "npy"):
        store.upload(tmp_path / kind, "bucket", kind)
        remote = _open(store, "bucket", kind, tmp_path)
        local = Dataset.from_path(kind, tmp_path / kind, index_cache_dir=str(tmp_path / "idx"))
        assert remote.format == local.format == kind.split("-", maxsplit=1)[0]
        assert len(remote.shards) > 1
        assert remote.shards[0].path.startswith(f"{store.scheme}://bucket/{kind}/")
        assert remote.fingerprint() == local.fingerprint()
        assert plain_rows(remote) == plain_rows(local), kind
        copy = pickle.loads(pickle.dumps(remote))  # as a DataLoader worker gets it
        assert [plain(row) for row in copy.read_rows(1, [1, 0])] == [
            plain(row) for row in local.read_rows(1, [1, 0])
        ]


def test_a_url_naming_one_object_reads_it(store: Store, tmp_path: Path) -> None:
    write_corpus(tmp_path / "one", "jsonl", shards=2, rows=5)
    store.upload(tmp_path / "one", "bucket", "one")
    remote = _open(store, "bucket", "one/part-001.jsonl", tmp_path)
    local = Dataset.from_path("one", tmp_path / "one" / "part-001.jsonl")
    assert [shard.path for shard in remote.shards] == [store.url("bucket", "one/part-001.jsonl")]
    assert plain_rows(remote) == plain_rows(local)


def test_a_folder_named_with_glob_characters_reads_as_the_local_one(
    store: Store, tmp_path: Path
) -> None:
    """A folder `what?` read as itself on gs:// (as `run[2]`), but on az:// adlfs takes a path
    ending in "?" for a URL with an empty query and drops the mark: `az://bucket/what?` listed
    `what`, and was 'no files found ... the path does not exist' where the local folder reads
    (and a folder `what` would have been read in its place)."""
    for name in ("what?", "run[2]", "what"):
        write_corpus(tmp_path / name, "jsonl", shards=1, rows=3 if name == "what" else 4)
        store.upload(tmp_path / name, "bucket", f"odd/{name}")
    for name in ("what?", "what?/", "run[2]", "what?/part-000.jsonl"):
        remote = _open(store, "bucket", f"odd/{name}", tmp_path)
        local = Dataset.from_path(name, tmp_path / name.rstrip("/"))
        assert [shard.path for shard in remote.shards] == [
            store.url("bucket", f"odd/{name.split('/')[0]}/part-000.jsonl")
        ], name
        assert plain_rows(remote) == plain_rows(local), name


def test_a_chained_url_names_its_shards_in_the_scheme_written(store: Store, tmp_path: Path) -> None:
    write_corpus(tmp_path / "c", "jsonl", shards=2, rows=5)
    store.upload(tmp_path / "c", "bucket", "c")
    remote = Dataset.from_path(
        "c",
        f"simplecache::{store.url('bucket', 'c')}",
        storage_options={store.scheme: store.options},  # a chained URL's options, by link
        io_options={"cache": {"dir": str(tmp_path / "cache")}},
    )
    assert [shard.path for shard in remote.shards] == [
        store.url("bucket", f"c/part-{n:03d}.jsonl") for n in range(2)
    ]
    assert plain_rows(remote) == plain_rows(Dataset.from_path("c", tmp_path / "c"))


def test_pipelines_give_the_batches_of_the_local_copy(
    store: Store, tmp_path: Path, tokenizer: Any
) -> None:
    write_corpus(tmp_path / "text", "jsonl", shards=4, rows=30)
    write_format(tmp_path / "tokens", "npy")
    store.upload(tmp_path / "text", "bucket", "text")
    store.upload(tmp_path / "tokens", "bucket", "tokens")

    def build(text: Dataset, tokens: Dataset) -> Pipeline:
        source = StaticMixtureWorkSource(
            [text], seed=4, token_estimation=TokenEstimation(), shuffle_window_shards=2
        )
        tokenized = Pipeline(source).options(canonical_replicas=2).tokenize(tokenizer=tokenizer)
        source = StaticMixtureWorkSource([tokens], seed=3, shuffle_window_shards=2)
        pretokenized = Pipeline(source).options(canonical_replicas=2).pretokenized("input_ids")
        return tokenized.pack_flat(64).batch(2), pretokenized.pack_flat(16).batch(2)

    remote = build(
        _open(store, "bucket", "text", tmp_path), _open(store, "bucket", "tokens", tmp_path)
    )
    local = build(
        Dataset.from_path("text", tmp_path / "text"),
        Dataset.from_path("tokens", tmp_path / "tokens"),
    )
    for over_store, here in zip(remote, local):
        expected = keys(here)
        assert len(expected) > 4
        assert keys(over_store) == expected
        assert over_store.stats()["cache"]["bytes_downloaded"] > 0


def test_a_dead_endpoint_raises_a_storage_error_naming_the_url_in_bounded_time(
    store: Store, tmp_path: Path
) -> None:
    """gcsfs retried a refused connection itself for minutes (236 s here with one attempt of
    ours, before its tries were cut to 2), the Azure SDK did for 86 s, before the retry
    policy saw the error: a download receiving nothing over a `rate_window` is now cut
    short."""
    write_corpus(tmp_path / "local", "parquet", shards=3)
    store.upload(tmp_path / "local", "bucket", "dying")
    retry = {"attempts": 1, "initial_delay": 0.1, "timeout": 5, "rate_window": 5}
    remote = _open(store, "bucket", "dying", tmp_path, retry=retry)
    url = f"{store.scheme}://bucket/dying/part-001.parquet"
    dies_naming(remote, store.process, url, bound=20)


def test_a_dead_azure_endpoint_fails_a_listing_after_the_retry_policy_s_attempts() -> None:
    """The Azure SDK retried a refused connection 3 times itself, 15 s and more apart, and
    adlfs passes no setting of it on: opening a dataset on a wrong or dead endpoint took 162 s,
    one attempt of the retry policy's. Those retries are now the policy's alone."""
    from zephon_torch import StorageError
    from zephon_torch._moto import free_port

    endpoint = f"http://127.0.0.1:{free_port()}/{AZURE_ACCOUNT}"  # nothing listens there
    connection = (
        f"DefaultEndpointsProtocol=http;AccountName={AZURE_ACCOUNT};AccountKey={AZURE_KEY};"
        f"BlobEndpoint={endpoint};"
    )
    with pytest.raises(StorageError, match=r"listing failed after 3 attempt\(s\)") as caught:
        Dataset.from_path(
            "d",
            "az://c/data",
            storage_options={"connection_string": connection, "skip_instance_cache": True},
            io_options={"retry": {"attempts": 3, "initial_delay": 0.1}},
        )
    assert caught.value.url == "az://c/data"
    assert "Cannot connect to host 127.0.0.1" in str(caught.value)
    # on a client of its own: the user's cached file system keeps the SDK's retries
    import fsspec

    from zephon_torch.io._filesystems import open_filesystem

    users = fsspec.filesystem("az", connection_string=connection)
    ours, _ = open_filesystem("az://c/data", {"connection_string": connection})
    assert ours is not users
    assert ours.service_client._config.retry_policy.connect_retries == 0
    assert users.service_client._config.retry_policy.connect_retries == 3


def test_a_dead_gcs_endpoint_fails_a_listing_after_the_retry_policy_s_attempts() -> None:
    """gcsfs tried each request 6 times itself, 1 to 32 s apart, before the retry policy saw
    the error: a listing on a dead endpoint took 67 s with 2 attempts of the policy's. gcsfs
    now tries twice, on a file system of zephon_torch's own."""
    import fsspec

    from zephon_torch import StorageError
    from zephon_torch._moto import free_port
    from zephon_torch.io._filesystems import open_filesystem

    options = {
        "endpoint_url": f"http://127.0.0.1:{free_port()}",  # nothing listens there
        "token": "anon",
        "project": "test",
    }
    start = time.monotonic()
    with pytest.raises(StorageError, match=r"listing failed after 2 attempt\(s\)") as caught:
        Dataset.from_path(
            "d",
            "gs://bucket/data",
            storage_options=options,
            io_options={"retry": {"attempts": 2, "initial_delay": 0.1}},
        )
    assert time.monotonic() - start < 20  # 2 attempts of 2 tries, 1-2 s apart: about 3 s
    assert caught.value.url == "gs://bucket/data"
    assert "Cannot connect to host 127.0.0.1" in str(caught.value)
    # on a client of its own: the user's cached file system keeps gcsfs's 6 tries
    users = fsspec.filesystem("gs", **options)
    ours, _ = open_filesystem("gs://bucket/data", options)
    assert ours is not users
    assert "_request" in vars(ours) and "_request" not in vars(users)


def test_a_missing_bucket_is_named_as_such_and_a_missing_path_as_such(store: Store) -> None:
    """Both were "the path does not exist" (Azure) or a bare "FileNotFoundError: b/nope/o"
    (GCS): neither said that the bucket or container was the missing part."""
    from zephon_torch import ConfigError

    store.filesystem().mkdir("bucket")
    kind = "container" if store.scheme == "az" else "bucket"
    with pytest.raises(ConfigError, match=f"the {kind} 'nobucket' does not exist, or these"):
        Dataset.from_path("d", store.url("nobucket", "c"), storage_options=store.options)
    with pytest.raises(ConfigError, match=r"no files found at .*: the path does not exist$"):
        Dataset.from_path("d", store.url("bucket", "c"), storage_options=store.options)


def test_gcs_requests_have_a_time_limit_unless_one_is_given(tmp_path: Path) -> None:
    """gcsfs waits for an answer with no limit by default: a store that took the connection
    and never answered held the run for ever (no error at 590 s). Every gs:// file system,
    a DataLoader worker's copy's too, now limits a request to 60 s unless told otherwise."""
    write_corpus(tmp_path / "c", "jsonl", shards=2, rows=5)
    with gcs_store() as store:
        store.upload(tmp_path / "c", "bucket", "c")
        opened = _open(store, "bucket", "c", tmp_path)
        copy = pickle.loads(pickle.dumps(opened))
        copy.read_rows(1, [0])
        for dataset in (opened, copy):
            limit = dataset._reader._filesystem().requests_timeout
            assert (limit.total, limit.sock_connect, limit.sock_read) == (None, 60.0, 60.0)
        given = Dataset.from_path(
            "c",
            store.url("bucket", "c"),
            storage_options={**store.options, "requests_timeout": 5},
            io_options={"cache": {"dir": str(tmp_path / "cache")}},
        )
        assert given._reader._filesystem().requests_timeout == 5


def test_a_gcs_download_longer_than_the_request_limit_reads_and_a_silent_store_ends(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """gcsfs gives `requests_timeout` to aiohttp as the limit of the whole request: with the
    60 s zephon_torch set, every attempt of a healthy download taking longer (a large shard,
    a slow link) failed as "FSTimeoutError", so the shard never read. The limit is now on
    the wait for an answer and for each of its reads: here 1 s, and a 3 MiB shard sent at
    1 MiB/s reads, while a listing on a store that stops answering still ends by it."""
    import os
    import signal

    import numpy as np

    from tests.hooked_proxy import hooked_proxy
    from zephon_torch import StorageError
    from zephon_torch.io import _filesystems

    monkeypatch.setattr(_filesystems, "GCS_REQUEST_TIMEOUT_S", 1.0)
    (tmp_path / "t").mkdir()
    np.save(tmp_path / "t" / "0.npy", np.arange(10, dtype=np.int32).reshape(-1, 2))
    np.save(tmp_path / "t" / "1.npy", np.arange(3 << 18, dtype=np.int32).reshape(-1, 1024))
    with gcs_store() as store:
        store.upload(tmp_path / "t", "bucket", "t")
        with hooked_proxy(store.options["endpoint_url"], lambda *_: None, 1 << 20) as proxy:
            remote = Dataset.from_path(
                "t",
                "gs://bucket/t",
                storage_options={**store.options, "endpoint_url": proxy},
                io_options={"cache": {"dir": str(tmp_path / "c"), "prefetch_bytes": 0}},
            )
            started = time.monotonic()
            assert remote.read_rows(1, [767])[0]["input_ids"][-1] == (3 << 18) - 1
            assert time.monotonic() - started > 2.5  # the download outlasted the limit
        os.kill(store.process.pid, signal.SIGSTOP)
        try:
            started = time.monotonic()
            with pytest.raises(StorageError, match="listing failed after 1 attempt"):
                _open(store, "bucket", "t", tmp_path, retry={"attempts": 1})
            assert time.monotonic() - started < 15  # gcsfs's 2 tries of 1 s, 1-2 s apart
        finally:
            os.kill(store.process.pid, signal.SIGCONT)


def test_a_gcs_token_never_shows_in_an_error_or_its_causes(tmp_path: Path) -> None:
    """gcsfs checks a raw access token by asking Google's tokeninfo with `?access_token=`;
    where that fails (here: no network), the token was copied into the StorageError and its
    cause."""
    import traceback

    from zephon_torch import StorageError

    secret = "ya29.a0SECRET-ACCESS-TOKEN-0123456789"
    options = {"token": secret, "endpoint_url": "http://127.0.0.1:9"}
    with pytest.raises(StorageError, match="cannot connect") as raised:
        Dataset.from_path("c", "gs://bucket/c", storage_options=options)
    text = "".join(traceback.format_exception(raised.value))
    assert "access_token=***" in text and secret not in text


def test_credentials_in_urls_are_blanked() -> None:
    from zephon_torch.errors import StorageError, without_secrets

    text = (
        "GET https://a.blob.core.windows.net/c/x?sv=2021&sig=AbC%2Fd&se=1 failed; "
        "tokeninfo?access_token=ya29.x (monkey=1, X-Amz-Signature=f00&X-Amz-Date=2)"
    )
    assert without_secrets(text) == (
        "GET https://a.blob.core.windows.net/c/x?sv=2021&sig=***&se=1 failed; "
        "tokeninfo?access_token=*** (monkey=1, X-Amz-Signature=***&X-Amz-Date=2)"
    )
    assert "AbC" not in str(StorageError(text, url="az://c/x"))


def test_a_malformed_gcs_token_is_a_config_error_naming_the_url() -> None:
    """A token dict missing a field escaped as a bare KeyError: 'refresh_token'."""
    from zephon_torch import ConfigError

    options = {"token": {"client_id": "a"}, "endpoint_url": "http://127.0.0.1:9"}
    with pytest.raises(ConfigError, match=r"cannot open 'gs://bucket/c' \(check its storage"):
        Dataset.from_path("c", "gs://bucket/c", storage_options=options)


def test_a_refused_gcs_download_is_one_storage_error_with_gcsfs_s_logs_demoted(
    tmp_path: Path,
) -> None:
    """gcsfs logs each request it gives up on at ERROR with its traceback (hundreds of stderr
    lines for one dead store in a review's run) and raised a refusal (409) as its own
    HttpError, naming no URL. During zephon_torch's calls those records are DEBUG (kept for
    who asks for them); outside them, gcsfs logs as it always did."""
    import logging

    from tests.hooked_proxy import hooked_proxy
    from zephon_torch import StorageError

    write_corpus(tmp_path / "c", "parquet", shards=2, rows=5)
    refusing: list[bool] = []

    def store_answer(method: str, path: str, headers: dict[str, str]) -> tuple[int, bytes] | None:
        if refusing and "alt=media" in path:
            return 409, b'{"error": {"code": 409, "message": "conflict"}}'
        return None

    records: list[logging.LogRecord] = []
    handler = logging.Handler(logging.DEBUG)
    handler.emit = records.append  # type: ignore[method-assign]
    gcsfs_logger = logging.getLogger("gcsfs")
    level = gcsfs_logger.level
    gcsfs_logger.addHandler(handler)
    gcsfs_logger.setLevel(logging.DEBUG)
    try:
        with (
            gcs_store() as store,
            hooked_proxy(store.options["endpoint_url"], store_answer) as proxy,
        ):
            store.upload(tmp_path / "c", "bucket", "c")
            options = {**store.options, "endpoint_url": proxy}
            remote = Dataset.from_path(
                "c",
                "gs://bucket/c",
                storage_options=options,
                io_options={"cache": {"dir": str(tmp_path / "cache"), "prefetch_bytes": 0}},
            )
            refusing.append(True)
            with pytest.raises(StorageError, match=r"refused by the store .*409") as caught:
                remote.read_rows(1, [0])
            assert caught.value.url == "gs://bucket/c/part-001.parquet"
            ours = [r for r in records if "non-retriable" in r.getMessage()]
            assert ours and {r.levelno for r in records} == {logging.DEBUG}
            records.clear()
            with pytest.raises(Exception, match="409"):  # gcsfs called directly: its own logs
                store.filesystem().__class__(**options).cat_file("bucket/c/part-001.parquet")
            assert any(
                r.levelno == logging.ERROR and "non-retriable" in r.getMessage() for r in records
            )
    finally:
        gcsfs_logger.removeHandler(handler)
        gcsfs_logger.setLevel(level)


def test_a_listing_let_go_on_a_frozen_azure_store_leaves_no_error_on_the_loop() -> None:
    """The Azure SDK goes on with a listing cancelled as stalled on a stopped store: its error,
    once the store died, was logged by asyncio as "Task exception was never retrieved", with
    a traceback of some 140 lines, where the StorageError had been raised long before."""
    import asyncio
    import gc
    import logging
    import os
    import signal

    from zephon_torch.io._filesystems import open_filesystem
    from zephon_torch.io._retry import RetryPolicy
    from zephon_torch.io._stall import Stalled, bounded

    records: list[logging.LogRecord] = []
    handler = logging.Handler(logging.DEBUG)
    handler.emit = records.append  # type: ignore[method-assign]
    logging.getLogger("asyncio").addHandler(handler)
    try:
        with azure_store() as store:
            store.filesystem().mkdir("bucket")
            store.filesystem().pipe_file("bucket/a/x.txt", b"x")
            fs, _ = open_filesystem("az://bucket/a", store.options)
            os.kill(store.process.pid, signal.SIGSTOP)
            with pytest.raises(Stalled, match="no answer in 1"):
                bounded(fs, "find", "bucket/a", retry=RetryPolicy(timeout=1), what="listing")
            store.process.kill()  # the connection the SDK still waits on is refused
            store.process.wait(10)

            async def running() -> int:
                return len(asyncio.all_tasks()) - 1

            deadline = time.monotonic() + 20
            while asyncio.run_coroutine_threadsafe(running(), fs.loop).result():
                assert time.monotonic() < deadline
                time.sleep(0.1)
            gc.collect()
    finally:
        logging.getLogger("asyncio").removeHandler(handler)
    assert [r.getMessage() for r in records if "never retrieved" in r.getMessage()] == []
